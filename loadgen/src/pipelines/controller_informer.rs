//! W6 through the shared informer, the default W6 (docs/workloads.md): a whole controller as a
//! user of kcache builds one. W1's events go into the in-memory API server
//! ([`server_feed`](crate::harness::server_feed), as `run --through informer`); a [`SharedInformer`]
//! lists and watches it; a [`kcache::controller::Controller`] registers its handler on it and
//! runs W6's workers: each reconcile gets the object from the informer's indexer, burns 5 µs
//! of CPU, and one in 100 fails (an error: the controller retries it rate limited).
//!
//! - **reference**: `SharedInformer::builder(..).build_reference()` and a [`ReferenceQueue`];
//! - **sharded**: `.build()` (`--shards`, `--consumers`) and a [`ShardedQueue`];
//!
//! both under the same delaying and rate-limiting layers and limiter as the bare-queue W6
//! ([`controller_loop`], `--through queue`), which stays the engine-only figure.
//!
//! # How a run ends
//!
//! The producer writes every event into the server. The controller's event filter keeps the
//! informer path's record of what its handler heard ([`Recorder`]) and counts the
//! notifications it let through; once the record of every key is the server's final state and
//! the reflector has read the server's last write, the run waits until the controller's
//! registration has delivered as many notifications as the filter counted (so every `add` has
//! happened), then until the controller is idle ([`Controller::is_idle`]), and shuts it down.
//! The wall time runs from the informer's start (its initial list) to that idle moment.
//!
//! # Verdict
//!
//! W6's own ([`check_controller`]: every key's last event reconciled, no key held by two
//! workers, the workqueue empty at the end), the handler's verdict of the informer path
//! ([`judge`]: no notification missed or out of order, its final view the server's), and the
//! informer path's checks of the server and the informer's store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kcache::controller::{Action, Controller, ControllerQueue, Event, Request};
use kcache::informer::{HandlerOptions, SharedInformer};
use kcache::workqueue::priority::{
    PriorityOptions, PriorityWorkQueue, ReferencePriorityQueue, ShardedPriorityQueue,
};
use kcache::workqueue::{
    DelayingQueue, QueueConfig, RateLimitingQueue, ReferenceQueue, ShardedQueue, WorkQueue,
};
use kcache::{DeltaObject, DeltaQueue, EventHandler, Indexer};
use kcache_sim::MemoryListerWatcher;

use crate::engines::{EngineConfig, EngineKind};
use crate::harness::informer_handlers::Recorder;
use crate::harness::server_feed::{millis, serve_initial, ServedPod};
use crate::judging::informer_verdict::{handler_result, HandlerRecord, Plan};
use crate::judging::verdict::Verdict;
use crate::measure::latency::new_histogram;
use crate::pipelines::bare::RunError;
use crate::pipelines::controller_loop::{
    check_controller, figures, last_events, reconcile, retry_limiter, ControllerConfig,
    ControllerRecord, Track, WorkerStats,
};
use crate::pipelines::through_informer::{check_final, informer_builder, wait_until_final, Feeder};
use crate::progress::Progress;
use crate::result::{InformerStats, LatencyUs, Meter, RunResult};
use workloads::{Generated, Pod};

/// The `workload` of W6's rows through the informer.
pub const LABEL: &str = "w6/informer";

/// How often the ending thread checks whether the controller is idle.
const IDLE_POLL: Duration = Duration::from_micros(200);

/// Which keys the handler leaves out of the workqueue: none in a real run. A test passes a
/// broken handler's choice to see the verdict catch it.
pub type Drops = Arc<dyn Fn(&Pod) -> bool + Send + Sync>;

/// A real handler: it drops no key.
pub fn drops_none() -> Drops {
    Arc::new(|_| false)
}

/// The controller's event filter: the informer path's record, W6's applied state, and the
/// count of notifications seen (each one let through becomes an `add` once the filter returns).
pub(crate) struct Watch {
    pub(crate) track: Arc<Track>,
    pub(crate) recorder: Mutex<Recorder>,
    pub(crate) drops: Drops,
    /// Notifications the filter was called with.
    pub(crate) seen: AtomicU64,
}

impl Watch {
    /// Records `event`; whether its key goes into the workqueue.
    pub(crate) fn filter(&self, event: &Event<'_, ServedPod>) -> bool {
        // Relaxed: counted before the recorder's lock is released, and the run reads it only
        // after it has seen, through that lock, the record of the final notification.
        self.seen.fetch_add(1, Ordering::Relaxed);
        let mut recorder = crate::sync::lock(&self.recorder);
        let (pod, deleted) = match event {
            Event::Add { object, initial } => {
                recorder.on_add(object, *initial);
                (Some(&object.pod), false)
            }
            Event::Update { old, new } => {
                recorder.on_update(old, new);
                (Some(&new.pod), false)
            }
            Event::Delete(obj) => {
                recorder.on_delete(obj);
                match obj {
                    DeltaObject::Object(o) => (Some(&o.pod), true),
                    DeltaObject::Tombstone(t) => (t.last_known.as_ref().map(|o| &o.pod), true),
                }
            }
        };
        drop(recorder);
        if let Some(pod) = pod {
            if (self.drops)(pod) {
                return false;
            }
            self.track.notified(pod, deleted);
        }
        // A deletion noticed on a relist with no last state still needs its key reconciled.
        true
    }
}

/// What each reconcile needs: W6's record, its knobs, and one tally per worker (a worker
/// locks only its own, so the locks are never contended).
pub(crate) struct Reconciler {
    pub(crate) track: Arc<Track>,
    pub(crate) cost: Duration,
    pub(crate) seed: u64,
    pub(crate) start: Instant,
    pub(crate) stats: Vec<Mutex<WorkerStats>>,
}

/// W6's reconcile as a controller's: an error is a failed draw.
pub(crate) fn reconcile_w6(
    request: &Request<ServedPod>,
    r: &Reconciler,
) -> Result<Action, &'static str> {
    let object = request.object().map(|served| Arc::clone(&served.pod));
    let mut stats = crate::sync::lock(&r.stats[request.worker()]);
    if reconcile(
        request.key(),
        object,
        &r.track,
        r.cost,
        r.seed,
        r.start,
        &mut stats,
    ) {
        Err("W6's failure draw")
    } else {
        Ok(Action::Done)
    }
}

/// The workqueue of W6 through the informer: `workqueue` under the delaying and rate-limiting
/// layers and W6's retry limiter.
pub(crate) fn controller_queue<W: WorkQueue + 'static>(workqueue: W) -> Arc<dyn ControllerQueue> {
    Arc::new(RateLimitingQueue::new(
        DelayingQueue::new(workqueue),
        retry_limiter(),
    ))
}

/// `engine`'s rate-limiting workqueue (client-go's one order, first in first out) as a
/// controller's: [`controller_queue`] over the reference or the sharded queue.
pub(crate) fn fifo_queue(engine: EngineKind, shards: usize) -> Arc<dyn ControllerQueue> {
    match engine {
        EngineKind::Reference => controller_queue(ReferenceQueue::new()),
        EngineKind::Sharded => controller_queue(ShardedQueue::new(shards)),
    }
}

/// How many hand-outs aging reordered in a priority queue (its `overdue_handouts`).
pub(crate) type OverdueHandouts = Box<dyn Fn() -> u64 + Send + Sync>;

/// `engine`'s priority queue (controller-runtime's) with W6's retry limiter, ordered with
/// `options`' aging and fairness (none: controller-runtime's order exactly).
pub(crate) fn priority_queue(
    engine: EngineKind,
    shards: usize,
    options: PriorityOptions,
) -> Arc<dyn ControllerQueue> {
    counted_priority_queue(engine, shards, options).0
}

/// [`priority_queue`], with a reading of how often aging reordered its hand-outs.
pub(crate) fn counted_priority_queue(
    engine: EngineKind,
    shards: usize,
    options: PriorityOptions,
) -> (Arc<dyn ControllerQueue>, OverdueHandouts) {
    fn counted<Q: ControllerQueue + PriorityWorkQueue + 'static>(
        queue: Q,
    ) -> (Arc<dyn ControllerQueue>, OverdueHandouts) {
        let queue = Arc::new(queue);
        let read = Arc::clone(&queue);
        (queue, Box::new(move || read.overdue_handouts()))
    }
    match engine {
        EngineKind::Reference => counted(ReferencePriorityQueue::with_options(
            &QueueConfig::new(),
            Box::new(retry_limiter()),
            options,
        )),
        EngineKind::Sharded => counted(ShardedPriorityQueue::with_options(
            shards,
            &QueueConfig::new(),
            Box::new(retry_limiter()),
            options,
        )),
    }
}

/// Waits until `controller` is idle, once every `add` its handler will make has happened;
/// returns early if `stopped` says the run cannot finish.
pub(crate) fn wait_controller_idle<K>(controller: &Controller<K>, stopped: impl Fn() -> bool) {
    while !controller.is_idle() && !stopped() {
        thread::sleep(IDLE_POLL);
    }
}

/// How long W7 waits for a reconcile to make progress before it calls the run stuck.
const STALL: Duration = Duration::from_secs(60);

/// Waits until every key's last event (`last`, see [`Track::reconcile_targets`]) has been
/// reconciled; an error if no reconcile progressed for [`STALL`] (a key was lost).
pub(crate) fn wait_all_reconciled(
    track: &Track,
    last: &[u64],
    stopped: impl Fn() -> bool,
) -> Result<(), String> {
    let (mut remaining, mut since) = (usize::MAX, Instant::now());
    loop {
        let now = track.unreconciled(&track.reconcile_targets(last));
        if now == 0 || stopped() {
            return Ok(());
        }
        if now < remaining {
            (remaining, since) = (now, Instant::now());
        } else if since.elapsed() > STALL {
            return Err(format!(
                "{now} keys' last events still unreconciled after {} s without progress",
                STALL.as_secs()
            ));
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until the controller's primary registration has delivered every notification the
/// filter saw: each one it let through has made its `add`.
pub(crate) fn wait_adds_done<K>(
    controller: &Controller<K>,
    watch: &Watch,
    stopped: impl Fn() -> bool,
) {
    let registration = &controller.registrations()[0];
    // The registration's count is raised after the handler calls return, so once it reaches
    // the filter's count every add has returned.
    while registration.delivered() < watch.seen.load(Ordering::Relaxed) && !stopped() {
        thread::sleep(IDLE_POLL);
    }
}

/// What a W6 run through the informer leaves behind.
pub struct Finished {
    /// From the informer's start until the controller was idle.
    pub wall: Duration,
    /// Event-to-reconcile latency (from the write into the server), in nanoseconds.
    pub latency: Histogram<u64>,
    /// Reconciles, failed ones included.
    pub reconciles: u64,
    /// Failed reconciles, re-added with `add_rate_limited`.
    pub retries: u64,
    /// W6's record for [`check_controller`].
    pub record: ControllerRecord,
    /// The handler's record and when its view became final.
    pub handler: Option<(HandlerRecord, Option<Duration>)>,
    /// Failures of the run as a whole (the server, the informer's store, a stall).
    pub failures: Vec<String>,
    /// What the reflector did.
    pub informer: InformerStats,
    /// The plan the run followed.
    pub plan: Arc<Plan>,
    /// The server's final state, by pod id.
    pub server_final: Vec<crate::judging::informer_verdict::KeyView>,
}

/// W7's twist on W6 (docs/workloads.md): the informer resyncs every object every `resync`,
/// and the workqueue is a priority queue or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Storm {
    /// The informer's resync period.
    pub resync: Duration,
    /// The workqueue is the engine's priority queue (else its rate-limiting queue).
    pub priority: bool,
}

impl Storm {
    /// The `workload` of W7's rows: `w7/priority` or `w7/fifo`.
    pub fn label(self) -> &'static str {
        if self.priority {
            "w7/priority"
        } else {
            "w7/fifo"
        }
    }
}

/// Runs W6 on `gen` through `engine`'s shared informer, or W7 with a `storm`; `drops` says which
/// keys the handler leaves out ([`drops_none`] for a real run).
#[allow(clippy::too_many_arguments)]
pub fn execute(
    engine: EngineKind,
    gen: &Generated,
    cfg: &EngineConfig,
    ctl: &ControllerConfig,
    drops: Drops,
    storm: Option<Storm>,
    progress: &dyn Progress,
) -> Result<Finished, RunError> {
    crate::harness::driver::prepare(gen)?;
    let plan = Arc::new(Plan::of(gen));
    let server = serve_initial(gen, plan.initial_ops).map_err(RunError::Informer)?;
    let errors = Arc::new(AtomicU64::new(0));
    let mut builder = informer_builder(&server, cfg, &errors);
    if let Some(storm) = storm {
        builder = builder.resync_period(storm.resync);
    }
    let run = Run {
        server: &server,
        gen,
        plan: &plan,
        cfg,
        ctl,
        drops,
        storm,
        progress,
    };
    let priority = storm.is_some_and(|s| s.priority);
    let queue = if priority {
        priority_queue(engine, cfg.shards, PriorityOptions::new())
    } else {
        fifo_queue(engine, cfg.shards)
    };
    let mut done = match (engine, priority) {
        // client-go's one FIFO has no resync lane: the priority is the workqueue's alone.
        (EngineKind::Reference, _) => {
            run.drive(builder.build_reference(), queue, HandlerOptions::new())?
        }
        (EngineKind::Sharded, false) => run.drive(builder.build(), queue, HandlerOptions::new())?,
        // Priority all the way: resyncs wait in the informer's lane behind live changes, the
        // controller's handler adds on the consumer (no buffer for a live change to wait in
        // behind a resync's notifications), and the workqueue serves normal priority first.
        (EngineKind::Sharded, true) => run.drive(
            builder.resync_last(true).build(),
            queue,
            HandlerOptions::new().inline(),
        )?,
    };
    done.informer.reflector_errors = errors.load(Ordering::Relaxed);
    Ok(done)
}

/// One run's inputs.
struct Run<'a> {
    server: &'a MemoryListerWatcher<ServedPod>,
    gen: &'a Generated,
    plan: &'a Arc<Plan>,
    cfg: &'a EngineConfig,
    ctl: &'a ControllerConfig,
    drops: Drops,
    storm: Option<Storm>,
    progress: &'a dyn Progress,
}

impl Run<'_> {
    /// Starts the informer and the controller, feeds the server, waits for the handler to hear
    /// the final state and for the controller to be idle, and collects what everyone saw.
    fn drive<Q, I>(
        self,
        informer: SharedInformer<ServedPod, MemoryListerWatcher<ServedPod>, Q, I>,
        queue: Arc<dyn ControllerQueue>,
        handler_options: HandlerOptions,
    ) -> Result<Finished, RunError>
    where
        Q: DeltaQueue<ServedPod> + 'static,
        I: Indexer<ServedPod> + 'static,
    {
        let Run {
            server,
            gen,
            plan,
            cfg,
            ctl,
            drops,
            storm,
            progress,
        } = self;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .map_err(|e| RunError::Informer(format!("cannot start a tokio runtime: {e}")))?;
        let keys = gen.universe.keys.len();
        let track = Arc::new(Track::new(keys));
        let recorder = Recorder::new(Arc::clone(plan), Duration::ZERO, None);
        let progressing = [recorder.shared()];
        let watch = Arc::new(Watch {
            track: Arc::clone(&track),
            recorder: Mutex::new(recorder),
            drops,
            seen: AtomicU64::new(0),
        });
        let start = Instant::now();
        let reconciler = Arc::new(Reconciler {
            track: Arc::clone(&track),
            cost: ctl.reconcile_cost,
            seed: ctl.seed,
            start,
            stats: (0..ctl.workers)
                .map(|_| Mutex::new(WorkerStats::new()))
                .collect(),
        });
        let filter = Arc::clone(&watch);
        let mut builder = Controller::builder(&informer)
            .name("w6")
            .workers(ctl.workers)
            .queue(Arc::clone(&queue))
            .handler_options(handler_options)
            .event_filter(move |event| filter.filter(event));
        if ctl.worker_nice > 0 {
            builder = builder.worker_nice(ctl.worker_nice);
        }
        let controller = builder
            .run(reconcile_w6, Arc::clone(&reconciler))
            .map_err(|e| RunError::Informer(format!("cannot start the controller: {e}")))?;
        let mut failures = Vec::new();
        let mut producer_held = Duration::ZERO;
        let feeder = Feeder::new(server, gen, plan);
        let wall = thread::scope(|scope| {
            let producer =
                match feeder.start(scope, &runtime, &informer, (start, cfg.rate), progress) {
                    Ok(producer) => {
                        runtime.block_on(wait_until_final(
                            &progressing,
                            &feeder,
                            &informer,
                            &mut failures,
                        ));
                        Some(producer)
                    }
                    Err(e) => {
                        failures.push(e);
                        None
                    }
                };
            let stuck = || !failures.is_empty() || controller.stats().panics > 0;
            if storm.is_some() {
                // Resyncs keep adding keys, so the controller may never be idle: the run ends
                // once every key's last event has been reconciled.
                if let Err(e) = wait_all_reconciled(&track, &last_events(&gen.ops, keys), stuck) {
                    failures.push(e);
                }
            } else {
                // Every handler `add` has happened (see the module docs), or the run failed.
                wait_adds_done(&controller, &watch, stuck);
                wait_controller_idle(&controller, stuck);
            }
            let wall = start.elapsed();
            if let Some(producer) = producer {
                let produced = producer
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                match produced {
                    Ok(produced) => producer_held = produced.held,
                    Err(e) => failures.push(format!("the server refused the workload: {e}")),
                }
            }
            wall
        });
        // The record of the workqueue at the end, before the shutdown drops its waiting keys.
        let mut record = track.record(&*queue, gen);
        if storm.is_some() {
            // Under resyncs the queue is not expected to be empty at the end.
            (
                record.queued_at_end,
                record.processing_at_end,
                record.waiting_at_end,
            ) = (0, 0, 0);
        }
        runtime.block_on(controller.shutdown());
        runtime.block_on(informer.shutdown());
        let server_final = check_final(&informer, server, plan, &mut failures);
        let stats = controller.stats();
        if stats.panics > 0 {
            failures.push(format!("{} reconciles panicked", stats.panics));
        }
        // The filter (and the recorder in it) is released with the informer's registration;
        // dropping the last handle hands the record over.
        drop(controller);
        drop(informer);
        drop(watch);
        let [progressing] = progressing;
        let handler = progressing
            .record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .map(|(record, _)| {
                let caught_up = progressing
                    .caught_up
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .map(|at| at.saturating_duration_since(start));
                (record, caught_up)
            });
        let mut latency = new_histogram();
        let (mut reconciles, mut retries) = (0, 0);
        for w in &reconciler.stats {
            let w = crate::sync::lock(w);
            reconciles += w.reconciles;
            retries += w.failures;
            latency.add(&w.latency).unwrap_or_default();
        }
        Ok(Finished {
            wall,
            latency,
            reconciles,
            retries,
            record: ControllerRecord {
                // A deletion may reach the handler as an older tombstone after an unplanned
                // relist: see `Track::reconcile_targets`.
                last_event: track.reconcile_targets(&record.last_event),
                ..record
            },
            handler,
            failures,
            informer: InformerStats {
                lists: server.list_calls(),
                watches: server.watch_calls(),
                reflector_errors: 0,
                expired_watches_pending: server.expired_watches_pending() as u64,
                skipped_resyncs: 0,
                producer_held_ms: millis(producer_held),
            },
            plan: Arc::clone(plan),
            server_final,
        })
    }
}

/// Runs W6 (or W7 with a `storm`, its rows labelled [`Storm::label`]) on `gen` through
/// `engine`'s shared informer, measures it and judges it.
pub fn measure(
    engine: EngineKind,
    gen: &Generated,
    cfg: &EngineConfig,
    ctl: &ControllerConfig,
    drops: Drops,
    storm: Option<Storm>,
    progress: &dyn Progress,
) -> Result<RunResult, RunError> {
    let meter = Meter::start();
    let done = execute(engine, gen, cfg, ctl, drops, storm, progress)?;
    let spent = meter.finish();
    let mut failures = done.failures.clone();
    failures.extend(check_controller(&done.record));
    let handlers = match &done.handler {
        Some(handler) => {
            let (plan, server) = (&done.plan, &done.server_final);
            vec![handler_result(
                0,
                handler,
                plan,
                server,
                "handler: ",
                &mut failures,
            )]
        }
        None => {
            failures.push("the handler's record was never handed over".to_string());
            Vec::new()
        }
    };
    let verdict = Verdict::from_failures(failures);
    let label = storm.map_or(LABEL, Storm::label);
    let keys = gen.universe.keys.len();
    let row = spent.row(engine.name(), label, keys, gen.event_count(), done.wall);
    Ok(RunResult {
        latency_us: LatencyUs::of(&done.latency),
        threads: cfg.consumers + ctl.workers,
        shards: (engine == EngineKind::Sharded).then_some(cfg.shards),
        deltas: handlers.first().map_or(0, |h| h.notifications),
        controller: Some(figures(ctl, done.reconciles, done.retries, &row)),
        verdict: verdict.summary(),
        failures: verdict.failures().to_vec(),
        handlers,
        informer: Some(done.informer),
        ..row
    })
}
