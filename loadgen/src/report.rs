//! One engine's result on one workload: measuring it, and showing it as a table and as JSON.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::driver::{
    execute, kept_schedule, EngineConfig, EngineError, EngineKind, Mode, Progress,
};
use crate::latency::Percentiles;
use crate::rss::{PeakSource, RssProbe};
use crate::timeline::Interval;
use crate::verdict::{check_with, Counters};
use crate::workload::Generated;

/// Enqueue-to-pop latency percentiles in microseconds; all `null` where nothing was queued (W4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyUs {
    /// Median.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// 99.9th percentile.
    pub p999: Option<f64>,
}

/// One row of a report; the JSON object of `results[]`.
///
/// `Default` leaves every per-path field empty (`controller`, `handlers`, `informer`,
/// `timeline`, the paced-run figures), so each path names only the fields it fills.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// `reference` or `sharded`.
    pub engine: String,
    /// `w1` .. `w5`, or `replay`.
    pub workload: String,
    /// Distinct keys of the workload.
    pub keys: usize,
    /// Objects handed to the engine: adds, updates, deletes and relisted objects.
    pub events: u64,
    /// Wall time of the run (enqueue of the first event to the end of the drain).
    pub wall_s: f64,
    /// `events / wall_s`; for W4 the writer's rate.
    pub events_per_s: f64,
    /// Keys popped.
    pub pops: u64,
    /// Deltas per pop; `null` for W4, which pops nothing.
    pub deltas_per_pop: Option<f64>,
    /// Enqueue-to-pop latency of the sampled events.
    pub latency_us: LatencyUs,
    /// Peak resident memory the engine added over the generated events; `null` if unknown.
    pub peak_rss_bytes: Option<u64>,
    /// How `peak_rss_bytes` was measured: `hwm` (VmHWM after reset) or `rss_end`.
    pub peak_rss_source: Option<String>,
    /// W4: reads per second by all readers together (`get` and `by_index` each count one).
    pub reads_per_s: Option<f64>,
    /// Consumer threads (readers for W4).
    pub threads: usize,
    /// Shards of the sharded engine; `null` for the reference.
    pub shards: Option<usize>,
    /// Deltas delivered.
    pub deltas: u64,
    /// The offered load of a paced run (`--rate`), in ops per second; `null` when flat out.
    pub offered_rate: Option<u64>,
    /// A paced run: the producer's largest lag behind its schedule, in milliseconds.
    pub producer_lag_ms: Option<f64>,
    /// A paced run: whether that lag stayed within 1% of the scheduled length
    /// ([`kept_schedule`](crate::driver::kept_schedule)).
    pub kept_up: Option<bool>,
    /// W6 only: workers, reconciles, retries (`null` for the other workloads).
    #[serde(default)]
    pub controller: Option<crate::controller_loop::ControllerFigures>,
    /// `ok`, or `FAIL: ...` with the first failed rule.
    pub verdict: String,
    /// Every failed rule (empty when `ok`).
    pub failures: Vec<String>,
    /// `--through informer`: one verdict per handler (absent otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handlers: Vec<HandlerResult>,
    /// `--through informer`: what the reflector did (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub informer: Option<InformerStats>,
    /// Latency per interval of the run (`run --timeline`); absent unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<Interval>>,
}

/// One handler of a run through the informer (`loadgen run --through informer`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandlerResult {
    /// Its number, in registration order.
    pub handler: usize,
    /// Whether it is the slow one.
    pub slow: bool,
    /// Handler calls.
    pub notifications: u64,
    /// Deletions it learnt from a relist (tombstones).
    pub tombstones: u64,
    /// When its view became the final state, from the informer's start; `null` if never.
    pub caught_up_s: Option<f64>,
    /// `ok`, or `FAIL: ...`.
    pub verdict: String,
    /// Every failed rule of this handler.
    pub failures: Vec<String>,
}

/// What the reflector of a run through the informer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InformerStats {
    /// List calls served (pages count one each).
    pub lists: u64,
    /// Watch calls served.
    pub watches: u64,
    /// Errors the reflector reported (the scripted outages and 410s among them).
    pub reflector_errors: u64,
    /// Scripted 410s no watch had received yet when the run ended.
    #[serde(default)]
    pub expired_watches_pending: u64,
    /// Workload resyncs left out (the informer resyncs on its own timer).
    pub skipped_resyncs: u64,
}

impl LatencyUs {
    /// The percentiles of `hist`; all `null` when it holds no sample.
    pub fn of(hist: &Histogram<u64>) -> Self {
        Percentiles::of(hist).map_or(LatencyUs::default(), |p| LatencyUs {
            p50: Some(p.p50),
            p99: Some(p.p99),
            p999: Some(p.p999),
        })
    }
}

/// `peak_rss_bytes` and `peak_rss_source` of a run from what its [`RssProbe`] found.
pub fn peak_rss(peak: Option<(u64, PeakSource)>) -> (Option<u64>, Option<String>) {
    let source = peak.map(|(_, source)| {
        match source {
            PeakSource::HighWaterMark => "hwm",
            PeakSource::EndResident => "rss_end",
        }
        .to_string()
    });
    (peak.map(|(bytes, _)| bytes), source)
}

impl RunResult {
    /// Whether the verdict is `ok`.
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }
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
    let done = execute(engine, gen, mode, cfg, progress)?;
    let peak = probe.finish();
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

/// The JSON document `run --json` writes (`replay --json` adds its parse summary around the
/// same `results`; a child process reports through either).
#[derive(Debug, Clone, Serialize)]
pub struct Report<'a> {
    /// Every row.
    pub results: &'a [RunResult],
}

/// A report file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {source} (check that the directory exists and is writable)")]
pub struct WriteError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// Writes `contents` to `path`, creating its directory.
pub fn write_file(path: &Path, contents: &[u8]) -> Result<(), WriteError> {
    let wrap = |source| WriteError {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(wrap)?;
    }
    fs::write(path, contents).map_err(wrap)
}

/// Writes `value` to `path` as pretty-printed JSON: `run --json`'s [`Report`],
/// `replay --json`'s report, `compare`'s `latest.json`.
pub fn write_json<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<(), WriteError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| WriteError {
        path: path.to_path_buf(),
        source: io::Error::other(e),
    })?;
    text.push('\n');
    write_file(path, text.as_bytes())
}

/// How `run`, `replay` and `compare` end once their engines have run: prints `shown` (the
/// command's table) on stdout and every failed verdict on stderr, then writes the command's
/// files with `write`. The exit code is 0 when every verdict is ok, 1 when one failed, 2
/// when the files could not be written.
pub fn finish(
    command: &str,
    shown: &str,
    results: &[RunResult],
    write: impl FnOnce() -> Result<(), String>,
) -> ExitCode {
    print!("{shown}");
    for r in results.iter().filter(|r| !r.is_ok()) {
        eprintln!("{} {}: verdict failed:", r.engine, r.workload);
        for failure in &r.failures {
            eprintln!("  {failure}");
        }
    }
    if let Err(e) = write() {
        return refuse(command, e);
    }
    if results.iter().all(RunResult::is_ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How a command ends when it cannot do its job (bad input, a child that failed, a file it
/// could not write): `loadgen COMMAND: why` on stderr, exit code 2.
pub fn refuse(command: &str, why: impl std::fmt::Display) -> ExitCode {
    eprintln!("loadgen {command}: {why}");
    ExitCode::from(2)
}

/// `1234567` → `1.23M`, for the table.
pub fn si(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.2}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Bytes as MiB.
pub fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// Right-aligns every column but the last, which is left as is.
pub fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if i + 1 == row.len() {
                line.push_str(cell);
            } else if i < 2 {
                let _ = write!(line, "{cell:<w$}", w = widths[i]);
            } else {
                let _ = write!(line, "{cell:>w$}", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A paced run's largest producer lag, marked when the producer fell behind its schedule.
fn lag(r: &RunResult) -> String {
    match (r.producer_lag_ms, r.kept_up) {
        (Some(ms), Some(false)) => format!("{ms:.2} behind"),
        (Some(ms), _) => format!("{ms:.2}"),
        (None, _) => "-".to_string(),
    }
}

/// The results as an aligned text table, one row per run.
///
/// ```
/// let table = loadgen::report::table(&[]);
/// assert!(table.starts_with("engine"));
/// ```
pub fn table(results: &[RunResult]) -> String {
    let mut rows = vec![[
        "engine", "workload", "events", "wall s", "events/s", "pops", "Δ/pop", "p50 µs", "p99 µs",
        "p999 µs", "+RSS MiB", "reads/s", "recon/s", "lag ms", "verdict",
    ]
    .map(String::from)
    .to_vec()];
    for r in results {
        rows.push(vec![
            r.engine.clone(),
            r.workload.clone(),
            r.events.to_string(),
            format!("{:.3}", r.wall_s),
            si(r.events_per_s),
            r.pops.to_string(),
            opt(r.deltas_per_pop, |v| format!("{v:.2}")),
            opt(r.latency_us.p50, |v| format!("{v:.1}")),
            opt(r.latency_us.p99, |v| format!("{v:.1}")),
            opt(r.latency_us.p999, |v| format!("{v:.1}")),
            r.peak_rss_bytes.map_or_else(|| "-".to_string(), mib),
            opt(r.reads_per_s, si),
            opt(r.controller.map(|c| c.reconciles_per_s), si),
            lag(r),
            r.verdict.clone(),
        ]);
    }
    aligned(&rows)
}

/// The distinct values of `field` over `results`, in the order they first appear (tables and
/// charts list workloads and engines in run order).
pub fn first_seen<'a>(
    results: &'a [RunResult],
    field: impl Fn(&'a RunResult) -> &'a String,
) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for r in results {
        let value = field(r).as_str();
        if !out.contains(&value) {
            out.push(value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(failures: &[&str]) -> RunResult {
        RunResult {
            engine: "sharded".into(),
            workload: "w1".into(),
            keys: 1,
            events: 1,
            wall_s: 1.0,
            events_per_s: 1.0,
            pops: 1,
            deltas_per_pop: Some(1.0),
            threads: 1,
            shards: Some(1),
            deltas: 1,
            verdict: if failures.is_empty() {
                "ok".into()
            } else {
                format!("FAIL: {}", failures[0])
            },
            failures: failures.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_exit_code_is_0_when_all_ok_1_on_a_failed_verdict_2_when_files_fail() {
        let ok = [row(&[]), row(&[])];
        assert_eq!(finish("run", "", &ok, || Ok(())), ExitCode::SUCCESS);
        let failed = [row(&[]), row(&["missing key x"])];
        assert_eq!(finish("run", "", &failed, || Ok(())), ExitCode::FAILURE);
        let unwritable = || Err("cannot write /x".to_string());
        assert_eq!(finish("run", "", &ok, unwritable), ExitCode::from(2));
        assert_eq!(finish("run", "", &failed, unwritable), ExitCode::from(2));
    }

    #[test]
    fn the_json_report_is_written_with_its_directory() {
        let dir = std::env::temp_dir().join(format!("loadgen-report-{}", std::process::id()));
        let path = dir.join("nested").join("r.json");
        let results = [row(&["missing key x"])];
        write_json(&path, &Report { results: &results }).expect("written");
        let back: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).expect("read back")).expect("JSON");
        assert_eq!(back["results"][0]["failures"][0], "missing key x");
        fs::remove_dir_all(&dir).ok();
    }
}
