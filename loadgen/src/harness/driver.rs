//! Driving an engine through a generated workload: producer, consumers, counters, timing.
//!
//! Everything here is generic over kcache's [`DeltaQueue`] and [`Indexer`] traits; the two
//! engines differ only in how they are built and how their consumers pop:
//!
//! - **reference**: exactly one consumer looping `pop` + [`process_deltas`], as client-go's
//!   controller does (the port runs `process` under the queue's lock, as client-go does).
//! - **sharded**: C consumers looping `pop_batch(256)` + [`apply_deltas_coalesced`].
//!
//! W4's readers call what a client of each engine would: the reference's `Arc` reads, the
//! sharded indexer's borrowed reads (see [`readers`](crate::harness::readers)).
//!
//! The producer is the calling thread. It stamps every [`SAMPLE_EVERY`]th event with the
//! nanoseconds since the run started just before enqueueing it; a consumer records the age of
//! every stamped `Added`/`Updated`/`Deleted` delta it pops into its own histogram. After
//! `close`, consumers drain the queue and stop; the wall time runs from the first enqueue to
//! the last consumer's exit.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kcache::{
    apply_deltas_coalesced, process_deltas, DeltaObject, DeltaQueue, DeltaType, Deltas,
    EventHandler, Indexer, QueueOptions,
};

use crate::engines::{EngineConfig, EngineKind, Mode};
use crate::harness::pacing::{due_time, pace, PACE_EVERY};
use crate::harness::readers::{read_until_done, W4Reads};
use crate::judging::verdict::Counters;
use crate::measure::latency::{new_histogram, SAMPLE_EVERY};
use crate::measure::timeline::{self, Sample};
use crate::progress::Progress;
use workloads::{pod_indexers, pod_key_fn, Generated, Op, Pod};

/// How many keys a sharded consumer takes per `pop_batch`.
pub const SHARDED_BATCH: usize = 256;

/// The producer reports progress every this many ops.
const PROGRESS_EVERY: usize = 1 << 16;

/// What a finished run leaves behind: the store (for the verdict) and what was measured.
pub struct Finished {
    /// The consumer's indexer after the drain.
    pub store: Arc<dyn Indexer<Pod>>,
    /// The consumers' counters, merged.
    pub counters: Counters,
    /// From the first enqueue (or write) to the end of the drain (or of the writes).
    pub wall: Duration,
    /// Enqueue-to-pop latency of the sampled events, in nanoseconds.
    pub latency: Histogram<u64>,
    /// W4: reads done by all readers (each `get_by_key` and each `by_index` is one).
    pub reads: u64,
    /// Consumer (or reader) threads used.
    pub threads: usize,
    /// A paced run: how far the producer fell behind its schedule at worst (`None` unpaced).
    pub producer_lag: Option<Duration>,
    /// Every sampled event with its pop time, when [`timeline`](crate::measure::timeline) is on.
    pub samples: Vec<Sample>,
}

impl fmt::Debug for Finished {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Finished")
            .field("store_len", &self.store.len())
            .field("counters", &self.counters)
            .field("wall", &self.wall)
            .field("samples", &self.latency.len())
            .field("reads", &self.reads)
            .field("threads", &self.threads)
            .field("producer_lag", &self.producer_lag)
            .finish()
    }
}

/// An engine could not run the workload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The workload has more keys than a pod's `u32` id can number (more than `u32::MAX`).
    #[error("too many keys ({0}); at most {max} are supported", max = u32::MAX)]
    TooManyKeys(usize),
}

/// Runs `gen` through `engine`, and returns the drained store with what was measured.
///
/// ```
/// use loadgen::harness::driver::execute;
/// use loadgen::engines::{EngineConfig, EngineKind, Mode};
/// use loadgen::progress::NoProgress;
/// use workloads::{generate, Workload, WorkloadSpec};
/// let gen = generate(&WorkloadSpec::new(Workload::W1).keys(50).events(500));
/// let done = execute(EngineKind::Reference, &gen, Mode::Queue, &EngineConfig::default(), &NoProgress).unwrap();
/// let verdict = loadgen::judging::verdict::check(&gen.model, &*done.store, &done.counters);
/// assert!(verdict.is_ok(), "{verdict}");
/// ```
pub fn execute(
    engine: EngineKind,
    gen: &Generated,
    mode: Mode,
    cfg: &EngineConfig,
    progress: &dyn Progress,
) -> Result<Finished, EngineError> {
    prepare(gen)?;
    Ok(match (engine, mode) {
        (EngineKind::Reference, Mode::Queue) => {
            let store = Arc::new(kcache::reference::IndexedStore::new(
                pod_key_fn(),
                pod_indexers(),
            ));
            let queue = kcache::reference::DeltaFifo::new(queue_options(&store, cfg));
            drive_queue(&queue, store, PopStyle::One, 1, gen, cfg, progress)
        }
        (EngineKind::Reference, Mode::Direct) => {
            let store = Arc::new(kcache::reference::IndexedStore::new(
                pod_key_fn(),
                pod_indexers(),
            ));
            drive_direct(store, gen, cfg, progress)
        }
        (EngineKind::Sharded, mode) => run_sharded(gen, mode, cfg, progress),
    })
}

/// THE SHARDED ENGINE HOOK: how the sharded engine is built and consumed. Everything else is
/// shared with the reference engine.
fn run_sharded(
    gen: &Generated,
    mode: Mode,
    cfg: &EngineConfig,
    progress: &dyn Progress,
) -> Finished {
    let store = Arc::new(kcache::sharded::IndexedStore::new(
        pod_key_fn(),
        pod_indexers(),
    ));
    match mode {
        Mode::Queue => {
            let queue = kcache::sharded::DeltaFifo::new(queue_options(&store, cfg), cfg.shards);
            let style = PopStyle::Batch(SHARDED_BATCH);
            drive_queue(
                &queue,
                store,
                style,
                cfg.consumers.max(1),
                gen,
                cfg,
                progress,
            )
        }
        Mode::Direct => drive_direct(store, gen, cfg, progress),
    }
}

/// The queue of every run: the store as known objects, `emit_replaced` on, and the backlog
/// bound and compaction `cfg` asks for.
pub(crate) fn queue_options<S: Indexer<Pod> + 'static>(
    store: &Arc<S>,
    cfg: &EngineConfig,
) -> QueueOptions<Pod> {
    let known: Arc<dyn kcache::KnownObjects<Pod>> = store.clone();
    QueueOptions::new(pod_key_fn())
        .known_objects(known)
        .emit_replaced(true)
        .max_queued_deltas(cfg.max_queued_deltas)
        .compact_updates(cfg.compact_updates)
}

/// How a consumer takes work from the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PopStyle {
    /// `pop` one key, `process_deltas` (client-go).
    One,
    /// `pop_batch(n)`, `apply_deltas_coalesced` per key.
    Batch(usize),
}

/// Producer on this thread, `consumers` consumer threads, until the queue is drained.
fn drive_queue<Q, S>(
    queue: &Q,
    store: Arc<S>,
    style: PopStyle,
    consumers: usize,
    gen: &Generated,
    cfg: &EngineConfig,
    progress: &dyn Progress,
) -> Finished
where
    Q: DeltaQueue<Pod>,
    S: Indexer<Pod> + 'static,
{
    let start = Instant::now();
    let (counters, latency, samples, lag) = thread::scope(|scope| {
        let handles: Vec<_> = (0..consumers)
            .map(|_| {
                let store = &*store;
                scope.spawn(move || {
                    let mut c = Consumer::new(start, cfg.handler_cost);
                    if timeline::enabled() {
                        c.samples = Some(Vec::with_capacity(gen.ops.len() / SAMPLE_EVERY + 1));
                    }
                    consume(queue, store, style, &mut c);
                    c
                })
            })
            .collect();
        produce_and_join(queue, gen, start, cfg.rate, progress, handles)
    });
    let wall = start.elapsed();
    Finished {
        store,
        counters,
        wall,
        latency,
        reads: 0,
        threads: consumers,
        producer_lag: lag,
        samples,
    }
}

/// Before any run on `gen`: refuses more keys than the engines' ids hold, and clears the marks
/// a previous run on these events left on the objects.
pub fn prepare(gen: &Generated) -> Result<(), EngineError> {
    if u32::try_from(gen.universe.keys.len()).is_err() {
        return Err(EngineError::TooManyKeys(gen.universe.keys.len()));
    }
    gen.reset_delivery();
    Ok(())
}

/// Performs `gen`'s ops on `queue` at `rate` ([`produce`]) and closes it, then joins its
/// `consumers` and merges what they counted: the counters (the queue's refusals included),
/// the latency, the timeline's samples, and the producer's largest lag when paced.
pub(crate) fn produce_and_join<Q: DeltaQueue<Pod>>(
    queue: &Q,
    gen: &Generated,
    start: Instant,
    rate: Option<u64>,
    progress: &dyn Progress,
    consumers: Vec<thread::ScopedJoinHandle<'_, Consumer>>,
) -> (Counters, Histogram<u64>, Vec<Sample>, Option<Duration>) {
    let (enqueue_errors, lag) = produce(queue, &gen.ops, start, rate, progress);
    queue.close();
    let mut counters = Counters {
        enqueue_errors,
        ..Counters::default()
    };
    let mut latency = new_histogram();
    let mut samples = Vec::new();
    for handle in consumers {
        // A consumer panics only if the engine, a handler or the harness has a bug: surface it
        // as is.
        let c = handle
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        counters.merge(&c.counters);
        latency.add(&c.latency).unwrap_or_default();
        samples.extend(c.samples.unwrap_or_default());
    }
    (counters, latency, samples, lag)
}

/// Performs every op on the queue, at `rate` ops per second if given; returns how many the
/// queue refused and, when paced, the producer's largest lag behind its schedule.
pub(crate) fn produce<Q: DeltaQueue<Pod>>(
    queue: &Q,
    ops: &[Op],
    start: Instant,
    rate: Option<u64>,
    progress: &dyn Progress,
) -> (u64, Option<Duration>) {
    let mut errors = 0;
    let mut lag = Duration::ZERO;
    for (n, op) in ops.iter().enumerate() {
        if let Some(rate) = rate {
            if n % PACE_EVERY == 0 {
                lag = lag.max(pace(start, n, rate));
            }
        }
        if n % SAMPLE_EVERY == 0 {
            stamp(op, start);
        }
        errors += u64::from(op.perform_on(queue).is_err());
        if n % PROGRESS_EVERY == 0 {
            progress.set(n as u64);
        }
    }
    // The ops since the last check were issued no earlier than their due times allowed;
    // the last one's lag is measured on its own, so a slow tail is not missed.
    if let (Some(rate), Some(last)) = (rate, ops.len().checked_sub(1)) {
        lag = lag.max(start.elapsed().saturating_sub(due_time(last, rate)));
    }
    progress.set(ops.len() as u64);
    (errors, rate.map(|_| lag))
}

/// Stamps an add/update/delete with the time since `start` (+1, so 0 means "not sampled").
fn stamp(op: &Op, start: Instant) {
    if let Op::Add(pod) | Op::Update(pod) | Op::Delete(pod) = op {
        // Relaxed: the queue's own synchronisation orders this store before the consumer's load.
        pod.enqueued_ns
            .store(elapsed_ns(start) + 1, Ordering::Relaxed);
    }
}

pub(crate) fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// One consumer thread's loop, until the queue is closed and drained.
fn consume<Q, S>(queue: &Q, store: &S, style: PopStyle, c: &mut Consumer)
where
    Q: DeltaQueue<Pod>,
    S: Indexer<Pod>,
{
    match style {
        PopStyle::One => {
            while queue
                .pop(|deltas, initial| {
                    c.observe(&deltas);
                    process_deltas(store, c, &deltas, initial);
                })
                .is_ok()
            {}
        }
        PopStyle::Batch(max) => {
            while queue
                .pop_batch(max, |deltas, initial| {
                    c.observe(&deltas);
                    apply_deltas_coalesced(store, c, &deltas, initial);
                })
                .is_ok()
            {}
        }
    }
}

/// A consumer's counters, histogram and handler.
///
/// Its checks touch only the objects it is handed (no per-key table): the harness must not
/// cost the consumer, which is the bottleneck being measured, more than the engine does.
/// Duplicates show up as an event object's `delivered` flag already set; order as a handler
/// update whose new object is older than the old one; losses in the verdict's counts.
pub(crate) struct Consumer {
    pub(crate) counters: Counters,
    pub(crate) latency: Histogram<u64>,
    start: Instant,
    handler_cost: Duration,
    /// Every sampled event with its pop time, when the timeline is on.
    samples: Option<Vec<Sample>>,
}

impl Consumer {
    pub(crate) fn new(start: Instant, handler_cost: Duration) -> Self {
        Self {
            counters: Counters::default(),
            latency: new_histogram(),
            start,
            handler_cost,
            samples: None,
        }
    }

    /// Counts a popped key's deltas, checks their versions, records sampled latencies.
    pub(crate) fn observe(&mut self, deltas: &Deltas<Pod>) {
        self.counters.pops += 1;
        let mut now = None;
        for delta in deltas {
            self.counters.deltas += 1;
            let pod = match &delta.object {
                DeltaObject::Tombstone(_) => {
                    self.counters.tombstones += 1;
                    continue;
                }
                DeltaObject::Object(pod) => pod,
            };
            // Its counter, and whether it is an event (not a relist's or a resync's).
            let (counter, event) = match delta.kind {
                DeltaType::Added => (&mut self.counters.added, true),
                DeltaType::Updated => (&mut self.counters.updated, true),
                DeltaType::Deleted => (&mut self.counters.deleted, true),
                DeltaType::Replaced => (&mut self.counters.replaced, false),
                DeltaType::Sync => (&mut self.counters.synced, false),
            };
            *counter += 1;
            // Only event objects are enqueued once and carry stamps of this run: relists are
            // fresh allocations, and a Sync re-delivers a stored object.
            if event {
                // Relaxed: the flag's own modification order is all that matters; two
                // deliveries of one object cannot both read false.
                if pod.delivered.swap(true, Ordering::Relaxed) {
                    self.counters.duplicated += 1;
                }
                if let Some(stamped) = pod.stamp() {
                    let now = *now.get_or_insert_with(|| elapsed_ns(self.start) + 1);
                    let latency_ns = now.saturating_sub(stamped).max(1);
                    self.latency.saturating_record(latency_ns);
                    if let Some(samples) = &mut self.samples {
                        samples.push(Sample {
                            at_ns: now,
                            latency_ns,
                        });
                    }
                }
            }
        }
    }

    /// W5's slow handler: spin for the configured time.
    fn burn(&self) {
        if self.handler_cost.is_zero() {
            return;
        }
        let t = Instant::now();
        while t.elapsed() < self.handler_cost {
            std::hint::spin_loop();
        }
    }
}

impl EventHandler<Pod> for Consumer {
    fn on_add(&mut self, _obj: &Arc<Pod>, _is_in_initial_list: bool) {
        self.counters.on_add += 1;
        self.burn();
    }

    fn on_update(&mut self, old: &Arc<Pod>, new: &Arc<Pod>) {
        self.counters.on_update += 1;
        // A key's states come out in order: never an older one over a newer one (a Sync or
        // Replaced may repeat the same version).
        if new.version < old.version {
            self.counters.version_regressions += 1;
        }
        self.burn();
    }

    fn on_delete(&mut self, _obj: &DeltaObject<Pod>) {
        self.counters.on_delete += 1;
        self.burn();
    }
}

/// W4: this thread writes every op straight into the store while `cfg.readers` threads query
/// it; the readers stop when the writer is done.
fn drive_direct<S>(
    store: Arc<S>,
    gen: &Generated,
    cfg: &EngineConfig,
    progress: &dyn Progress,
) -> Finished
where
    S: W4Reads + 'static,
{
    let done = AtomicBool::new(false);
    let start = Instant::now();
    let (counters, reads, wall) = thread::scope(|scope| {
        let readers: Vec<_> = (0..cfg.readers)
            .map(|r| {
                let (store, done, universe) = (&*store, &done, &gen.universe);
                scope.spawn(move || read_until_done(store, universe, r as u64, done))
            })
            .collect();
        let counters = write_all(&*store, &gen.ops, progress);
        let wall = start.elapsed();
        done.store(true, Ordering::Relaxed);
        let reads: u64 = readers
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
            })
            .sum();
        (counters, reads, wall)
    });
    Finished {
        store,
        counters,
        wall,
        latency: new_histogram(),
        reads,
        threads: cfg.readers,
        // W4's writer is never paced.
        producer_lag: None,
        samples: Vec::new(),
    }
}

/// The W4 writer: each op is one store write, counted as if a consumer had popped it.
fn write_all<S: Indexer<Pod>>(store: &S, ops: &[Op], progress: &dyn Progress) -> Counters {
    let mut c = Counters::default();
    for (n, op) in ops.iter().enumerate() {
        match op {
            Op::Add(pod) | Op::Update(pod) => {
                if matches!(op, Op::Add(_)) {
                    c.added += 1;
                } else {
                    c.updated += 1;
                }
                match store.insert_by_key(pod.key.clone(), Arc::clone(pod)) {
                    Some(_) => c.on_update += 1,
                    None => c.on_add += 1,
                }
            }
            Op::Delete(pod) => {
                c.deleted += 1;
                store.remove_by_key(&pod.key);
                c.on_delete += 1;
            }
            // Direct mode replays W1's stream, which has neither: counting them as errors
            // makes the verdict say so rather than guess what a relist should mean here.
            Op::Replace(_) | Op::Resync => {
                c.enqueue_errors += 1;
                continue;
            }
        }
        c.pops += 1;
        c.deltas += 1;
        if n % PROGRESS_EVERY == 0 {
            progress.set(n as u64);
        }
    }
    progress.set(ops.len() as u64);
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use kcache::{Delta, Key};

    fn pod(version: u64) -> Arc<Pod> {
        Arc::new(Pod::new(0, Key::new("ns/a"), Key::new("ns"), None, version))
    }

    fn deltas(list: Vec<Delta<Pod>>) -> Deltas<Pod> {
        Deltas::from_vec(Key::new("ns/a"), list)
    }

    // The verdict tests corrupt the counters by hand; these check that the consumer itself
    // fills them in, since its checks live on the objects rather than in a per-key table.
    #[test]
    fn an_event_object_delivered_twice_counts_as_duplicated() {
        let mut c = Consumer::new(Instant::now(), Duration::ZERO);
        let p = pod(1);
        c.observe(&deltas(vec![Delta::new(DeltaType::Added, Arc::clone(&p))]));
        assert_eq!(c.counters.duplicated, 0);
        c.observe(&deltas(vec![Delta::new(DeltaType::Added, p)]));
        assert_eq!(c.counters.duplicated, 1);
        assert_eq!((c.counters.pops, c.counters.added), (2, 2));
    }

    #[test]
    fn replaced_and_sync_deltas_never_count_as_duplicated() {
        let mut c = Consumer::new(Instant::now(), Duration::ZERO);
        let p = pod(1);
        for kind in [DeltaType::Replaced, DeltaType::Sync, DeltaType::Sync] {
            c.observe(&deltas(vec![Delta::new(kind, Arc::clone(&p))]));
        }
        assert_eq!(c.counters.duplicated, 0);
        assert_eq!((c.counters.replaced, c.counters.synced), (1, 2));
    }

    #[test]
    fn a_stamped_event_records_one_latency_sample() {
        let start = Instant::now();
        let mut c = Consumer::new(start, Duration::ZERO);
        let p = pod(1);
        stamp(&Op::Update(Arc::clone(&p)), start);
        c.observe(&deltas(vec![
            Delta::new(DeltaType::Updated, p),
            Delta::new(DeltaType::Updated, pod(2)),
        ]));
        assert_eq!(c.latency.len(), 1);
    }

    #[test]
    fn an_update_to_an_older_version_counts_as_a_regression() {
        let mut c = Consumer::new(Instant::now(), Duration::ZERO);
        c.on_update(&pod(1), &pod(2));
        c.on_update(&pod(2), &pod(2));
        assert_eq!(c.counters.version_regressions, 0);
        c.on_update(&pod(3), &pod(2));
        assert_eq!(c.counters.version_regressions, 1);
        assert_eq!(c.counters.on_update, 3);
    }
}
