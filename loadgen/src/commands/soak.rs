//! `loadgen soak`: the whole pipeline for a long time, with faults, watching for what only
//! time shows (docs/soak.md): `serve` in this process → kcache's informer over loopback HTTP
//! (`KubeListerWatcher`) → a handler that enqueues each key into a workqueue → worker threads
//! that reconcile it against the informer's store, plus a ledger handler (per-handler
//! verdict). Faults from `serve`'s list are switched on at random for a few seconds at a time;
//! RSS, threads, open files, queue depths and lag are sampled every few seconds.
//!
//! The workload is generated whole before it is served, so a long soak runs it in segments:
//! when a segment's churn is over, the cache is checked against the server (a checkpoint),
//! and the server restarts without its state on the next segment (versions go back: the
//! informer relists on the 504 `ResourceVersionTooLarge`, one more fault survived).
//!
//! The verdict at the end: the informer's cache equals the server's state, the workers
//! reconciled every key at its last version, each handler's ledger holds, RSS after the
//! warm-up grew at most `--max-rss-growth`, and the thread and fd counts stayed flat.
//!
//! With `--kubeconfig FILE` the same pipeline runs against the API server the kubeconfig
//! names, `loadgen churn` children write, and nothing is injected ([`kubeconfig`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use kcache::informer::{kube_key_fn, Backoff, Error, KubeListerWatcher, SharedInformer, Versioned};
use kcache::workqueue::{ShardedQueue, WorkQueue};
use kcache::{DeltaObject, EventHandler};
use kube::api::Api;

use crate::args::parse_rate;
use crate::judging::handler_ledger::{Ledger, LedgerHandler};
use crate::reports::soak_report::{
    after_warmup, open_fds, rss_growth, soak_svg, spread, status_count, Sample,
};
use crate::serve::faults::{parse_duration, FaultPlan};
use crate::serve::{ServeConfig, Server};
use crate::sync::lock;
use workloads::{Workload, WorkloadSpec};

mod kubeconfig;

/// Arguments of `loadgen soak`.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// How long to run (`2m`, `1h`).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Duration,
    /// Offered churn rate, events per second.
    #[arg(long, value_parser = parse_rate)]
    pub rate: f64,
    /// Pods.
    #[arg(long, default_value_t = 10_000)]
    pub keys: usize,
    /// How much of a real pod the server sends (docs/workloads.md, "Pod profiles"). Typical by
    /// default: a soak looks for memory that grows, and a cache of realistic pods is what a
    /// leak or fragmentation would show in (minimal pods understate the cache twentyfold).
    #[arg(long, default_value_t = workloads::PodProfile::Typical)]
    pub pod_profile: workloads::PodProfile,
    /// Events per segment [default: a minute of churn, at most 2,000,000].
    #[arg(long)]
    pub segment_events: Option<usize>,
    /// Worker threads reconciling keys.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Seconds between samples.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub sample_every: Duration,
    /// A random fault is switched on this often... [default: 20s]
    #[arg(long, value_parser = parse_duration)]
    pub fault_every: Option<Duration>,
    /// ...for this long [default: 5s].
    #[arg(long, value_parser = parse_duration)]
    pub fault_for: Option<Duration>,
    /// No faults (the restarts between segments still happen).
    #[arg(long)]
    pub no_faults: bool,
    /// Run against the API server this kubeconfig names instead of `serve` in this process
    /// (plain HTTP: `serve --writes`, or a cluster through `kubectl proxy`), with `loadgen
    /// churn` children writing the workload into `--namespace`, and no faults
    /// (docs/real-clusters.md, "`soak --kubeconfig`").
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// With `--kubeconfig`: the namespace the churn writes to and the informer watches
    /// [default: the kubeconfig context's].
    #[arg(long, requires = "kubeconfig")]
    pub namespace: Option<String>,
    /// With `--kubeconfig`: let the churn share its namespace with pods it did not create
    /// (they are never written; they are in the informer's cache and its verdict).
    #[arg(long, requires = "kubeconfig")]
    pub allow_foreign: bool,
    /// Samples before this are the warm-up, left out of the RSS slope [default: a sixth of
    /// the duration].
    #[arg(long, value_parser = parse_duration)]
    pub warmup: Option<Duration>,
    /// The largest RSS growth after the warm-up that passes, as a share.
    #[arg(long, default_value_t = 0.05)]
    pub max_rss_growth: f64,
    /// How long the cache may take to match the server at a checkpoint and at the end.
    /// The default outlasts the reflector's longest wait: under faults every few seconds its
    /// backoff (client-go's) never gets two quiet minutes to reset, so a fault just before a
    /// checkpoint can cost a 30 s wait stretched by up to 100% jitter, then a relist that
    /// meets the restarted server's 3 s wait for a too-new version.
    #[arg(long, default_value = "150s", value_parser = parse_duration)]
    pub settle: Duration,
    /// Where soak.md and soak.svg go.
    #[arg(long, default_value = "results")]
    pub out: PathBuf,
    /// The workload's and the fault schedule's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// The faults a soak switches on at random, each at a rate that hits within a few seconds.
/// `{page}` is a per-request share that strikes about one page of a full relist (see
/// [`page_share`]): a share per page, such as 30%, would fail every attempt at a list of
/// hundreds of pages for as long as it is on, which tests the backoff's ceiling, not recovery.
const FAULTS: &[&str] = &[
    "reset-mid-chunk=0.02",
    "truncate-frame=0.02",
    "oversized-frame=0.002",
    "big-object=0.02",
    "too-many-requests={page}",
    "list-500={page}",
    "expire-continue={page}",
    "stall",
];

/// One of these is on during the relist after each segment's restart.
const RELIST_FAULTS: &[&str] = &[
    "list-500={page}",
    "expire-continue={page}",
    "too-many-requests={page}",
];

/// The share of requests a list fault strikes: about one page of a full list of `keys`
/// objects (at most 30%, for small lists).
fn page_share(keys: usize) -> f64 {
    let pages = keys.div_ceil(kcache::informer::DEFAULT_PAGE_SIZE).max(1);
    (1.0 / pages as f64).min(0.3)
}

/// `fault` with its `{page}` share filled in.
fn filled(fault: &str, keys: usize) -> String {
    fault.replace("{page}", &format!("{:.4}", page_share(keys)))
}

/// A filled-in fault, parsed, with its coin flips seeded.
fn fault_plan(fault: &str, seed: u64) -> FaultPlan {
    let mut plan: FaultPlan = fault.parse().expect("the soak's plans parse");
    plan.seed = seed;
    plan
}

/// How much longer than `--fault-for` a relist fault stays on.
const RELIST_WINDOW: Duration = Duration::from_secs(10);

/// The informer's backoff in a soak: client-go's shape (800 ms, doubling, jitter 100%) with a
/// 5 s ceiling and a reset after 30 quiet seconds, where client-go's are 30 s and 2 minutes.
///
/// Why: a soak restarts the server every segment (about a minute) and switches a fault on every
/// `--fault-every`, so client-go's backoff never sees two quiet minutes and stays at its
/// ceiling: each restart then costs two waits of up to 60 s (the refused re-watch, then the
/// relist after the 504), and a first hour-long run at 30,000 events/s spent 87% of its
/// samples with the informer still waiting, streaming almost nothing. A soak is about what
/// time does to memory and to correctness under load, so the informer must spend its time
/// streaming; client-go's own schedule is the fault tests' subject (`serve_faults`).
const SOAK_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(800),
    max: Duration::from_secs(5),
    factor: 2.0,
    jitter: 1.0,
    reset_after: Duration::from_secs(30),
};

/// How long a soak stall lasts.
const STALL: Duration = Duration::from_secs(3);
/// Tolerated spread of the thread count after the warm-up (the blocking pool comes and goes).
const THREAD_SPREAD: u64 = 8;
/// Tolerated spread of open fds after the warm-up (connections cut by faults come back).
const FD_SPREAD: u64 = 64;

/// The handler the controller registers: every notification enqueues its key.
struct Enqueue(Arc<ShardedQueue>);

impl EventHandler<Pod> for Enqueue {
    fn on_add(&mut self, obj: &Arc<Pod>, _initial: bool) {
        if let Ok(key) = kcache::informer::kube_key(&**obj) {
            self.0.add(key);
        }
    }
    fn on_update(&mut self, _old: &Arc<Pod>, new: &Arc<Pod>) {
        if let Ok(key) = kcache::informer::kube_key(&**new) {
            self.0.add(key);
        }
    }
    fn on_delete(&mut self, obj: &DeltaObject<Pod>) {
        let key = match (obj.tombstone(), obj.object()) {
            (Some(t), _) => Some(t.key.clone()),
            (None, Some(o)) => kcache::informer::kube_key(&**o).ok(),
            (None, None) => None,
        };
        if let Some(key) = key {
            self.0.add(key);
        }
    }
}

/// `loadgen soak`.
pub fn main(args: SoakArgs) -> ExitCode {
    if args.kubeconfig.is_some() {
        // A real API server takes no faults from us: say so rather than run without them.
        let given: Vec<&str> = [
            ("--fault-every", args.fault_every.is_some()),
            ("--fault-for", args.fault_for.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect();
        if !given.is_empty() {
            eprintln!(
                "loadgen soak: {} cannot be used with --kubeconfig: faults cannot be injected into a server loadgen does not run; `soak --kubeconfig` runs without faults (drop {})",
                given.join(" and "),
                if given.len() > 1 { "them" } else { "it" }
            );
            return ExitCode::from(2);
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("loadgen soak: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match args.kubeconfig.clone() {
        Some(path) => runtime.block_on(kubeconfig::soak(args, path)),
        None => runtime.block_on(soak(args)),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("loadgen soak: {e}");
            ExitCode::FAILURE
        }
    }
}

fn sample(
    start: Instant,
    informer_queue: usize,
    workqueue: usize,
    lag: u64,
    faults: u64,
) -> Sample {
    Sample {
        seconds: start.elapsed().as_secs_f64(),
        rss: crate::measure::rss::status_field_bytes("VmRSS").unwrap_or(0),
        threads: status_count("Threads").unwrap_or(0),
        fds: open_fds().unwrap_or(0),
        informer_queue,
        workqueue,
        lag_events: lag,
        faults,
    }
}

/// The start of a progress line on stderr, up to the lag's number (whose unit follows).
fn progress_start(s: &Sample) -> String {
    format!(
        "soak {:>6.0}s: rss {:.1} MiB, threads {}, fds {}, queues {}/{}, lag {}",
        s.seconds,
        s.rss as f64 / 1048576.0,
        s.threads,
        s.fds,
        s.informer_queue,
        s.workqueue,
        s.lag_events,
    )
}

/// Events the informer has not seen: after a restart without state its version is ahead of
/// the server's until it relists, and it has seen none of the new server's events.
fn lag(server_rv: u64, informer_rv: &str) -> u64 {
    let informer_rv: u64 = informer_rv.parse().unwrap_or(0);
    if informer_rv > server_rv {
        server_rv
    } else {
        server_rv - informer_rv
    }
}

/// `namespace/name` → resource version of pods.
fn state_of(pods: &[Arc<Pod>]) -> BTreeMap<String, u64> {
    pods.iter()
        .filter_map(|p| {
            let key = kcache::informer::kube_key(&**p).ok()?;
            Some((key.as_str().to_string(), p.resource_version().parse().ok()?))
        })
        .collect()
}

/// What the workers last reconciled, by key: the version they found, `None` for absent.
type Reconciled = Arc<Mutex<HashMap<String, Option<u64>>>>;

/// Keys whose last reconciliation does not match `expected`.
fn unreconciled(reconciled: &Reconciled, expected: &BTreeMap<String, u64>) -> usize {
    let reconciled = lock(reconciled);
    let wrong_present = expected
        .iter()
        .filter(|(k, rv)| reconciled.get(*k).copied().flatten() != Some(**rv))
        .count();
    let wrong_absent = reconciled
        .iter()
        .filter(|(k, rv)| rv.is_some() && !expected.contains_key(*k))
        .count();
    wrong_present + wrong_absent
}

/// The informer a soak runs.
type Informer = SharedInformer<
    Pod,
    KubeListerWatcher<Pod>,
    kcache::sharded::DeltaFifo<Pod>,
    kcache::sharded::IndexedStore<Pod>,
>;

/// The controller under soak: the informer (not started), its two handlers (the workqueue's
/// and the ledger), the workqueue and the workers reconciling from it.
struct Pipeline {
    informer: Informer,
    queue: Arc<ShardedQueue>,
    ledger: Arc<Mutex<Ledger>>,
    reconciled: Reconciled,
    reconciles: Arc<AtomicU64>,
    /// The watch error handler's counts, by kind.
    errors: Arc<Mutex<BTreeMap<String, u64>>>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Pipeline {
    /// The pipeline over `api`, with `workers` worker threads (at least one).
    fn build(api: Api<Pod>, workers: usize) -> Result<Self, String> {
        let errors: Arc<Mutex<BTreeMap<String, u64>>> = Arc::default();
        let informer = SharedInformer::builder(KubeListerWatcher::new(api), kube_key_fn::<Pod>())
            .backoff(SOAK_BACKOFF)
            .watch_error_handler({
                let errors = Arc::clone(&errors);
                Arc::new(move |e: &Error| {
                    let kind = match e {
                        Error::Api(s) => format!("{} {}", s.code, s.reason),
                        Error::Transport(_) => "transport".into(),
                        Error::Decode(_) => "decode".into(),
                        Error::VeryShortWatch => "very short watch".into(),
                        Error::Queue(_) => "queue".into(),
                    };
                    *lock(&errors).entry(kind).or_default() += 1;
                })
            })
            .build();
        let queue = Arc::new(ShardedQueue::with_default_shards());
        informer
            .add_event_handler(Enqueue(Arc::clone(&queue)))
            .map_err(|e| e.to_string())?;
        let ledger_handler = LedgerHandler::new(kube_key_fn::<Pod>());
        let ledger: Arc<Mutex<Ledger>> = ledger_handler.ledger();
        informer
            .add_event_handler(ledger_handler)
            .map_err(|e| e.to_string())?;

        let reconciled: Reconciled = Arc::default();
        let reconciles = Arc::new(AtomicU64::new(0));
        let workers: Vec<_> = (0..workers.max(1))
            .map(|n| {
                let (queue, store, reconciled, reconciles) = (
                    Arc::clone(&queue),
                    informer.store(),
                    Arc::clone(&reconciled),
                    Arc::clone(&reconciles),
                );
                std::thread::Builder::new()
                    .name(format!("soak-worker-{n}"))
                    .spawn(move || {
                        while let Ok(key) = queue.get() {
                            let found = store
                                .get_by_key(&key)
                                .and_then(|p| p.resource_version().parse().ok());
                            lock(&reconciled).insert(key.as_str().to_string(), found);
                            // Relaxed: a count for the report.
                            reconciles.fetch_add(1, Ordering::Relaxed);
                            let _ = queue.done(&key);
                        }
                    })
                    .map_err(|e| e.to_string())
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            informer,
            queue,
            ledger,
            reconciled,
            reconciles,
            errors,
            workers,
        })
    }

    /// Starts the informer and waits until it has synced, at most `limit`.
    async fn start(&self, limit: Duration) -> Result<(), String> {
        self.informer.start().map_err(|e| e.to_string())?;
        let start = Instant::now();
        while !self.informer.has_synced() {
            if start.elapsed() > limit {
                return Err("the informer never synced".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Whether the cache equals `expected`, the workqueue is idle and the workers reconciled
    /// every key at its version.
    fn matches(&self, expected: &BTreeMap<String, u64>) -> bool {
        state_of(&self.informer.store().list()) == *expected
            && self.queue.len() == 0
            && self.queue.processing_len() == 0
            && unreconciled(&self.reconciled, expected) == 0
    }

    /// Stops the informer, the workqueue and the workers.
    async fn shutdown(self) {
        self.informer.shutdown().await;
        self.queue.shut_down();
        for worker in self.workers {
            let _ = worker.join();
        }
    }
}

/// Judges the process over the samples after the warm-up: RSS growth, threads and fds flat.
/// Pushes what failed onto `failures`; returns the report's rows for them.
fn judge_process(
    samples: &[Sample],
    warmup: Duration,
    max_rss_growth: f64,
    failures: &mut Vec<String>,
) -> Vec<(String, String)> {
    let steady = after_warmup(samples, warmup);
    let growth = rss_growth(steady);
    let thread_spread = spread(steady, |s| s.threads);
    let fd_spread = spread(steady, |s| s.fds);
    match growth {
        Some(g) if g > max_rss_growth => failures.push(format!(
            "RSS grew {:.1}% after the warm-up (at most {:.1}%)",
            g * 100.0,
            max_rss_growth * 100.0
        )),
        None => failures.push(format!(
            "fewer than 3 samples after the warm-up ({:?}): run longer or sample more often",
            warmup
        )),
        _ => {}
    }
    if thread_spread > THREAD_SPREAD {
        failures.push(format!("the thread count moved by {thread_spread}"));
    }
    if fd_spread > FD_SPREAD {
        failures.push(format!("the open fd count moved by {fd_spread}"));
    }
    let first = steady.first().map_or(0.0, |s| s.rss as f64 / 1048576.0);
    let last = steady.last().map_or(0.0, |s| s.rss as f64 / 1048576.0);
    vec![
        (
            format!("RSS after the warm-up ({warmup:?})"),
            format!(
                "{first:.1} → {last:.1} MiB, fitted growth {}",
                growth.map_or("n/a".into(), |g| format!("{:+.2}%", g * 100.0))
            ),
        ),
        (
            "threads (spread after warm-up)".into(),
            format!(
                "{} ({thread_spread})",
                steady.last().map_or(0, |s| s.threads)
            ),
        ),
        (
            "open fds (spread after warm-up)".into(),
            format!("{} ({fd_spread})", steady.last().map_or(0, |s| s.fds)),
        ),
    ]
}

/// Writes `soak.md` (the verdict, `rows`, the command, the machine, `server`) and `soak.svg`
/// into `out`, prints the verdict, and returns whether it is ok.
fn write_report(
    out: &std::path::Path,
    samples: &[Sample],
    warmup: Duration,
    server: &str,
    rows: &[(String, String)],
    failures: &[String],
) -> Result<bool, String> {
    let ok = failures.is_empty();
    let verdict = if ok {
        "ok".to_string()
    } else {
        failures.join("; ")
    };
    let svg = out.join("soak.svg");
    soak_svg(samples, warmup, &svg).map_err(|e| e.to_string())?;
    let mut md = String::new();
    let _ = writeln!(md, "# Soak\n");
    let _ = writeln!(
        md,
        "`cargo run --release -p loadgen --features wire -- {}`\n",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    let machine = crate::measure::machine::Machine::detect();
    let _ = writeln!(
        md,
        "Machine: {} ({} cores), {}, {}, commit {}, {} build, allocator {}.\n",
        machine.cpu.as_deref().unwrap_or("unknown CPU"),
        machine.cores,
        machine.os,
        machine.rustc.as_deref().unwrap_or("rustc ?"),
        machine.commit.as_deref().unwrap_or("?"),
        machine.profile,
        machine.allocator
    );
    let _ = writeln!(md, "Server: {server}.\n");
    let _ = writeln!(md, "![RSS and lag over time](soak.svg)\n");
    let _ = writeln!(md, "| figure | value |\n|---|---|");
    let _ = writeln!(md, "| verdict | {verdict} |");
    for (figure, value) in rows {
        let _ = writeln!(md, "| {figure} | {value} |");
    }
    let md_path = out.join("soak.md");
    std::fs::write(&md_path, &md)
        .map_err(|e| format!("cannot write {}: {e}", md_path.display()))?;
    eprintln!(
        "loadgen soak: {verdict}; wrote {} and {}",
        md_path.display(),
        svg.display()
    );
    Ok(ok)
}

async fn soak(args: SoakArgs) -> Result<bool, String> {
    let fault_every = args.fault_every.unwrap_or(Duration::from_secs(20));
    let fault_for = args.fault_for.unwrap_or(Duration::from_secs(5));
    let segment_events = args
        .segment_events
        .unwrap_or_else(|| ((args.rate * 60.0) as usize).clamp(1_000, 2_000_000));
    let warmup = args.warmup.unwrap_or(args.duration / 6);
    let spec = WorkloadSpec::new(Workload::W1)
        .keys(args.keys)
        .events(segment_events)
        .seed(args.seed);
    let mut config = ServeConfig::new(spec, args.rate);
    config.pod_profile = args.pod_profile;
    config.hold_churn = true;
    let mut server = Server::start(config)
        .await
        .map_err(|e| format!("serve: {e}"))?;

    // kube-rs' own retries would hide 429s and 504s from the reflector (docs/informer.md).
    let mut kube_config = kube::Config::new(server.url().parse().map_err(|e| format!("{e}"))?);
    kube_config.default_retry = false;
    let client = kube::Client::try_from(kube_config).map_err(|e| e.to_string())?;
    let pipeline = Pipeline::build(Api::<Pod>::all(client), args.workers)?;
    let start = Instant::now();
    pipeline.start(args.settle).await?;
    let Pipeline {
        informer,
        queue,
        reconciled,
        reconciles,
        errors,
        ..
    } = &pipeline;
    server.release_churn();
    eprintln!(
        "loadgen soak: {} pods, {} events per segment at {}/s for {:?}, faults {}",
        args.keys,
        segment_events,
        args.rate,
        args.duration,
        if args.no_faults { "off" } else { "on" }
    );

    let mut rng = fastrand::Rng::with_seed(args.seed);
    let mut samples = Vec::new();
    let mut faults_tried: BTreeMap<String, u64> = BTreeMap::new();
    let mut checkpoints = Vec::new();
    let (mut next_sample, mut next_fault) = (Duration::ZERO, fault_every);
    let mut fault_off: Option<Duration> = None;
    let mut segment = 0u64;
    while start.elapsed() < args.duration {
        let now = start.elapsed();
        if now >= next_sample {
            // From now, not from the missed deadline: a checkpoint's settle does not sample,
            // and its missed samples are not made up in a burst.
            next_sample = now + args.sample_every;
            let faults = server.faults();
            let total = faults.resets
                + faults.truncated_frames
                + faults.oversized_frames
                + faults.big_objects
                + faults.stalled_chunks
                + faults.too_many_requests
                + faults.list_500s
                + faults.expired_continues
                + faults.slow_watchers_closed
                + faults.too_large_versions;
            let (server_rv, informer_rv) = (
                server.store().resource_version(),
                informer.last_sync_resource_version(),
            );
            let s = sample(
                start,
                informer.queued_keys(),
                queue.len(),
                lag(server_rv, &informer_rv),
                total,
            );
            eprintln!(
                "{} events (server at {}, informer at {:?}), {} reconciles, segment {segment}, \
                 faults {}, watch errors {:?}",
                progress_start(&s),
                server_rv,
                informer_rv,
                reconciles.load(Ordering::Relaxed),
                server.faults(),
                lock(errors)
            );
            samples.push(s);
        }
        if !args.no_faults {
            if fault_off.is_some_and(|off| now >= off) {
                server.set_faults(FaultPlan::default());
                fault_off = None;
            }
            if now >= next_fault {
                next_fault += fault_every;
                let fault = filled(FAULTS[rng.usize(..FAULTS.len())], args.keys);
                *faults_tried.entry(fault.clone()).or_default() += 1;
                if fault == "stall" {
                    server.stall_watches(STALL);
                } else {
                    server.set_faults(fault_plan(&fault, rng.u64(..)));
                    fault_off = Some(now + fault_for);
                }
            }
        }
        if server.churn_finished().now_or_never().is_some() {
            // A segment is over: a checkpoint, then the next segment on a server that lost
            // its state.
            server.set_faults(FaultPlan::default());
            fault_off = None;
            let ok = settle(&server, &pipeline, args.settle).await;
            checkpoints.push((start.elapsed().as_secs_f64(), ok));
            eprintln!(
                "soak: segment {segment} over, checkpoint {}",
                if ok { "ok" } else { "FAILED" }
            );
            segment += 1;
            server
                .restart_without_state(Duration::from_secs(1), args.seed + segment, false)
                .await
                .map_err(|e| format!("restart: {e}"))?;
            *faults_tried
                .entry("restart without state".into())
                .or_default() += 1;
            if !args.no_faults {
                // The relist that follows is when the list and request faults can bite: one of
                // them is on for it.
                let fault = filled(RELIST_FAULTS[rng.usize(..RELIST_FAULTS.len())], args.keys);
                *faults_tried.entry(fault.clone()).or_default() += 1;
                server.set_faults(fault_plan(&fault, rng.u64(..)));
                // The relist comes after the watch's 504 (3 s), a backoff and the list's own
                // 504 (3 s more): the fault stays on past it.
                fault_off = Some(start.elapsed() + fault_for + RELIST_WINDOW);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.set_faults(FaultPlan::default());
    server.stop_churn();
    let converged = settle(&server, &pipeline, args.settle).await;
    let expected = server.pod_versions();
    let cache = state_of(&informer.store().list());
    let unreconciled_keys = unreconciled(reconciled, &expected);
    let ledger_verdict = if segment > 0 {
        lock(&pipeline.ledger).judge_after_lost_state(&expected)
    } else {
        lock(&pipeline.ledger).judge(&expected)
    };
    let faults = server.faults();
    let errors = lock(errors).clone();
    let reconciles = reconciles.load(Ordering::Relaxed);

    pipeline.shutdown().await;
    server.stop().await.map_err(|e| format!("serve: {e}"))?;

    let mut failures = Vec::new();
    if !converged || cache != expected {
        failures.push(format!(
            "the cache ({} pods) does not equal the server ({} pods)",
            cache.len(),
            expected.len()
        ));
    }
    if unreconciled_keys > 0 {
        failures.push(format!(
            "{unreconciled_keys} keys not reconciled at their last version"
        ));
    }
    if let Err(verdict) = &ledger_verdict {
        failures.push(format!("the ledger handler: {verdict}"));
    }
    if checkpoints.iter().any(|(_, ok)| !ok) {
        failures.push("a segment checkpoint failed".into());
    }
    let process_rows = judge_process(&samples, warmup, args.max_rss_growth, &mut failures);
    let mut rows = vec![
        (
            "duration".to_string(),
            format!(
                "{:.0} s ({} segments of {segment_events} events at {}/s)",
                start.elapsed().as_secs_f64(),
                segment + 1,
                args.rate
            ),
        ),
        ("pods at the end".into(), expected.len().to_string()),
        ("reconciles".into(), reconciles.to_string()),
    ];
    rows.extend(process_rows);
    rows.extend([
        (
            "max lag".to_string(),
            format!(
                "{} events",
                samples.iter().map(|s| s.lag_events).max().unwrap_or(0)
            ),
        ),
        ("faults injected".into(), faults.to_string()),
        ("faults switched on".into(), format!("{faults_tried:?}")),
        (
            "errors the watch error handler saw".into(),
            format!("{errors:?}"),
        ),
        ("checkpoints (s, ok)".into(), format!("{checkpoints:?}")),
    ]);
    write_report(
        &args.out,
        &samples,
        warmup,
        "`serve` in this process, on loopback",
        &rows,
        &failures,
    )
}

/// Waits until the informer's cache equals the server's state, the workqueue is idle and the
/// workers reconciled every key at its version; false if `limit` passes first.
async fn settle(server: &Server, pipeline: &Pipeline, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if pipeline.matches(&server.pod_versions()) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_faults_strike_about_one_page_of_a_full_list() {
        // 100,000 pods are 200 pages of 500: one page in 200.
        assert_eq!(page_share(100_000), 1.0 / 200.0);
        // A small list would be struck on every page: at most 30%.
        assert_eq!(page_share(1_000), 0.3);
        assert_eq!(page_share(0), 0.3);
        assert_eq!(filled("list-500={page}", 100_000), "list-500=0.0050");
        assert_eq!(filled("stall", 100_000), "stall");
    }

    #[test]
    fn lag_after_a_restart_counts_the_new_servers_events() {
        assert_eq!(lag(1_000, "900"), 100);
        // The informer still holds the old server's version 5,000: it has seen none of the
        // new server's 1,000 events.
        assert_eq!(lag(1_000, "5000"), 1_000);
        assert_eq!(lag(1_000, ""), 1_000);
    }
}
