//! W6, the controller loop (docs/workloads.md): W1's events through the DeltaFIFO into the
//! indexer, a handler that adds every notified key to a rate-limited workqueue, and workers
//! that `get` a key, read it from the indexer, burn `--reconcile-us` of CPU, and `done` it; one
//! reconcile in [`FAIL_ONE_IN`] fails and is re-added with `add_rate_limited`.
//!
//! - **reference** pipeline: the reference DeltaFIFO and indexer (one consumer, `pop`) and the
//!   [`ReferenceQueue`] (client-go's `Type`);
//! - **sharded** pipeline: the sharded DeltaFIFO and indexer (`pop_batch`, `--consumers`) and
//!   the [`ShardedQueue`] with `--shards` shards.
//!
//! Both sit under the same delaying and rate-limiting layers and the same limiter
//! ([`retry_limiter`]).
//!
//! # How a run ends
//!
//! The producer enqueues every op and closes the DeltaFIFO; the consumers drain it and exit, so
//! every handler `add` has happened. Then this thread waits until the controller is idle —
//! nothing waiting for a retry, nothing queued, nothing processing ([`wait_idle`]) — and shuts
//! the workqueue down; the workers return. The wall time runs from the first enqueue to that
//! idle moment.
//!
//! # What is recorded for the verdict
//!
//! Per key: the state code ([`state_code`]) of the last event the handler was notified of
//! (written after the indexer holds it), the highest state a *successful* reconcile read, an
//! in-progress flag a reconcile sets and clears (finding it set means two workers held the key
//! at once), and how many reconciles it had (the failure draw's attempt number).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kcache::controller::ControllerQueue;
use kcache::workqueue::{
    DelayingQueue, ExponentialFailureRateLimiter, RateLimitingQueue, ReferenceQueue, ShardedQueue,
    WorkQueue,
};
use kcache::{
    apply_deltas_coalesced, process_deltas, DeltaObject, DeltaQueue, EventHandler, Indexer, Key,
};

use crate::engines::{EngineConfig, EngineKind};
use crate::harness::driver::{
    elapsed_ns, prepare, produce_and_join, queue_options, Consumer, EngineError, SHARDED_BATCH,
};
use crate::harness::pacing::record_pacing;
use crate::judging::verdict::{check, Counters};
use crate::measure::latency::new_histogram;
use crate::progress::Progress;
use crate::result::{ControllerFigures, LatencyUs, Meter, RunResult};
use crate::units::si;
use workloads::{pod_indexers, pod_key_fn, Generated, Op, Pod};

/// W6's worker threads unless told otherwise.
pub const DEFAULT_WORKERS: usize = 4;

/// W6's reconcile cost unless told otherwise: CPU microseconds burnt per reconcile.
pub const DEFAULT_RECONCILE_US: u64 = 5;

/// One reconcile in this many fails and is retried.
pub const FAIL_ONE_IN: u64 = 100;

/// The retry limiter's base delay: client-go's per-item exponential limiter's own 5 ms.
pub const RETRY_BASE: Duration = Duration::from_millis(5);

/// The retry limiter's cap: client-go's 1000 s.
pub const RETRY_MAX: Duration = Duration::from_secs(1000);

/// How often the ending thread checks whether the controller is idle.
const IDLE_POLL: Duration = Duration::from_micros(200);

/// W6's own knobs, on top of [`EngineConfig`] (shards, consumers, pacing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ControllerConfig {
    /// Worker threads taking keys from the workqueue.
    pub workers: usize,
    /// CPU each reconcile burns (busy loop).
    pub reconcile_cost: Duration,
    /// The seed of the failure draws ([`fails`]): the workload's, so one spec fails the same
    /// reconcile attempts in both pipelines and in every run.
    pub seed: u64,
    /// W6/W7 through the informer: the worker threads' `nice` value (0: inherited), see
    /// `ControllerBuilder::worker_nice`.
    pub worker_nice: i32,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            workers: DEFAULT_WORKERS,
            reconcile_cost: Duration::from_micros(DEFAULT_RECONCILE_US),
            seed: workloads::DEFAULT_SEED,
            worker_nice: 0,
        }
    }
}

/// Parses a `--workers` argument: at least one (no worker would never drain the workqueue).
///
/// ```
/// use loadgen::pipelines::controller_loop::parse_workers;
/// assert_eq!(parse_workers("4"), Ok(4));
/// assert!(parse_workers("0").is_err());
/// ```
pub fn parse_workers(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "--workers must be a whole number of at least 1 (got {s:?})"
        )),
    }
}

/// The limiter of W6's retries: client-go's per-item exponential limiter, 5 ms doubling up to
/// 1000 s. Not `default_controller_rate_limiter`: its overall bucket of 10 retries per second
/// (burst 100) would hold the ~1% of reconciles that fail — thousands in a run — for minutes,
/// and W6 would measure the bucket instead of the pipeline.
pub fn retry_limiter() -> ExponentialFailureRateLimiter<Key> {
    ExponentialFailureRateLimiter::new(RETRY_BASE, RETRY_MAX)
}

/// A key state as one number: `version · 2`, plus one for a deletion. A key's states only
/// grow: a deletion carries the key's last version, and a re-add the next one.
///
/// ```
/// use loadgen::pipelines::controller_loop::state_code;
/// assert!(state_code(3, false) < state_code(3, true));
/// assert!(state_code(3, true) < state_code(4, false));
/// ```
pub fn state_code(version: u64, deleted: bool) -> u64 {
    (version << 1) | u64::from(deleted)
}

/// Whether attempt `attempt` (counting from 0) at reconciling key `id` fails: one in
/// [`FAIL_ONE_IN`], drawn from the seed, the key and the attempt alone (never from timing).
pub fn fails(seed: u64, id: u32, attempt: u32) -> bool {
    let mut rng = fastrand::Rng::with_seed(seed ^ ((u64::from(id) << 32) | u64::from(attempt)));
    rng.u64(..FAIL_ONE_IN) == 0
}

/// The state code of every key's last event in `ops`, by key id (0: the key never appeared).
pub fn last_events(ops: &[Op], keys: usize) -> Vec<u64> {
    let mut last = vec![0; keys];
    let mut set = |pod: &Pod, deleted: bool| {
        if let Some(slot) = last.get_mut(pod.id as usize) {
            *slot = state_code(pod.version, deleted);
        }
    };
    for op in ops {
        match op {
            Op::Add(pod) | Op::Update(pod) => set(pod, false),
            Op::Delete(pod) => set(pod, true),
            Op::Replace(relist) => relist.objects.iter().for_each(|pod| set(pod, false)),
            Op::Resync => {}
        }
    }
    last
}

/// What a W6 run leaves for its verdict, beyond the store and the consumers' counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerRecord {
    /// Per key id, the state code of the key's last event (see [`last_events`]).
    pub last_event: Vec<u64>,
    /// Per key id, the highest state code a successful reconcile of the key read (0: none).
    pub reconciled: Vec<u64>,
    /// Reconciles that found their key already being reconciled by another worker.
    pub overlaps: u64,
    /// `done` calls the workqueue refused (the key was not being processed).
    pub done_errors: u64,
    /// Keys queued when the workqueue was shut down.
    pub queued_at_end: usize,
    /// Keys being processed when the workqueue was shut down.
    pub processing_at_end: usize,
    /// Retries waiting for their delay when the workqueue was shut down.
    pub waiting_at_end: usize,
}

/// Spelled-out failures of one kind, at most.
const MAX_DETAILS: usize = 5;

/// W6's own verdict (docs/workloads.md): every key's last event reconciled after it arrived,
/// no key reconciled by two workers at once, the workqueue empty at the end. Returns every
/// failed rule (empty: ok).
pub fn check_controller(record: &ControllerRecord) -> Vec<String> {
    let mut failures = Vec::new();
    if record.last_event.len() != record.reconciled.len() {
        failures.push(format!(
            "reconcile record covers {} keys, the workload {}",
            record.reconciled.len(),
            record.last_event.len()
        ));
    }
    let stale: Vec<usize> = record
        .last_event
        .iter()
        .zip(&record.reconciled)
        .enumerate()
        .filter(|(_, (&last, &seen))| last != 0 && seen < last)
        .map(|(id, _)| id)
        .collect();
    for &id in stale.iter().take(MAX_DETAILS) {
        let (last, seen) = (record.last_event[id], record.reconciled[id]);
        failures.push(format!(
            "key {id}: last event (version {}{}) never reconciled; the newest state a reconcile read was {}",
            last >> 1,
            if last & 1 == 1 { ", deleted" } else { "" },
            describe(seen)
        ));
    }
    if stale.len() > MAX_DETAILS {
        failures.push(format!(
            "keys whose last event was never reconciled: {} more not shown",
            stale.len() - MAX_DETAILS
        ));
    }
    failures.extend(overlapped(record.overlaps));
    if record.done_errors > 0 {
        failures.push(format!(
            "{} done calls refused (key not being processed)",
            record.done_errors
        ));
    }
    let (q, p, w) = (
        record.queued_at_end,
        record.processing_at_end,
        record.waiting_at_end,
    );
    if q + p + w > 0 {
        failures.push(format!(
            "workqueue not empty at the end: {q} queued, {p} processing, {w} retries waiting"
        ));
    }
    failures
}

fn describe(code: u64) -> String {
    match code {
        0 => "none".to_string(),
        c if c & 1 == 1 => format!("version {} deleted", c >> 1),
        c => format!("version {}", c >> 1),
    }
}

/// What each key's reconciles share.
#[derive(Default)]
pub(crate) struct KeySlot {
    /// The state code of the last event the handler was notified of; stored after the indexer
    /// holds that state.
    applied: AtomicU64,
    /// The highest state code a successful reconcile read.
    reconciled: AtomicU64,
    /// A worker is reconciling the key.
    in_progress: AtomicBool,
    /// Reconciles so far (the failure draw's attempt number).
    attempts: AtomicU32,
}

/// The harness's shared record of a run (both W6 forms share it: [`controller_informer`]
/// fills it from the shared informer's handler).
///
/// [`controller_informer`]: crate::pipelines::controller_informer
pub(crate) struct Track {
    keys: Vec<KeySlot>,
    overlaps: AtomicU64,
    done_errors: AtomicU64,
    /// Workers between their first and last workqueue call after a reconcile
    /// (`add_rate_limited`/`forget`, `done`); see [`wait_idle`].
    finishing: AtomicUsize,
    /// Reconciles that finished (incremented after `done`).
    finished: AtomicU64,
}

impl Track {
    pub(crate) fn new(keys: usize) -> Self {
        Self {
            keys: (0..keys).map(|_| KeySlot::default()).collect(),
            overlaps: AtomicU64::new(0),
            done_errors: AtomicU64::new(0),
            finishing: AtomicUsize::new(0),
            finished: AtomicU64::new(0),
        }
    }

    fn slot(&self, id: u32) -> Option<&KeySlot> {
        self.keys.get(id as usize)
    }

    /// The handler was told of `pod`'s state (`deleted`): call after the indexer holds it and
    /// before adding the key to the workqueue.
    pub(crate) fn notified(&self, pod: &Pod, deleted: bool) {
        if let Some(slot) = self.slot(pod.id) {
            // Release pairs with the worker's Acquire load: a reconcile that reads this state
            // code also sees the indexer write that preceded this handler call.
            slot.applied
                .store(state_code(pod.version, deleted), Ordering::Release);
        }
    }

    /// Per key id, the state code a reconcile must have read: the workload's last event
    /// (`last`, from [`last_events`]), except for a key the workload ends deleted and whose
    /// last notification was a deletion too: then that notification's.
    ///
    /// Through the informer a deletion can carry an older version than the workload's: a
    /// watch that fell behind the server's window is answered with a 410, the informer
    /// relists, and a deletion it missed reaches the handler as a tombstone carrying the last
    /// state the informer knew. That the informer itself converged is checked apart (its
    /// store against the server's final state); a key the handler never passed on still
    /// fails here, held to the workload's last event.
    pub(crate) fn reconcile_targets(&self, last: &[u64]) -> Vec<u64> {
        last.iter()
            .zip(&self.keys)
            .map(|(&last, k)| {
                let notified = k.applied.load(Ordering::Acquire);
                let both_deleted = last & 1 == 1 && notified & 1 == 1;
                if both_deleted {
                    notified
                } else {
                    last
                }
            })
            .collect()
    }

    /// How many keys with an event have not had it reconciled: `targets` from
    /// [`reconcile_targets`](Self::reconcile_targets).
    pub(crate) fn unreconciled(&self, targets: &[u64]) -> usize {
        targets
            .iter()
            .zip(&self.keys)
            .filter(|(&target, k)| target != 0 && k.reconciled.load(Ordering::Relaxed) < target)
            .count()
    }

    /// What the run leaves for W6's verdict, once the workqueue is shut down.
    pub(crate) fn record<Q: ControllerQueue + ?Sized>(
        &self,
        queue: &Q,
        gen: &Generated,
    ) -> ControllerRecord {
        ControllerRecord {
            last_event: last_events(&gen.ops, gen.universe.keys.len()),
            reconciled: self
                .keys
                .iter()
                .map(|k| k.reconciled.load(Ordering::Relaxed))
                .collect(),
            overlaps: self.overlaps.load(Ordering::Relaxed),
            done_errors: self.done_errors.load(Ordering::Relaxed),
            queued_at_end: queue.len(),
            processing_at_end: queue.processing_len(),
            waiting_at_end: queue.waiting_len(),
        }
    }
}

/// The key id of a synthetic pod key `ns-N/pod-ID` (docs/workloads.md); `None` for any other.
fn key_id(key: &Key) -> Option<u32> {
    key.as_str().rsplit_once("/pod-")?.1.parse().ok()
}

/// The consumers' handler: W1's counting, then the key's applied state, then `add(key)`.
struct Notify<'a, Q: WorkQueue> {
    consumer: Consumer,
    queue: &'a Q,
    track: &'a Track,
}

impl<Q: WorkQueue> Notify<'_, Q> {
    fn notify(&self, pod: &Pod, deleted: bool) {
        self.track.notified(pod, deleted);
        self.queue.add(pod.key.clone());
    }
}

impl<Q: WorkQueue> EventHandler<Pod> for Notify<'_, Q> {
    fn on_add(&mut self, obj: &Arc<Pod>, is_in_initial_list: bool) {
        self.consumer.on_add(obj, is_in_initial_list);
        self.notify(obj, false);
    }

    fn on_update(&mut self, old: &Arc<Pod>, new: &Arc<Pod>) {
        self.consumer.on_update(old, new);
        self.notify(new, false);
    }

    fn on_delete(&mut self, obj: &DeltaObject<Pod>) {
        self.consumer.on_delete(obj);
        match obj {
            DeltaObject::Object(pod) => self.notify(pod, true),
            // W6 replays W1's events, which never make tombstones; a deletion noticed on a
            // relist still needs its key reconciled.
            DeltaObject::Tombstone(t) => self.queue.add(t.key.clone()),
        }
    }
}

/// One worker's tallies.
pub(crate) struct WorkerStats {
    pub(crate) reconciles: u64,
    pub(crate) failures: u64,
    pub(crate) latency: Histogram<u64>,
}

impl WorkerStats {
    pub(crate) fn new() -> Self {
        Self {
            reconciles: 0,
            failures: 0,
            latency: new_histogram(),
        }
    }
}

/// The workqueue of one pipeline: the delaying and rate-limiting layers over `Q`.
pub(crate) type Controller<Q> = RateLimitingQueue<Q, ExponentialFailureRateLimiter<Key>>;

/// One worker: `get`, reconcile from what `read` returns for the key (the indexer's object),
/// `forget` or `add_rate_limited`, `done`, until the workqueue shuts down.
pub(crate) fn work<Q: WorkQueue, R: Fn(&Key) -> Option<Arc<Pod>> + ?Sized>(
    queue: &Controller<Q>,
    read: &R,
    track: &Track,
    cost: Duration,
    seed: u64,
    start: Instant,
) -> WorkerStats {
    let mut stats = WorkerStats::new();
    while let Ok(key) = queue.get() {
        let failed = reconcile(&key, read(&key), track, cost, seed, start, &mut stats);
        // SeqCst, like every access to `finishing` and `finished`: `wait_idle` relies on one
        // total order of these and its own reads (see there).
        track.finishing.fetch_add(1, Ordering::SeqCst);
        if failed {
            queue.add_rate_limited(key.clone());
        } else {
            queue.forget(&key);
        }
        if queue.done(&key).is_err() {
            track.done_errors.fetch_add(1, Ordering::Relaxed);
        }
        track.finished.fetch_add(1, Ordering::SeqCst);
        track.finishing.fetch_sub(1, Ordering::SeqCst);
    }
    stats
}

/// One reconcile of `key`, whose object the indexer holds as `object` (`None`: deleted):
/// W6's bookkeeping (overlap flag, event-to-reconcile latency, the state read), the reconcile's
/// CPU, and the failure draw. Returns whether it failed (the caller retries it rate limited).
/// Shared by the bare-queue loop ([`work`]) and the [`Controller`](kcache::controller::Controller)
/// of W6 through the informer.
pub(crate) fn reconcile(
    key: &Key,
    object: Option<Arc<Pod>>,
    track: &Track,
    cost: Duration,
    seed: u64,
    start: Instant,
    stats: &mut WorkerStats,
) -> bool {
    stats.reconciles += 1;
    let id = key_id(key);
    let slot = id.and_then(|id| track.slot(id));
    if let Some(slot) = slot {
        // Relaxed: the flag only detects overlap; the workqueue's own hand-off orders a
        // legitimate previous holder's clear before this swap.
        if slot.in_progress.swap(true, Ordering::Relaxed) {
            track.overlaps.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Acquire pairs with the handler's Release store: the indexer holds at least this
    // state, so what the read below returns is this state or a newer one.
    let applied = slot.map_or(0, |s| s.applied.load(Ordering::Acquire));
    let seen = match object {
        Some(pod) => {
            // The sampled object's enqueue stamp, consumed by the first reconcile to read
            // it: event-to-reconcile latency.
            let stamped = pod.enqueued_ns.swap(0, Ordering::Relaxed);
            if stamped != 0 {
                let now = elapsed_ns(start) + 1;
                stats
                    .latency
                    .saturating_record(now.saturating_sub(stamped).max(1));
            }
            state_code(pod.version, false)
        }
        // Gone: which deletion it saw is the newest the handler had announced.
        None => applied,
    };
    burn(cost);
    let failed = match (id, slot) {
        (Some(id), Some(slot)) => {
            let attempt = slot.attempts.fetch_add(1, Ordering::Relaxed);
            fails(seed, id, attempt)
        }
        _ => false,
    };
    if let Some(slot) = slot {
        if !failed {
            slot.reconciled.fetch_max(seen, Ordering::Relaxed);
        }
        // Cleared before `done`: once `done` returns another worker may hold the key.
        slot.in_progress.store(false, Ordering::Relaxed);
    }
    if failed {
        stats.failures += 1;
    }
    failed
}

/// Spins for `cost` (the reconcile's CPU).
pub(crate) fn burn(cost: Duration) {
    if cost.is_zero() {
        return;
    }
    let t = Instant::now();
    while t.elapsed() < cost {
        std::hint::spin_loop();
    }
}

/// Waits until no retry waits, nothing is queued and nothing is processing — once no more
/// handler adds can come (the DeltaFIFO is drained).
///
/// The three counts are read one after another, not at one instant, so an item could move
/// between them. Items move forward only — a retry becomes queued (the timer; or dirty, counted
/// as processing, if a worker holds its key), a queued key becomes processing (`get`) — except
/// through a worker's `add_rate_limited` or `done`, which happen while `finishing` is raised
/// and raise `finished`. Reading waiting, then queued, then
/// processing catches every forward move; a backward move between the first and last read
/// shows as `finishing` non-zero or `finished` changed.
///
/// Returns early if `stopped` says a worker has stopped (it panicked: its key would stay
/// processing forever); joining it then surfaces the panic.
pub(crate) fn wait_idle<Q: WorkQueue>(
    queue: &Controller<Q>,
    track: &Track,
    stopped: impl Fn() -> bool,
) {
    loop {
        let before = track.finished.load(Ordering::SeqCst);
        let idle = track.finishing.load(Ordering::SeqCst) == 0
            && queue.delaying().waiting_len() == 0
            && queue.len() == 0
            && queue.processing_len() == 0
            && track.finishing.load(Ordering::SeqCst) == 0
            && track.finished.load(Ordering::SeqCst) == before;
        if idle || stopped() {
            return;
        }
        thread::sleep(IDLE_POLL);
    }
}

/// What [`drive`] measured.
struct Outcome {
    counters: Counters,
    wall: Duration,
    latency: Histogram<u64>,
    reconciles: u64,
    failures: u64,
    record: ControllerRecord,
    producer_lag: Option<Duration>,
}

/// How the consumers pop.
#[derive(Clone, Copy)]
enum Pop {
    /// `pop` + `process_deltas` (client-go).
    One,
    /// `pop_batch` + `apply_deltas_coalesced`.
    Batch,
}

/// Runs the pipeline: producer on this thread, `consumers` consumers, `ctl.workers` workers.
#[allow(clippy::too_many_arguments)]
fn drive<F, S, Q>(
    fifo: &F,
    store: &S,
    queue: &Controller<Q>,
    pop: Pop,
    consumers: usize,
    gen: &Generated,
    cfg: &EngineConfig,
    ctl: &ControllerConfig,
    progress: &dyn Progress,
) -> Outcome
where
    F: DeltaQueue<Pod>,
    S: Indexer<Pod>,
    Q: WorkQueue,
{
    let track = Track::new(gen.universe.keys.len());
    let seed = ctl.seed;
    let start = Instant::now();
    let (counters, consumer_latency, lag, wall, workers) = thread::scope(|scope| {
        let track = &track;
        let workers: Vec<_> = (0..ctl.workers)
            .map(|_| {
                scope.spawn(move || {
                    let read = |key: &Key| store.get_by_key(key);
                    work(queue, &read, track, ctl.reconcile_cost, seed, start)
                })
            })
            .collect();
        let consumer_handles: Vec<_> = (0..consumers)
            .map(|_| {
                scope.spawn(move || {
                    let mut handler = Notify {
                        consumer: Consumer::new(start, Duration::ZERO),
                        queue,
                        track,
                    };
                    consume(fifo, store, pop, &mut handler);
                    handler.consumer
                })
            })
            .collect();
        let (counters, latency, _, lag) =
            produce_and_join(fifo, gen, start, cfg.rate, progress, consumer_handles);
        wait_idle(queue, track, || workers.iter().any(|w| w.is_finished()));
        let wall = start.elapsed();
        queue.shut_down();
        let workers: Vec<WorkerStats> = workers
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .collect();
        (counters, latency, lag, wall, workers)
    });
    // The consumers' enqueue-to-pop latency is W1's figure; W6 reports event-to-reconcile.
    drop(consumer_latency);
    let mut latency = new_histogram();
    let (mut reconciles, mut failures) = (0, 0);
    for w in &workers {
        reconciles += w.reconciles;
        failures += w.failures;
        latency.add(&w.latency).unwrap_or_default();
    }
    let record = track.record(queue, gen);
    Outcome {
        counters,
        wall,
        latency,
        reconciles,
        failures,
        record,
        producer_lag: lag,
    }
}

/// One consumer's loop, until the DeltaFIFO is closed and drained.
fn consume<F, S, Q>(fifo: &F, store: &S, pop: Pop, handler: &mut Notify<'_, Q>)
where
    F: DeltaQueue<Pod>,
    S: Indexer<Pod>,
    Q: WorkQueue,
{
    match pop {
        Pop::One => {
            while fifo
                .pop(|deltas, initial| {
                    handler.consumer.observe(&deltas);
                    process_deltas(store, handler, &deltas, initial);
                })
                .is_ok()
            {}
        }
        Pop::Batch => {
            while fifo
                .pop_batch(SHARDED_BATCH, |deltas, initial| {
                    handler.consumer.observe(&deltas);
                    apply_deltas_coalesced(store, handler, &deltas, initial);
                })
                .is_ok()
            {}
        }
    }
}

/// Runs W6 on `gen` through `engine`'s pipeline, measures it and judges it.
pub fn measure(
    engine: EngineKind,
    workload: &str,
    gen: &Generated,
    cfg: &EngineConfig,
    ctl: &ControllerConfig,
    progress: &dyn Progress,
) -> Result<RunResult, EngineError> {
    prepare(gen)?;
    let meter = Meter::start();
    let (store, outcome): (Arc<dyn Indexer<Pod>>, Outcome) = match engine {
        EngineKind::Reference => {
            let store = Arc::new(kcache::reference::IndexedStore::new(
                pod_key_fn(),
                pod_indexers(),
            ));
            let fifo = kcache::reference::DeltaFifo::new(queue_options(&store, cfg));
            let queue =
                RateLimitingQueue::new(DelayingQueue::new(ReferenceQueue::new()), retry_limiter());
            let outcome = drive(&fifo, &*store, &queue, Pop::One, 1, gen, cfg, ctl, progress);
            (store, outcome)
        }
        EngineKind::Sharded => {
            let store = Arc::new(kcache::sharded::IndexedStore::new(
                pod_key_fn(),
                pod_indexers(),
            ));
            let fifo = kcache::sharded::DeltaFifo::new(queue_options(&store, cfg), cfg.shards);
            let queue = RateLimitingQueue::new(
                DelayingQueue::new(ShardedQueue::new(cfg.shards)),
                retry_limiter(),
            );
            let consumers = cfg.consumers.max(1);
            let outcome = drive(
                &fifo,
                &*store,
                &queue,
                Pop::Batch,
                consumers,
                gen,
                cfg,
                ctl,
                progress,
            );
            (store, outcome)
        }
    };
    let spent = meter.finish();
    let verdict = check(&gen.model, &*store, &outcome.counters);
    let mut failures = verdict.failures().to_vec();
    failures.extend(check_controller(&outcome.record));
    let events = gen.event_count();
    let c = &outcome.counters;
    let verdict = crate::judging::verdict::Verdict::from_failures(failures);
    let keys = gen.universe.keys.len();
    let mut row = spent.row(engine.name(), workload, keys, events, outcome.wall);
    record_pacing(&mut row, cfg.rate, outcome.producer_lag, gen.ops.len());
    Ok(RunResult {
        pops: c.pops,
        deltas_per_pop: (c.pops > 0).then(|| c.deltas as f64 / c.pops as f64),
        latency_us: LatencyUs::of(&outcome.latency),
        threads: match engine {
            EngineKind::Reference => 1,
            EngineKind::Sharded => cfg.consumers.max(1),
        },
        shards: (engine == EngineKind::Sharded).then_some(cfg.shards),
        deltas: c.deltas,
        controller: Some(figures(ctl, outcome.reconciles, outcome.failures, &row)),
        verdict: verdict.summary(),
        failures: verdict.failures().to_vec(),
        ..row
    })
}

/// The rule every controller run keeps: a key is never held by two workers at once
/// (`overlaps` reconciles found theirs held by another).
pub(crate) fn overlapped(overlaps: u64) -> Option<String> {
    (overlaps > 0).then(|| format!("{overlaps} reconciles found their key held by another worker"))
}

/// A controller row's figures: `reconciles` (`retries` of them failed) by `ctl`'s workers
/// over the `row`'s wall time and events.
pub(crate) fn figures(
    ctl: &ControllerConfig,
    reconciles: u64,
    retries: u64,
    row: &RunResult,
) -> ControllerFigures {
    ControllerFigures {
        workers: ctl.workers,
        reconcile_us: u64::try_from(ctl.reconcile_cost.as_micros()).unwrap_or(u64::MAX),
        reconciles,
        reconciles_per_s: reconciles as f64 / row.wall_s,
        reconciles_per_event: reconciles as f64 / row.events.max(1) as f64,
        retries,
    }
}

/// What a W6 run's progress line ends with, in both of its forms.
pub(crate) fn phase_summary(result: &RunResult) -> String {
    format!(
        "{} events/s, {} reconciles/s, verdict {}",
        si(result.events_per_s),
        si(result.controller.map_or(0.0, |c| c.reconciles_per_s)),
        result.verdict
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deletion_is_held_to_the_one_notified_and_anything_else_to_the_workload() {
        let pod = |id: u32, version: u64| {
            let key = Key::new(&format!("ns-0/pod-{id}"));
            Pod::new(id, key, Key::new("ns-0"), None, version)
        };
        let track = Track::new(4);
        track.notified(&pod(0, 41), true); // a tombstone older than the workload's deletion
        track.notified(&pod(1, 45), false); // the deletion never reached the handler
        track.notified(&pod(2, 7), false); // alive at the end
                                           // Key 3: the handler passed nothing on.
        let last = [
            state_code(45, true),
            state_code(45, true),
            state_code(9, false),
            state_code(3, true),
        ];
        assert_eq!(
            track.reconcile_targets(&last),
            [
                state_code(41, true),
                state_code(45, true),
                state_code(9, false),
                state_code(3, true)
            ]
        );
    }

    #[test]
    fn the_failure_draw_fails_about_one_in_a_hundred_and_only_by_seed_key_and_attempt() {
        let failed = (0..100_000u32).filter(|&id| fails(42, id, 0)).count();
        assert!((800..1200).contains(&failed), "{failed} of 100,000");
        assert_eq!(fails(42, 7, 3), fails(42, 7, 3));
        let differ = (0..1000u32).any(|id| fails(1, id, 0) != fails(2, id, 0));
        assert!(differ, "the seed changes which attempts fail");
    }

    #[test]
    fn key_ids_come_from_synthetic_keys_only() {
        assert_eq!(key_id(&Key::new("ns-234/pod-1234")), Some(1234));
        assert_eq!(key_id(&Key::new("default/web")), None);
    }

    #[test]
    fn the_retry_limiter_waits_5_ms_then_doubles() {
        use kcache::workqueue::{RateLimiter, Time};
        let limiter = retry_limiter();
        let key = Key::new("ns-0/pod-0");
        assert_eq!(limiter.when(&key, Time::ZERO), Duration::from_millis(5));
        assert_eq!(limiter.when(&key, Time::ZERO), Duration::from_millis(10));
    }
}
