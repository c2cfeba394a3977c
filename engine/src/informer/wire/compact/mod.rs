//! The compact object: a Kubernetes object kept as the bytes it arrived as, with the metadata a
//! cache needs decoded once beside them (docs/objects.md).
//!
//! A [`CompactObject`] is one buffer holding the object's body as the server sent it, protobuf
//! or JSON, less `metadata.managedFields` (stripped while copying, as client-go's and
//! controller-runtime's transforms strip it, unless [`CompactCodec::keep_managed_fields`]),
//! followed by a small table locating what was decoded: namespace, name, uid, resource
//! version, generation, labels, annotations, owner references, deletion time, and the fields
//! declared for index functions ([`FieldPath`], e.g. `spec.nodeName`). Reading any of those is
//! a slice of the buffer; nothing is decoded again. The whole typed object (a `k8s-pb` message
//! from protobuf, any serde type such as `k8s-openapi`'s from JSON) is decoded on demand
//! ([`CompactObject::decode_protobuf`], [`CompactObject::decode_json`]) and not kept.
//!
//! Key functions, indexers, handlers, the workqueue and the controller take it as any other
//! object: [`compact_key_fn`], [`index_by_namespace`], [`index_by_label`], [`index_by_field`].
//!
//! ```
//! use kcache::informer::wire::{pod_fields, CompactCodec, CompactObject, Format};
//! use kcache::informer::Versioned;
//! let codec = CompactCodec::json_only("", "v1", "pods").index_field(pod_fields::node_name());
//! let node = codec.field_id("spec.nodeName").unwrap();
//! let pod = codec.object(Format::Json, br#"{"metadata":{"name":"web-0","namespace":"default",
//!     "resourceVersion":"7","labels":{"app":"web"},"managedFields":[{"manager":"kubectl"}]},
//!     "spec":{"nodeName":"node-1"}}"#).unwrap();
//! assert_eq!((pod.namespace(), pod.name(), pod.resource_version()), ("default", "web-0", "7"));
//! assert_eq!(pod.label("app"), Some("web"));
//! assert_eq!(pod.field(node), Some("node-1"));
//! assert!(!std::str::from_utf8(pod.bytes()).unwrap().contains("managedFields"));
//! ```

mod codec;
mod fields;
mod json;
mod layout;
mod protobuf;

use std::fmt;
use std::sync::Arc;

use prost::Message;
use serde::de::DeserializeOwned;
use smallvec::smallvec;

use super::super::lister_watcher::SetResourceVersion;
use super::super::lister_watcher::{Error, Versioned};
use super::codec::Format;
use crate::key::{namespace_name_key, Key, KeyError, KeyFn, ObjectMeta};
use crate::store::{IndexFunc, IndexValues};
pub use codec::CompactCodec;
pub use fields::{pod as pod_fields, FieldId, FieldPath};
use layout::{str_at, with_builder, Finished, Span, Table};
use protobuf::Plan;

/// A Kubernetes object as it arrived, less what is stripped, with its metadata decoded once.
///
/// Made by a [`CompactCodec`] (as the informer's objects, from a watch or a list) or by
/// [`CompactCodec::object`]. Immutable, apart from the resource version the in-memory server
/// sets ([`SetResourceVersion`], which writes the object again).
pub struct CompactObject {
    data: Box<[u8]>,
    format: Format,
    object_len: u32,
    namespace: Span,
    name: Span,
    uid: Span,
    resource_version: Span,
    generation: i64,
    deletion_timestamp: Option<i64>,
    table: u32,
    labels: u32,
    annotations: u32,
    owners: u32,
    fields: u32,
}

/// An owner reference of a [`CompactObject`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerRef<'a> {
    /// `apiVersion` of the owner.
    pub api_version: &'a str,
    /// `kind` of the owner.
    pub kind: &'a str,
    /// `name` of the owner.
    pub name: &'a str,
    /// `uid` of the owner.
    pub uid: &'a str,
    /// Whether the owner is the managing controller.
    pub controller: bool,
}

impl CompactObject {
    /// Builds an object from `body`, an object's own bytes (protobuf: the message inside the
    /// `runtime.Unknown` envelope; JSON: the object).
    pub(crate) fn build(
        format: Format,
        body: &[u8],
        fields: usize,
        plan: Plan<'_>,
    ) -> Result<CompactObject, Error> {
        with_builder(fields, |b| {
            match format {
                Format::Protobuf => protobuf::build(b, body, plan)?,
                Format::Json => {
                    let text = std::str::from_utf8(body)
                        .map_err(|e| Error::Decode(format!("an object is not UTF-8: {e}")))?;
                    json::build(b, text, plan)?;
                }
            }
            b.finish()
                .map(|finished| Self::from_finished(format, finished))
        })
    }

    /// Builds from JSON already being parsed (a watch event's or a list's), into `b`.
    pub(crate) fn from_finished(format: Format, f: Finished) -> CompactObject {
        let span = |s: Option<Span>| s.unwrap_or(Span::ABSENT);
        CompactObject {
            data: f.data,
            format,
            object_len: f.object_len,
            namespace: span(f.meta.namespace),
            name: span(f.meta.name),
            uid: span(f.meta.uid),
            resource_version: span(f.meta.resource_version),
            generation: f.meta.generation,
            deletion_timestamp: f.meta.deletion_timestamp,
            table: f.table,
            labels: f.labels,
            annotations: f.annotations,
            owners: f.owners,
            fields: f.fields,
        }
    }

    fn str(&self, span: Span) -> &str {
        str_at(&self.data, span).unwrap_or("")
    }

    fn table(&self) -> Table<'_> {
        Table {
            data: &self.data,
            start: self.table,
            labels: self.labels,
            annotations: self.annotations,
            owners: self.owners,
            fields: self.fields,
        }
    }

    /// The format of [`bytes`](Self::bytes).
    pub fn format(&self) -> Format {
        self.format
    }

    /// The object's bytes as kept: its body as it arrived (protobuf: the object's message,
    /// without the `k8s\0` magic and envelope; JSON: the object, `kind` and `apiVersion`
    /// included when the server sent them), less what was stripped.
    pub fn bytes(&self) -> &[u8] {
        &self.data[..self.object_len as usize]
    }

    /// `metadata.namespace`; empty for a cluster-scoped object.
    pub fn namespace(&self) -> &str {
        self.str(self.namespace)
    }

    /// `metadata.name`.
    pub fn name(&self) -> &str {
        self.str(self.name)
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> &str {
        self.str(self.uid)
    }

    /// `metadata.generation` (0 when absent).
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// `metadata.deletionTimestamp`, in seconds since the Unix epoch.
    pub fn deletion_timestamp(&self) -> Option<i64> {
        self.deletion_timestamp
    }

    /// `metadata.labels`, in the order they arrived (both formats sort them by key).
    pub fn labels(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        let table = self.table();
        (0..self.labels as usize).map(move |i| table.label(i))
    }

    /// The label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// `metadata.annotations`.
    pub fn annotations(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + '_ {
        let table = self.table();
        (0..self.annotations as usize).map(move |i| table.annotation(i))
    }

    /// The annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// `metadata.ownerReferences`.
    pub fn owner_references(&self) -> impl ExactSizeIterator<Item = OwnerRef<'_>> + '_ {
        let table = self.table();
        (0..self.owners as usize).map(move |i| {
            let ([api_version, kind, name, uid], controller) = table.owner(i);
            OwnerRef {
                api_version,
                kind,
                name,
                uid,
                controller,
            }
        })
    }

    /// The owner reference marked as the controller, if any.
    pub fn controller(&self) -> Option<OwnerRef<'_>> {
        self.owner_references().find(|o| o.controller)
    }

    /// A declared field (see [`CompactCodec::index_field`]); `None` when the object does not
    /// have it.
    pub fn field(&self, id: FieldId) -> Option<&str> {
        self.table().field(id.0)
    }

    /// The whole object as the `k8s-pb` message `T`, decoded now (not kept). Only for objects
    /// that arrived as protobuf. Stripped fields are empty.
    pub fn decode_protobuf<T: Message + Default>(&self) -> Result<T, Error> {
        match self.format {
            Format::Protobuf => T::decode(self.bytes()).map_err(|e| {
                Error::Decode(format!("the object is not a valid protobuf message: {e}"))
            }),
            Format::Json => Err(Error::Decode(
                "the object arrived as JSON: decode it with decode_json".to_owned(),
            )),
        }
    }

    /// The whole object as the serde type `T` (a `k8s-openapi` type, a custom resource),
    /// decoded now (not kept). Only for objects that arrived as JSON. Stripped fields are
    /// absent.
    pub fn decode_json<T: DeserializeOwned>(&self) -> Result<T, Error> {
        match self.format {
            Format::Json => serde_json::from_slice(self.bytes()).map_err(|e| {
                Error::Decode(format!("the object is not valid JSON for the type: {e}"))
            }),
            Format::Protobuf => Err(Error::Decode(
                "the object arrived as protobuf: decode it with decode_protobuf".to_owned(),
            )),
        }
    }

    /// The bytes this object holds on the heap (its buffer), for memory accounting.
    pub fn heap_bytes(&self) -> usize {
        self.data.len()
    }
}

impl fmt::Debug for CompactObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompactObject")
            .field("format", &self.format)
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .field("resource_version", &self.resource_version())
            .field("bytes", &self.object_len)
            .finish_non_exhaustive()
    }
}

impl Clone for CompactObject {
    fn clone(&self) -> Self {
        CompactObject {
            data: self.data.clone(),
            ..*self
        }
    }
}

impl PartialEq for CompactObject {
    /// Equal when they hold the same bytes in the same format.
    fn eq(&self, other: &Self) -> bool {
        self.format == other.format && self.bytes() == other.bytes()
    }
}

impl Versioned for CompactObject {
    fn resource_version(&self) -> &str {
        self.str(self.resource_version)
    }
}

impl ObjectMeta for CompactObject {
    fn namespace(&self) -> &str {
        CompactObject::namespace(self)
    }

    fn name(&self) -> &str {
        CompactObject::name(self)
    }
}

impl SetResourceVersion for CompactObject {
    /// Writes the object again with `resource_version` (the in-memory server's writes). The
    /// declared fields are found again only by a codec: here they are carried over by
    /// position, which the rewrite does not change for any field but the metadata.
    fn set_resource_version(&mut self, resource_version: &str) {
        let plan = Plan {
            keep_managed_fields: true,
            fields: &[],
            resource_version: Some(resource_version),
        };
        let declared: Vec<Option<String>> = (0..self.fields as usize)
            .map(|i| self.table().field(i).map(str::to_owned))
            .collect();
        let rebuilt = with_builder(declared.len(), |b| {
            match self.format {
                Format::Protobuf => protobuf::build(b, self.bytes(), plan)?,
                Format::Json => {
                    let text = std::str::from_utf8(self.bytes())
                        .map_err(|e| Error::Decode(e.to_string()))?;
                    json::build(b, text, plan)?;
                }
            }
            for (i, value) in declared.iter().enumerate() {
                if let Some(value) = value {
                    let span = b.extra_string(value)?;
                    b.field(i, span);
                }
            }
            b.finish()
        });
        // The object was built from these bytes once already, so building it again succeeds.
        if let Ok(finished) = rebuilt {
            *self = Self::from_finished(self.format, finished);
        }
    }
}

/// client-go's `MetaNamespaceKeyFunc` for compact objects: `namespace/name`, or `name` for
/// cluster-scoped ones.
pub fn compact_key(obj: &CompactObject) -> Result<Key, KeyError> {
    namespace_name_key(obj.namespace(), obj.name())
}

/// [`compact_key`] as a [`KeyFn`].
pub fn compact_key_fn() -> KeyFn<CompactObject> {
    Arc::new(compact_key)
}

/// client-go's `MetaNamespaceIndexFunc`: the object's namespace.
pub fn index_by_namespace() -> IndexFunc<CompactObject> {
    Arc::new(|obj: &CompactObject| -> IndexValues { smallvec![Key::new(obj.namespace())] })
}

/// The value of label `key`, for objects that have it.
pub fn index_by_label(key: &str) -> IndexFunc<CompactObject> {
    let key = key.to_owned();
    Arc::new(move |obj: &CompactObject| -> IndexValues {
        obj.label(&key).map(Key::new).into_iter().collect()
    })
}

/// The value of a declared field (see [`CompactCodec::field_id`]), for objects that have it.
pub fn index_by_field(id: FieldId) -> IndexFunc<CompactObject> {
    Arc::new(move |obj: &CompactObject| -> IndexValues {
        obj.field(id).map(Key::new).into_iter().collect()
    })
}
