//! The sharded queue's resync lane (`DeltaFifo::resync_last`): keys queued by a resync alone
//! pop after every key with a live delta, and nothing changes per key (the differential
//! proptest `resync_last_matches_the_reference_per_key_on_drains` and the stress test
//! `resync_replace_and_close_under_load_lose_nothing` check the rest).

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use common::{obj, options, MapStore};
use kcache::sharded::DeltaFifo;
use kcache::{process_deltas, DeltaQueue, DeltaType, NoopHandler, TryPop};

/// A one-shard queue with the lane over a store holding `known`, every key popped once so
/// the store is the consumer's.
fn queue_over(known: &[&str]) -> (DeltaFifo<common::Obj>, Arc<MapStore>) {
    let store = Arc::new(MapStore::default());
    let q = DeltaFifo::new(options().known_objects(store.clone()), 1).resync_last();
    for key in known {
        q.add(obj(key, 1)).unwrap();
    }
    drain(&q, &store);
    (q, store)
}

/// Pops everything, applying it to `store`: each pop's key and delta types, in order.
fn drain(q: &DeltaFifo<common::Obj>, store: &MapStore) -> Vec<(String, Vec<DeltaType>)> {
    let mut popped = Vec::new();
    while let TryPop::Popped(line) = q.try_pop(|d, initial| {
        process_deltas(store, &mut NoopHandler, &d, initial);
        (
            d.key().as_str().to_string(),
            d.iter().map(|d| d.kind).collect(),
        )
    }) {
        popped.push(line);
    }
    popped
}

#[test]
fn a_live_change_pops_before_the_keys_a_resync_queued() {
    let (q, store) = queue_over(&["a", "b", "c"]);
    q.resync().unwrap();
    q.add(obj("d", 1)).unwrap();
    assert_eq!(q.len(), 4);
    assert_eq!(
        drain(&q, &store),
        [
            ("d".into(), vec![DeltaType::Added]),
            ("a".into(), vec![DeltaType::Sync]),
            ("b".into(), vec![DeltaType::Sync]),
            ("c".into(), vec![DeltaType::Sync]),
        ]
    );
    assert!(q.is_empty());
}

#[test]
fn a_resynced_key_that_changes_leaves_the_lane_with_both_deltas() {
    let (q, store) = queue_over(&["a", "b", "c"]);
    q.resync().unwrap();
    q.update(obj("c", 2)).unwrap();
    // c now has a live change: it pops first, its Sync before its update (client-go's per-key
    // order); its stale lane entry is skipped later.
    assert_eq!(
        drain(&q, &store),
        [
            ("c".into(), vec![DeltaType::Sync, DeltaType::Updated]),
            ("a".into(), vec![DeltaType::Sync]),
            ("b".into(), vec![DeltaType::Sync]),
        ]
    );
    // A second resync queues c again, once, in the lane (the stale entry is gone).
    q.resync().unwrap();
    assert_eq!(drain(&q, &store).len(), 3);
    assert!(q.is_empty());
    assert_eq!(
        store.snapshot(),
        [("a".into(), 1), ("b".into(), 1), ("c".into(), 2)]
    );
}

#[test]
fn without_the_lane_a_resync_keeps_client_gos_order() {
    let store = Arc::new(MapStore::default());
    let q = DeltaFifo::new(options().known_objects(store.clone()), 1);
    for key in ["a", "b"] {
        q.add(obj(key, 1)).unwrap();
    }
    drain(&q, &store);
    q.resync().unwrap();
    q.add(obj("d", 1)).unwrap();
    let keys: Vec<_> = drain(&q, &store).into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["a", "b", "d"]);
}

#[test]
fn a_resynced_key_still_in_flight_is_parked_and_comes_back_first() {
    let (q, store) = queue_over(&["a", "b"]);
    q.update(obj("a", 2)).unwrap();
    let mut inner = Vec::new();
    q.pop(|d, initial| {
        assert_eq!(d.key().as_str(), "a");
        // While a is in flight a resync queues both keys in the lane (a as it will be once
        // this pop is applied), and a second consumer meets a in flight: it parks a and takes b.
        q.resync().unwrap();
        let TryPop::Popped(key) = q.try_pop(|d, initial| {
            process_deltas(&*store, &mut NoopHandler, &d, initial);
            d.key().as_str().to_string()
        }) else {
            panic!("b waits in the lane")
        };
        inner.push(key);
        process_deltas(&*store, &mut NoopHandler, &d, initial);
    })
    .unwrap();
    assert_eq!(inner, ["b"]);
    // Done with a: the parked key is back at the head, with the resync's Sync of version 2.
    assert_eq!(q.len(), 1);
    assert_eq!(drain(&q, &store), [("a".into(), vec![DeltaType::Sync])]);
    assert_eq!(store.snapshot(), [("a".into(), 2), ("b".into(), 1)]);
}

#[test]
fn a_panicking_consumer_loses_no_key_from_the_lane() {
    let (q, store) = queue_over(&["a", "b", "c"]);
    q.resync().unwrap();
    q.update(obj("d", 1)).unwrap();
    // A batch takes d (live) and then lane keys; the process panics on the first.
    let result = catch_unwind(AssertUnwindSafe(|| {
        q.pop_batch(4, |_, _| panic!("user code")).unwrap();
    }));
    assert!(result.is_err());
    // d was handed to the process (done with, as in the reference); the rest come back.
    let mut keys: Vec<_> = drain(&q, &store).into_iter().map(|(k, _)| k).collect();
    keys.sort();
    assert_eq!(keys, ["a", "b", "c"]);
    assert!(q.is_empty());
}
