//! The indexer's write of one key into a [`Writable`] state.

use std::sync::Arc;

use super::epoch::Pinned;
use super::slot::{Slot, SlotRef};
use super::writable::Writable;
use crate::key::Key;

impl<T: Send + Sync + 'static> Writable<'_, T> {
    /// Stores `obj` under `key` and re-indexes it. Its index values (user code) are computed
    /// first, with no shard lock held; the rest happens while holding `key`'s items-shard
    /// entry, and the old object's values (user code, which may panic) are computed before
    /// anything changes, so a panic leaves items and indices as they were.
    pub(super) fn insert(self, key: Key, obj: Arc<T>, guard: &Pinned) -> Option<Arc<T>> {
        let state = self.state();
        let values = state.values_of(&obj);
        match self.entry(key) {
            Ok(mut held) => {
                let old = state.values_of(held.slot().load(guard));
                let changes = || state.indexes.iter().zip(&old).zip(&values);
                // Leave the sets of lost values before the new object is published, join
                // those of gained values after: a key in a set always holds an object that
                // has the set's value (the module docs say why by_index relies on it).
                for ((index, old), new) in changes() {
                    for value in old.iter().filter(|value| !new.contains(value)) {
                        index.remove(held.key(), value);
                    }
                }
                let previous = Slot::replace(&mut held, obj, guard);
                for ((index, old), new) in changes() {
                    for value in new.iter().filter(|value| !old.contains(value)) {
                        index.add(value, held.slot());
                    }
                }
                Some(previous)
            }
            Err(vacant) => {
                let slot = SlotRef::new(Slot::new(vacant.key().clone(), obj));
                for (index, new) in state.indexes.iter().zip(&values) {
                    for value in new {
                        index.add(value, &slot);
                    }
                }
                let shard = state.items.determine_map(vacant.key());
                vacant.insert(slot);
                state.grow_items_shard(shard);
                None
            }
        }
    }
}
