//! The consumer side: applying popped deltas to a store and telling an [`EventHandler`]
//! (client-go's `processDeltas`).

use std::sync::Arc;

use crate::delta::{DeltaObject, DeltaType, Deltas, FinalState};
use crate::store::Store;

/// Receives the notifications a shared informer hands its handlers
/// (client-go's `ResourceEventHandler`). Every method defaults to doing nothing.
pub trait EventHandler<T> {
    /// A key appeared in the store. `is_in_initial_list` is true for objects of the first list.
    fn on_add(&mut self, obj: &Arc<T>, is_in_initial_list: bool) {
        let _ = (obj, is_in_initial_list);
    }
    /// A stored key got a new state (also on resync, where `old` and `new` may be the same).
    fn on_update(&mut self, old: &Arc<T>, new: &Arc<T>) {
        let _ = (old, new);
    }
    /// A key was deleted; the payload may be a tombstone.
    fn on_delete(&mut self, obj: &DeltaObject<T>) {
        let _ = obj;
    }
}

/// A handler that ignores everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopHandler;

impl<T> EventHandler<T> for NoopHandler {}

/// client-go's `processDeltas`, oldest delta first: `Sync`, `Replaced`, `Added`, `Updated`
/// store the object and call `on_update(old, new)` if the key was stored, else `on_add`;
/// `Deleted` removes the key and calls `on_delete`.
///
/// Each delta is one store write, exactly as in client-go.
///
/// This is how a consumer meets its obligation to a queue with known objects (see
/// [`DeltaQueue`](crate::DeltaQueue)): call it (or [`apply_deltas_coalesced`]) on **every**
/// popped list, with the queue's known store as `store`, inside `process`. Skipping a list, or
/// applying it to another store, leaves the queue wrong about what exists: later `delete`s are
/// ignored, `replace` tombstones live objects, `resync` sends stale ones.
///
/// ```
/// use std::sync::Arc;
/// use kcache::{process_deltas, reference, DeltaQueue, Key, KeyFn, KnownObjects, NoopHandler,
///              QueueOptions, Store as _};
///
/// let key_fn: KeyFn<String> = Arc::new(|s: &String| Ok(Key::new(s)));
/// let store = Arc::new(reference::IndexedStore::new(key_fn.clone(), vec![]));
/// let queue = reference::DeltaFifo::new(
///     QueueOptions::new(key_fn).known_objects(store.clone() as Arc<dyn KnownObjects<String>>),
/// );
/// queue.add(Arc::new("a".to_string())).unwrap();
/// queue.pop(|deltas, initial| process_deltas(&*store, &mut NoopHandler, &deltas, initial)).unwrap();
/// assert_eq!(store.len(), 1);
/// // The queue now knows "a": a relist without it queues its deletion.
/// queue.replace(vec![], "2").unwrap();
/// assert_eq!(queue.list_keys(), [Key::new("a")]);
/// ```
pub fn process_deltas<T, S, H>(
    store: &S,
    handler: &mut H,
    deltas: &Deltas<T>,
    is_in_initial_list: bool,
) where
    S: Store<T> + ?Sized,
    H: EventHandler<T> + ?Sized,
{
    let key = deltas.key();
    for delta in deltas {
        match (delta.kind, &delta.object) {
            (DeltaType::Deleted, payload) => {
                store.remove_by_key(key);
                handler.on_delete(payload);
            }
            (_, DeltaObject::Object(obj)) => {
                match store.insert_by_key(key.clone(), Arc::clone(obj)) {
                    Some(old) => handler.on_update(&old, obj),
                    None => handler.on_add(obj, is_in_initial_list),
                }
            }
            // A tombstone only ever travels in a Deleted delta; nothing to store otherwise.
            (_, DeltaObject::Tombstone(_)) => {}
        }
    }
}

/// [`process_deltas`] with the store writes of one key coalesced into one.
///
/// The handler sees exactly the calls `process_deltas` would make (same order, same `old` and
/// `new`), and the store ends in the same state; only the intermediate states of this key are
/// never written. A reader cannot tell the difference from having read a moment earlier or
/// later. Handlers run after the key's final state is stored.
pub fn apply_deltas_coalesced<T, S, H>(
    store: &S,
    handler: &mut H,
    deltas: &Deltas<T>,
    is_in_initial_list: bool,
) where
    S: Store<T> + ?Sized,
    H: EventHandler<T> + ?Sized,
{
    if deltas.len() == 1 {
        // The common case: one delta is already one write; nothing to coalesce.
        process_deltas(store, handler, deltas, is_in_initial_list);
        return;
    }

    let key = deltas.key();
    // Only tombstones (outside a Deleted): nothing to store, and nothing to call.
    let Some(last) = deltas.final_state() else {
        return;
    };
    // One write, which also returns what the key held before it: the consumer processing a
    // key is its only writer, so that is the state the first delta applies to. (Looking it up
    // first would probe the items map twice per key.) Removing an absent key changes nothing.
    let before = match last {
        FinalState::Stored(obj) => store.insert_by_key(key.clone(), Arc::clone(obj)),
        FinalState::Removed => store.remove_by_key(key),
    };
    // Replay the deltas over `before` for the handler: the calls process_deltas would make.
    let mut current = before.as_ref();
    for delta in deltas {
        match (delta.kind, &delta.object) {
            (DeltaType::Deleted, payload) => {
                current = None;
                handler.on_delete(payload);
            }
            (_, DeltaObject::Object(obj)) => match current.replace(obj) {
                Some(old) => handler.on_update(old, obj),
                None => handler.on_add(obj, is_in_initial_list),
            },
            (_, DeltaObject::Tombstone(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::delta::{Delta, Tombstone};
    use crate::key::{Key, KeyError};
    use crate::reference::IndexedStore;
    use crate::store::KnownObjects;

    /// Records every handler call as text.
    #[derive(Default)]
    struct Recorder(Vec<String>);

    impl EventHandler<u32> for Recorder {
        fn on_add(&mut self, obj: &Arc<u32>, initial: bool) {
            self.0.push(format!("add {obj} {initial}"));
        }
        fn on_update(&mut self, old: &Arc<u32>, new: &Arc<u32>) {
            self.0.push(format!("update {old}->{new}"));
        }
        fn on_delete(&mut self, obj: &DeltaObject<u32>) {
            let last = obj.last_known().map(|o| **o);
            self.0
                .push(format!("delete {last:?} tombstone={}", obj.is_tombstone()));
        }
    }

    fn store(initial: Option<u32>) -> IndexedStore<u32> {
        let key_fn: crate::KeyFn<u32> =
            Arc::new(|_: &u32| -> Result<Key, KeyError> { Ok(Key::new("k")) });
        let store = IndexedStore::new(key_fn, Vec::new());
        if let Some(v) = initial {
            store.insert_by_key(Key::new("k"), Arc::new(v));
        }
        store
    }

    /// Delta `i` of a sequence, carrying version `v`.
    fn delta(i: usize, v: u32) -> Delta<u32> {
        match i {
            0 => Delta::new(DeltaType::Added, Arc::new(v)),
            1 => Delta::new(DeltaType::Updated, Arc::new(v)),
            2 => Delta::new(DeltaType::Deleted, Arc::new(v)),
            3 => Delta::tombstone(Tombstone {
                key: Key::new("k"),
                last_known: Some(Arc::new(v)),
            }),
            4 => Delta::new(DeltaType::Sync, Arc::new(v)),
            _ => Delta::new(DeltaType::Replaced, Arc::new(v)),
        }
    }

    /// A store that counts the calls made to it.
    struct Counting {
        inner: IndexedStore<u32>,
        calls: std::sync::Mutex<Vec<&'static str>>,
    }

    impl Counting {
        fn record(&self, call: &'static str) {
            self.calls.lock().unwrap().push(call);
        }
    }

    impl KnownObjects<u32> for Counting {
        fn list_keys(&self) -> Vec<Key> {
            self.record("list_keys");
            self.inner.list_keys()
        }
        fn get_by_key(&self, key: &Key) -> Option<Arc<u32>> {
            self.record("get_by_key");
            self.inner.get_by_key(key)
        }
    }

    impl Store<u32> for Counting {
        fn key_of(&self, obj: &u32) -> Result<Key, KeyError> {
            self.inner.key_of(obj)
        }
        fn insert_by_key(&self, key: Key, obj: Arc<u32>) -> Option<Arc<u32>> {
            self.record("insert_by_key");
            self.inner.insert_by_key(key, obj)
        }
        fn remove_by_key(&self, key: &Key) -> Option<Arc<u32>> {
            self.record("remove_by_key");
            self.inner.remove_by_key(key)
        }
        fn replace(&self, list: Vec<Arc<u32>>) -> Result<(), KeyError> {
            self.inner.replace(list)
        }
        fn list(&self) -> Vec<Arc<u32>> {
            self.inner.list()
        }
        fn len(&self) -> usize {
            self.inner.len()
        }
    }

    #[test]
    fn coalesced_apply_makes_one_store_call_per_key_and_no_lookup() {
        let cases: [(&[usize], Option<u32>, &[&str]); 5] = [
            (&[0, 1, 1], None, &["insert_by_key"]),
            (&[1, 2], Some(100), &["remove_by_key"]),
            // Deleting a key the store does not hold: one call, which changes nothing.
            (&[0, 2], None, &["remove_by_key"]),
            (&[2, 0, 1], Some(100), &["insert_by_key"]),
            // A tombstone outside a Deleted delta stores nothing and calls nothing.
            (&[], None, &[]),
        ];
        for (seq, initial, expected) in cases {
            let store = Counting {
                inner: store(initial),
                calls: Default::default(),
            };
            let mut list: Vec<Delta<u32>> = seq
                .iter()
                .enumerate()
                .map(|(n, &d)| delta(d, n as u32 + 1))
                .collect();
            if seq.is_empty() {
                let mut sync_of_tombstone = delta(3, 1);
                sync_of_tombstone.kind = DeltaType::Sync;
                list = vec![sync_of_tombstone.clone(), sync_of_tombstone];
            }
            let deltas = Deltas::from_vec(Key::new("k"), list);
            apply_deltas_coalesced(&store, &mut Recorder::default(), &deltas, false);
            assert_eq!(
                *store.calls.lock().unwrap(),
                expected,
                "{seq:?} from {initial:?}"
            );
        }
    }

    #[test]
    fn coalesced_apply_makes_the_same_calls_and_leaves_the_same_store_as_process_deltas() {
        let mut sequences: Vec<Vec<usize>> = vec![vec![]];
        for _ in 0..3 {
            let longer: Vec<Vec<usize>> = sequences
                .iter()
                .filter(|s| s.len() == sequences.last().map_or(0, Vec::len))
                .flat_map(|s| (0..6).map(move |d| [s.clone(), vec![d]].concat()))
                .collect();
            sequences.extend(longer);
        }
        let mut checked = 0;
        for seq in sequences.iter().filter(|s| !s.is_empty()) {
            for initial_state in [None, Some(100)] {
                for initial_list in [false, true] {
                    let deltas = Deltas::from_vec(
                        Key::new("k"),
                        seq.iter()
                            .enumerate()
                            .map(|(n, &d)| delta(d, n as u32 + 1))
                            .collect(),
                    );
                    let (one, coalesced) = (store(initial_state), store(initial_state));
                    let (mut a, mut b) = (Recorder::default(), Recorder::default());
                    process_deltas(&one, &mut a, &deltas, initial_list);
                    apply_deltas_coalesced(&coalesced, &mut b, &deltas, initial_list);
                    assert_eq!(a.0, b.0, "handler calls for {seq:?} from {initial_state:?}");
                    let key = Key::new("k");
                    assert_eq!(
                        one.get_by_key(&key).map(|o| *o),
                        coalesced.get_by_key(&key).map(|o| *o),
                        "final store for {seq:?} from {initial_state:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, (6 + 36 + 216) * 4, "every sequence up to length 3");
    }
}
