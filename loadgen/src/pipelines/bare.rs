//! A workload through an engine bare: generate it (before any clock starts), run and measure
//! one engine on it and judge the result. The rows of every run are
//! [`RunSpec`](crate::runner::run_spec::RunSpec)s; this is what one bare row does.

use workloads::{generate, Generated, WorkloadSpec};

use crate::engines::{EngineConfig, EngineKind, Mode};
use crate::harness::driver::{execute, EngineError};
use crate::harness::pacing::record_pacing;
use crate::judging::verdict::{check_with, Counters};
use crate::progress::Progress;
use crate::result::{LatencyUs, Meter, RunResult};
use crate::ui::Ui;

/// Why a workload could not be run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The arguments make no workload.
    #[error("invalid arguments: {0}")]
    Invalid(String),
    /// An engine refused the workload.
    #[error(transparent)]
    Engine(#[from] crate::harness::driver::EngineError),
    /// A run through the informer could not go on (`--through informer`).
    #[error("the informer run failed: {0}")]
    Informer(String),
    /// A child process for one engine failed.
    #[error(transparent)]
    Isolate(#[from] crate::harness::isolate::IsolateError),
}

/// Refuses a spec that makes no workload.
pub fn check_spec(spec: &WorkloadSpec) -> Result<(), RunError> {
    if spec.keys == 0 {
        return Err(RunError::Invalid("--keys must be at least 1".to_string()));
    }
    Ok(())
}

/// Generates `spec` (before any clock starts), with progress.
pub fn generate_with_progress(spec: &WorkloadSpec, ui: Ui) -> Result<Generated, RunError> {
    check_spec(spec)?;
    let phase = ui.phase(format!("{} generate", spec.workload), 0);
    let gen = generate(spec);
    phase.finish(&format!(
        "{} ops, {} keys",
        gen.ops.len(),
        gen.universe.keys.len()
    ));
    Ok(gen)
}

/// Runs `gen` through `engine`, measures it, judges it, and drops everything of the run before
/// returning.
pub fn measure(
    engine: EngineKind,
    workload: &str,
    gen: &Generated,
    mode: Mode,
    cfg: &EngineConfig,
    progress: &dyn Progress,
) -> Result<RunResult, EngineError> {
    let meter = Meter::start();
    let done = execute(engine, gen, mode, cfg, progress)?;
    let spent = meter.finish();
    let verdict = check_with(
        &gen.model,
        &*done.store,
        &done.counters,
        cfg.compact_updates,
    );
    let events = match mode {
        // The writer counts what it applied; the generator's count is the same when ok.
        Mode::Direct => done.counters.deltas,
        Mode::Queue => gen.event_count(),
    };
    let c: &Counters = &done.counters;
    let mut row = spent.row(
        engine.name(),
        workload,
        gen.universe.keys.len(),
        events,
        done.wall,
    );
    record_pacing(&mut row, cfg.rate, done.producer_lag, gen.ops.len());
    Ok(RunResult {
        pops: c.pops,
        deltas_per_pop: (mode == Mode::Queue && c.pops > 0)
            .then(|| c.deltas as f64 / c.pops as f64),
        latency_us: LatencyUs::of(&done.latency),
        reads_per_s: (mode == Mode::Direct).then(|| done.reads as f64 / row.wall_s),
        threads: done.threads,
        shards: (engine == EngineKind::Sharded && mode == Mode::Queue).then_some(cfg.shards),
        deltas: c.deltas,
        verdict: verdict.summary(),
        failures: verdict.failures().to_vec(),
        timeline: crate::measure::timeline::enabled().then(|| {
            crate::measure::timeline::intervals(
                &done.samples,
                crate::measure::timeline::INTERVAL_MS,
            )
        }),
        ..row
    })
}
