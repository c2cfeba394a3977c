//! `loadgen ops`: replays an ops trace (docs/traces.md) through one engine.
//!
//! The trace is JSON Lines on stdin, one op per line; every op that produces output writes one
//! compact JSON line on stdout, and nothing else is written there. The same replay is offered
//! in-process as [`replay`], for the trace tests and the differential tests.
//!
//! - A malformed line (bad JSON, unknown op, missing or mistyped field, a `config` that is not
//!   the first non-blank line) stops the replay: the lines written so far are flushed, and
//!   `line N: <what is wrong>` goes to stderr; the exit code is 2.
//! - An operation the engine refuses (an empty `"key"` is a [`KeyError`](kcache::KeyError))
//!   is reported as `line N: <op> refused: <error>` on stderr, and the replay goes on; the
//!   exit code stays 0.
//! - Blank lines are skipped; line numbers count them, so they match an editor's.
//!
//! ```
//! use loadgen::commands::ops::{replay, EngineChoice};
//! let trace = br#"{"op":"add","obj":{"key":"ns/a","v":1}}
//! {"op":"update","obj":{"key":"ns/a","v":2}}
//! {"op":"pop"}
//! "#;
//! let mut out = Vec::new();
//! let summary = replay(&trace[..], &mut out, EngineChoice::Reference).unwrap();
//! assert_eq!(
//!     String::from_utf8(out).unwrap(),
//!     "{\"pop\":\"ns/a\",\"initial\":false,\"deltas\":[{\"type\":\"Added\",\"v\":1},{\"type\":\"Updated\",\"v\":2}]}\n"
//! );
//! assert_eq!(summary.outputs, 1);
//! ```

mod output;
mod trace;
mod trace_replayer;
pub mod workqueue;
pub mod workqueue_priority;

use std::fmt;
use std::io::{self, BufRead, Write};
use std::process::ExitCode;

use kcache::QueueError;
use thiserror::Error;

pub use output::{DeltaLine, OutputLine, PoppedLine};
pub use trace::{parse_op, Op, TraceConfig, TraceObject};

/// Arguments of `loadgen ops`.
#[derive(Debug, clap::Args)]
pub struct OpsArgs {
    /// The engine to replay the trace through.
    #[arg(long, value_enum)]
    pub engine: EngineArg,
    /// Shards of the sharded engines, a power of two from 1 to 65536; ignored by `reference`,
    /// `workqueue-reference` and `workqueue-priority-reference`.
    #[arg(long, default_value_t = 1, value_parser = workloads::parse_shards)]
    pub shards: usize,
}

/// The `--engine` choices of `loadgen ops`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineArg {
    /// The faithful client-go port (`kcache::reference`).
    Reference,
    /// The sharded engine (`kcache::sharded`).
    Sharded,
    /// client-go's work queue, ported (`kcache::workqueue::ReferenceQueue`); a workqueue trace.
    WorkqueueReference,
    /// The sharded work queue (`kcache::workqueue::ShardedQueue`, `--shards`); a workqueue trace.
    Workqueue,
    /// controller-runtime's priority queue, ported
    /// (`kcache::workqueue::priority::ReferencePriorityQueue`); a priority workqueue trace.
    WorkqueuePriorityReference,
    /// The sharded priority queue (`kcache::workqueue::priority::ShardedPriorityQueue`,
    /// `--shards`); a priority workqueue trace.
    WorkqueuePriority,
}

/// Which engine a replay runs, with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineChoice {
    /// `kcache::reference::DeltaFifo` with a `kcache::reference::IndexedStore` as known store.
    Reference,
    /// `kcache::sharded::DeltaFifo` with `shards` shards and a `kcache::sharded::IndexedStore`.
    Sharded {
        /// How many shards.
        shards: usize,
    },
}

/// The engine `loadgen ops` replays through: a DeltaFIFO one, or a work queue.
enum Chosen {
    Fifo(EngineChoice),
    Workqueue(workqueue::WorkqueueEngine),
    Priority(workqueue_priority::PriorityEngine),
}

impl From<&OpsArgs> for Chosen {
    fn from(args: &OpsArgs) -> Self {
        let shards = args.shards;
        match args.engine {
            EngineArg::Reference => Chosen::Fifo(EngineChoice::Reference),
            EngineArg::Sharded => Chosen::Fifo(EngineChoice::Sharded { shards }),
            EngineArg::WorkqueueReference => {
                Chosen::Workqueue(workqueue::WorkqueueEngine::Reference)
            }
            EngineArg::Workqueue => {
                Chosen::Workqueue(workqueue::WorkqueueEngine::Sharded { shards })
            }
            EngineArg::WorkqueuePriorityReference => {
                Chosen::Priority(workqueue_priority::PriorityEngine::Reference)
            }
            EngineArg::WorkqueuePriority => {
                Chosen::Priority(workqueue_priority::PriorityEngine::Sharded { shards })
            }
        }
    }
}

/// Why a replay stopped.
#[derive(Debug, Error)]
pub enum OpsError {
    /// A trace line is not a valid op; the message says what is wrong and how to fix it.
    #[error("line {line}: {message}")]
    Malformed {
        /// The 1-based line number, blank lines included.
        line: usize,
        /// What is wrong with the line.
        message: String,
    },
    /// Reading the trace failed.
    #[error("line {line}: reading the trace failed: {source}")]
    Read {
        /// The line that was being read.
        line: usize,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Writing the output failed (for example, stdout was closed).
    #[error("writing the output failed: {0}")]
    Write(#[source] io::Error),
}

impl OpsError {
    /// The trace line the error is about, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            OpsError::Malformed { line, .. } | OpsError::Read { line, .. } => Some(*line),
            OpsError::Write(_) => None,
        }
    }

    /// The exit code `loadgen ops` gives this error: 2 for a bad trace (the caller must change
    /// something), 1 for an I/O failure.
    pub fn exit_code(&self) -> u8 {
        match self {
            OpsError::Malformed { .. } => 2,
            OpsError::Read { .. } | OpsError::Write(_) => 1,
        }
    }
}

/// An operation the engine refused; the replay went on without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The 1-based line of the op.
    pub line: usize,
    /// The op's name (`add`, `replace`, ...).
    pub op: &'static str,
    /// Why the engine refused it.
    pub error: QueueError,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {} refused: {}", self.line, self.op, self.error)
    }
}

/// What a finished replay did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplaySummary {
    /// Lines read, blank ones included.
    pub lines: usize,
    /// Non-blank lines, `config` included.
    pub ops: usize,
    /// Output lines written.
    pub outputs: usize,
    /// Operations the engine refused, in trace order.
    pub refusals: Vec<Refusal>,
}

/// Replays the trace on `input` through `engine`, writing the output lines to `output`.
///
/// Refused operations are collected in [`ReplaySummary::refusals`]; see [`replay_logged`] to
/// also see them as they happen. On a malformed line, the output written so far is flushed
/// and [`OpsError::Malformed`] names the line.
///
/// ```
/// use loadgen::commands::ops::{replay, EngineChoice, OpsError};
/// let trace = b"{\"op\":\"pop\"}\n\n{\"op\":\"popp\"}\n";
/// let mut out = Vec::new();
/// let err = replay(&trace[..], &mut out, EngineChoice::Reference).unwrap_err();
/// assert_eq!(err.line(), Some(3));
/// assert_eq!(out, b"{\"pop\":null,\"closed\":false}\n");
/// ```
pub fn replay(
    input: impl BufRead,
    output: impl Write,
    engine: EngineChoice,
) -> Result<ReplaySummary, OpsError> {
    replay_logged(input, output, &mut io::sink(), engine)
}

/// [`replay`], also writing each refusal (`line N: <op> refused: <error>`) to `log` as it
/// happens. Failing to write to `log` does not stop the replay.
pub fn replay_logged(
    input: impl BufRead,
    mut output: impl Write,
    log: &mut dyn Write,
    engine: EngineChoice,
) -> Result<ReplaySummary, OpsError> {
    match engine {
        EngineChoice::Reference => trace_replayer::run(
            input,
            &mut output,
            log,
            kcache::reference::DeltaFifo::new,
            kcache::reference::IndexedStore::new,
        ),
        EngineChoice::Sharded { shards } => trace_replayer::run(
            input,
            &mut output,
            log,
            |opts| kcache::sharded::DeltaFifo::new(opts, shards),
            kcache::sharded::IndexedStore::new,
        ),
    }
}

/// Runs `loadgen ops`: stdin → the engine → stdout, diagnostics on stderr.
pub fn main(args: OpsArgs) -> ExitCode {
    let engine = match Chosen::from(&args) {
        Chosen::Fifo(engine) => engine,
        Chosen::Workqueue(engine) => return workqueue::main(engine),
        Chosen::Priority(engine) => return workqueue_priority::main(engine),
    };
    run_stdio(|stdin, stdout, stderr| replay_logged(stdin, stdout, stderr, engine).map(|_| ()))
}

/// Runs one replay over the process's stdin, stdout (buffered) and stderr (its log), and turns
/// its outcome into `loadgen ops`' exit code; the same for every engine.
fn run_stdio(
    replay: impl FnOnce(
        io::StdinLock<'static>,
        io::BufWriter<io::StdoutLock<'static>>,
        &mut dyn Write,
    ) -> Result<(), OpsError>,
) -> ExitCode {
    let stdin = io::stdin().lock();
    let stdout = io::BufWriter::new(io::stdout().lock());
    let mut stderr = io::stderr().lock();
    match replay(stdin, stdout, &mut stderr) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            match &err {
                // The trace's own errors are reported exactly as `line N: ...`.
                OpsError::Malformed { .. } => {
                    let _ = writeln!(stderr, "{err}");
                }
                _ => {
                    let _ = writeln!(stderr, "loadgen ops: {err}");
                }
            }
            ExitCode::from(err.exit_code())
        }
    }
}
