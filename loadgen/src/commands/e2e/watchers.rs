//! `loadgen e2e --watchers N`: the fan-out of one server to many watchers, as a capacity test
//! of an API server's watch fan-out measures it.
//!
//! One server (in this process, so its CPU time is this process's) churns at the offered rate,
//! and N watchers, spread over `--watcher-procs` child processes (`loadgen e2e-watchers`,
//! hidden), each open a watch of every pod. A watcher is a discarding reader by default
//! ([`super::discard`]: it counts events by their framing and decodes nothing, so what is
//! measured is the server), or any client row (`--watcher-client kcache-protobuf`: a kcache
//! informer per watcher, each with its own cache).
//!
//! The protocol with each child is [`super::client`]'s: the child opens its watchers and
//! prints `synced`; the server holds its churn until every child has; after the churn the
//! parent writes the server's record of when each event was due (and, for watchers with a
//! cache, the server's final state), says `churned`, and reads one JSON line
//! ([`ChildOutcome`]): per watcher, the events it received of those it should have, its lag
//! p99 from when the event was due to when it was read, and whether its watch ended early
//! (the server closes a watcher that falls a window behind, as the API server closes one
//! whose buffer is full).
//!
//! Reported: events delivered in total and per second of churn, watchers ok and dropped, lag
//! p99 over the watchers (median and worst), the server's CPU per delivered event, the
//! watcher processes' CPU per delivered event, how many watchers the server closed as too
//! slow, and the verdict: every watcher received every event and none was closed.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::client::{
    process_cpu_seconds, read_expected, read_seen, run_and_print, say_synced, start_client,
    wait_for_catch_up, wait_for_churned, write_expected, ReadCache, Seen, Stop, Synced,
};
use super::discard::{served_resource_version, Discarded, Reader};
use super::{end_child, wait_child, write_figures, E2eArgs, OneClient, Timeline};
use crate::serve::Server;
use crate::sync::lock;
use workloads::WorkloadSpec;

/// Watchers per child process when `--watcher-procs` is not given.
pub const WATCHERS_PER_PROC: usize = 250;
/// Seconds of churn when neither `--events` nor `--churn-seconds` says otherwise.
pub const DEFAULT_CHURN_SECONDS: f64 = 20.0;
/// Watches a child opens at once: enough to open thousands in a second or two, few enough
/// that the server's accept backlog never overflows.
const OPENING: usize = 16;
/// File descriptors a process needs besides its sockets (the runtime, pipes, files).
const SPARE_FDS: usize = 128;

/// Arguments of `loadgen e2e-watchers` (started by `loadgen e2e --watchers`, not by people).
#[derive(Debug, Clone, clap::Args)]
pub struct E2eWatchersArgs {
    /// The server, `http://ADDR`.
    #[arg(long)]
    pub url: String,
    /// What each watcher is.
    #[arg(long, value_enum)]
    pub client: OneClient,
    /// How many watchers this process opens.
    #[arg(long)]
    pub watchers: usize,
    /// The churn's rate (spaces the events of a published batch, for the lag).
    #[arg(long)]
    pub rate: f64,
    /// Give up this many seconds after the churn on a watcher still missing events.
    #[arg(long)]
    pub settle_seconds: f64,
    /// Where the parent writes when each batch of events was due, before it says `churned`.
    #[arg(long)]
    pub timeline: PathBuf,
    /// Where the parent writes the server's final state (watchers with a cache).
    #[arg(long)]
    pub expected: PathBuf,
    /// How many of the discarding watchers stop reading after their first chunk.
    #[arg(long, default_value_t = 0)]
    pub stall: usize,
}

/// What one watcher did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatcherOutcome {
    /// Events (added, modified, deleted) it received.
    pub events: u64,
    /// Events the churn published after its watch started.
    pub expected: u64,
    /// Lag p99 from when an event was due to when it was read, microseconds.
    pub lag_p99_us: u64,
    /// The worst lag, microseconds.
    pub lag_max_us: u64,
    /// Why its watch ended before the churn's last event was read; `None` if it did not.
    pub ended_early: Option<String>,
    /// It received every event (a watcher with a cache: its cache ends equal to the server's).
    pub ok: bool,
    /// Seconds from the end of the churn until it had every event (or until giving up).
    pub settle_seconds: f64,
}

/// What a child reports on its stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChildOutcome {
    /// Its watchers, in the order opened.
    pub watchers: Vec<WatcherOutcome>,
    /// CPU seconds the process used from `synced` to its report.
    pub cpu_seconds: Option<f64>,
    /// Its peak resident memory, bytes.
    pub peak_bytes: Option<u64>,
}

/// The figures of a fan-out run (the `--json` document's body).
#[derive(Debug, Clone, Serialize)]
pub struct FanOutReport {
    /// What each watcher was.
    pub watcher_client: &'static str,
    /// Watchers asked for.
    pub watchers: usize,
    /// Child processes they were spread over.
    pub procs: usize,
    /// Churn events the server published.
    pub events: u64,
    /// Seconds the churn lasted.
    pub churn_seconds: f64,
    /// Events received by all watchers together.
    pub delivered: u64,
    /// Seconds from the churn's start until the last watcher had every event: the churn, and
    /// the time the slowest watcher took to catch up after it.
    pub delivery_seconds: f64,
    /// `delivered` per second of `delivery_seconds`: above the offered rate × watchers only
    /// while the watchers keep up.
    pub delivered_per_second: f64,
    /// Watchers that received every event.
    pub watchers_ok: usize,
    /// Watchers that did not (incomplete, or their watch ended early).
    pub dropped: usize,
    /// Watchers the server closed as too slow (its own count).
    pub closed_as_too_slow: u64,
    /// Lag p99 over the watchers, microseconds: the median watcher's and the worst.
    pub lag_p99_us: (u64, u64),
    /// The worst lag of any watcher, microseconds.
    pub lag_max_us: u64,
    /// CPU seconds of the server's process from the churn's release until every watcher
    /// reported (the churn, the sends, the watchers' few status requests).
    pub server_cpu_seconds: Option<f64>,
    /// The server's CPU per delivered event, microseconds.
    pub server_cpu_us_per_event: Option<f64>,
    /// The watcher processes' CPU per delivered event, microseconds.
    pub watcher_cpu_us_per_event: Option<f64>,
    /// Peak resident memory of the largest watcher process, bytes.
    pub watcher_peak_bytes: Option<u64>,
    /// Every watcher received every event and none was closed.
    pub ok: bool,
    /// Each watcher, children in order.
    pub per_watcher: Vec<WatcherOutcome>,
}

/// How `N` watchers are spread: `procs` children, the first `N % procs` one more.
fn spread(watchers: usize, procs: usize) -> Vec<usize> {
    (0..procs)
        .map(|i| watchers / procs + usize::from(i < watchers % procs))
        .collect()
}

/// The soft limit on open files of this process (children inherit it).
fn open_files_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    match line.split_whitespace().nth(3)? {
        "unlimited" => Some(usize::MAX),
        n => n.parse().ok(),
    }
}

/// Checks `--watchers` and `--watcher-procs`; returns each child's share.
fn plan(watchers: usize, procs: Option<usize>, fds: Option<usize>) -> Result<Vec<usize>, String> {
    if watchers == 0 {
        return Err("--watchers must be at least 1".to_owned());
    }
    let procs = procs.unwrap_or_else(|| watchers.div_ceil(WATCHERS_PER_PROC));
    if procs == 0 || procs > watchers {
        return Err(format!(
            "--watcher-procs must be between 1 and --watchers ({watchers})"
        ));
    }
    let shares = spread(watchers, procs);
    // The server holds a socket per watcher, each child one per watcher of its own (and one
    // more while it opens it).
    if let Some(limit) = fds {
        let needed = watchers + SPARE_FDS;
        if needed > limit {
            return Err(format!(
                "{watchers} watchers need {needed} open files in the server's process; the \
                 limit is {limit}: raise it (`ulimit -n {}`) or ask for fewer watchers",
                needed.next_power_of_two()
            ));
        }
    }
    Ok(shares)
}

/// `loadgen e2e --watchers N`.
pub fn main(
    args: &E2eArgs,
    watchers: usize,
    spec: WorkloadSpec,
    exe: &Path,
    runtime: &tokio::runtime::Runtime,
) -> ExitCode {
    let shares = match plan(watchers, args.watcher_procs, open_files_limit()) {
        Ok(shares) => shares,
        Err(e) => {
            eprintln!("loadgen e2e: {e}");
            return ExitCode::from(2);
        }
    };
    if args.stalled_watchers > 0
        && (args.watcher_client.discards().is_none() || args.stalled_watchers > shares[0])
    {
        eprintln!(
            "loadgen e2e: --stalled-watchers needs a discarding --watcher-client and at most \
             the first process's {} watchers",
            shares[0]
        );
        return ExitCode::from(2);
    }
    let events = match (args.pods.events, args.churn_seconds) {
        (Some(_), Some(_)) => {
            eprintln!("loadgen e2e: give --events or --churn-seconds, not both");
            return ExitCode::from(2);
        }
        (Some(events), None) => events,
        (None, seconds) => {
            let seconds = seconds.unwrap_or(DEFAULT_CHURN_SECONDS);
            if !(seconds.is_finite() && seconds > 0.0) {
                eprintln!("loadgen e2e: --churn-seconds must be above 0");
                return ExitCode::from(2);
            }
            ((args.rate * seconds).round() as usize).max(1)
        }
    };
    let spec = spec.events(events);
    let report = match runtime.block_on(run(args, spec, &shares, exe)) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("loadgen e2e: {e}");
            return ExitCode::FAILURE;
        }
    };
    print_report(&report, args);
    if let Err(code) = write_figures(
        args,
        &spec,
        serde_json::json!({
            "events": spec.events,
            "rate": args.rate,
            "pod_profile": args.pod_profile.to_string(),
            "max_lag_ms": args.max_lag_ms,
            "fan_out": report,
        }),
    ) {
        return code;
    }
    if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// A temporary file name for this run.
fn temp_path(what: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "loadgen-e2e-watchers-{}.{what}",
        std::process::id()
    ))
}

/// Writes `pairs` as [`read_seen`] reads them.
fn write_pairs(path: &Path, pairs: &[(u64, u64)]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for &(a, b) in pairs {
        out.write_all(&a.to_le_bytes())?;
        out.write_all(&b.to_le_bytes())?;
    }
    out.flush()
}

/// A started child and the lines of its stdout.
struct Child {
    process: std::process::Child,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
}

async fn end_all(children: Vec<Child>) {
    for child in children {
        end_child(child.process).await;
    }
}

/// Serves one churn to the watchers of `shares` (one child each) and reports on them.
async fn run(
    args: &E2eArgs,
    spec: WorkloadSpec,
    shares: &[usize],
    exe: &Path,
) -> Result<FanOutReport, String> {
    let client = args.watcher_client;
    let mut config = args.serve_config(spec, args.rate);
    config.record_publications = true;
    config.hold_churn = true;
    let mut server = Server::start(config)
        .await
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let initial_version = server.store().resource_version();
    let (timeline_path, expected_path) = (temp_path("timeline"), temp_path("expected"));
    let total: usize = shares.iter().sum();
    let ui = crate::ui::Ui::detect();

    let opening = ui.phase(format!("opening {total} watchers"), 0);
    let mut children = Vec::with_capacity(shares.len());
    for (i, &share) in shares.iter().enumerate() {
        let stall = if i == 0 { args.stalled_watchers } else { 0 };
        let spawned = std::process::Command::new(exe)
            .arg("e2e-watchers")
            .args(["--url", &server.url(), "--client", client.name()])
            .args(["--watchers", &share.to_string()])
            .args(["--rate", &args.rate.to_string()])
            .args(["--settle-seconds", &args.settle_seconds.to_string()])
            .arg("--timeline")
            .arg(&timeline_path)
            .arg("--expected")
            .arg(&expected_path)
            .args(["--stall", &stall.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn();
        match spawned {
            Ok(mut process) => {
                let lines = crate::kube_churn::lines(&mut process);
                children.push(Child { process, lines });
            }
            Err(e) => {
                end_all(children).await;
                return Err(format!("cannot start {} e2e-watchers: {e}", exe.display()));
            }
        }
    }
    // The churn starts once every watcher is open: all of them watch from the same version,
    // and none of the opening's work is measured as lag.
    for i in 0..children.len() {
        let said = tokio::time::timeout(super::SYNC_TIMEOUT, children[i].lines.recv()).await;
        match said {
            Ok(Some(line)) if line == "synced" => {}
            said => {
                let why = match said {
                    Ok(Some(line)) => format!("said {line:?} instead of `synced`"),
                    Ok(None) => "ended before its watchers were open (its error is above)".into(),
                    Err(_) => format!("did not open its watchers within {:?}", super::SYNC_TIMEOUT),
                };
                end_all(children).await;
                return Err(format!("watcher process {i} {why}"));
            }
        }
    }
    opening.finish(&format!("{total} open in {} processes", children.len()));

    let churning = ui.phase("churn", spec.events as u64);
    let cpu_before = process_cpu_seconds();
    server.release_churn();
    let summary = {
        let finished = server.churn_finished();
        tokio::pin!(finished);
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                summary = &mut finished => break summary,
                _ = tick.tick() => crate::progress::Progress::set(
                    &churning,
                    server.store().resource_version() - initial_version,
                ),
            }
        }
    };
    churning.finish(&format!(
        "{} events in {:.2} s",
        summary.events, summary.seconds
    ));

    let settling = ui.phase("watchers catching up", 0);
    let written = write_pairs(&timeline_path, &server.store().publications())
        .map_err(|e| format!("writing {}: {e}", timeline_path.display()));
    let written = written.and_then(|()| match client.discards() {
        Some(_) => Ok(()),
        None => {
            let state = server.store().snapshot(None);
            write_expected(
                &expected_path,
                state
                    .pods
                    .iter()
                    .map(|p| (&*p.namespace, &*p.name, p.resource_version)),
            )
            .map_err(|e| format!("writing {}: {e}", expected_path.display()))
        }
    });
    if let Err(e) = written {
        end_all(children).await;
        return Err(e);
    }
    for child in &mut children {
        // A child that died already is found out below, by its missing report.
        if let Some(mut stdin) = child.process.stdin.take() {
            let _ = stdin.write_all(b"churned\n");
        }
    }
    let mut outcomes = Vec::with_capacity(children.len());
    for (i, mut child) in children.into_iter().enumerate() {
        let mut last = None;
        while let Some(line) = child.lines.recv().await {
            last = Some(line);
        }
        let status = wait_child(child.process).await?;
        let outcome: ChildOutcome = last
            .and_then(|line| serde_json::from_str(&line).ok())
            .ok_or_else(|| {
                format!(
                    "watcher process {i} ended with {status} and no report (its error is above)"
                )
            })?;
        outcomes.push(outcome);
    }
    let server_cpu_seconds = cpu_before
        .zip(process_cpu_seconds())
        .map(|(before, after)| after - before);
    settling.finish("done");
    let _ = std::fs::remove_file(&timeline_path);
    let _ = std::fs::remove_file(&expected_path);
    let closed_as_too_slow = server.faults().slow_watchers_closed;
    server
        .stop()
        .await
        .map_err(|e| format!("stopping the server: {e}"))?;
    Ok(aggregate(
        client,
        summary.events,
        summary.seconds,
        closed_as_too_slow,
        server_cpu_seconds,
        outcomes,
    ))
}

/// The run's figures from the children's reports.
fn aggregate(
    client: OneClient,
    events: u64,
    churn_seconds: f64,
    closed_as_too_slow: u64,
    server_cpu_seconds: Option<f64>,
    outcomes: Vec<ChildOutcome>,
) -> FanOutReport {
    let procs = outcomes.len();
    let watcher_cpu: Option<f64> = outcomes.iter().map(|o| o.cpu_seconds).sum();
    let watcher_peak_bytes = outcomes.iter().filter_map(|o| o.peak_bytes).max();
    let per_watcher: Vec<WatcherOutcome> = outcomes.into_iter().flat_map(|o| o.watchers).collect();
    let delivered: u64 = per_watcher.iter().map(|w| w.events).sum();
    let watchers_ok = per_watcher
        .iter()
        .filter(|w| w.ok && w.ended_early.is_none())
        .count();
    let mut p99s: Vec<u64> = per_watcher.iter().map(|w| w.lag_p99_us).collect();
    p99s.sort_unstable();
    let delivery_seconds = churn_seconds
        + per_watcher
            .iter()
            .map(|w| w.settle_seconds)
            .fold(0.0, f64::max);
    let per_event = |cpu: Option<f64>| {
        crate::measure::cpu::cpu_figures(
            cpu.map(|s| Duration::from_secs_f64(s.max(0.0))),
            delivered,
        )
        .1
    };
    FanOutReport {
        watcher_client: client.name(),
        watchers: per_watcher.len(),
        procs,
        events,
        churn_seconds,
        delivered,
        delivery_seconds,
        delivered_per_second: delivered as f64 / delivery_seconds.max(1e-9),
        watchers_ok,
        dropped: per_watcher.len() - watchers_ok,
        closed_as_too_slow,
        lag_p99_us: (
            p99s.get(p99s.len() / 2).copied().unwrap_or(0),
            p99s.last().copied().unwrap_or(0),
        ),
        lag_max_us: per_watcher.iter().map(|w| w.lag_max_us).max().unwrap_or(0),
        server_cpu_seconds,
        server_cpu_us_per_event: per_event(server_cpu_seconds),
        watcher_cpu_us_per_event: per_event(watcher_cpu),
        watcher_peak_bytes,
        ok: watchers_ok == per_watcher.len() && closed_as_too_slow == 0 && !per_watcher.is_empty(),
        per_watcher,
    }
}

fn print_report(r: &FanOutReport, args: &E2eArgs) {
    let ms = |us: u64| format!("{:.2} ms", us as f64 / 1e3);
    let opt = |x: Option<f64>| x.map_or("n/a".to_owned(), |x| format!("{x:.2}"));
    println!(
        "{:<22} {:>8} {:>5} {:>12} {:>12} {:>11} {:>11} {:>5} {:>7} {:>6} {:>8} {:>9} {:>9} {:>8}  verdict",
        "watcher",
        "watchers",
        "procs",
        "delivered",
        "delivered/s",
        "p99 median",
        "p99 worst",
        "ok",
        "dropped",
        "closed",
        "srv cpu",
        "srv µs/ev",
        "wch µs/ev",
        "wch MB",
    );
    let lagging = r
        .per_watcher
        .iter()
        .filter(|w| w.lag_p99_us as f64 > args.max_lag_ms * 1e3)
        .count();
    let verdict = if !r.ok {
        format!("FAILED ({} of {} dropped)", r.dropped, r.watchers)
    } else if lagging > 0 {
        format!(
            "ok, {lagging} with lag p99 > {} ms (--max-lag-ms)",
            args.max_lag_ms
        )
    } else {
        "ok".to_owned()
    };
    println!(
        "{:<22} {:>8} {:>5} {:>12} {:>12.0} {:>11} {:>11} {:>5} {:>7} {:>6} {:>8} {:>9} {:>9} {:>8}  {verdict}",
        r.watcher_client,
        r.watchers,
        r.procs,
        r.delivered,
        r.delivered_per_second,
        ms(r.lag_p99_us.0),
        ms(r.lag_p99_us.1),
        r.watchers_ok,
        r.dropped,
        r.closed_as_too_slow,
        opt(r.server_cpu_seconds),
        opt(r.server_cpu_us_per_event),
        opt(r.watcher_cpu_us_per_event),
        r.watcher_peak_bytes
            .map_or("n/a".to_owned(), |b| format!("{:.1}", b as f64 / 1e6)),
    );
    println!(
        "({} events at {:.0}/s offered over {:.2} s, {} pods; delivered: events received by all \
         watchers, per second until the last watcher had every event ({:.2} s); p99 median/worst: each watcher's lag p99 from when the event was due on the \
         server to when it read it, the median watcher's and the worst; dropped: watchers missing \
         events or whose watch ended early; closed: watchers the server closed as too slow; srv \
         cpu: the server's process (churn and sends) from the churn's start until every watcher \
         reported; wch: the watcher processes, CPU per delivered event and the largest's peak \
         resident MB; verdict: every watcher received every event and none was closed)",
        r.events, args.rate, r.churn_seconds, args.pod_profile, r.delivery_seconds
    );
}

/// `loadgen e2e-watchers`.
pub fn child_main(args: E2eWatchersArgs) -> ExitCode {
    run_and_print("e2e-watchers", args.client.name(), child(&args))
}

/// Each watcher's lag p99 and maximum (microseconds) over `seen` (version, unix nanoseconds).
fn lags(timeline: &Timeline, seen: &[(u64, u64)]) -> (u64, u64) {
    // Up to an hour in microseconds; a longer lag is clamped to it.
    let mut lags =
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).expect("constant bounds are valid");
    for &(rv, at) in seen {
        if let Some(due) = timeline.due(rv) {
            lags.saturating_record(at.saturating_sub(due) / 1_000);
        }
    }
    (lags.value_at_quantile(0.99), lags.max())
}

/// A watcher with a cache: a client row, its record of what its handler saw and its count of
/// events received.
struct Cached {
    read_cache: ReadCache,
    stop: Stop,
    seen: Arc<Seen>,
    received: Arc<AtomicU64>,
}

/// What a child knows once its watchers have synced and the churn has ended.
struct AfterChurn {
    /// The process's CPU time at sync.
    cpu_at_sync: Option<f64>,
    /// When the parent said the churn had ended.
    churn_end: Instant,
    /// When each churned version was published.
    timeline: Timeline,
    /// The server's resource version at the end.
    last: u64,
}

/// Says the watchers are synced, waits for the churn to end and reads what it published.
async fn after_churn(args: &E2eWatchersArgs) -> Result<AfterChurn, String> {
    let cpu_at_sync = process_cpu_seconds();
    say_synced()?;
    wait_for_churned().await?;
    let churn_end = Instant::now();
    Ok(AfterChurn {
        cpu_at_sync,
        churn_end,
        timeline: read_timeline(args)?,
        last: served_resource_version(&args.url).await?,
    })
}

async fn child(args: &E2eWatchersArgs) -> Result<ChildOutcome, String> {
    let settle = Duration::from_secs_f64(args.settle_seconds);
    let outcome_of = |watchers, cpu_at_sync: Option<f64>| ChildOutcome {
        watchers,
        cpu_seconds: cpu_at_sync
            .zip(process_cpu_seconds())
            .map(|(sync, end)| end - sync),
        peak_bytes: crate::measure::rss::status_field_bytes("VmHWM"),
    };
    match args.client.discards() {
        Some(wire) => {
            let readers: Vec<Reader> = futures_util::stream::iter(0..args.watchers)
                .map(|i| Reader::start_stalling(&args.url, wire, i < args.stall))
                // In order: the stalled ones are the first, and the report lists them first.
                .buffered(OPENING)
                .try_collect()
                .await?;
            let after = after_churn(args).await?;
            // Together: each one's settling counts from the end of the churn.
            let done: Vec<Discarded> = futures_util::future::try_join_all(
                readers
                    .into_iter()
                    .map(|r| r.finish_at(after.last, after.churn_end, settle)),
            )
            .await?;
            let watchers = done
                .into_iter()
                .map(|d| {
                    let (lag_p99_us, lag_max_us) = lags(&after.timeline, &d.seen);
                    let complete = d.events >= d.expected;
                    WatcherOutcome {
                        events: d.events,
                        expected: d.expected,
                        lag_p99_us,
                        lag_max_us,
                        // A watch that ended after its last event was read did not end early.
                        ended_early: (d.ended && !complete).then(|| {
                            d.error
                                .unwrap_or_else(|| "the server ended the watch".to_owned())
                        }),
                        ok: d.events == d.expected,
                        settle_seconds: d.settle_seconds,
                    }
                })
                .collect();
            Ok(outcome_of(watchers, after.cpu_at_sync))
        }
        None => {
            let url = args
                .url
                .parse()
                .map_err(|e| format!("the server's url {:?}: {e}", args.url))?;
            let kube_client = kube::Client::try_from(kube::Config::new(url))
                .map_err(|e| format!("cannot make a kube client: {e}"))?;
            let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
                kube::Api::all(kube_client.clone());
            let mut cached = Vec::with_capacity(args.watchers);
            let mut synced: Vec<Synced> = Vec::with_capacity(args.watchers);
            for _ in 0..args.watchers {
                let seen = Arc::new(Seen::default());
                let received = Arc::new(AtomicU64::new(0));
                let (read_cache, is_synced, stop) = start_client(
                    args.client,
                    api.clone(),
                    kube_client.clone(),
                    false,
                    &seen,
                    &received,
                )?;
                synced.push(is_synced);
                cached.push(Cached {
                    read_cache,
                    stop,
                    seen,
                    received,
                });
            }
            futures_util::future::join_all(synced).await;
            let after = after_churn(args).await?;
            let expected = read_expected(&args.expected)?;
            let deadline = tokio::time::Instant::from_std(after.churn_end + settle);
            futures_util::future::join_all(
                cached
                    .iter()
                    .map(|c| wait_for_catch_up(&c.seen, after.last, &c.received, deadline)),
            )
            .await;
            let mut watchers = Vec::with_capacity(cached.len());
            let published = after
                .timeline
                .batches
                .first()
                .map_or(0, |&(first, _)| after.last + 1 - first);
            for c in cached {
                let mut same = (c.read_cache)() == expected;
                while !same && after.churn_end.elapsed() < settle {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    same = (c.read_cache)() == expected;
                }
                (c.stop)().await;
                let seen = std::mem::take(&mut *lock(&c.seen.events));
                let (lag_p99_us, lag_max_us) = lags(&after.timeline, &seen);
                watchers.push(WatcherOutcome {
                    // Relaxed: the informer is stopped; its count is final.
                    events: c.received.load(Ordering::Relaxed),
                    expected: published,
                    lag_p99_us,
                    lag_max_us,
                    // An informer watches again when its watch ends; the server's count of
                    // closed watchers tells.
                    ended_early: None,
                    ok: same,
                    settle_seconds: after.churn_end.elapsed().as_secs_f64(),
                });
            }
            Ok(outcome_of(watchers, after.cpu_at_sync))
        }
    }
}

fn read_timeline(args: &E2eWatchersArgs) -> Result<Timeline, String> {
    let batches = read_seen(&args.timeline)
        .map_err(|e| format!("reading the timeline {}: {e}", args.timeline.display()))?;
    Ok(Timeline {
        batches,
        rate: args.rate,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchers_are_spread_evenly_and_bad_plans_say_why() {
        assert_eq!(spread(10, 3), [4, 3, 3]);
        assert_eq!(plan(500, None, None).unwrap(), [250, 250]);
        assert_eq!(plan(501, None, None).unwrap(), [167, 167, 167]);
        assert_eq!(plan(1, None, None).unwrap(), [1]);
        assert_eq!(plan(20, Some(2), Some(1024)).unwrap(), [10, 10]);
        assert!(plan(0, None, None).unwrap_err().contains("at least 1"));
        assert!(plan(2, Some(3), None)
            .unwrap_err()
            .contains("between 1 and"));
        assert!(plan(2, Some(0), None)
            .unwrap_err()
            .contains("between 1 and"));
        let err = plan(5_000, None, Some(1024)).unwrap_err();
        assert!(err.contains("ulimit -n 8192"), "{err}");
    }

    #[test]
    fn the_report_counts_a_watcher_ended_early_as_dropped() {
        let watcher = |events, ended: Option<&str>, p99| WatcherOutcome {
            events,
            expected: 100,
            lag_p99_us: p99,
            lag_max_us: p99 * 2,
            ended_early: ended.map(str::to_owned),
            ok: events == 100,
            settle_seconds: 0.5,
        };
        let child = |watchers| ChildOutcome {
            watchers,
            cpu_seconds: Some(0.5),
            peak_bytes: Some(1),
        };
        let report = aggregate(
            OneClient::ServeAlone,
            100,
            2.0,
            0,
            Some(0.001),
            vec![
                child(vec![watcher(100, None, 10), watcher(100, None, 30)]),
                child(vec![watcher(100, None, 20)]),
            ],
        );
        assert!(report.ok);
        assert_eq!(
            (report.delivered, report.watchers_ok, report.dropped),
            (300, 3, 0)
        );
        assert_eq!(
            report.delivered_per_second, 120.0,
            "over the churn and the settling"
        );
        assert_eq!(report.lag_p99_us, (20, 30));
        assert_eq!(report.lag_max_us, 60);
        assert!((report.server_cpu_us_per_event.unwrap() - 1000.0 / 300.0).abs() < 1e-9);
        assert!((report.watcher_cpu_us_per_event.unwrap() - 1e6 / 300.0).abs() < 1e-6);

        let report = aggregate(
            OneClient::ServeAlone,
            100,
            2.0,
            1,
            Some(0.001),
            vec![child(vec![
                watcher(100, None, 10),
                watcher(40, Some("the server ended the watch"), 10),
            ])],
        );
        assert!(!report.ok);
        assert_eq!(
            (
                report.watchers_ok,
                report.dropped,
                report.closed_as_too_slow
            ),
            (1, 1, 1)
        );
    }
}
