//! The key-count sweep of `loadgen scale`: how each engine's throughput, latency and memory per key change with the
//! key count.
//!
//! For every key count of the sweep, the workload runs through every engine twice: flat out
//! (its capacity and its peak memory) and paced at one fixed offered rate (its latency at a
//! load both engines are meant to carry). Every run is a child process of its own
//! ([`isolate`](crate::harness::isolate)), so peak memory is that run's alone. The sweep writes a JSON
//! report, an SVG chart of events/s, paced p99 and bytes per key against the key count, and a
//! Markdown summary (the table, the same-run ratios, the machine and its load average).

use serde::Serialize;

use crate::engines::{EngineConfig, EngineKind};
use crate::measure::machine::Machine;
use crate::result::RunResult;
use crate::runner::run_spec::RunSpec;
use crate::ui::Ui;
use crate::units::si;
use workloads::{Workload, WorkloadSpec};

/// The key counts of a sweep unless told otherwise.
pub const DEFAULT_KEYS: &str = "10k,100k,1M,4M";

/// The offered rate of the paced runs unless told otherwise, in ops per second.
pub const DEFAULT_RATE: u64 = 300_000;

/// What a sweep runs: one workload through `engines` at every key count, flat out and paced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SweepPlan {
    /// Which workload (not W4: it has no queue to pace).
    pub workload: Workload,
    /// The engines, in order.
    pub engines: Vec<EngineKind>,
    /// The key counts, in order.
    pub keys: KeyCounts,
    /// Churn events of every run; `None`: the workload's own.
    pub events: Option<usize>,
    /// The paced runs' offered rate, in ops per second.
    pub rate: u64,
    /// Shards of the sharded engine.
    pub shards: usize,
    /// The generator's seed.
    pub seed: u64,
}

/// A sweep's key counts, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyCounts(pub Vec<usize>);

/// Parses `10k,100k,1M,4M` (also plain numbers, `_` separators and a lower-case `m`).
///
/// ```
/// use loadgen::runner::scale_sweep::{parse_key_counts, KeyCounts};
/// assert_eq!(parse_key_counts("10k,1M,2_500"), Ok(KeyCounts(vec![10_000, 1_000_000, 2_500])));
/// assert!(parse_key_counts("0").is_err());
/// assert!(parse_key_counts("ten").is_err());
/// ```
pub fn parse_key_counts(s: &str) -> Result<KeyCounts, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        let clean = part.replace('_', "");
        let (digits, scale) = match clean.char_indices().last() {
            Some((i, 'k' | 'K')) => (&clean[..i], 1_000),
            Some((i, 'm' | 'M')) => (&clean[..i], 1_000_000),
            _ => (&clean[..], 1),
        };
        let n: usize = digits
            .parse()
            .ok()
            .and_then(|n: usize| n.checked_mul(scale))
            .ok_or_else(|| format!("{part:?} is not a key count (e.g. 10k, 1M, 250000)"))?;
        if n == 0 {
            return Err("a key count must be at least 1".to_string());
        }
        if u32::try_from(n).is_err() {
            return Err(format!("{part:?}: at most {} keys", u32::MAX));
        }
        out.push(n);
    }
    Ok(KeyCounts(out))
}

/// One engine at one key count.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// The engine.
    pub engine: String,
    /// Distinct keys.
    pub keys: usize,
    /// Flat out: events per second.
    pub events_per_s: f64,
    /// Flat out: peak resident memory the engine added, per key.
    pub bytes_per_key: Option<f64>,
    /// Paced: the 99th percentile latency, microseconds.
    pub paced_p99_us: Option<f64>,
    /// Paced: the 99.9th percentile latency, microseconds.
    pub paced_p999_us: Option<f64>,
    /// Paced: whether the producer kept its schedule.
    pub paced_kept_up: Option<bool>,
    /// Both runs' verdicts were ok.
    pub ok: bool,
}

impl Point {
    fn of(flat: &RunResult, paced: &RunResult) -> Self {
        Self {
            engine: flat.engine.clone(),
            keys: flat.keys,
            events_per_s: flat.events_per_s,
            bytes_per_key: flat
                .peak_rss_bytes
                .map(|b| b as f64 / flat.keys.max(1) as f64),
            paced_p99_us: paced.latency_us.p99,
            paced_p999_us: paced.latency_us.p999,
            paced_kept_up: paced.kept_up,
            ok: flat.is_ok() && paced.is_ok(),
        }
    }
}

/// `scale`'s JSON report.
#[derive(Debug, Serialize)]
pub struct ScaleReport {
    /// The machine and build the sweep ran on.
    pub machine: Machine,
    /// `/proc/loadavg`'s 1, 5 and 15-minute load averages when the sweep started and ended
    /// (the runs share the machine with whatever else runs: read the figures with these).
    pub load_average: [Option<String>; 2],
    /// The workload.
    pub workload: String,
    /// Churn events of every run.
    pub events: usize,
    /// The paced runs' offered rate.
    pub rate: u64,
    /// One per engine and key count.
    pub points: Vec<Point>,
    /// Every run as `run --json` reports it (flat out, then paced, per key count and engine).
    pub runs: Vec<RunResult>,
}

/// Why a sweep failed.
#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    /// The arguments make no sweep.
    #[error("invalid arguments: {0}")]
    Invalid(String),
    /// A run failed (its child, or its arguments).
    #[error(transparent)]
    Run(#[from] crate::pipelines::bare::RunError),
    /// A file could not be written.
    #[error("{0}")]
    Write(String),
}

/// Runs the sweep of `plan` (every run in a child process) and returns its report.
pub fn sweep(plan: &SweepPlan, ui: Ui) -> Result<ScaleReport, ScaleError> {
    if plan.workload == Workload::W4 {
        return Err(ScaleError::Invalid(
            "w4 writes straight into the indexer: it has no queue to pace".to_string(),
        ));
    }
    if plan.rate == 0 {
        return Err(ScaleError::Invalid("--rate must be at least 1".to_string()));
    }
    let load_before = load_average();
    let engines = plan.engines.clone();
    let total = (plan.keys.0.len() * engines.len() * 2) as u64;
    let phase = ui.phase(format!("{} scale", plan.workload), total);
    let mut points = Vec::new();
    let mut runs = Vec::new();
    let mut done = 0;
    for &keys in &plan.keys.0 {
        let mut spec = WorkloadSpec::new(plan.workload).seed(plan.seed).keys(keys);
        if let Some(events) = plan.events {
            spec = spec.events(events);
        }
        for &engine in &engines {
            let mut pair = Vec::with_capacity(2);
            for rate in [None, Some(plan.rate)] {
                let cfg = EngineConfig {
                    shards: plan.shards,
                    rate,
                    ..EngineConfig::for_workload(plan.workload)
                };
                let result = one_run(&spec, engine, &cfg)?;
                done += 1;
                phase.step(done, &line(&result));
                pair.push(result);
            }
            points.push(Point::of(&pair[0], &pair[1]));
            runs.extend(pair);
        }
    }
    phase.finish(&format!("{} runs", runs.len()));
    Ok(ScaleReport {
        machine: Machine::detect(),
        load_average: [load_before, load_average()],
        workload: plan.workload.name().to_string(),
        events: plan
            .events
            .unwrap_or_else(|| plan.workload.default_events()),
        rate: plan.rate,
        points,
        runs,
    })
}

/// The 1, 5 and 15-minute load averages, as `/proc/loadavg` gives them.
fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let fields: Vec<&str> = text.split_whitespace().take(3).collect();
    (fields.len() == 3).then(|| fields.join(" "))
}

fn one_run(
    spec: &WorkloadSpec,
    engine: EngineKind,
    cfg: &EngineConfig,
) -> Result<RunResult, ScaleError> {
    let rows = RunSpec::bare(spec, &[engine], cfg);
    Ok(rows[0].probe(false)?)
}

fn line(r: &RunResult) -> String {
    let mode = r.offered_rate.map_or_else(
        || "flat out".to_string(),
        |rate| format!("at {}/s", si(rate as f64)),
    );
    let p99 = r
        .latency_us
        .p99
        .map_or_else(|| "-".to_string(), |us| format!("{:.2} ms", us / 1e3));
    let mem = r.peak_rss_bytes.map_or_else(
        || "-".to_string(),
        |b| format!("{:.0} B/key", b as f64 / r.keys as f64),
    );
    format!(
        "  {:>9} keys {:<9} {:<12} {:>8} events/s  p99 {:>10}  {:>10}  {}",
        r.keys,
        r.engine,
        mode,
        si(r.events_per_s),
        p99,
        mem,
        r.verdict
    )
}
