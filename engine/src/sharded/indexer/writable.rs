//! [`Writable`]: the proof that a thread may replace the objects in one state's slots, and the
//! indexer's write of one key, which needs it.
//!
//! [`Slot::replace`] is a load and a store, sound only while writers of one slot never
//! overlap. A write holds its key's items-shard entry (the shard's write lock) around the
//! replace, so two writers of one slot cannot overlap *through the same items map*. What is
//! left is the other maps that hold the same slot: slots are shared between states only by
//! `add_indexers`, which builds its new state from the current one while holding the writers'
//! lock exclusively and then publishes it, so the states that hold a slot are the current one
//! and states already replaced. A `Writable` names a state in which no other thread writes
//! a slot but through that state's items entries:
//!
//! - [`Writable::current`]: the store's current state, under the writers' lock held shared
//!   ([`SharedWriteLock`]), so every writer reaches this same state (the lock keeps `publish` out) and
//!   none reaches a replaced one;
//! - [`Fresh`]: a state being built by one thread (`replace` builds the next content aside),
//!   whose slots are all its own and which no other thread can reach until it is given up.
//!
//! Nothing else can make one (the field is private to this module), and nothing else
//! replaces a slot's object.

use std::sync::Arc;

use dashmap::mapref::entry::Entry;

use super::epoch::Pinned;
use super::published::SharedWriteLock;
use super::slot::{Slot, SlotRef};
use super::{Index, State};
use crate::key::Key;

/// A state whose slots the holder may write, each under its key's items-shard entry (see the
/// module docs for why no other writer of those slots can overlap).
#[derive(Clone, Copy)]
pub(super) struct Writable<'w, T: Send + Sync + 'static> {
    state: &'w State<T>,
}

impl<'w, T: Send + Sync + 'static> Writable<'w, T> {
    /// The current state of the store `shared` locks, which stays current while `shared`
    /// lives, for as long as `guard` stays pinned.
    pub(super) fn current(shared: &'w SharedWriteLock<'_, State<T>>, guard: &'w Pinned) -> Self {
        Self {
            state: shared.pinned(guard),
        }
    }

    /// Stores `obj` under `key` and re-indexes it. Its index values (user code) are computed
    /// first, with no shard lock held; the rest happens while holding `key`'s items-shard
    /// entry, and the old object's values (user code, which may panic) are computed before
    /// anything changes, so a panic leaves items and indices as they were.
    pub(super) fn insert(self, key: Key, obj: Arc<T>, guard: &Pinned) -> Option<Arc<T>> {
        let state = self.state;
        let values = state.values_of(&obj);
        match state.items.entry(key) {
            Entry::Occupied(entry) => {
                let (key, slot) = (entry.key(), entry.get());
                let old = state.values_of(slot.load(guard));
                let changes = || state.indexes.iter().zip(&old).zip(&values);
                // Leave the sets of lost values before the new object is published, join
                // those of gained values after: a key in a set always holds an object that
                // has the set's value (the module docs say why by_index relies on it).
                for ((index, old), new) in changes() {
                    for value in old.iter().filter(|value| !new.contains(value)) {
                        index.remove(key, value);
                    }
                }
                // Safety: `entry` holds this key's items-shard entry (the shard's write lock)
                // in `state`, through which alone writers of `state` replace this slot's
                // object; and `self` proves that no other thread writes the slot through
                // another state meanwhile (the module docs). So no other `replace` of this
                // slot overlaps this one. `guard` comes from `crossbeam_epoch::pin`.
                let previous = unsafe { slot.replace(obj, guard) };
                for ((index, old), new) in changes() {
                    for value in new.iter().filter(|value| !old.contains(value)) {
                        index.add(value, slot);
                    }
                }
                Some(previous)
            }
            Entry::Vacant(entry) => {
                let slot = SlotRef::new(Slot::new(entry.key().clone(), obj));
                for (index, new) in state.indexes.iter().zip(&values) {
                    for value in new {
                        index.add(value, &slot);
                    }
                }
                let shard = state.items.determine_map(entry.key());
                entry.insert(slot);
                state.grow_items_shard(shard);
                None
            }
        }
    }
}

/// A state being built by one thread: every slot in it was made by its own
/// [`insert`](Self::insert), and no other thread can reach it until
/// [`into_state`](Self::into_state) gives it up.
pub(super) struct Fresh<T: Send + Sync + 'static>(State<T>);

impl<T: Send + Sync + 'static> Fresh<T> {
    /// An empty state with `indexes`, room for `capacity` keys.
    pub(super) fn new(indexes: Vec<Arc<Index<T>>>, capacity: usize) -> Self {
        Self(State::empty(indexes, capacity))
    }

    /// Stores `obj` under `key` (a later insert of a key replaces the earlier one).
    pub(super) fn insert(&mut self, key: Key, obj: Arc<T>, guard: &Pinned) {
        // `&mut self`: this thread is the state's only writer, and its slots are its own.
        Writable { state: &self.0 }.insert(key, obj, guard);
    }

    /// The state, ready to be shared.
    pub(super) fn into_state(self) -> State<T> {
        self.0
    }
}
