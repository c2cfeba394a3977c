//! A workload through a list of engines: generate it (before any clock starts), run and measure
//! each engine on it and judge the result, here or each engine in a child process of its own
//! ([`isolate`](crate::isolate)). `run`, `compare`, `replay`, the capacity probes and the W6 and
//! informer paths all come through here.

use workloads::{generate, Generated, WorkloadSpec};

use crate::cpu::{cpu_figures, CpuProbe};
use crate::driver::{execute, EngineError};
use crate::engines::{EngineConfig, EngineKind, Mode};
use crate::pacing::kept_schedule;
use crate::progress::Progress;
use crate::result::{peak_rss, LatencyUs, RunResult};
use crate::rss::RssProbe;
use crate::ui::Ui;
use crate::units::si;
use crate::verdict::{check_with, Counters};

/// Why a workload could not be run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The arguments make no workload.
    #[error("invalid arguments: {0}")]
    Invalid(String),
    /// An engine refused the workload.
    #[error(transparent)]
    Engine(#[from] crate::driver::EngineError),
    /// A run through the informer could not go on (`--through informer`).
    #[error("the informer run failed: {0}")]
    Informer(String),
    /// A child process for one engine failed.
    #[error(transparent)]
    Isolate(#[from] crate::isolate::IsolateError),
}

/// The `run` command line that makes a child process run `engine` alone on `spec`.
pub fn child_args(spec: &WorkloadSpec, engine: EngineKind, cfg: &EngineConfig) -> Vec<String> {
    let mut args = [
        "run",
        "--workload",
        spec.workload.name(),
        "--engine",
        engine.name(),
        "--keys",
        &spec.keys.to_string(),
        "--events",
        &spec.events.to_string(),
        "--seed",
        &spec.seed.to_string(),
        "--shards",
        &cfg.shards.to_string(),
        "--consumers",
        &cfg.consumers.to_string(),
        "--readers",
        &cfg.readers.to_string(),
        "--handler-us",
        &cfg.handler_cost.as_micros().to_string(),
        "--in-process",
    ]
    .map(String::from)
    .to_vec();
    if let Some(rate) = cfg.rate {
        args.extend(["--rate".to_string(), rate.to_string()]);
    }
    if cfg.max_queued_deltas > 0 {
        args.extend([
            "--max-queued-deltas".to_string(),
            cfg.max_queued_deltas.to_string(),
        ]);
    }
    if cfg.compact_updates {
        args.push("--compact-updates".to_string());
    }
    args
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

/// Runs `engines` one after another on `gen`, each measured and judged.
pub fn run_engines(
    gen: &Generated,
    workload: &str,
    mode: Mode,
    engines: &[EngineKind],
    cfg: &EngineConfig,
    ui: Ui,
) -> Result<Vec<RunResult>, RunError> {
    let mut results = Vec::with_capacity(engines.len());
    for &engine in engines {
        let phase = ui.phase(format!("{workload} {engine}"), gen.ops.len() as u64);
        let result = measure(engine, workload, gen, mode, cfg, &phase)?;
        phase.finish(&format!(
            "{} events/s, verdict {}",
            si(result.events_per_s),
            result.verdict
        ));
        results.push(result);
    }
    Ok(results)
}

/// Runs `engines` on the workload of `spec` with `cfg`: generated and run in this process for
/// one engine or with `in_process`, else each engine in a child process of its own that
/// generates the same events from the same seed (see [`isolate`](crate::isolate)). `run` and
/// `compare` both come through here.
pub fn run_spec(
    spec: &WorkloadSpec,
    engines: &[EngineKind],
    cfg: &EngineConfig,
    in_process: bool,
    ui: Ui,
) -> Result<Vec<RunResult>, RunError> {
    check_spec(spec)?;
    crate::isolate::run_each(
        engines,
        in_process,
        |engine| child_args(spec, engine, cfg),
        |engines| {
            let gen = generate_with_progress(spec, ui)?;
            let workload = spec.workload;
            run_engines(&gen, workload.name(), Mode::of(workload), engines, cfg, ui)
        },
    )
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
    let probe = RssProbe::start();
    let cpu = CpuProbe::start();
    let done = execute(engine, gen, mode, cfg, progress)?;
    let peak = probe.finish();
    let cpu_spent = cpu.finish();
    let verdict = check_with(
        &gen.model,
        &*done.store,
        &done.counters,
        cfg.compact_updates,
    );
    let wall_s = done.wall.as_secs_f64().max(1e-9);
    let events = match mode {
        // The writer counts what it applied; the generator's count is the same when ok.
        Mode::Direct => done.counters.deltas,
        Mode::Queue => gen.event_count(),
    };
    let c: &Counters = &done.counters;
    let (peak_rss_bytes, peak_rss_source) = peak_rss(peak);
    let (cpu_s, cpu_us_per_event) = cpu_figures(cpu_spent, events);
    Ok(RunResult {
        engine: engine.name().to_string(),
        workload: workload.to_string(),
        keys: gen.universe.keys.len(),
        events,
        wall_s,
        events_per_s: events as f64 / wall_s,
        pops: c.pops,
        deltas_per_pop: (mode == Mode::Queue && c.pops > 0)
            .then(|| c.deltas as f64 / c.pops as f64),
        latency_us: LatencyUs::of(&done.latency),
        peak_rss_bytes,
        peak_rss_source,
        cpu_s,
        cpu_us_per_event,
        reads_per_s: (mode == Mode::Direct).then(|| done.reads as f64 / wall_s),
        threads: done.threads,
        shards: (engine == EngineKind::Sharded && mode == Mode::Queue).then_some(cfg.shards),
        deltas: c.deltas,
        offered_rate: cfg.rate.filter(|_| done.producer_lag.is_some()),
        producer_lag_ms: done.producer_lag.map(|lag| lag.as_secs_f64() * 1e3),
        kept_up: cfg
            .rate
            .zip(done.producer_lag)
            .map(|(rate, lag)| kept_schedule(lag, gen.ops.len(), rate)),
        verdict: verdict.summary(),
        failures: verdict.failures().to_vec(),
        timeline: crate::timeline::enabled()
            .then(|| crate::timeline::intervals(&done.samples, crate::timeline::INTERVAL_MS)),
        ..Default::default()
    })
}
