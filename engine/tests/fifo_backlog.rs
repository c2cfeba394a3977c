//! The opt-in backlog bound (`QueueOptions::max_queued_deltas`) on both engines: who waits,
//! who may go over the bound, what `close` does, the async path, and a stress run with a small
//! bound (nothing lost or duplicated, the bound held, no deadlock).
//!
//! The stress sizes scale with `KCACHE_STRESS_SCALE` (default 1: a few seconds in a debug
//! build).

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use common::{obj, options, stress_scale, CountingWaker, MapStore, Obj};
use kcache::{process_deltas, DeltaQueue, DeltaType, Key, NoopHandler, QueueOptions, TryPop};

/// How long a producer must stay blocked to count as waiting. Long enough that an unblocked
/// producer would certainly have returned; a loaded machine can only make a wrong "still
/// waiting" verdict less likely, never a wrong "returned".
const BLOCKED: Duration = Duration::from_millis(100);

/// Runs `check` on the reference and on the sharded engine with 1 and 4 shards.
fn on_every_engine(check: impl Fn(&str, &dyn Fn(QueueOptions<Obj>) -> Engine)) {
    check("reference", &|o| {
        Engine::Reference(Arc::new(kcache::reference::DeltaFifo::new(o)))
    });
    for shards in [1, 4] {
        check(&format!("sharded/{shards}"), &move |o| {
            Engine::Sharded(Arc::new(kcache::sharded::DeltaFifo::new(o, shards)))
        });
    }
}

/// Either engine behind one type (the trait is not object safe: `pop` is generic).
#[derive(Clone)]
enum Engine {
    Reference(Arc<kcache::reference::DeltaFifo<Obj>>),
    Sharded(Arc<kcache::sharded::DeltaFifo<Obj>>),
}

macro_rules! each {
    ($engine:expr, $q:ident => $body:expr) => {
        match $engine {
            Engine::Reference($q) => $body,
            Engine::Sharded($q) => $body,
        }
    };
}

impl Engine {
    fn add(&self, o: Arc<Obj>) {
        each!(self, q => q.add(o).unwrap())
    }
    fn update(&self, o: Arc<Obj>) {
        each!(self, q => q.update(o).unwrap())
    }
    fn delete(&self, o: Arc<Obj>) {
        each!(self, q => q.delete(o).unwrap())
    }
    fn replace(&self, list: Vec<Arc<Obj>>) {
        each!(self, q => q.replace(list, "1").unwrap())
    }
    fn resync(&self) {
        each!(self, q => q.resync().unwrap())
    }
    fn pop_key(&self) -> String {
        each!(self, q => q.pop(|d, _| d.key().to_string()).unwrap())
    }
    fn pop_deltas(&self) -> kcache::Deltas<Obj> {
        each!(self, q => q.pop(|d, _| d).unwrap())
    }
    fn try_pop_key(&self) -> Option<String> {
        match each!(self, q => q.try_pop(|d, _| d.key().to_string())) {
            TryPop::Popped(key) => Some(key),
            TryPop::Empty | TryPop::Closed => None,
        }
    }
    fn add_if_not_present(&self, d: kcache::Deltas<Obj>) {
        each!(self, q => q.add_if_not_present(d).unwrap())
    }
    fn close(&self) {
        each!(self, q => q.close())
    }
    fn queued_deltas(&self) -> usize {
        each!(self, q => q.queued_deltas())
    }
    fn has_room(&self) -> bool {
        each!(self, q => q.has_room())
    }
    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        each!(self, q => q.poll_room(cx))
    }
}

/// Runs `produce` on a thread; returns a receiver that gets `()` when it returned.
fn spawn_producer(
    q: &Engine,
    produce: impl FnOnce(&Engine) + Send + 'static,
) -> mpsc::Receiver<()> {
    let (tx, rx) = mpsc::channel();
    let q = q.clone();
    thread::spawn(move || {
        produce(&q);
        let _ = tx.send(());
    });
    rx
}

fn assert_waiting(rx: &mpsc::Receiver<()>, what: &str) {
    assert!(
        rx.recv_timeout(BLOCKED).is_err(),
        "{what}: the producer should be waiting for room"
    );
}

fn assert_returns(rx: &mpsc::Receiver<()>, what: &str) {
    assert!(
        rx.recv_timeout(Duration::from_secs(10)).is_ok(),
        "{what}: the producer should have returned"
    );
}

#[test]
fn unbounded_by_default_and_zero_means_unbounded() {
    on_every_engine(|name, make| {
        for opts in [options(), options().max_queued_deltas(0)] {
            let q = make(opts);
            for v in 0..1_000 {
                q.add(obj(&format!("k{v}"), v));
            }
            assert!(q.has_room(), "{name}");
            assert_eq!(q.queued_deltas(), 1_000, "{name}");
        }
    });
}

#[test]
fn producers_wait_while_full_and_resume_after_a_pop() {
    on_every_engine(|name, make| {
        let q = make(options().max_queued_deltas(2));
        q.add(obj("a", 1));
        q.update(obj("a", 2));
        assert_eq!(q.queued_deltas(), 2, "{name}: counts deltas, not keys");
        assert!(!q.has_room(), "{name}");
        for (what, produce) in [
            (
                "add",
                Box::new(|q: &Engine| q.add(obj("b", 1))) as Box<dyn FnOnce(&Engine) + Send>,
            ),
            ("update", Box::new(|q: &Engine| q.update(obj("b", 2)))),
            ("delete", Box::new(|q: &Engine| q.delete(obj("b", 3)))),
        ] {
            let done = spawn_producer(&q, produce);
            assert_waiting(&done, &format!("{name} {what}"));
            // The pop makes room (popped deltas no longer count) and wakes the producer.
            q.pop_key();
            assert_returns(&done, &format!("{name} {what}"));
            assert!(q.queued_deltas() <= 2, "{name} {what}");
            // Refill to the bound for the next producer.
            while q.queued_deltas() < 2 {
                q.add(obj("fill", 0));
            }
        }
    });
}

#[test]
fn a_delta_that_adds_nothing_never_waits() {
    on_every_engine(|name, make| {
        // Dedup: a second Deleted is absorbed by the first.
        let q = make(options().max_queued_deltas(2));
        q.add(obj("a", 1));
        q.delete(obj("a", 1));
        assert!(!q.has_room());
        let done = spawn_producer(&q, |q| q.delete(obj("a", 2)));
        assert_returns(&done, &format!("{name}: deduplicated delete"));
        // An ignored delete (unknown key, no known objects) queues nothing.
        let done = spawn_producer(&q, |q| q.delete(obj("zz", 1)));
        assert_returns(&done, &format!("{name}: ignored delete"));
        assert_eq!(q.queued_deltas(), 2, "{name}");

        // Compaction: an update absorbed by the key's newest state.
        let q = make(options().max_queued_deltas(1).compact_updates(true));
        q.update(obj("a", 1));
        let done = spawn_producer(&q, |q| {
            for v in 2..100 {
                q.update(obj("a", v));
            }
        });
        assert_returns(&done, &format!("{name}: compacted updates"));
        assert_eq!(q.queued_deltas(), 1, "{name}");
    });
}

#[test]
fn replace_and_resync_go_over_the_bound_then_producers_wait() {
    on_every_engine(|name, make| {
        let store = Arc::new(MapStore::default());
        let q = make(options().known_objects(store.clone()).max_queued_deltas(2));
        q.replace((0..5).map(|i| obj(&format!("k{i}"), 1)).collect());
        assert_eq!(q.queued_deltas(), 5, "{name}: a relist never waits");
        let done = spawn_producer(&q, |q| q.add(obj("late", 1)));
        assert_waiting(&done, name);
        // Three pops bring the count from 5 to 2: still no room.
        for _ in 0..3 {
            each!(&q, q => q.pop(|d, initial| process_deltas(&*store, &mut NoopHandler, &d, initial)).unwrap());
        }
        assert_waiting(&done, name);
        each!(&q, q => q.pop(|d, initial| process_deltas(&*store, &mut NoopHandler, &d, initial)).unwrap());
        assert_returns(&done, name);
        while let Some(_key) = q.try_pop_key() {}
        // The store now holds k0..k3 (k4 was popped without being applied, `late` likewise).
        q.resync();
        assert_eq!(
            q.queued_deltas(),
            store.snapshot().len(),
            "{name}: a resync never waits"
        );
        assert!(store.snapshot().len() > 2 && !q.has_room(), "{name}");
    });
}

#[test]
fn add_if_not_present_never_waits() {
    on_every_engine(|name, make| {
        let q = make(options().max_queued_deltas(2));
        q.add(obj("a", 1));
        q.update(obj("a", 2));
        let popped = q.pop_deltas();
        q.add(obj("b", 1));
        q.update(obj("b", 2));
        assert!(!q.has_room());
        let done = spawn_producer(&q, move |q| q.add_if_not_present(popped));
        assert_returns(&done, name);
        assert_eq!(q.queued_deltas(), 4, "{name}: b's two deltas plus a's two");
    });
}

#[test]
fn close_wakes_waiting_producers_and_they_enqueue() {
    on_every_engine(|name, make| {
        let q = make(options().max_queued_deltas(1));
        q.add(obj("a", 1));
        let waiting: Vec<_> = ["b", "c"]
            .into_iter()
            .map(|k| spawn_producer(&q, move |q| q.add(obj(k, 1))))
            .collect();
        for done in &waiting {
            assert_waiting(done, name);
        }
        q.close();
        for done in &waiting {
            assert_returns(done, name);
        }
        // After close the bound no longer applies.
        q.add(obj("d", 1));
        assert!(q.has_room(), "{name}");
        let mut keys = Vec::new();
        while let Some(key) = q.try_pop_key() {
            keys.push(key);
        }
        keys.sort();
        assert_eq!(keys, ["a", "b", "c", "d"], "{name}: nothing lost");
        assert_eq!(q.queued_deltas(), 0, "{name}");
    });
}

#[test]
fn poll_room_registers_the_waker_and_a_pop_wakes_it() {
    on_every_engine(|name, make| {
        let q = make(options().max_queued_deltas(1));
        let counter = Arc::new(CountingWaker::default());
        let waker = Waker::from(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        assert!(
            q.poll_room(&mut cx).is_ready(),
            "{name}: empty queue has room"
        );
        q.add(obj("a", 1));
        assert!(q.poll_room(&mut cx).is_pending(), "{name}");
        assert!(q.poll_room(&mut cx).is_pending(), "{name}: polled twice");
        assert_eq!(counter.wakes(), 0);
        q.pop_key();
        assert_eq!(
            counter.wakes(),
            1,
            "{name}: woken once, however often it polled"
        );
        assert!(q.poll_room(&mut cx).is_ready(), "{name}");

        q.add(obj("b", 1));
        assert!(q.poll_room(&mut cx).is_pending(), "{name}");
        q.close();
        assert_eq!(counter.wakes(), 2, "{name}: close wakes");
        assert!(q.poll_room(&mut cx).is_ready(), "{name}");
    });
}

/// An async producer on tokio awaits room before every enqueue while a consumer thread pops
/// only when told the producer found the queue full: every event arrives, the producer really
/// waits (once per event beyond the bound), never blocks its runtime thread (there is always
/// room once the future completed, it being the only producer), and the bound holds.
#[test]
fn an_async_producer_on_tokio_applies_backpressure() {
    const BOUND: usize = 8;
    const EVENTS: u64 = 400;
    on_every_engine(|name, make| {
        let q = make(options().max_queued_deltas(BOUND));
        let delivered = Arc::new(Mutex::new(Vec::new()));
        // One message per time the producer found no room: the consumer pops one event for
        // each, so the producer waits for the consumer every time, whatever the scheduling.
        let (full_tx, full_rx) = mpsc::channel::<()>();
        let consumer = {
            let (q, delivered) = (q.clone(), Arc::clone(&delivered));
            thread::spawn(move || {
                let record = |d: kcache::Deltas<Obj>, _| {
                    let mut seen = delivered.lock().unwrap();
                    seen.extend(d.iter().map(|d| d.object.object().unwrap().v));
                };
                while full_rx.recv().is_ok() {
                    each!(&q, q => q.pop(record)).expect("a full queue has an event to pop");
                }
                // The producer is done: take the rest until the queue is closed and empty.
                while each!(&q, q => q.pop(record)).is_ok() {}
            })
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let (max_seen, waits) = runtime.block_on(async {
            let (mut max_seen, mut waits) = (0, 0);
            for v in 0..EVENTS {
                if !q.has_room() {
                    waits += 1;
                    full_tx.send(()).unwrap();
                }
                each!(&q, q => q.wait_for_room().await);
                assert!(
                    q.has_room(),
                    "{name}: the only producer finds the room it awaited"
                );
                // Distinct keys: nothing is absorbed, every add counts.
                q.add(obj(&format!("k{v}"), v));
                max_seen = max_seen.max(q.queued_deltas());
            }
            (max_seen, waits)
        });
        drop(full_tx);
        assert!(max_seen <= BOUND, "{name}: {max_seen} deltas queued");
        assert!(waits > 0, "{name}: the producer never had to wait for room");
        q.close();
        consumer.join().unwrap();
        let mut seen = delivered.lock().unwrap().clone();
        // Keys of different shards pop in any order.
        seen.sort_unstable();
        assert_eq!(seen, (0..EVENTS).collect::<Vec<_>>(), "{name}");
    });
}

#[test]
fn close_releases_an_awaiting_async_producer() {
    on_every_engine(|name, make| {
        let q = make(options().max_queued_deltas(1));
        q.add(obj("a", 1));
        let wakes = Arc::new(CountingWaker::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        each!(&q, q => {
            let mut waiting = std::pin::pin!(q.wait_for_room());
            assert!(
                waiting.as_mut().poll(&mut cx).is_pending(),
                "{name}: a full queue has no room"
            );
            // From another thread, as a consumer shutting the informer down would.
            let closer = {
                let q = q.clone();
                thread::spawn(move || q.close())
            };
            closer.join().unwrap();
            assert!(wakes.wakes() > 0, "{name}: close wakes the producer");
            assert!(
                waiting.as_mut().poll(&mut cx).is_ready(),
                "{name}: close must complete wait_for_room"
            );
        });
    });
}

const STRESS_BOUND: usize = 64;

/// What consumers saw of each key, in delivery order: (type, version).
type PerKey = Vec<Mutex<Vec<(DeltaType, u64)>>>;
const PRODUCERS: usize = 4;
const CONSUMERS: usize = 2;
const KEYS_PER_PRODUCER: usize = 16;

/// Producer `p`'s operation `seq` on one of its own keys: a key cycles through Added, a few
/// Updated, Deleted. Every delete is of a known or queued key, so none is ignored, and no two
/// deletes are adjacent, so none is absorbed: every delta produced must be delivered.
fn stress_op(q: &Engine, p: usize, seq: usize) -> (usize, DeltaType) {
    let k = p * KEYS_PER_PRODUCER + seq % KEYS_PER_PRODUCER;
    let round = seq / KEYS_PER_PRODUCER;
    let o = obj(&format!("k{k}"), seq as u64);
    let kind = match round % 5 {
        0 => DeltaType::Added,
        4 => DeltaType::Deleted,
        _ => DeltaType::Updated,
    };
    match kind {
        DeltaType::Added => q.add(o),
        DeltaType::Deleted => q.delete(o),
        _ => q.update(o),
    }
    (k, kind)
}

/// 4 producers and 2 consumers through a bound of 64, on both engines: every delta once and in
/// order, the count never above the bound, and the run finishes (a watchdog turns a deadlock
/// into a failure).
#[test]
fn small_bound_under_four_producers_and_two_consumers() {
    let per_producer = 4_000 * stress_scale();
    let keys = PRODUCERS * KEYS_PER_PRODUCER;
    on_every_engine(|name, make| {
        let store = Arc::new(MapStore::default());
        let q = make(
            options()
                .known_objects(store.clone())
                .max_queued_deltas(STRESS_BOUND),
        );
        let (finished_tx, finished_rx) = mpsc::channel();
        let run = {
            let q = q.clone();
            let store = Arc::clone(&store);
            thread::spawn(move || {
                let seen: Arc<PerKey> =
                    Arc::new((0..keys).map(|_| Mutex::new(Vec::new())).collect());
                let stop = Arc::new(AtomicBool::new(false));
                let max_seen = Arc::new(AtomicUsize::new(0));
                let sampler = {
                    let (q, stop, max_seen) = (q.clone(), Arc::clone(&stop), Arc::clone(&max_seen));
                    thread::spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            max_seen.fetch_max(q.queued_deltas(), Ordering::Relaxed);
                            thread::yield_now();
                        }
                    })
                };
                let consumers: Vec<_> = (0..CONSUMERS)
                    .map(|_| {
                        let (q, store, seen) = (q.clone(), Arc::clone(&store), Arc::clone(&seen));
                        thread::spawn(move || {
                            let mut record = |d: kcache::Deltas<Obj>, initial: bool| {
                                let k: usize = d.key().as_str()[1..].parse().unwrap();
                                let mut list = seen[k].lock().unwrap();
                                for delta in d.iter() {
                                    list.push((delta.kind, delta.object.object().unwrap().v));
                                }
                                drop(list);
                                process_deltas(&*store, &mut NoopHandler, &d, initial);
                            };
                            while each!(&q, q => q.pop_batch(8, &mut record)).is_ok() {}
                        })
                    })
                    .collect();
                let producers: Vec<_> = (0..PRODUCERS)
                    .map(|p| {
                        let q = q.clone();
                        thread::spawn(move || {
                            (0..per_producer)
                                .map(|seq| (stress_op(&q, p, seq), seq as u64))
                                .map(|((k, kind), v)| (k, kind, v))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                let mut produced: Vec<Vec<(DeltaType, u64)>> = vec![Vec::new(); keys];
                for p in producers {
                    for (k, kind, v) in p.join().unwrap() {
                        produced[k].push((kind, v));
                    }
                }
                q.close();
                for c in consumers {
                    c.join().unwrap();
                }
                stop.store(true, Ordering::Relaxed);
                sampler.join().unwrap();
                let seen: Vec<Vec<(DeltaType, u64)>> =
                    seen.iter().map(|s| s.lock().unwrap().clone()).collect();
                (
                    produced,
                    seen,
                    max_seen.load(Ordering::Relaxed),
                    q.queued_deltas(),
                )
            })
        };
        let watchdog = thread::spawn(move || {
            let outcome = run.join();
            let _ = finished_tx.send(());
            outcome
        });
        assert!(
            finished_rx.recv_timeout(Duration::from_secs(120)).is_ok(),
            "{name}: deadlock: the stress run did not finish"
        );
        let (produced, seen, max_seen, left) = watchdog.join().unwrap().unwrap();
        for (k, (produced, seen)) in produced.iter().zip(&seen).enumerate() {
            assert_eq!(
                seen, produced,
                "{name}: key k{k}: lost, duplicated or reordered"
            );
        }
        assert!(
            max_seen <= STRESS_BOUND,
            "{name}: {max_seen} deltas queued with a bound of {STRESS_BOUND}"
        );
        assert_eq!(left, 0, "{name}: count back to zero after the drain");
    });
}

#[test]
fn queued_deltas_count_after_dedup_and_not_in_flight() {
    on_every_engine(|name, make| {
        for bound in [0, 100] {
            let q = make(options().max_queued_deltas(bound));
            q.add(obj("a", 1));
            q.delete(obj("a", 1));
            q.delete(obj("a", 2));
            q.update(obj("b", 1));
            assert_eq!(q.queued_deltas(), 3, "{name} bound {bound}: dedup counted");
            let popped = q.pop_deltas();
            assert_eq!(popped.key(), &Key::new("a"));
            assert_eq!(
                q.queued_deltas(),
                1,
                "{name} bound {bound}: popped deltas gone"
            );
            q.add_if_not_present(popped);
            assert_eq!(q.queued_deltas(), 3, "{name} bound {bound}");
        }
    });
}
