//! A recorded Kubernetes watch stream as a workload: what `kubectl get pods -A --watch
//! --output-watch-events -o json` writes, parsed ([`parse_trace`]) and turned into ops and
//! their model ([`to_workload`]) for `loadgen replay` and the child processes it starts.
//!
//! The trace is concatenated `{"type": ..., "object": {...}}` documents, pretty-printed or one
//! per line. Objects are keyed `metadata.namespace/metadata.name` (just the name when
//! cluster-scoped), versioned by `metadata.resourceVersion` (which must be a number, as every
//! apiserver backed by etcd makes it), and indexed by namespace and by `spec.nodeName`.
//! `ADDED` becomes `add`, `MODIFIED` `update`, `DELETED` `delete`; `BOOKMARK`s are skipped and
//! `ERROR`s counted.
//!
//! A bad document (broken JSON, a missing name, an unknown type, a version older than one
//! already seen for its key) is counted and reported with its position, then skipped: the
//! parser resumes at the next `{` that starts a line, which is where kubectl starts every
//! document in both formats.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use kcache::Key;
use serde::Serialize;
use serde_json::Value;

use workloads::{Generated, Model, Op, Pod, Universe};

/// What a watch event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum WatchType {
    /// `ADDED`: becomes `add`.
    Added,
    /// `MODIFIED`: becomes `update`.
    Modified,
    /// `DELETED`: becomes `delete`.
    Deleted,
}

/// Where a document starts (or where it broke): byte offset, and 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Position {
    /// Byte offset in the file.
    pub offset: usize,
    /// 1-based line.
    pub line: usize,
    /// 1-based column (in bytes).
    pub column: usize,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {}, column {} (byte {})",
            self.line, self.column, self.offset
        )
    }
}

/// One object event of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// What happened.
    pub kind: WatchType,
    /// `metadata.namespace`; empty when cluster-scoped.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.nodeName`, if set.
    pub node: Option<String>,
    /// `metadata.resourceVersion`.
    pub resource_version: u64,
    /// Where the document starts.
    pub position: Position,
}

impl WatchEvent {
    /// `namespace/name`, or `name` when cluster-scoped.
    pub fn key(&self) -> String {
        if self.namespace.is_empty() {
            self.name.clone()
        } else {
            format!("{}/{}", self.namespace, self.name)
        }
    }
}

/// A document that was skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadDocument {
    /// Where the document starts.
    pub start: Position,
    /// Where parsing failed (for broken JSON; the start otherwise).
    pub at: Position,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for BadDocument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document at {}: {}", self.start, self.reason)?;
        if self.at != self.start {
            write!(f, " (at {})", self.at)?;
        }
        Ok(())
    }
}

/// A parsed trace.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedTrace {
    /// Object events, in file order.
    pub events: Vec<WatchEvent>,
    /// Documents seen, good and bad.
    pub documents: usize,
    /// `BOOKMARK` documents (skipped).
    pub bookmarks: usize,
    /// Where the `ERROR` documents are.
    pub errors: Vec<Position>,
    /// Skipped documents.
    pub bad: Vec<BadDocument>,
}

/// Maps byte offsets to lines and columns.
struct Lines {
    starts: Vec<usize>,
}

impl Lines {
    fn new(bytes: &[u8]) -> Self {
        let mut starts = vec![0];
        starts.extend(
            bytes
                .iter()
                .enumerate()
                .filter(|(_, &b)| b == b'\n')
                .map(|(i, _)| i + 1),
        );
        Self { starts }
    }

    fn position(&self, offset: usize) -> Position {
        let line = self.starts.partition_point(|&s| s <= offset).max(1);
        Position {
            offset,
            line,
            column: offset - self.starts[line - 1] + 1,
        }
    }

    /// The byte offset of a 1-based line and column, clamped to `len`.
    fn offset(&self, line: usize, column: usize, len: usize) -> usize {
        let start = self
            .starts
            .get(line.saturating_sub(1))
            .copied()
            .unwrap_or(len);
        (start + column.saturating_sub(1)).min(len)
    }
}

/// The next document start after `from`: a `{` at the beginning of a line.
fn resync(bytes: &[u8], from: usize) -> usize {
    (from..bytes.len())
        .find(|&i| bytes[i] == b'{' && i > 0 && bytes[i - 1] == b'\n')
        .unwrap_or(bytes.len())
}

fn skip_whitespace(bytes: &[u8], mut pos: usize) -> usize {
    while pos < bytes.len() && bytes[pos].is_ascii_whitespace() {
        pos += 1;
    }
    pos
}

/// Parses a watch stream. Never fails: what cannot be used is reported in
/// [`ParsedTrace::bad`].
///
/// ```
/// let text = br#"{"type":"ADDED","object":{"metadata":{"namespace":"ns","name":"a","resourceVersion":"5"}}}
/// {"type":"ADDED","object":
/// {"type":"DELETED","object":{"metadata":{"namespace":"ns","name":"a","resourceVersion":"6"}}}
/// "#;
/// let trace = loadgen::watch_trace::parse_trace(text);
/// assert_eq!(trace.events.len(), 2);
/// assert_eq!(trace.bad.len(), 1);
/// assert_eq!(trace.bad[0].start.line, 2);
/// ```
pub fn parse_trace(bytes: &[u8]) -> ParsedTrace {
    let lines = Lines::new(bytes);
    let mut trace = ParsedTrace::default();
    // The newest resourceVersion seen per key, to refuse documents that go back in time.
    let mut newest: HashMap<String, u64> = HashMap::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let base = skip_whitespace(bytes, pos);
        if base >= bytes.len() {
            break;
        }
        let mut stream = serde_json::Deserializer::from_slice(&bytes[base..]).into_iter::<Value>();
        loop {
            let start = skip_whitespace(bytes, base + stream.byte_offset());
            match stream.next() {
                None => {
                    pos = bytes.len();
                    break;
                }
                Some(Ok(doc)) => {
                    trace.documents += 1;
                    let start_pos = lines.position(start);
                    if let Err(reason) = accept(doc, start_pos, &mut newest, &mut trace) {
                        trace.bad.push(BadDocument {
                            start: start_pos,
                            at: start_pos,
                            reason,
                        });
                    }
                }
                Some(Err(e)) => {
                    trace.documents += 1;
                    // serde_json counts lines and columns from where this stream began.
                    let base_pos = lines.position(base);
                    let line = base_pos.line + e.line().saturating_sub(1);
                    let column = if e.line() <= 1 {
                        base_pos.column + e.column().saturating_sub(1)
                    } else {
                        e.column()
                    };
                    let at = lines.position(lines.offset(line, column.max(1), bytes.len()));
                    trace.bad.push(BadDocument {
                        start: lines.position(start),
                        at,
                        reason: format!("invalid JSON: {}", strip_position(&e.to_string())),
                    });
                    pos = resync(bytes, start + 1);
                    break;
                }
            }
        }
    }
    trace
}

/// serde_json appends " at line L column C" relative to its slice; the report gives the
/// absolute position instead.
fn strip_position(message: &str) -> &str {
    message
        .rfind(" at line ")
        .map_or(message, |i| &message[..i])
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_str()
}

/// Turns one document into an event (or a bookmark or an error count).
fn accept(
    doc: Value,
    position: Position,
    newest: &mut HashMap<String, u64>,
    trace: &mut ParsedTrace,
) -> Result<(), String> {
    if !doc.is_object() {
        return Err("not a watch event: expected an object with \"type\" and \"object\"".into());
    }
    let kind = match doc.get("type").and_then(Value::as_str) {
        Some("ADDED") => WatchType::Added,
        Some("MODIFIED") => WatchType::Modified,
        Some("DELETED") => WatchType::Deleted,
        Some("BOOKMARK") => {
            trace.bookmarks += 1;
            return Ok(());
        }
        Some("ERROR") => {
            trace.errors.push(position);
            return Ok(());
        }
        Some(other) => return Err(format!("unknown event type {other:?}")),
        None => return Err("missing \"type\"".into()),
    };
    let object = doc
        .get("object")
        .filter(|o| o.is_object())
        .ok_or("missing \"object\"")?;
    let name = str_at(object, &["metadata", "name"])
        .filter(|n| !n.is_empty())
        .ok_or("missing metadata.name")?;
    let namespace = str_at(object, &["metadata", "namespace"]).unwrap_or("");
    let rv_text = str_at(object, &["metadata", "resourceVersion"])
        .ok_or("missing metadata.resourceVersion")?;
    let resource_version: u64 = rv_text
        .parse()
        .map_err(|_| format!("metadata.resourceVersion {rv_text:?} is not a number"))?;
    let node = str_at(object, &["spec", "nodeName"])
        .filter(|n| !n.is_empty())
        .map(str::to_string);
    let event = WatchEvent {
        kind,
        namespace: namespace.to_string(),
        name: name.to_string(),
        node,
        resource_version,
        position,
    };
    // Per key, a watch delivers strictly newer versions (a deletion may repeat the last one);
    // anything else would make the verdict's version check meaningless.
    let key = event.key();
    if let Some(&seen) = newest.get(&key) {
        let ok = match kind {
            WatchType::Deleted => resource_version >= seen,
            _ => resource_version > seen,
        };
        if !ok {
            return Err(format!(
                "{key}: resourceVersion {resource_version} is older than {seen}, already seen"
            ));
        }
    }
    newest.insert(key, resource_version);
    trace.events.push(event);
    Ok(())
}

/// Interns strings as [`Key`]s, so every object of one value shares one key.
#[derive(Default)]
struct Interner {
    ids: HashMap<String, usize>,
    keys: Vec<Key>,
}

impl Interner {
    fn intern(&mut self, s: &str) -> (usize, Key) {
        if let Some(&id) = self.ids.get(s) {
            return (id, self.keys[id].clone());
        }
        let id = self.keys.len();
        let key = Key::new(s);
        self.ids.insert(s.to_string(), id);
        self.keys.push(key.clone());
        (id, key)
    }
}

/// The ops a replay performs, and the model of where they end: the trace as a workload.
///
/// A `DELETED` of a key that is not alive is replayed (the queue must ignore it) but expects
/// no delivery.
pub fn to_workload(trace: &ParsedTrace, label: &str) -> Generated {
    let (mut keys, mut namespaces, mut nodes) = (
        Interner::default(),
        Interner::default(),
        Interner::default(),
    );
    let mut ops = Vec::with_capacity(trace.events.len());
    let mut alive: Vec<Option<Arc<Pod>>> = Vec::new();
    let mut model = Model::default();
    for event in &trace.events {
        let (id, key) = keys.intern(&event.key());
        let (_, namespace) = namespaces.intern(&event.namespace);
        let node = event.node.as_deref().map(|n| nodes.intern(n).1);
        if alive.len() <= id {
            alive.resize(id + 1, None);
        }
        let pod = Arc::new(Pod::new(
            id as u32,
            key,
            namespace,
            node,
            event.resource_version,
        ));
        match event.kind {
            WatchType::Added | WatchType::Modified => {
                alive[id] = Some(Arc::clone(&pod));
                if event.kind == WatchType::Added {
                    model.expected.added += 1;
                    ops.push(Op::Add(pod));
                } else {
                    model.expected.updated += 1;
                    ops.push(Op::Update(pod));
                }
            }
            WatchType::Deleted => {
                if alive[id].take().is_some() {
                    model.expected.deleted += 1;
                }
                ops.push(Op::Delete(pod));
            }
        }
    }
    model.alive = alive;
    Generated {
        label: label.to_string(),
        ops,
        universe: Universe {
            keys: keys.keys,
            namespaces: namespaces.keys,
            nodes: nodes.keys,
        },
        model,
    }
}
