//! Differential property tests: the sharded engine against the reference port, driven by the
//! same random sequences of every docs/traces.md operation.
//!
//! - One shard: every output line must be identical, pop order included (docs/sharded.md).
//! - 2 and 64 shards, sequences whose pops are all `drain`s: identical once pop lines are
//!   grouped by key (docs/traces.md, the drain suite).
//! - The resync lane (`resync_last`), 1, 2 and 64 shards: the same per-key rule on drains.
//!
//! Random configurations include the opt-in modes: update compaction, and a small backlog
//! bound. With a bound, a producing operation that finds no room first pops (one key at a time
//! with one shard, a whole drain with more) until there is room, so the single-threaded run
//! never waits; both engines must agree on exactly when the queue is full.
//!
//! A failure shrinks to a short, readable list of operations.

mod common;

use std::sync::Arc;

use common::{grouped, key_of, obj, options, MakeRoom, MapStore, Obj, PopLine, Popped};
use kcache::{
    process_deltas, DeltaQueue, Key, KnownObjects, NoopHandler, Store, Tombstone, TryPop,
};
use proptest::prelude::*;

const KEYS: [&str; 6] = ["a", "b", "c", "ns/d", "ns/e", "x/f"];

#[derive(Debug, Clone)]
enum Op {
    Add(usize, u64),
    Update(usize, u64),
    Delete(usize, u64),
    DeleteTombstone(usize, Option<u64>),
    Replace(Vec<(usize, u64)>),
    Resync,
    Pop,
    PopRequeue,
    Drain,
    HasSynced,
    Keys,
    Known,
    Close,
}

fn op(drain_only: bool) -> impl Strategy<Value = Op> {
    let key = 0..KEYS.len();
    let v = 1..6u64;
    let mut ops = vec![
        (
            6,
            (key.clone(), v.clone())
                .prop_map(|(k, v)| Op::Add(k, v))
                .boxed(),
        ),
        (
            6,
            (key.clone(), v.clone())
                .prop_map(|(k, v)| Op::Update(k, v))
                .boxed(),
        ),
        (
            5,
            (key.clone(), v.clone())
                .prop_map(|(k, v)| Op::Delete(k, v))
                .boxed(),
        ),
        (
            2,
            (key.clone(), proptest::option::of(v.clone()))
                .prop_map(|(k, v)| Op::DeleteTombstone(k, v))
                .boxed(),
        ),
        (
            2,
            proptest::collection::vec((key, v), 0..5)
                .prop_map(Op::Replace)
                .boxed(),
        ),
        (2, Just(Op::Resync).boxed()),
        (3, Just(Op::Drain).boxed()),
        (1, Just(Op::HasSynced).boxed()),
        (1, Just(Op::Keys).boxed()),
        (1, Just(Op::Known).boxed()),
        (1, Just(Op::Close).boxed()),
    ];
    if !drain_only {
        ops.push((5, Just(Op::Pop).boxed()));
        ops.push((1, Just(Op::PopRequeue).boxed()));
    }
    proptest::strategy::Union::new_weighted(ops)
}

/// Which store the queue is given as known objects (the same kind for both engines). The
/// indexers walk themselves for `replace` and `resync` (`visit_keys`, `visit_objects`); the
/// plain map takes the trait's default walk over `list_keys` and `get_by_key`.
#[derive(Debug, Clone, Copy)]
enum KnownStore {
    Map,
    ReferenceIndexer,
    ShardedIndexer,
}

#[derive(Debug, Clone, Copy)]
struct Config {
    known_objects: bool,
    store: KnownStore,
    emit_replaced: bool,
    compact_updates: bool,
    /// `max_queued_deltas`; 0 is unbounded.
    max_queued_deltas: usize,
}

fn config() -> impl Strategy<Value = Config> {
    (
        any::<bool>(),
        prop_oneof![
            Just(KnownStore::Map),
            Just(KnownStore::ReferenceIndexer),
            Just(KnownStore::ShardedIndexer)
        ],
        any::<bool>(),
        any::<bool>(),
        prop_oneof![Just(0usize), 1..6usize],
    )
        .prop_map(
            |(known_objects, store, emit_replaced, compact_updates, max_queued_deltas)| Config {
                known_objects,
                store,
                emit_replaced,
                compact_updates,
                max_queued_deltas,
            },
        )
}

/// One output line, as docs/traces.md writes it (kept structured; the trace tests cover the JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Line {
    Pop(Popped),
    Nothing {
        closed: bool,
    },
    HasSynced(bool),
    Keys(Vec<String>),
    /// How many deltas were queued (after dedup and compaction).
    Queued(usize),
    /// A producer found no room: the pops that follow make it.
    Full,
    Known(Vec<(String, u64)>),
}

impl PopLine for Line {
    fn popped(&self) -> Option<&Popped> {
        match self {
            Line::Pop(pop) => Some(pop),
            _ => None,
        }
    }
}

fn run<Q: DeltaQueue<Obj>>(
    make: impl FnOnce(kcache::QueueOptions<Obj>) -> Q,
    cfg: Config,
    make_room: MakeRoom,
    ops: &[Op],
) -> Vec<Line> {
    /// The store twice: as a store for the consumer, as known objects for the queue.
    fn both<S: Store<Obj> + 'static>(
        store: S,
    ) -> (Arc<dyn Store<Obj>>, Arc<dyn KnownObjects<Obj>>) {
        let store = Arc::new(store);
        (store.clone(), store)
    }
    let key_fn: kcache::KeyFn<Obj> = Arc::new(key_of);
    let store = match cfg.store {
        KnownStore::Map => both(MapStore::default()),
        KnownStore::ReferenceIndexer => {
            both(kcache::reference::IndexedStore::new(key_fn, Vec::new()))
        }
        KnownStore::ShardedIndexer => both(kcache::sharded::IndexedStore::new(key_fn, Vec::new())),
    };
    run_with(store, make, cfg, make_room, ops)
}

/// The store's content as (key, version), sorted.
fn snapshot(store: &dyn Store<Obj>) -> Vec<(String, u64)> {
    let mut out: Vec<_> = store
        .list_keys()
        .into_iter()
        .filter_map(|key| store.get_by_key(&key).map(|o| (key.to_string(), o.v)))
        .collect();
    out.sort();
    out
}

fn run_with<Q: DeltaQueue<Obj>>(
    (store, known_objects): (Arc<dyn Store<Obj>>, Arc<dyn KnownObjects<Obj>>),
    make: impl FnOnce(kcache::QueueOptions<Obj>) -> Q,
    cfg: Config,
    make_room: MakeRoom,
    ops: &[Op],
) -> Vec<Line> {
    let mut opts = options()
        .emit_replaced(cfg.emit_replaced)
        .compact_updates(cfg.compact_updates)
        .max_queued_deltas(cfg.max_queued_deltas);
    if cfg.known_objects {
        opts = opts.known_objects(known_objects);
    }
    let q = make(opts);
    let known = cfg.known_objects;
    let pop_and_apply = |q: &Q| {
        q.try_pop(|d, initial| {
            if known {
                process_deltas(&*store, &mut NoopHandler, &d, initial);
            }
            Line::Pop(Popped::of(&d, initial))
        })
    };
    let mut out = Vec::new();
    for op in ops {
        let produces = matches!(
            op,
            Op::Add(..) | Op::Update(..) | Op::Delete(..) | Op::DeleteTombstone(..)
        );
        if produces && !q.has_room() {
            out.push(Line::Full);
            common::make_room(&q, make_room, &mut out, &pop_and_apply);
        }
        match op {
            Op::Add(k, v) => q.add(obj(KEYS[*k], *v)).unwrap(),
            Op::Update(k, v) => q.update(obj(KEYS[*k], *v)).unwrap(),
            Op::Delete(k, v) => q.delete(obj(KEYS[*k], *v)).unwrap(),
            Op::DeleteTombstone(k, v) => q
                .delete_tombstone(Tombstone {
                    key: Key::new(KEYS[*k]),
                    last_known: v.map(|v| obj(KEYS[*k], v)),
                })
                .unwrap(),
            Op::Replace(list) => q
                .replace(list.iter().map(|(k, v)| obj(KEYS[*k], *v)).collect(), "")
                .unwrap(),
            Op::Resync => q.resync().unwrap(),
            Op::Pop => match pop_and_apply(&q) {
                TryPop::Popped(line) => out.push(line),
                TryPop::Empty | TryPop::Closed => out.push(Line::Nothing {
                    closed: q.is_closed(),
                }),
            },
            Op::PopRequeue => match q.try_pop(|d, initial| (Line::Pop(Popped::of(&d, initial)), d))
            {
                TryPop::Popped((line, deltas)) => {
                    out.push(line);
                    q.add_if_not_present(deltas).unwrap();
                }
                TryPop::Empty | TryPop::Closed => out.push(Line::Nothing {
                    closed: q.is_closed(),
                }),
            },
            Op::Drain => {
                while let TryPop::Popped(line) = pop_and_apply(&q) {
                    out.push(line);
                }
            }
            Op::HasSynced => out.push(Line::HasSynced(q.has_synced())),
            Op::Keys => {
                let mut keys: Vec<String> = q.list_keys().iter().map(ToString::to_string).collect();
                keys.sort();
                out.push(Line::Keys(keys));
                out.push(Line::Queued(q.queued_deltas()));
            }
            Op::Known => out.push(Line::Known(snapshot(&*store))),
            Op::Close => q.close(),
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn one_shard_matches_the_reference_line_for_line(cfg in config(), ops in proptest::collection::vec(op(false), 0..40)) {
        let reference = run(kcache::reference::DeltaFifo::new, cfg, MakeRoom::PopOne, &ops);
        let sharded = run(|o| kcache::sharded::DeltaFifo::new(o, 1), cfg, MakeRoom::PopOne, &ops);
        prop_assert_eq!(sharded, reference);
    }

    #[test]
    fn many_shards_match_the_reference_per_key_on_drains(
        cfg in config(),
        shards in prop_oneof![Just(2usize), Just(64usize)],
        ops in proptest::collection::vec(op(true), 0..40),
    ) {
        let reference = grouped(run(kcache::reference::DeltaFifo::new, cfg, MakeRoom::Drain, &ops));
        let sharded = grouped(run(
            |o| kcache::sharded::DeltaFifo::new(o, shards),
            cfg,
            MakeRoom::Drain,
            &ops,
        ));
        prop_assert_eq!(sharded, reference);
    }

    /// With the resync lane, keys cross each other (live ones overtake resynced ones), but each
    /// key's pops are the reference's: the drain suite's rule, now for one shard too.
    #[test]
    fn resync_last_matches_the_reference_per_key_on_drains(
        cfg in config(),
        shards in prop_oneof![Just(1usize), Just(2usize), Just(64usize)],
        ops in proptest::collection::vec(op(true), 0..40),
    ) {
        let reference = grouped(run(kcache::reference::DeltaFifo::new, cfg, MakeRoom::Drain, &ops));
        let sharded = grouped(run(
            |o| kcache::sharded::DeltaFifo::new(o, shards).resync_last(),
            cfg,
            MakeRoom::Drain,
            &ops,
        ));
        prop_assert_eq!(sharded, reference);
    }
}

/// What `op` returned on a queue whose known store holds `known` (store key → object), then
/// every pop line. The store's key need not be the one the key function gives its object.
fn known_store_case<Q: DeltaQueue<Obj>>(
    make: impl FnOnce(kcache::QueueOptions<Obj>) -> Q,
    known: &[(&str, Arc<Obj>)],
    op: impl FnOnce(&Q) -> Result<(), kcache::QueueError>,
) -> (Result<(), kcache::QueueError>, Vec<Line>) {
    let store = Arc::new(MapStore::default());
    for (key, o) in known {
        kcache::Store::insert_by_key(&*store, Key::new(key), Arc::clone(o));
    }
    let q = make(options().known_objects(store.clone()));
    q.add(obj("queued", 1)).unwrap();
    let result = op(&q);
    let mut lines = vec![Line::Keys({
        let mut keys: Vec<String> = q.list_keys().iter().map(ToString::to_string).collect();
        keys.sort();
        keys
    })];
    while let TryPop::Popped(line) = q.try_pop(|d, initial| Line::Pop(Popped::of(&d, initial))) {
        lines.push(line);
    }
    (result, lines)
}

/// The cases where the known store's key and the key function disagree, or the key function
/// fails on a known object.
fn odd_stores() -> Vec<Vec<(&'static str, Arc<Obj>)>> {
    vec![
        // An object stored under another key than its own.
        vec![("alias", obj("a", 1))],
        // Two store keys whose objects share one key: the first (sorted) wins.
        vec![
            ("alias", obj("a", 1)),
            ("a", obj("a", 2)),
            ("b", obj("b", 1)),
        ],
        // Its own key is queued already: skipped.
        vec![("alias", obj("queued", 7))],
        // The key function fails on a known object.
        vec![("b", obj("b", 1)), ("z", obj("", 1))],
    ]
}

#[test]
fn resync_keys_known_objects_again_as_the_reference_does() {
    for known in odd_stores() {
        let reference = known_store_case(kcache::reference::DeltaFifo::new, &known, |q| q.resync());
        for shards in [1, 4] {
            let sharded = known_store_case(
                |o| kcache::sharded::DeltaFifo::new(o, shards),
                &known,
                |q| q.resync(),
            );
            let (mut sharded_lines, mut reference_lines) = (sharded.1, reference.1.clone());
            if shards > 1 {
                sharded_lines.sort_by_key(|l| format!("{l:?}"));
                reference_lines.sort_by_key(|l| format!("{l:?}"));
            }
            assert_eq!(sharded.0, reference.0, "{known:?}, {shards} shards");
            assert_eq!(sharded_lines, reference_lines, "{known:?}, {shards} shards");
        }
    }
    // client-go's syncKeyLocked: the error of KeyOf(known object) is returned.
    let failing = &odd_stores()[3];
    let (result, lines) =
        known_store_case(kcache::reference::DeltaFifo::new, failing, |q| q.resync());
    assert!(matches!(result, Err(kcache::QueueError::Key(_))));
    assert_eq!(
        lines[0],
        Line::Keys(vec!["queued".into()]),
        "nothing changed"
    );
}

#[test]
fn replace_tombstones_known_objects_under_the_store_key_on_both_engines() {
    for known in odd_stores() {
        let replace =
            |q: &dyn Fn(Vec<Arc<Obj>>) -> Result<(), kcache::QueueError>| q(vec![obj("b", 5)]);
        let reference = known_store_case(kcache::reference::DeltaFifo::new, &known, |q| {
            replace(&|l| q.replace(l, "1"))
        });
        let sharded = known_store_case(
            |o| kcache::sharded::DeltaFifo::new(o, 1),
            &known,
            |q| replace(&|l| q.replace(l, "1")),
        );
        assert_eq!(sharded, reference, "{known:?}");
        assert!(reference.0.is_ok(), "a tombstone's key is the store's key");
    }
}

/// A queue with a transformer (version + 100) through add, a relist, a resync and deletes.
fn transformed_run<Q: DeltaQueue<Obj>>(
    make: impl FnOnce(kcache::QueueOptions<Obj>) -> Q,
    emit_replaced: bool,
) -> Vec<Line> {
    let store = Arc::new(MapStore::default());
    let plus_100: kcache::TransformFn<Obj> =
        Arc::new(|o: Arc<Obj>| Ok(obj(o.key.as_str(), o.v + 100)));
    let q = make(
        options()
            .known_objects(store.clone())
            .emit_replaced(emit_replaced)
            .transformer(plus_100),
    );
    let mut lines = Vec::new();
    let mut drain = |q: &Q| {
        while let TryPop::Popped(line) = q.try_pop(|d, initial| {
            process_deltas(&*store, &mut NoopHandler, &d, initial);
            Line::Pop(Popped::of(&d, initial))
        }) {
            lines.push(line);
        }
    };
    q.add(obj("a", 1)).unwrap();
    q.replace(vec![obj("b", 2), obj("c", 3)], "1").unwrap();
    drain(&q);
    q.resync().unwrap();
    q.delete(obj("b", 4)).unwrap();
    q.delete_tombstone(Tombstone {
        key: Key::new("c"),
        last_known: Some(obj("c", 5)),
    })
    .unwrap();
    drain(&q);
    lines
}

#[test]
fn transformer_applies_to_relisted_objects_but_not_to_resync_or_tombstones() {
    for emit_replaced in [false, true] {
        let reference = transformed_run(kcache::reference::DeltaFifo::new, emit_replaced);
        let sharded = transformed_run(|o| kcache::sharded::DeltaFifo::new(o, 1), emit_replaced);
        assert_eq!(sharded, reference, "emit_replaced {emit_replaced}");
        let relist = if emit_replaced { "Replaced" } else { "Sync" };
        let pop = |key: &str, initial, deltas: &[(&str, bool, u64)]| {
            Line::Pop(Popped {
                key: key.into(),
                initial,
                deltas: deltas
                    .iter()
                    .map(|&(t, tomb, v)| (t.into(), tomb, Some(v)))
                    .collect(),
            })
        };
        assert_eq!(
            reference,
            [
                // (The add populated the queue: no initial list.) The add's object and the
                // relist's objects went through the transformer once, a relist's Sync included;
                // the tombstone carries the queued object as it is.
                pop("a", false, &[("Added", false, 101), ("Deleted", true, 101)]),
                pop("b", false, &[(relist, false, 102)]),
                pop("c", false, &[(relist, false, 103)]),
                // Resync's objects come from the store: not transformed again. The delete's
                // object is; the tombstone is not.
                pop("b", false, &[("Sync", false, 102), ("Deleted", false, 104)]),
                pop("c", false, &[("Sync", false, 103), ("Deleted", true, 5)]),
            ],
            "emit_replaced {emit_replaced}"
        );
    }
}
