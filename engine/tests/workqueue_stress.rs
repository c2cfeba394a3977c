//! Stress: 8 workers and several producers on random keys, on threads and on tokio tasks.
//!
//! Checks, for the reference port and the sharded queue with 1, 2 and 16 shards:
//! - **exclusivity**: no key is handed to two workers at once;
//! - **nothing lost**: every key added after its last `get` is handed out again (each `get`
//!   records how many adds of its key had started; after the queue is drained, the last `get`
//!   of every key must have seen all of them);
//! - **shutdown with drain** completes, with every worker done.
//!
//! Sizes scale with `KCACHE_STRESS_SCALE` (default 1, CI-sized).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kcache::workqueue::{AsyncGet, ReferenceQueue, ShardedQueue, ShutDown, WorkQueue};
use kcache::Key;

const KEYS: usize = 256;
const WORKERS: usize = 8;
const PRODUCERS: usize = 4;

fn scale() -> usize {
    std::env::var("KCACHE_STRESS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// Per-key bookkeeping shared by producers and workers.
struct Book {
    keys: Vec<Key>,
    /// Adds started per key (incremented *before* `add`, so a `get` that misses one is
    /// followed by another `get`).
    adds: Vec<AtomicU64>,
    /// The largest `adds` value any `get` of the key observed.
    seen: Vec<AtomicU64>,
    busy: Vec<AtomicBool>,
    gets: AtomicU64,
}

impl Book {
    fn new() -> Self {
        Self {
            keys: (0..KEYS).map(|i| Key::new(&format!("ns/k{i}"))).collect(),
            adds: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            seen: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            busy: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
            gets: AtomicU64::new(0),
        }
    }

    fn index(key: &Key) -> usize {
        key.as_str()[4..].parse().unwrap()
    }

    fn produce(&self, q: &dyn WorkQueue, seed: u64, adds: usize) {
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..adds {
            let i = rng.usize(..KEYS);
            self.adds[i].fetch_add(1, Ordering::SeqCst);
            q.add(self.keys[i].clone());
        }
    }

    /// A worker's processing of `key`: claim it, record what it saw, release it.
    fn process(&self, key: &Key) {
        let i = Self::index(key);
        assert!(
            !self.busy[i].swap(true, Ordering::SeqCst),
            "{key} handed to two workers at once"
        );
        let adds = self.adds[i].load(Ordering::SeqCst);
        self.seen[i].fetch_max(adds, Ordering::SeqCst);
        self.gets.fetch_add(1, Ordering::SeqCst);
        std::hint::spin_loop();
        self.busy[i].store(false, Ordering::SeqCst);
    }

    fn check(&self, name: &str) {
        for i in 0..KEYS {
            assert_eq!(
                self.seen[i].load(Ordering::SeqCst),
                self.adds[i].load(Ordering::SeqCst),
                "{name}: {} was added after its last get and never handed out again",
                self.keys[i]
            );
        }
    }
}

fn queues() -> Vec<(&'static str, Arc<dyn WorkQueue>)> {
    vec![
        ("reference", Arc::new(ReferenceQueue::new())),
        ("sharded/1", Arc::new(ShardedQueue::new(1))),
        ("sharded/2", Arc::new(ShardedQueue::new(2))),
        ("sharded/16", Arc::new(ShardedQueue::new(16))),
    ]
}

/// Whether the workers are idle for good: nothing queued and nothing being processed. Once
/// the producers are done only a worker's `done` could queue an item again, and no worker
/// holds one.
fn idle(q: &dyn WorkQueue) -> bool {
    q.is_empty() && q.processing_len() == 0
}

/// Waits (at most 30 s) until the workers are [`idle`].
fn wait_idle(q: &dyn WorkQueue, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !idle(q) {
        assert!(
            Instant::now() < deadline,
            "{name}: the workers never emptied the queue ({} queued, {} processing)",
            q.len(),
            q.processing_len()
        );
        thread::yield_now();
    }
}

#[test]
fn threads_never_share_a_key_lose_nothing_and_drain_on_shutdown() {
    let adds = 60_000 * scale();
    for (name, q) in queues() {
        let book = Arc::new(Book::new());
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (q, book) = (q.clone(), book.clone());
                thread::spawn(move || {
                    while let Ok(key) = q.get() {
                        book.process(&key);
                        q.done(&key).unwrap();
                    }
                })
            })
            .collect();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (q, book) = (q.clone(), book.clone());
                thread::spawn(move || book.produce(&*q, p as u64 + 1, adds / PRODUCERS))
            })
            .collect();
        for p in producers {
            p.join().unwrap();
        }
        wait_idle(&*q, name);
        q.shut_down_with_drain();
        for w in workers {
            w.join().unwrap();
        }
        book.check(name);
        assert!(book.gets.load(Ordering::SeqCst) >= KEYS as u64, "{name}");
    }
}

/// Shutdown while producers still add: the drain completes, workers exit, and every key whose
/// adds were accepted before the shutdown (the queue refuses the rest) was handed out.
#[test]
fn shutdown_with_drain_completes_under_load() {
    for (name, q) in queues() {
        let book = Arc::new(Book::new());
        let workers: Vec<_> = (0..WORKERS)
            .map(|_| {
                let (q, book) = (q.clone(), book.clone());
                thread::spawn(move || {
                    while let Ok(key) = q.get() {
                        book.process(&key);
                        q.done(&key).unwrap();
                    }
                })
            })
            .collect();
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let (q, book) = (q.clone(), book.clone());
                thread::spawn(move || book.produce(&*q, p as u64 + 11, 5_000 * scale()))
            })
            .collect();
        // Shut down once the workers are at it, while the producers still add.
        let deadline = Instant::now() + Duration::from_secs(30);
        while book.gets.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "{name}: no worker got an item");
            thread::yield_now();
        }
        q.shut_down_with_drain();
        for w in workers {
            w.join().unwrap();
        }
        for p in producers {
            p.join().unwrap();
        }
        assert!(
            q.is_empty(),
            "{name}: workers exit only once nothing is queued"
        );
    }
}

#[test]
fn tokio_tasks_never_share_a_key_and_lose_nothing() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let adds = 60_000 * scale();
    for (name, q) in queues() {
        let book = Arc::new(Book::new());
        runtime.block_on(async {
            let workers: Vec<_> = (0..WORKERS)
                .map(|_| {
                    let (q, book) = (q.clone(), book.clone());
                    tokio::spawn(async move {
                        loop {
                            match q.get_async().await {
                                Ok(key) => {
                                    book.process(&key);
                                    q.done(&key).unwrap();
                                }
                                Err(ShutDown) => return,
                            }
                        }
                    })
                })
                .collect();
            // Producers are threads: an add never waits, so it needs no task.
            let producers: Vec<_> = (0..PRODUCERS)
                .map(|p| {
                    let (q, book) = (q.clone(), book.clone());
                    thread::spawn(move || book.produce(&*q, p as u64 + 21, adds / PRODUCERS))
                })
                .collect();
            for p in producers {
                p.join().unwrap();
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            while !idle(&*q) {
                assert!(
                    Instant::now() < deadline,
                    "{name}: the tasks never emptied the queue"
                );
                tokio::task::yield_now().await;
            }
            // Drain from a blocking thread: it waits for the tasks' `done`s.
            let drainer = {
                let q = q.clone();
                tokio::task::spawn_blocking(move || q.shut_down_with_drain())
            };
            for w in workers {
                w.await.unwrap();
            }
            drainer.await.unwrap();
        });
        book.check(name);
    }
}
