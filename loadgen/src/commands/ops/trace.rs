//! Parsing one line of an ops trace (docs/traces.md) into an [`Op`].
//!
//! Parsing is hand-written over `serde_json::Value` rather than derived, so that every
//! complaint names the op and the field and shows what a correct line looks like: a trace is
//! written by hand, and the person fixing it reads these messages.

use std::sync::Arc;

use kcache::{Key, KeyError};
use serde_json::{Map, Value};

/// An object of a trace: `{"key":"ns/name","v":N}`; any other field is ignored.
///
/// ```
/// use loadgen::commands::ops::TraceObject;
/// let pod = TraceObject::new("ns/a", 3);
/// assert_eq!(pod.key.as_str(), "ns/a");
/// assert_eq!(pod.namespace.as_str(), "ns");
/// assert_eq!(TraceObject::new("node-1", 1).namespace.as_str(), "");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceObject {
    /// The object's key, exactly as the trace spells it. Empty means "no identity": the key
    /// function refuses it (see [`TraceObject::key_of`]).
    pub key: Key,
    /// The object's version: what the output lines report as `"v"`.
    pub v: i64,
    /// The part of the key before the first `/`, or `""` when there is none; the known store
    /// indexes objects by it.
    pub namespace: Key,
}

impl TraceObject {
    /// An object with `key` at version `v`.
    pub fn new(key: &str, v: i64) -> Self {
        let namespace = key.split_once('/').map_or("", |(ns, _)| ns);
        Self {
            key: Key::new(key),
            v,
            namespace: Key::new(namespace),
        }
    }

    /// The key function of every queue and store the replay builds: the object's own key, or
    /// a [`KeyError`] when it is empty.
    ///
    /// ```
    /// use loadgen::commands::ops::TraceObject;
    /// assert_eq!(TraceObject::key_of(&TraceObject::new("ns/a", 1)).unwrap().as_str(), "ns/a");
    /// assert!(TraceObject::key_of(&TraceObject::new("", 1)).is_err());
    /// ```
    pub fn key_of(obj: &TraceObject) -> Result<Key, KeyError> {
        if obj.key.as_str().is_empty() {
            Err(KeyError::new("the object's \"key\" is empty"))
        } else {
            Ok(obj.key.clone())
        }
    }
}

/// The optional first line of a trace: how the queue is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceConfig {
    /// Give the queue a known store (an indexer that every pop feeds). Default true.
    pub known_objects: bool,
    /// `replace` queues `Replaced` rather than `Sync`. Default false.
    pub emit_replaced: bool,
    /// Level-triggered mode: consecutive `Updated`/`Sync`/`Replaced` deltas of a key compact
    /// into the newest (`QueueOptions::compact_updates`). Default false.
    pub compact_updates: bool,
}

impl Default for TraceConfig {
    fn default() -> Self {
        Self {
            known_objects: true,
            emit_replaced: false,
            compact_updates: false,
        }
    }
}

/// One line of a trace.
#[derive(Debug, Clone)]
pub enum Op {
    /// `{"op":"config",...}`: only valid as the first non-blank line.
    Config(TraceConfig),
    /// `{"op":"add","obj":O}`.
    Add(Arc<TraceObject>),
    /// `{"op":"update","obj":O}`.
    Update(Arc<TraceObject>),
    /// `{"op":"delete","obj":O}`.
    Delete(Arc<TraceObject>),
    /// `{"op":"delete_tombstone","key":K,"obj":O or null}`.
    DeleteTombstone {
        /// The tombstone's key.
        key: Key,
        /// The last known state, if any.
        last_known: Option<Arc<TraceObject>>,
    },
    /// `{"op":"replace","objs":[O,...]}`.
    Replace(Vec<Arc<TraceObject>>),
    /// `{"op":"resync"}`.
    Resync,
    /// `{"op":"pop"}`: one non-blocking pop.
    Pop,
    /// `{"op":"drain"}`: non-blocking pops until nothing is queued.
    Drain,
    /// `{"op":"has_synced"}`.
    HasSynced,
    /// `{"op":"keys"}`: the queued keys, sorted.
    Keys,
    /// `{"op":"known"}`: the known store, sorted by key.
    Known,
    /// `{"op":"close"}`.
    Close,
}

impl Op {
    /// The op's name as traces spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Config(_) => "config",
            Op::Add(_) => "add",
            Op::Update(_) => "update",
            Op::Delete(_) => "delete",
            Op::DeleteTombstone { .. } => "delete_tombstone",
            Op::Replace(_) => "replace",
            Op::Resync => "resync",
            Op::Pop => "pop",
            Op::Drain => "drain",
            Op::HasSynced => "has_synced",
            Op::Keys => "keys",
            Op::Known => "known",
            Op::Close => "close",
        }
    }
}

/// Every op name with the fields it takes, in the order the error messages list them.
const OPS: &[(&str, &[&str])] = &[
    (
        "config",
        &["known_objects", "emit_replaced", "compact_updates"],
    ),
    ("add", &["obj"]),
    ("update", &["obj"]),
    ("delete", &["obj"]),
    ("delete_tombstone", &["key", "obj"]),
    ("replace", &["objs"]),
    ("resync", &[]),
    ("pop", &[]),
    ("drain", &[]),
    ("has_synced", &[]),
    ("keys", &[]),
    ("known", &[]),
    ("close", &[]),
];

/// An example object, shown in messages about malformed objects.
const OBJ_EXAMPLE: &str = r#"{"key":"ns/a","v":1}"#;

/// Parses one non-blank trace line. The error says what is wrong and how to fix it; it does
/// not carry the line number (the caller adds it).
///
/// ```
/// use loadgen::commands::ops::{parse_op, Op};
/// assert!(matches!(parse_op(r#"{"op":"pop"}"#), Ok(Op::Pop)));
/// assert!(matches!(parse_op(r#"{"op":"add","obj":{"key":"ns/a","v":1,"node":"n1"}}"#), Ok(Op::Add(_))));
/// assert!(parse_op(r#"{"op":"add"}"#).unwrap_err().contains("\"obj\""));
/// ```
pub fn parse_op(line: &str) -> Result<Op, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| {
        format!("not valid JSON ({e}); write one JSON object per line, e.g. {{\"op\":\"pop\"}}")
    })?;
    let fields = as_object(&value, "a JSON object such as {\"op\":\"pop\"}")?;
    let op = string_field(fields, "op", "\"add\"", || {
        format!(
            "missing \"op\"; every line names one, e.g. {{\"op\":\"add\",\"obj\":{OBJ_EXAMPLE}}}"
        )
    })?;
    let Some(&(op, allowed)) = OPS.iter().find(|(name, _)| *name == op) else {
        let names: Vec<&str> = OPS.iter().map(|(name, _)| *name).collect();
        return Err(format!(
            "unknown op {op:?}; use one of {}",
            names.join(", ")
        ));
    };
    // Unknown fields are refused rather than ignored: in a hand-written trace they are typos
    // (`"known_object"`, `"obs"`), and ignoring one silently would test something else.
    if let Some(extra) = fields
        .keys()
        .find(|k| k.as_str() != "op" && !allowed.contains(&k.as_str()))
    {
        let takes = if allowed.is_empty() {
            "no other fields".to_owned()
        } else {
            format!("only {}", quoted_list(allowed))
        };
        return Err(format!(
            "op {op:?} has no field {extra:?}; it takes {takes}"
        ));
    }
    let fields = Fields { op, map: fields };
    Ok(match op {
        "config" => Op::Config(TraceConfig {
            known_objects: fields.optional_bool("known_objects", true)?,
            emit_replaced: fields.optional_bool("emit_replaced", false)?,
            compact_updates: fields.optional_bool("compact_updates", false)?,
        }),
        "add" => Op::Add(fields.object("obj")?),
        "update" => Op::Update(fields.object("obj")?),
        "delete" => Op::Delete(fields.object("obj")?),
        "delete_tombstone" => Op::DeleteTombstone {
            key: fields.key("key")?,
            last_known: fields.object_or_null("obj")?,
        },
        "replace" => Op::Replace(fields.objects("objs")?),
        "resync" => Op::Resync,
        "pop" => Op::Pop,
        "drain" => Op::Drain,
        "has_synced" => Op::HasSynced,
        "keys" => Op::Keys,
        "known" => Op::Known,
        "close" => Op::Close,
        // `OPS` and this match list the same names; a name in one and not the other is a bug
        // in this file, reported as a malformed line rather than a panic.
        other => return Err(format!("op {other:?} is listed but not implemented")),
    })
}

/// The fields of one op line, with typed getters whose errors name the op and the field.
struct Fields<'a> {
    op: &'a str,
    map: &'a Map<String, Value>,
}

impl Fields<'_> {
    fn required(&self, name: &str, what: &str) -> Result<&Value, String> {
        self.map
            .get(name)
            .ok_or_else(|| format!("op {:?} needs field {name:?}, {what}", self.op))
    }

    fn optional_bool(&self, name: &str, default: bool) -> Result<bool, String> {
        match self.map.get(name) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(format!(
                "op {:?}: field {name:?} must be true or false, found {}",
                self.op,
                describe(other)
            )),
        }
    }

    fn key(&self, name: &str) -> Result<Key, String> {
        match self.required(name, "a key string such as \"ns/a\"")? {
            Value::String(s) => Ok(Key::new(s)),
            other => Err(format!(
                "op {:?}: field {name:?} must be a key string such as \"ns/a\", found {}",
                self.op,
                describe(other)
            )),
        }
    }

    fn object(&self, name: &str) -> Result<Arc<TraceObject>, String> {
        let value = self.required(name, &format!("an object such as {OBJ_EXAMPLE}"))?;
        parse_object(value).map_err(|e| format!("op {:?}: field {name:?}: {e}", self.op))
    }

    fn object_or_null(&self, name: &str) -> Result<Option<Arc<TraceObject>>, String> {
        let value = self.required(
            name,
            &format!("the last known object such as {OBJ_EXAMPLE}, or null"),
        )?;
        if value.is_null() {
            return Ok(None);
        }
        parse_object(value)
            .map(Some)
            .map_err(|e| format!("op {:?}: field {name:?}: {e} (or null)", self.op))
    }

    fn objects(&self, name: &str) -> Result<Vec<Arc<TraceObject>>, String> {
        let what = format!("a list of objects such as [{OBJ_EXAMPLE}]");
        let Value::Array(items) = self.required(name, &what)? else {
            return Err(format!(
                "op {:?}: field {name:?} must be {what}, found {}",
                self.op,
                describe(&self.map[name])
            ));
        };
        items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                parse_object(item)
                    .map_err(|e| format!("op {:?}: field {name:?}, item {i}: {e}", self.op))
            })
            .collect()
    }
}

/// Parses `{"key":K,"v":N,...}`; fields other than `key` and `v` are ignored (docs/traces.md).
fn parse_object(value: &Value) -> Result<Arc<TraceObject>, String> {
    let map = as_object(value, &format!("an object such as {OBJ_EXAMPLE}"))?;
    let key = string_field(map, "key", "\"ns/a\"", || {
        format!("the object has no \"key\"; write e.g. {OBJ_EXAMPLE}")
    })?;
    let v = match map.get("v") {
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| {
            format!("\"v\" must be a whole number that fits in 64 bits, found {n}")
        })?,
        Some(other) => {
            return Err(format!(
                "\"v\" must be a whole number (the version), found {}",
                describe(other)
            ))
        }
        None => return Err(format!("the object has no \"v\"; write e.g. {OBJ_EXAMPLE}")),
    };
    Ok(Arc::new(TraceObject::new(key, v)))
}

/// `value` as an object, or an error that says `expected` (e.g. `an object such as …`).
fn as_object<'a>(value: &'a Value, expected: &str) -> Result<&'a Map<String, Value>, String> {
    match value {
        Value::Object(map) => Ok(map),
        other => Err(format!("expected {expected}, found {}", describe(other))),
    }
}

/// The string field `name` of `map`; `such_as` is an example value for the message when it is
/// not a string, `missing` the message when it is absent.
fn string_field<'a>(
    map: &'a Map<String, Value>,
    name: &str,
    such_as: &str,
    missing: impl FnOnce() -> String,
) -> Result<&'a str, String> {
    match map.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!(
            "\"{name}\" must be a string such as {such_as}, found {}",
            describe(other)
        )),
        None => Err(missing()),
    }
}

/// A short description of a JSON value for error messages: its kind and, if short, itself.
fn describe(value: &Value) -> String {
    let kind = match value {
        Value::Null => return "null".to_owned(),
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    let text = value.to_string();
    if text.len() <= 40 {
        format!("{kind} {text}")
    } else {
        kind.to_owned()
    }
}

fn quoted_list(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(" and ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_ignore_extra_fields_and_split_the_namespace() {
        let Ok(Op::Add(obj)) = parse_op(r#"{"op":"add","obj":{"key":"ns/a","v":7,"node":"n"}}"#)
        else {
            panic!("add did not parse");
        };
        assert_eq!(*obj, TraceObject::new("ns/a", 7));
        assert_eq!(obj.namespace.as_str(), "ns");
    }

    #[test]
    fn config_fields_default_to_known_objects_without_replaced() {
        let Ok(Op::Config(cfg)) = parse_op(r#"{"op":"config"}"#) else {
            panic!("config did not parse");
        };
        assert_eq!(cfg, TraceConfig::default());
        assert!(cfg.known_objects && !cfg.emit_replaced);
        let Ok(Op::Config(cfg)) = parse_op(r#"{"op":"config","emit_replaced":true}"#) else {
            panic!("config did not parse");
        };
        assert!(cfg.known_objects && cfg.emit_replaced && !cfg.compact_updates);
        let Ok(Op::Config(cfg)) = parse_op(r#"{"op":"config","compact_updates":true}"#) else {
            panic!("config did not parse");
        };
        assert!(cfg.known_objects && !cfg.emit_replaced && cfg.compact_updates);
    }

    #[test]
    fn tombstone_obj_may_be_null_but_not_missing() {
        let Ok(Op::DeleteTombstone { key, last_known }) =
            parse_op(r#"{"op":"delete_tombstone","key":"ns/a","obj":null}"#)
        else {
            panic!("delete_tombstone did not parse");
        };
        assert_eq!(key.as_str(), "ns/a");
        assert!(last_known.is_none());
        let err = parse_op(r#"{"op":"delete_tombstone","key":"ns/a"}"#).unwrap_err();
        assert!(err.contains("\"obj\"") && err.contains("null"), "{err}");
    }

    #[test]
    fn malformed_lines_say_what_is_wrong() {
        let cases = [
            (r#"{"op":"add""#, "not valid JSON"),
            ("[1]", "expected a JSON object"),
            (r#"{"obj":{}}"#, "missing \"op\""),
            (r#"{"op":"popp"}"#, "unknown op \"popp\""),
            (
                r#"{"op":"add","obj":{"key":"a","v":"1"}}"#,
                "\"v\" must be a whole number",
            ),
            (
                r#"{"op":"add","obj":{"key":"a","v":1.5}}"#,
                "fits in 64 bits",
            ),
            (r#"{"op":"add","obj":{"v":1}}"#, "no \"key\""),
            (r#"{"op":"replace","objs":{}}"#, "must be a list of objects"),
            (r#"{"op":"replace","objs":[1]}"#, "item 0"),
            (
                r#"{"op":"config","known_object":true}"#,
                "no field \"known_object\"",
            ),
            (r#"{"op":"config","emit_replaced":1}"#, "true or false"),
            (r#"{"op":"pop","x":1}"#, "no other fields"),
        ];
        for (line, expected) in cases {
            let err = parse_op(line).expect_err(line);
            assert!(err.contains(expected), "{line}: {err:?} lacks {expected:?}");
        }
    }

    #[test]
    fn every_listed_op_parses() {
        for (name, fields) in OPS {
            let mut line = format!("{{\"op\":\"{name}\"");
            for field in *fields {
                let value = match *field {
                    "obj" => OBJ_EXAMPLE.to_owned(),
                    "objs" => format!("[{OBJ_EXAMPLE}]"),
                    "key" => "\"ns/a\"".to_owned(),
                    _ => "true".to_owned(),
                };
                line.push_str(&format!(",\"{field}\":{value}"));
            }
            line.push('}');
            let op = parse_op(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(op.name(), *name);
        }
    }
}
