//! Panics in user code must never wedge a queue: a key function, a transformer, the known
//! objects (`list_keys`, `get_by_key`) or a `process` callback that panics leaves both engines
//! in a state where `len()` counts exactly the keys that can still be popped, every key queued
//! before the panic still comes out, and the sharded engine ends where the reference does.
//!
//! Both engines guarantee that a panic in the key function, the transformer or the known objects
//! changes nothing (those calls all happen before the first change), and that a panic in
//! `process` loses only the key being processed (the reference has already taken it off the
//! queue, as client-go has); keys of the same batch not yet handed to `process` stay queued.
//! The reference runs user code under its lock, so a panic poisons its mutex; both engines
//! ignore poisoning because their state is consistent wherever user code runs.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::{key_of, obj, summary, MapStore, Obj};
use kcache::{
    process_deltas, reference, sharded, DeltaQueue, DeltaType, Key, KeyError, KnownObjects,
    NoopHandler, QueueError, QueueOptions, Store as _, Tombstone, TransformError, TryPop,
};

/// The key function panics on this version.
const KEY_PANICS: u64 = 999;
/// The transformer panics on this version.
const TRANSFORM_PANICS: u64 = 998;

/// The known objects, with switches that make `list_keys` or `get_by_key` panic.
#[derive(Debug, Default)]
struct Panicky {
    store: MapStore,
    list_keys_panics: AtomicBool,
    get_panics: AtomicBool,
}

impl KnownObjects<Obj> for Panicky {
    fn list_keys(&self) -> Vec<Key> {
        if self.list_keys_panics.load(Ordering::Relaxed) {
            panic!("list_keys bug");
        }
        self.store.list_keys()
    }
    fn get_by_key(&self, key: &Key) -> Option<Arc<Obj>> {
        if self.get_panics.load(Ordering::Relaxed) {
            panic!("get_by_key bug");
        }
        self.store.get_by_key(key)
    }
}

fn key_fn(o: &Obj) -> Result<Key, KeyError> {
    assert_ne!(o.v, KEY_PANICS, "key function bug");
    key_of(o)
}

fn options(known: &Arc<Panicky>) -> QueueOptions<Obj> {
    QueueOptions::new(Arc::new(key_fn))
        .known_objects(Arc::clone(known) as Arc<dyn KnownObjects<Obj>>)
        .transformer(Arc::new(|o: Arc<Obj>| {
            assert_ne!(o.v, TRANSFORM_PANICS, "transformer bug");
            Ok::<_, TransformError>(o)
        }))
}

/// A popped key as the tests compare it: key, `is_in_initial_list`, deltas.
type Pop = (String, bool, Vec<(DeltaType, bool, Option<u64>)>);

/// What a queue looks like after a scenario: what `len` said, then everything that could be
/// popped (applied to the known store, as a consumer must), then `has_synced`.
#[derive(Debug, PartialEq)]
struct Seen {
    len: usize,
    pops: Vec<Pop>,
    has_synced: bool,
    known: Vec<(String, u64)>,
}

fn drain<Q: DeltaQueue<Obj>>(q: &Q, known: &Panicky) -> Seen {
    let len = q.len();
    let mut pops = Vec::new();
    while let TryPop::Popped(pop) = q.try_pop(|d, initial| {
        process_deltas(&known.store, &mut NoopHandler, &d, initial);
        (d.key().to_string(), initial, summary(&d))
    }) {
        pops.push(pop);
    }
    assert_eq!(
        len,
        pops.len(),
        "len() must count exactly the keys that can be popped: {pops:?}"
    );
    assert_eq!(q.len(), 0);
    Seen {
        len,
        pops,
        has_synced: q.has_synced(),
        known: known.store.snapshot(),
    }
}

/// Runs `scenario` against the reference and the sharded engine with 1 and 4 shards, each with
/// a fresh known store holding `known`. Returns what each saw afterwards: the reference's and
/// one shard's line for line, four shards' once sorted by key (pop order across shards differs).
fn on_every_engine(
    known: &[(&str, Arc<Obj>)],
    scenario: impl Fn(&dyn Queue, &Panicky),
) -> Vec<Seen> {
    on_engines(&[1, 4], known, scenario)
}

/// [`on_every_engine`] with the sharded engine's shard counts given.
fn on_engines(
    shard_counts: &[usize],
    known: &[(&str, Arc<Obj>)],
    scenario: impl Fn(&dyn Queue, &Panicky),
) -> Vec<Seen> {
    let store = || {
        let store = Arc::new(Panicky::default());
        for (key, o) in known {
            store.store.insert_by_key(Key::new(key), Arc::clone(o));
        }
        store
    };
    let mut seen = Vec::new();
    {
        let known = store();
        let q = reference::DeltaFifo::new(options(&known));
        scenario(&q, &known);
        disarm(&known);
        seen.push(drain(&q, &known));
    }
    for &shards in shard_counts {
        let known = store();
        let q = sharded::DeltaFifo::new(options(&known), shards);
        scenario(&q, &known);
        disarm(&known);
        seen.push(drain(&q, &known));
    }
    seen
}

fn disarm(known: &Panicky) {
    known.list_keys_panics.store(false, Ordering::Relaxed);
    known.get_panics.store(false, Ordering::Relaxed);
}

/// Asserts every engine saw the same, the reference first.
fn assert_agree(mut seen: Vec<Seen>) {
    let reference = seen.remove(0);
    let one_shard = seen.remove(0);
    assert_eq!(one_shard, reference, "one shard must match the reference");
    let mut four_shards = seen.remove(0);
    let mut sorted = reference;
    sorted.pops.sort_by(|a, b| a.0.cmp(&b.0));
    four_shards.pops.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(four_shards, sorted, "four shards must match it per key");
}

/// The operations the scenarios call, object-safe so one scenario runs on every engine.
trait Queue {
    fn add(&self, o: Arc<Obj>) -> Result<(), QueueError>;
    fn delete(&self, o: Arc<Obj>) -> Result<(), QueueError>;
    fn delete_tombstone(&self, t: Tombstone<Obj>) -> Result<(), QueueError>;
    fn replace(&self, list: Vec<Arc<Obj>>) -> Result<(), QueueError>;
    fn resync(&self) -> Result<(), QueueError>;
    /// `pop_batch(max)` whose `process` applies each key to `known` and panics on `bad`.
    fn pop_batch_panicking_on(&self, max: usize, bad: &str, known: &Panicky) -> Vec<String>;
}

impl<Q: DeltaQueue<Obj>> Queue for Q {
    fn add(&self, o: Arc<Obj>) -> Result<(), QueueError> {
        DeltaQueue::add(self, o)
    }
    fn delete(&self, o: Arc<Obj>) -> Result<(), QueueError> {
        DeltaQueue::delete(self, o)
    }
    fn delete_tombstone(&self, t: Tombstone<Obj>) -> Result<(), QueueError> {
        DeltaQueue::delete_tombstone(self, t)
    }
    fn replace(&self, list: Vec<Arc<Obj>>) -> Result<(), QueueError> {
        DeltaQueue::replace(self, list, "1")
    }
    fn resync(&self) -> Result<(), QueueError> {
        DeltaQueue::resync(self)
    }
    fn pop_batch_panicking_on(&self, max: usize, bad: &str, known: &Panicky) -> Vec<String> {
        let mut handed = Vec::new();
        let result = catch_unwind(AssertUnwindSafe(|| {
            DeltaQueue::pop_batch(self, max, |d, initial| {
                handed.push(d.key().to_string());
                assert_ne!(d.key().as_str(), bad, "handler bug");
                process_deltas(&known.store, &mut NoopHandler, &d, initial);
            })
        }));
        assert!(result.is_err(), "process must have panicked");
        handed
    }
}

/// Calls `f`, which must panic.
fn panics<R: std::fmt::Debug>(f: impl FnOnce() -> R) {
    let result = catch_unwind(AssertUnwindSafe(f));
    assert!(result.is_err(), "expected a panic, got {:?}", result.ok());
}

/// Some state to survive the panic: a queued key, a key known only to the store, a tombstone.
fn setup(q: &dyn Queue) {
    q.add(obj("a", 1)).unwrap();
    q.add(obj("b", 1)).unwrap();
    q.delete_tombstone(Tombstone {
        key: Key::new("k"),
        last_known: Some(obj("k", 1)),
    })
    .unwrap();
}

fn known_k() -> Vec<(&'static str, Arc<Obj>)> {
    vec![("k", obj("k", 1)), ("m", obj("m", 1))]
}

/// On every engine, after [`setup`], `arm` makes the known store panic and `call` must panic;
/// asserts nothing was lost (the three entries of the setup still pop) and the engines agree.
fn survives_with_setup_intact<R: std::fmt::Debug>(
    known: &[(&str, Arc<Obj>)],
    arm: impl Fn(&Panicky),
    call: impl Fn(&dyn Queue) -> R,
) {
    let seen = on_every_engine(known, |q, k| {
        setup(q);
        arm(k);
        panics(|| call(q));
    });
    assert_eq!(seen[0].pops.len(), 3, "{:?}", seen[0].pops);
    assert_agree(seen);
}

#[test]
fn replace_survives_a_panicking_list_keys() {
    // Nothing changed: the listed objects and the tombstones were not queued.
    survives_with_setup_intact(
        &known_k(),
        |k| k.list_keys_panics.store(true, Ordering::Relaxed),
        |q| q.replace(vec![obj("a", 2), obj("c", 1)]),
    );
}

#[test]
fn replace_survives_a_panicking_get_by_key() {
    let seen = on_every_engine(&known_k(), |q, known| {
        setup(q);
        known.get_panics.store(true, Ordering::Relaxed);
        panics(|| q.replace(vec![obj("c", 1)]));
        // The queue keeps working after the panic.
        known.get_panics.store(false, Ordering::Relaxed);
        q.replace(vec![obj("d", 1)]).unwrap();
    });
    assert!(seen[0].pops.iter().any(|p| p.0 == "d"));
    assert_agree(seen);
}

#[test]
fn first_replace_that_panics_leaves_the_queue_unpopulated() {
    let seen = on_every_engine(&known_k(), |q, known| {
        known.list_keys_panics.store(true, Ordering::Relaxed);
        panics(|| q.replace(vec![obj("a", 1), obj("c", 1)]));
    });
    assert!(seen[0].pops.is_empty());
    assert!(
        !seen[0].has_synced,
        "the panicking replace populated nothing"
    );
    assert_agree(seen);
}

#[test]
fn resync_survives_a_panicking_known_store() {
    for arm in [
        |k: &Panicky| k.list_keys_panics.store(true, Ordering::Relaxed),
        |k: &Panicky| k.get_panics.store(true, Ordering::Relaxed),
    ] {
        survives_with_setup_intact(&known_k(), arm, |q| q.resync());
    }
}

#[test]
fn resync_survives_a_panicking_key_function() {
    // The store holds an object the key function panics on: resync keys every known object.
    let mut known = known_k();
    known.push(("z", obj("z", KEY_PANICS)));
    survives_with_setup_intact(&known, |_| {}, |q| q.resync());
}

#[test]
fn delete_survives_a_panicking_get_by_key() {
    let seen = on_every_engine(&known_k(), |q, known| {
        setup(q);
        known.get_panics.store(true, Ordering::Relaxed);
        panics(|| q.delete(obj("m", 2)));
    });
    assert_agree(seen);
}

#[test]
fn key_function_and_transformer_panics_change_nothing() {
    let seen = on_every_engine(&known_k(), |q, _| {
        setup(q);
        panics(|| q.add(obj("c", KEY_PANICS)));
        panics(|| q.add(obj("c", TRANSFORM_PANICS)));
        panics(|| q.delete(obj("a", KEY_PANICS)));
        panics(|| q.delete(obj("a", TRANSFORM_PANICS)));
        panics(|| q.replace(vec![obj("c", 1), obj("d", KEY_PANICS)]));
        panics(|| q.replace(vec![obj("c", 1), obj("d", TRANSFORM_PANICS)]));
        // Still working.
        q.add(obj("e", 1)).unwrap();
    });
    let keys: Vec<&str> = seen[0].pops.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(keys, ["a", "b", "k", "e"]);
    assert_agree(seen);
}

#[test]
fn a_panicking_process_loses_only_the_key_it_was_given() {
    // One shard only: with more, the first batch holds whichever keys share a shard.
    let seen = on_engines(&[1], &[], |q, known| {
        for key in ["a", "b", "c", "d"] {
            q.add(obj(key, 1)).unwrap();
        }
        let handed = q.pop_batch_panicking_on(8, "b", known);
        assert_eq!(handed, ["a", "b"], "keys are handed out in order");
    });
    // The reference took a and b off the queue; c and d were never handed out and stay.
    let keys: Vec<&str> = seen[0].pops.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(keys, ["c", "d"]);
    // a was applied, b was lost with the panic, c and d by the drain.
    let known: Vec<(String, u64)> = ["a", "c", "d"].map(|k| (k.to_string(), 1)).into();
    assert_eq!(seen[0].known, known);
    assert_eq!(seen[1], seen[0]);
}

#[test]
fn a_panicking_process_keeps_the_rest_of_the_batch_on_any_shard_count() {
    for shards in [1, 2, 4, 64] {
        let known = Arc::new(Panicky::default());
        let q = sharded::DeltaFifo::new(options(&known), shards);
        // Enough keys that the first batch holds several on 64 shards too (hashes are fixed).
        let keys: Vec<String> = (0..1000).map(|i| format!("k{i}")).collect();
        DeltaQueue::replace(&q, keys.iter().map(|k| obj(k, 1)).collect(), "1").unwrap();
        // Updates queued for a key while its batch is out must stay after the restored deltas.
        let mut handed = Vec::new();
        let result = catch_unwind(AssertUnwindSafe(|| {
            q.pop_batch(16, |d, _| {
                handed.push(d.key().to_string());
                if handed.len() == 2 {
                    for k in &keys {
                        q.update(obj(k, 2)).unwrap();
                    }
                    panic!("handler bug");
                }
            })
        }));
        assert!(result.is_err());
        let seen = drain(&q, &known);
        let mut popped: Vec<&str> = seen.pops.iter().map(|p| p.0.as_str()).collect();
        popped.extend(handed.iter().map(String::as_str));
        popped.sort_unstable();
        popped.dedup();
        assert_eq!(popped.len(), keys.len(), "shards {shards}: no key lost");
        for (key, initial, deltas) in &seen.pops {
            let expected: &[_] = if handed.contains(key) {
                // Its first deltas went to the panicking batch: only the update is left.
                &[(DeltaType::Updated, false, Some(2))]
            } else {
                &[
                    (DeltaType::Sync, false, Some(1)),
                    (DeltaType::Updated, false, Some(2)),
                ]
            };
            assert_eq!(deltas, expected, "shards {shards}, key {key}");
            assert_eq!(
                *initial,
                !handed.contains(key),
                "shards {shards}, key {key}: a returned key is still in the initial list"
            );
        }
        assert!(seen.has_synced, "shards {shards}");
    }
}
