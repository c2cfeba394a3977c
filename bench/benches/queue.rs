//! DeltaFIFO operations, one criterion group per operation, competitors side by side:
//! `reference` (the client-go port), `sharded` (16 shards), `sharded_1shard` and `floor` (the
//! same bookkeeping in a plain map with no lock: the lower bound, see `bench::floor`).
//!
//! Every iteration starts from a fresh queue built off the clock (`bench::time_with_setup`);
//! the clock covers only the operation, over a whole batch of keys, and the throughput is in
//! keys (objects) per second. All objects and keys are built once, before any group runs.
//!
//! | group | state before | timed |
//! |---|---|---|
//! | `enqueue_new` | empty queue | `add` of 100,000 new keys |
//! | `enqueue_queued` | 100,000 keys queued (`Added`) | `update` of each: the key is already queued |
//! | `pop` | 100,000 keys queued | 100,000 `pop`s |
//! | `pop_batch` | 100,000 keys queued | `pop_batch(256)` until all are popped |
//! | `replace` | empty queue; known store of 151,500 objects | `replace` with 150,000 of them (1,500 tombstones) |
//! | `resync` | empty queue; known store of 150,000 objects | `resync` (150,000 `Sync` deltas) |
//!
//! The global allocator is mimalloc, as in the loadgen binary: with glibc's allocator, whether
//! a 10 MB table comes from fresh pages (page faults) or from reused memory depended on which
//! competitor ran before, which skewed the comparison by up to 2x.
//!
//! Single-threaded on purpose: these are the costs of one operation, lock included, with no
//! contention. Contention is what the load generator measures.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bench::floor::{FloorIndexer, FloorQueue};
use bench::{pods, time_with_setup, universe, Pod, BATCH};
use criterion::{criterion_group, criterion_main, Bencher, Criterion, SamplingMode, Throughput};
use kcache::{DeltaQueue, KnownObjects, Store};

/// mimalloc, as in the loadgen binary (see the module docs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Keys queued by the per-key operations (the W1 key count of docs/workloads.md).
const KEYS: usize = 100_000;
/// Objects listed by `replace`, and known objects `resync` walks (the W3 key count of docs/workloads.md).
const RELIST: usize = 150_000;
/// Known keys that `replace`'s list leaves out: 1% of the list, as in W3.
const MISSED: usize = RELIST / 100;

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

type Known = Option<Arc<dyn KnownObjects<Pod>>>;

fn reference(known: Known) -> kcache::reference::DeltaFifo<Pod> {
    bench::reference_queue(known)
}

fn sharded(known: Known) -> kcache::sharded::DeltaFifo<Pod> {
    bench::sharded_queue(known, kcache::sharded::DEFAULT_SHARDS)
}

fn sharded_1shard(known: Known) -> kcache::sharded::DeltaFifo<Pod> {
    bench::sharded_queue(known, 1)
}

/// The operations the groups time, so each timed loop is written once for every competitor:
/// the engines through [`DeltaQueue`], the floor (which is not one) through [`Floor`].
trait Competitor {
    fn add(&mut self, obj: Arc<Pod>);
    fn update(&mut self, obj: Arc<Pod>);
    /// Pops one key, which must be queued.
    fn pop_one(&mut self);
    /// Pops up to [`BATCH`] keys; returns how many.
    fn pop_batch(&mut self) -> usize;
    fn replace(&mut self, list: Vec<Arc<Pod>>);
    fn resync(&mut self);
}

impl<Q: DeltaQueue<Pod>> Competitor for Q {
    fn add(&mut self, obj: Arc<Pod>) {
        DeltaQueue::add(self, obj).expect("pods always have keys");
    }

    fn update(&mut self, obj: Arc<Pod>) {
        DeltaQueue::update(self, obj).expect("pods always have keys");
    }

    fn pop_one(&mut self) {
        let popped = self.pop(|deltas, initial| black_box((deltas.len(), initial)));
        black_box(popped.expect("the queue holds every key"));
    }

    fn pop_batch(&mut self) -> usize {
        DeltaQueue::pop_batch(self, BATCH, |deltas, initial| {
            black_box((deltas.len(), initial));
        })
        .expect("the queue holds every key")
    }

    fn replace(&mut self, list: Vec<Arc<Pod>>) {
        DeltaQueue::replace(self, list, "bench").expect("pods always have keys");
    }

    fn resync(&mut self) {
        DeltaQueue::resync(self).expect("pods always have keys");
    }
}

/// The floor queue with the known store its `replace` and `resync` read (the engines hold
/// theirs from construction).
struct Floor<'a> {
    queue: FloorQueue<Pod>,
    known: Option<&'a FloorIndexer<Pod>>,
}

fn floor(known: Option<&FloorIndexer<Pod>>) -> Floor<'_> {
    Floor {
        queue: FloorQueue::new(bench::pod_key_fn()),
        known,
    }
}

impl Competitor for Floor<'_> {
    fn add(&mut self, obj: Arc<Pod>) {
        self.queue.add(obj).expect("pods always have keys");
    }

    fn update(&mut self, obj: Arc<Pod>) {
        self.queue.update(obj).expect("pods always have keys");
    }

    fn pop_one(&mut self) {
        let popped = self
            .queue
            .pop(|deltas, initial| black_box((deltas.len(), initial)));
        black_box(popped.expect("the queue holds every key"));
    }

    fn pop_batch(&mut self) -> usize {
        self.queue.pop_batch(BATCH, |deltas, initial| {
            black_box((deltas.len(), initial));
        })
    }

    fn replace(&mut self, list: Vec<Arc<Pod>>) {
        self.queue
            .replace(list, self.known)
            .expect("pods always have keys");
    }

    fn resync(&mut self) {
        let known = self
            .known
            .expect("resync's floor is built with its known store");
        self.queue.resync(known).expect("pods always have keys");
    }
}

fn filled<Q: Competitor>(mut queue: Q, objs: &[Arc<Pod>]) -> Q {
    for obj in objs {
        queue.add(Arc::clone(obj));
    }
    queue
}

// ---- enqueue_new ---------------------------------------------------------------------------

fn enqueue_new_on<Q: Competitor>(b: &mut Bencher<'_>, make: impl Fn() -> Q, objs: &[Arc<Pod>]) {
    b.iter_custom(|iters| {
        time_with_setup(
            iters,
            || (make(), objs.to_vec()),
            |(mut queue, batch)| {
                for obj in batch {
                    queue.add(obj);
                }
                queue
            },
        )
    });
}

fn enqueue_new(c: &mut Criterion) {
    let u = universe(KEYS);
    let adds = pods(&u, 1);
    let mut g = c.benchmark_group("enqueue_new");
    g.throughput(Throughput::Elements(KEYS as u64));
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function("reference", |b| {
        enqueue_new_on(b, || reference(None), &adds)
    });
    g.bench_function("sharded", |b| enqueue_new_on(b, || sharded(None), &adds));
    g.bench_function("sharded_1shard", |b| {
        enqueue_new_on(b, || sharded_1shard(None), &adds);
    });
    g.bench_function("floor", |b| enqueue_new_on(b, || floor(None), &adds));
    g.finish();
}

// ---- enqueue_queued ------------------------------------------------------------------------

fn enqueue_queued_on<Q: Competitor>(
    b: &mut Bencher<'_>,
    make: impl Fn() -> Q,
    adds: &[Arc<Pod>],
    updates: &[Arc<Pod>],
) {
    b.iter_custom(|iters| {
        time_with_setup(
            iters,
            || (filled(make(), adds), updates.to_vec()),
            |(mut queue, batch)| {
                for obj in batch {
                    queue.update(obj);
                }
                queue
            },
        )
    });
}

fn enqueue_queued(c: &mut Criterion) {
    let u = universe(KEYS);
    let adds = pods(&u, 1);
    let updates = pods(&u, 2);
    let mut g = c.benchmark_group("enqueue_queued");
    g.throughput(Throughput::Elements(KEYS as u64));
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function("reference", |b| {
        enqueue_queued_on(b, || reference(None), &adds, &updates);
    });
    g.bench_function("sharded", |b| {
        enqueue_queued_on(b, || sharded(None), &adds, &updates);
    });
    g.bench_function("sharded_1shard", |b| {
        enqueue_queued_on(b, || sharded_1shard(None), &adds, &updates);
    });
    g.bench_function("floor", |b| {
        enqueue_queued_on(b, || floor(None), &adds, &updates);
    });
    g.finish();
}

// ---- pop -----------------------------------------------------------------------------------

fn pop_on<Q: Competitor>(b: &mut Bencher<'_>, make: impl Fn() -> Q, adds: &[Arc<Pod>]) {
    b.iter_custom(|iters| {
        time_with_setup(
            iters,
            || filled(make(), adds),
            |mut queue| {
                for _ in 0..adds.len() {
                    queue.pop_one();
                }
                queue
            },
        )
    });
}

fn pop(c: &mut Criterion) {
    let u = universe(KEYS);
    let adds = pods(&u, 1);
    let mut g = c.benchmark_group("pop");
    g.throughput(Throughput::Elements(KEYS as u64));
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function("reference", |b| pop_on(b, || reference(None), &adds));
    g.bench_function("sharded", |b| pop_on(b, || sharded(None), &adds));
    g.bench_function("sharded_1shard", |b| {
        pop_on(b, || sharded_1shard(None), &adds)
    });
    g.bench_function("floor", |b| pop_on(b, || floor(None), &adds));
    g.finish();
}

// ---- pop_batch -----------------------------------------------------------------------------

fn pop_batch_on<Q: Competitor>(b: &mut Bencher<'_>, make: impl Fn() -> Q, adds: &[Arc<Pod>]) {
    b.iter_custom(|iters| {
        time_with_setup(
            iters,
            || filled(make(), adds),
            |mut queue| {
                let mut popped = 0;
                while popped < adds.len() {
                    popped += queue.pop_batch();
                }
                queue
            },
        )
    });
}

fn pop_batch(c: &mut Criterion) {
    let u = universe(KEYS);
    let adds = pods(&u, 1);
    let mut g = c.benchmark_group("pop_batch");
    g.throughput(Throughput::Elements(KEYS as u64));
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function("reference", |b| pop_batch_on(b, || reference(None), &adds));
    g.bench_function("sharded", |b| pop_batch_on(b, || sharded(None), &adds));
    g.bench_function("sharded_1shard", |b| {
        pop_batch_on(b, || sharded_1shard(None), &adds);
    });
    g.bench_function("floor", |b| pop_batch_on(b, || floor(None), &adds));
    g.finish();
}

// ---- replace and resync --------------------------------------------------------------------

/// Known stores of each kind holding `objs`: what `replace` and `resync` consult.
struct KnownStores {
    reference: Arc<kcache::reference::IndexedStore<Pod>>,
    sharded: Arc<kcache::sharded::IndexedStore<Pod>>,
    floor: FloorIndexer<Pod>,
}

impl KnownStores {
    fn holding(objs: &[Arc<Pod>]) -> Self {
        let reference = Arc::new(bench::reference_indexer());
        let sharded = Arc::new(bench::sharded_indexer());
        let mut floor = bench::floor_indexer();
        for obj in objs {
            reference
                .add(Arc::clone(obj))
                .expect("pods always have keys");
            sharded.add(Arc::clone(obj)).expect("pods always have keys");
            floor
                .update(Arc::clone(obj))
                .expect("pods always have keys");
        }
        Self {
            reference,
            sharded,
            floor,
        }
    }

    fn reference(&self) -> Known {
        Some(Arc::clone(&self.reference) as Arc<dyn KnownObjects<Pod>>)
    }

    fn sharded(&self) -> Known {
        Some(Arc::clone(&self.sharded) as Arc<dyn KnownObjects<Pod>>)
    }
}

fn replace_on<Q: Competitor>(b: &mut Bencher<'_>, make: impl Fn() -> Q, list: &[Arc<Pod>]) {
    b.iter_custom(|iters| {
        time_with_setup(
            iters,
            || (make(), list.to_vec()),
            |(mut queue, list)| {
                queue.replace(list);
                queue
            },
        )
    });
}

fn replace(c: &mut Criterion) {
    let u = universe(RELIST + MISSED);
    let known = KnownStores::holding(&pods(&u, 1));
    let mut list = pods(&u, 2);
    list.truncate(RELIST);
    let mut g = c.benchmark_group("replace");
    g.throughput(Throughput::Elements(RELIST as u64));
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function("reference", |b| {
        replace_on(b, || reference(known.reference()), &list);
    });
    g.bench_function("sharded", |b| {
        replace_on(b, || sharded(known.sharded()), &list);
    });
    g.bench_function("sharded_1shard", |b| {
        replace_on(b, || sharded_1shard(known.sharded()), &list);
    });
    g.bench_function("floor", |b| {
        replace_on(b, || floor(Some(&known.floor)), &list);
    });
    g.finish();
}

fn resync_on<Q: Competitor>(b: &mut Bencher<'_>, make: impl Fn() -> Q) {
    b.iter_custom(|iters| {
        time_with_setup(iters, &make, |mut queue| {
            queue.resync();
            queue
        })
    });
}

fn resync(c: &mut Criterion) {
    let u = universe(RELIST);
    let known = KnownStores::holding(&pods(&u, 1));
    let mut g = c.benchmark_group("resync");
    g.throughput(Throughput::Elements(RELIST as u64));
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function("reference", |b| {
        resync_on(b, || reference(known.reference()))
    });
    g.bench_function("sharded", |b| resync_on(b, || sharded(known.sharded())));
    g.bench_function("sharded_1shard", |b| {
        resync_on(b, || sharded_1shard(known.sharded()));
    });
    g.bench_function("floor", |b| resync_on(b, || floor(Some(&known.floor))));
    g.finish();
}

criterion_group! {
    name = queue;
    config = config();
    targets = enqueue_new, enqueue_queued, pop, pop_batch, replace, resync
}
criterion_main!(queue);
