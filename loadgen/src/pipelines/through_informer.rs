//! `loadgen run --through informer`: a workload's events through the whole informer pipeline,
//! with a verdict per handler.
//!
//! The path: the producer thread writes the workload's events into an in-memory API server
//! ([`MemoryListerWatcher`]); a [`SharedInformer`] (its reflector lists and watches the
//! server, its consumers apply what they pop to the indexer) fans the notifications out to H
//! handlers, the last of which is slow (it spins a few microseconds per notification).
//!
//! - **The initial list.** The workload's initial population (W1, W2, W5: the first add of
//!   every key; W3: its first relist) is written into the server before the clock starts, so
//!   it is the informer's initial list. The churn starts once the informer has synced, which
//!   makes the initial-list flag exact: a key's first notification is `on_add(initial=true)`
//!   if and only if the key was in that list.
//! - **W3's relists** are real: at each relist of the workload the server goes down (the
//!   watch ends, every call is refused), performs the deletions the relist "missed" (so no
//!   watch sees them), scripts a `410 Expired` for the next watch, and comes back. The
//!   reflector's retried watch gets the 410, it lists again, and the `replace` turns the
//!   missing keys into tombstones. The producer waits for that list before it goes on.
//!   W3's resyncs are left out: the informer resyncs on its own timer (periods of a second
//!   or more), not on request.
//! - **Each handler** keeps what it heard per key and checks every notification as it comes
//!   ([`HandlerRecord`]): adds and deletes alternate, versions never go back, an update's
//!   `old` (and a delete's object) is the state it was last told, the initial flag is right.
//!   After the run, [`judge`] holds its final view to the server's final state.
//! - **Timing.** From the informer's start (the initial list) until every handler's view
//!   equals the final state; each handler's own time is reported too. Latency: from the
//!   producer's write into the server to the first (fast) handler's notification, on a
//!   sample of the events. In the report's row, `deltas` counts the first handler's
//!   notifications and `pops` is 0 (the informer does not expose its pops).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kcache::informer::{Backoff, SharedInformer, SharedInformerBuilder};
use kcache::{DeltaQueue, Indexer};
use kcache_sim::MemoryListerWatcher;

use crate::engines::{EngineConfig, EngineKind};
use crate::harness::driver::SHARDED_BATCH;
use crate::harness::informer_handlers::{
    recorders, AsyncRecorder, Delivery, InformerConfig, Progressing,
};
use crate::harness::pacing::record_pacing;
use crate::harness::server_feed::{
    millis, parse_version, produce, serve_initial, served_indexers, served_key_fn, server_views,
    Produced, ServedPod,
};
use crate::judging::informer_verdict::{handler_result, same_state, HandlerRecord, KeyView, Plan};
use crate::judging::verdict::Verdict;
use crate::measure::latency::new_histogram;
use crate::pipelines::bare::RunError;
use crate::progress::Progress;
use crate::result::{HandlerResult, InformerStats, LatencyUs, Meter, RunResult};
use crate::sync::lock;
use workloads::{Generated, Workload, NODE_INDEX};

/// A handler that hears nothing for this long, while its view is not final, has stalled.
const STALL: Duration = Duration::from_secs(60);

/// How a run's events reach the engine (`--through`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Through {
    /// The producer calls the queue; consumers apply pops to the indexer (the engines bare).
    #[default]
    Queue,
    /// Through an in-memory API server, the reflector and a shared informer with handlers.
    Informer,
}

/// What one registration's buffer saw in a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct BufferFigures {
    /// Its bound, in notifications (0: an inline registration, which has no buffer).
    pub bound: usize,
    /// The most notifications waiting for it at once.
    pub peak_pending: usize,
    /// How often a consumer waited for it (back-pressure).
    pub waits: u64,
    /// Notifications merged away while it lagged (when it coalesces).
    pub merged: u64,
}

/// What a run through the informer leaves behind.
#[derive(Debug)]
pub struct InformerFinished {
    /// Per handler: its record, and when its view became final (from the start).
    pub handlers: Vec<(HandlerRecord, Option<Duration>)>,
    /// Per handler, in the same order: what its buffer saw.
    pub buffers: Vec<BufferFigures>,
    /// The plan the run followed.
    pub plan: Arc<Plan>,
    /// The server's final state, by pod id.
    pub server_final: Vec<KeyView>,
    /// Failures of the run as a whole (the server or the informer's store off the model, a
    /// stall, the informer's own failure).
    pub failures: Vec<String>,
    /// From the informer's start until every handler's view was final.
    pub wall: Duration,
    /// Write-to-notification latency at the first handler, in nanoseconds.
    pub latency: Histogram<u64>,
    /// List and watch calls the server served, and errors the reflector reported.
    pub lists: u64,
    /// Watch calls.
    pub watches: u64,
    /// Errors reported to the watch error handler (the scripted outages and 410s among them).
    pub reflector_errors: u64,
    /// Scripted 410s no watch had received when the run ended (a relist that starts before
    /// the reflector reopened its watch leaves its 410 for a later watch).
    pub expired_watches_pending: u64,
    /// What the producer did beyond its writes: W3's resyncs left out (see the module docs),
    /// how long it waited for the reflector, how far behind its schedule it fell.
    pub produced: Produced,
}

/// The reflector's waits between failed attempts: short, so that a scripted outage costs the
/// run the pipeline's work and not client-go's 800 ms first wait.
fn loadgen_backoff() -> Backoff {
    Backoff {
        initial: Duration::from_millis(1),
        max: Duration::from_millis(20),
        factor: 2.0,
        jitter: 0.5,
        reset_after: Duration::from_secs(1),
    }
}

/// The builder of a run's informer on `server`: the served pods' indexes, the run's shards,
/// consumers and batch, the short backoff, and a watch error handler that counts into
/// `errors`.
pub(crate) fn informer_builder(
    server: &MemoryListerWatcher<ServedPod>,
    cfg: &EngineConfig,
    errors: &Arc<AtomicU64>,
) -> SharedInformerBuilder<ServedPod, MemoryListerWatcher<ServedPod>> {
    let errors = Arc::clone(errors);
    SharedInformer::builder(server.clone(), served_key_fn())
        .indexers(served_indexers())
        .shards(cfg.shards)
        .consumers(cfg.consumers)
        .batch(SHARDED_BATCH)
        .backoff(loadgen_backoff())
        .watch_error_handler(Arc::new(move |_| {
            errors.fetch_add(1, Ordering::Relaxed);
        }))
}

/// Runs `gen` through the informer pipeline on `engine`.
pub fn execute(
    engine: EngineKind,
    gen: &Generated,
    cfg: &EngineConfig,
    icfg: &InformerConfig,
    progress: &dyn Progress,
) -> Result<InformerFinished, RunError> {
    crate::harness::driver::prepare(gen)?;
    let plan = Arc::new(Plan::of(gen));
    let server = serve_initial(gen, plan.initial_ops).map_err(RunError::Informer)?;
    let errors = Arc::new(AtomicU64::new(0));
    let builder = informer_builder(&server, cfg, &errors);
    let mut done = match engine {
        EngineKind::Reference => drive(
            builder.build_reference(),
            &server,
            gen,
            &plan,
            cfg,
            icfg,
            progress,
        )?,
        EngineKind::Sharded => drive(builder.build(), &server, gen, &plan, cfg, icfg, progress)?,
    };
    done.reflector_errors = errors.load(Ordering::Relaxed);
    Ok(done)
}

/// The producer of a run through the informer, and the flags it raises for the thread that
/// waits for the handlers.
pub(crate) struct Feeder<'a> {
    /// The in-memory API server it writes into.
    server: &'a MemoryListerWatcher<ServedPod>,
    /// The events; those after the plan's initial population are written.
    gen: &'a Generated,
    /// The run's plan.
    plan: &'a Plan,
    /// Raised (Release) once the producer's last write is in the server.
    produced: AtomicBool,
    /// Raised with `produced` when the producer failed (read only to stop waiting).
    failed: AtomicBool,
}

impl<'a> Feeder<'a> {
    /// A producer of `gen`'s events into `server` after `plan`'s initial population; nothing
    /// started yet.
    pub(crate) fn new(
        server: &'a MemoryListerWatcher<ServedPod>,
        gen: &'a Generated,
        plan: &'a Plan,
    ) -> Self {
        Self {
            server,
            gen,
            plan,
            produced: AtomicBool::new(false),
            failed: AtomicBool::new(false),
        }
    }

    /// Starts `informer` and waits for its sync (the initial list), then starts the producer on
    /// a thread of `scope`, on the schedule of `rate` from `start` and held back by how far the
    /// informer has read.
    pub(crate) fn start<'scope, 'env, Q, I>(
        &'env self,
        scope: &'scope thread::Scope<'scope, 'env>,
        runtime: &tokio::runtime::Runtime,
        informer: &'env SharedInformer<ServedPod, MemoryListerWatcher<ServedPod>, Q, I>,
        (start, rate): (Instant, Option<u64>),
        progress: &'env dyn Progress,
    ) -> Result<thread::ScopedJoinHandle<'scope, Result<Produced, String>>, String>
    where
        Q: DeltaQueue<ServedPod> + 'static,
        I: Indexer<ServedPod> + 'static,
    {
        runtime
            .block_on(async {
                informer.start()?;
                informer.wait_for_sync().await;
                Ok::<_, kcache::informer::InformerError>(())
            })
            .map_err(|e| format!("the informer did not start: {e}"))?;
        Ok(scope.spawn(move || {
            let client_version = || parse_version(&informer.last_sync_resource_version());
            let from = self.plan.initial_ops;
            let result = produce(
                self.server,
                self.gen,
                from,
                start,
                rate,
                &client_version,
                progress,
            );
            // Relaxed: read only to stop waiting; the error itself comes back through join.
            self.failed.store(result.is_err(), Ordering::Relaxed);
            // Release pairs with `wait_until_final`'s Acquire: the last write is in the server.
            self.produced.store(true, Ordering::Release);
            result
        }))
    }
}

/// Starts `informer` with its handlers, feeds the server, waits for every handler to reach the
/// final state, shuts the informer down and collects what everyone saw.
fn drive<Q, I>(
    informer: SharedInformer<ServedPod, MemoryListerWatcher<ServedPod>, Q, I>,
    server: &MemoryListerWatcher<ServedPod>,
    gen: &Generated,
    plan: &Arc<Plan>,
    cfg: &EngineConfig,
    icfg: &InformerConfig,
    progress: &dyn Progress,
) -> Result<InformerFinished, RunError>
where
    Q: DeltaQueue<ServedPod> + 'static,
    I: Indexer<ServedPod> + 'static,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| RunError::Informer(format!("cannot start a tokio runtime: {e}")))?;
    let start = Instant::now();
    let mut handlers = Vec::with_capacity(icfg.handlers);
    let mut registrations = Vec::with_capacity(icfg.handlers);
    for (recorder, options) in recorders(plan, icfg, start) {
        let shared = recorder.shared();
        let registration = match icfg.delivery {
            Delivery::Thread | Delivery::Inline => {
                informer.add_event_handler_with(recorder, options)
            }
            Delivery::Async => {
                informer.add_async_event_handler_with(AsyncRecorder::new(recorder), options)
            }
        }
        .map_err(|e| RunError::Informer(format!("cannot register a handler: {e}")))?;
        handlers.push(shared);
        registrations.push(registration);
    }
    let mut failures = Vec::new();
    let feeder = Feeder::new(server, gen, plan);
    let (produced, wall) = thread::scope(|scope| {
        let producer = (feeder.start(scope, &runtime, &informer, (start, cfg.rate), progress))
            .map_err(RunError::Informer)?;
        runtime.block_on(wait_until_final(
            &handlers,
            &feeder,
            &informer,
            &mut failures,
        ));
        let wall = handlers
            .iter()
            .filter_map(|h| *lock(&h.caught_up))
            .max()
            .map_or_else(|| start.elapsed(), |at| at.saturating_duration_since(start));
        let produced = producer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            .map_err(|e| RunError::Informer(format!("the server refused the workload: {e}")))?;
        Ok::<_, RunError>((produced, wall))
    })?;
    runtime.block_on(informer.shutdown());
    let server_final = check_final(&informer, server, plan, &mut failures);
    let mut latency = new_histogram();
    let mut records = Vec::with_capacity(handlers.len());
    let mut buffers = Vec::with_capacity(handlers.len());
    for (h, shared) in handlers.iter().enumerate() {
        let taken = lock(&shared.record).take();
        let Some((record, hist)) = taken else {
            failures.push(format!("handler {h}: its record was never handed over"));
            continue;
        };
        if let Some(hist) = hist {
            latency.add(&hist).unwrap_or_default();
        }
        let caught_up = lock(&shared.caught_up).map(|at| at.saturating_duration_since(start));
        records.push((record, caught_up));
        let registration = &registrations[h];
        buffers.push(BufferFigures {
            bound: registration.bound(),
            peak_pending: registration.peak_pending(),
            waits: registration.waits(),
            merged: registration.merged(),
        });
    }
    Ok(InformerFinished {
        handlers: records,
        buffers,
        plan: Arc::clone(plan),
        server_final,
        failures,
        wall,
        latency,
        lists: server.list_calls(),
        watches: server.watch_calls(),
        reflector_errors: 0,
        expired_watches_pending: server.expired_watches_pending() as u64,
        produced,
    })
}

/// Polls until the producer is done and every handler's view is final, or a handler stalls,
/// or the producer or the informer failed.
pub(crate) async fn wait_until_final<Q, I>(
    handlers: &[Arc<Progressing>],
    feeder: &Feeder<'_>,
    informer: &SharedInformer<ServedPod, MemoryListerWatcher<ServedPod>, Q, I>,
    failures: &mut Vec<String>,
) where
    Q: DeltaQueue<ServedPod> + 'static,
    I: Indexer<ServedPod> + 'static,
{
    let mut heard: Vec<(u64, Instant)> = vec![(0, Instant::now()); handlers.len()];
    loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        // Either way the run is over: the error is reported after this returns.
        if informer.failure().is_some() || feeder.failed.load(Ordering::Relaxed) {
            return;
        }
        // Acquire pairs with the producer's Release: its last write is in the server.
        let all_written = feeder.produced.load(Ordering::Acquire);
        let server_rv = if all_written {
            feeder.server.resource_version()
        } else {
            String::new()
        };
        let mut all_final = true;
        for (h, shared) in handlers.iter().enumerate() {
            let notifications = shared.notifications.load(Ordering::Relaxed);
            if notifications != heard[h].0 {
                heard[h] = (notifications, Instant::now());
            }
            // Acquire: see the Recorder's Release store.
            if shared.mismatches.load(Ordering::Acquire) != 0 {
                all_final = false;
                if heard[h].1.elapsed() > STALL {
                    failures.push(format!(
                        "handler {h}: stalled, nothing heard for {STALL:?} with {} keys not final",
                        shared.mismatches.load(Ordering::Relaxed)
                    ));
                    return;
                }
            }
        }
        // The reflector has put the server's last write into the queue: nothing is left in the
        // watch for a handler to hear (a key deleted again after a handler saw it go away
        // would otherwise look final while its re-creation is still on the way).
        if all_written && all_final && informer.last_sync_resource_version() == server_rv {
            return;
        }
    }
}

/// After `informer` shut down: its own failure, the server's final state against `plan`'s,
/// and the informer's store against the server ([`check_store`]). Returns the server's final
/// state, by pod id.
pub(crate) fn check_final<Q, I>(
    informer: &SharedInformer<ServedPod, MemoryListerWatcher<ServedPod>, Q, I>,
    server: &MemoryListerWatcher<ServedPod>,
    plan: &Plan,
    failures: &mut Vec<String>,
) -> Vec<KeyView>
where
    Q: DeltaQueue<ServedPod> + 'static,
    I: Indexer<ServedPod> + 'static,
{
    if let Some(why) = informer.failure() {
        failures.push(format!("the informer failed: {why}"));
    }
    let server_final = server_views(server, plan.final_views.len());
    let differ = (server_final.iter().zip(&plan.final_views))
        .filter(|(a, b)| !same_state(**a, **b))
        .count();
    if differ > 0 {
        failures.push(format!(
            "the server's final state differs from the workload's model on {differ} keys"
        ));
    }
    check_store(&informer.store(), &server_final, failures);
    server_final
}

/// The informer's store must hold exactly the server's objects, each at its version, with both
/// indexes answering for them.
fn check_store<I: Indexer<ServedPod>>(
    store: &kcache::informer::StoreReader<ServedPod, I>,
    server_final: &[KeyView],
    failures: &mut Vec<String>,
) {
    let alive = server_final.iter().filter(|v| v.alive).count();
    if store.len() != alive {
        failures.push(format!(
            "the informer's store holds {} objects, the server {alive}",
            store.len()
        ));
    }
    let mut wrong = 0usize;
    let mut by_node = 0usize;
    for obj in store.list() {
        let want = server_final[obj.pod.id as usize];
        if !want.alive || want.version != obj.pod.version {
            wrong += 1;
        }
    }
    for value in store.list_index_func_values(NODE_INDEX).unwrap_or_default() {
        by_node += store
            .by_index(NODE_INDEX, value.as_str())
            .map_or(0, |v| v.len());
    }
    if wrong > 0 {
        failures.push(format!(
            "the informer's store holds {wrong} objects the server does not (or at another version)"
        ));
    }
    if by_node != alive {
        failures.push(format!(
            "the informer's node index lists {by_node} objects, the server holds {alive}"
        ));
    }
}

/// Runs, measures and judges `gen` through the informer on `engine`.
pub fn measure(
    engine: EngineKind,
    gen: &Generated,
    workload: Workload,
    cfg: &EngineConfig,
    icfg: &InformerConfig,
    progress: &dyn Progress,
) -> Result<RunResult, RunError> {
    let meter = Meter::start();
    let done = execute(engine, gen, cfg, icfg, progress)?;
    let spent = meter.finish();
    let mut failures = done.failures.clone();
    let mut handlers = Vec::with_capacity(done.handlers.len());
    for (h, handler) in done.handlers.iter().enumerate() {
        let (plan, server) = (&done.plan, &done.server_final);
        let prefix = format!("handler {h}: ");
        let result = handler_result(h, handler, plan, server, &prefix, &mut failures);
        let buffer = done.buffers.get(h).copied().unwrap_or_default();
        handlers.push(HandlerResult {
            slow: h + 1 == done.handlers.len() && !icfg.slow_handler.is_zero(),
            peak_pending: buffer.peak_pending as u64,
            waits: buffer.waits,
            merged: buffer.merged,
            ..result
        });
    }
    let summary = Verdict::from_failures(failures.clone()).summary();
    let label = format!("{workload}/informer");
    let keys = gen.universe.keys.len();
    let mut row = spent.row(engine.name(), &label, keys, gen.event_count(), done.wall);
    let lag = cfg.rate.map(|_| done.produced.lag);
    record_pacing(&mut row, cfg.rate, lag, done.produced.paced_ops);
    Ok(RunResult {
        latency_us: LatencyUs::of(&done.latency),
        threads: cfg.consumers + icfg.handlers,
        shards: (engine == EngineKind::Sharded).then_some(cfg.shards),
        deltas: done.handlers.first().map_or(0, |(r, _)| r.notifications()),
        verdict: summary,
        failures,
        handlers,
        informer: Some(InformerStats {
            lists: done.lists,
            watches: done.watches,
            reflector_errors: done.reflector_errors,
            expired_watches_pending: done.expired_watches_pending,
            skipped_resyncs: done.produced.skipped_resyncs,
            producer_held_ms: millis(done.produced.held),
        }),
        ..row
    })
}
