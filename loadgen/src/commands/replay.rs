//! `loadgen replay --trace FILE`: a recorded Kubernetes watch stream through the engines.
//!
//! The trace is what `kubectl get pods -A --watch --output-watch-events -o json` writes
//! (parsed by [`watch_trace`](crate::watch_trace), which says how documents become ops and
//! what a bad one is). Everything is parsed before the clock starts. A trace without a single
//! valid object event is refused (exit code 2): there would be nothing to measure.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;

use crate::engines::EngineChoice;
use crate::engines::{EngineConfig, DEFAULT_CONSUMERS};
use crate::pipelines::bare::RunError;
use crate::pipelines::harness_floor::Subject;
use crate::reports::report::{finish, refuse, table, write_json};
use crate::result::RunResult;
use crate::runner::run_spec::{Pipeline, RunSpec, Source};
use crate::ui::Ui;
use crate::watch_trace::{parse_trace, to_workload, BadDocument, ParsedTrace, Position, WatchType};
use workloads::Generated;

/// Arguments of `loadgen replay`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayArgs {
    /// The watch stream to replay (`kubectl get pods -A --watch --output-watch-events -o json`).
    #[arg(long)]
    pub trace: PathBuf,
    /// Which engine(s).
    #[arg(long, value_enum, default_value = "all")]
    pub engine: EngineChoice,
    /// Shards of the sharded engine: a power of two from 1 to 65536.
    #[arg(long, default_value_t = kcache::sharded::DEFAULT_SHARDS, value_parser = workloads::parse_shards)]
    pub shards: usize,
    /// Consumer threads of the sharded engine (the reference always uses exactly one).
    #[arg(long, default_value_t = DEFAULT_CONSUMERS, value_parser = crate::engines::parse_consumers)]
    pub consumers: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run both engines in this process instead of one child process each (the peak memory
    /// of the second is then understated; see `loadgen run --help`).
    #[arg(long)]
    pub in_process: bool,
}

/// What `replay --json` writes: the parse summary and the usual results.
#[derive(Debug, Clone, Serialize)]
pub struct ReplayReport<'a> {
    /// The trace file.
    pub trace: String,
    /// Documents seen.
    pub documents: usize,
    /// Object events replayed.
    pub events: usize,
    /// `BOOKMARK` documents skipped.
    pub bookmarks: usize,
    /// Where the `ERROR` documents are.
    pub errors: &'a [Position],
    /// Skipped documents, with positions and reasons.
    pub bad_documents: &'a [BadDocument],
    /// One row per engine.
    pub results: &'a [RunResult],
}

/// A human summary of the parse: counts, then one line per bad document.
pub fn summary(trace: &ParsedTrace, path: &Path) -> String {
    let count = |k: WatchType| trace.events.iter().filter(|e| e.kind == k).count();
    let mut out = format!(
        "trace {}: {} documents, {} events ({} ADDED, {} MODIFIED, {} DELETED), {} BOOKMARK, \
         {} ERROR, {} bad\n",
        path.display(),
        trace.documents,
        trace.events.len(),
        count(WatchType::Added),
        count(WatchType::Modified),
        count(WatchType::Deleted),
        trace.bookmarks,
        trace.errors.len(),
        trace.bad.len()
    );
    for p in &trace.errors {
        out.push_str(&format!("  ERROR document at {p}\n"));
    }
    for bad in &trace.bad {
        out.push_str(&format!("  bad {bad}\n"));
    }
    out
}

/// Runs the engines on the replayed trace: in this process for one engine or with
/// `--in-process`, else each in a child process that parses the trace again.
fn replay_engines(
    args: &ReplayArgs,
    gen: &Generated,
    cfg: &EngineConfig,
    ui: Ui,
) -> Result<Vec<RunResult>, RunError> {
    let subjects = args.engine.engines().into_iter().map(Subject::Engine);
    let source = Source::Trace(args.trace.clone());
    let specs = RunSpec::rows(&source, subjects, cfg, &[Pipeline::Queue]);
    // Here, the trace parsed once above; in a child, parsed again from the file.
    crate::harness::isolate::run_each(&specs, args.in_process, |specs| {
        specs.iter().map(|spec| spec.execute(gen, ui)).collect()
    })
}

/// Runs `loadgen replay`.
pub fn main(args: ReplayArgs) -> ExitCode {
    let ui = Ui::detect();
    let bytes = match std::fs::read(&args.trace) {
        Ok(bytes) => bytes,
        Err(e) => {
            return refuse(
                "replay",
                format!(
                    "cannot read {}: {e} (record one with `kubectl get pods -A --watch \
                     --output-watch-events -o json > FILE`)",
                    args.trace.display()
                ),
            )
        }
    };
    let phase = ui.phase("replay parse", 0);
    let trace = parse_trace(&bytes);
    phase.finish(&format!("{} events", trace.events.len()));
    print!("{}", summary(&trace, &args.trace));
    if trace.events.is_empty() {
        // Replaying nothing would measure nothing, and an all-ok verdict on it would hide a
        // wrong file or a wrong format.
        return refuse(
            "replay",
            format!(
                "nothing to replay: {} holds no valid ADDED, MODIFIED or DELETED document ({} \
                 documents, {} bad; the bad ones are listed above). Expected the output of \
                 `kubectl get pods -A --watch --output-watch-events -o json`.",
                args.trace.display(),
                trace.documents,
                trace.bad.len()
            ),
        );
    }
    let gen = to_workload(&trace, &args.trace.display().to_string());
    let cfg = EngineConfig {
        shards: args.shards,
        consumers: args.consumers,
        ..EngineConfig::default()
    };
    let results = match replay_engines(&args, &gen, &cfg, ui) {
        Ok(results) => results,
        Err(e) => return refuse("replay", e),
    };
    finish("replay", &table(&results), &results, || match &args.json {
        Some(path) => {
            let report = ReplayReport {
                trace: args.trace.display().to_string(),
                documents: trace.documents,
                events: trace.events.len(),
                bookmarks: trace.bookmarks,
                errors: &trace.errors,
                bad_documents: &trace.bad,
                results: &results,
            };
            write_json(path, &report).map_err(|e| e.to_string())
        }
        None => Ok(()),
    })
}
