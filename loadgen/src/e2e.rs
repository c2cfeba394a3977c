//! `loadgen e2e` (feature `wire`): real clients over the wire against `loadgen serve`.
//!
//! For each client asked for, a fresh in-process server churns the same workload (same seed:
//! the same stream of events) on loopback, and the client lists and watches it through kube-rs:
//! (a) `kcache`: kcache's `SharedInformer` through its kube-rs adapter (`KubeListerWatcher`),
//! (b) `kube-rs`: kube-rs' own `watcher` + `reflector`. The clients run one after the other in
//! this process, not in processes of their own: the peak memory figure is this process's
//! growth while the client ran, so it includes the server's own work during the churn.
//!
//! Reported per client: watch events received and handler events applied (and per second, over
//! the churn), lag from the event's publication on the server to the handler (an upper bound:
//! the server's resource version is sampled about every millisecond, and the lag counts from
//! the last sample before the event's version, so it is over by at most that period), peak
//! memory, how long the cache took to match after the churn, and the verdict: the client's
//! final cache equals the server's final state.

use std::collections::BTreeMap;
use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use hdrhistogram::Histogram;
use k8s_openapi::api::core::v1::Pod;
use kcache::informer::{
    kube_key_fn, Error, KubeListerWatcher, ListOptions, ListerWatcher, Page, SharedInformer,
    Versioned, WatchEvent, WatchOptions, WatchStream,
};
use kcache::{DeltaObject, EventHandler};
use kube::api::Api;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Client, Config, ResourceExt};

use crate::rss::RssProbe;
use crate::serve::store::Store;
use crate::serve::{ServeConfig, Server, DEFAULT_WINDOW};
use crate::workload::{Workload, WorkloadSpec};

/// Which clients to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientChoice {
    /// kcache's SharedInformer through its kube-rs adapter.
    Kcache,
    /// kube-rs' own watcher + reflector.
    #[value(name = "kube-rs")]
    KubeRs,
    /// Both, one after the other.
    All,
}

/// Arguments of `loadgen e2e`.
#[derive(Debug, Clone, clap::Args)]
pub struct E2eArgs {
    /// The workload whose events churn the pods (W4 and W5 churn like W1).
    #[arg(long, default_value = "w1")]
    pub workload: Workload,
    /// Offered rate of churn, in events per second.
    #[arg(long, value_parser = parse_rate)]
    pub rate: f64,
    /// Which client(s) to run.
    #[arg(long, value_enum, default_value = "all")]
    pub client: ClientChoice,
    /// Keys (pods) of the workload [default: the workload's K].
    #[arg(long)]
    pub keys: Option<usize>,
    /// Churn events [default: the workload's E].
    #[arg(long)]
    pub events: Option<usize>,
    /// The server's window of recent events (older resource versions get 410 Expired).
    #[arg(long, default_value_t = DEFAULT_WINDOW)]
    pub window: usize,
    /// The workload's seed.
    #[arg(long, default_value_t = crate::workload::DEFAULT_SEED)]
    pub seed: u64,
    /// Give up on a client whose cache does not match this many seconds after the churn.
    #[arg(long, default_value_t = 60.0)]
    pub settle_seconds: f64,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!(
            "{s:?} is not a rate: expected events per second, a number above 0"
        )),
    }
}

/// What one client did.
#[derive(Debug, Clone)]
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
    /// Peak memory growth while the client ran, bytes.
    pub peak_bytes: Option<u64>,
    /// Seconds from the end of the churn until the cache matched (or until giving up).
    pub settle_seconds: f64,
    /// Whether the cache ended equal to the server's final state.
    pub ok: bool,
    /// Pods in the server's final state and in the client's cache.
    pub pods: (usize, usize),
}

/// `loadgen e2e`.
pub fn main(args: E2eArgs) -> ExitCode {
    if args.window == 0 || !(args.settle_seconds.is_finite() && args.settle_seconds > 0.0) {
        eprintln!("loadgen e2e: --window and --settle-seconds must be above 0");
        return ExitCode::from(2);
    }
    let mut spec = WorkloadSpec::new(args.workload).seed(args.seed);
    if let Some(keys) = args.keys {
        if keys == 0 || keys > u32::MAX as usize {
            eprintln!("loadgen e2e: --keys must be between 1 and {}", u32::MAX);
            return ExitCode::from(2);
        }
        spec = spec.keys(keys);
    }
    if let Some(events) = args.events {
        spec = spec.events(events);
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("loadgen e2e: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let clients: &[ClientChoice] = match args.client {
        ClientChoice::All => &[ClientChoice::Kcache, ClientChoice::KubeRs],
        ClientChoice::Kcache => &[ClientChoice::Kcache],
        ClientChoice::KubeRs => &[ClientChoice::KubeRs],
    };
    let settle = Duration::from_secs_f64(args.settle_seconds);
    let mut reports = Vec::new();
    for &client in clients {
        let mut config = ServeConfig::new(spec, args.rate);
        config.window = args.window;
        config.bookmark_interval = Duration::from_secs(1);
        match runtime.block_on(run_client(client, config, settle)) {
            Ok(report) => reports.push(report),
            Err(e) => {
                eprintln!("loadgen e2e: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    print_reports(&reports, args.rate);
    if reports.iter().all(|r| r.ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn print_reports(reports: &[ClientReport], rate: f64) {
    println!(
        "{:<8} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8}  verdict",
        "client",
        "received",
        "recv/s",
        "applied",
        "applied/s",
        "lag p50",
        "lag p99",
        "lag max",
        "peak MB",
        "settle"
    );
    for r in reports {
        let per_s = |n: u64| n as f64 / r.churn_seconds.max(1e-9);
        let peak = r
            .peak_bytes
            .map_or("n/a".to_owned(), |b| format!("{:.1}", b as f64 / 1e6));
        let verdict = if r.ok {
            "ok".to_owned()
        } else {
            format!("MISMATCH ({} pods served, {} cached)", r.pods.0, r.pods.1)
        };
        println!(
            "{:<8} {:>10} {:>10.0} {:>10} {:>10.0} {:>7}µs {:>7}µs {:>7}µs {:>9} {:>7.2}s  {verdict}",
            r.client,
            r.received,
            per_s(r.received),
            r.applied,
            per_s(r.applied),
            r.lag_us.0,
            r.lag_us.1,
            r.lag_us.2,
            peak,
            r.settle_seconds,
        );
    }
    println!(
        "(offered {rate:.0} events/s; per second: over the churn's duration on the server; lag: \
         publication to handler, an upper bound over by at most ~1 ms of sampling; clients ran \
         one after the other in this process, each against a fresh server with the same events)"
    );
}

/// The server's resource version, sampled about every millisecond: when each version was
/// published, within one sampling period.
#[derive(Debug, Default)]
struct Timeline {
    samples: Mutex<Vec<(u64, Instant)>>,
}

impl Timeline {
    /// Samples `store` until `done`.
    async fn sample(self: Arc<Self>, store: Arc<Store>, done: Arc<AtomicBool>) {
        while !done.load(Ordering::Relaxed) {
            let sample = (store.resource_version(), Instant::now());
            lock(&self.samples).push(sample);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The last moment `rv` was seen not yet published: the lag measured from it is an upper
    /// bound, over by at most one sampling period. `None` if `rv` was published before the
    /// sampling began.
    fn not_yet_published(&self, rv: u64) -> Option<Instant> {
        let samples = lock(&self.samples);
        let i = samples.partition_point(|&(at, _)| at < rv);
        i.checked_sub(1).map(|i| samples[i].1)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What a client's handler saw: (resource version, when), for the lag.
#[derive(Debug, Default)]
struct Seen {
    events: Mutex<Vec<(u64, Instant)>>,
}

impl Seen {
    fn record(&self, pod: &Pod) {
        if let Ok(rv) = Versioned::resource_version(pod).parse::<u64>() {
            lock(&self.events).push((rv, Instant::now()));
        }
    }
}

struct Handler(Arc<Seen>);

impl EventHandler<Pod> for Handler {
    fn on_add(&mut self, obj: &Arc<Pod>, is_in_initial_list: bool) {
        if !is_in_initial_list {
            self.0.record(obj);
        }
    }

    fn on_update(&mut self, _old: &Arc<Pod>, new: &Arc<Pod>) {
        self.0.record(new);
    }

    fn on_delete(&mut self, obj: &DeltaObject<Pod>) {
        if let Some(obj) = obj.object() {
            self.0.record(obj);
        }
    }
}

/// The adapter, counting the object events its watches deliver.
struct Counting {
    inner: KubeListerWatcher<Pod>,
    received: Arc<AtomicU64>,
}

impl ListerWatcher<Pod> for Counting {
    fn list(&self, options: ListOptions) -> impl Future<Output = Result<Page<Pod>, Error>> + Send {
        self.inner.list(options)
    }

    fn watch(
        &self,
        options: WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<Pod>, Error>> + Send {
        let received = Arc::clone(&self.received);
        let watch = self.inner.watch(options);
        async move {
            let stream: WatchStream<Pod> = watch
                .await?
                .inspect(move |event| {
                    if let Ok(
                        WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_),
                    ) = event
                    {
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .boxed();
            Ok(stream)
        }
    }
}

/// Reads a client's cache as `namespace/name` → resource version.
type ReadCache = Box<dyn Fn() -> BTreeMap<String, String> + Send>;
/// Stops a client.
type Stop = Box<dyn FnOnce() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

fn state_of<'a>(pods: impl Iterator<Item = &'a Pod>) -> BTreeMap<String, String> {
    pods.map(|p| {
        (
            format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
            Versioned::resource_version(p).to_owned(),
        )
    })
    .collect()
}

fn server_state(server: &Server) -> BTreeMap<String, String> {
    server
        .store()
        .snapshot(None)
        .pods
        .iter()
        .map(|p| {
            (
                format!("{}/{}", p.namespace, p.name),
                p.resource_version.to_string(),
            )
        })
        .collect()
}

async fn run_client(
    client: ClientChoice,
    config: ServeConfig,
    settle: Duration,
) -> Result<ClientReport, String> {
    let server = Server::start(config)
        .await
        .map_err(|e| format!("cannot start the server: {e}"))?;
    let kube_client = Client::try_from(Config::new(
        server
            .url()
            .parse()
            .map_err(|e| format!("the server's url: {e}"))?,
    ))
    .map_err(|e| format!("cannot make a kube client: {e}"))?;
    let api: Api<Pod> = Api::all(kube_client);
    let timeline = Arc::new(Timeline::default());
    let done = Arc::new(AtomicBool::new(false));
    let sampler =
        tokio::spawn(Arc::clone(&timeline).sample(Arc::clone(server.store()), Arc::clone(&done)));
    let seen = Arc::new(Seen::default());
    let received = Arc::new(AtomicU64::new(0));
    let probe = RssProbe::start();

    // Each client: something that reads its cache as a state, and a way to stop it.
    let (name, read_cache, stop): (&'static str, ReadCache, Stop) = match client {
        ClientChoice::Kcache => {
            let lw = Counting {
                inner: KubeListerWatcher::new(api),
                received: Arc::clone(&received),
            };
            let informer = Arc::new(SharedInformer::builder(lw, kube_key_fn::<Pod>()).build());
            informer
                .add_event_handler(Handler(Arc::clone(&seen)))
                .map_err(|e| format!("kcache: {e}"))?;
            informer.start().map_err(|e| format!("kcache: {e}"))?;
            let reader = Arc::clone(&informer);
            (
                "kcache",
                Box::new(move || state_of(reader.store().list().iter().map(|p| &**p))),
                Box::new(move || Box::pin(async move { informer.shutdown().await })),
            )
        }
        ClientChoice::KubeRs => {
            let (reader, writer) = reflector::store::<Pod>();
            let seen = Arc::clone(&seen);
            let received = Arc::clone(&received);
            let task = tokio::spawn(async move {
                let mut stream = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .reflect(writer)
                    .boxed();
                while let Some(event) = stream.next().await {
                    // Errors (a 410 among them) make the watcher relist on its next poll.
                    if let Ok(watcher::Event::Apply(pod) | watcher::Event::Delete(pod)) = event {
                        received.fetch_add(1, Ordering::Relaxed);
                        seen.record(&pod);
                    }
                }
            });
            (
                "kube-rs",
                Box::new(move || state_of(reader.state().iter().map(|p| &**p))),
                Box::new(move || {
                    Box::pin(async move {
                        task.abort();
                        let _ = task.await;
                    })
                }),
            )
        }
        ClientChoice::All => unreachable!("main splits `all` into the two clients"),
    };

    let summary = server.churn_finished().await;
    let churn_end = Instant::now();
    let expected = server_state(&server);
    let mut cache = read_cache();
    while cache != expected && churn_end.elapsed() < settle {
        tokio::time::sleep(Duration::from_millis(10)).await;
        cache = read_cache();
    }
    let settle_seconds = churn_end.elapsed().as_secs_f64();
    let peak_bytes = probe.finish().map(|(bytes, _)| bytes);
    done.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    stop().await;

    // Up to an hour in microseconds; a longer lag is clamped to it.
    let mut lags = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
        .map_err(|e| format!("histogram: {e}"))?;
    for &(rv, at) in lock(&seen.events).iter() {
        if let Some(published) = timeline.not_yet_published(rv) {
            let us = at.saturating_duration_since(published).as_micros();
            lags.saturating_record(u64::try_from(us).unwrap_or(u64::MAX));
        }
    }
    let applied = lock(&seen.events).len() as u64;
    let report = ClientReport {
        client: name,
        received: received.load(Ordering::Relaxed),
        applied,
        churn_seconds: summary.seconds,
        lag_us: (
            lags.value_at_quantile(0.5),
            lags.value_at_quantile(0.99),
            lags.max(),
        ),
        peak_bytes,
        settle_seconds,
        ok: cache == expected,
        pods: (expected.len(), cache.len()),
    };
    server
        .stop()
        .await
        .map_err(|e| format!("stopping the server: {e}"))?;
    Ok(report)
}
