//! Differential property tests: the sharded engine against the reference port, driven by the
//! same random sequences of every docs/traces.md operation.
//!
//! - One shard: every output line must be identical, pop order included (docs/sharded.md).
//! - 2 and 64 shards, sequences whose pops are all `drain`s: identical once pop lines are
//!   grouped by key (docs/traces.md, the drain suite).
//!
//! A failure shrinks to a short, readable list of operations.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{obj, options, MapStore, Obj};
use kcache::{process_deltas, DeltaQueue, Deltas, Key, NoopHandler, Tombstone, TryPop};
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

#[derive(Debug, Clone, Copy)]
struct Config {
    known_objects: bool,
    emit_replaced: bool,
}

fn config() -> impl Strategy<Value = Config> {
    (any::<bool>(), any::<bool>()).prop_map(|(known_objects, emit_replaced)| Config {
        known_objects,
        emit_replaced,
    })
}

/// One output line, as docs/traces.md writes it (kept structured; the trace tests cover the JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Line {
    Pop {
        key: String,
        initial: bool,
        deltas: Vec<(String, bool, Option<u64>)>,
    },
    Nothing {
        closed: bool,
    },
    HasSynced(bool),
    Keys(Vec<String>),
    Known(Vec<(String, u64)>),
}

fn pop_line(deltas: &Deltas<Obj>, initial: bool) -> Line {
    Line::Pop {
        key: deltas.key().to_string(),
        initial,
        deltas: deltas
            .iter()
            .map(|d| {
                (
                    d.kind.to_string(),
                    d.object.is_tombstone(),
                    d.object.last_known().map(|o| o.v),
                )
            })
            .collect(),
    }
}

fn run<Q: DeltaQueue<Obj>>(
    make: impl FnOnce(kcache::QueueOptions<Obj>) -> Q,
    cfg: Config,
    ops: &[Op],
) -> Vec<Line> {
    let store = Arc::new(MapStore::default());
    let mut opts = options().emit_replaced(cfg.emit_replaced);
    if cfg.known_objects {
        opts = opts.known_objects(store.clone());
    }
    let q = make(opts);
    let known = cfg.known_objects;
    let pop_and_apply = |q: &Q| {
        q.try_pop(|d, initial| {
            if known {
                process_deltas(&*store, &mut NoopHandler, &d, initial);
            }
            pop_line(&d, initial)
        })
    };
    let mut out = Vec::new();
    for op in ops {
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
            Op::PopRequeue => match q.try_pop(|d, initial| (pop_line(&d, initial), d)) {
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
            }
            Op::Known => out.push(Line::Known(store.snapshot())),
            Op::Close => q.close(),
        }
    }
    out
}

/// Pop lines grouped by key, everything else in order.
fn grouped(lines: Vec<Line>) -> (Vec<Line>, BTreeMap<String, Vec<Line>>) {
    let mut other = Vec::new();
    let mut by_key: BTreeMap<String, Vec<Line>> = BTreeMap::new();
    for line in lines {
        match &line {
            Line::Pop { key, .. } => by_key.entry(key.clone()).or_default().push(line),
            _ => other.push(line),
        }
    }
    (other, by_key)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn one_shard_matches_the_reference_line_for_line(cfg in config(), ops in proptest::collection::vec(op(false), 0..40)) {
        let reference = run(kcache::reference::DeltaFifo::new, cfg, &ops);
        let sharded = run(|o| kcache::sharded::DeltaFifo::new(o, 1), cfg, &ops);
        prop_assert_eq!(sharded, reference);
    }

    #[test]
    fn many_shards_match_the_reference_per_key_on_drains(
        cfg in config(),
        shards in prop_oneof![Just(2usize), Just(64usize)],
        ops in proptest::collection::vec(op(true), 0..40),
    ) {
        let reference = grouped(run(kcache::reference::DeltaFifo::new, cfg, &ops));
        let sharded = grouped(run(|o| kcache::sharded::DeltaFifo::new(o, shards), cfg, &ops));
        prop_assert_eq!(sharded, reference);
    }
}
