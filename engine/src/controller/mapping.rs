//! From a secondary object to the primary keys it concerns: owner references (the built-in
//! mapping, controller-runtime's `EnqueueRequestForOwner`) or a function of the user's.

use std::sync::Arc;

use crate::key::Key;

/// Maps a secondary object to the keys of the primary objects to reconcile when it changes.
pub type Mapper<S> = Arc<dyn Fn(&S) -> Vec<Key> + Send + Sync>;

/// An object that can name its owners, as Kubernetes' `metadata.ownerReferences` do: an owner
/// lives in the object's namespace and is named by kind and name.
///
/// With the `kube` feature every `kube::Resource` implements it from its metadata. Implement
/// it for your own types:
///
/// ```
/// use kcache::controller::Owned;
///
/// struct Pod { namespace: String, owner: Option<(String, String)> }
/// impl Owned for Pod {
///     fn owner_namespace(&self) -> &str { &self.namespace }
///     fn for_each_owner(&self, f: &mut dyn FnMut(&str, &str, bool)) {
///         if let Some((kind, name)) = &self.owner { f(kind, name, true) }
///     }
/// }
/// ```
pub trait Owned {
    /// The namespace the owners live in (the object's own); empty for cluster-scoped objects.
    fn owner_namespace(&self) -> &str;

    /// Calls `f(kind, name, controller)` for each owner reference; `controller` is the
    /// reference's `controller` flag (the one managing owner).
    fn for_each_owner(&self, f: &mut dyn FnMut(&str, &str, bool));
}

/// The keys (`namespace/name`, or `name` when cluster-scoped) of `obj`'s owners of kind
/// `kind`; with `controller_only`, only the owner whose reference is the controller's.
pub fn owner_keys<S: Owned + ?Sized>(obj: &S, kind: &str, controller_only: bool) -> Vec<Key> {
    let namespace = obj.owner_namespace();
    let mut keys = Vec::new();
    obj.for_each_owner(&mut |owner_kind, name, controller| {
        if owner_kind != kind || name.is_empty() || (controller_only && !controller) {
            return;
        }
        let key = if namespace.is_empty() {
            Key::new(name)
        } else {
            Key::new(&format!("{namespace}/{name}"))
        };
        if !keys.contains(&key) {
            keys.push(key);
        }
    });
    keys
}

/// The owner mapping as a [`Mapper`]: `obj` ↦ its owners of kind `kind`.
pub fn owner_mapper<S: Owned + 'static>(kind: &str, controller_only: bool) -> Mapper<S> {
    let kind = kind.to_string();
    Arc::new(move |obj: &S| owner_keys(obj, &kind, controller_only))
}

#[cfg(feature = "kube")]
impl<K: kube::Resource> Owned for K {
    fn owner_namespace(&self) -> &str {
        self.meta().namespace.as_deref().unwrap_or("")
    }

    fn for_each_owner(&self, f: &mut dyn FnMut(&str, &str, bool)) {
        for owner in self.meta().owner_references.iter().flatten() {
            f(&owner.kind, &owner.name, owner.controller == Some(true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Obj {
        namespace: &'static str,
        owners: Vec<(&'static str, &'static str, bool)>,
    }

    impl Owned for Obj {
        fn owner_namespace(&self) -> &str {
            self.namespace
        }
        fn for_each_owner(&self, f: &mut dyn FnMut(&str, &str, bool)) {
            for (kind, name, controller) in &self.owners {
                f(kind, name, *controller);
            }
        }
    }

    #[test]
    fn owners_of_the_kind_in_the_objects_namespace() {
        let obj = Obj {
            namespace: "ns",
            owners: vec![
                ("ReplicaSet", "web", true),
                ("ConfigMap", "cfg", false),
                ("ReplicaSet", "old", false),
                ("ReplicaSet", "web", false),
                ("ReplicaSet", "", true),
            ],
        };
        assert_eq!(
            owner_keys(&obj, "ReplicaSet", false),
            [Key::new("ns/web"), Key::new("ns/old")]
        );
        assert_eq!(owner_keys(&obj, "ReplicaSet", true), [Key::new("ns/web")]);
        assert!(owner_keys(&obj, "Deployment", false).is_empty());
        let cluster = Obj {
            namespace: "",
            owners: vec![("Node", "n1", true)],
        };
        assert_eq!(
            owner_mapper::<Obj>("Node", false)(&cluster),
            [Key::new("n1")]
        );
    }
}
