//! Test fixtures shared by the engine's integration tests.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use kcache::{Key, KeyError, KeyMap, KnownObjects, QueueOptions, Store};

pub mod workqueue_stress;

/// Joins every thread, in order, and returns what each returned; a thread's panic fails the
/// test here.
pub fn join_all<T>(threads: impl IntoIterator<Item = std::thread::JoinHandle<T>>) -> Vec<T> {
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

/// The stress tests' size factor, from `KCACHE_STRESS_SCALE` (default 1, CI-sized): a long
/// soak is one variable away.
pub fn stress_scale() -> usize {
    std::env::var("KCACHE_STRESS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// A test object: a key and a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Obj {
    pub key: Key,
    pub v: u64,
}

pub fn obj(key: &str, v: u64) -> Arc<Obj> {
    Arc::new(Obj {
        key: Key::new(key),
        v,
    })
}

pub fn key_of(o: &Obj) -> Result<Key, KeyError> {
    if o.key.as_str().is_empty() {
        Err(KeyError::new("empty key"))
    } else {
        Ok(o.key.clone())
    }
}

pub fn options() -> QueueOptions<Obj> {
    QueueOptions::new(Arc::new(key_of))
}

/// A minimal thread-safe store, so these tests do not depend on either indexer.
#[derive(Debug, Default)]
pub struct MapStore(Mutex<KeyMap<Arc<Obj>>>);

impl MapStore {
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let mut out: Vec<_> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(k, o)| (k.to_string(), o.v))
            .collect();
        out.sort();
        out
    }
}

impl KnownObjects<Obj> for MapStore {
    fn list_keys(&self) -> Vec<Key> {
        self.0.lock().unwrap().keys().cloned().collect()
    }
    fn get_by_key(&self, key: &Key) -> Option<Arc<Obj>> {
        self.0.lock().unwrap().get(key).cloned()
    }
}

impl Store<Obj> for MapStore {
    fn key_of(&self, obj: &Obj) -> Result<Key, KeyError> {
        key_of(obj)
    }
    fn insert_by_key(&self, key: Key, obj: Arc<Obj>) -> Option<Arc<Obj>> {
        self.0.lock().unwrap().insert(key, obj)
    }
    fn remove_by_key(&self, key: &Key) -> Option<Arc<Obj>> {
        self.0.lock().unwrap().remove(key)
    }
    fn replace(&self, list: Vec<Arc<Obj>>) -> Result<(), KeyError> {
        let mut map = KeyMap::default();
        for o in list {
            map.insert(key_of(&o)?, o);
        }
        *self.0.lock().unwrap() = map;
        Ok(())
    }
    fn list(&self) -> Vec<Arc<Obj>> {
        self.0.lock().unwrap().values().cloned().collect()
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// A delta as (type, tombstone?, version), for compact assertions.
pub fn summary(deltas: &kcache::Deltas<Obj>) -> Vec<(kcache::DeltaType, bool, Option<u64>)> {
    deltas
        .iter()
        .map(|d| {
            (
                d.kind,
                d.object.is_tombstone(),
                d.object.last_known().map(|o| o.v),
            )
        })
        .collect()
}

/// [`summary`] with each delta type by name, as the differential tests' output lines write it.
pub fn named_summary(deltas: &kcache::Deltas<Obj>) -> Vec<(String, bool, Option<u64>)> {
    summary(deltas)
        .into_iter()
        .map(|(kind, tombstone, v)| (kind.to_string(), tombstone, v))
        .collect()
}

/// A pop as the differential tests compare it: the key, whether it came from the initial
/// list, and its deltas by [`named_summary`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Popped {
    pub key: String,
    pub initial: bool,
    pub deltas: Vec<(String, bool, Option<u64>)>,
}

impl Popped {
    pub fn of(deltas: &kcache::Deltas<Obj>, initial: bool) -> Self {
        Self {
            key: deltas.key().to_string(),
            initial,
            deltas: named_summary(deltas),
        }
    }
}

/// An output line of a differential run, which may be a pop.
pub trait PopLine {
    fn popped(&self) -> Option<&Popped>;
}

/// Pop lines grouped by key, everything else in order: what a run on several shards must
/// agree with the reference on, as pops of different keys may come in another order.
pub fn grouped<L: PopLine>(lines: Vec<L>) -> (Vec<L>, std::collections::BTreeMap<String, Vec<L>>) {
    let mut other = Vec::new();
    let mut by_key: std::collections::BTreeMap<String, Vec<L>> = Default::default();
    for line in lines {
        match line.popped() {
            Some(pop) => by_key.entry(pop.key.clone()).or_default().push(line),
            None => other.push(line),
        }
    }
    (other, by_key)
}

/// A waker that counts how often it was woken.
#[derive(Debug, Default)]
pub struct CountingWaker {
    wakes: std::sync::atomic::AtomicUsize,
}

impl CountingWaker {
    pub fn wakes(&self) -> usize {
        self.wakes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl std::task::Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A priority queue under test, on a fake clock of its own.
pub struct QueueOnFakeClock {
    pub name: String,
    /// 1 for the reference.
    pub shards: usize,
    pub clock: Arc<kcache::workqueue::FakeClock>,
    pub queue: Arc<dyn kcache::workqueue::priority::PriorityWorkQueue>,
}

/// Every priority queue, each on a fake clock of its own, with `limiter()`'s rate limiter and
/// `options`: the reference, and the sharded queue with 1 and 16 shards.
pub fn priority_queues_on_fake_clocks(
    limiter: impl Fn() -> Box<dyn kcache::workqueue::RateLimiter<Key>>,
    options: &kcache::workqueue::priority::PriorityOptions,
) -> Vec<QueueOnFakeClock> {
    use kcache::workqueue::priority::{ReferencePriorityQueue, ShardedPriorityQueue};
    use kcache::workqueue::{FakeClock, QueueConfig};

    let on_fake_clock = || {
        let clock = Arc::new(FakeClock::new());
        (clock.clone(), QueueConfig::new().clock(clock))
    };
    let (clock, config) = on_fake_clock();
    let reference = ReferencePriorityQueue::with_options(&config, limiter(), options.clone());
    let mut queues = vec![QueueOnFakeClock {
        name: "reference".to_string(),
        shards: 1,
        clock,
        queue: Arc::new(reference),
    }];
    for shards in [1, 16] {
        let (clock, config) = on_fake_clock();
        let q = ShardedPriorityQueue::with_options(shards, &config, limiter(), options.clone());
        queues.push(QueueOnFakeClock {
            name: format!("sharded/{shards}"),
            shards,
            clock,
            queue: Arc::new(q),
        });
    }
    queues
}

/// How a differential run makes room for a producer when the queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MakeRoom {
    /// Pop one key at a time until there is room (one shard: pop order is the reference's).
    PopOne,
    /// Drain everything (any shard count: only per-key order is the reference's).
    Drain,
}

/// Pops with `pop` (which returns each pop's output line) until `q` has room, `how` says how
/// far each time, and adds the lines to `out`.
pub fn make_room<Q: kcache::DeltaQueue<Obj>, L>(
    q: &Q,
    how: MakeRoom,
    out: &mut Vec<L>,
    mut pop: impl FnMut(&Q) -> kcache::TryPop<L>,
) {
    while !q.has_room() {
        let mut popped = false;
        while let kcache::TryPop::Popped(line) = pop(q) {
            out.push(line);
            popped = true;
            if how == MakeRoom::PopOne {
                break;
            }
        }
        // A full queue always has something to pop; if not, the count is wrong, and the
        // producer would wait forever.
        assert!(popped, "no room, yet nothing to pop");
    }
}

/// The maximal runs of consecutive lines that are `gets`, as index ranges: what the queues'
/// differential tests compare as multisets when several shards may hand keys out in another
/// order.
pub fn get_runs<L>(lines: &[L], is_get: impl Fn(&L) -> bool) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut start = 0;
    while start < lines.len() {
        if !is_get(&lines[start]) {
            start += 1;
            continue;
        }
        let end = (start..lines.len())
            .find(|&i| !is_get(&lines[i]))
            .unwrap_or(lines.len());
        runs.push(start..end);
        start = end;
    }
    runs
}
