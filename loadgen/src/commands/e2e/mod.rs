//! `loadgen e2e` (feature `wire`): real clients over the wire against `loadgen serve`.
//!
//! For each client asked for, a fresh in-process server churns the same workload (same seed:
//! the same stream of events) on loopback, and the client lists and watches it through kube-rs
//! in a process of its own ([`client`], `loadgen e2e-client`): (a) `kcache`: kcache's
//! `SharedInformer` through its kube-rs adapter (`KubeListerWatcher`), (b) `kube-rs`: kube-rs'
//! own `watcher` + `reflector`. The clients run one after the other, so neither takes CPU from
//! the other, and each one's memory and CPU time are its own.
//!
//! Reported per client: watch events received and handler events applied (and per second, over
//! the churn), lag from the event's publication on the server to the handler (the store stamps
//! each batch just before handing it to the watches; both processes read the same clock), the
//! client process's peak resident memory and CPU seconds, the server's CPU seconds, how long
//! the cache took to match after the churn, and the verdict: the client's final cache equals
//! the server's final state.
//!
//! With `--kubeconfig FILE` the rows run against a server that is already up instead (a
//! `serve --writes`, a real cluster), and `loadgen churn` writes the workload ([`kubeconfig`]).
//!
//! With `--watchers N` one server fans its churn out to N watchers spread over child
//! processes instead, and the report is the fan-out's ([`watchers`]).

pub mod capacity;
pub mod client;
pub mod discard;
pub mod kubeconfig;
pub mod watchers;

use std::io::Write;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::args::{parse_rate, PodWorkloadArgs};
use crate::serve::store::Publication;
use crate::serve::{ServeConfig, Server, DEFAULT_WINDOW};
pub use client::OneClient;
use client::{process_cpu_seconds, read_seen, ClientOutcome};
use workloads::WorkloadSpec;

/// The rows `--client` asks for, in order: client names separated by commas, `serve-alone`
/// for both of the server's own rows (JSON and protobuf), or `all`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clients(pub Vec<OneClient>);

impl Clients {
    /// Every row, one after the other.
    pub const ALL: [OneClient; 9] = [
        OneClient::Kcache,
        OneClient::KcacheProtobuf,
        OneClient::KcacheJson,
        OneClient::KcacheMetadata,
        OneClient::KcacheCompactProtobuf,
        OneClient::KcacheCompactJson,
        OneClient::KubeRs,
        OneClient::ServeAlone,
        OneClient::ServeAloneProtobuf,
    ];
}

/// Parses `--client`.
///
/// ```
/// use loadgen::commands::e2e::{parse_clients, OneClient};
/// assert_eq!(parse_clients("kube-rs,kcache-protobuf").unwrap().0, [OneClient::KubeRs, OneClient::KcacheProtobuf]);
/// assert_eq!(parse_clients("serve-alone").unwrap().0.len(), 2);
/// assert_eq!(parse_clients("all").unwrap().0.len(), 9);
/// assert!(parse_clients("kcache,nope").unwrap_err().contains("nope"));
/// ```
pub fn parse_clients(s: &str) -> Result<Clients, String> {
    use clap::ValueEnum;
    let mut rows = Vec::new();
    for name in s.split(',').map(str::trim) {
        match name {
            "all" => rows.extend(Clients::ALL),
            "serve-alone" => rows.extend([OneClient::ServeAlone, OneClient::ServeAloneProtobuf]),
            _ => rows.push(OneClient::from_str(name, false).map_err(|_| {
                let known: Vec<&str> = Clients::ALL.iter().map(|c| c.name()).collect();
                format!(
                    "unknown client {name:?}: expected all, or names separated by commas from {}",
                    known.join(", ")
                )
            })?),
        }
    }
    Ok(Clients(rows))
}

/// Arguments of `loadgen e2e`.
#[derive(Debug, Clone, clap::Args)]
pub struct E2eArgs {
    /// The pods' workload.
    #[command(flatten)]
    pub pods: PodWorkloadArgs,
    /// Offered rate of churn, in events per second.
    #[arg(long, value_parser = parse_rate)]
    pub rate: f64,
    /// Which client(s) to run: `all`, or names separated by commas (kcache, kcache-protobuf,
    /// kcache-json, kcache-metadata, kcache-compact-protobuf, kcache-compact-json, kube-rs,
    /// serve-alone for both of the server's own rows, serve-alone-protobuf).
    #[arg(long, default_value = "all", value_parser = parse_clients)]
    pub client: Clients,
    /// The server's window of recent events (older resource versions get 410 Expired).
    #[arg(long, default_value_t = DEFAULT_WINDOW)]
    pub window: usize,
    /// How much of a real pod the server sends: minimal, typical or large (docs/workloads.md,
    /// "Pod profiles").
    #[arg(long, default_value_t = workloads::PodProfile::Typical)]
    pub pod_profile: workloads::PodProfile,
    /// Give up on a client whose cache does not match this many seconds after the churn.
    #[arg(long, default_value_t = 60.0)]
    pub settle_seconds: f64,
    /// kcache's own client (`kcache-protobuf`, `kcache-json`, `kcache-metadata`) lists by streaming
    /// (`sendInitialEvents`) instead of in pages: compare the rows' peak MB to see what the
    /// initial sync costs either way.
    #[arg(long)]
    pub streaming_lists: bool,
    /// Instead of one run at `--rate`: find the highest rate each client keeps up with, starting
    /// from `--rate` (server on schedule, lag p99 within `--max-lag-ms`, verdict ok), and what
    /// limits it.
    #[arg(long)]
    pub find_capacity: bool,
    /// With `--find-capacity`: seconds of churn per probe (`--events` is rate × this).
    #[arg(long, default_value_t = 10.0)]
    pub probe_seconds: f64,
    /// With `--find-capacity`: the lag p99 a client must keep, milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub max_lag_ms: f64,
    /// The server publishes what is due at most once per this many milliseconds (0: each
    /// event when it is due). A lag is measured from when an event was due, so the wait
    /// counts against the client.
    #[arg(long = "publish-interval-ms", value_name = "MS", default_value = "1", value_parser = crate::serve::parse_publish_interval_ms)]
    pub publish_interval: Duration,
    /// Also write the figures as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run the rows against the API server this kubeconfig names (plain HTTP: `serve
    /// --writes`, or a cluster through `kubectl proxy`) instead of a server of its own, with
    /// `loadgen churn` writing the workload into `--namespace` (docs/real-clusters.md).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// With `--kubeconfig`: the namespace the churn writes to.
    #[arg(long, default_value = "loadgen-e2e")]
    pub namespace: String,
    /// With `--kubeconfig`: the churn's writes in flight at once (its `--concurrency`).
    #[arg(long, default_value_t = 1, value_parser = crate::args::parse_concurrency)]
    pub write_concurrency: usize,
    /// With `--kubeconfig`: let the churn share its namespace with pods it did not create.
    #[arg(long)]
    pub allow_foreign: bool,
    /// Also draw each client's CPU per event and bytes per cached pod as an SVG chart here
    /// (one run at `--rate`; not with `--find-capacity`).
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Instead of the client rows: N watchers of one server, spread over child processes;
    /// reports events delivered per second, each watcher's lag p99, the server's CPU per
    /// delivered event and the watchers it closed as too slow (docs/wire.md, "Many
    /// watchers").
    #[arg(long, value_name = "N", conflicts_with_all = ["client", "find_capacity", "kubeconfig", "chart"])]
    pub watchers: Option<usize>,
    /// With `--watchers`: what each watcher is: `serve-alone` (a reader that counts events and
    /// discards them, the default), `serve-alone-protobuf`, or a client row such as
    /// `kcache-protobuf` (an informer with a cache per watcher).
    #[arg(long, value_enum, default_value = "serve-alone", requires = "watchers")]
    pub watcher_client: OneClient,
    /// With `--watchers`: child processes to spread them over [default: one per 250].
    #[arg(long, value_name = "P", requires = "watchers")]
    pub watcher_procs: Option<usize>,
    /// With `--watchers`: seconds of churn, `--events` being rate × this [default: 20].
    #[arg(
        long,
        value_name = "S",
        requires = "watchers",
        conflicts_with = "events"
    )]
    pub churn_seconds: Option<f64>,
    /// With `--watchers`: this many discarding watchers stop reading after their first
    /// chunk, for the server to close as too slow (a test of the close and its count).
    #[arg(
        long,
        value_name = "K",
        default_value_t = 0,
        hide = true,
        requires = "watchers"
    )]
    pub stalled_watchers: usize,
}

impl E2eArgs {
    /// The server a client runs against: `spec` at `rate`, with these arguments' pod profile,
    /// window and publication interval, and a bookmark each second.
    fn serve_config(&self, spec: WorkloadSpec, rate: f64) -> ServeConfig {
        let mut config = ServeConfig::new(spec, rate);
        config.pod_profile = self.pod_profile;
        config.window = self.window;
        // As `serve` does: a watcher a window behind is closed, the point past which it could
        // only get a 410 anyway.
        config.limits = crate::serve::limits::Limits::for_window(self.window);
        config.bookmark_interval = Duration::from_secs(1);
        config.publish_interval = self.publish_interval;
        config
    }
}

/// What one client did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClientReport {
    /// `kcache` or `kube-rs`.
    pub client: &'static str,
    /// Watch events (added, modified, deleted) the client received.
    pub received: u64,
    /// Events its handler applied (initial-list adds excluded).
    pub applied: u64,
    /// Seconds the churn lasted on the server.
    pub churn_seconds: f64,
    /// Lag percentiles from publication to handler, microseconds: p50, p99, max.
    pub lag_us: (u64, u64, u64),
    /// The client process's peak resident memory, bytes.
    pub peak_bytes: Option<u64>,
    /// Bytes the allocator committed for the client's cache after its initial sync, per pod
    /// of the initial list.
    pub bytes_per_pod: Option<f64>,
    /// CPU seconds the client process used from its initial sync until its handler heard the
    /// last event (the harness's own check of its cache afterwards is not counted).
    pub client_cpu_seconds: Option<f64>,
    /// CPU seconds the client process used to start and make its initial sync.
    pub client_sync_cpu_seconds: Option<f64>,
    /// CPU seconds this process (the server and its churn) used while the client ran.
    pub server_cpu_seconds: Option<f64>,
    /// The client's CPU per event it received, microseconds.
    pub client_cpu_us_per_event: Option<f64>,
    /// The server's CPU per event it published, microseconds (the churn included: writing
    /// each event's encodings once, then sending them).
    pub server_cpu_us_per_event: Option<f64>,
    /// Seconds from the end of the churn until the cache matched (or until giving up).
    pub settle_seconds: f64,
    /// Whether the cache ended equal to the server's final state.
    pub ok: bool,
    /// Pods in the server's final state and in the client's cache.
    pub pods: (usize, usize),
}

/// `loadgen e2e`.
pub fn main(args: E2eArgs) -> ExitCode {
    let positive = |x: f64| x.is_finite() && x > 0.0;
    if args.window == 0
        || !positive(args.settle_seconds)
        || !positive(args.probe_seconds)
        || !positive(args.max_lag_ms)
    {
        eprintln!(
            "loadgen e2e: --window, --settle-seconds, --probe-seconds and --max-lag-ms must be \
             above 0"
        );
        return ExitCode::from(2);
    }
    if args.find_capacity && args.pods.events.is_some() {
        eprintln!("loadgen e2e: --find-capacity sets each probe's events (rate × --probe-seconds); drop --events");
        return ExitCode::from(2);
    }
    let spec = match args.pods.spec() {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("loadgen e2e: {e}");
            return ExitCode::from(2);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("loadgen e2e: cannot find this loadgen binary to run the clients: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("loadgen e2e: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(watchers) = args.watchers {
        return watchers::main(&args, watchers, spec, &exe, &runtime);
    }
    let clients: &[OneClient] = &args.client.0;
    if args.kubeconfig.is_some() {
        if args.find_capacity {
            eprintln!(
                "loadgen e2e: --find-capacity starts a server per probe; not with --kubeconfig"
            );
            return ExitCode::from(2);
        }
        if let Some(c) = clients.iter().find(|c| c.discards().is_some()) {
            eprintln!(
                "loadgen e2e: {} measures `serve` itself; with --kubeconfig ask for client rows only (--client kcache,kube-rs,...)",
                c.name()
            );
            return ExitCode::from(2);
        }
    } else if args.find_capacity {
        return find_capacity(&args, spec, &exe, &runtime, clients);
    }
    let url = match &args.kubeconfig {
        None => None,
        Some(path) => match runtime.block_on(kubeconfig::cluster_url(path)) {
            Ok(url) => Some(url),
            Err(e) => {
                eprintln!("loadgen e2e: {e}");
                return ExitCode::from(2);
            }
        },
    };
    let mut reports = Vec::new();
    for &client in clients {
        let report = match (&args.kubeconfig, &url) {
            (Some(path), Some(url)) => {
                let target = kubeconfig::Target {
                    kubeconfig: path,
                    url,
                    namespace: &args.namespace,
                    allow_foreign: args.allow_foreign,
                    workload_args: vec![
                        format!("--workload={}", args.pods.workload.name()),
                        format!("--keys={}", spec.keys),
                        format!("--events={}", spec.events),
                        format!("--seed={}", spec.seed),
                        format!("--rate={}", args.rate),
                        format!("--concurrency={}", args.write_concurrency),
                    ],
                };
                runtime.block_on(kubeconfig::run_client(
                    &exe,
                    client,
                    &target,
                    args.settle_seconds,
                    args.streaming_lists,
                ))
            }
            _ => runtime.block_on(run_client(
                &exe,
                client,
                args.serve_config(spec, args.rate),
                args.settle_seconds,
                args.streaming_lists,
            )),
        };
        match report {
            Ok(report) => reports.push(report),
            Err(e) => {
                eprintln!("loadgen e2e: {}: {e}", client.name());
                return ExitCode::FAILURE;
            }
        }
    }
    print_reports(&reports, args.rate, url.as_deref());
    if let Some(path) = &args.chart {
        let bars: Vec<crate::reports::chart::ClientBar> = reports
            .iter()
            .map(|r| crate::reports::chart::ClientBar {
                client: r.client.to_owned(),
                cpu_us_per_event: r.client_cpu_us_per_event,
                bytes_per_pod: r.bytes_per_pod,
            })
            .collect();
        let title = format!(
            "{}, {} {} pods, {:.0} events/s offered",
            args.pods.workload.to_string().to_uppercase(),
            spec.keys,
            args.pod_profile,
            args.rate
        );
        if let Err(e) = crate::reports::chart::clients_svg(&title, &bars, path) {
            eprintln!("loadgen e2e: {e}");
            return ExitCode::from(2);
        }
    }
    if let Err(code) = write_figures(
        &args,
        &spec,
        serde_json::json!({
            "events": spec.events,
            "rate": args.rate,
            "clients": reports,
        }),
    ) {
        return code;
    }
    if reports.iter().all(|r| r.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn write_json(path: &std::path::Path, value: &serde_json::Value) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).expect("plain figures serialise");
    std::fs::write(path, text + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Writes `--json`, if asked: the run's workload and key count, then `body`'s fields (an
/// object). Exit code 2 when it cannot be written, after saying why.
fn write_figures(
    args: &E2eArgs,
    spec: &WorkloadSpec,
    body: serde_json::Value,
) -> Result<(), ExitCode> {
    let Some(path) = &args.json else {
        return Ok(());
    };
    let mut figures = serde_json::json!({
        "workload": args.pods.workload.to_string(),
        "keys": spec.keys,
    });
    if let (Some(all), serde_json::Value::Object(fields)) = (figures.as_object_mut(), body) {
        all.extend(fields);
    }
    write_json(path, &figures).map_err(|e| {
        eprintln!("loadgen e2e: {e}");
        ExitCode::from(2)
    })
}

/// `--find-capacity`: a search per client (see [`capacity`]), one line per probe as it ends.
fn find_capacity(
    args: &E2eArgs,
    spec: WorkloadSpec,
    exe: &std::path::Path,
    runtime: &tokio::runtime::Runtime,
    clients: &[OneClient],
) -> ExitCode {
    let mut searches = Vec::new();
    for &client in clients {
        let found = crate::runner::capacity_search::search(&capacity::plan(args.rate), |rate| {
            let rate = rate as f64;
            let events = ((rate * args.probe_seconds) as usize).max(1_000);
            let report = runtime
                .block_on(run_client(
                    exe,
                    client,
                    args.serve_config(spec.events(events), rate),
                    args.settle_seconds,
                    args.streaming_lists,
                ))
                .map_err(|e| format!("{}: {e}", client.name()))?;
            let probe = capacity::Probe::judge(rate, events, args.max_lag_ms, report);
            eprintln!(
                "{:<20} {:>9.0}/s  lag p50 {:>8.2} ms  p99 {:>8.2} ms  client cpu {:>5.0}%  srv µs/ev {:>6}  {}",
                client.name(),
                rate,
                probe.report.lag_us.0 as f64 / 1e3,
                probe.report.lag_us.1 as f64 / 1e3,
                probe
                    .report
                    .client_cpu_seconds
                    .map_or(f64::NAN, |c| 100.0 * c
                        / probe.report.churn_seconds.max(1e-9)),
                probe
                    .report
                    .server_cpu_us_per_event
                    .map_or("n/a".to_owned(), |c| format!("{c:.2}")),
                if probe.passed() {
                    "kept up".to_owned()
                } else {
                    probe.failed.join("; ")
                }
            );
            Ok::<_, String>((probe.passed(), probe))
        });
        match found {
            Ok(found) => searches.push(capacity::Search::of(client.name(), found)),
            Err(e) => {
                eprintln!("loadgen e2e: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "client               capacity (lag p99 ≤ {} ms)  lag p50/p99 at capacity  peak MB  limit above it",
        args.max_lag_ms
    );
    for search in &searches {
        let at = search
            .capacity
            .and_then(|c| search.probes.iter().find(|p| p.rate == c && p.passed()));
        println!(
            "{:<20} {:>27}  {:>23}  {:>7}  {}",
            search.client,
            search
                .capacity
                .map_or("none kept up".to_owned(), |c| format!("{c:.0} events/s")),
            at.map_or("-".to_owned(), |p| format!(
                "{:.2} / {:.2} ms",
                p.report.lag_us.0 as f64 / 1e3,
                p.report.lag_us.1 as f64 / 1e3
            )),
            at.and_then(|p| p.report.peak_bytes)
                .map_or("-".to_owned(), |b| format!("{:.1}", b as f64 / 1e6)),
            search.limit.as_deref().unwrap_or("not reached"),
        );
    }
    if let Err(code) = write_figures(
        args,
        &spec,
        serde_json::json!({
            "probe_seconds": args.probe_seconds,
            "max_lag_ms": args.max_lag_ms,
            "searches": searches,
        }),
    ) {
        return code;
    }
    if searches
        .iter()
        .all(|s| s.probes.iter().all(|p| p.report.ok))
    {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_reports(reports: &[ClientReport], rate: f64, against: Option<&str>) {
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8}  verdict",
        "client",
        "received",
        "recv/s",
        "applied",
        "applied/s",
        "lag p50",
        "lag p99",
        "lag max",
        "peak MB",
        "B/pod",
        "cpu s",
        "srv cpu",
        "cpu µs/ev",
        "srv µs/ev",
        "settle"
    );
    for r in reports {
        let per_s = |n: u64| n as f64 / r.churn_seconds.max(1e-9);
        let peak = r
            .peak_bytes
            .map_or("n/a".to_owned(), |b| format!("{:.1}", b as f64 / 1e6));
        let cpu = |c: Option<f64>| c.map_or("n/a".to_owned(), |c| format!("{c:.2}"));
        let verdict = if r.ok {
            "ok".to_owned()
        } else {
            format!(
                "MISMATCH ({} served, {} {})",
                r.pods.0,
                r.pods.1,
                if r.client.starts_with("serve-alone") {
                    "events counted"
                } else {
                    "cached"
                }
            )
        };
        println!(
            "{:<24} {:>10} {:>10.0} {:>10} {:>10.0} {:>7}µs {:>7}µs {:>7}µs {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>7.2}s  {verdict}",
            r.client,
            r.received,
            per_s(r.received),
            r.applied,
            per_s(r.applied),
            r.lag_us.0,
            r.lag_us.1,
            r.lag_us.2,
            peak,
            r.bytes_per_pod.map_or("n/a".to_owned(), |b| format!("{b:.0}")),
            cpu(r.client_cpu_seconds),
            cpu(r.server_cpu_seconds),
            cpu(r.client_cpu_us_per_event),
            cpu(r.server_cpu_us_per_event),
            r.settle_seconds,
        );
    }
    if let Some(url) = against {
        println!(
            "(against {url}; offered {rate:.0} writes/s by `loadgen churn`; per second: over the \
             churn's duration; lag: from the write's return in the churn to the client's handler, \
             for the churn's own writes; each client ran alone in a process of its own (peak MB: \
             its peak resident memory, the initial sync included; cpu s: its CPU seconds from its \
             initial sync until it heard the last write); verdict: its cache against a fresh list)"
        );
        return;
    }
    println!(
        "(offered {rate:.0} events/s; per second: over the churn's duration on the server; lag: \
         when the event was due on the server's schedule to the client's handler; each client \
         ran alone in a process of its own (peak MB: its peak resident memory, the initial sync \
         included; B/pod: bytes its allocator committed from its start to its initial sync, per \
         pod listed; cpu s: its CPU seconds from its initial sync until it heard the last event), against a fresh server in this process with the same events (srv cpu: this \
         process's CPU seconds meanwhile))"
    );
}

/// When each event was due: the store's record of its batches (each stamped when its first
/// event was due), and the churn's rate, which spaces the events of a batch.
struct Timeline {
    batches: Vec<Publication>,
    rate: f64,
}

impl Timeline {
    /// When `rv` was due (Unix nanoseconds), its batch's stamp plus its place in the batch at
    /// the churn's rate; `None` if it was not published while recording (the population
    /// present at start).
    fn due(&self, rv: u64) -> Option<u64> {
        let i = self.batches.partition_point(|&(first, _)| first <= rv);
        let (first, stamp) = self.batches[i.checked_sub(1)?];
        Some(stamp + ((rv - first) as f64 * 1e9 / self.rate) as u64)
    }
}

/// How long a client may take to list and sync before the churn starts.
const SYNC_TIMEOUT: Duration = Duration::from_secs(600);

/// Kills a client that will not be asked for its report, and reaps it (no zombie left behind
/// across a capacity search's probes).
async fn end_child(mut child: std::process::Child) {
    let _ = child.kill();
    let _ = wait_child(child).await;
}

/// Waits for the client process to exit, off the runtime's threads.
/// Tells a client process the churn has ended (`churned`, a line of its stdin) and reads its
/// report: the last line it writes to `lines` (its stdout) before it exits.
async fn client_report(
    mut child: std::process::Child,
    lines: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    churned: &str,
) -> Result<ClientOutcome, String> {
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(churned.as_bytes());
    }
    let status = wait_child(child).await?;
    let mut last = None;
    while let Some(line) = lines.recv().await {
        last = Some(line);
    }
    last.and_then(|line| serde_json::from_str(&line).ok())
        .ok_or_else(|| {
            format!("the client process ended with {status} and no report (its error is above)")
        })
}

async fn wait_child(mut child: std::process::Child) -> Result<std::process::ExitStatus, String> {
    tokio::task::spawn_blocking(move || child.wait())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("waiting for the client: {e}"))
}

/// A `--seen` file name no other loadgen process uses.
fn seen_path(client: OneClient) -> PathBuf {
    std::env::temp_dir().join(format!(
        "loadgen-e2e-{}-{}.seen",
        std::process::id(),
        client.name()
    ))
}

/// Serves one fresh churn to `client` running in a child process, and reports on it.
async fn run_client(
    exe: &std::path::Path,
    client: OneClient,
    mut config: ServeConfig,
    settle_seconds: f64,
    streaming_lists: bool,
) -> Result<ClientReport, String> {
    config.record_publications = true;
    config.hold_churn = true;
    let rate = config.rate;
    let mut server = Server::start(config)
        .await
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let initial_pods = server.initial_pods();
    let seen = seen_path(client);
    let expected = seen.with_extension("expected");
    let mut child = std::process::Command::new(exe)
        .arg("e2e-client")
        .args(["--url", &server.url(), "--client", client.name()])
        .arg("--expected")
        .arg(&expected)
        .args(["--settle-seconds", &settle_seconds.to_string()])
        .args(streaming_lists.then_some("--streaming-lists"))
        .arg("--seen")
        .arg(&seen)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {} e2e-client: {e}", exe.display()))?;
    let mut lines = crate::kube_churn::lines(&mut child);

    // The churn starts once the client has listed and its handler has seen the list: the lag
    // measured is the steady state's, not that of events waiting behind the initial list.
    match tokio::time::timeout(SYNC_TIMEOUT, lines.recv()).await {
        Ok(Some(line)) if line == "synced" => {}
        Ok(Some(line)) => {
            end_child(child).await;
            return Err(format!("expected `synced` from the client, got {line:?}"));
        }
        Ok(None) => {
            let status = wait_child(child).await?;
            return Err(format!(
                "the client process ended with {status} before it synced (its error is above)"
            ));
        }
        Err(_) => {
            end_child(child).await;
            return Err(format!(
                "the client did not sync within {} s",
                SYNC_TIMEOUT.as_secs()
            ));
        }
    }
    let cpu_before = process_cpu_seconds();
    server.release_churn();
    let summary = server.churn_finished().await;
    let server_cpu_seconds = cpu_before
        .zip(process_cpu_seconds())
        .map(|(before, after)| after - before);
    // The server's final state, for the child to check its cache against.
    let final_state = server.store().snapshot(None);
    client::write_expected(
        &expected,
        final_state
            .pods
            .iter()
            .map(|p| (&*p.namespace, &*p.name, p.resource_version)),
    )
    .map_err(|e| format!("writing {}: {e}", expected.display()))?;
    drop(final_state);
    // The child may have died already; its exit status tells below.
    let outcome = client_report(child, &mut lines, "churned\n").await?;
    let events = read_seen(&seen).map_err(|e| format!("reading {}: {e}", seen.display()));
    let _ = std::fs::remove_file(&seen);
    let _ = std::fs::remove_file(&expected);
    let events = events?;

    // Up to an hour in microseconds; a longer lag is clamped to it.
    let mut lags = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
        .map_err(|e| format!("histogram: {e}"))?;
    let timeline = Timeline {
        batches: server.store().publications(),
        rate,
    };
    for &(rv, at) in &events {
        if let Some(published) = timeline.due(rv) {
            lags.saturating_record(at.saturating_sub(published) / 1_000);
        }
    }
    // The child compared its cache with a list from the server; check the count against the
    // server's own state too.
    let served = match client.discards() {
        Some(_) => outcome.served,
        None => server.store().snapshot(None).pods.len(),
    };
    let report = ClientReport {
        client: client.name(),
        received: outcome.received,
        applied: outcome.applied,
        churn_seconds: summary.seconds,
        lag_us: (
            lags.value_at_quantile(0.5),
            lags.value_at_quantile(0.99),
            lags.max(),
        ),
        peak_bytes: outcome.peak_bytes,
        bytes_per_pod: outcome
            .cache_bytes
            .filter(|_| initial_pods > 0)
            .map(|b| b as f64 / initial_pods as f64),
        client_cpu_seconds: outcome.cpu_seconds,
        client_sync_cpu_seconds: outcome.sync_cpu_seconds,
        server_cpu_seconds,
        client_cpu_us_per_event: crate::measure::cpu::cpu_figures(
            outcome.cpu_seconds.map(Duration::from_secs_f64),
            outcome.received,
        )
        .1,
        server_cpu_us_per_event: crate::measure::cpu::cpu_figures(
            server_cpu_seconds.map(|s| Duration::from_secs_f64(s.max(0.0))),
            summary.events,
        )
        .1,
        settle_seconds: outcome.settle_seconds,
        // A discarding reader checked its own count against the server's final version.
        ok: outcome.ok && (client.discards().is_some() || outcome.served == served),
        pods: (served, outcome.cached),
    };
    server
        .stop()
        .await
        .map_err(|e| format!("stopping the server: {e}"))?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::Timeline;

    #[test]
    fn an_event_is_due_at_its_batchs_stamp_plus_its_place_at_the_rate() {
        let timeline = Timeline {
            batches: vec![(11, 100_000), (14, 200_000), (15, 300_000)],
            rate: 1e6,
        };
        assert_eq!(timeline.due(10), None, "present before the churn");
        assert_eq!(timeline.due(11), Some(100_000));
        assert_eq!(
            timeline.due(13),
            Some(102_000),
            "third of its batch, 1 µs apart"
        );
        assert_eq!(timeline.due(14), Some(200_000));
        assert_eq!(timeline.due(16), Some(301_000));
    }
}
