//! Building a compact object from a protobuf message (an object's own message, the `raw` of its
//! `runtime.Unknown`), in one walk.
//!
//! Every Kubernetes object's message has its `ObjectMeta` at field 1. That field is rewritten
//! (the same fields in the same order, less `managedFields`, field 17, unless kept) while the
//! metadata a cache needs is read from it; every other field is copied as it is, and the
//! declared fields are found inside the ones they live in. Only the strings read are checked
//! (UTF-8); the rest is checked by whoever decodes the object in full.

use super::super::super::lister_watcher::Error;
use super::super::protowire::{push_len_field_head, varint_len, Fields, Value};
use super::fields::FieldPath;
use super::layout::{Builder, Span};

/// `ObjectMeta`'s field numbers (k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto).
mod meta {
    pub const NAME: u32 = 1;
    pub const NAMESPACE: u32 = 3;
    pub const UID: u32 = 5;
    pub const RESOURCE_VERSION: u32 = 6;
    pub const GENERATION: u32 = 7;
    pub const DELETION_TIMESTAMP: u32 = 9;
    pub const LABELS: u32 = 11;
    pub const ANNOTATIONS: u32 = 12;
    pub const OWNER_REFERENCES: u32 = 13;
    pub const MANAGED_FIELDS: u32 = 17;
}

/// `OwnerReference`'s field numbers.
mod owner {
    pub const KIND: u32 = 1;
    pub const NAME: u32 = 3;
    pub const UID: u32 = 4;
    pub const API_VERSION: u32 = 5;
    pub const CONTROLLER: u32 = 6;
}

/// The metadata field of every top-level object message.
const METADATA: u32 = 1;

/// What to keep and what to find.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan<'a> {
    pub(crate) keep_managed_fields: bool,
    pub(crate) fields: &'a [FieldPath],
    /// Write this resource version instead of the object's own.
    pub(crate) resource_version: Option<&'a str>,
}

/// Writes `object` into `b` as kept, collecting its metadata.
pub(crate) fn build(b: &mut Builder, object: &[u8], plan: Plan<'_>) -> Result<(), Error> {
    b.out.reserve(object.len());
    let mut fields = Fields::new(object);
    let mut saw_metadata = false;
    while let Some(field) = fields.next_field() {
        let field = field?;
        match (field.number, &field.value) {
            (METADATA, Value::Bytes(metadata)) => {
                saw_metadata = true;
                write_metadata(b, metadata, plan)?;
            }
            (number, value) => {
                let at = b.out.len();
                b.out.extend_from_slice(field.encoded);
                if let Value::Bytes(inner) = value {
                    let inner_at = at + offset_in(field.encoded, inner);
                    find_declared(b, plan.fields, number, inner, inner_at)?;
                }
            }
        }
    }
    if !saw_metadata {
        return Err(Error::Decode(
            "a protobuf object without metadata (field 1)".to_owned(),
        ));
    }
    Ok(())
}

/// Where `inner` (a slice of `outer`) starts in `outer`.
fn offset_in(outer: &[u8], inner: &[u8]) -> usize {
    inner.as_ptr() as usize - outer.as_ptr() as usize
}

fn utf8<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, Error> {
    std::str::from_utf8(bytes).map_err(|_| Error::Decode(format!("{what} is not UTF-8")))
}

/// The metadata field, rewritten without what is stripped.
fn write_metadata(b: &mut Builder, metadata: &[u8], plan: Plan<'_>) -> Result<(), Error> {
    let dropped = |number: u32| {
        (number == meta::MANAGED_FIELDS && !plan.keep_managed_fields)
            || (number == meta::RESOURCE_VERSION && plan.resource_version.is_some())
    };
    let mut kept = 0;
    let mut fields = Fields::new(metadata);
    while let Some(field) = fields.next_field() {
        let field = field?;
        if !dropped(field.number) {
            kept += field.encoded.len();
        }
    }
    if let Some(rv) = plan.resource_version {
        kept += 1 + varint_len(rv.len() as u64) + rv.len();
    }
    push_len_field_head(&mut b.out, METADATA, kept);

    let mut fields = Fields::new(metadata);
    while let Some(field) = fields.next_field() {
        let field = field?;
        if dropped(field.number) {
            continue;
        }
        let at = b.out.len();
        b.out.extend_from_slice(field.encoded);
        let value = match field.value {
            Value::Bytes(v) => Some((v, at + offset_in(field.encoded, v))),
            _ => None,
        };
        let string_at = |b: &Builder, what: &str| -> Result<Span, Error> {
            let (v, v_at) = value.ok_or_else(|| wrong_type(what))?;
            utf8(v, what)?;
            b.span_at(v_at, v.len())
        };
        match field.number {
            meta::NAME => b.meta.name = Some(string_at(b, "metadata.name")?),
            meta::NAMESPACE => b.meta.namespace = Some(string_at(b, "metadata.namespace")?),
            meta::UID => b.meta.uid = Some(string_at(b, "metadata.uid")?),
            meta::RESOURCE_VERSION => {
                b.meta.resource_version = Some(string_at(b, "metadata.resourceVersion")?)
            }
            meta::GENERATION => match field.value {
                // int64: two's complement in a varint.
                Value::Varint(n) => b.meta.generation = n as i64,
                _ => return Err(wrong_type("metadata.generation")),
            },
            meta::DELETION_TIMESTAMP => {
                let (v, _) = value.ok_or_else(|| wrong_type("metadata.deletionTimestamp"))?;
                b.meta.deletion_timestamp = Some(time_seconds(v)?);
            }
            meta::LABELS | meta::ANNOTATIONS => {
                let (entry, entry_at) = value.ok_or_else(|| wrong_type("a label"))?;
                let [k, v] = map_entry(b, entry, entry_at)?;
                if field.number == meta::LABELS {
                    b.label(k, v);
                } else {
                    b.annotation(k, v);
                }
            }
            meta::OWNER_REFERENCES => {
                let (reference, reference_at) =
                    value.ok_or_else(|| wrong_type("an owner reference"))?;
                owner_reference(b, reference, reference_at)?;
            }
            _ => {}
        }
    }
    if let Some(rv) = plan.resource_version {
        push_len_field_head(&mut b.out, meta::RESOURCE_VERSION, rv.len());
        let at = b.out.len();
        b.out.extend_from_slice(rv.as_bytes());
        b.meta.resource_version = Some(b.span_at(at, rv.len())?);
    }
    Ok(())
}

fn wrong_type(what: &str) -> Error {
    Error::Decode(format!(
        "malformed protobuf: {what} has the wrong wire type"
    ))
}

/// A `map<string, string>` entry: `{1: key, 2: value}` (either may be missing: empty).
fn map_entry(b: &Builder, entry: &[u8], entry_at: usize) -> Result<[Span; 2], Error> {
    let mut spans = [b.span_at(entry_at, 0)?; 2];
    for field in Fields::new(entry) {
        match field? {
            (n @ (1 | 2), Value::Bytes(s)) => {
                utf8(s, "a label or annotation")?;
                spans[n as usize - 1] = b.span_at(entry_at + offset_in(entry, s), s.len())?;
            }
            (1 | 2, _) => return Err(wrong_type("a label or annotation")),
            _ => {}
        }
    }
    Ok(spans)
}

fn owner_reference(b: &mut Builder, reference: &[u8], at: usize) -> Result<(), Error> {
    let empty = b.span_at(at, 0)?;
    let mut spans = [empty; 4];
    let mut controller = false;
    for field in Fields::new(reference) {
        let (number, value) = field?;
        let slot = match number {
            owner::API_VERSION => 0,
            owner::KIND => 1,
            owner::NAME => 2,
            owner::UID => 3,
            owner::CONTROLLER => {
                controller = matches!(value, Value::Varint(n) if n != 0);
                continue;
            }
            _ => continue,
        };
        let Value::Bytes(s) = value else {
            return Err(wrong_type("an owner reference's field"));
        };
        utf8(s, "an owner reference's field")?;
        spans[slot] = b.span_at(at + offset_in(reference, s), s.len())?;
    }
    b.owner(spans, controller);
    Ok(())
}

/// `metav1.Time`'s seconds (field 1, an int64).
fn time_seconds(time: &[u8]) -> Result<i64, Error> {
    let mut seconds = 0;
    for field in Fields::new(time) {
        if let (1, Value::Varint(n)) = field? {
            seconds = n as i64;
        }
    }
    Ok(seconds)
}

/// Finds the declared fields that live in top-level field `number` (whose bytes are `inner`,
/// at `inner_at` in the output).
fn find_declared(
    b: &mut Builder,
    declared: &[FieldPath],
    number: u32,
    inner: &[u8],
    inner_at: usize,
) -> Result<(), Error> {
    for (i, path) in declared.iter().enumerate() {
        let Some((&first, rest)) = path.protobuf().split_first() else {
            continue;
        };
        if first != number || rest.is_empty() {
            continue;
        }
        if let Some(found) = find(inner, rest)? {
            let s = utf8(found, path.name())?;
            let span = b.span_at(inner_at + offset_in(inner, found), s.len())?;
            b.field(i, span);
        }
    }
    Ok(())
}

/// The bytes at `path` inside `message`: the last occurrence of each field, as protobuf's
/// decoders take for a singular field.
fn find<'a>(message: &'a [u8], path: &[u32]) -> Result<Option<&'a [u8]>, Error> {
    let Some((&number, rest)) = path.split_first() else {
        return Ok(None);
    };
    let mut last = None;
    for field in Fields::new(message) {
        if let (n, Value::Bytes(v)) = field? {
            if n == number {
                last = Some(v);
            }
        }
    }
    match (last, rest.is_empty()) {
        (Some(v), true) => Ok(Some(v)),
        (Some(v), false) => find(v, rest),
        (None, _) => Ok(None),
    }
}
