//! `loadgen ops --engine workqueue-reference | workqueue --shards N`: replays a workqueue trace
//! (docs/traces.md, workqueue section) through `kcache::workqueue`.
//!
//! The queue is a rate-limiting queue over a delaying queue over the reference port or the
//! sharded queue, on a fake clock that starts at 0 and moves only on `step`; a step adds every
//! item whose ready time has come, earliest first, before the next op.
//!
//! Errors follow the DeltaFIFO replay's rules: a malformed line stops the replay with
//! `line N: <what is wrong>` (exit code 2) after flushing the output so far; an operation the
//! queue refuses (the sharded queue's `done` of an item it did not hand out) is reported as
//! `line N: done refused: <why>` on stderr and the replay goes on.
//!
//! ```
//! use loadgen::commands::ops::workqueue::{replay, WorkqueueEngine};
//! let trace = br#"{"op":"config","limiter":{"kind":"exponential","base_ms":1,"max_ms":10}}
//! {"op":"add_rate_limited","item":"a"}
//! {"op":"get"}
//! {"op":"step","ms":1}
//! {"op":"get"}
//! "#;
//! let mut out = Vec::new();
//! replay(&trace[..], &mut out, &mut std::io::sink(), WorkqueueEngine::Sharded { shards: 4 }).unwrap();
//! assert_eq!(String::from_utf8(out).unwrap(), "{\"get\":null,\"empty\":true}\n{\"get\":\"a\"}\n");
//! ```

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use kcache::workqueue::{
    default_controller_rate_limiter, BucketRateLimiter, DelayingQueue,
    ExponentialFailureRateLimiter, FakeClock, FastSlowRateLimiter, MaxOfRateLimiter, QueueConfig,
    RateLimiter, RateLimitingQueue, ReferenceQueue, ShardedQueue, TryGet, WorkQueue,
};
use kcache::Key;
use serde_json::{Map, Value};

use super::OpsError;

/// Which work queue a replay runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkqueueEngine {
    /// `kcache::workqueue::ReferenceQueue`, client-go's port.
    Reference,
    /// `kcache::workqueue::ShardedQueue` with `shards` shards.
    Sharded {
        /// How many shards (rounded up to a power of two).
        shards: usize,
    },
}

/// A limiter as a trace's `config` line describes it.
#[derive(Debug, Clone, PartialEq)]
pub enum LimiterSpec {
    /// `{"kind":"exponential","base_ms":F,"max_ms":F}`.
    Exponential {
        /// Base delay, ns.
        base_ns: i64,
        /// Cap, ns.
        max_ns: i64,
    },
    /// `{"kind":"fast_slow","fast_ms":F,"slow_ms":F,"max_fast":N}`.
    FastSlow {
        /// Fast delay, ns.
        fast_ns: i64,
        /// Slow delay, ns.
        slow_ns: i64,
        /// Attempts that get the fast delay.
        max_fast: i64,
    },
    /// `{"kind":"bucket","qps":F,"burst":N}`.
    Bucket {
        /// Tokens per second.
        qps: f64,
        /// Bucket size.
        burst: i64,
    },
    /// `{"kind":"max_of","of":[L,...]}`.
    MaxOf(Vec<LimiterSpec>),
    /// `{"kind":"default"}`.
    Default,
}

/// A trace's nanoseconds as a delay. A negative one is "now", as a negative `time.Duration` is
/// for client-go's delaying queue; a `Duration` cannot be negative, so it becomes zero.
pub(super) fn delay(ns: i64) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

/// A delay as a trace prints it: nanoseconds, with "never" (and anything beyond Go's range)
/// as `i64::MAX`, Go's `InfDuration`.
pub(super) fn delay_ns(delay: Duration) -> i64 {
    i64::try_from(delay.as_nanos()).unwrap_or(i64::MAX)
}

impl LimiterSpec {
    /// Builds the limiter. Negative delays are taken as zero (see `delay`).
    pub fn build(&self) -> Box<dyn RateLimiter<Key>> {
        match self {
            LimiterSpec::Exponential { base_ns, max_ns } => Box::new(
                ExponentialFailureRateLimiter::new(delay(*base_ns), delay(*max_ns)),
            ),
            LimiterSpec::FastSlow {
                fast_ns,
                slow_ns,
                max_fast,
            } => Box::new(FastSlowRateLimiter::new(
                delay(*fast_ns),
                delay(*slow_ns),
                *max_fast,
            )),
            LimiterSpec::Bucket { qps, burst } => Box::new(BucketRateLimiter::new(*qps, *burst)),
            LimiterSpec::MaxOf(of) => Box::new(MaxOfRateLimiter::new(
                of.iter().map(LimiterSpec::build).collect(),
            )),
            LimiterSpec::Default => Box::new(default_controller_rate_limiter()),
        }
    }
}

/// One line of a workqueue trace.
#[derive(Debug, Clone, PartialEq)]
pub enum WqOp {
    /// `config`: the limiter.
    Config(LimiterSpec),
    /// `add`.
    Add(Key),
    /// `add_after`, in ns.
    AddAfter(Key, i64),
    /// `add_rate_limited`.
    AddRateLimited(Key),
    /// `forget`.
    Forget(Key),
    /// `num_requeues`.
    NumRequeues(Key),
    /// `when`.
    When(Key),
    /// `step`, in ns (never negative).
    Step(i64),
    /// `get` if it would not block.
    Get,
    /// `done`.
    Done(Key),
    /// `len`.
    Len,
    /// `shut_down`.
    ShutDown,
    /// `shutting_down`.
    ShuttingDown,
}

/// Milliseconds (any JSON number) to whole nanoseconds, rounding half away from zero, computed
/// exactly from the number's decimal form (so `2.5` ms is 2 500 000 ns with no `f64` error).
/// `None` if the result does not fit an `i64`.
///
/// ```
/// use loadgen::commands::ops::workqueue::ms_to_ns;
/// let n = |s: &str| serde_json::from_str::<serde_json::Number>(s).unwrap();
/// assert_eq!(ms_to_ns(&n("2.5")), Some(2_500_000));
/// assert_eq!(ms_to_ns(&n("1073.741824")), Some(1 << 30));
/// assert_eq!(ms_to_ns(&n("0.0000005")), Some(1));
/// assert_eq!(ms_to_ns(&n("-0.0000005")), Some(-1));
/// assert_eq!(ms_to_ns(&n("1e-7")), Some(0));
/// assert_eq!(ms_to_ns(&n("9000000000000")), Some(9_000_000_000_000_000_000));
/// assert_eq!(ms_to_ns(&n("1e20")), None);
/// ```
pub fn ms_to_ns(ms: &serde_json::Number) -> Option<i64> {
    if let Some(int) = ms.as_i64() {
        return int.checked_mul(1_000_000);
    }
    let text = ms.to_string();
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], text[at + 1..].parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = int_part.chars().chain(frac_part.chars()).collect();
    let digits = digits.trim_start_matches('0');
    if digits.len() > 36 {
        return None;
    }
    let value: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    // ns = value · 10^(exponent − fraction digits + 6)
    let scale = exponent - frac_part.len() as i32 + 6;
    let magnitude: u128 = if scale >= 0 {
        value.checked_mul(10u128.checked_pow(scale as u32)?)?
    } else if -scale > 38 {
        0 // below half a nanosecond: value < 10^36 < 10^|scale| / 2
    } else {
        let divisor = 10u128.pow((-scale) as u32);
        let (quotient, remainder) = (value / divisor, value % divisor);
        quotient + u128::from(remainder * 2 >= divisor)
    };
    let magnitude = i128::try_from(magnitude).ok()?;
    i64::try_from(if negative { -magnitude } else { magnitude }).ok()
}

pub(super) fn field<'a>(
    obj: &'a Map<String, Value>,
    op: &str,
    name: &str,
    example: &str,
) -> Result<&'a Value, String> {
    obj.get(name)
        .ok_or_else(|| format!("{op}: missing \"{name}\" (expected {example})"))
}

pub(super) fn item(obj: &Map<String, Value>, op: &str) -> Result<Key, String> {
    let example = format!("{{\"op\":\"{op}\",\"item\":\"ns/a\"}}");
    match field(obj, op, "item", &example)? {
        Value::String(s) => Ok(Key::new(s)),
        other => Err(format!(
            "{op}: \"item\" must be a string, got {other} (expected {example})"
        )),
    }
}

pub(super) fn ms(
    obj: &Map<String, Value>,
    op: &str,
    name: &str,
    example: &str,
) -> Result<i64, String> {
    match field(obj, op, name, example)? {
        Value::Number(n) => ms_to_ns(n).ok_or_else(|| {
            format!("{op}: \"{name}\" {n} ms is out of range (at most ±9223372036854 ms)")
        }),
        other => Err(format!(
            "{op}: \"{name}\" must be a number of milliseconds, got {other} (expected {example})"
        )),
    }
}

pub(super) fn limiter(value: &Value) -> Result<LimiterSpec, String> {
    const KINDS: &str = "exponential, fast_slow, bucket, max_of or default";
    let Value::Object(obj) = value else {
        return Err(format!(
            "config: a limiter must be an object like {{\"kind\":\"default\"}}, got {value}"
        ));
    };
    let kind = match obj.get("kind") {
        Some(Value::String(kind)) => kind.as_str(),
        _ => {
            return Err(format!(
                "config: a limiter needs a \"kind\" ({KINDS}), got {value}"
            ))
        }
    };
    let int = |name: &str, example: &str| -> Result<i64, String> {
        match field(obj, "config", name, example)? {
            Value::Number(n) => n.as_i64().ok_or_else(|| {
                format!("config: {kind} \"{name}\" must be a whole number, got {n}")
            }),
            other => Err(format!(
                "config: {kind} \"{name}\" must be a number, got {other}"
            )),
        }
    };
    match kind {
        "exponential" => {
            let example = r#"{"kind":"exponential","base_ms":5,"max_ms":1000}"#;
            Ok(LimiterSpec::Exponential {
                base_ns: ms(obj, "config", "base_ms", example)?,
                max_ns: ms(obj, "config", "max_ms", example)?,
            })
        }
        "fast_slow" => {
            let example = r#"{"kind":"fast_slow","fast_ms":1,"slow_ms":100,"max_fast":3}"#;
            Ok(LimiterSpec::FastSlow {
                fast_ns: ms(obj, "config", "fast_ms", example)?,
                slow_ns: ms(obj, "config", "slow_ms", example)?,
                max_fast: int("max_fast", example)?,
            })
        }
        "bucket" => {
            let example = r#"{"kind":"bucket","qps":10,"burst":100}"#;
            let qps = match field(obj, "config", "qps", example)? {
                Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                other => return Err(format!("config: bucket \"qps\" must be a number, got {other}")),
            };
            if !qps.is_finite() {
                return Err(format!("config: bucket \"qps\" must be finite, got {qps}"));
            }
            Ok(LimiterSpec::Bucket {
                qps,
                burst: int("burst", example)?,
            })
        }
        "max_of" => match obj.get("of") {
            Some(Value::Array(of)) => Ok(LimiterSpec::MaxOf(
                of.iter().map(limiter).collect::<Result<_, _>>()?,
            )),
            _ => Err(format!(
                "config: max_of needs \"of\": a list of limiters, like {{\"kind\":\"max_of\",\"of\":[{{\"kind\":\"default\"}}]}}, got {value}"
            )),
        },
        "default" => Ok(LimiterSpec::Default),
        other => Err(format!("config: unknown limiter kind {other:?} (expected {KINDS})")),
    }
}

/// Parses one non-blank trace line.
///
/// ```
/// use loadgen::commands::ops::workqueue::{parse_wq_op, WqOp};
/// assert_eq!(parse_wq_op(r#"{"op":"step","ms":1.5}"#), Ok(WqOp::Step(1_500_000)));
/// assert!(parse_wq_op(r#"{"op":"step","ms":-1}"#).unwrap_err().contains("negative"));
/// assert!(parse_wq_op(r#"{"op":"gett"}"#).unwrap_err().contains("unknown op"));
/// ```
pub fn parse_wq_op(line: &str) -> Result<WqOp, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(obj) = value else {
        return Err(format!(
            "expected an object like {{\"op\":\"get\"}}, got {value}"
        ));
    };
    let op = match obj.get("op") {
        Some(Value::String(op)) => op.clone(),
        _ => return Err("missing \"op\" (expected e.g. {\"op\":\"get\"})".into()),
    };
    let op = op.as_str();
    Ok(match op {
        "config" => WqOp::Config(match obj.get("limiter") {
            Some(value) => limiter(value)?,
            None => LimiterSpec::Default,
        }),
        "add" => WqOp::Add(item(&obj, op)?),
        "add_after" => WqOp::AddAfter(
            item(&obj, op)?,
            ms(&obj, op, "ms", r#"{"op":"add_after","item":"a","ms":10}"#)?,
        ),
        "add_rate_limited" => WqOp::AddRateLimited(item(&obj, op)?),
        "forget" => WqOp::Forget(item(&obj, op)?),
        "num_requeues" => WqOp::NumRequeues(item(&obj, op)?),
        "when" => WqOp::When(item(&obj, op)?),
        "step" => {
            let ns = ms(&obj, op, "ms", r#"{"op":"step","ms":10}"#)?;
            if ns < 0 {
                return Err(format!(
                    "step: \"ms\" must not be negative (the clock never goes back), got {}",
                    obj["ms"]
                ));
            }
            WqOp::Step(ns)
        }
        "get" => WqOp::Get,
        "done" => WqOp::Done(item(&obj, op)?),
        "len" => WqOp::Len,
        "shut_down" => WqOp::ShutDown,
        "shutting_down" => WqOp::ShuttingDown,
        other => {
            return Err(format!(
                "unknown op {other:?} (expected config, add, add_after, add_rate_limited, forget, \
                 num_requeues, when, step, get, done, len, shut_down or shutting_down)"
            ))
        }
    })
}

/// What a finished workqueue replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkqueueSummary {
    /// Lines read, blank ones included.
    pub lines: usize,
    /// Non-blank lines, `config` included.
    pub ops: usize,
    /// Output lines written.
    pub outputs: usize,
    /// `line N: done refused: ...` for every refused `done`, in trace order.
    pub refusals: Vec<String>,
}

/// The queue a replay drives, with its fake clock.
struct Replayer<Q: WorkQueue + 'static> {
    clock: Arc<FakeClock>,
    queue: RateLimitingQueue<Q>,
}

impl<Q: WorkQueue + 'static> Replayer<Q> {
    fn new(make: impl FnOnce(&QueueConfig) -> Q, limiter: &LimiterSpec) -> Self {
        let clock = Arc::new(FakeClock::new());
        let config = QueueConfig::new().clock(clock.clone());
        let queue = RateLimitingQueue::new(
            DelayingQueue::with_config(make(&config), &config),
            limiter.build(),
        );
        Self { clock, queue }
    }

    /// Applies one op; returns its output line, if any, or a refusal.
    fn apply(&self, op: WqOp) -> Result<Option<String>, String> {
        let q = &self.queue;
        let op = match apply_common_op(q, &self.clock, op) {
            Ok(line) => return Ok(line),
            Err(op) => op,
        };
        Ok(match op {
            // Only accepted as the first line, which built the queue.
            WqOp::Config(_) => None,
            WqOp::Get => Some(match q.try_get() {
                TryGet::Item(item) => format!("{{\"get\":{}}}", json_string(item.as_str())),
                TryGet::Empty => "{\"get\":null,\"empty\":true}".to_string(),
                TryGet::ShutDown => "{\"get\":null,\"shutdown\":true}".to_string(),
            }),
            WqOp::Done(item) => {
                q.done(&item).map_err(|e| format!("done refused: {e}"))?;
                None
            }
            common => unreachable!("{common:?} is applied by apply_common_op"),
        })
    }
}

/// The calls of a rate-limiting queue that a priority queue spells the same, so that both
/// replays apply the ops they share with one function, [`apply_common_op`].
pub(super) trait RateLimitedQueue: WorkQueue {
    fn add_after(&self, item: Key, delay: Duration);
    fn add_rate_limited(&self, item: Key);
    fn forget(&self, item: &Key);
    fn num_requeues(&self, item: &Key) -> u64;
    fn when(&self, item: &Key) -> Duration;
}

/// Implements [`RateLimitedQueue`] for `$queue` by its own methods of the same names.
macro_rules! rate_limited_queue {
    ($queue:ty $(, $generic:ident: $bound:path)?) => {
        impl$(<$generic: $bound>)? RateLimitedQueue for $queue {
            fn add_after(&self, item: Key, delay: Duration) {
                <$queue>::add_after(self, item, delay)
            }
            fn add_rate_limited(&self, item: Key) {
                <$queue>::add_rate_limited(self, item)
            }
            fn forget(&self, item: &Key) {
                <$queue>::forget(self, item)
            }
            fn num_requeues(&self, item: &Key) -> u64 {
                <$queue>::num_requeues(self, item)
            }
            fn when(&self, item: &Key) -> Duration {
                <$queue>::when(self, item)
            }
        }
    };
}

rate_limited_queue!(RateLimitingQueue<Q>, Q: WorkQueue);
rate_limited_queue!(dyn kcache::workqueue::priority::PriorityWorkQueue);

/// Applies `op` if both replays answer it alike (every op but `config`, `get` and `done`):
/// its output line, if any; any other op is handed back.
pub(super) fn apply_common_op<Q: RateLimitedQueue + ?Sized>(
    q: &Q,
    clock: &FakeClock,
    op: WqOp,
) -> Result<Option<String>, WqOp> {
    Ok(match op {
        WqOp::Add(item) => {
            q.add(item);
            None
        }
        WqOp::AddAfter(item, ns) => {
            q.add_after(item, delay(ns));
            None
        }
        WqOp::AddRateLimited(item) => {
            q.add_rate_limited(item);
            None
        }
        WqOp::Forget(item) => {
            q.forget(&item);
            None
        }
        WqOp::NumRequeues(item) => Some(format!("{{\"num_requeues\":{}}}", q.num_requeues(&item))),
        WqOp::When(item) => Some(format!("{{\"when_ns\":{}}}", delay_ns(q.when(&item)))),
        WqOp::Step(ns) => {
            // Validated non-negative by the parser; the clock saturates at its maximum.
            clock.step(delay(ns));
            None
        }
        WqOp::Len => Some(format!("{{\"len\":{}}}", q.len())),
        WqOp::ShutDown => {
            q.shut_down();
            None
        }
        WqOp::ShuttingDown => Some(format!("{{\"shutting_down\":{}}}", q.shutting_down())),
        other => return Err(other),
    })
}

pub(super) fn json_string(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// Replays the workqueue trace on `input` through `engine`, writing output lines to `output`
/// and refusals (`line N: done refused: ...`) to `log` as they happen.
pub fn replay(
    input: impl BufRead,
    output: impl Write,
    log: &mut dyn Write,
    engine: WorkqueueEngine,
) -> Result<WorkqueueSummary, OpsError> {
    match engine {
        WorkqueueEngine::Reference => run(input, output, log, ReferenceQueue::with_config),
        WorkqueueEngine::Sharded { shards } => run(input, output, log, |config| {
            ShardedQueue::with_config(shards, config)
        }),
    }
}

fn run<Q: WorkQueue + 'static>(
    input: impl BufRead,
    output: impl Write,
    log: &mut dyn Write,
    make: impl FnOnce(&QueueConfig) -> Q,
) -> Result<WorkqueueSummary, OpsError> {
    run_trace(
        input,
        output,
        log,
        parse_wq_op,
        |op| match op {
            WqOp::Config(limiter) => Some(limiter.clone()),
            _ => None,
        },
        |limiter| Replayer::new(make, &limiter.unwrap_or(LimiterSpec::Default)),
        Replayer::apply,
    )
}

/// The replay loop of every workqueue trace: parses each line with `parse`, builds the queue
/// from the first op (`config_of` says whether it is a `config` line, and with which
/// configuration: a limiter, or more for the priority queues), applies each op, and writes
/// outputs and refusals as they happen.
pub(super) fn run_trace<O, C, R>(
    input: impl BufRead,
    mut output: impl Write,
    log: &mut dyn Write,
    parse: impl Fn(&str) -> Result<O, String>,
    config_of: impl Fn(&O) -> Option<C>,
    build: impl FnOnce(Option<C>) -> R,
    apply: impl Fn(&R, O) -> Result<Option<String>, String>,
) -> Result<WorkqueueSummary, OpsError> {
    let mut summary = WorkqueueSummary::default();
    let mut build = Some(build);
    let mut replayer: Option<R> = None;
    let result = (|| {
        for (index, line) in input.lines().enumerate() {
            let number = index + 1;
            summary.lines = number;
            let line = line.map_err(|source| OpsError::Read {
                line: number,
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            summary.ops += 1;
            let op = parse(&line).map_err(|message| OpsError::Malformed {
                line: number,
                message,
            })?;
            let config = config_of(&op);
            if replayer.is_none() {
                // The queue is built by the first op: a `config` line, or the default limiter.
                if let Some(build) = build.take() {
                    replayer = Some(build(config));
                }
            } else if config.is_some() {
                return Err(OpsError::Malformed {
                    line: number,
                    message: "config: only allowed as the first line of the trace".into(),
                });
            }
            let Some(replayer) = &replayer else {
                continue; // built just above
            };
            match apply(replayer, op) {
                Ok(Some(out)) => {
                    writeln!(output, "{out}").map_err(OpsError::Write)?;
                    summary.outputs += 1;
                }
                Ok(None) => {}
                Err(refusal) => {
                    let refusal = format!("line {number}: {refusal}");
                    let _ = writeln!(log, "{refusal}");
                    summary.refusals.push(refusal);
                }
            }
        }
        Ok(())
    })();
    output.flush().map_err(OpsError::Write)?;
    result.map(|()| summary)
}

/// Runs `loadgen ops` for a workqueue engine: stdin → the queue → stdout.
pub fn main(engine: WorkqueueEngine) -> ExitCode {
    super::run_stdio(|stdin, stdout, stderr| replay(stdin, stdout, stderr, engine).map(|_| ()))
}
