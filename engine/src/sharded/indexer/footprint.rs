//! [`IndexedStore::footprint`]: what the store's tables and index sets hold.

use std::mem::{size_of, size_of_val};

use dashmap::DashMap;

use super::slot::Slot;
use super::{IndexedStore, Member};
use crate::footprint::{table_bytes, Footprint};
use crate::key::{BuildKeyHasher, Key};

/// Heap bytes of a `DashMap`'s shard tables (exact: hashbrown reports each table's
/// allocation) and of its array of shards.
fn dash_map_bytes<V>(map: &DashMap<Key, V, BuildKeyHasher>) -> usize {
    map.shards()
        .iter()
        .map(|shard| size_of_val(shard) + shard.read().allocation_info().1.size())
        .sum()
}

impl<T: Send + Sync + 'static> IndexedStore<T> {
    /// The heap bytes the store holds, per structure: `store.items` (the items map; its
    /// entries are keys), `store.slots` (one slot per key, shared by the items map and the
    /// index sets), and per index `index.NAME.values` (value → set; its entries are values)
    /// and `index.NAME.sets` (the sets; their entries are memberships). Objects and key strings
    /// are not counted. See [`Footprint`](crate::Footprint).
    pub fn footprint(&self) -> Footprint {
        let state = self.state.load();
        let mut footprint = Footprint::default();
        let items = state.items.len();
        footprint.add("store.items", items, dash_map_bytes(&state.items));
        // A `SlotRef`'s allocation: one count and the slot.
        let slot_bytes = size_of::<usize>() + size_of::<Slot<T>>();
        footprint.add("store.slots", items, items * slot_bytes);
        for index in &state.indexes {
            footprint.add(
                format!("index.{}.values", index.name),
                index.map.len(),
                dash_map_bytes(&index.map),
            );
            let (mut members, mut bytes) = (0, 0);
            for set in index.map.iter() {
                members += set.len();
                bytes += table_bytes::<Member<T>>(set.capacity());
            }
            footprint.add(format!("index.{}.sets", index.name), members, bytes);
        }
        footprint
    }
}
