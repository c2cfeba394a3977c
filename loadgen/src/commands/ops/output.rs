//! The output lines of an ops trace (docs/traces.md), serialized as compact JSON with the fields in
//! the order the spec shows them (serde writes struct fields in declaration order).

use std::io::{self, Write};

use kcache::{Delta, Deltas, Key};
use serde::{Serialize, Serializer};

use super::trace::TraceObject;

/// One line of replay output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputLine {
    /// A key was popped: `{"pop":K,"initial":B,"deltas":[D,...]}`.
    Popped(PoppedLine),
    /// Nothing was queued: `{"pop":null,"closed":B}`.
    NothingQueued {
        /// Whether the queue was closed.
        closed: bool,
    },
    /// `{"has_synced":B}`.
    HasSynced(bool),
    /// `{"keys":[K,...]}`, sorted.
    Keys(Vec<Key>),
    /// `{"known":[[K,v],...]}`, sorted by key.
    Known(Vec<(Key, i64)>),
}

/// What one pop handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoppedLine {
    /// The popped key.
    pub key: Key,
    /// The `is_in_initial_list` flag the pop passed to its process function.
    pub initial: bool,
    /// The key's deltas, oldest first.
    pub deltas: Vec<DeltaLine>,
}

impl PoppedLine {
    /// The line for popped `deltas`.
    pub fn new(deltas: &Deltas<TraceObject>, initial: bool) -> Self {
        Self {
            key: deltas.key().clone(),
            initial,
            deltas: deltas.iter().map(DeltaLine::new).collect(),
        }
    }
}

/// One delta as the output shows it: `{"type":T,"v":N}` or
/// `{"type":"Deleted","tombstone":true,"v":N or null}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeltaLine {
    /// The delta type, as client-go names it.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Whether the payload is a tombstone; only written when true.
    #[serde(skip_serializing_if = "is_false")]
    pub tombstone: bool,
    /// The object's version, or for a tombstone its last known object's version.
    pub v: Option<i64>,
}

impl DeltaLine {
    /// The line for one delta.
    pub fn new(delta: &Delta<TraceObject>) -> Self {
        Self {
            kind: delta.kind.as_str(),
            tombstone: delta.object.is_tombstone(),
            v: delta.object.last_known().map(|obj| obj.v),
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn key_str<S: Serializer>(key: &Key, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(key.as_str())
}

#[derive(Serialize)]
struct PopJson<'a> {
    #[serde(serialize_with = "key_str")]
    pop: &'a Key,
    initial: bool,
    deltas: &'a [DeltaLine],
}

#[derive(Serialize)]
struct EmptyPopJson {
    pop: Option<()>,
    closed: bool,
}

#[derive(Serialize)]
struct HasSyncedJson {
    has_synced: bool,
}

#[derive(Serialize)]
struct KeysJson<'a> {
    keys: Vec<&'a str>,
}

#[derive(Serialize)]
struct KnownJson<'a> {
    known: Vec<(&'a str, i64)>,
}

impl OutputLine {
    /// Writes the line as compact JSON followed by a newline.
    ///
    /// ```
    /// use loadgen::commands::ops::OutputLine;
    /// let mut out = Vec::new();
    /// OutputLine::NothingQueued { closed: false }.write_to(&mut out).unwrap();
    /// assert_eq!(out, b"{\"pop\":null,\"closed\":false}\n");
    /// ```
    pub fn write_to<W: Write + ?Sized>(&self, out: &mut W) -> io::Result<()> {
        match self {
            OutputLine::Popped(p) => serde_json::to_writer(
                &mut *out,
                &PopJson {
                    pop: &p.key,
                    initial: p.initial,
                    deltas: &p.deltas,
                },
            ),
            OutputLine::NothingQueued { closed } => serde_json::to_writer(
                &mut *out,
                &EmptyPopJson {
                    pop: None,
                    closed: *closed,
                },
            ),
            OutputLine::HasSynced(b) => {
                serde_json::to_writer(&mut *out, &HasSyncedJson { has_synced: *b })
            }
            OutputLine::Keys(keys) => serde_json::to_writer(
                &mut *out,
                &KeysJson {
                    keys: keys.iter().map(Key::as_str).collect(),
                },
            ),
            OutputLine::Known(known) => serde_json::to_writer(
                &mut *out,
                &KnownJson {
                    known: known.iter().map(|(k, v)| (k.as_str(), *v)).collect(),
                },
            ),
        }
        .map_err(io::Error::from)?;
        out.write_all(b"\n")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kcache::{DeltaType, Tombstone};

    use super::*;

    fn text(line: &OutputLine) -> String {
        let mut out = Vec::new();
        line.write_to(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn pop_line_keeps_spec_field_order_and_marks_only_tombstones() {
        let a = Arc::new(TraceObject::new("ns/a", 1));
        let deltas = Deltas::from_vec(
            Key::new("ns/a"),
            vec![
                Delta::new(DeltaType::Added, Arc::clone(&a)),
                Delta::tombstone(Tombstone {
                    key: Key::new("ns/a"),
                    last_known: Some(a),
                }),
                Delta::tombstone(Tombstone {
                    key: Key::new("ns/a"),
                    last_known: None,
                }),
            ],
        );
        let line = OutputLine::Popped(PoppedLine::new(&deltas, true));
        assert_eq!(
            text(&line),
            concat!(
                r#"{"pop":"ns/a","initial":true,"deltas":[{"type":"Added","v":1},"#,
                r#"{"type":"Deleted","tombstone":true,"v":1},"#,
                r#"{"type":"Deleted","tombstone":true,"v":null}]}"#,
                "\n"
            )
        );
    }

    #[test]
    fn query_lines_are_compact_json() {
        assert_eq!(
            text(&OutputLine::HasSynced(true)),
            "{\"has_synced\":true}\n"
        );
        assert_eq!(
            text(&OutputLine::Keys(vec![Key::new("a"), Key::new("b")])),
            "{\"keys\":[\"a\",\"b\"]}\n"
        );
        assert_eq!(
            text(&OutputLine::Known(vec![(Key::new("ns/a"), 2)])),
            "{\"known\":[[\"ns/a\",2]]}\n"
        );
        assert_eq!(
            text(&OutputLine::NothingQueued { closed: true }),
            "{\"pop\":null,\"closed\":true}\n"
        );
    }
}
