//! `loadgen ops --engine workqueue-priority-reference | workqueue-priority --shards N`:
//! replays a priority workqueue trace (docs/traces.md, "Priority workqueue traces") through
//! `kcache::workqueue::priority`.
//!
//! The workqueue trace format with one more op, `add_with_opts`, and `get` telling the
//! priority. The queue runs on a fake clock that starts at 0 and moves only on `step`; a step
//! makes every due entry ready before the next op. Without a `config` line the limiter is the
//! priority queue's default, exponential(5 ms, 1000 s); `{"kind":"default"}` is still
//! client-go's default. `done` of a key that is not being processed does nothing (it is not a
//! refusal: that is the priority queue's rule).
//!
//! The `config` line may also turn on kcache's opt-in ordering rules: `"max_wait_ms":N`
//! (aging: `PriorityOptions::max_wait`) and `"fair":true` (fairness by namespace). With aging
//! on, a `get` that hands out an overdue entry says so: `{"get":I,"priority":P,"overdue":true}`.
//!
//! ```
//! use loadgen::commands::ops::workqueue_priority::{replay, PriorityEngine};
//! let trace = br#"{"op":"add_with_opts","item":"a","priority":-100}
//! {"op":"add","item":"b"}
//! {"op":"get"}
//! {"op":"get"}
//! "#;
//! let mut out = Vec::new();
//! replay(&trace[..], &mut out, &mut std::io::sink(), PriorityEngine::Reference).unwrap();
//! assert_eq!(
//!     String::from_utf8(out).unwrap(),
//!     "{\"get\":\"b\",\"priority\":0}\n{\"get\":\"a\",\"priority\":-100}\n"
//! );
//! ```

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;

use kcache::workqueue::priority::{
    AddOpts, Priority, PriorityOptions, PriorityWorkQueue, ReferencePriorityQueue,
    ShardedPriorityQueue, TryGetWithPriority,
};
use kcache::workqueue::{FakeClock, QueueConfig};
use kcache::Key;
use serde_json::{Map, Value};

use super::workqueue::{
    apply_common_op, delay, item, json_string, limiter, ms, parse_wq_op, run_trace, LimiterSpec,
    WorkqueueSummary, WqOp,
};
use super::OpsError;

/// Which priority queue a replay runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriorityEngine {
    /// `kcache::workqueue::priority::ReferencePriorityQueue`, controller-runtime's port.
    Reference,
    /// `kcache::workqueue::priority::ShardedPriorityQueue` with `shards` shards.
    Sharded {
        /// How many shards (rounded up to a power of two).
        shards: usize,
    },
}

/// A priority trace's `config` line.
#[derive(Debug, Clone, PartialEq)]
pub struct PriorityConfig {
    /// `limiter` (default `{"kind":"default"}`, client-go's default, as in every trace).
    pub limiter: LimiterSpec,
    /// `max_wait_ms`, in ns: aging on with this bound.
    pub max_wait_ns: Option<i64>,
    /// `fair`: fairness by namespace.
    pub fair: bool,
}

/// One line of a priority workqueue trace.
#[derive(Debug, Clone, PartialEq)]
pub enum PriorityOp {
    /// `config`, only as the first line.
    Config(PriorityConfig),
    /// Any op of the workqueue trace format (`add` is an add at the default priority).
    Base(WqOp),
    /// `add_with_opts`.
    AddWithOpts {
        /// The key.
        item: Key,
        /// `priority`, if given.
        priority: Option<Priority>,
        /// `after_ms`, in ns (default 0).
        after_ns: i64,
        /// `rate_limited` (default false).
        rate_limited: bool,
    },
}

/// The limiter of a trace without a `config` line: controller-runtime's default.
fn default_limiter() -> LimiterSpec {
    LimiterSpec::Exponential {
        base_ns: 5_000_000,
        max_ns: 1_000_000_000_000,
    }
}

fn add_with_opts(obj: &Map<String, Value>) -> Result<PriorityOp, String> {
    const OP: &str = "add_with_opts";
    const EXAMPLE: &str =
        r#"{"op":"add_with_opts","item":"a","priority":-100,"after_ms":5,"rate_limited":true}"#;
    if let Some(unknown) = obj.keys().find(|k| {
        !matches!(
            k.as_str(),
            "op" | "item" | "priority" | "after_ms" | "rate_limited"
        )
    }) {
        return Err(format!(
            "{OP}: unexpected field \"{unknown}\" (expected {EXAMPLE})"
        ));
    }
    let priority = match obj.get("priority") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(
            n.as_i64()
                .and_then(|p| Priority::try_from(p).ok())
                .ok_or_else(|| {
                    format!("{OP}: \"priority\" must be a whole number in 32 bits, got {n}")
                })?,
        ),
        Some(other) => {
            return Err(format!(
                "{OP}: \"priority\" must be an integer, got {other} (expected {EXAMPLE})"
            ))
        }
    };
    let after_ns = match obj.get("after_ms") {
        None => 0,
        Some(_) => ms(obj, OP, "after_ms", EXAMPLE)?,
    };
    if after_ns < 0 {
        return Err(format!(
            "{OP}: \"after_ms\" must not be negative, got {}",
            obj["after_ms"]
        ));
    }
    let rate_limited = flag(obj, OP, "rate_limited", EXAMPLE)?;
    Ok(PriorityOp::AddWithOpts {
        item: item(obj, OP)?,
        priority,
        after_ns,
        rate_limited,
    })
}

/// An optional `true`/`false` field of `op`'s object (default false).
fn flag(obj: &Map<String, Value>, op: &str, name: &str, example: &str) -> Result<bool, String> {
    match obj.get(name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(format!(
            "{op}: \"{name}\" must be true or false, got {other} (expected {example})"
        )),
    }
}

fn config(obj: &Map<String, Value>) -> Result<PriorityOp, String> {
    const OP: &str = "config";
    const EXAMPLE: &str =
        r#"{"op":"config","limiter":{"kind":"default"},"max_wait_ms":100,"fair":true}"#;
    if let Some(unknown) = obj
        .keys()
        .find(|k| !matches!(k.as_str(), "op" | "limiter" | "max_wait_ms" | "fair"))
    {
        return Err(format!(
            "{OP}: unexpected field \"{unknown}\" (expected {EXAMPLE})"
        ));
    }
    let limiter = match obj.get("limiter") {
        Some(value) => limiter(value)?,
        None => LimiterSpec::Default,
    };
    let max_wait_ns = match obj.get("max_wait_ms") {
        None => None,
        Some(_) => {
            let ns = ms(obj, OP, "max_wait_ms", EXAMPLE)?;
            if ns < 0 {
                return Err(format!(
                    "{OP}: \"max_wait_ms\" must not be negative, got {}",
                    obj["max_wait_ms"]
                ));
            }
            Some(ns)
        }
    };
    let fair = flag(obj, OP, "fair", EXAMPLE)?;
    Ok(PriorityOp::Config(PriorityConfig {
        limiter,
        max_wait_ns,
        fair,
    }))
}

/// Parses one non-blank line of a priority workqueue trace.
///
/// ```
/// use kcache::Key;
/// use loadgen::commands::ops::workqueue_priority::{parse_priority_op, PriorityOp};
/// assert_eq!(
///     parse_priority_op(r#"{"op":"add_with_opts","item":"a","priority":3}"#),
///     Ok(PriorityOp::AddWithOpts { item: Key::new("a"), priority: Some(3), after_ns: 0, rate_limited: false })
/// );
/// assert!(parse_priority_op(r#"{"op":"add_with_opts","item":"a","priority":1.5}"#).is_err());
/// ```
pub fn parse_priority_op(line: &str) -> Result<PriorityOp, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not valid JSON: {e}"))?;
    if let Value::Object(obj) = &value {
        match obj.get("op").and_then(Value::as_str) {
            Some("add_with_opts") => return add_with_opts(obj),
            Some("config") => return config(obj),
            _ => {}
        }
    }
    parse_wq_op(line).map(PriorityOp::Base)
}

/// The queue a replay drives, with its fake clock.
struct Replayer {
    clock: Arc<FakeClock>,
    queue: Box<dyn PriorityWorkQueue>,
}

impl Replayer {
    fn new(engine: PriorityEngine, trace_config: Option<PriorityConfig>) -> Self {
        let clock = Arc::new(FakeClock::new());
        let config = QueueConfig::new().clock(clock.clone());
        let (limiter, options) = match trace_config {
            None => (default_limiter(), PriorityOptions::new()),
            Some(c) => {
                let mut options = PriorityOptions::new();
                if let Some(ns) = c.max_wait_ns {
                    options = options.max_wait(delay(ns));
                }
                if c.fair {
                    options = options.fair();
                }
                (c.limiter, options)
            }
        };
        let limiter = limiter.build();
        let queue: Box<dyn PriorityWorkQueue> = match engine {
            PriorityEngine::Reference => Box::new(ReferencePriorityQueue::with_options(
                &config, limiter, options,
            )),
            PriorityEngine::Sharded { shards } => Box::new(ShardedPriorityQueue::with_options(
                shards, &config, limiter, options,
            )),
        };
        Self { clock, queue }
    }

    fn apply(&self, op: PriorityOp) -> Result<Option<String>, String> {
        let q = &*self.queue;
        let op = match op {
            PriorityOp::AddWithOpts {
                item,
                priority,
                after_ns,
                rate_limited,
            } => {
                let opts = AddOpts {
                    after: delay(after_ns),
                    rate_limited,
                    priority,
                };
                q.add_with_opts(opts, item);
                return Ok(None);
            }
            PriorityOp::Config(_) => return Ok(None),
            PriorityOp::Base(op) => op,
        };
        let op = match apply_common_op(q, &self.clock, op) {
            Ok(line) => return Ok(line),
            Err(op) => op,
        };
        Ok(match op {
            WqOp::Config(_) => None,
            WqOp::Get => Some(match (q.overdue_handouts(), q.try_get_with_priority()) {
                (before, TryGetWithPriority::Item(item, priority)) => {
                    // One replay thread: the count moved only if this get was overdue.
                    let overdue = if q.overdue_handouts() > before {
                        ",\"overdue\":true"
                    } else {
                        ""
                    };
                    format!(
                        "{{\"get\":{},\"priority\":{priority}{overdue}}}",
                        json_string(item.as_str())
                    )
                }
                (_, TryGetWithPriority::Empty) => "{\"get\":null,\"empty\":true}".to_string(),
                (_, TryGetWithPriority::ShutDown) => "{\"get\":null,\"shutdown\":true}".to_string(),
            }),
            WqOp::Done(item) => {
                // A key not being processed: nothing, by the priority queue's rule.
                let _ = q.done(&item);
                None
            }
            common => unreachable!("{common:?} is applied by apply_common_op"),
        })
    }
}

/// Replays the priority workqueue trace on `input` through `engine`, writing output lines to
/// `output`.
pub fn replay(
    input: impl BufRead,
    output: impl Write,
    log: &mut dyn Write,
    engine: PriorityEngine,
) -> Result<WorkqueueSummary, OpsError> {
    run_trace(
        input,
        output,
        log,
        parse_priority_op,
        |op| match op {
            PriorityOp::Config(config) => Some(config.clone()),
            _ => None,
        },
        |limiter| Replayer::new(engine, limiter),
        Replayer::apply,
    )
}

/// Runs `loadgen ops` for a priority workqueue engine: stdin → the queue → stdout.
pub fn main(engine: PriorityEngine) -> ExitCode {
    super::run_stdio(|stdin, stdout, stderr| replay(stdin, stdout, stderr, engine).map(|_| ()))
}
