//! Building a compact object from JSON, in one parse.
//!
//! The object is written back as it is read: its top level, `metadata` and the objects on the
//! way to a declared field are re-emitted member by member (without the whitespace between
//! members), every other value is copied as it arrived (serde_json's `RawValue`: checked, not
//! decoded). `metadata.managedFields` is skipped unless kept. Strings the cache reads are
//! borrowed from the written bytes when they have no escapes, and kept unescaped beside them
//! otherwise.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;

use super::super::super::lister_watcher::Error;
use super::fields::FieldPath;
use super::layout::{Builder, Span};
use super::protobuf::Plan;

/// Writes the object `text` into `b` as kept, collecting its metadata.
pub(crate) fn build(b: &mut Builder, text: &str, plan: Plan<'_>) -> Result<(), Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    object_seed(b, plan)
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|e| Error::Decode(format!("an object is not valid JSON: {e}")))
}

/// The seed that writes a top-level object.
pub(crate) fn object_seed<'b, 'p>(b: &'b mut Builder, plan: Plan<'p>) -> ObjectSeed<'b, 'p> {
    let all = if plan.fields.len() >= 64 {
        u64::MAX
    } else {
        (1u64 << plan.fields.len()) - 1
    };
    ObjectSeed {
        b,
        plan,
        depth: 0,
        declared: all,
    }
}

/// A string as serde_json gives it: borrowed from the input when it had no escapes.
struct JsonStr<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for JsonStr<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JsonStr<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(JsonStr(Cow::Owned(s)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Writes `"key":` after a comma unless first; returns the span of the key's text.
fn write_key(b: &mut Builder, first: &mut bool, key: &JsonStr<'_>) -> Result<Span, Error> {
    if !std::mem::take(first) {
        b.out.push(b',');
    }
    let span = match &key.0 {
        // Borrowed: it had no escapes, so its text is a valid JSON string body as it is.
        Cow::Borrowed(k) => {
            b.out.push(b'"');
            let span = b.span_at(b.out.len(), k.len())?;
            b.out.extend_from_slice(k.as_bytes());
            b.out.push(b'"');
            span
        }
        Cow::Owned(k) => {
            serde_json::to_writer(&mut b.out, k).map_err(|e| Error::Decode(e.to_string()))?;
            b.extra_string(k)?
        }
    };
    b.out.push(b':');
    Ok(span)
}

/// Copies a raw value, returning the span of its string when it is one (`None` for `null`).
fn write_string(b: &mut Builder, raw: &RawValue, what: &str) -> Result<Option<Span>, Error> {
    let text = raw.get();
    let at = b.out.len();
    b.out.extend_from_slice(text.as_bytes());
    string_span(b, text, at, what)
}

/// The span of the string whose JSON text is `text`, written at `at`.
fn string_span(b: &mut Builder, text: &str, at: usize, what: &str) -> Result<Option<Span>, Error> {
    if text == "null" {
        return Ok(None);
    }
    let inner = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .ok_or_else(|| Error::Decode(format!("{what} is not a string")))?;
    if inner.contains('\\') {
        let unescaped: String =
            serde_json::from_str(text).map_err(|e| Error::Decode(format!("{what}: {e}")))?;
        b.extra_string(&unescaped).map(Some)
    } else {
        b.span_at(at + 1, inner.len()).map(Some)
    }
}

fn custom<E: de::Error>(e: Error) -> E {
    E::custom(e)
}

/// Re-emits an object, descending into the members on the way to declared fields.
pub(crate) struct ObjectSeed<'b, 'p> {
    b: &'b mut Builder,
    plan: Plan<'p>,
    depth: usize,
    /// The declared fields whose path matched so far, as bits.
    declared: u64,
}

impl<'de> DeserializeSeed<'de> for ObjectSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ObjectSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.b.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let ObjectSeed {
            b,
            plan,
            depth,
            declared,
        } = self;
        b.out.push(b'{');
        let mut first = true;
        while let Some(key) = map.next_key::<JsonStr<'de>>()? {
            if depth == 0 && key.0 == "metadata" {
                write_key(b, &mut first, &key).map_err(custom)?;
                map.next_value_seed(MetadataSeed { b, plan })?;
                continue;
            }
            let matching = matching(plan.fields, declared, depth, &key.0);
            if matching == 0 {
                let raw: &RawValue = map.next_value()?;
                write_key(b, &mut first, &key).map_err(custom)?;
                b.out.extend_from_slice(raw.get().as_bytes());
                continue;
            }
            write_key(b, &mut first, &key).map_err(custom)?;
            let leaves = leaves(plan.fields, matching, depth);
            if leaves == matching {
                let raw: &RawValue = map.next_value()?;
                let span = write_string(b, raw, &key.0).map_err(custom)?;
                if let Some(span) = span {
                    for i in bits(leaves) {
                        b.field(i, span);
                    }
                }
            } else {
                // A path both ends here and goes on (a declaration error): descend.
                map.next_value_seed(ObjectSeed {
                    b: &mut *b,
                    plan,
                    depth: depth + 1,
                    declared: matching & !leaves,
                })?;
            }
        }
        b.out.push(b'}');
        Ok(())
    }
}

/// The declared fields among `declared` whose segment `depth` is `key`.
fn matching(fields: &[FieldPath], declared: u64, depth: usize, key: &str) -> u64 {
    bits(declared)
        .filter(|&i| fields[i].json().get(depth).is_some_and(|s| s == key))
        .fold(0, |acc, i| acc | 1 << i)
}

/// Those of `matching` that end at `depth`.
fn leaves(fields: &[FieldPath], matching: u64, depth: usize) -> u64 {
    bits(matching)
        .filter(|&i| fields[i].json().len() == depth + 1)
        .fold(0, |acc, i| acc | 1 << i)
}

fn bits(mut set: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        if set == 0 {
            return None;
        }
        let i = set.trailing_zeros() as usize;
        set &= set - 1;
        Some(i)
    })
}

/// Re-emits `metadata`, reading what a cache needs and skipping what is stripped.
struct MetadataSeed<'b, 'p> {
    b: &'b mut Builder,
    plan: Plan<'p>,
}

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object's metadata")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let MetadataSeed { b, plan } = self;
        b.out.push(b'{');
        let mut first = true;
        while let Some(key) = map.next_key::<JsonStr<'de>>()? {
            let key_str: &str = &key.0;
            let skip = (key_str == "managedFields" && !plan.keep_managed_fields)
                || (key_str == "resourceVersion" && plan.resource_version.is_some());
            if skip {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            match key_str {
                "labels" | "annotations" => {
                    write_key(b, &mut first, &key).map_err(custom)?;
                    map.next_value_seed(StringMapSeed {
                        b: &mut *b,
                        labels: key_str == "labels",
                    })?;
                }
                "ownerReferences" => {
                    write_key(b, &mut first, &key).map_err(custom)?;
                    map.next_value_seed(OwnersSeed { b: &mut *b })?;
                }
                _ => {
                    let raw: &RawValue = map.next_value()?;
                    write_key(b, &mut first, &key).map_err(custom)?;
                    // Formatted only for an error message, never per event.
                    let what = || format!("metadata.{key_str}");
                    match key_str {
                        "name" | "namespace" | "uid" | "resourceVersion" => {
                            let field = match key_str {
                                "name" => "metadata.name",
                                "namespace" => "metadata.namespace",
                                "uid" => "metadata.uid",
                                _ => "metadata.resourceVersion",
                            };
                            let span = write_string(b, raw, field).map_err(custom)?;
                            let slot = match key_str {
                                "name" => &mut b.meta.name,
                                "namespace" => &mut b.meta.namespace,
                                "uid" => &mut b.meta.uid,
                                _ => &mut b.meta.resource_version,
                            };
                            *slot = span;
                        }
                        "generation" => {
                            b.out.extend_from_slice(raw.get().as_bytes());
                            b.meta.generation = match raw.get() {
                                "null" => 0,
                                n => n.parse().map_err(|_| {
                                    de::Error::custom(format!("{} is not an integer", what()))
                                })?,
                            };
                        }
                        "deletionTimestamp" => {
                            b.out.extend_from_slice(raw.get().as_bytes());
                            b.meta.deletion_timestamp = match raw.get() {
                                "null" => None,
                                t => Some(rfc3339_seconds(t).ok_or_else(|| {
                                    de::Error::custom(format!(
                                        "{} is not an RFC 3339 time: {t}",
                                        what()
                                    ))
                                })?),
                            };
                        }
                        _ => b.out.extend_from_slice(raw.get().as_bytes()),
                    }
                }
            }
        }
        if let Some(rv) = plan.resource_version {
            let key = JsonStr(Cow::Borrowed("resourceVersion"));
            write_key(b, &mut first, &key).map_err(custom)?;
            let at = b.out.len();
            serde_json::to_writer(&mut b.out, rv).map_err(de::Error::custom)?;
            let text = String::from_utf8_lossy(&b.out[at..]).into_owned();
            b.meta.resource_version =
                string_span(b, &text, at, "resourceVersion").map_err(custom)?;
        }
        b.out.push(b'}');
        Ok(())
    }
}

/// Re-emits a `map[string]string` (labels, annotations), recording each pair.
struct StringMapSeed<'b> {
    b: &'b mut Builder,
    labels: bool,
}

impl<'de> DeserializeSeed<'de> for StringMapSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StringMapSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.b.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let b = self.b;
        b.out.push(b'{');
        let mut first = true;
        while let Some(key) = map.next_key::<JsonStr<'de>>()? {
            let raw: &RawValue = map.next_value()?;
            let k = write_key(b, &mut first, &key).map_err(custom)?;
            let v = write_string(b, raw, "a label or annotation")
                .map_err(custom)?
                .unwrap_or(Span::ABSENT);
            if self.labels {
                b.label(k, v);
            } else {
                b.annotation(k, v);
            }
        }
        b.out.push(b'}');
        Ok(())
    }
}

/// Re-emits `ownerReferences`, recording each.
struct OwnersSeed<'b> {
    b: &'b mut Builder,
}

impl<'de> DeserializeSeed<'de> for OwnersSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for OwnersSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of owner references")
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.b.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let b = self.b;
        b.out.push(b'[');
        let mut first = true;
        while let Some(raw) = seq.next_element::<&RawValue>()? {
            if !std::mem::take(&mut first) {
                b.out.push(b',');
            }
            let at = b.out.len();
            b.out.extend_from_slice(raw.get().as_bytes());
            owner_reference(b, raw.get(), at).map_err(custom)?;
        }
        b.out.push(b']');
        Ok(())
    }
}

/// Records the owner reference whose text (an object, copied as it is) was written at `at`.
fn owner_reference(b: &mut Builder, text: &str, at: usize) -> Result<(), Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Owner<'a> {
        #[serde(borrow, default)]
        api_version: Option<&'a RawValue>,
        #[serde(borrow, default)]
        kind: Option<&'a RawValue>,
        #[serde(borrow, default)]
        name: Option<&'a RawValue>,
        #[serde(borrow, default)]
        uid: Option<&'a RawValue>,
        #[serde(default)]
        controller: Option<bool>,
    }
    let owner: Owner<'_> = serde_json::from_str(text)
        .map_err(|e| Error::Decode(format!("an owner reference: {e}")))?;
    let empty = b.span_at(at, 0)?;
    let mut spans = [empty; 4];
    for (slot, raw) in [owner.api_version, owner.kind, owner.name, owner.uid]
        .into_iter()
        .enumerate()
    {
        if let Some(raw) = raw {
            let raw_at = at + (raw.get().as_ptr() as usize - text.as_ptr() as usize);
            if let Some(span) = string_span(b, raw.get(), raw_at, "an owner reference's field")? {
                spans[slot] = span;
            }
        }
    }
    b.owner(spans, owner.controller.unwrap_or(false));
    Ok(())
}

/// Seconds since the Unix epoch of an RFC 3339 time in JSON (`"2024-05-01T10:00:00Z"`, with
/// an optional fraction and offset), as `metav1.Time` writes it.
pub(crate) fn rfc3339_seconds(text: &str) -> Option<i64> {
    let t = text.strip_prefix('"')?.strip_suffix('"')?.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Option<i64> {
        let digits = t.get(range)?;
        digits.iter().try_fold(0i64, |acc, &d| {
            d.is_ascii_digit().then(|| acc * 10 + i64::from(d - b'0'))
        })
    };
    let sep = |i: usize, c: u8| {
        t.get(i)
            .is_some_and(|&x| x == c || (c == b'T' && x == b't'))
    };
    if !(sep(4, b'-') && sep(7, b'-') && sep(10, b'T') && sep(13, b':') && sep(16, b':')) {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let mut i = 19;
    if t.get(i) == Some(&b'.') {
        i += 1;
        while t.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
    }
    let offset = match t.get(i)? {
        b'Z' | b'z' if i + 1 == t.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == t.len() && t[i + 3] == b':' => {
            let minutes = num(i + 1..i + 3)? * 60 + num(i + 4..i + 6)?;
            if *sign == b'+' {
                minutes * 60
            } else {
                -minutes * 60
            }
        }
        _ => return None,
    };
    // Howard Hinnant's days_from_civil.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second - offset)
}

/// A JSON watch event as read: its type, and its object either written into the builder
/// (`None`: an `ADDED`, `MODIFIED` or `DELETED` whose type came first, as servers write it)
/// or left as text to read by its type.
pub(crate) struct Event<'de> {
    pub(crate) kind: Cow<'de, str>,
    pub(crate) raw_object: Option<&'de str>,
}

/// Reads a watch event, writing its object into `b` when it is a pod-carrying one.
pub(crate) fn event<'de>(
    b: &mut Builder,
    text: &'de str,
    plan: Plan<'_>,
) -> Result<Event<'de>, Error> {
    struct Seed<'b, 'p> {
        b: &'b mut Builder,
        plan: Plan<'p>,
    }
    impl<'de> Visitor<'de> for Seed<'_, '_> {
        type Value = (Option<Cow<'de, str>>, Option<&'de str>, bool);
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a watch event")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let (mut kind, mut raw, mut built) = (None::<Cow<'de, str>>, None, false);
            while let Some(key) = map.next_key::<JsonStr<'de>>()? {
                match &*key.0 {
                    "type" => kind = Some(map.next_value::<JsonStr<'de>>()?.0),
                    "object" => {
                        let carries_object = kind
                            .as_deref()
                            .is_some_and(|k| matches!(k, "ADDED" | "MODIFIED" | "DELETED"));
                        if carries_object && !built {
                            map.next_value_seed(object_seed(&mut *self.b, self.plan))?;
                            built = true;
                        } else {
                            raw = Some(map.next_value::<&'de RawValue>()?.get());
                        }
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok((kind, raw, built))
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let (kind, raw, built) = de
        .deserialize_map(Seed { b, plan })
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| Error::Decode(format!("a watch event is not valid JSON: {e}")))?;
    let kind = kind.ok_or_else(|| Error::Decode("a watch event without a type".to_owned()))?;
    match (built, raw) {
        (true, _) => Ok(Event {
            kind,
            raw_object: None,
        }),
        (false, Some(raw)) => Ok(Event {
            kind,
            raw_object: Some(raw),
        }),
        (false, None) => Err(Error::Decode("a watch event without an object".to_owned())),
    }
}

/// Reads a list: its metadata, and each item built by `item` (which is handed the builder,
/// emptied, after each item is written into it).
pub(crate) fn list<'de>(
    b: &mut Builder,
    fields: usize,
    text: &'de str,
    plan: Plan<'_>,
    item: &mut dyn FnMut(&mut Builder) -> Result<(), Error>,
) -> Result<super::super::codec::JsonListMeta, Error> {
    struct Items<'b, 'p, 'f> {
        b: &'b mut Builder,
        fields: usize,
        plan: Plan<'p>,
        item: &'f mut dyn FnMut(&mut Builder) -> Result<(), Error>,
    }
    impl<'de> DeserializeSeed<'de> for Items<'_, '_, '_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }
    impl<'de> Visitor<'de> for Items<'_, '_, '_> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list's items")
        }
        fn visit_unit<E: de::Error>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            loop {
                self.b.reset(self.fields);
                if seq
                    .next_element_seed(object_seed(&mut *self.b, self.plan))?
                    .is_none()
                {
                    return Ok(());
                }
                (self.item)(&mut *self.b).map_err(custom)?;
            }
        }
    }
    struct List<'b, 'p, 'f> {
        items: Items<'b, 'p, 'f>,
    }
    impl<'de> Visitor<'de> for List<'_, '_, '_> {
        type Value = super::super::codec::JsonListMeta;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut meta = None;
            let mut items = Some(self.items);
            while let Some(key) = map.next_key::<JsonStr<'de>>()? {
                match &*key.0 {
                    "metadata" => meta = Some(map.next_value()?),
                    "items" => match items.take() {
                        Some(seed) => map.next_value_seed(seed)?,
                        None => return Err(de::Error::duplicate_field("items")),
                    },
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(meta.unwrap_or_default())
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let items = Items {
        b,
        fields,
        plan,
        item,
    };
    de.deserialize_map(List { items })
        .and_then(|v| de.end().map(|()| v))
        .map_err(|e| Error::Decode(format!("a list is not valid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_times() {
        assert_eq!(rfc3339_seconds("\"1970-01-01T00:00:00Z\""), Some(0));
        assert_eq!(
            rfc3339_seconds("\"2023-11-14T22:13:20Z\""),
            Some(1_700_000_000)
        );
        assert_eq!(
            rfc3339_seconds("\"2023-11-14T23:13:20.5+01:00\""),
            Some(1_700_000_000)
        );
        assert_eq!(rfc3339_seconds("\"2023-13-14T23:13:20Z\""), None);
        assert_eq!(rfc3339_seconds("\"yesterday\""), None);
        assert_eq!(rfc3339_seconds("12"), None);
    }
}
