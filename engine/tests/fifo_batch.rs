//! `DeltaQueue::apply_events`, the batch hand-off a reflector uses: it must equal applying the
//! events one by one.
//!
//! - **Differential** (proptest, in the style of `fifo_differential.rs`): random batches of
//!   adds, updates and deletes, some refused (an object without a key, or one the transformer
//!   refuses), between pops, drains, relists and resyncs. The sharded engine applies each
//!   batch with one `apply_events` call; the reference applies the same events one by one with
//!   `add`/`update`/`delete`. One shard: identical output line for line, pop order and the
//!   refusals included. 2 and 64 shards, drains only: identical per key. The reference's own
//!   `apply_events` is held to its one-by-one self the same way. With a backlog bound both
//!   engines apply batches (a one-by-one producer would wait in the middle of a batch, which a
//!   single-threaded run cannot): they must agree on every line, room included.
//! - **Bound**: a batch on a full queue waits for a pop, then queues all its events: at most
//!   its length minus one past the bound.
//! - **Stress**: several producers' batches against several consumers, every shard count:
//!   every delta once, each producer's updates of a key in order, no key held twice at once.
//!
//! A failure shrinks to a short list of steps.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use common::{
    grouped, join_all, obj, options, stress_scale, MakeRoom, MapStore, Obj, PopLine, Popped,
};
use kcache::{
    process_deltas, BatchError, DeltaQueue, DeltaType, Key, NoopHandler, QueueError, QueueEvent,
    TransformError, TransformFn, TryPop,
};
use proptest::prelude::*;

/// Keys of the random runs; `""` has no key (the key function refuses it).
const KEYS: [&str; 7] = ["a", "b", "c", "ns/d", "ns/e", "x/f", ""];

/// Objects of this version are refused by the transformer, when there is one.
const REFUSED_VERSION: u64 = 9;

#[derive(Debug, Clone, Copy)]
enum Ev {
    Add(usize, u64),
    Update(usize, u64),
    Delete(usize, u64),
}

#[derive(Debug, Clone)]
enum Step {
    Batch(Vec<Ev>),
    Replace(Vec<(usize, u64)>),
    Resync,
    Pop,
    Drain,
    Keys,
    Close,
}

fn ev() -> impl Strategy<Value = Ev> {
    let key = 0..KEYS.len();
    let v = prop_oneof![9 => 1..6u64, 1 => Just(REFUSED_VERSION)];
    prop_oneof![
        (key.clone(), v.clone()).prop_map(|(k, v)| Ev::Add(k, v)),
        (key.clone(), v.clone()).prop_map(|(k, v)| Ev::Update(k, v)),
        (key, v).prop_map(|(k, v)| Ev::Delete(k, v)),
    ]
}

fn step(drain_only: bool) -> impl Strategy<Value = Step> {
    let key = 0..KEYS.len() - 1;
    let mut steps = vec![
        (
            8,
            proptest::collection::vec(ev(), 0..12)
                .prop_map(Step::Batch)
                .boxed(),
        ),
        (
            1,
            proptest::collection::vec((key, 1..6u64), 0..5)
                .prop_map(Step::Replace)
                .boxed(),
        ),
        (1, Just(Step::Resync).boxed()),
        (3, Just(Step::Drain).boxed()),
        (1, Just(Step::Keys).boxed()),
        (1, Just(Step::Close).boxed()),
    ];
    if !drain_only {
        steps.push((4, Just(Step::Pop).boxed()));
    }
    proptest::strategy::Union::new_weighted(steps)
}

#[derive(Debug, Clone, Copy)]
struct Config {
    known_objects: bool,
    emit_replaced: bool,
    compact_updates: bool,
    transformer: bool,
    /// `max_queued_deltas`; 0 is unbounded.
    max_queued_deltas: usize,
}

fn config(bounded: bool) -> impl Strategy<Value = Config> {
    let bound = if bounded {
        (1..6usize).boxed()
    } else {
        Just(0).boxed()
    };
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        bound,
    )
        .prop_map(
            |(known_objects, emit_replaced, compact_updates, transformer, max_queued_deltas)| {
                Config {
                    known_objects,
                    emit_replaced,
                    compact_updates,
                    transformer,
                    max_queued_deltas,
                }
            },
        )
}

/// How a run hands a batch to the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Apply {
    /// `add`/`update`/`delete`, one event at a time (the yardstick).
    OneByOne,
    /// One `apply_events` call.
    Batch,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Line {
    Pop(Popped),
    Nothing,
    /// The refused events of a batch: (position, error).
    Refused(Vec<(usize, QueueError)>),
    Keys(Vec<String>),
    Queued(usize),
    Full,
}

impl PopLine for Line {
    fn popped(&self) -> Option<&Popped> {
        match self {
            Line::Pop(pop) => Some(pop),
            _ => None,
        }
    }
}

fn event(e: Ev) -> QueueEvent<Obj> {
    match e {
        Ev::Add(k, v) => QueueEvent::Added(obj(KEYS[k], v)),
        Ev::Update(k, v) => QueueEvent::Updated(obj(KEYS[k], v)),
        Ev::Delete(k, v) => QueueEvent::Deleted(obj(KEYS[k], v)),
    }
}

fn refusing_transformer() -> TransformFn<Obj> {
    Arc::new(|o: Arc<Obj>| {
        if o.v == REFUSED_VERSION {
            Err(TransformError("version 9 is refused".into()))
        } else {
            Ok(o)
        }
    })
}

/// Applies `events` one at a time, collecting the refusals as a batch reports them.
fn one_by_one<Q: DeltaQueue<Obj>>(q: &Q, events: Vec<QueueEvent<Obj>>) -> Result<(), BatchError> {
    let mut refused = Vec::new();
    for (at, e) in events.into_iter().enumerate() {
        let applied = match e {
            QueueEvent::Added(o) => q.add(o),
            QueueEvent::Updated(o) => q.update(o),
            QueueEvent::Deleted(o) => q.delete(o),
        };
        if let Err(err) = applied {
            refused.push((at, err));
        }
    }
    BatchError::check(refused)
}

fn run<Q: DeltaQueue<Obj>>(
    make: impl FnOnce(kcache::QueueOptions<Obj>) -> Q,
    cfg: Config,
    apply: Apply,
    make_room: MakeRoom,
    steps: &[Step],
) -> Vec<Line> {
    let store = Arc::new(MapStore::default());
    let mut opts = options()
        .emit_replaced(cfg.emit_replaced)
        .compact_updates(cfg.compact_updates)
        .max_queued_deltas(cfg.max_queued_deltas);
    if cfg.known_objects {
        opts = opts.known_objects(store.clone());
    }
    if cfg.transformer {
        opts = opts.transformer(refusing_transformer());
    }
    let q = make(opts);
    let pop_and_apply = |q: &Q| {
        q.try_pop(|d, initial| {
            if cfg.known_objects {
                process_deltas(&*store, &mut NoopHandler, &d, initial);
            }
            Line::Pop(Popped::of(&d, initial))
        })
    };
    let mut out = Vec::new();
    for step in steps {
        match step {
            Step::Batch(events) => {
                if !events.is_empty() && !q.has_room() {
                    out.push(Line::Full);
                    common::make_room(&q, make_room, &mut out, &pop_and_apply);
                }
                let events: Vec<_> = events.iter().copied().map(event).collect();
                let result = match apply {
                    Apply::OneByOne => one_by_one(&q, events),
                    Apply::Batch => q.apply_events(events),
                };
                if let Err(refused) = result {
                    out.push(Line::Refused(refused.refused));
                }
            }
            Step::Replace(list) => {
                let list = list.iter().map(|&(k, v)| obj(KEYS[k], v)).collect();
                if let Err(err) = q.replace(list, "") {
                    out.push(Line::Refused(vec![(0, err)]));
                }
            }
            Step::Resync => q.resync().unwrap(),
            Step::Pop => match pop_and_apply(&q) {
                TryPop::Popped(line) => out.push(line),
                TryPop::Empty | TryPop::Closed => out.push(Line::Nothing),
            },
            Step::Drain => {
                while let TryPop::Popped(line) = pop_and_apply(&q) {
                    out.push(line);
                }
            }
            Step::Keys => {
                let mut keys: Vec<String> = q.list_keys().iter().map(ToString::to_string).collect();
                keys.sort();
                out.push(Line::Keys(keys));
                out.push(Line::Queued(q.queued_deltas()));
            }
            Step::Close => q.close(),
        }
    }
    out
}

fn reference(o: kcache::QueueOptions<Obj>) -> kcache::reference::DeltaFifo<Obj> {
    kcache::reference::DeltaFifo::new(o)
}

/// The sharded queue's batches on `shards` shards, drained, against the reference applying
/// the same events `reference_applies` way: the same pops per key and the same other lines.
fn sharded_batches_agree_per_key(
    cfg: Config,
    shards: usize,
    reference_applies: Apply,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let expected = grouped(run(
        reference,
        cfg,
        reference_applies,
        MakeRoom::Drain,
        steps,
    ));
    let sharded = grouped(run(
        |o| kcache::sharded::DeltaFifo::new(o, shards),
        cfg,
        Apply::Batch,
        MakeRoom::Drain,
        steps,
    ));
    prop_assert_eq!(sharded, expected);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn one_shard_batches_match_the_reference_one_by_one(
        cfg in config(false),
        steps in proptest::collection::vec(step(false), 0..30),
    ) {
        let expected = run(reference, cfg, Apply::OneByOne, MakeRoom::PopOne, &steps);
        let sharded = run(|o| kcache::sharded::DeltaFifo::new(o, 1), cfg, Apply::Batch, MakeRoom::PopOne, &steps);
        prop_assert_eq!(&sharded, &expected);
        let batched = run(reference, cfg, Apply::Batch, MakeRoom::PopOne, &steps);
        prop_assert_eq!(&batched, &expected);
    }

    #[test]
    fn many_shard_batches_match_the_reference_one_by_one_per_key(
        cfg in config(false),
        shards in prop_oneof![Just(2usize), Just(64usize)],
        steps in proptest::collection::vec(step(true), 0..30),
    ) {
        sharded_batches_agree_per_key(cfg, shards, Apply::OneByOne, &steps)?;
    }

    #[test]
    fn bounded_batches_agree_across_engines(
        cfg in config(true),
        shards in prop_oneof![Just(1usize), Just(2usize), Just(64usize)],
        steps in proptest::collection::vec(step(true), 0..30),
    ) {
        sharded_batches_agree_per_key(cfg, shards, Apply::Batch, &steps)?;
    }
}

/// A batch on a full queue waits until a pop makes room, then queues every event: the count
/// goes past the bound by at most the batch's length minus one. On both engines.
#[test]
fn a_batch_waits_for_room_once_then_queues_all_of_it() {
    /// `waiting` is what the queue's `Debug` shows while a producer waits for room.
    fn check<Q: DeltaQueue<Obj> + std::fmt::Debug + 'static>(q: Arc<Q>, waiting: &str) {
        q.add(obj("a", 1)).unwrap();
        q.add(obj("b", 1)).unwrap();
        assert!(!q.has_room(), "{q:?}: full at the bound of 2");
        let done = Arc::new(AtomicBool::new(false));
        let producer = {
            let (q, done) = (Arc::clone(&q), Arc::clone(&done));
            thread::spawn(move || {
                let batch = (0..5).map(|i| QueueEvent::Added(obj(&format!("n{i}"), 1)));
                let result = q.apply_events(batch.collect());
                done.store(true, Ordering::SeqCst);
                result
            })
        };
        // Until the producer has registered as waiting (its own record in the queue, not a
        // guess about time).
        while !format!("{q:?}").contains(waiting) {
            thread::yield_now();
        }
        assert!(
            !done.load(Ordering::SeqCst),
            "the batch went past a full queue"
        );
        assert_eq!(q.queued_deltas(), 2, "nothing of the batch queued yet");
        q.pop(|_, _| ()).unwrap();
        producer.join().unwrap().unwrap();
        assert_eq!(q.queued_deltas(), 1 + 5, "{q:?}: all of the batch queued");
    }
    let opts = || options().max_queued_deltas(2);
    check(
        Arc::new(kcache::reference::DeltaFifo::new(opts())),
        "waiting_producers: 1",
    );
    for shards in [1, 4] {
        check(
            Arc::new(kcache::sharded::DeltaFifo::new(opts(), shards)),
            "waiting: true",
        );
    }
}

const STRESS_KEYS: usize = 64;

/// Several producers send batches of updates (and, bounded, wait for room); several consumers
/// pop. Every update comes out once, each producer's updates of a key in the order sent, and
/// no key is held by two consumers at once.
#[test]
fn concurrent_batches_lose_nothing_and_keep_per_key_order() {
    let per_producer = 2_000 * stress_scale();
    for shards in [1, 2, 64] {
        for (producers, consumers) in [(1, 1), (2, 2), (4, 1), (1, 4)] {
            for bound in [0, 16] {
                stress(shards, producers, consumers, bound, per_producer);
            }
        }
    }
}

fn stress(shards: usize, producers: usize, consumers: usize, bound: usize, per_producer: usize) {
    let q = Arc::new(kcache::sharded::DeltaFifo::new(
        options().max_queued_deltas(bound),
        shards,
    ));
    let busy: Arc<Vec<AtomicBool>> =
        Arc::new((0..STRESS_KEYS).map(|_| AtomicBool::new(false)).collect());
    let seen: Arc<Vec<Mutex<Vec<u64>>>> =
        Arc::new((0..STRESS_KEYS).map(|_| Mutex::new(Vec::new())).collect());
    let delivered = Arc::new(AtomicUsize::new(0));
    let consumer_threads: Vec<_> = (0..consumers)
        .map(|_| {
            let (q, busy, seen, delivered) = (
                Arc::clone(&q),
                Arc::clone(&busy),
                Arc::clone(&seen),
                Arc::clone(&delivered),
            );
            thread::spawn(move || {
                while q
                    .pop_batch(8, |d, _| {
                        let k: usize = d.key().as_str()[1..].parse().unwrap();
                        assert!(!busy[k].swap(true, Ordering::SeqCst), "key held twice");
                        let mut versions = seen[k].lock().unwrap();
                        for delta in &d {
                            assert_eq!(delta.kind, DeltaType::Updated);
                            versions.push(delta.object.object().unwrap().v);
                        }
                        delivered.fetch_add(d.len(), Ordering::Relaxed);
                        busy[k].store(false, Ordering::SeqCst);
                    })
                    .is_ok()
                {}
            })
        })
        .collect();
    let producer_threads: Vec<_> = (0..producers)
        .map(|p| {
            let q = Arc::clone(&q);
            thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(p as u64 + 1);
                let mut seq = 0;
                while seq < per_producer {
                    let len = rng.usize(1..=64).min(per_producer - seq);
                    let batch = (seq..seq + len)
                        .map(|s| {
                            let k = rng.usize(..STRESS_KEYS);
                            QueueEvent::Updated(Arc::new(Obj {
                                key: Key::new(&format!("k{k}")),
                                v: ((p as u64) << 32) | s as u64,
                            }))
                        })
                        .collect();
                    q.apply_events(batch).unwrap();
                    seq += len;
                }
            })
        })
        .collect();
    join_all(producer_threads);
    q.close();
    join_all(consumer_threads);
    let what = format!("shards={shards} producers={producers} consumers={consumers} bound={bound}");
    assert!(q.is_empty(), "{what}: keys left after close and drain");
    assert_eq!(
        delivered.load(Ordering::Relaxed),
        producers * per_producer,
        "{what}: updates lost or duplicated"
    );
    for (k, versions) in seen.iter().enumerate() {
        let mut last = vec![None::<u64>; producers];
        for &v in versions.lock().unwrap().iter() {
            let p = (v >> 32) as usize;
            assert!(
                last[p].is_none_or(|prev| prev < v),
                "{what}: key k{k}, producer {p} out of order"
            );
            last[p] = Some(v);
        }
    }
}
