//! The sharded engine's own promises (docs/sharded.md) beyond client-go's per-key semantics, which the
//! differential tests cover: exclusivity, parking, the known-objects race, initial flags across
//! shards, fairness, and completion on panic.

mod common;

use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{obj, options, summary, MapStore, Obj};
use kcache::sharded::DeltaFifo;
use kcache::DeltaType::{Added, Deleted, Sync as SyncDelta, Updated};
use kcache::{process_deltas, DeltaQueue, Deltas, NoopHandler, TryPop};

fn drain_keys(q: &DeltaFifo<Obj>) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    while let TryPop::Popped(item) = q.try_pop(|d, initial| (d.key().to_string(), initial)) {
        out.push(item);
    }
    out
}

/// Pops one key on another thread and holds it in flight until `release` is sent.
fn hold_one(
    q: &Arc<DeltaFifo<Obj>>,
) -> (
    mpsc::Receiver<Deltas<Obj>>,
    mpsc::Sender<()>,
    thread::JoinHandle<()>,
) {
    let (popped_tx, popped_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let q = Arc::clone(q);
    let handle = thread::spawn(move || {
        q.pop(|deltas, _| {
            popped_tx.send(deltas).unwrap();
            release_rx.recv().unwrap();
        })
        .unwrap();
    });
    (popped_rx, release_tx, handle)
}

#[test]
fn shard_count_is_a_power_of_two() {
    assert_eq!(DeltaFifo::new(options(), 0).shard_count(), 1);
    assert_eq!(DeltaFifo::new(options(), 3).shard_count(), 4);
    assert_eq!(DeltaFifo::new(options(), 64).shard_count(), 64);
}

#[test]
fn shard_count_is_capped_and_any_request_is_valid() {
    use kcache::sharded::MAX_SHARDS;
    assert_eq!(MAX_SHARDS, 65_536);
    for asked in [MAX_SHARDS - 1, MAX_SHARDS, MAX_SHARDS + 1, usize::MAX] {
        let q = DeltaFifo::new(options(), asked);
        assert_eq!(q.shard_count(), MAX_SHARDS, "asked for {asked}");
        q.add(obj("a", 1)).unwrap();
        assert_eq!(drain_keys(&q), [("a".to_string(), false)]);
    }
}

#[test]
fn is_empty_sees_a_key_in_any_shard_and_none_after_the_drain() {
    let q = DeltaFifo::new(options(), 16);
    assert!(q.is_empty());
    // Enough keys that every shard holds some: each one alone must make the queue non-empty.
    for i in 0..64 {
        q.add(obj(&format!("k{i}"), 1)).unwrap();
    }
    let mut left = q.len();
    while left > 0 {
        assert!(!q.is_empty(), "{left} keys queued");
        assert!(matches!(q.try_pop(|_, _| ()), TryPop::Popped(())));
        left -= 1;
    }
    assert!(q.is_empty());
}

#[test]
fn one_shard_pops_keys_in_arrival_order() {
    let q = DeltaFifo::new(options(), 1);
    for (k, v) in [("c", 1), ("a", 1), ("b", 1), ("a", 2)] {
        q.add(obj(k, v)).unwrap();
    }
    let order: Vec<_> = drain_keys(&q).into_iter().map(|(k, _)| k).collect();
    assert_eq!(order, ["c", "a", "b"]);
}

#[test]
fn pop_batch_hands_over_many_keys_in_order() {
    let q = DeltaFifo::new(options(), 1);
    for i in 0..10 {
        q.add(obj(&format!("k{i}"), 1)).unwrap();
    }
    let mut seen = Vec::new();
    let n = q
        .pop_batch(4, |d, _| seen.push(d.key().to_string()))
        .unwrap();
    assert_eq!(n, 4);
    assert_eq!(seen, ["k0", "k1", "k2", "k3"]);
    assert_eq!(q.len(), 6);
}

/// Every batch size around the prefetch distance (the queue looks two keys ahead while one is
/// processed): each key handed over once, in FIFO order.
#[test]
fn pop_batch_of_any_size_hands_each_key_once_in_order() {
    for max in 1..=6 {
        let q = DeltaFifo::new(options(), 1);
        for i in 0..11 {
            q.add(obj(&format!("k{i:02}"), 1)).unwrap();
        }
        let mut seen = Vec::new();
        while !q.is_empty() {
            q.pop_batch(max, |d, _| seen.push(d.key().to_string()))
                .unwrap();
        }
        let expected: Vec<String> = (0..11).map(|i| format!("k{i:02}")).collect();
        assert_eq!(seen, expected, "batches of {max}");
    }
}

/// A batch longer than what the consumer takes per hold of the shard lock (32 keys) is still
/// one visit: every key in FIFO order, in one `pop_batch`, each with its own deltas, and a key
/// parked by a second consumer's in-flight hold is skipped, not lost, across the holds.
#[test]
fn a_batch_taken_over_several_holds_of_the_lock_is_one_visit_in_order() {
    let q = Arc::new(DeltaFifo::new(options(), 1));
    for i in 0..100 {
        q.add(obj(&format!("k{i:03}"), 1)).unwrap();
    }
    q.update(obj("k040", 2)).unwrap();
    // Hold "k000" in flight on another thread, then queue it again: it is parked, not taken.
    let (popped, release, holder) = hold_one(&q);
    assert_eq!(popped.recv().unwrap().key().to_string(), "k000");
    q.update(obj("k000", 2)).unwrap();
    q.add(obj("k100", 1)).unwrap();
    let mut seen = Vec::new();
    let n = q
        .pop_batch(256, |d, _| seen.push((d.key().to_string(), summary(&d))))
        .unwrap();
    assert_eq!(n, 100);
    let expected: Vec<String> = (1..=100).map(|i| format!("k{i:03}")).collect();
    let keys: Vec<&String> = seen.iter().map(|(k, _)| k).collect();
    assert_eq!(keys, expected.iter().collect::<Vec<_>>());
    let (_, k040) = &seen[39];
    assert_eq!(*k040, [(Added, false, Some(1)), (Updated, false, Some(2))]);
    release.send(()).unwrap();
    holder.join().unwrap();
    // The parked key went back to the head once its first delivery completed.
    assert_eq!(
        q.try_pop(|d, _| (d.key().to_string(), summary(&d))),
        TryPop::Popped(("k000".to_string(), vec![(Updated, false, Some(2))]))
    );
    assert!(q.is_empty());
}

#[test]
fn key_in_flight_is_not_handed_to_a_second_consumer() {
    let q = Arc::new(DeltaFifo::new(options(), 1));
    q.add(obj("k", 1)).unwrap();
    let (popped, release, holder) = hold_one(&q);
    assert_eq!(summary(&popped.recv().unwrap()), [(Added, false, Some(1))]);
    q.update(obj("k", 2)).unwrap();
    q.add(obj("j", 1)).unwrap();
    // "k" is first in line but in flight: a second consumer gets "j" and parks "k".
    assert_eq!(
        q.try_pop(|d, _| d.key().to_string()),
        TryPop::Popped("j".to_string())
    );
    assert_eq!(
        q.try_pop(|d, _| d.key().to_string()),
        TryPop::Empty,
        "k waits for its holder"
    );
    assert_eq!(q.len(), 1, "a parked key still counts as queued");
    release.send(()).unwrap();
    holder.join().unwrap();
    let TryPop::Popped(deltas) = q.try_pop(|d, _| d) else {
        panic!("k must be poppable once done")
    };
    assert_eq!(summary(&deltas), [(Updated, false, Some(2))]);
}

#[test]
fn parked_key_goes_back_to_the_head_of_the_line() {
    let q = Arc::new(DeltaFifo::new(options(), 1));
    q.add(obj("k", 1)).unwrap();
    let (popped, release, holder) = hold_one(&q);
    popped.recv().unwrap();
    q.update(obj("k", 2)).unwrap();
    q.add(obj("j", 1)).unwrap();
    q.add(obj("i", 1)).unwrap();
    assert_eq!(
        q.try_pop(|d, _| d.key().to_string()),
        TryPop::Popped("j".to_string())
    );
    release.send(()).unwrap();
    holder.join().unwrap();
    let order: Vec<_> = drain_keys(&q).into_iter().map(|(k, _)| k).collect();
    assert_eq!(
        order,
        ["k", "i"],
        "k arrived before i, so it comes out first"
    );
}

#[test]
fn delete_of_a_key_popped_but_not_yet_stored_is_not_ignored() {
    let store = Arc::new(MapStore::default());
    let q = Arc::new(DeltaFifo::new(options().known_objects(store.clone()), 4));
    q.add(obj("k", 1)).unwrap();
    let (popped, release, holder) = hold_one(&q);
    popped.recv().unwrap();
    // The store does not have "k" yet, but once the consumer is done it will: client-go (which
    // processes under its lock) would queue this delete.
    q.delete(obj("k", 1)).unwrap();
    release.send(()).unwrap();
    holder.join().unwrap();
    let TryPop::Popped(deltas) = q.try_pop(|d, _| d) else {
        panic!("the delete must be queued")
    };
    assert_eq!(summary(&deltas), [(Deleted, false, Some(1))]);
}

#[test]
fn delete_of_a_key_whose_popped_deletion_is_not_yet_applied_is_ignored() {
    let store = Arc::new(MapStore::default());
    let q = Arc::new(DeltaFifo::new(options().known_objects(store.clone()), 4));
    q.add(obj("k", 1)).unwrap();
    q.pop(|d, initial| process_deltas(&*store, &mut NoopHandler, &d, initial))
        .unwrap();
    q.delete(obj("k", 1)).unwrap();
    let (popped, release, holder) = hold_one(&q);
    assert_eq!(
        summary(&popped.recv().unwrap()),
        [(Deleted, false, Some(1))]
    );
    // The store still has "k", but after the popped delete is applied it will not: ignore.
    q.delete(obj("k", 1)).unwrap();
    release.send(()).unwrap();
    holder.join().unwrap();
    assert!(q.is_empty());
}

#[test]
fn replace_sees_an_in_flight_key_as_its_popped_state() {
    let store = Arc::new(MapStore::default());
    let q = Arc::new(DeltaFifo::new(options().known_objects(store.clone()), 4));
    q.add(obj("k", 7)).unwrap();
    let (popped, release, holder) = hold_one(&q);
    popped.recv().unwrap();
    q.replace(vec![], "").unwrap();
    q.resync().unwrap();
    release.send(()).unwrap();
    holder.join().unwrap();
    let TryPop::Popped(deltas) = q.try_pop(|d, _| d) else {
        panic!("a tombstone must be queued")
    };
    assert_eq!(summary(&deltas), [(Deleted, true, Some(7))]);
}

#[test]
fn resync_of_an_in_flight_key_syncs_its_popped_state() {
    let store = Arc::new(MapStore::default());
    let q = Arc::new(DeltaFifo::new(options().known_objects(store.clone()), 4));
    q.add(obj("k", 3)).unwrap();
    let (popped, release, holder) = hold_one(&q);
    popped.recv().unwrap();
    q.resync().unwrap();
    release.send(()).unwrap();
    holder.join().unwrap();
    let TryPop::Popped(deltas) = q.try_pop(|d, _| d) else {
        panic!("a sync must be queued")
    };
    assert_eq!(summary(&deltas), [(SyncDelta, false, Some(3))]);
}

#[test]
fn initial_flags_follow_keys_whatever_the_shard_order() {
    for shards in [1, 2, 64] {
        let q = DeltaFifo::new(options(), shards);
        q.replace((0..20).map(|i| obj(&format!("init-{i}"), 1)).collect(), "")
            .unwrap();
        for i in 0..20 {
            q.add(obj(&format!("later-{i}"), 1)).unwrap();
        }
        assert!(!q.has_synced());
        for (key, initial) in drain_keys(&q) {
            assert_eq!(
                initial,
                key.starts_with("init-"),
                "{key} with {shards} shards"
            );
        }
        assert!(q.has_synced());
        assert!(q.wait_synced(Some(Duration::ZERO)));
    }
}

#[test]
fn has_synced_waits_until_the_last_initial_key_is_processed() {
    let q = Arc::new(DeltaFifo::new(options(), 2));
    q.replace(vec![obj("a", 1)], "").unwrap();
    let (popped, release, holder) = hold_one(&q);
    popped.recv().unwrap();
    assert!(!q.has_synced(), "popped but not yet processed");
    release.send(()).unwrap();
    holder.join().unwrap();
    assert!(q.has_synced());
}

#[test]
fn a_panicking_consumer_does_not_leave_its_key_in_flight() {
    let q = Arc::new(DeltaFifo::new(options(), 1));
    q.add(obj("k", 1)).unwrap();
    let q2 = Arc::clone(&q);
    let result = thread::spawn(move || q2.pop(|_, _| panic!("handler bug"))).join();
    assert!(result.is_err());
    q.update(obj("k", 2)).unwrap();
    let TryPop::Popped(deltas) = q.try_pop(|d, _| d) else {
        panic!("k must be poppable again")
    };
    assert_eq!(summary(&deltas), [(Updated, false, Some(2))]);
}

/// `close` ends a `pop` on an empty queue. The popper says it is about to pop, so `close`
/// races it: whether the pop was already asleep is up to the scheduler (a blocked thread
/// cannot be observed), and either way it must return `Closed`.
#[test]
fn close_wakes_a_blocked_pop_and_keeps_items_poppable() {
    let q = Arc::new(DeltaFifo::new(options(), 4));
    let (started, ready) = mpsc::channel();
    let blocked = {
        let q = Arc::clone(&q);
        thread::spawn(move || {
            started.send(()).unwrap();
            q.pop(|d, _| d.key().to_string())
        })
    };
    ready.recv().unwrap();
    q.close();
    assert_eq!(blocked.join().unwrap(), Err(kcache::Closed));
    q.add(obj("late", 1)).unwrap();
    assert_eq!(q.pop(|d, _| d.key().to_string()), Ok("late".to_string()));
    assert_eq!(q.try_pop(|_, _| ()), TryPop::Closed);
}

#[test]
fn every_shard_gets_a_turn() {
    // With 4 shards and round-robin visits of one key each, no shard's keys can be starved by
    // another's: after popping `4 * n` keys, every shard with >= n keys has given n.
    let q = DeltaFifo::new(options(), 4);
    for i in 0..400 {
        q.add(obj(&format!("k{i}"), 1)).unwrap();
    }
    let mut per_shard = std::collections::HashMap::<usize, usize>::new();
    let shard_of = |k: &str| (kcache::Key::new(k).hash_value() >> 32) as usize & 3;
    for _ in 0..40 {
        let TryPop::Popped(k) = q.try_pop(|d, _| d.key().to_string()) else {
            panic!()
        };
        *per_shard.entry(shard_of(&k)).or_default() += 1;
    }
    assert_eq!(per_shard.len(), 4);
    assert!(
        per_shard.values().all(|&n| n == 10),
        "round-robin: {per_shard:?}"
    );
}
