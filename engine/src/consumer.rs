//! The consumer side: applying popped deltas to a store and telling an [`EventHandler`]
//! (client-go's `processDeltas`).

use std::sync::Arc;

use crate::delta::{DeltaObject, DeltaType, Deltas};
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
    if let [only] = deltas.as_slice() {
        // The common case: one delta, one write, no bookkeeping.
        let key = deltas.key();
        match (only.kind, &only.object) {
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
            (_, DeltaObject::Tombstone(_)) => {}
        }
        return;
    }

    let key = deltas.key();
    let before = store.get_by_key(key);
    let mut current = before.clone();
    let mut events: smallvec::SmallVec<[Event<'_, T>; 4]> = smallvec::SmallVec::new();
    for delta in deltas {
        match (delta.kind, &delta.object) {
            (DeltaType::Deleted, payload) => {
                current = None;
                events.push(Event::Delete(payload));
            }
            (_, DeltaObject::Object(obj)) => match current.replace(Arc::clone(obj)) {
                Some(old) => events.push(Event::Update(old, obj)),
                None => events.push(Event::Add(obj)),
            },
            (_, DeltaObject::Tombstone(_)) => {}
        }
    }
    match current {
        Some(obj) => {
            store.insert_by_key(key.clone(), obj);
        }
        None => {
            if before.is_some() {
                store.remove_by_key(key);
            }
        }
    }
    for event in events {
        match event {
            Event::Add(obj) => handler.on_add(obj, is_in_initial_list),
            Event::Update(old, new) => handler.on_update(&old, new),
            Event::Delete(payload) => handler.on_delete(payload),
        }
    }
}

/// A handler call recorded while coalescing.
enum Event<'a, T> {
    Add(&'a Arc<T>),
    Update(Arc<T>, &'a Arc<T>),
    Delete(&'a DeltaObject<T>),
}
