//! [`Writable`]: the proof that a thread may replace the objects in one state's slots, and
//! [`Held`], the proof [`Slot::replace`](super::slot::Slot::replace) takes for one slot.
//!
//! Replacing a slot's object is a load and a store, sound only while writers of one slot never
//! overlap. A write holds its key's items-shard entry (the shard's write lock) around the
//! replace, so two writers of one slot cannot overlap *through the same items map*. What is
//! left is the other maps that hold the same slot: slots are shared between states only by
//! `add_indexers`, which builds its new state from the current one while holding the writers'
//! lock exclusively and then publishes it, so the states that hold a slot are the current one
//! and states already replaced. A `Writable` names a state in which no other thread writes
//! a slot but through that state's items entries:
//!
//! - [`Writable::current`]: the store's current state, under the writers' lock held shared
//!   ([`SharedWriteLock`]), so every writer reaches this same state (the lock keeps `publish`
//!   out) and none reaches a replaced one;
//! - [`Fresh`]: a state being built by one thread (`replace` builds the next content aside),
//!   whose slots are all its own and which no other thread can reach until it is given up.
//!
//! A [`Held`] is one key's items entry held in such a state ([`Writable::entry`]): while it
//! lives, no other thread can write that key's slot, and `&mut Held` is what replacing the
//! slot's object takes. Nothing outside this module can make either (their fields are
//! private to it).

use std::sync::Arc;

use dashmap::mapref::entry::{Entry, OccupiedEntry, VacantEntry};

use super::epoch::Pinned;
use super::published::SharedWriteLock;
use super::{Index, ItemSlot, State};
use crate::key::Key;

/// A state whose slots the holder may write, each under its key's items-shard entry (see the
/// module docs for why no other writer of those slots can overlap).
pub(super) struct Writable<'w, T: Send + Sync + 'static> {
    state: &'w State<T>,
}

// A copy names the same state (a derive would ask `T: Copy`).
impl<T: Send + Sync + 'static> Clone for Writable<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Send + Sync + 'static> Copy for Writable<'_, T> {}

/// A key's items-shard entry held in a [`Writable`] state: no other thread writes the key's
/// slot while it lives (the module docs say why).
pub(super) struct Held<'w, T: Send + Sync + 'static>(OccupiedEntry<'w, Key, ItemSlot<T>>);

impl<'w, T: Send + Sync + 'static> Writable<'w, T> {
    /// The current state of the store `shared` locks, which stays current while `shared`
    /// lives, for as long as `guard` stays pinned.
    pub(super) fn current(shared: &'w SharedWriteLock<'_, State<T>>, guard: &'w Pinned) -> Self {
        Self {
            state: shared.pinned(guard),
        }
    }

    /// The state itself, to read and to index.
    pub(super) fn state(self) -> &'w State<T> {
        self.state
    }

    /// Holds `key`'s items-shard entry: a [`Held`] if the key is stored, else the vacant
    /// entry to store it in.
    pub(super) fn entry(self, key: Key) -> Result<Held<'w, T>, VacantEntry<'w, Key, ItemSlot<T>>> {
        match self.state.items.entry(key) {
            Entry::Occupied(entry) => Ok(Held(entry)),
            Entry::Vacant(entry) => Err(entry),
        }
    }
}

impl<T: Send + Sync + 'static> Held<'_, T> {
    /// The key held.
    pub(super) fn key(&self) -> &Key {
        self.0.key()
    }

    /// The key's slot.
    pub(super) fn slot(&self) -> &ItemSlot<T> {
        self.0.get()
    }
}

/// A state being built by one thread: every slot in it was made by its own writes, and no
/// other thread can reach it until [`into_state`](Self::into_state) gives it up.
pub(super) struct Fresh<T: Send + Sync + 'static>(State<T>);

impl<T: Send + Sync + 'static> Fresh<T> {
    /// An empty state with `indexes`, room for `capacity` keys.
    pub(super) fn new(indexes: Vec<Arc<Index<T>>>, capacity: usize) -> Self {
        Self(State::empty(indexes, capacity))
    }

    /// The state, to write (`&mut self`: this thread is its only writer, and its slots are its
    /// own).
    pub(super) fn writable(&mut self) -> Writable<'_, T> {
        Writable { state: &self.0 }
    }

    /// The state, ready to be shared.
    pub(super) fn into_state(self) -> State<T> {
        self.0
    }
}
