//! Indexer operations, one criterion group per operation, competitors side by side:
//! `reference` (client-go's `threadSafeMap`: one `RwLock`), `sharded` (the concurrent indexer,
//! through the `Arc` API), `sharded_guarded` (its borrowed reads, in the read groups: one
//! `pin()` per read, no reference count per object) and `floor`, the same bookkeeping in plain maps with no lock (see `bench::floor`), index
//! sets of keys like both engines': an engine's price of concurrency is its distance to the
//! floor. Every store holds 100,000 pods indexed by `namespace` and `node`.
//!
//! | group | timed |
//! |---|---|
//! | `indexer_update_unchanged` | `update` of all 100,000 pods, new version, same index values |
//! | `indexer_update_changed` | `update` of all 100,000 pods, each moved to another node |
//! | `get_with_writer` | 1,000 `get_by_key` of random keys while a writer thread updates |
//! | `by_index_with_writer` | 100 `by_index("node", v)` of random nodes while a writer updates |
//!
//! The global allocator is mimalloc, as in the loadgen binary: with glibc's allocator, whether
//! a 10 MB table comes from fresh pages (page faults) or from reused memory depended on which
//! competitor ran before, which skewed the comparison by up to 2x.
//!
//! In the `*_with_writer` groups one background thread loops over every pod, updating it, the
//! whole time the group runs (10% of its updates move a pod to another node, so index sets
//! change too), while the measured thread reads (`iter_custom` times only the reads). A floor
//! cannot be shared with a writer (it has no lock), so its figure there is the same reads with
//! no writer at all: what a read costs when nothing else happens.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use bench::floor::FloorIndexer;
use bench::{pods, pods_moving, random_indices, universe, Pod, NODES, NODE_INDEX};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use kcache::{Indexer, Key, Store};

/// mimalloc, as in the loadgen binary (see the module docs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Pods in every store (the W1 key count of docs/workloads.md).
const KEYS: usize = 100_000;
/// `get_by_key` calls per timed iteration.
const GETS: usize = 1_000;
/// `by_index` calls per timed iteration.
const BY_INDEX: usize = 100;

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

/// The three stores, filled with the same pods.
struct Stores {
    reference: kcache::reference::IndexedStore<Pod>,
    sharded: kcache::sharded::IndexedStore<Pod>,
    floor: FloorIndexer<Pod>,
}

impl Stores {
    fn holding(objs: &[Arc<Pod>]) -> Self {
        let mut stores = Self {
            reference: bench::reference_indexer(),
            sharded: bench::sharded_indexer(),
            floor: bench::floor_indexer(),
        };
        for obj in objs {
            stores
                .reference
                .add(Arc::clone(obj))
                .expect("pods have keys");
            stores.sharded.add(Arc::clone(obj)).expect("pods have keys");
            stores
                .floor
                .update(Arc::clone(obj))
                .expect("pods have keys");
        }
        stores
    }
}

/// Updates every pod of `rounds[round % 2]`, alternating per timed iteration so each update
/// really is a new state (and, for `changed`, a new node).
fn update_group(c: &mut Criterion, name: &str, rounds: [Vec<Arc<Pod>>; 2], initial: &[Arc<Pod>]) {
    let mut stores = Stores::holding(initial);
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(KEYS as u64));
    g.sampling_mode(SamplingMode::Flat);

    /// Times `iters` rounds of `update` on every pod of the round's batch.
    fn timed(
        mut update: impl FnMut(Arc<Pod>),
        rounds: &[Vec<Arc<Pod>>; 2],
        round: &mut usize,
        iters: u64,
    ) -> Duration {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let batch = &rounds[*round % 2];
            *round += 1;
            let start = Instant::now();
            for obj in batch {
                update(Arc::clone(obj));
            }
            total += start.elapsed();
        }
        total
    }

    fn store_update<S: Store<Pod>>(store: &S) -> impl FnMut(Arc<Pod>) + '_ {
        |obj| store.update(obj).expect("pods have keys")
    }

    let mut round = 0;
    g.bench_function("reference", |b| {
        b.iter_custom(|iters| timed(store_update(&stores.reference), &rounds, &mut round, iters));
    });
    let mut round = 0;
    g.bench_function("sharded", |b| {
        b.iter_custom(|iters| timed(store_update(&stores.sharded), &rounds, &mut round, iters));
    });
    let mut round = 0;
    let floor = &mut stores.floor;
    g.bench_function("floor", |b| {
        b.iter_custom(|iters| {
            let update = |obj| {
                floor.update(obj).expect("pods have keys");
            };
            timed(update, &rounds, &mut round, iters)
        });
    });
    g.finish();
}

fn indexer_update_unchanged(c: &mut Criterion) {
    let u = universe(KEYS);
    // Versions 2 and 3 on the same nodes as version 1: every update keeps its index values.
    update_group(
        c,
        "indexer_update_unchanged",
        [pods(&u, 2), pods(&u, 3)],
        &pods(&u, 1),
    );
}

fn indexer_update_changed(c: &mut Criterion) {
    let u = universe(KEYS);
    // Every pod alternates between node i % 5000 and the next one: every update moves it.
    update_group(
        c,
        "indexer_update_changed",
        [pods_moving(&u, 2, 1), pods(&u, 3)],
        &pods(&u, 1),
    );
}

/// Sets `stop` when dropped, so the writer ends even if a bench panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `read` with one thread updating `store` in the background until `read` returns.
fn with_writer<S: Store<Pod> + Sync>(store: &S, rounds: &[Vec<Arc<Pod>>; 2], read: impl FnOnce()) {
    let stop = AtomicBool::new(false);
    thread::scope(|scope| {
        scope.spawn(|| {
            for round in 0.. {
                for obj in &rounds[round % 2] {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    store.update(Arc::clone(obj)).expect("pods have keys");
                }
            }
        });
        let _stop = StopOnDrop(&stop);
        read();
    });
}

/// Times `iters` passes of `read` over every probe; each result goes through `black_box`.
fn timed_reads<R>(read: impl Fn(&Key) -> R, probes: &[Key], iters: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        for probe in probes {
            black_box(read(probe));
        }
    }
    start.elapsed()
}

fn get_with_writer(c: &mut Criterion) {
    let u = universe(KEYS);
    let stores = Stores::holding(&pods(&u, 1));
    let rounds = [pods(&u, 2), pods_moving(&u, 3, 10)];
    let keys: Vec<Key> = random_indices(KEYS, GETS, 7)
        .into_iter()
        .map(|i| u.keys[i].clone())
        .collect();
    let mut g = c.benchmark_group("get_with_writer");
    g.throughput(Throughput::Elements(GETS as u64));

    fn gets<S: Store<Pod>>(store: &S) -> impl Fn(&Key) -> Option<Arc<Pod>> + '_ {
        |key| store.get_by_key(key)
    }

    with_writer(&stores.reference, &rounds, || {
        g.bench_function("reference", |b| {
            b.iter_custom(|iters| timed_reads(gets(&stores.reference), &keys, iters));
        });
    });
    with_writer(&stores.sharded, &rounds, || {
        g.bench_function("sharded", |b| {
            b.iter_custom(|iters| timed_reads(gets(&stores.sharded), &keys, iters));
        });
    });
    with_writer(&stores.sharded, &rounds, || {
        g.bench_function("sharded_guarded", |b| {
            let get = |key: &Key| stores.sharded.pin().get_by_key(key).is_some();
            b.iter_custom(|iters| timed_reads(get, &keys, iters));
        });
    });
    g.bench_function("floor", |b| {
        b.iter_custom(|iters| timed_reads(|key| stores.floor.get_by_key(key), &keys, iters));
    });
    g.finish();
}

fn by_index_with_writer(c: &mut Criterion) {
    let u = universe(KEYS);
    let stores = Stores::holding(&pods(&u, 1));
    let rounds = [pods(&u, 2), pods_moving(&u, 3, 10)];
    let nodes: Vec<Key> = random_indices(NODES, BY_INDEX, 11)
        .into_iter()
        .map(|i| u.nodes[i].clone())
        .collect();
    let mut g = c.benchmark_group("by_index_with_writer");
    g.throughput(Throughput::Elements(BY_INDEX as u64));

    fn by_node<S: Indexer<Pod>>(store: &S) -> impl Fn(&Key) -> Vec<Arc<Pod>> + '_ {
        |node| {
            store
                .by_index(NODE_INDEX, node.as_str())
                .expect("node is an index")
        }
    }

    with_writer(&stores.reference, &rounds, || {
        g.bench_function("reference", |b| {
            b.iter_custom(|iters| timed_reads(by_node(&stores.reference), &nodes, iters));
        });
    });
    with_writer(&stores.sharded, &rounds, || {
        g.bench_function("sharded", |b| {
            b.iter_custom(|iters| timed_reads(by_node(&stores.sharded), &nodes, iters));
        });
    });
    with_writer(&stores.sharded, &rounds, || {
        g.bench_function("sharded_guarded", |b| {
            // Borrowed objects cannot outlive the guard: the read returns their count (the
            // Vec is built and freed, as in the Arc read).
            let by_node = |node: &Key| {
                stores
                    .sharded
                    .pin()
                    .by_index(NODE_INDEX, node.as_str())
                    .expect("node is an index")
                    .len()
            };
            b.iter_custom(|iters| timed_reads(by_node, &nodes, iters));
        });
    });
    let floor_by_node = |node: &Key| {
        stores
            .floor
            .by_index(NODE_INDEX, node.as_str())
            .expect("node is an index")
    };
    g.bench_function("floor", |b| {
        b.iter_custom(|iters| timed_reads(floor_by_node, &nodes, iters));
    });
    g.finish();
}

criterion_group! {
    name = indexer;
    config = config();
    targets = indexer_update_unchanged, indexer_update_changed, get_with_writer, by_index_with_writer
}
criterion_main!(indexer);
