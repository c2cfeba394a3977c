//! Work queue operations (`kcache::workqueue`), competitors side by side in each group:
//! `reference` (client-go's port: one lock, one condition variable), `sharded` (16 shards) and
//! `sharded_1shard`; `wq_round_trip_N_workers` also runs the priority queues,
//! `priority_reference` (controller-runtime's port) and `priority_sharded` (16 shards).
//!
//! | group | state before | timed |
//! |---|---|---|
//! | `wq_round_trip` | empty queue | `add`, `get`, `done` of 10,000 keys, one thread |
//! | `wq_round_trip_N_workers` | empty queue, N = 1, 4 or 16 worker threads blocked in `get` (ids `NAME/N`) | `add` of 100,000 keys by one producer until the workers have `done` them all; no work per key |
//! | `wq_add_dirty` | 100,000 keys queued | `add` of each again (deduplicated: the key is dirty) |
//! | `wq_add_after_100k_pending` | delaying queue (real clock, timer thread) with 100,000 items waiting an hour | `add_after` of 10,000 more, each ready later than the earliest (the timer is not woken) |
//! | `wq_fire_100k_ready` | delaying queue (fake clock) with 100,000 items waiting | one clock step that makes them all ready: heap pops and `add`s, earliest first |
//!
//! Every iteration starts from a fresh queue built off the clock (`bench::time_with_setup`).
//! Keys are built once, before any group runs.

use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::time_with_setup;
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use kcache::workqueue::priority::{ReferencePriorityQueue, ShardedPriorityQueue};
use kcache::workqueue::{
    DelayingQueue, FakeClock, QueueConfig, ReferenceQueue, ShardedQueue, WorkQueue,
};
use kcache::Key;

/// mimalloc, as in the loadgen binary and the other benches.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const ROUND_TRIP_KEYS: usize = 10_000;
const KEYS: usize = 100_000;
const MORE_TIMERS: usize = 10_000;
const WORKER_COUNTS: [usize; 3] = [1, 4, 16];
const HOUR: Duration = Duration::from_secs(3_600);

fn config() -> Criterion {
    Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

fn keys(n: usize) -> Vec<Key> {
    (0..n)
        .map(|i| Key::new(&format!("ns-{}/pod-{i}", i % 1000)))
        .collect()
}

type Make = fn(&QueueConfig) -> Box<dyn WorkQueue>;

/// The competitors, each a constructor from a config (the delaying groups need the clock).
const COMPETITORS: &[(&str, Make)] = &[
    ("reference", |c| Box::new(ReferenceQueue::with_config(c))),
    ("sharded", |c| Box::new(ShardedQueue::with_config(16, c))),
    ("sharded_1shard", |c| {
        Box::new(ShardedQueue::with_config(1, c))
    }),
];

/// The round trip's competitors: the basic queues and the priority ones (every key at the
/// default priority, so they do the same work).
const ROUND_TRIP_COMPETITORS: &[(&str, Make)] = &[
    ("reference", |c| Box::new(ReferenceQueue::with_config(c))),
    ("sharded", |c| Box::new(ShardedQueue::with_config(16, c))),
    ("sharded_1shard", |c| {
        Box::new(ShardedQueue::with_config(1, c))
    }),
    ("priority_reference", |c| {
        Box::new(ReferencePriorityQueue::with_config(c))
    }),
    ("priority_sharded", |c| {
        Box::new(ShardedPriorityQueue::with_config(16, c))
    }),
];

fn round_trip(c: &mut Criterion) {
    let keys = keys(ROUND_TRIP_KEYS);
    let mut g = c.benchmark_group("wq_round_trip");
    g.throughput(Throughput::Elements(ROUND_TRIP_KEYS as u64));
    for &(name, make) in COMPETITORS {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                time_with_setup(
                    iters,
                    || make(&QueueConfig::new()),
                    |q| {
                        for key in &keys {
                            q.add(key.clone());
                            let got = q.get().unwrap();
                            q.done(&got).unwrap();
                        }
                        q
                    },
                )
            })
        });
    }
    g.finish();
}

/// One producer adds `keys` while `workers` threads `get` and `done` them; the time from the
/// first add to the last `done`.
fn workers_round_trip(make: Make, workers: usize, keys: &[Key]) -> Duration {
    let q: Arc<dyn WorkQueue> = Arc::from(make(&QueueConfig::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let (q, done) = (q.clone(), done.clone());
            std::thread::spawn(move || {
                while let Ok(key) = q.get() {
                    black_box(&key);
                    q.done(&key).unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let start = Instant::now();
    for key in keys {
        q.add(key.clone());
    }
    while done.load(Ordering::Relaxed) < keys.len() {
        std::hint::spin_loop();
    }
    let elapsed = start.elapsed();
    q.shut_down();
    for t in threads {
        t.join().unwrap();
    }
    elapsed
}

fn round_trip_n_workers(c: &mut Criterion) {
    let keys = keys(KEYS);
    let mut g = c.benchmark_group("wq_round_trip_N_workers");
    g.throughput(Throughput::Elements(KEYS as u64));
    g.sampling_mode(SamplingMode::Flat);
    for workers in WORKER_COUNTS {
        for &(name, make) in ROUND_TRIP_COMPETITORS {
            g.bench_function(BenchmarkId::new(name, workers), |b| {
                b.iter_custom(|iters| {
                    (0..iters)
                        .map(|_| workers_round_trip(make, workers, &keys))
                        .sum()
                })
            });
        }
    }
    g.finish();
}

fn add_dirty(c: &mut Criterion) {
    let keys = keys(KEYS);
    let mut g = c.benchmark_group("wq_add_dirty");
    g.throughput(Throughput::Elements(KEYS as u64));
    for &(name, make) in COMPETITORS {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                time_with_setup(
                    iters,
                    || {
                        let q = make(&QueueConfig::new());
                        keys.iter().for_each(|k| q.add(k.clone()));
                        q
                    },
                    |q| {
                        for key in &keys {
                            q.add(key.clone());
                        }
                        q
                    },
                )
            })
        });
    }
    g.finish();
}

fn add_after_100k_pending(c: &mut Criterion) {
    let pending = keys(KEYS);
    let more: Vec<Key> = (0..MORE_TIMERS)
        .map(|i| Key::new(&format!("late/pod-{i}")))
        .collect();
    let mut g = c.benchmark_group("wq_add_after_100k_pending");
    g.throughput(Throughput::Elements(MORE_TIMERS as u64));
    for &(name, make) in COMPETITORS {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                time_with_setup(
                    iters,
                    || {
                        let config = QueueConfig::new();
                        let q = DelayingQueue::with_config(make(&config), &config);
                        for (i, key) in pending.iter().enumerate() {
                            q.add_after(key.clone(), HOUR + Duration::from_nanos(i as u64));
                        }
                        q
                    },
                    |q| {
                        for (i, key) in more.iter().enumerate() {
                            q.add_after(key.clone(), 2 * HOUR + Duration::from_nanos(i as u64));
                        }
                        q
                    },
                )
            })
        });
    }
    g.finish();
}

fn fire_100k_ready(c: &mut Criterion) {
    let pending = keys(KEYS);
    let mut g = c.benchmark_group("wq_fire_100k_ready");
    g.throughput(Throughput::Elements(KEYS as u64));
    for &(name, make) in COMPETITORS {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                time_with_setup(
                    iters,
                    || {
                        let clock = Arc::new(FakeClock::new());
                        let config = QueueConfig::new().clock(clock.clone());
                        let q = DelayingQueue::with_config(make(&config), &config);
                        for (i, key) in pending.iter().enumerate() {
                            q.add_after(key.clone(), Duration::from_nanos(1 + i as u64));
                        }
                        (clock, q)
                    },
                    |(clock, q)| {
                        // The fake clock adds every ready item before `step` returns.
                        clock.step(HOUR);
                        assert_eq!(q.len(), KEYS);
                        (clock, q)
                    },
                )
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = config();
    targets = round_trip, round_trip_n_workers, add_dirty, add_after_100k_pending, fire_100k_ready
}
criterion_main!(benches);
