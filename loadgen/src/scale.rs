//! `loadgen scale`: how each engine's throughput, latency and memory per key change with the
//! key count.
//!
//! For every key count of the sweep, the workload runs through every engine twice: flat out
//! (its capacity and its peak memory) and paced at one fixed offered rate (its latency at a
//! load both engines are meant to carry). Every run is a child process of its own
//! ([`isolate`](crate::isolate)), so peak memory is that run's alone. The sweep writes a JSON
//! report, an SVG chart of events/s, paced p99 and bytes per key against the key count, and a
//! Markdown summary (the table, the same-run ratios, the machine and its load average).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use plotters::prelude::*;
use serde::Serialize;

use crate::driver::{EngineConfig, EngineKind};
use crate::machine::Machine;
use crate::report::{refuse, si, write_file, write_json, RunResult};
use crate::run::{child_args, parse_workload, EngineChoice};
use crate::ui::Ui;
use crate::workload::{Workload, WorkloadSpec, DEFAULT_SEED};

/// The key counts of a sweep unless told otherwise.
pub const DEFAULT_KEYS: &str = "10k,100k,1M,4M";

/// The offered rate of the paced runs unless told otherwise, in ops per second.
pub const DEFAULT_RATE: u64 = 300_000;

/// Arguments of `loadgen scale`.
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// Which workload (w1, w2, w3 or w5; w4 has no queue to pace).
    #[arg(long, value_parser = parse_workload, default_value = "w1")]
    pub workload: Workload,
    /// Which engine(s).
    #[arg(long, value_enum, default_value = "all")]
    pub engine: EngineChoice,
    /// Key counts, comma-separated; `k` and `M` suffixes allowed.
    #[arg(long, default_value = DEFAULT_KEYS, value_parser = parse_key_counts)]
    pub keys: KeyCounts,
    /// Churn events after the initial population, the same at every key count. Default: the
    /// workload's own (docs/workloads.md).
    #[arg(long)]
    pub events: Option<usize>,
    /// The offered rate of the paced runs, in ops per second.
    #[arg(long, default_value_t = DEFAULT_RATE)]
    pub rate: u64,
    /// Shards of the sharded engine: a power of two from 1 to 65536.
    #[arg(long, default_value_t = kcache::sharded::DEFAULT_SHARDS, value_parser = crate::driver::parse_shards)]
    pub shards: usize,
    /// The splitmix64 seed.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Where the JSON report goes.
    #[arg(long, default_value = "results/scale.json")]
    pub json: PathBuf,
    /// Where the chart goes.
    #[arg(long, default_value = "results/scale.svg")]
    pub chart: PathBuf,
    /// Where the Markdown summary goes.
    #[arg(long, default_value = "results/scale.md")]
    pub md: PathBuf,
}

/// A sweep's key counts, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyCounts(pub Vec<usize>);

/// Parses `10k,100k,1M,4M` (also plain numbers, `_` separators and a lower-case `m`).
///
/// ```
/// use loadgen::scale::{parse_key_counts, KeyCounts};
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
    /// A child run failed.
    #[error(transparent)]
    Isolate(#[from] crate::isolate::IsolateError),
    /// A file could not be written.
    #[error("{0}")]
    Write(String),
}

/// Runs the sweep of `args` (every run in a child process) and returns its report.
pub fn sweep(args: &ScaleArgs, ui: Ui) -> Result<ScaleReport, ScaleError> {
    if args.workload == Workload::W4 {
        return Err(ScaleError::Invalid(
            "w4 writes straight into the indexer: it has no queue to pace".to_string(),
        ));
    }
    if args.rate == 0 {
        return Err(ScaleError::Invalid("--rate must be at least 1".to_string()));
    }
    let load_before = load_average();
    let engines = args.engine.engines();
    let total = (args.keys.0.len() * engines.len() * 2) as u64;
    let phase = ui.phase(format!("{} scale", args.workload), total);
    let mut points = Vec::new();
    let mut runs = Vec::new();
    let mut done = 0;
    for &keys in &args.keys.0 {
        let mut spec = WorkloadSpec::new(args.workload).seed(args.seed).keys(keys);
        if let Some(events) = args.events {
            spec = spec.events(events);
        }
        for &engine in &engines {
            let mut pair = Vec::with_capacity(2);
            for rate in [None, Some(args.rate)] {
                let cfg = EngineConfig {
                    shards: args.shards,
                    rate,
                    ..EngineConfig::for_workload(args.workload)
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
        workload: args.workload.name().to_string(),
        events: args
            .events
            .unwrap_or_else(|| args.workload.default_events()),
        rate: args.rate,
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
    let mut results = crate::isolate::run_child_quietly(&child_args(spec, engine, cfg))?;
    results
        .pop()
        .ok_or_else(|| ScaleError::Invalid("a child run reported no result".to_string()))
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

/// The sweep as a table: one row per key count and engine.
pub fn table(report: &ScaleReport) -> String {
    let mut out = format!(
        "{:>9}  {:<9}  {:>10}  {:>10}  {:>12}  {:>13}  verdict\n",
        "keys",
        "engine",
        "events/s",
        "B/key",
        format!("p99 @{}", si(report.rate as f64)),
        format!("p999 @{}", si(report.rate as f64)),
    );
    let ms =
        |us: Option<f64>| us.map_or_else(|| "-".to_string(), |us| format!("{:.2} ms", us / 1e3));
    for p in &report.points {
        out += &format!(
            "{:>9}  {:<9}  {:>10}  {:>10}  {:>12}  {:>13}  {}\n",
            p.keys,
            p.engine,
            si(p.events_per_s),
            p.bytes_per_key
                .map_or_else(|| "-".to_string(), |b| format!("{b:.0}")),
            ms(p.paced_p99_us),
            ms(p.paced_p999_us),
            if p.ok { "ok" } else { "FAIL" },
        );
    }
    out
}

/// The key count each engine's events/s are compared with in [`markdown`]: 100,000 (the
/// workloads' usual size) when the sweep has it, else its first.
const BASE_KEYS: usize = 100_000;

/// The sweep as a Markdown page: how it was made, the table, and per key count the same-run
/// ratios sharded ÷ reference and each engine's events/s against its own at 100,000 keys (or
/// at the sweep's first key count when it has no 100,000).
pub fn markdown(report: &ScaleReport) -> String {
    let m = &report.machine;
    let unknown = || "unknown".to_string();
    let load = |l: &Option<String>| l.clone().unwrap_or_else(unknown);
    let mut out = format!(
        "# {} against key count\n\n\
         `loadgen scale --workload {} --events {} --rate {}` (every run a child process of its \
         own; flat out for events/s and peak memory, paced at {}/s for p99/p999).\n\n\
         Machine: {}, {} cores, {}, commit `{}`, {} build, {}. Load average (1, 5, 15 min) \
         {} at the start, {} at the end.\n\n```text\n{}```\n\n",
        report.workload.to_uppercase(),
        report.workload,
        report.events,
        report.rate,
        si(report.rate as f64),
        m.cpu.clone().unwrap_or_else(unknown),
        m.cores,
        m.rustc.clone().unwrap_or_else(unknown),
        m.commit.clone().unwrap_or_else(unknown),
        m.profile,
        m.allocator,
        load(&report.load_average[0]),
        load(&report.load_average[1]),
        table(report),
    );
    let find = |engine: &str, keys: usize| {
        report
            .points
            .iter()
            .find(|p| p.engine == engine && p.keys == keys)
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "-".to_string(),
    };
    let base = if report.points.iter().any(|p| p.keys == BASE_KEYS) {
        Some(BASE_KEYS)
    } else {
        report.points.first().map(|p| p.keys)
    };
    let at_base = base.map_or_else(|| "-".to_string(), |k| k.to_string());
    out += &format!(
        "| keys | events/s sharded ÷ reference | B/key sharded ÷ reference | paced p99 sharded ÷ reference | sharded events/s ÷ at {at_base} keys | reference events/s ÷ at {at_base} keys |\n"
    );
    out += "|---:|---:|---:|---:|---:|---:|\n";
    let mut keys: Vec<usize> = report.points.iter().map(|p| p.keys).collect();
    keys.dedup();
    for k in keys {
        let (r, s) = (find("reference", k), find("sharded", k));
        let own = |engine: &str| {
            let at = find(engine, k).map(|p| p.events_per_s);
            ratio(
                at,
                base.and_then(|b| find(engine, b)).map(|p| p.events_per_s),
            )
        };
        out += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            k,
            ratio(s.map(|p| p.events_per_s), r.map(|p| p.events_per_s)),
            ratio(
                s.and_then(|p| p.bytes_per_key),
                r.and_then(|p| p.bytes_per_key)
            ),
            ratio(
                s.and_then(|p| p.paced_p99_us),
                r.and_then(|p| p.paced_p99_us)
            ),
            own("sharded"),
            own("reference"),
        );
    }
    out
}

/// Draws events/s (flat out), p99 (paced) and bytes per key (flat out) against the key count,
/// three panels side by side, one line per engine; every axis on a log scale.
pub fn chart_svg(report: &ScaleReport, path: &Path) -> Result<(), crate::chart::ChartError> {
    let fail = |message: String| crate::chart::ChartError {
        path: path.to_path_buf(),
        message,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    }
    let root = SVGBackend::new(path, (1500, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let root = root
        .titled(
            &format!(
                "{} against key count ({} churn events; p99 paced at {}/s)",
                report.workload.to_uppercase(),
                si(report.events as f64),
                si(report.rate as f64)
            ),
            ("sans-serif", 22),
        )
        .map_err(|e| fail(e.to_string()))?;
    let panels = root.split_evenly((1, 3));
    type Metric = fn(&Point) -> Option<f64>;
    let metrics: [(&str, &str, Metric); 3] = [
        ("events/s, flat out", "events/s", |p| Some(p.events_per_s)),
        ("p99 latency, paced", "p99 (ms)", |p| {
            p.paced_p99_us.map(|us| us / 1e3)
        }),
        ("peak memory per key, flat out", "bytes per key", |p| {
            p.bytes_per_key
        }),
    ];
    let mut engines: Vec<&str> = Vec::new();
    for p in &report.points {
        if !engines.contains(&p.engine.as_str()) {
            engines.push(&p.engine);
        }
    }
    let (x_lo, x_hi) = report.points.iter().fold((f64::MAX, 0f64), |(lo, hi), p| {
        (lo.min(p.keys as f64), hi.max(p.keys as f64))
    });
    let (x_lo, x_hi) = if x_hi > 0.0 {
        (x_lo / 1.5, x_hi * 1.5)
    } else {
        (1.0, 10.0)
    };
    for (panel, (caption, y_desc, metric)) in panels.iter().zip(metrics) {
        let ys: Vec<f64> = report
            .points
            .iter()
            .filter_map(metric)
            .filter(|y| *y > 0.0)
            .collect();
        let (y_lo, y_hi) = ys
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &y| (lo.min(y), hi.max(y)));
        let (y_lo, y_hi) = if y_hi > 0.0 {
            (y_lo / 2.0, y_hi * 2.0)
        } else {
            (0.1, 10.0)
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())
            .map_err(|e| fail(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("keys (log scale)")
            .x_label_formatter(&|v| si(*v))
            .y_desc(y_desc)
            .y_label_formatter(&|v| si(*v))
            .draw()
            .map_err(|e| fail(e.to_string()))?;
        for engine in &engines {
            let color = if *engine == "sharded" {
                RGBColor(0xdd, 0x84, 0x52)
            } else {
                RGBColor(0x4c, 0x72, 0xb0)
            };
            let line: Vec<(f64, f64)> = report
                .points
                .iter()
                .filter(|p| p.engine == *engine)
                .filter_map(|p| metric(p).filter(|y| *y > 0.0).map(|y| (p.keys as f64, y)))
                .collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(|e| fail(e.to_string()))?
                .label(engine.to_string())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2))
                });
            chart
                .draw_series(line.iter().map(|&xy| Circle::new(xy, 4, color.filled())))
                .map_err(|e| fail(e.to_string()))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| fail(e.to_string()))?;
    }
    root.present().map_err(|e| fail(e.to_string()))
}

/// Runs the sweep and writes its JSON report and chart (for `scale` and `compare --scale`).
pub fn sweep_and_write(args: &ScaleArgs, ui: Ui) -> Result<ScaleReport, ScaleError> {
    let report = sweep(args, ui)?;
    write_json(&args.json, &report).map_err(|e| ScaleError::Write(e.to_string()))?;
    chart_svg(&report, &args.chart).map_err(|e| ScaleError::Write(e.to_string()))?;
    write_file(&args.md, markdown(&report).as_bytes())
        .map_err(|e| ScaleError::Write(e.to_string()))?;
    Ok(report)
}

/// Runs `loadgen scale`.
pub fn main(args: ScaleArgs) -> ExitCode {
    match sweep_and_write(&args, Ui::detect()) {
        Ok(report) => {
            print!("{}", table(&report));
            eprintln!(
                "wrote {}, {} and {}",
                args.json.display(),
                args.chart.display(),
                args.md.display()
            );
            if report.points.iter().all(|p| p.ok) {
                ExitCode::SUCCESS
            } else {
                eprintln!("scale: a run's verdict failed (see `runs` in the JSON report)");
                ExitCode::from(1)
            }
        }
        Err(e) => refuse("scale", e),
    }
}
