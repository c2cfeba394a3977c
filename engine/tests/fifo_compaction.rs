//! The opt-in level-triggered mode (`QueueOptions::compact_updates`) on both engines: which
//! deltas compact, which never do, and what a handler fed by `process_deltas` sees.

mod common;

use std::sync::Arc;

use common::{obj, options, summary, MapStore, Obj};
use kcache::{
    process_deltas, DeltaObject, DeltaQueue, DeltaType, Deltas, EventHandler, Key, QueueOptions,
    Tombstone,
};

use DeltaType::{Added, Deleted, Replaced, Sync, Updated};

/// Runs `check` with a constructor for the reference and the sharded engine (1 and 4 shards).
fn on_every_engine(check: impl Fn(&str, &dyn Fn(QueueOptions<Obj>) -> Box<dyn Queue>)) {
    check("reference", &|o| {
        Box::new(kcache::reference::DeltaFifo::new(o))
    });
    for shards in [1, 4] {
        check(&format!("sharded/{shards}"), &move |o| {
            Box::new(kcache::sharded::DeltaFifo::new(o, shards))
        });
    }
}

/// The operations these tests use, object safe.
trait Queue {
    fn q_add(&self, o: Arc<Obj>);
    fn q_update(&self, o: Arc<Obj>);
    fn q_delete(&self, o: Arc<Obj>);
    fn q_tombstone(&self, t: Tombstone<Obj>);
    fn q_replace(&self, list: Vec<Arc<Obj>>);
    fn q_resync(&self);
    fn q_get(&self, key: &str) -> Vec<(DeltaType, bool, Option<u64>)>;
    fn q_pop(&self) -> (Deltas<Obj>, bool);
    fn q_queued_deltas(&self) -> usize;
}

impl<Q: DeltaQueue<Obj>> Queue for Q {
    fn q_add(&self, o: Arc<Obj>) {
        self.add(o).unwrap();
    }
    fn q_update(&self, o: Arc<Obj>) {
        self.update(o).unwrap();
    }
    fn q_delete(&self, o: Arc<Obj>) {
        self.delete(o).unwrap();
    }
    fn q_tombstone(&self, t: Tombstone<Obj>) {
        self.delete_tombstone(t).unwrap();
    }
    fn q_replace(&self, list: Vec<Arc<Obj>>) {
        self.replace(list, "1").unwrap();
    }
    fn q_resync(&self) {
        self.resync().unwrap();
    }
    fn q_get(&self, key: &str) -> Vec<(DeltaType, bool, Option<u64>)> {
        self.get_by_key(&Key::new(key))
            .map(|d| summary(&d))
            .unwrap_or_default()
    }
    fn q_pop(&self) -> (Deltas<Obj>, bool) {
        self.pop(|d, initial| (d, initial)).unwrap()
    }
    fn q_queued_deltas(&self) -> usize {
        self.queued_deltas()
    }
}

fn compacting() -> QueueOptions<Obj> {
    options().compact_updates(true)
}

#[test]
fn off_by_default() {
    on_every_engine(|name, make| {
        let q = make(options());
        for v in 1..=3 {
            q.q_update(obj("a", v));
        }
        assert_eq!(
            q.q_get("a"),
            [
                (Updated, false, Some(1)),
                (Updated, false, Some(2)),
                (Updated, false, Some(3))
            ],
            "{name}"
        );
    });
}

#[test]
fn consecutive_updates_compact_into_the_newest() {
    on_every_engine(|name, make| {
        let q = make(compacting());
        for v in 1..=1_000 {
            q.q_update(obj("a", v));
        }
        assert_eq!(q.q_get("a"), [(Updated, false, Some(1_000))], "{name}");
        assert_eq!(q.q_queued_deltas(), 1, "{name}");
    });
}

#[test]
fn added_is_kept_and_the_updates_after_it_compact() {
    on_every_engine(|name, make| {
        let q = make(compacting());
        q.q_add(obj("a", 1));
        for v in 2..=5 {
            q.q_update(obj("a", v));
        }
        assert_eq!(
            q.q_get("a"),
            [(Added, false, Some(1)), (Updated, false, Some(5))],
            "{name}: on_add must still fire with the object it was created as"
        );
        // Two adds in a row are two events: neither compacts the other.
        q.q_add(obj("b", 1));
        q.q_add(obj("b", 2));
        assert_eq!(
            q.q_get("b"),
            [(Added, false, Some(1)), (Added, false, Some(2))],
            "{name}"
        );
    });
}

#[test]
fn sync_and_replaced_compact_with_updates_keeping_the_newer_type() {
    on_every_engine(|name, make| {
        // Updated then a relist's Sync: the Sync wins (newer object, newer type).
        let q = make(compacting());
        q.q_update(obj("a", 1));
        q.q_replace(vec![obj("a", 2)]);
        assert_eq!(q.q_get("a"), [(Sync, false, Some(2))], "{name}");
        q.q_update(obj("a", 3));
        assert_eq!(q.q_get("a"), [(Updated, false, Some(3))], "{name}");

        // With emit_replaced: Replaced compacts the same way.
        let q = make(compacting().emit_replaced(true));
        q.q_update(obj("a", 1));
        q.q_replace(vec![obj("a", 2), obj("a", 3)]);
        assert_eq!(
            q.q_get("a"),
            [(Replaced, false, Some(3))],
            "{name}: a key listed twice keeps one state"
        );
    });
}

#[test]
fn deletes_and_tombstones_keep_order_and_meaning() {
    on_every_engine(|name, make| {
        let q = make(compacting());
        q.q_update(obj("a", 1));
        q.q_delete(obj("a", 2));
        q.q_update(obj("a", 3));
        q.q_update(obj("a", 4));
        assert_eq!(
            q.q_get("a"),
            [
                (Updated, false, Some(1)),
                (Deleted, false, Some(2)),
                (Updated, false, Some(4))
            ],
            "{name}: an update never jumps over a delete"
        );

        q.q_tombstone(Tombstone {
            key: Key::new("a"),
            last_known: Some(obj("a", 4)),
        });
        q.q_update(obj("a", 5));
        assert_eq!(
            q.q_get("a")[3..],
            [(Deleted, true, Some(4)), (Updated, false, Some(5))],
            "{name}: a tombstone is not compacted away"
        );
        // Dedup of two deletes is unchanged: a real delete replaces a tombstone.
        let q = make(compacting());
        q.q_update(obj("b", 1));
        q.q_tombstone(Tombstone {
            key: Key::new("b"),
            last_known: None,
        });
        q.q_delete(obj("b", 2));
        assert_eq!(
            q.q_get("b"),
            [(Updated, false, Some(1)), (Deleted, false, Some(2))],
            "{name}"
        );
    });
}

#[test]
fn resync_sync_compacts_with_nothing_because_it_skips_queued_keys() {
    on_every_engine(|name, make| {
        let store = Arc::new(MapStore::default());
        kcache::Store::insert_by_key(&*store, Key::new("a"), obj("a", 1));
        let q = make(compacting().known_objects(store.clone()));
        q.q_resync();
        q.q_update(obj("a", 2));
        assert_eq!(
            q.q_get("a"),
            [(Updated, false, Some(2))],
            "{name}: an update after a resync's Sync replaces it"
        );
    });
}

/// Records what a handler is told.
#[derive(Default)]
struct Recorder(Vec<String>);

impl EventHandler<Obj> for Recorder {
    fn on_add(&mut self, obj: &Arc<Obj>, is_in_initial_list: bool) {
        self.0
            .push(format!("add {} initial={is_in_initial_list}", obj.v));
    }
    fn on_update(&mut self, old: &Arc<Obj>, new: &Arc<Obj>) {
        self.0.push(format!("update {} -> {}", old.v, new.v));
    }
    fn on_delete(&mut self, obj: &DeltaObject<Obj>) {
        self.0
            .push(format!("delete {}", obj.last_known().map_or(0, |o| o.v)));
    }
}

/// What the handler sees: fewer updates, each with the newest object and the store's previous
/// state as `old`; adds, deletes and the initial-list flag as without compaction.
#[test]
fn a_handler_sees_fewer_updates_with_the_newest_object() {
    on_every_engine(|name, make| {
        for compact in [false, true] {
            let store = Arc::new(MapStore::default());
            let q = make(
                options()
                    .compact_updates(compact)
                    .known_objects(store.clone()),
            );
            let mut handler = Recorder::default();
            let drain = |q: &dyn Queue, handler: &mut Recorder| {
                while q.q_queued_deltas() > 0 {
                    let (d, initial) = q.q_pop();
                    process_deltas(&*store, handler, &d, initial);
                }
            };
            q.q_replace(vec![obj("a", 1)]);
            q.q_update(obj("a", 2));
            drain(&*q, &mut handler);
            q.q_update(obj("a", 3));
            q.q_update(obj("a", 4));
            q.q_update(obj("a", 5));
            drain(&*q, &mut handler);
            q.q_update(obj("b", 1));
            q.q_update(obj("b", 2));
            q.q_delete(obj("b", 2));
            drain(&*q, &mut handler);
            let expected: &[&str] = if compact {
                &[
                    // Sync(1) + Updated(2) compacted: one add, with the newest object, still
                    // flagged as part of the initial list.
                    "add 2 initial=true",
                    "update 2 -> 5",
                    // An object first seen through updates is still added (newest state).
                    "add 2 initial=false",
                    "delete 2",
                ]
            } else {
                &[
                    "add 1 initial=true",
                    "update 1 -> 2",
                    "update 2 -> 3",
                    "update 3 -> 4",
                    "update 4 -> 5",
                    "add 1 initial=false",
                    "update 1 -> 2",
                    "delete 2",
                ]
            };
            assert_eq!(handler.0, expected, "{name} compact={compact}");
            assert_eq!(
                store.snapshot(),
                [("a".to_string(), 5)],
                "{name} compact={compact}: the same final store"
            );
        }
    });
}
