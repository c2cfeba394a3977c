//! Keys: the identity of an object, hashed once.
//!
//! Every map in kcache is keyed by [`Key`]. A key carries its ahash, computed once when the key
//! is made, so shard selection and every hash-map probe afterwards cost no hashing at all
//! ([`KeyHasher`] passes the stored hash through). Cloning a key is one reference-count bump.

use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

use thiserror::Error;

/// Fixed seeds, so a key hashes the same in every process and every run: shard placement and
/// therefore pop order are reproducible, which the benchmarks and the trace tests rely on.
const KEY_HASH_STATE: ahash::RandomState = ahash::RandomState::with_seeds(
    0x243f_6a88_85a3_08d3,
    0x1319_8a2e_0370_7344,
    0xa409_3822_299f_31d0,
    0x082e_fa98_ec4e_6c89,
);

/// The identity of an object (`namespace/name` by default), with its hash computed once.
///
/// Equality and ordering are those of the string; the hash is the precomputed ahash.
///
/// ```
/// use kcache::Key;
/// let a = Key::new("default/nginx");
/// let b = a.clone(); // a reference-count bump, no copy, no rehash
/// assert_eq!(a, b);
/// assert_eq!(a.as_str(), "default/nginx");
/// assert_eq!(a.hash_value(), Key::from("default/nginx").hash_value());
/// ```
#[derive(Clone)]
pub struct Key {
    hash: u64,
    name: Arc<str>,
}

impl Key {
    /// Makes a key, hashing `name` once.
    pub fn new(name: &str) -> Self {
        Self {
            hash: KEY_HASH_STATE.hash_one(name),
            name: Arc::from(name),
        }
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The precomputed 64-bit hash of the key.
    pub fn hash_value(&self) -> u64 {
        self.hash
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        // The hash check rejects almost every unequal pair in one compare; the pointer check
        // accepts clones of the same key without touching the bytes.
        self.hash == other.hash && (Arc::ptr_eq(&self.name, &other.name) || self.name == other.name)
    }
}

impl Eq for Key {}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.name.cmp(&other.name)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.name, f)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl From<&str> for Key {
    fn from(name: &str) -> Self {
        Self::new(name)
    }
}

impl From<String> for Key {
    fn from(name: String) -> Self {
        Self::new(&name)
    }
}

impl AsRef<str> for Key {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

/// A borrowed [`Key`]: its hash and its name, inline. Equal exactly when the keys are, and
/// compared the same way (hash, then the same string allocation, then the bytes), so a set of
/// them answers "is this key in it?" without a reference count per member, and mostly without
/// leaving the set's own memory.
#[derive(Clone, Copy)]
pub(crate) struct KeyRef<'a> {
    hash: u64,
    name: &'a str,
}

impl<'a> KeyRef<'a> {
    pub(crate) fn of(key: &'a Key) -> Self {
        Self {
            hash: key.hash,
            name: &key.name,
        }
    }
}

impl PartialEq for KeyRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        // As `Key::eq`: two keys share a string allocation exactly when their names are the same
        // pointer (and length).
        self.hash == other.hash && (std::ptr::eq(self.name, other.name) || self.name == other.name)
    }
}

impl Eq for KeyRef<'_> {}

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// A set of borrowed keys (see [`KeyRef`]).
pub(crate) type KeyRefSet<'a> = std::collections::HashSet<KeyRef<'a>, BuildKeyHasher>;

/// A [`Hasher`] that passes a [`Key`]'s precomputed hash through.
///
/// Only for maps keyed by [`Key`]: anything else written to it is folded in with a cheap
/// multiply, which is correct but not a good hash.
#[derive(Debug, Default, Clone, Copy)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

/// The `BuildHasher` for maps keyed by [`Key`].
pub type BuildKeyHasher = BuildHasherDefault<KeyHasher>;

/// A `HashMap` keyed by [`Key`] that never rehashes the key.
pub type KeyMap<V> = std::collections::HashMap<Key, V, BuildKeyHasher>;

/// A `HashSet` of [`Key`]s that never rehashes a key.
pub type KeySet = std::collections::HashSet<Key, BuildKeyHasher>;

/// A key function failed: the object has no usable identity.
///
/// The operation that called the key function returns this error and changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("couldn't create key for object: {reason}")]
pub struct KeyError {
    reason: String,
}

impl KeyError {
    /// A key error with the reason shown to the user.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
        }
    }

    /// Why no key could be made.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

/// A key function: the identity of an object, or why it has none.
pub type KeyFn<T> = Arc<dyn Fn(&T) -> Result<Key, KeyError> + Send + Sync>;

/// What [`meta_namespace_key`] needs from an object: Kubernetes' `ObjectMeta` identity.
pub trait ObjectMeta {
    /// The namespace; empty for cluster-scoped objects.
    fn namespace(&self) -> &str;
    /// The name.
    fn name(&self) -> &str;
}

/// client-go's `MetaNamespaceKeyFunc`: `namespace/name`, or `name` when the namespace is empty.
///
/// An object without a name has no identity and gives a [`KeyError`].
///
/// ```
/// use kcache::{meta_namespace_key, ObjectMeta};
/// struct Pod { ns: String, name: String }
/// impl ObjectMeta for Pod {
///     fn namespace(&self) -> &str { &self.ns }
///     fn name(&self) -> &str { &self.name }
/// }
/// let pod = Pod { ns: "default".into(), name: "web-0".into() };
/// assert_eq!(meta_namespace_key(&pod).unwrap().as_str(), "default/web-0");
/// let node = Pod { ns: String::new(), name: "node-1".into() };
/// assert_eq!(meta_namespace_key(&node).unwrap().as_str(), "node-1");
/// let nameless = Pod { ns: "default".into(), name: String::new() };
/// assert!(meta_namespace_key(&nameless).is_err());
/// ```
pub fn meta_namespace_key<T: ObjectMeta + ?Sized>(obj: &T) -> Result<Key, KeyError> {
    namespace_name_key(obj.namespace(), obj.name())
}

/// The key of an object in `namespace` (empty for a cluster-scoped one) named `name`: the rule
/// of [`meta_namespace_key`], for objects whose metadata is read some other way (kube-rs'
/// types, protobuf messages).
pub fn namespace_name_key(namespace: &str, name: &str) -> Result<Key, KeyError> {
    if name.is_empty() {
        return Err(KeyError::new("object has no name"));
    }
    if namespace.is_empty() {
        return Ok(Key::new(name));
    }
    // Assembled on the stack when it fits (a namespace is at most 63 bytes and a name at most
    // 253, so it always does for valid objects): the key's own allocation is then the only one.
    let len = namespace.len() + 1 + name.len();
    let mut buffer = [0u8; 320];
    match buffer.get_mut(..len) {
        Some(joined) => {
            joined[..namespace.len()].copy_from_slice(namespace.as_bytes());
            joined[namespace.len()] = b'/';
            joined[namespace.len() + 1..].copy_from_slice(name.as_bytes());
            // Two strings and a '/' joined are UTF-8.
            let key = std::str::from_utf8(joined).map_err(|e| KeyError::new(e.to_string()))?;
            Ok(Key::new(key))
        }
        None => Ok(Key::new(&format!("{namespace}/{name}"))),
    }
}

/// Splits a `namespace/name` key (client-go's `SplitMetaNamespaceKey`).
///
/// ```
/// assert_eq!(kcache::split_meta_namespace_key("ns/a"), Ok(("ns", "a")));
/// assert_eq!(kcache::split_meta_namespace_key("a"), Ok(("", "a")));
/// assert!(kcache::split_meta_namespace_key("a/b/c").is_err());
/// ```
pub fn split_meta_namespace_key(key: &str) -> Result<(&str, &str), KeyError> {
    let mut parts = key.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => Ok(("", name)),
        (Some(namespace), Some(name), None) => Ok((namespace, name)),
        _ => Err(KeyError::new(format!("unexpected key format: {key:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_strings_make_equal_keys_with_equal_hashes() {
        let a = Key::new("ns/a");
        let b = Key::from(String::from("ns/a"));
        assert_eq!(a, b);
        assert_eq!(a.hash_value(), b.hash_value());
        assert_ne!(a, Key::new("ns/b"));
    }

    #[test]
    fn key_map_finds_keys_by_precomputed_hash() {
        let mut map = KeyMap::default();
        map.insert(Key::new("x"), 1);
        assert_eq!(map.get(&Key::new("x")), Some(&1));
        assert_eq!(map.get(&Key::new("y")), None);
    }

    #[test]
    fn keys_order_like_strings() {
        let mut keys = [Key::new("b"), Key::new("a/c"), Key::new("a")];
        keys.sort();
        let names: Vec<_> = keys.iter().map(Key::as_str).collect();
        assert_eq!(names, ["a", "a/c", "b"]);
    }
}
