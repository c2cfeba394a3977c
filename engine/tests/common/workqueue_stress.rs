//! The stress harness of `workqueue_stress` and `workqueue_priority_stress`: both queues are
//! checked the same way (8 workers, several producers on random keys, on threads and on tokio
//! tasks); only how a producer adds and when a queue is idle differ, see [`Stressed`].

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kcache::workqueue::{AsyncGet, ShutDown, WorkQueue};
use kcache::Key;

use super::join_all;

pub const KEYS: usize = 256;
pub const WORKERS: usize = 8;
pub const PRODUCERS: usize = 4;

/// What differs between the queues under stress.
pub trait Stressed: WorkQueue + 'static {
    /// One producer's add of `key`, with whatever options this queue takes drawn from `rng`.
    fn add_drawn(&self, rng: &mut fastrand::Rng, key: Key);

    /// Nothing queued and nothing being processed: once the producers are done only a
    /// worker's `done` could queue an item again, and no worker holds one.
    fn idle(&self) -> bool;

    /// The counts [`idle`](Stressed::idle) looks at, for a timeout's message.
    fn backlog(&self) -> String;
}

/// The queues under stress: `reference`, and the sharded queue `sharded(shards)` with 1, 2 and
/// 16 shards, named.
pub fn queues<Q: ?Sized>(
    reference: Arc<Q>,
    sharded: impl Fn(usize) -> Arc<Q>,
) -> Vec<(&'static str, Arc<Q>)> {
    vec![
        ("reference", reference),
        ("sharded/1", sharded(1)),
        ("sharded/2", sharded(2)),
        ("sharded/16", sharded(16)),
    ]
}

/// Per-key bookkeeping shared by producers and workers.
pub struct Book {
    pub keys: Vec<Key>,
    /// Adds started per key (incremented *before* `add`, so a `get` that misses one is
    /// followed by another `get`).
    adds: Vec<AtomicU64>,
    /// The largest `adds` value any `get` of the key observed.
    seen: Vec<AtomicU64>,
    busy: Vec<AtomicBool>,
    pub gets: AtomicU64,
    total_adds: AtomicU64,
}

impl Default for Book {
    fn default() -> Self {
        Self {
            keys: (0..KEYS).map(|i| Key::new(&format!("ns/k{i}"))).collect(),
            adds: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            seen: (0..KEYS).map(|_| AtomicU64::new(0)).collect(),
            busy: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
            gets: AtomicU64::new(0),
            total_adds: AtomicU64::new(0),
        }
    }
}

impl Book {
    fn index(key: &Key) -> usize {
        key.as_str()[4..].parse().unwrap()
    }

    pub fn produce<Q: Stressed + ?Sized>(&self, q: &Q, seed: u64, adds: usize) {
        let mut rng = fastrand::Rng::with_seed(seed);
        for _ in 0..adds {
            let i = rng.usize(..KEYS);
            self.adds[i].fetch_add(1, Ordering::SeqCst);
            self.total_adds.fetch_add(1, Ordering::SeqCst);
            q.add_drawn(&mut rng, self.keys[i].clone());
        }
    }

    /// A worker's processing of `key`: claim it, record what it saw, release it.
    pub fn process(&self, key: &Key) {
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

    /// Nothing lost (every key's last `get` saw all its adds), nothing duplicated (at most one
    /// `get` per add), and every key handed out.
    pub fn check(&self, name: &str) {
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

/// [`WORKERS`] threads that process and `done` every key they get, until shutdown.
pub fn spawn_thread_workers<Q: Stressed + ?Sized>(
    q: &Arc<Q>,
    book: &Arc<Book>,
) -> Vec<thread::JoinHandle<()>> {
    (0..WORKERS)
        .map(|_| {
            let (q, book) = (q.clone(), book.clone());
            thread::spawn(move || {
                while let Ok(key) = q.get() {
                    book.process(&key);
                    q.done(&key).unwrap();
                }
            })
        })
        .collect()
}

/// [`PRODUCERS`] threads (an add never waits, so even the tokio test needs no task), seeded
/// `first_seed`, `first_seed + 1`, ...
pub fn spawn_producers<Q: Stressed + ?Sized>(
    q: &Arc<Q>,
    book: &Arc<Book>,
    first_seed: u64,
    adds_each: usize,
) -> Vec<thread::JoinHandle<()>> {
    (0..PRODUCERS)
        .map(|p| {
            let (q, book) = (q.clone(), book.clone());
            thread::spawn(move || book.produce(&*q, first_seed + p as u64, adds_each))
        })
        .collect()
}

/// Waits (at most 30 s) until the workers are [`idle`](Stressed::idle).
fn wait_idle<Q: Stressed + ?Sized>(q: &Q, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !q.idle() {
        assert!(
            Instant::now() < deadline,
            "{name}: the workers never emptied the queue ({})",
            q.backlog()
        );
        thread::yield_now();
    }
}

/// Threads: no key shared, nothing lost or duplicated, and the drain completes.
pub fn threads_never_share_a_key<Q: Stressed + ?Sized>(queues: Vec<(&str, Arc<Q>)>, adds: usize) {
    for (name, q) in queues {
        let book = Arc::new(Book::default());
        let workers = spawn_thread_workers(&q, &book);
        join_all(spawn_producers(&q, &book, 1, adds / PRODUCERS));
        wait_idle(&*q, name);
        q.shut_down_with_drain();
        join_all(workers);
        book.check(name);
    }
}

/// Tokio tasks as workers: no key shared, nothing lost or duplicated, and the drain (from a
/// blocking thread, as it waits for the tasks' `done`s) completes.
pub fn tokio_tasks_never_share_a_key<Q: Stressed + ?Sized>(
    queues: Vec<(&str, Arc<Q>)>,
    adds: usize,
) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    for (name, q) in queues {
        let book = Arc::new(Book::default());
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
            join_all(spawn_producers(&q, &book, 21, adds / PRODUCERS));
            let deadline = Instant::now() + Duration::from_secs(30);
            while !q.idle() {
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
