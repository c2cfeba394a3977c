//! [`IndexedStore::footprint`]: what the store's maps and index sets hold.

use std::sync::Arc;

use super::IndexedStore;
use crate::footprint::{table_bytes, Footprint};
use crate::key::{Key, KeySet};
use crate::sync::read;

impl<T> IndexedStore<T> {
    /// The heap bytes the store holds, per structure: `store.items` (key → object; its
    /// entries are keys), and per index `index.NAME.values` (value → set of keys; its entries
    /// are values) and `index.NAME.sets` (the sets; their entries are memberships). Objects
    /// and key strings are not counted. See [`Footprint`](crate::Footprint).
    pub fn footprint(&self) -> Footprint {
        let inner = read(&self.inner);
        let mut footprint = Footprint::default();
        footprint.add(
            "store.items",
            inner.items.len(),
            table_bytes::<(Key, Arc<T>)>(inner.items.capacity()),
        );
        for index in &inner.indexes {
            footprint.add(
                format!("index.{}.values", index.name),
                index.map.len(),
                table_bytes::<(Key, KeySet)>(index.map.capacity()),
            );
            let (mut members, mut bytes) = (0, 0);
            for set in index.map.values() {
                members += set.len();
                bytes += table_bytes::<Key>(set.capacity());
            }
            footprint.add(format!("index.{}.sets", index.name), members, bytes);
        }
        footprint
    }
}
