//! `loadgen compare`: both engines on equal work first, W1's, W2's and W5's capacity at the
//! same p99 limit, bare and (W1) through the informer (see
//! [`capacity_search`](crate::runner::capacity_search); `--no-capacity` skips it) and W1 at one
//! offered rate; then W1–W6 flat out (W6 as a whole controller on the shared
//! informer, its default form: `w6/informer`), labelled saturated, with the ratio
//! sharded/reference of every figure. Writes `latest.json`, `latest.md`, `throughput.svg`,
//! `latency.svg` and `capacity-w1.svg`, `capacity-w2.svg`, `capacity-w5.svg`,
//! `capacity-w1-informer.svg` into the output directory.
//!
//! The default sizes of the side-by-side runs finish in about a minute and a half on the
//! project's 2-core machine (release build; the committed `results/latest.json` measured 75 s
//! of engine time), the capacity searches add their probes (see [`capacity_plan`]): W1–W3 at
//! their full sizes (docs/workloads.md), W4 and W5 trimmed (see [`plan`]). Every engine run is
//! a child process of its own (see [`isolate`](crate::harness::isolate)), so no run inherits memory that
//! an earlier one freed; `--in-process` runs everything in this process instead. `--quick`
//! runs tiny sizes, for tests and smoke checks.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;

use crate::engines::{parse_consumers, EngineConfig, EngineKind};
use crate::harness::informer_handlers::InformerConfig;
use crate::measure::machine::{command_line, Machine};
use crate::pipelines::bare::RunError;
use crate::pipelines::controller_loop::ControllerConfig;
use crate::pipelines::harness_floor::Subject;
use crate::reports::capacity_report::{claim, summary_rows};
use crate::reports::chart::{capacity_svg, latency_svg, throughput_svg};
use crate::reports::report::{aligned, finish, first_seen, refuse, write_file, write_json};
use crate::reports::scale_report::{table as scale_table, write};
use crate::result::RunResult;
use crate::runner::capacity_search::{
    measure_engine, Curve, Job, ProbeSize, SearchPlan, DEFAULT_P99_LIMIT_MS, MIN_PROBE_EVENTS,
};
use crate::runner::run_spec::{run_all, Pipeline, RunSpec, Source};
use crate::runner::scale_sweep::{
    parse_key_counts, sweep, ScaleError, ScaleReport, SweepPlan, DEFAULT_KEYS, DEFAULT_RATE,
};
use crate::ui::Ui;
use crate::units::{mib, si};
use workloads::{Workload, WorkloadSpec, DEFAULT_SEED};

/// Arguments of `loadgen compare`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// Where to write latest.json, latest.md, throughput.svg and latency.svg.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// Tiny sizes (seconds, not minutes): for tests and smoke checks.
    #[arg(long)]
    pub quick: bool,
    /// Shards of the sharded engine: a power of two from 1 to 65536.
    #[arg(long, default_value_t = kcache::sharded::DEFAULT_SHARDS, value_parser = workloads::parse_shards)]
    pub shards: usize,
    /// Consumer threads of the sharded engine (the reference always uses exactly one).
    /// Default: per workload, see `loadgen run --help`.
    #[arg(long, value_parser = parse_consumers)]
    pub consumers: Option<usize>,
    /// Bound both engines' backlog (see `loadgen run --help`; 0: unbounded, the default).
    #[arg(long, default_value_t = 0)]
    pub max_queued_deltas: usize,
    /// Both engines compact consecutive updates (see `loadgen run --help`).
    #[arg(long)]
    pub compact_updates: bool,
    /// The splitmix64 seed.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Run everything in this process instead of one child process per engine run (the peak
    /// memory of later runs is then understated; see `loadgen run --help`).
    #[arg(long)]
    pub in_process: bool,
    /// Skip the capacity searches of W1, W2 and W5 (a few minutes of the default run).
    #[arg(long)]
    pub no_capacity: bool,
    /// Also sweep W1 over key counts (`loadgen scale`: 10k, 100k, 1M and 4M keys, 1,000,000
    /// churn events, flat out and at 300k/s; tiny with `--quick`) into `scale.json` and
    /// `scale.svg`. Off by default: the 4M-key runs take minutes.
    #[arg(long)]
    pub scale: bool,
}

/// The workload sizes of a comparison, in order.
///
/// Full: W1, W2 and W3 at their sizes in docs/workloads.md (100,000 keys × 5,000,000 events; 1,000,000 ×
/// 5,000,000; 150,000 × 10 rounds of 100,000); W4 at 100,000 keys × 3,000,000 events (its
/// readers share the two cores with the writer, so full size would take half a minute per
/// engine); W5 at 100,000 × 2,000,000 (the handler alone costs 2 µs per delta); W6 at
/// 100,000 × [`W6_EVENTS`]. About a minute and a half on the 2-core machine, child processes
/// and generation included, plus W6's seconds.
pub fn plan(quick: bool, seed: u64) -> Vec<WorkloadSpec> {
    let sizes: [(Workload, usize, usize); 6] = if quick {
        [
            (Workload::W1, 2_000, 20_000),
            (Workload::W2, 10_000, 20_000),
            (Workload::W3, 3_000, 20_000),
            (Workload::W4, 2_000, 20_000),
            (Workload::W5, 2_000, 10_000),
            (Workload::W6, 2_000, 10_000),
        ]
    } else {
        [
            (Workload::W1, 100_000, 5_000_000),
            (Workload::W2, 1_000_000, 5_000_000),
            (Workload::W3, 150_000, 1_000_000),
            (Workload::W4, 100_000, 3_000_000),
            (Workload::W5, 100_000, 2_000_000),
            (Workload::W6, 100_000, W6_EVENTS),
        ]
    };
    sizes
        .into_iter()
        .map(|(w, keys, events)| WorkloadSpec::new(w).keys(keys).events(events).seed(seed))
        .collect()
}

/// W6's churn events in a full comparison: a fifth of its own size, so both pipelines together
/// add about 12 s to a comparison on the 2-core machine (measured on the bare-queue form, on a
/// loaded machine: the reference 7.5–7.9 s, the sharded 2.4–5 s, plus generating the events
/// in each child; the informer form, now compare's, adds the server and the reflector and has
/// not been timed at this size).
pub const W6_EVENTS: usize = 1_000_000;

/// `latest.json`: the machine, the command, the same `results` as `run --json`, and the
/// capacity curves as `capacity --json` writes them.
#[derive(Debug, Clone, Serialize)]
pub struct CompareReport {
    /// Where it ran.
    pub machine: Machine,
    /// The command line that produced it.
    pub command: String,
    /// One row per engine and workload.
    pub results: Vec<RunResult>,
    /// W1's and W5's capacity per engine (empty with `--no-capacity`).
    pub capacity: Vec<Curve>,
}

/// The capacity searches of a comparison: W1, W2 and W5 at the same key count, with probes shorter
/// and a coarser precision than `loadgen capacity`'s defaults (1 s per probe, 10%, at most 16
/// probes per engine): the four searches took 10–11 probes each and 3 min in all on the 2-core
/// machine while other builds loaded it; `quick`: tiny.
pub fn capacity_plan(args: &CompareArgs) -> Vec<Job> {
    let (keys, size, plan) = if args.quick {
        // At most 6 probes of at most 2,000 ops at 10,000/s or faster: a fraction of a second.
        let size = ProbeSize {
            secs: 0.05,
            min_events: 1_000,
            max_events: 10_000,
        };
        let plan = SearchPlan {
            start: 50_000,
            min: 10_000,
            max: 1_000_000,
            factor: 2.0,
            precision: 0.5,
            tries: 1,
            max_probes: 6,
        };
        (1_000, size, plan)
    } else {
        let size = ProbeSize {
            secs: 1.0,
            min_events: MIN_PROBE_EVENTS,
            max_events: 2_000_000,
        };
        let plan = SearchPlan {
            start: 100_000,
            // The longest probe, 116,000 ops at 20,000/s, lasts 5.8 s.
            min: 20_000,
            max: 20_000_000,
            factor: 2.0,
            precision: 0.10,
            tries: 2,
            max_probes: 16,
        };
        (100_000, size, plan)
    };
    let bare = [Workload::W1, Workload::W2, Workload::W5].map(|w| (w, None));
    // And W1 through the informer, as a controller's cache meets its events: written into the
    // in-memory API server, heard by the default three handlers.
    let through_informer = (Workload::W1, Some(InformerConfig::default()));
    bare.into_iter()
        .chain([through_informer])
        .map(|(w, informer)| {
            let own = EngineConfig::for_workload(w);
            Job {
                spec: WorkloadSpec::new(w).keys(keys).seed(args.seed),
                cfg: EngineConfig {
                    shards: args.shards,
                    consumers: args.consumers.unwrap_or(own.consumers),
                    ..own
                },
                plan,
                size,
                p99_limit_ms: DEFAULT_P99_LIMIT_MS,
                in_process: args.in_process,
                informer,
            }
        })
        .collect()
}

/// Searches the capacity of every job of [`capacity_plan`] on both engines.
pub fn capacity(args: &CompareArgs, ui: Ui) -> Result<Vec<Curve>, RunError> {
    let mut curves = Vec::new();
    if args.no_capacity {
        return Ok(curves);
    }
    for job in capacity_plan(args) {
        for engine in EngineKind::ALL {
            curves.push(measure_engine(&job, engine, ui)?);
        }
    }
    Ok(curves)
}

/// The offered load of the paced W1 run, in ops per second: well below what either engine
/// absorbs here, so that its latency is the engine's hand-off and not a backlog.
pub const PACED_RATE: u64 = 200_000;

/// The paced W1 run: W1's rule at [`PACED_RATE`], labelled `w1@200k/s` in the results.
pub fn paced_plan(quick: bool, seed: u64) -> (WorkloadSpec, String) {
    let (keys, events) = if quick {
        (2_000, 20_000)
    } else {
        (100_000, 600_000)
    };
    let spec = WorkloadSpec::new(Workload::W1)
        .keys(keys)
        .events(events)
        .seed(seed);
    (spec, format!("w1@{}k/s", PACED_RATE / 1000))
}

/// Runs every workload of `plan` through both engines, then W1 at a paced rate.
pub fn compare(args: &CompareArgs, ui: Ui) -> Result<Vec<RunResult>, RunError> {
    let mut results = Vec::new();
    let (paced, paced_label) = paced_plan(args.quick, args.seed);
    let runs = plan(args.quick, args.seed)
        .into_iter()
        .map(|spec| (spec, None))
        .chain([(paced, Some(paced_label))]);
    for (spec, label) in runs {
        let own = EngineConfig::for_workload(spec.workload);
        let cfg = EngineConfig {
            shards: args.shards,
            consumers: args.consumers.unwrap_or(own.consumers),
            rate: label.as_ref().map(|_| PACED_RATE),
            max_queued_deltas: args.max_queued_deltas,
            compact_updates: args.compact_updates,
            ..own
        };
        let pipeline = if spec.workload == Workload::W6 {
            // The default W6: a whole controller on the shared informer.
            Pipeline::ControllerInformer(ControllerConfig {
                seed: spec.seed,
                ..ControllerConfig::default()
            })
        } else {
            Pipeline::Queue
        };
        let subjects = EngineKind::ALL.map(Subject::Engine);
        let specs = RunSpec::rows(&Source::Workload(spec), subjects, &cfg, &[pipeline]);
        let mut rows = run_all(&specs, args.in_process, ui)?;
        if let Some(label) = &label {
            for row in &mut rows {
                row.workload.clone_from(label);
            }
        }
        results.extend(rows);
    }
    Ok(results)
}

/// `a / b` as `1.23×`, or `-` when it means nothing.
fn ratio(sharded: Option<f64>, reference: Option<f64>) -> String {
    match (sharded, reference) {
        (Some(s), Some(r)) if r > 0.0 && s.is_finite() => format!("{:.2}×", s / r),
        _ => "-".to_string(),
    }
}

/// One figure of the side-by-side table: its name, how to read it out of a row, how to show it.
struct Figure {
    name: &'static str,
    value: fn(&RunResult) -> Option<f64>,
    show: fn(f64) -> String,
}

/// A row of [`FIGURES`].
const fn figure(
    name: &'static str,
    value: fn(&RunResult) -> Option<f64>,
    show: fn(f64) -> String,
) -> Figure {
    Figure { name, value, show }
}

fn no_decimals(v: f64) -> String {
    format!("{v:.0}")
}

fn one_decimal(v: f64) -> String {
    format!("{v:.1}")
}

fn two_decimals(v: f64) -> String {
    format!("{v:.2}")
}

fn three_decimals(v: f64) -> String {
    format!("{v:.3}")
}

const FIGURES: [Figure; 17] = [
    figure("keys", |r| Some(r.keys as f64), no_decimals),
    figure("threads", |r| Some(r.threads as f64), no_decimals),
    figure("events", |r| Some(r.events as f64), no_decimals),
    figure("wall s", |r| Some(r.wall_s), three_decimals),
    figure("events/s", |r| Some(r.events_per_s), si),
    figure(
        "pops",
        |r| (r.pops > 0 && r.deltas_per_pop.is_some()).then_some(r.pops as f64),
        no_decimals,
    ),
    figure("deltas/pop", |r| r.deltas_per_pop, two_decimals),
    figure("latency p50 µs", |r| r.latency_us.p50, one_decimal),
    figure("latency p99 µs", |r| r.latency_us.p99, one_decimal),
    figure("latency p99.9 µs", |r| r.latency_us.p999, one_decimal),
    figure(
        "peak +RSS MiB",
        |r| r.peak_rss_bytes.map(|b| b as f64),
        |v| mib(v as u64),
    ),
    figure("CPU µs/event", |r| r.cpu_us_per_event, two_decimals),
    figure("reads/s", |r| r.reads_per_s, si),
    figure(
        "reconciles/s",
        |r| r.controller.map(|c| c.reconciles_per_s),
        si,
    ),
    figure(
        "reconciles/event",
        |r| r.controller.map(|c| c.reconciles_per_event),
        three_decimals,
    ),
    figure(
        "retries",
        |r| r.controller.map(|c| c.retries as f64),
        no_decimals,
    ),
    figure("producer lag ms", |r| r.producer_lag_ms, two_decimals),
];

/// The side-by-side rows: workload, figure, reference, sharded, sharded/reference.
pub fn side_by_side(results: &[RunResult]) -> Vec<Vec<String>> {
    let mut rows = vec![[
        "workload",
        "figure",
        "reference",
        "sharded",
        "sharded/reference",
    ]
    .map(String::from)
    .to_vec()];
    let loads = first_seen(results, |r| &r.workload);
    for w in loads {
        let get = |engine: EngineKind| {
            results
                .iter()
                .find(|r| r.workload == w && r.engine == engine.name())
        };
        let (reference, sharded) = (get(EngineKind::Reference), get(EngineKind::Sharded));
        // `w6/informer` is W6 through the shared informer: still the controller loop.
        let base = w.split_once('/').map_or(w, |(base, _)| base);
        let title = base
            .parse::<Workload>()
            .map_or_else(|_| w.to_string(), |wl| format!("{w} {}", wl.title()));
        for figure in &FIGURES {
            let rv = reference.and_then(figure.value);
            let sv = sharded.and_then(figure.value);
            if rv.is_none() && sv.is_none() {
                continue;
            }
            let show = |v: Option<f64>| v.map_or_else(|| "-".to_string(), figure.show);
            rows.push(vec![
                title.clone(),
                figure.name.to_string(),
                show(rv),
                show(sv),
                ratio(sv, rv),
            ]);
        }
        let verdict =
            |r: Option<&RunResult>| r.map_or_else(|| "-".to_string(), |r| r.verdict.clone());
        rows.push(vec![
            title.clone(),
            "verdict".to_string(),
            verdict(reference),
            verdict(sharded),
            String::new(),
        ]);
    }
    rows
}

/// `latest.md`: the command, the machine, the side-by-side table and the charts.
pub fn markdown(report: &CompareReport) -> String {
    let mut md = String::new();
    let m = &report.machine;
    let unknown = || "unknown".to_string();
    let _ = writeln!(md, "# kcache: reference vs sharded\n");
    let _ = writeln!(md, "Produced by `{}`.\n", report.command);
    let _ = writeln!(md, "| machine | |\n|---|---|");
    let _ = writeln!(md, "| cpu | {} |", m.cpu.clone().unwrap_or_else(unknown));
    let _ = writeln!(md, "| cores | {} |", m.cores);
    let _ = writeln!(md, "| os | {} |", m.os);
    let _ = writeln!(
        md,
        "| rustc | {} |",
        m.rustc.clone().unwrap_or_else(unknown)
    );
    let _ = writeln!(
        md,
        "| commit | {} |",
        m.commit.clone().unwrap_or_else(unknown)
    );
    let _ = writeln!(md, "| profile | {} |", m.profile);
    let _ = writeln!(md, "| allocator | {} |", m.allocator);
    let _ = writeln!(md, "| hasher | {} |\n", m.hasher);
    let _ = writeln!(
        md,
        "The last column of each table is sharded ÷ reference: above 1× the sharded engine has \
         more of the figure (good for events/s and reads/s), below 1× less (good for wall \
         time, latency and memory). The reference engine always runs one consumer, as \
         client-go does (threads: consumers, or W4's readers). Latency is enqueue-to-pop of \
         every {}th event; peak +RSS is the resident memory the engine added over the \
         pre-generated events; CPU µs/event is the user + system CPU of the whole run's \
         process per event.\n",
        crate::measure::latency::SAMPLE_EVERY
    );
    let (paced, saturated): (Vec<RunResult>, Vec<RunResult>) = report
        .results
        .iter()
        .cloned()
        .partition(|r| r.workload.contains('@'));
    let _ = writeln!(md, "## Equal work\n");
    if report.capacity.is_empty() {
        let _ = writeln!(md, "(No capacity search: `--no-capacity`.)\n");
    } else {
        capacity_markdown(&mut md, &report.capacity);
    }
    if !paced.is_empty() {
        let _ = writeln!(
            md,
            "\n### One offered rate\n\nW1's events offered at a fixed {} ops/s that both \
             engines absorb (`w1@{}k/s`): the latency is each engine's own hand-off, not a \
             backlog.\n",
            PACED_RATE,
            PACED_RATE / 1000
        );
        table_markdown(&mut md, &side_by_side(&paced));
    }
    let _ = writeln!(
        md,
        "\n## Saturated: each engine flat out (not equal work)\n\nIn W1-W5 the producer \
         never waits: each engine runs as fast as it can, so the two rows do different work. \
         The sharded engine runs saturated, its keys gathering several deltas each (deltas \
         per pop above 1) behind a backlog (p50 in milliseconds), while the reference keeps \
         closer to one delta per pop: read events/s with deltas/pop and p50 beside it. \
         `w6/informer` is W6 as a whole controller: the events through an in-memory API \
         server, the reflector and a shared informer into a workqueue and 4 workers \
         (`loadgen run --workload w6 --through queue` gives its bare-queue form).\n"
    );
    table_markdown(&mut md, &side_by_side(&saturated));
    let _ = writeln!(
        md,
        "\n![throughput](throughput.svg)\n\n![latency](latency.svg)"
    );
    md
}

/// A side-by-side table as Markdown.
fn table_markdown(md: &mut String, rows: &[Vec<String>]) {
    for (i, row) in rows.iter().enumerate() {
        let _ = writeln!(md, "| {} |", row.join(" | "));
        if i == 0 {
            let _ = writeln!(md, "|---|---|---:|---:|---:|");
        }
    }
}

/// The capacity curves of `workload`, one per engine.
fn curves_of(capacity: &[Curve], workload: &str) -> Vec<Curve> {
    capacity
        .iter()
        .filter(|c| c.workload == workload)
        .cloned()
        .collect()
}

/// The workloads of `curves`, in the order they first appear.
fn capacity_workloads(curves: &[Curve]) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for c in curves {
        if !out.contains(&c.workload.as_str()) {
            out.push(&c.workload);
        }
    }
    out
}

/// The capacity section of `latest.md`: what it means, the table, the sentence and the chart
/// per workload.
fn capacity_markdown(md: &mut String, curves: &[Curve]) {
    let limit = curves
        .first()
        .map_or(DEFAULT_P99_LIMIT_MS, |c| c.p99_limit_ms);
    let _ = writeln!(
        md,
        "### Capacity\n\nThe highest offered rate (events/s, producer paced) at which the \
         producer never fell behind its schedule by more than 1% of the run and the p99 \
         enqueue-to-pop latency stayed within {limit} ms (docs/workloads.md, \"Capacity\"); \
         latency and peak +RSS are the probe's at that rate. Probes are shorter than \
         `loadgen capacity`'s: see `latest.json` for every probe.\n"
    );
    let rows = summary_rows(curves);
    for (i, row) in rows.iter().enumerate() {
        let _ = writeln!(md, "| {} |", row.join(" | "));
        if i == 0 {
            let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---|");
        }
    }
    for w in capacity_workloads(curves) {
        let of_w: Vec<Curve> = curves.iter().filter(|c| c.workload == w).cloned().collect();
        if let Some(claim) = claim(&of_w) {
            let _ = writeln!(md, "\n{claim}.");
        }
        let _ = writeln!(md, "\n![{w} capacity]({})", capacity_chart_name(w));
    }
}

/// The file of `workload`'s capacity chart: `capacity-w1.svg`, `capacity-w1-informer.svg`.
fn capacity_chart_name(workload: &str) -> String {
    format!("capacity-{}.svg", workload.replace('/', "-"))
}

/// Writes the four files into `out`; returns their paths.
pub fn write_outputs(out: &Path, report: &CompareReport) -> Result<Vec<PathBuf>, String> {
    let json_path = out.join("latest.json");
    let md_path = out.join("latest.md");
    let throughput = out.join("throughput.svg");
    let latency = out.join("latency.svg");
    write_json(&json_path, report).map_err(|e| e.to_string())?;
    write_file(&md_path, markdown(report).as_bytes()).map_err(|e| e.to_string())?;
    throughput_svg(&report.results, &throughput).map_err(|e| e.to_string())?;
    latency_svg(&report.results, &latency).map_err(|e| e.to_string())?;
    let mut charts = vec![throughput, latency];
    for w in capacity_workloads(&report.capacity) {
        let path = out.join(capacity_chart_name(w));
        let of_w = curves_of(&report.capacity, w);
        capacity_svg(&of_w, &path).map_err(|e| e.to_string())?;
        charts.push(path);
    }
    // Plotters reports most failures, but an empty file would still be a broken chart.
    for chart in &charts {
        let len = std::fs::metadata(chart).map(|m| m.len()).unwrap_or(0);
        if len == 0 {
            return Err(format!("{} was written empty", chart.display()));
        }
    }
    Ok([json_path, md_path].into_iter().chain(charts).collect())
}

/// `compare --scale`: W1 over key counts, written into the output directory beside the rest.
fn scale_sweep(args: &CompareArgs, ui: Ui) -> Result<ScaleReport, ScaleError> {
    let keys = if args.quick { "200,1k" } else { DEFAULT_KEYS };
    let plan = SweepPlan {
        workload: Workload::W1,
        engines: EngineKind::ALL.to_vec(),
        keys: parse_key_counts(keys).map_err(ScaleError::Invalid)?,
        events: Some(if args.quick { 2_000 } else { 1_000_000 }),
        rate: DEFAULT_RATE,
        shards: args.shards,
        seed: args.seed,
    };
    let report = sweep(&plan, ui)?;
    let out = &args.out;
    write(
        &report,
        &out.join("scale.json"),
        &out.join("scale.svg"),
        &out.join("scale.md"),
    )?;
    Ok(report)
}

/// Runs `loadgen compare`.
pub fn main(args: CompareArgs) -> ExitCode {
    let ui = Ui::detect();
    let results = match compare(&args, ui) {
        Ok(results) => results,
        Err(e) => return refuse("compare", e),
    };
    let capacity = match capacity(&args, ui) {
        Ok(curves) => curves,
        Err(e) => return refuse("compare", e),
    };
    let scaled = match args.scale.then(|| scale_sweep(&args, ui)).transpose() {
        Ok(scaled) => scaled,
        Err(e) => return refuse("compare", e),
    };
    let report = CompareReport {
        machine: Machine::detect(),
        command: command_line(),
        results,
        capacity,
    };
    // Equal work first: the capacities, then the paced run; the saturated runs after.
    let (paced, saturated): (Vec<RunResult>, Vec<RunResult>) = report
        .results
        .iter()
        .cloned()
        .partition(|r| r.workload.contains('@'));
    let mut shown = String::from("Equal work: capacity at the same p99 limit\n");
    if report.capacity.is_empty() {
        shown.push_str("(no capacity search: --no-capacity)\n");
    } else {
        shown.push_str(&aligned(&summary_rows(&report.capacity)));
        for w in capacity_workloads(&report.capacity) {
            let of_w = curves_of(&report.capacity, w);
            if let Some(claim) = claim(&of_w) {
                shown.push_str(&format!("{claim}\n"));
            }
        }
    }
    if !paced.is_empty() {
        shown.push_str("\nEqual work: one offered rate\n");
        shown.push_str(&aligned(&side_by_side(&paced)));
    }
    shown.push_str("\nSaturated: each engine flat out (not equal work; see deltas/pop and p50)\n");
    shown.push_str(&aligned(&side_by_side(&saturated)));
    if let Some(scaled) = &scaled {
        shown.push('\n');
        shown.push_str(&scale_table(scaled));
    }
    // A failed verdict in a capacity probe is as much a bug as one in the table's runs.
    let every_run: Vec<RunResult> = report
        .results
        .iter()
        .chain(report.capacity.iter().flat_map(Curve::results))
        .chain(scaled.iter().flat_map(|s| &s.runs))
        .cloned()
        .collect();
    finish("compare", &shown, &every_run, || {
        for path in write_outputs(&args.out, &report)? {
            ui.note(&format!("wrote {}", path.display()));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quick_comparison_writes_json_markdown_and_two_charts() {
        let out = std::env::temp_dir().join(format!("loadgen-compare-{}", std::process::id()));
        let args = CompareArgs {
            out: out.clone(),
            quick: true,
            shards: 4,
            consumers: Some(2),
            max_queued_deltas: 0,
            compact_updates: false,
            seed: 7,
            in_process: true,
            no_capacity: false,
            scale: false,
        };
        let results = compare(&args, Ui::Quiet).expect("quick compare runs");
        assert_eq!(
            results.len(),
            14,
            "six workloads and the paced W1, two engines each"
        );
        assert!(results.iter().all(RunResult::is_ok), "{results:#?}");
        let paced: Vec<_> = results
            .iter()
            .filter(|r| r.workload == "w1@200k/s")
            .collect();
        assert_eq!(paced.len(), 2, "the paced run is labelled apart from w1");
        let capacity = capacity(&args, Ui::Quiet).expect("quick capacity searches run");
        let engines_and_loads: Vec<(&str, &str)> = capacity
            .iter()
            .map(|c| (c.workload.as_str(), c.engine.as_str()))
            .collect();
        assert_eq!(
            engines_and_loads,
            [
                ("w1", "reference"),
                ("w1", "sharded"),
                ("w2", "reference"),
                ("w2", "sharded"),
                ("w5", "reference"),
                ("w5", "sharded"),
                ("w1/informer", "reference"),
                ("w1/informer", "sharded")
            ]
        );
        assert!(capacity.iter().all(|c| !c.probes.is_empty()
            && c.probes.len() <= 6
            && c.results().all(RunResult::is_ok)));
        let report = CompareReport {
            machine: Machine::detect(),
            command: "loadgen compare --quick".into(),
            results,
            capacity,
        };
        write_outputs(&out, &report).expect("outputs written");
        let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&read("latest.json")).unwrap();
        assert_eq!(json["results"].as_array().map(Vec::len), Some(14));
        assert!(json["machine"]["cores"].as_u64().unwrap_or(0) >= 1);
        assert_eq!(json["results"][0]["verdict"], "ok");
        let md = read("latest.md");
        assert!(md.contains("| workload | figure | reference | sharded | sharded/reference |"));
        assert!(md.contains("loadgen compare --quick"));
        assert!(md.contains("| w4 read heavy | reads/s |"));
        assert!(md.contains("| w6/informer controller loop | reconciles/s |"));
        assert!(md.contains("| w6/informer controller loop | CPU µs/event |"));
        assert!(md.contains("| w1@200k/s | latency p99 µs |"));
        assert_eq!(json["capacity"].as_array().map(Vec::len), Some(8));
        assert!(md.contains("### Capacity") && md.contains("![w5 capacity](capacity-w5.svg)"));
        assert!(md.contains("![w1/informer capacity](capacity-w1-informer.svg)"));
        assert!(read("capacity-w1-informer.svg").contains("sharded p99"));
        // Equal work leads; the saturated table comes after, labelled as such.
        // Each heading and row must be there: `None < Some(..)` would pass unnoticed.
        let at = |text: &str| md.find(text).unwrap_or_else(|| panic!("{text:?} in {md}"));
        let saturated = at("## Saturated");
        assert!(at("## Equal work") < saturated, "{md}");
        assert!(at("| w1@200k/s |") < saturated && at("| w1 steady churn |") > saturated);
        assert!(md.contains("absorbs"), "{md}");
        let curve = read("capacity-w1.svg");
        assert!(curve.contains("p99 limit 10 ms") && curve.contains("sharded p99"));
        for chart in ["throughput.svg", "latency.svg"] {
            let svg = read(chart);
            assert!(
                svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
                "{chart}"
            );
            assert!(
                svg.contains("<rect") && svg.contains("W1"),
                "{chart} has bars and labels"
            );
        }
        std::fs::remove_dir_all(&out).ok();
    }

    #[test]
    fn ratios_are_sharded_over_reference_and_blank_without_a_base() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), "1.50×");
        assert_eq!(ratio(Some(3.0), Some(0.0)), "-");
        assert_eq!(ratio(None, Some(2.0)), "-");
    }
}
