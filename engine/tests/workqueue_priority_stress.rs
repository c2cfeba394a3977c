//! Stress: 8 workers and several producers on random keys, random priorities and short real
//! delays, on threads and on tokio tasks.
//!
//! Checks, for the reference priority queue and the sharded one with 1, 2 and 16 shards:
//! - **exclusivity**: no key is handed to two workers at once;
//! - **nothing lost**: every key added after its last `get` is handed out again (each `get`
//!   records how many adds of its key had started; once the queue is idle, the last `get` of
//!   every key must have seen all of them);
//! - **nothing duplicated**: a key is handed out at most once per add (gets ≤ adds);
//! - **shutdown with drain** completes, with every worker done.
//!
//! Sizes scale with `KCACHE_STRESS_SCALE` (default 1, CI-sized).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kcache::workqueue::priority::{
    AddOpts, PriorityWorkQueue, ReferencePriorityQueue, ShardedPriorityQueue,
};
use kcache::workqueue::{AsyncGet, ShutDown};
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

struct Book {
    keys: Vec<Key>,
    adds: Vec<AtomicU64>,
    seen: Vec<AtomicU64>,
    busy: Vec<AtomicBool>,
    gets: AtomicU64,
    total_adds: AtomicU64,
}

impl Book {
    fn new() -> Self {
        Self {
            keys: (0..KEYS).map(|i| Key::new(&format!("ns/k{i}"))).collect(),
            adds: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            seen: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            busy: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
            gets: AtomicU64::new(0),
            total_adds: AtomicU64::new(0),
        }
    }

    fn index(key: &Key) -> usize {
        key.as_str()[4..].parse().unwrap()
    }

    fn produce(&self, q: &dyn PriorityWorkQueue, seed: u64, adds: usize) {
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..adds {
            let i = rng.usize(..KEYS);
            let mut opts = AddOpts::new().priority([-100, 0, 5][rng.usize(..3)]);
            if rng.u8(..32) == 0 {
                opts = opts.after(Duration::from_micros(rng.u64(1..500)));
            }
            self.adds[i].fetch_add(1, Ordering::SeqCst);
            self.total_adds.fetch_add(1, Ordering::SeqCst);
            q.add_with_opts(opts, self.keys[i].clone());
        }
    }

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
        let (gets, adds) = (
            self.gets.load(Ordering::SeqCst),
            self.total_adds.load(Ordering::SeqCst),
        );
        assert!(gets <= adds, "{name}: {gets} gets for {adds} adds");
        assert!(gets >= KEYS as u64, "{name}: only {gets} gets");
    }
}

fn queues() -> Vec<(&'static str, Arc<dyn PriorityWorkQueue>)> {
    vec![
        ("reference", Arc::new(ReferencePriorityQueue::new())),
        ("sharded/1", Arc::new(ShardedPriorityQueue::new(1))),
        ("sharded/2", Arc::new(ShardedPriorityQueue::new(2))),
        ("sharded/16", Arc::new(ShardedPriorityQueue::new(16))),
    ]
}

/// Nothing waiting, ready or processing: once the producers are done, nothing can come back.
/// The three counts are read one after another, in the order an entry moves (waiting, then
/// ready, then processing), so an entry that moves between two reads is still seen by the
/// later one. Read the other way round, an entry the clock made ready after the ready count
/// and before the waiting count was missed by both, and the queue was shut down with it
/// still queued.
fn idle(q: &dyn PriorityWorkQueue) -> bool {
    q.waiting_len() == 0 && q.is_empty() && q.processing_len() == 0
}

fn wait_idle(q: &dyn PriorityWorkQueue, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !idle(q) {
        assert!(
            Instant::now() < deadline,
            "{name}: the workers never emptied the queue ({} ready, {} waiting, {} processing)",
            q.len(),
            q.waiting_len(),
            q.processing_len()
        );
        thread::yield_now();
    }
}

#[test]
fn threads_never_share_a_key_lose_nothing_and_drain_on_shutdown() {
    let adds = 40_000 * scale();
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
    }
}

#[test]
fn tokio_tasks_never_share_a_key_and_lose_nothing() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let adds = 40_000 * scale();
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
