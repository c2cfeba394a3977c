//! `loadgen serve`: a synthetic Kubernetes API server for `pods` that kubectl and kube-rs accept
//! (docs/wire.md), churning its pods at an offered rate following a workload of
//! docs/workloads.md.
//!
//! | module | what it does |
//! |---|---|
//! | [`bytes`] | JSON and protobuf written by hand: strings, integers, times, keys, varints, fields |
//! | [`encode`] | a pod written from its varying fields, JSON and protobuf, without a typed object (the `minimal` profile by hand, the others through `template`) |
//! | [`profile`] | the `typical` and `large` pods: a Deployment's pod as a real API server holds it, typed, from the values that vary |
//! | [`convert`] | that typed pod as the same `k8s-pb` pod (the protobuf reference) |
//! | `template` | templates compiled once per pod shape from the typed pod's JSON and protobuf, rendered per event |
//! | [`objects`] | pods, watch lines, bookmarks, `Status` errors, discovery documents (JSON) |
//! | [`protobuf`] | the protobuf envelope, watch frames, `Status` |
//! | [`format`] | JSON or protobuf, chosen from `Accept`; list pages in each |
//! | [`store`] | the pods in the engine's simulated API server (`kcache_sim::apiserver`: the window of recent events, paged lists, the fan-out to watches) |
//! | [`churn`] | the workload as pod events, paced |
//! | [`watch`] | one watch's stream |
//! | [`routes`] | paths, query parameters, lists, gets and watches |
//! | [`writes`] | creates, replaces, patches and deletes of pods (`--writes`) |
//! | [`faults`] | faults injected on purpose (resets, cut frames, stalls, 429s, …) and their counts |
//! | [`limits`] | the accept loop: per-connection limits and the slow-watcher close |
//! | [`params`] | query parameters read before routing (a too-new resource version waits) |
//! | `restart` | the churn's thread; a restart that loses the state (versions go back) |
//!
//! [`Server::start`] runs it inside a tokio runtime (tests, and an end-to-end run that wants
//! it in-process); `loadgen serve` is the same behind a command line.

pub mod bytes;
pub mod churn;
pub mod convert;
pub mod encode;
pub mod faults;
pub mod format;
pub mod limits;
pub mod objects;
pub mod params;
pub mod profile;
pub mod protobuf;
mod restart;
pub mod routes;
pub mod store;
mod template;
pub mod watch;
pub mod writes;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch as signal;

use crate::args::{parse_rate, PodWorkloadArgs};
pub use churn::Pace;
use churn::{Churn, ChurnSummary};
use faults::{FaultPlan, FaultReport, Faults};
use limits::Limits;
use routes::App;
use store::Store;
use workloads::{generate, PodProfile, WorkloadSpec};

/// The default window of recent events a watch can resume from.
pub const DEFAULT_WINDOW: usize = 100_000;
/// The default period of bookmarks (the real API server's).
pub const DEFAULT_BOOKMARK_SECONDS: f64 = 60.0;
/// How long a request for a resource version newer than the server's waits for it before the
/// 504 (the API server's wait).
pub const DEFAULT_TOO_LARGE_WAIT: Duration = Duration::from_secs(3);

/// Arguments of `loadgen serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// The pods' workload.
    #[command(flatten)]
    pub pods: PodWorkloadArgs,
    /// Offered rate of churn, in events per second.
    #[arg(long, value_parser = parse_rate)]
    pub rate: f64,
    /// Where to listen (plain HTTP; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub addr: SocketAddr,
    /// How many recent events a watch can resume from; older resource versions get 410 Expired.
    #[arg(long, default_value_t = DEFAULT_WINDOW, value_parser = parse_window)]
    pub window: usize,
    /// Write a kubeconfig pointing at the server here (instead of printing it on stdout).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// How much of a real pod each pod carries: minimal (~330 bytes of JSON), typical (a
    /// Deployment's pod with managedFields and status, ~6 KB) or large (~25 KB)
    /// (docs/workloads.md, "Pod profiles").
    #[arg(long, default_value_t = PodProfile::Typical)]
    pub pod_profile: PodProfile,
    /// Seconds between the bookmarks of a watch with allowWatchBookmarks=true.
    #[arg(long, default_value_t = DEFAULT_BOOKMARK_SECONDS, value_parser = parse_bookmark_seconds)]
    pub bookmark_seconds: f64,
    /// Faults to inject, `name=value,...` (docs/wire.md, "Faults"), e.g.
    /// `reset-mid-chunk=0.001,too-many-requests=0.01,stall=30s@60s`.
    #[arg(long, default_value = "")]
    pub faults: FaultPlan,
    /// Close a watcher this many events behind the newest [default: the window].
    #[arg(long)]
    pub slow_watcher_events: Option<u64>,
    /// Seconds a connection may take to send a request head (and may sit idle).
    #[arg(long, default_value_t = limits::DEFAULT_HEADER_READ_TIMEOUT.as_secs_f64(), value_parser = parse_bookmark_seconds)]
    pub header_read_timeout: f64,
    /// The churn publishes what is due at most once per this many milliseconds (0: each event
    /// when it is due; a watch then hears one event per write).
    #[arg(long = "publish-interval-ms", value_name = "MS", default_value = "1", value_parser = parse_publish_interval_ms)]
    pub publish_interval: Duration,
    /// Accept writes of pods (create, replace, patch, delete) as the API server does, each an
    /// event in the same stream as the churn's (docs/wire.md, "Writes"); without it every
    /// write gets `405 MethodNotAllowed`.
    #[arg(long)]
    pub writes: bool,
}

/// A publication interval given in milliseconds, 0 to 1000.
pub fn parse_publish_interval_ms(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(ms) if (0.0..=1000.0).contains(&ms) => Ok(Duration::from_secs_f64(ms / 1000.0)),
        _ => Err(format!(
            "{s:?} is not a publication interval: expected milliseconds from 0 to 1000"
        )),
    }
}

fn parse_window(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(w) if w > 0 => Ok(w),
        _ => Err(format!(
            "{s:?} is not a window: expected a number of events above 0"
        )),
    }
}

fn parse_bookmark_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(b) if b.is_finite() && b >= 0.001 => Ok(b),
        _ => Err(format!(
            "{s:?} is not a bookmark period: expected seconds, at least 0.001"
        )),
    }
}

/// What to serve.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The workload, its sizes and seed.
    pub workload: WorkloadSpec,
    /// How much of a real pod each pod carries ([`PodProfile::Typical`] by default).
    pub pod_profile: PodProfile,
    /// Offered churn rate, events per second (above 0).
    pub rate: f64,
    /// Where to listen.
    pub addr: SocketAddr,
    /// The window of recent events (at least 1).
    pub window: usize,
    /// Bookmark period.
    pub bookmark_interval: Duration,
    /// Remember when each batch of events is published ([`Store::publications`]), from the
    /// first event on.
    pub record_publications: bool,
    /// Serve the initial population but hold the churn until [`Server::release_churn`]: a
    /// client can list and sync first, so what is measured is the steady state, not events
    /// that waited behind the initial list. [`Server::churn_finished`] waits for a held churn
    /// to be released and run; stopping or dropping the server ends it unreleased.
    pub hold_churn: bool,
    /// Faults to inject (none by default).
    pub faults: FaultPlan,
    /// Per-connection limits.
    pub limits: Limits,
    /// How long a request for a resource version newer than the server's waits for it before
    /// the 504.
    pub too_large_wait: Duration,
    /// The churn publishes what is due at most once per this interval ([`Pace::interval`]).
    pub publish_interval: Duration,
    /// Accept writes of pods (off by default: a read-only server answers them 405).
    pub writes: bool,
}

impl ServeConfig {
    /// How the churn publishes.
    pub fn pace(&self) -> Pace {
        Pace {
            rate: self.rate,
            interval: self.publish_interval,
        }
    }

    /// `workload` at `rate` on a free loopback port, with typical pods and the default window
    /// and bookmarks.
    pub fn new(workload: WorkloadSpec, rate: f64) -> Self {
        Self {
            workload,
            pod_profile: PodProfile::default(),
            rate,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            window: DEFAULT_WINDOW,
            bookmark_interval: Duration::from_secs_f64(DEFAULT_BOOKMARK_SECONDS),
            record_publications: false,
            hold_churn: false,
            faults: FaultPlan::default(),
            limits: Limits::for_window(DEFAULT_WINDOW),
            publish_interval: Pace::DEFAULT_INTERVAL,
            too_large_wait: DEFAULT_TOO_LARGE_WAIT,
            writes: false,
        }
    }
}

/// A running server. Dropping it without [`Server::stop`] leaves the HTTP task running until
/// the runtime ends; the churn stops either way.
#[derive(Debug)]
pub struct Server {
    addr: SocketAddr,
    store: Arc<Store>,
    shutdown: signal::Sender<bool>,
    stop_churn: Arc<AtomicBool>,
    churn: signal::Receiver<Option<ChurnSummary>>,
    http: tokio::task::JoinHandle<io::Result<()>>,
    /// What every request sees; `restart` serves it again behind a new shutdown signal.
    app: App,
    initial_pods: usize,
    initial_resource_version: u64,
    /// While the churn is held: dropping it lets the churn begin.
    churn_gate: Option<restart::ChurnGate>,
    /// What it was started with (a restart without state starts over from it).
    config: ServeConfig,
}

impl Server {
    /// Generates the workload, binds, and starts serving and churning. Must be called within a
    /// tokio runtime; the churn runs on a thread of its own.
    pub async fn start(config: ServeConfig) -> io::Result<Server> {
        if !(config.rate.is_finite() && config.rate > 0.0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "rate {} is not a number of events per second above 0",
                    config.rate
                ),
            ));
        }
        let (spec, profile) = (config.workload, config.pod_profile);
        let (churn, initial, resource_version) =
            tokio::task::spawn_blocking(move || Churn::new(generate(&spec), profile))
                .await
                .map_err(io::Error::other)?;
        let initial_pods = initial.len();
        let store = Arc::new(Store::new(initial, resource_version, config.window));
        if config.record_publications {
            store.record_publications();
        }
        let listener = listen(config.addr).map_err(|e| {
            io::Error::new(e.kind(), format!("cannot listen on {}: {e}", config.addr))
        })?;
        let addr = listener.local_addr()?;
        let (churn_done, churn_rx) = signal::channel(None);
        let faults = Faults::new(config.faults.clone());
        let app = App {
            store: Arc::clone(&store),
            addr,
            bookmark_interval: config.bookmark_interval,
            // Replaced by `serve_http`.
            shutdown: signal::channel(false).1,
            churn: churn_rx.clone(),
            label: workload_label(&config),
            faults,
            too_large_wait: config.too_large_wait,
            writes: config.writes,
        };
        let (shutdown, http) = serve_http(listener, app.clone(), config.limits.clone());
        let (stop_churn, churn_gate) = restart::spawn_churn(
            churn,
            Arc::clone(&store),
            config.pace(),
            config.hold_churn,
            churn_done,
        )?;
        Ok(Server {
            addr,
            store,
            shutdown,
            stop_churn,
            churn: churn_rx,
            http,
            app,
            initial_pods,
            initial_resource_version: resource_version,
            churn_gate,
            config,
        })
    }

    /// The faults injected so far (and the watchers the limits closed).
    pub fn faults(&self) -> FaultReport {
        self.app.faults.counts.report()
    }

    /// Stops the churn where it is (the server goes on serving); `churn_finished` resolves.
    pub fn stop_churn(&self) {
        // Relaxed: the flag carries no data (see Churn::run).
        self.stop_churn.store(true, Ordering::Relaxed);
        self.churn_gate_open();
    }

    /// Stalls every watch for `duration` from now (no bytes, no close).
    pub fn stall_watches(&self, duration: Duration) {
        self.app.faults.stall_from_now(duration);
    }

    /// Injects `plan` from now on instead of the one it was started with.
    pub fn set_faults(&self, plan: FaultPlan) {
        self.app.faults.set_plan(plan);
    }

    /// Lets a churn held by [`ServeConfig::hold_churn`] begin (nothing if it is not held).
    pub fn release_churn(&mut self) {
        self.churn_gate = None;
    }

    fn churn_gate_open(&self) {
        if let Some(gate) = &self.churn_gate {
            // A held churn that is told to stop must get past its gate to see it: dropping the
            // sender is what opens it, and this handle is shared, so the gate gets a message.
            let _ = gate.sender.send(());
        }
    }

    /// How many times the connections were checked for a slow watcher.
    pub fn slow_watcher_checks(&self) -> u64 {
        // Relaxed: a count, read on its own.
        self.app
            .faults
            .counts
            .slow_watcher_checks
            .load(Ordering::Relaxed)
    }

    /// Whether a held churn's thread is parked at its gate, having published nothing: what a
    /// test waits for before it checks that a held churn publishes nothing.
    pub fn churn_waiting_at_gate(&self) -> bool {
        self.churn_gate
            .as_ref()
            .is_some_and(|gate| gate.waiting.load(Ordering::Acquire))
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many pods were present at start.
    pub fn initial_pods(&self) -> usize {
        self.initial_pods
    }

    /// The resource version before the first churn event.
    pub fn initial_resource_version(&self) -> u64 {
        self.initial_resource_version
    }

    /// The state it serves (for tests that compare a client's view to it).
    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The pods it serves now: `namespace/name` → resource version (what a client's cache
    /// must end with).
    pub fn pod_versions(&self) -> std::collections::BTreeMap<String, u64> {
        self.store
            .snapshot(None)
            .pods
            .iter()
            .map(|p| (format!("{}/{}", p.namespace, p.name), p.resource_version))
            .collect()
    }

    /// A kubeconfig that points kubectl or kube-rs at it.
    pub fn kubeconfig(&self) -> String {
        kubeconfig(&self.url())
    }

    /// Waits until the churn has published its last event (or was stopped).
    pub async fn churn_finished(&self) -> ChurnSummary {
        let mut rx = self.churn.clone();
        let summary = match rx.wait_for(Option::is_some).await {
            Ok(summary) => *summary,
            // The churn thread is gone without a word only if it panicked.
            Err(_) => None,
        };
        summary.expect("the churn thread ended without a summary (it panicked)")
    }

    /// An API server restart, as a client sees one: every watch and connection ends, the
    /// address refuses connections for `down`, then the same state is served again on the same
    /// address. The pods and the window of recent events survive (a real API server keeps its
    /// state in etcd) and the churn goes on throughout (other API servers keep writing), so a
    /// client resumes its watch from its last version if that is still in the window, or gets
    /// `410 Expired` and relists.
    pub async fn restart(&mut self, down: Duration) -> io::Result<()> {
        // No receiver left means nothing is serving any more: fine.
        let _ = self.shutdown.send(true);
        // A finished task stands in until the new one exists, so `stop` after a failed restart
        // has a task to wait for.
        let old = std::mem::replace(&mut self.http, tokio::spawn(async { Ok(()) }));
        old.await.map_err(io::Error::other)??;
        tokio::time::sleep(down).await;
        self.serve_again()
    }

    /// Listens on the same address again and serves `app` there (after the old HTTP task has
    /// ended): the second half of both restarts.
    fn serve_again(&mut self) -> io::Result<()> {
        let listener = listen(self.addr).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot listen on {} again: {e}", self.addr),
            )
        })?;
        let (shutdown, http) = serve_http(listener, self.app.clone(), self.config.limits.clone());
        self.shutdown = shutdown;
        self.http = http;
        Ok(())
    }

    /// Stops the churn, ends every watch, and waits for the HTTP server to finish.
    pub async fn stop(mut self) -> io::Result<()> {
        // Relaxed: the flag carries no data (see Churn::run).
        self.stop_churn.store(true, Ordering::Relaxed);
        // No receiver left means nothing is serving any more: fine.
        let _ = self.shutdown.send(true);
        (&mut self.http).await.map_err(io::Error::other)?
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Relaxed: see `stop`.
        self.stop_churn.store(true, Ordering::Relaxed);
        let _ = self.shutdown.send(true);
    }
}

/// Serves `app` on `listener` under `limits` until the returned sender turns true; every
/// watch ends then.
fn serve_http(
    listener: tokio::net::TcpListener,
    mut app: App,
    limits: Limits,
) -> (
    signal::Sender<bool>,
    tokio::task::JoinHandle<io::Result<()>>,
) {
    let (shutdown, shutdown_rx) = signal::channel(false);
    app.shutdown = shutdown_rx.clone();
    let (store, faults) = (Arc::clone(&app.store), Arc::clone(&app.faults));
    let router = axum::Router::new().fallback(routes::handle).with_state(app);
    let http = tokio::spawn(limits::serve(
        listener,
        router,
        limits,
        store,
        faults,
        shutdown_rx,
    ));
    (shutdown, http)
}

/// How many connections may wait to be accepted: thousands of watchers connecting at once must
/// not overflow the queue (tokio's default is 1024; the kernel caps it at `somaxconn`).
const LISTEN_BACKLOG: u32 = 4096;

fn listen(addr: SocketAddr) -> io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// A kubeconfig for a plain-HTTP server at `url` (kubectl and kube-rs accept `http://`).
pub fn kubeconfig(url: &str) -> String {
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: loadgen
  cluster:
    server: {url}
contexts:
- name: loadgen
  context:
    cluster: loadgen
    user: loadgen
current-context: loadgen
users:
- name: loadgen
  user: {{}}
"
    )
}

/// `loadgen serve`: serves until Ctrl-C.
pub fn main(args: ServeArgs) -> ExitCode {
    let spec = match args.pods.spec() {
        Ok(spec) => spec,
        Err(e) => {
            eprintln!("loadgen serve: {e}");
            return ExitCode::from(2);
        }
    };
    let config = ServeConfig {
        workload: spec,
        pod_profile: args.pod_profile,
        rate: args.rate,
        addr: args.addr,
        window: args.window,
        bookmark_interval: Duration::from_secs_f64(args.bookmark_seconds),
        record_publications: false,
        hold_churn: false,
        faults: args.faults,
        limits: Limits {
            slow_watcher_events: args.slow_watcher_events.unwrap_or(args.window as u64),
            header_read_timeout: Duration::from_secs_f64(args.header_read_timeout),
            ..Limits::for_window(args.window)
        },
        too_large_wait: DEFAULT_TOO_LARGE_WAIT,
        publish_interval: args.publish_interval,
        writes: args.writes,
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("loadgen serve: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(serve(config, args.kubeconfig))
}

async fn wait_for_ctrl_c() {
    if let Err(e) = tokio::signal::ctrl_c().await {
        // Without a signal handler nothing could stop the server but a kill: say so, and keep
        // serving until then.
        eprintln!("loadgen serve: cannot listen for Ctrl-C ({e}); stop it with a kill");
        std::future::pending::<()>().await;
    }
}

/// What a server serves, in one line.
fn workload_label(config: &ServeConfig) -> String {
    format!(
        "{} keys={} events={} seed={} pods={} rate={}/s window={}",
        config.workload.workload,
        config.workload.keys,
        config.workload.events,
        config.workload.seed,
        config.pod_profile,
        config.rate,
        config.window
    )
}

/// `serve CPU X s, Y µs per event` since `probe`, for `events` events.
fn cpu_per_event(probe: &crate::measure::cpu::CpuProbe, events: u64) -> String {
    match probe.finish() {
        Some(cpu) if events > 0 => format!(
            "serve CPU {:.2} s, {:.2} µs per event",
            cpu.as_secs_f64(),
            cpu.as_secs_f64() * 1e6 / events as f64
        ),
        Some(cpu) => format!("serve CPU {:.2} s", cpu.as_secs_f64()),
        None => "serve CPU unknown (no /proc/self/stat)".to_owned(),
    }
}

async fn serve(config: ServeConfig, kubeconfig_path: Option<PathBuf>) -> ExitCode {
    let label = workload_label(&config);
    let server = match Server::start(config).await {
        Ok(server) => server,
        Err(e) => {
            eprintln!("loadgen serve: {e}");
            return ExitCode::FAILURE;
        }
    };
    match &kubeconfig_path {
        Some(path) => {
            if let Err(e) = std::fs::write(path, server.kubeconfig()) {
                eprintln!("loadgen serve: cannot write {}: {e}", path.display());
                return ExitCode::FAILURE;
            }
            eprintln!("loadgen serve: kubeconfig written to {}", path.display());
        }
        None => print!("{}", server.kubeconfig()),
    }
    eprintln!(
        "loadgen serve: {label}: {} pods at resourceVersion {}, listening on {} (Ctrl-C stops)",
        server.initial_pods(),
        server.store().resource_version(),
        server.url()
    );
    // The server's own cost: what it spends per event it serves, from here on (generating the
    // workload is not counted).
    let cpu = crate::measure::cpu::CpuProbe::start();
    tokio::select! {
        summary = server.churn_finished() => {
            eprintln!(
                "loadgen serve: churn done: {} events in {:.1} s, {} pods at resourceVersion {}; {}; still serving (Ctrl-C stops)",
                summary.events, summary.seconds, summary.pods, summary.resource_version,
                cpu_per_event(&cpu, summary.events)
            );
            wait_for_ctrl_c().await;
        }
        _ = wait_for_ctrl_c() => {}
    }
    let events = server.store().resource_version() - server.initial_resource_version();
    eprintln!(
        "loadgen serve: stopping; {}; faults: {}",
        cpu_per_event(&cpu, events),
        server.faults()
    );
    match server.stop().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen serve: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::parse_publish_interval_ms;

    #[test]
    fn a_publication_interval_is_milliseconds_from_0_to_1000() {
        assert_eq!(parse_publish_interval_ms("0"), Ok(Duration::ZERO));
        assert_eq!(parse_publish_interval_ms("1"), Ok(Duration::from_millis(1)));
        assert_eq!(
            parse_publish_interval_ms("0.5"),
            Ok(Duration::from_micros(500))
        );
        assert_eq!(
            parse_publish_interval_ms("1000"),
            Ok(Duration::from_secs(1))
        );
        for bad in ["-1", "1001", "x", "", "NaN"] {
            let error = parse_publish_interval_ms(bad).expect_err(bad);
            assert!(error.contains("not a publication interval"), "{error}");
        }
    }
}
