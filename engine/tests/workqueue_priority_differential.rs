//! Differential property tests: the sharded priority queue against the reference priority
//! queue (controller-runtime's port), both on a fake clock, driven by the same random
//! sequences of every priority trace operation (docs/traces.md, "Priority workqueue traces").
//!
//! - One shard: every output line identical, `get` order and priorities included (also with
//!   equal ready times: one shard keeps the reference's entries exactly).
//! - 2 and 16 shards: `get`s come only as runs of exactly `len` gets after every handed-out key
//!   is done; each run is compared as a multiset of (key, priority) and its priorities must not
//!   increase; every other line in order.
//!
//! Each property runs in every ordering mode: controller-runtime's, aging
//! (`PriorityOptions::max_wait`), fairness by namespace, and both. A `get` line says whether the
//! entry was handed out overdue, and "priorities must not increase" reads an overdue entry as
//! above every priority.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use kcache::workqueue::priority::{
    AddOpts, Priority, PriorityOptions, PriorityWorkQueue, ReferencePriorityQueue,
    ShardedPriorityQueue, TryGetWithPriority,
};
use kcache::workqueue::{ExponentialFailureRateLimiter, FakeClock, QueueConfig, WorkQueue};
use kcache::Key;
use proptest::prelude::*;

const ITEMS: [&str; 8] = ["a", "b", "c", "ns/d", "ns/e", "x/f", "x/g", "y/h"];
const PRIORITIES: [Option<Priority>; 5] = [None, Some(-100), Some(0), Some(3), Some(-7)];
const MS: Duration = Duration::from_millis(1);

#[derive(Debug, Clone)]
enum Op {
    AddWithOpts {
        item: usize,
        priority: usize,
        after_ms: u64,
        rate_limited: bool,
    },
    Add(usize),
    AddAfter(usize, u64),
    AddRateLimited(usize),
    Forget(usize),
    NumRequeues(usize),
    When(usize),
    Step(u64),
    Get,
    /// Done every handed-out key, then `len`, then `len` gets (the only get with N shards).
    GetAll,
    Done(usize),
    Len,
    WaitingLen,
    ProcessingLen,
    ShutDown,
    ShuttingDown,
}

fn op(single_gets: bool) -> impl Strategy<Value = Op> {
    let item = 0..ITEMS.len();
    let get = if single_gets {
        Just(Op::Get).boxed()
    } else {
        Just(Op::GetAll).boxed()
    };
    prop_oneof![
        10 => (item.clone(), 0..PRIORITIES.len(), prop_oneof![Just(0u64), 1..20u64], any::<bool>())
            .prop_map(|(item, priority, after_ms, rate_limited)| Op::AddWithOpts {
                item, priority, after_ms, rate_limited
            }),
        4 => item.clone().prop_map(Op::Add),
        3 => (item.clone(), 0..20u64).prop_map(|(i, ms)| Op::AddAfter(i, ms)),
        3 => item.clone().prop_map(Op::AddRateLimited),
        1 => item.clone().prop_map(Op::Forget),
        1 => item.clone().prop_map(Op::NumRequeues),
        1 => item.clone().prop_map(Op::When),
        4 => (0..12u64).prop_map(Op::Step),
        8 => get,
        2 => Just(Op::GetAll),
        6 => item.prop_map(Op::Done),
        2 => Just(Op::Len),
        1 => Just(Op::WaitingLen),
        1 => Just(Op::ProcessingLen),
        1 => Just(Op::ShuttingDown),
        // Rare: a shut-down queue answers every get with "shut down".
        1 => (0..8u8).prop_filter_map("rare", |r| (r == 0).then_some(Op::ShutDown)),
    ]
}

/// The ordering rules a run uses.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Plain,
    Aging,
    Fair,
    AgingAndFair,
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![
        Just(Mode::Plain),
        Just(Mode::Aging),
        Just(Mode::Fair),
        Just(Mode::AgingAndFair),
    ]
}

impl Mode {
    fn options(self) -> PriorityOptions {
        // A bound of a few steps, so entries do become overdue in 100 ops.
        let aging = PriorityOptions::new().max_wait(6 * MS);
        match self {
            Mode::Plain => PriorityOptions::new(),
            Mode::Aging => aging,
            Mode::Fair => PriorityOptions::new().fair(),
            Mode::AgingAndFair => aging.fair(),
        }
    }
}

/// One output line of the replay.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Line {
    /// Key, priority, handed out overdue.
    Get(String, Priority, bool),
    GetEmpty,
    GetShutDown,
    NumRequeues(u64),
    When(Duration),
    Len(usize),
    WaitingLen(usize),
    ProcessingLen(usize),
    ShuttingDown(bool),
}

fn run(make: impl FnOnce(&QueueConfig) -> Box<dyn PriorityWorkQueue>, ops: &[Op]) -> Vec<Line> {
    let clock = Arc::new(FakeClock::new());
    let config = QueueConfig::new().clock(clock.clone());
    let q = make(&config);
    let key = |i: usize| Key::new(ITEMS[i]);
    let mut processing = BTreeSet::new();
    let mut out = Vec::new();
    let get = |q: &dyn PriorityWorkQueue, out: &mut Vec<Line>, processing: &mut BTreeSet<Key>| {
        let overdue_before = q.overdue_handouts();
        out.push(match q.try_get_with_priority() {
            TryGetWithPriority::Item(k, p) => {
                assert!(processing.insert(k.clone()), "{k} handed out twice");
                Line::Get(k.to_string(), p, q.overdue_handouts() > overdue_before)
            }
            TryGetWithPriority::Empty => Line::GetEmpty,
            TryGetWithPriority::ShutDown => Line::GetShutDown,
        })
    };
    let mut shut = false;
    for op in ops {
        match *op {
            Op::AddWithOpts {
                item,
                priority,
                after_ms,
                rate_limited,
            } => q.add_with_opts(
                AddOpts {
                    after: Duration::from_millis(after_ms),
                    rate_limited,
                    priority: PRIORITIES[priority],
                },
                key(item),
            ),
            Op::Add(i) => q.add(key(i)),
            Op::AddAfter(i, ms) => q.add_after(key(i), Duration::from_millis(ms)),
            Op::AddRateLimited(i) => q.add_rate_limited(key(i)),
            Op::Forget(i) => q.forget(&key(i)),
            Op::NumRequeues(i) => out.push(Line::NumRequeues(q.num_requeues(&key(i)))),
            Op::When(i) => out.push(Line::When(q.when(&key(i)))),
            Op::Step(ms) => {
                clock.step(Duration::from_millis(ms));
            }
            Op::Get => get(&*q, &mut out, &mut processing),
            Op::GetAll => {
                for k in std::mem::take(&mut processing) {
                    q.done(&k).unwrap();
                }
                let n = q.len();
                out.push(Line::Len(n));
                for _ in 0..n {
                    get(&*q, &mut out, &mut processing);
                }
            }
            Op::Done(i) => {
                if processing.remove(&key(i)) {
                    q.done(&key(i)).unwrap();
                } else {
                    assert!(q.done(&key(i)).is_err(), "done of a key not processing");
                }
            }
            Op::Len => out.push(Line::Len(q.len())),
            Op::WaitingLen => out.push(Line::WaitingLen(q.waiting_len())),
            Op::ProcessingLen => out.push(Line::ProcessingLen(q.processing_len())),
            Op::ShutDown => {
                if !shut {
                    q.shut_down();
                    shut = true;
                }
            }
            Op::ShuttingDown => out.push(Line::ShuttingDown(q.shutting_down())),
        }
    }
    out
}

fn reference(mode: Mode) -> impl FnOnce(&QueueConfig) -> Box<dyn PriorityWorkQueue> {
    move |config| {
        Box::new(ReferencePriorityQueue::with_options(
            config,
            Box::new(ExponentialFailureRateLimiter::new(MS, 50 * MS)),
            mode.options(),
        ))
    }
}

fn sharded(shards: usize, mode: Mode) -> impl FnOnce(&QueueConfig) -> Box<dyn PriorityWorkQueue> {
    move |config| {
        Box::new(ShardedPriorityQueue::with_options(
            shards,
            config,
            Box::new(ExponentialFailureRateLimiter::new(MS, 50 * MS)),
            mode.options(),
        ))
    }
}

fn is_get(line: &Line) -> bool {
    matches!(line, Line::Get(..) | Line::GetEmpty | Line::GetShutDown)
}

/// The maximal runs of consecutive `get` lines.
fn get_runs(lines: &[Line]) -> Vec<std::ops::Range<usize>> {
    common::get_runs(lines, is_get)
}

/// Panics if a run hands out a lower effective priority before a higher one (an overdue entry
/// is above every priority).
fn assert_priorities_never_rise(lines: &[Line]) {
    for run in get_runs(lines) {
        let priorities: Vec<i64> = lines[run]
            .iter()
            .filter_map(|l| match l {
                Line::Get(_, _, true) => Some(i64::MAX),
                Line::Get(_, p, false) => Some(i64::from(*p)),
                _ => None,
            })
            .collect();
        assert!(
            priorities.windows(2).all(|w| w[0] >= w[1]),
            "a lower priority overtook a higher one: {priorities:?}"
        );
    }
}

fn sort_get_runs(lines: &mut [Line]) {
    for run in get_runs(lines) {
        lines[run].sort();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    #[test]
    fn one_shard_matches_the_reference_line_for_line(
        mode in mode(),
        ops in prop::collection::vec(op(true), 1..100),
    ) {
        let expected = run(reference(mode), &ops);
        let actual = run(sharded(1, mode), &ops);
        prop_assert_eq!(actual, expected);
    }

    #[test]
    fn many_shards_match_the_reference_as_multisets_and_never_invert_priorities(
        mode in mode(),
        shards in prop_oneof![Just(2usize), Just(16)],
        ops in prop::collection::vec(op(false), 1..100),
    ) {
        let mut expected = run(reference(mode), &ops);
        let mut actual = run(sharded(shards, mode), &ops);
        assert_priorities_never_rise(&expected);
        assert_priorities_never_rise(&actual);
        sort_get_runs(&mut expected);
        sort_get_runs(&mut actual);
        prop_assert_eq!(actual, expected);
    }
}
