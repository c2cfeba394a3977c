//! Multi-thread stress tests of the sharded DeltaFifo under every configuration: shards 1, 2
//! and 64; 1 to 4 producers and consumers. They check that every delta is delivered exactly
//! once, that each key's deltas keep their order, that no key is ever held by two consumers at
//! once, and that concurrent `resync`/`replace`/`close` lose nothing. With
//! `pop_batch_into`, a batch's keys stay its consumer's until its `finish` returned: what
//! consumers hand over at a batch's end arrives in each key's order (both engines).
//!
//! Sizes scale with `KCACHE_STRESS_SCALE` (default 1, a few seconds in a debug build); a long
//! soak is `KCACHE_STRESS_SCALE=100 cargo test --release -p kcache --test fifo_stress`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use common::{join_all, options, stress_scale, MapStore, Obj};
use kcache::sharded::DeltaFifo;
use kcache::{process_deltas, BatchConsumer, DeltaQueue, DeltaType, Deltas, Key, NoopHandler};

const KEYS: usize = 64;
const SHARDS: [usize; 3] = [1, 2, 64];
const THREADS: [(usize, usize); 4] = [(1, 1), (2, 2), (4, 1), (1, 4)];

/// Version encoding: producer in the high bits, its own sequence number in the low bits.
fn version(producer: usize, seq: usize) -> u64 {
    ((producer as u64) << 32) | seq as u64
}

fn key_index(key: &Key) -> usize {
    key.as_str()[1..].parse().unwrap()
}

/// One delivered delta: its type, whether it is a tombstone, and the version it carries.
type Seen = (DeltaType, bool, Option<u64>);

/// What consumers saw, per key, in delivery order.
struct Observed {
    busy: Vec<AtomicBool>,
    per_key: Vec<Mutex<Vec<Seen>>>,
    deltas: AtomicUsize,
}

impl Observed {
    fn new() -> Self {
        Self {
            busy: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
            per_key: (0..KEYS).map(|_| Mutex::new(Vec::new())).collect(),
            deltas: AtomicUsize::new(0),
        }
    }

    fn record(&self, deltas: &kcache::Deltas<Obj>) {
        let k = key_index(deltas.key());
        assert!(
            !self.busy[k].swap(true, Ordering::SeqCst),
            "key {} held by two consumers",
            deltas.key()
        );
        let mut seen = self.per_key[k].lock().unwrap();
        for d in deltas {
            seen.push((
                d.kind,
                d.object.is_tombstone(),
                d.object.last_known().map(|o| o.v),
            ));
        }
        drop(seen);
        self.deltas.fetch_add(deltas.len(), Ordering::Relaxed);
        if k % 7 == 0 {
            // Hold some keys a little longer so other consumers meet them in flight.
            thread::yield_now();
        }
        self.busy[k].store(false, Ordering::SeqCst);
    }

    /// Every producer's updates to every key arrived once and in the order they were sent.
    fn assert_updates_complete_and_ordered(&self, producers: usize, per_producer: usize) {
        let mut total = 0;
        for (k, seen) in self.per_key.iter().enumerate() {
            let mut last = vec![None::<u64>; producers];
            for &(kind, _, v) in seen.lock().unwrap().iter() {
                if kind != DeltaType::Updated {
                    continue;
                }
                let v = v.unwrap();
                let p = (v >> 32) as usize;
                assert!(
                    last[p].is_none_or(|prev| prev < v),
                    "key k{k}: producer {p} out of order"
                );
                last[p] = Some(v);
                total += 1;
            }
        }
        assert_eq!(
            total,
            producers * per_producer,
            "updates lost or duplicated"
        );
    }
}

/// Runs `producers` threads of `produce` to completion.
fn produce_all(q: &Arc<DeltaFifo<Obj>>, producers: usize, per_producer: usize) {
    let threads: Vec<_> = (0..producers)
        .map(|p| {
            let q = Arc::clone(q);
            thread::spawn(move || produce(&*q, p, per_producer))
        })
        .collect();
    join_all(threads);
}

fn produce<Q: DeltaQueue<Obj> + ?Sized>(q: &Q, producer: usize, count: usize) {
    // Seeded per producer: each walks the keys in its own reproducible order.
    let mut rng = fastrand::Rng::with_seed(producer as u64 + 1);
    for seq in 0..count {
        let k = rng.usize(..KEYS);
        let obj = Arc::new(Obj {
            key: Key::new(&format!("k{k}")),
            v: version(producer, seq),
        });
        q.update(obj).unwrap();
    }
}

/// A consumer that only records a batch at its end (`finish`), slowly, as a shared informer
/// hands its notifications over: if the queue let another consumer pop one of the batch's keys
/// before `finish` returned, that key would be recorded by two consumers at once, or out of
/// order.
struct RecordAtFinish {
    observed: Arc<Observed>,
    batch: Vec<Deltas<Obj>>,
}

impl BatchConsumer<Obj> for RecordAtFinish {
    fn process(&mut self, deltas: Deltas<Obj>, _initial: bool) {
        self.batch.push(deltas);
    }

    fn finish(&mut self) {
        // Give other consumers time to reach these keys if the queue had let them go.
        for _ in 0..3 {
            thread::yield_now();
        }
        for deltas in self.batch.drain(..) {
            self.observed.record(&deltas);
        }
    }
}

fn hand_over_at_batch_end<Q: DeltaQueue<Obj> + 'static>(
    q: Arc<Q>,
    producers: usize,
    consumers: usize,
) {
    let per_producer = 2_000 * stress_scale();
    let observed = Arc::new(Observed::new());
    let consumer_threads: Vec<_> = (0..consumers)
        .map(|_| {
            let (q, observed) = (Arc::clone(&q), Arc::clone(&observed));
            thread::spawn(move || {
                let mut consumer = RecordAtFinish {
                    observed,
                    batch: Vec::new(),
                };
                while q.pop_batch_into(16, &mut consumer).is_ok() {}
            })
        })
        .collect();
    let producer_threads: Vec<_> = (0..producers)
        .map(|p| {
            let q = Arc::clone(&q);
            thread::spawn(move || produce(&*q, p, per_producer))
        })
        .collect();
    join_all(producer_threads);
    q.close();
    join_all(consumer_threads);
    observed.assert_updates_complete_and_ordered(producers, per_producer);
}

#[test]
fn a_batch_keeps_its_keys_until_its_end_is_handed_over() {
    for shards in SHARDS {
        for (producers, consumers) in [(1, 4), (2, 2), (2, 4)] {
            hand_over_at_batch_end(
                Arc::new(DeltaFifo::new(options(), shards)),
                producers,
                consumers,
            );
        }
    }
    for (producers, consumers) in [(1, 4), (2, 2)] {
        hand_over_at_batch_end(
            Arc::new(kcache::reference::DeltaFifo::new(options())),
            producers,
            consumers,
        );
    }
}

#[test]
fn every_delta_once_in_order_and_keys_exclusive() {
    let per_producer = 3_000 * stress_scale();
    for shards in SHARDS {
        for (producers, consumers) in THREADS {
            let q = Arc::new(DeltaFifo::new(options(), shards));
            let observed = Arc::new(Observed::new());
            let consumer_threads: Vec<_> = (0..consumers)
                .map(|c| {
                    let (q, observed) = (Arc::clone(&q), Arc::clone(&observed));
                    thread::spawn(move || {
                        // Mix the single-key and the batch API.
                        if c % 2 == 0 {
                            while q.pop_batch(16, |d, _| observed.record(&d)).is_ok() {}
                        } else {
                            while q.pop(|d, _| observed.record(&d)).is_ok() {}
                        }
                    })
                })
                .collect();
            produce_all(&q, producers, per_producer);
            q.close();
            join_all(consumer_threads);
            assert!(
                q.is_empty(),
                "shards={shards}: keys left after close and drain"
            );
            observed.assert_updates_complete_and_ordered(producers, per_producer);
            assert_eq!(
                observed.deltas.load(Ordering::Relaxed),
                producers * per_producer
            );
        }
    }
}

#[test]
fn resync_replace_and_close_under_load_lose_nothing() {
    let per_producer = 2_000 * stress_scale();
    // With and without the resync lane (`resync_last`): live deltas overtake resynced keys,
    // which must change nothing per key.
    for (shards, resync_last) in SHARDS.into_iter().flat_map(|s| [(s, false), (s, true)]) {
        for (producers, consumers) in THREADS {
            let store = Arc::new(MapStore::default());
            let q = DeltaFifo::new(
                options().known_objects(store.clone()).emit_replaced(true),
                shards,
            );
            let q = Arc::new(if resync_last { q.resync_last() } else { q });
            let observed = Arc::new(Observed::new());
            let done = Arc::new(AtomicBool::new(false));
            let consumer_threads: Vec<_> = (0..consumers)
                .map(|_| {
                    let (q, observed, store) =
                        (Arc::clone(&q), Arc::clone(&observed), Arc::clone(&store));
                    thread::spawn(move || {
                        while q
                            .pop_batch(8, |d, initial| {
                                observed.record(&d);
                                process_deltas(&*store, &mut NoopHandler, &d, initial);
                            })
                            .is_ok()
                        {}
                    })
                })
                .collect();
            let relister = {
                let (q, store, done) = (Arc::clone(&q), Arc::clone(&store), Arc::clone(&done));
                thread::spawn(move || {
                    let mut round = 0usize;
                    while !done.load(Ordering::Relaxed) {
                        if round % 2 == 0 {
                            q.resync().unwrap();
                        } else {
                            // Relist with every other stored object: the rest get tombstones.
                            let list = kcache::Store::list(&*store)
                                .into_iter()
                                .step_by(2)
                                .collect();
                            q.replace(list, "").unwrap();
                        }
                        round += 1;
                        thread::yield_now();
                    }
                })
            };
            produce_all(&q, producers, per_producer);
            done.store(true, Ordering::Relaxed);
            relister.join().unwrap();
            q.close();
            join_all(consumer_threads);
            assert!(q.is_empty());
            observed.assert_updates_complete_and_ordered(producers, per_producer);
            // The store holds exactly what each key's last delivered delta says.
            for (k, seen) in observed.per_key.iter().enumerate() {
                let expected = seen
                    .lock()
                    .unwrap()
                    .last()
                    .and_then(|&(kind, _, v)| match kind {
                        DeltaType::Deleted => None,
                        _ => v,
                    });
                let stored = kcache::KnownObjects::get_by_key(&*store, &Key::new(&format!("k{k}")))
                    .map(|o| o.v);
                assert_eq!(
                    stored, expected,
                    "shards={shards} resync_last={resync_last} key k{k}"
                );
            }
        }
    }
}
