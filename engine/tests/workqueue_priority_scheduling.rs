//! kcache's opt-in ordering rules for the priority queues (docs/workqueue.md, "Aging" and
//! "Fairness"), checked on every priority queue on a fake clock: what they promise a
//! controller, stated as bounds.

mod common;

use std::time::Duration;

use common::priority_queues_on_fake_clocks;
use kcache::workqueue::priority::{
    default_priority_rate_limiter, AddOpts, PriorityOptions, PriorityWorkQueue, LOW_PRIORITY,
};
use kcache::workqueue::{FakeClock, TryGet};
use kcache::Key;

const MS: Duration = Duration::from_millis(1);

/// Every priority queue with `options` on a fake clock: the reference, and the sharded queue
/// with 1 and 16 shards (with the shard count, 1 for the reference).
fn each_queue(
    options: PriorityOptions,
    check: impl Fn(&str, usize, &FakeClock, &dyn PriorityWorkQueue),
) {
    for q in priority_queues_on_fake_clocks(default_priority_rate_limiter, &options) {
        check(&q.name, q.shards, &q.clock, &*q.queue);
    }
}

/// One worker that takes a key per millisecond while two higher-priority keys arrive per
/// millisecond: the millisecond at which `ns/low` (added at 0) is handed out, if within `ms`.
fn low_key_served_at(clock: &FakeClock, q: &dyn PriorityWorkQueue, ms: u64) -> Option<u64> {
    q.add_with_opts(AddOpts::new().priority(LOW_PRIORITY), Key::new("ns/low"));
    for now in 0..ms {
        for n in 0..2 {
            q.add(Key::new(&format!("ns/hot-{now}-{n}")));
        }
        let TryGet::Item(key) = q.try_get() else {
            panic!("the flood always leaves a key to take");
        };
        q.done(&key).unwrap();
        if key.as_str() == "ns/low" {
            return Some(now);
        }
        clock.step(MS);
    }
    None
}

#[test]
fn without_aging_a_flood_of_live_changes_starves_a_low_priority_key() {
    each_queue(PriorityOptions::new(), |name, _, clock, q| {
        assert_eq!(low_key_served_at(clock, q, 200), None, "{name}");
        assert_eq!(q.overdue_handouts(), 0, "{name}");
    });
}

#[test]
fn aging_hands_a_key_out_by_the_first_get_once_it_has_waited_max_wait() {
    each_queue(
        PriorityOptions::new().max_wait(10 * MS),
        |name, _, clock, q| {
            // Ready since 0, overdue from 10 ms: the get at 10 ms takes it, not one later.
            assert_eq!(low_key_served_at(clock, q, 200), Some(10), "{name}");
            assert_eq!(q.overdue_handouts(), 1, "{name}");
        },
    );
}

#[test]
fn aging_bounds_every_keys_wait_when_the_queue_keeps_up() {
    // Two adds and one get per millisecond: the queue cannot keep up, so keys do become
    // overdue. The rule: a key handed out overdue leaves no older key behind (overdue keys go
    // oldest first, before any that is not overdue); so a key waits at most `max_wait` plus
    // the hand-outs of the keys ready before it.
    each_queue(
        PriorityOptions::new().max_wait(5 * MS),
        |name, _, clock, q| {
            let mut added = std::collections::HashMap::new();
            for now in 0..100u64 {
                for n in 0..2 {
                    let key = Key::new(&format!("ns/k-{now}-{n}"));
                    q.add_with_opts(AddOpts::new().priority((now % 3) as i32), key.clone());
                    added.insert(key, now);
                }
                let TryGet::Item(key) = q.try_get() else {
                    panic!("{name}: a key is always ready");
                };
                q.done(&key).unwrap();
                let since = added.remove(&key).unwrap();
                let oldest_left = added.values().copied().min();
                if now >= since + 5 {
                    assert!(
                    oldest_left.is_none_or(|oldest| oldest >= since),
                    "{name}: an overdue key ready since {since} went out at {now} before one ready since {oldest_left:?}"
                );
                }
                clock.step(MS);
            }
        },
    );
}

#[test]
fn fairness_serves_a_lone_namespace_within_one_turn_of_a_busy_one() {
    each_queue(PriorityOptions::new().fair(), |name, shards, _, q| {
        for n in 0..1000 {
            q.add(Key::new(&format!("busy/{n}")));
        }
        q.add(Key::new("quiet/only"));
        let position = (0..1001)
            .position(|_| {
                let TryGet::Item(key) = q.try_get() else {
                    panic!("{name}: 1001 keys are ready");
                };
                key.as_str() == "quiet/only"
            })
            .unwrap();
        // One shard: the busy namespace's first key, then the quiet one. N shards: the quiet
        // key's shard is served at least once every N gets, and it is second there.
        assert!(position < 2 * shards, "{name}: served {position}th");
    });
}

#[test]
fn without_fairness_the_lone_namespace_waits_behind_the_busy_one() {
    each_queue(PriorityOptions::new(), |name, shards, _, q| {
        for n in 0..1000 {
            q.add(Key::new(&format!("busy/{n}")));
        }
        q.add(Key::new("quiet/only"));
        let position = (0..1001)
            .position(|_| q.try_get() == TryGet::Item(Key::new("quiet/only")))
            .unwrap();
        if shards == 1 {
            assert_eq!(position, 1000, "{name}: first in, first out");
        }
    });
}

#[test]
fn fairness_by_a_custom_group_and_priorities_still_first() {
    // Group by the key's first letter; priorities still order before groups.
    let options = PriorityOptions::new().fair_by(|key: &Key| Key::new(&key.as_str()[..1]));
    each_queue(options, |name, shards, _, q| {
        for key in ["a1", "a2", "a3", "b1", "b2"] {
            q.add(Key::new(key));
        }
        q.add_with_opts(AddOpts::new().priority(5), Key::new("c1"));
        let mut out = Vec::new();
        while let TryGet::Item(key) = q.try_get() {
            out.push(key.as_str().to_string());
        }
        assert_eq!(out[0], "c1", "{name}");
        if shards == 1 {
            assert_eq!(out, ["c1", "a1", "b1", "a2", "b2", "a3"], "{name}");
        }
    });
}
