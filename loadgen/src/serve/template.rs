//! Templates compiled from typed pods: a pod of the `typical` and `large` profiles is written
//! per event from fixed byte chunks and holes, in JSON and in protobuf, with no typed object.
//!
//! A template is compiled once per [`Shape`]: [`super::profile`] builds the typed pod with a
//! sentinel in every varying place ([`Values::sentinels`]), serde writes it as JSON and prost
//! as protobuf (through [`super::convert`]), and the compiler finds the sentinels in both:
//!
//! - in JSON, a string slot is the whole string token `"@@NN@@"`, an integer slot a number
//!   token, a time slot the whole `"YYYY-MM-DDTHH:MM:SSZ"` token; everything between them is
//!   a fixed chunk. Rendering writes the chunks and the values (strings escaped as serde_json
//!   escapes them).
//! - in protobuf, a string slot is a length-delimited field whose content is exactly the
//!   sentinel, an integer or time slot a varint field whose value is the sentinel (a `Time`'s
//!   `seconds`). A length-delimited field that contains a sentinel without being one is a
//!   nested message: the compiler recurses into it and the template keeps it open, so that a
//!   render computes the length of every enclosing message from the values it writes (one pass
//!   for the lengths, one for the bytes). Everything else is a fixed chunk.
//!
//! The compiled templates are checked against the bytes they came from when compiled, and the
//! tests hold renders to serde and prost for random values ([`super::encode`]'s tests).

use std::ops::Range;
use std::sync::OnceLock;

use prost::Message;

use super::bytes::{push_json_str, push_rfc3339, push_u64, varint, varint_len};
use super::objects::POD_HEAD;
use super::profile::{self, i, s, t, Shape, Values};

/// One varying value's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// A string ([`s`]).
    Str(u8),
    /// An integer ([`i`]).
    Int(u8),
    /// A time ([`t`]).
    Time(u8),
}

impl Slot {
    /// The value to write as a varint (integers and times).
    fn number(self, v: &Values) -> u64 {
        match self {
            Slot::Int(k) => v.ints[usize::from(k)],
            // Times are clamped to 1970..=9999 (`Values::of`): never negative.
            Slot::Time(k) => v.times[usize::from(k)] as u64,
            Slot::Str(_) => unreachable!("a string is not a varint"),
        }
    }
}

/// A step of a JSON render.
#[derive(Debug, Clone, Copy)]
enum JsonOp {
    /// Fixed bytes: a range of [`JsonTemplate::bytes`].
    Chunk(u32, u32),
    /// A value, as its JSON token.
    Value(Slot),
    /// Where the `metadata` object starts.
    MetadataStart,
    /// Where it ends.
    MetadataEnd,
}

/// The JSON form: chunks and values.
#[derive(Debug)]
struct JsonTemplate {
    bytes: Vec<u8>,
    ops: Vec<JsonOp>,
}

/// A step of a protobuf render.
#[derive(Debug, Clone, Copy)]
enum ProtobufOp {
    /// Fixed bytes: a range of [`ProtobufTemplate::bytes`].
    Chunk(u32, u32),
    /// A string field's length and content (its key is in the chunk before).
    Str(u8),
    /// A varint field's value (its key is in the chunk before).
    Varint(Slot),
    /// A nested message begins: its length (its key is in the chunk before).
    Open,
    /// The innermost open message ends.
    Close,
}

/// The protobuf form: chunks, values and the nested messages that hold values.
#[derive(Debug)]
struct ProtobufTemplate {
    bytes: Vec<u8>,
    ops: Vec<ProtobufOp>,
    /// How many `Open`s.
    messages: usize,
}

/// Nested messages deeper than this are not expected in a pod (a `Time` inside a container
/// state inside a container status inside the status is 4).
const MAX_DEPTH: usize = 16;

/// A pod shape's compiled template.
#[derive(Debug)]
pub struct Template {
    json: JsonTemplate,
    protobuf: ProtobufTemplate,
}

static TEMPLATES: [OnceLock<Template>; Shape::COUNT] = [const { OnceLock::new() }; Shape::COUNT];

/// The template of `shape`, compiled the first time it is asked for.
pub fn template(shape: Shape) -> &'static Template {
    TEMPLATES[shape.index()].get_or_init(|| Template::of_shape(shape))
}

impl Template {
    /// Builds the typed pod of `shape` with sentinels, encodes it both ways and compiles.
    fn of_shape(shape: Shape) -> Template {
        let sentinels = Values::sentinels();
        let pod = profile::typed_pod(shape, &sentinels);
        let json = serde_json::to_vec(&pod).expect("a Pod always serialises");
        let metadata = serde_json::to_vec(&pod.metadata).expect("metadata serialises");
        let head = [POD_HEAD, br#""metadata":"#].concat();
        assert!(
            json.starts_with(&head) && json[head.len()..].starts_with(&metadata),
            "k8s-openapi writes apiVersion, kind, then metadata"
        );
        let metadata = head.len()..head.len() + metadata.len();
        let protobuf = super::convert::pod(&pod).encode_to_vec();
        Template::compile(&json, metadata, &protobuf, &sentinels)
    }

    /// Compiles the JSON `json` (whose `metadata` object is at `metadata`) and the protobuf
    /// `protobuf` of one pod built from `sentinels`.
    fn compile(json: &[u8], metadata: Range<usize>, protobuf: &[u8], sentinels: &Values) -> Self {
        let template = Template {
            json: compile_json(json, metadata.clone(), sentinels),
            protobuf: compile_protobuf(protobuf, sentinels),
        };
        let mut again = Vec::new();
        let range = template.write_json(&mut again, sentinels);
        assert!(
            again == json && range == metadata,
            "the JSON template renders its source"
        );
        assert!(
            template.protobuf(sentinels) == protobuf,
            "the protobuf template renders its source"
        );
        template
    }

    /// Appends the pod with `values` as JSON to `out`; returns where its `metadata` is in
    /// `out`.
    pub fn write_json(&self, out: &mut Vec<u8>, values: &Values) -> Range<usize> {
        out.reserve(self.json.bytes.len() + 512);
        let mut metadata = 0..0;
        for op in &self.json.ops {
            match *op {
                JsonOp::Chunk(a, b) => {
                    out.extend_from_slice(&self.json.bytes[a as usize..b as usize]);
                }
                JsonOp::Value(Slot::Str(k)) => {
                    push_json_str(out, values.str(usize::from(k)));
                }
                JsonOp::Value(Slot::Int(k)) => push_u64(out, values.ints[usize::from(k)]),
                JsonOp::Value(Slot::Time(k)) => {
                    out.push(b'"');
                    push_rfc3339(out, values.times[usize::from(k)]);
                    out.push(b'"');
                }
                JsonOp::MetadataStart => metadata.start = out.len(),
                JsonOp::MetadataEnd => metadata.end = out.len(),
            }
        }
        metadata
    }

    /// The bare `v1.Pod` message with `values`.
    pub fn protobuf(&self, values: &Values) -> Vec<u8> {
        let p = &self.protobuf;
        // First the length of every open message, innermost first.
        let mut lengths = vec![0usize; p.messages];
        let mut stack = [0usize; MAX_DEPTH + 1];
        let mut open = [0usize; MAX_DEPTH + 1];
        let (mut depth, mut next) = (0, 0);
        for op in &p.ops {
            match *op {
                ProtobufOp::Chunk(a, b) => stack[depth] += (b - a) as usize,
                ProtobufOp::Str(k) => {
                    let len = values.str(usize::from(k)).len();
                    stack[depth] += varint_len(len as u64) + len;
                }
                ProtobufOp::Varint(slot) => stack[depth] += varint_len(slot.number(values)),
                ProtobufOp::Open => {
                    depth += 1;
                    stack[depth] = 0;
                    open[depth] = next;
                    next += 1;
                }
                ProtobufOp::Close => {
                    let len = stack[depth];
                    lengths[open[depth]] = len;
                    depth -= 1;
                    stack[depth] += varint_len(len as u64) + len;
                }
            }
        }
        // Then the bytes.
        let mut out = Vec::with_capacity(stack[0]);
        let mut message = 0;
        for op in &p.ops {
            match *op {
                ProtobufOp::Chunk(a, b) => out.extend_from_slice(&p.bytes[a as usize..b as usize]),
                ProtobufOp::Str(k) => {
                    let value = values.str(usize::from(k));
                    varint(&mut out, value.len() as u64);
                    out.extend_from_slice(value.as_bytes());
                }
                ProtobufOp::Varint(slot) => varint(&mut out, slot.number(values)),
                ProtobufOp::Open => {
                    varint(&mut out, lengths[message] as u64);
                    message += 1;
                }
                ProtobufOp::Close => {}
            }
        }
        debug_assert_eq!(out.len(), stack[0]);
        out
    }

    /// How many values the JSON form and the protobuf form write.
    #[cfg(test)]
    pub fn holes(&self) -> (usize, usize) {
        let json = self
            .json
            .ops
            .iter()
            .filter(|op| matches!(op, JsonOp::Value(_)))
            .count();
        let protobuf = self
            .protobuf
            .ops
            .iter()
            .filter(|op| matches!(op, ProtobufOp::Str(_) | ProtobufOp::Varint(_)))
            .count();
        (json, protobuf)
    }
}

/// Every sentinel: its slot, its JSON token, its protobuf form (a string's content, or a
/// varint's value).
fn sentinels(v: &Values) -> Vec<(Slot, Vec<u8>)> {
    let mut out = Vec::new();
    for k in 0..s::COUNT {
        out.push((Slot::Str(k as u8), format!("\"{}\"", v.str(k)).into_bytes()));
    }
    for k in 0..i::COUNT {
        let mut token = Vec::new();
        push_u64(&mut token, v.ints[k]);
        out.push((Slot::Int(k as u8), token));
    }
    for k in 0..t::COUNT {
        let mut token = vec![b'"'];
        push_rfc3339(&mut token, v.times[k]);
        token.push(b'"');
        out.push((Slot::Time(k as u8), token));
    }
    out
}

fn find_all<'a>(haystack: &'a [u8], needle: &'a [u8]) -> impl Iterator<Item = usize> + 'a {
    haystack
        .windows(needle.len())
        .enumerate()
        .filter(move |(_, w)| *w == needle)
        .map(|(at, _)| at)
}

fn compile_json(json: &[u8], metadata: Range<usize>, v: &Values) -> JsonTemplate {
    // (position, length, op), sorted by position.
    let mut found: Vec<(usize, usize, JsonOp)> = vec![
        (metadata.start, 0, JsonOp::MetadataStart),
        (metadata.end, 0, JsonOp::MetadataEnd),
    ];
    for (slot, token) in sentinels(v) {
        for at in find_all(json, &token) {
            if let Slot::Int(_) = slot {
                // A number token: not a part of a longer number.
                let digit = |i: Option<&u8>| i.is_some_and(u8::is_ascii_digit);
                if digit(at.checked_sub(1).and_then(|p| json.get(p)))
                    || digit(json.get(at + token.len()))
                {
                    continue;
                }
            }
            found.push((at, token.len(), JsonOp::Value(slot)));
        }
    }
    // Marks sort before a value at the same place (metadata starts with `{`, never a value).
    found.sort_by_key(|&(at, len, _)| (at, len));
    let mut ops = Vec::new();
    let mut last = 0;
    for (at, len, op) in found {
        assert!(at >= last, "sentinels overlap at {at}");
        if at > last {
            ops.push(JsonOp::Chunk(last as u32, at as u32));
        }
        ops.push(op);
        last = at + len;
    }
    if last < json.len() {
        ops.push(JsonOp::Chunk(last as u32, json.len() as u32));
    }
    JsonTemplate {
        bytes: json.to_vec(),
        ops,
    }
}

/// The protobuf sentinels: string contents and varint values.
struct ProtobufSentinels {
    strings: Vec<(Vec<u8>, u8)>,
    varints: Vec<(u64, Slot)>,
    /// Every sentinel's encoded bytes, to tell whether a field holds one somewhere inside.
    patterns: Vec<Vec<u8>>,
}

impl ProtobufSentinels {
    fn new(v: &Values) -> Self {
        let strings: Vec<(Vec<u8>, u8)> = (0..s::COUNT)
            .map(|k| (v.str(k).as_bytes().to_vec(), k as u8))
            .collect();
        let mut varints: Vec<(u64, Slot)> = (0..i::COUNT)
            .map(|k| (v.ints[k], Slot::Int(k as u8)))
            .collect();
        varints.extend((0..t::COUNT).map(|k| (v.times[k] as u64, Slot::Time(k as u8))));
        let mut patterns: Vec<Vec<u8>> = strings.iter().map(|(s, _)| s.clone()).collect();
        for &(n, _) in &varints {
            let mut encoded = Vec::new();
            varint(&mut encoded, n);
            patterns.push(encoded);
        }
        Self {
            strings,
            varints,
            patterns,
        }
    }

    fn holds_one(&self, bytes: &[u8]) -> bool {
        self.patterns
            .iter()
            .any(|p| find_all(bytes, p).next().is_some())
    }
}

/// A protobuf template being compiled: the fixed bytes not yet closed into a chunk.
struct ProtobufCompiler<'a> {
    sentinels: &'a ProtobufSentinels,
    bytes: Vec<u8>,
    ops: Vec<ProtobufOp>,
    chunk_start: usize,
    messages: usize,
}

impl ProtobufCompiler<'_> {
    fn flush(&mut self) {
        if self.bytes.len() > self.chunk_start {
            self.ops.push(ProtobufOp::Chunk(
                self.chunk_start as u32,
                self.bytes.len() as u32,
            ));
            self.chunk_start = self.bytes.len();
        }
    }

    fn message(&mut self, mut message: &[u8], depth: usize) {
        assert!(
            depth <= MAX_DEPTH,
            "messages nested deeper than {MAX_DEPTH}"
        );
        while !message.is_empty() {
            let (key, key_len) = read_varint(message);
            self.bytes.extend_from_slice(&message[..key_len]);
            message = &message[key_len..];
            match key & 7 {
                0 => {
                    let (value, len) = read_varint(message);
                    match self.sentinels.varints.iter().find(|&&(n, _)| n == value) {
                        Some(&(_, slot)) => {
                            self.flush();
                            self.ops.push(ProtobufOp::Varint(slot));
                        }
                        None => self.bytes.extend_from_slice(&message[..len]),
                    }
                    message = &message[len..];
                }
                2 => {
                    let (len, len_len) = read_varint(message);
                    let end = len_len + len as usize;
                    let content = &message[len_len..end];
                    if let Some(&(_, k)) = self.sentinels.strings.iter().find(|(s, _)| s == content)
                    {
                        self.flush();
                        self.ops.push(ProtobufOp::Str(k));
                    } else if self.sentinels.holds_one(content) {
                        self.flush();
                        self.ops.push(ProtobufOp::Open);
                        self.messages += 1;
                        self.message(content, depth + 1);
                        self.flush();
                        self.ops.push(ProtobufOp::Close);
                    } else {
                        self.bytes.extend_from_slice(&message[..end]);
                    }
                    message = &message[end..];
                }
                1 => {
                    self.bytes.extend_from_slice(&message[..8]);
                    message = &message[8..];
                }
                5 => {
                    self.bytes.extend_from_slice(&message[..4]);
                    message = &message[4..];
                }
                other => panic!("protobuf wire type {other} in a pod"),
            }
        }
    }
}

fn compile_protobuf(protobuf: &[u8], v: &Values) -> ProtobufTemplate {
    let sentinels = ProtobufSentinels::new(v);
    let mut compiler = ProtobufCompiler {
        sentinels: &sentinels,
        bytes: Vec::with_capacity(protobuf.len()),
        ops: Vec::new(),
        chunk_start: 0,
        messages: 0,
    };
    compiler.message(protobuf, 0);
    compiler.flush();
    ProtobufTemplate {
        bytes: compiler.bytes,
        ops: compiler.ops,
        messages: compiler.messages,
    }
}

/// A varint at the start of `bytes`, and its length.
fn read_varint(bytes: &[u8]) -> (u64, usize) {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return (value, i + 1);
        }
    }
    panic!("a truncated varint in a pod");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_compiles_with_its_values_in_both_forms() {
        for shape in Shape::all() {
            let (json, protobuf) = template(shape).holes();
            // Scheduled pods carry node, IPs, container statuses; pending ones do not.
            assert!(
                json >= 12 && protobuf >= 12,
                "{shape:?}: {json} / {protobuf}"
            );
            assert_eq!(json, protobuf, "{shape:?}: the same values in both forms");
        }
    }

    #[test]
    fn varints_round_trip() {
        for n in [0, 1, 127, 128, 300, u64::from(u32::MAX), u64::MAX] {
            let mut out = Vec::new();
            varint(&mut out, n);
            assert_eq!(read_varint(&out), (n, out.len()));
        }
    }
}
