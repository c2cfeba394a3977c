//! The reference indexer: client-go's `threadSafeMap` + `storeIndex` behind one `RwLock`.
//!
//! State, all guarded by one lock (readers share it, writers take it exclusive):
//!
//! - `items`: key → object;
//! - the indexes, each a name, an index function (client-go's `Indexers`) and its index
//!   (client-go's `Indices[name]`): index value → set of the keys of the objects that have it.
//!
//! Invariants, true whenever the lock is free:
//!
//! 1. a key is in the set of value `v` of index `i` iff `items` holds that key and `i`'s function
//!    gives the stored object `v` among its values (the index functions are assumed
//!    deterministic, as in client-go);
//! 2. an index never keeps an empty set (client-go's `deleteKeyFromIndex` drops it);
//! 3. index names are unique.
//!
//! Every write computes all the index values it needs (user code, which may panic) *before* it
//! changes anything, so a panicking index function leaves the state as it was; that is why the
//! lock may ignore poisoning.

use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::key::{Key, KeyError, KeyFn, KeyMap, KeySet};
use crate::store::{self, IndexError, IndexFunc, IndexValues, Indexers, KnownObjects, Store};
use crate::sync::{read, write, RwLock};

mod footprint;

/// A thread-safe, indexed key → object store, ported from client-go (`cache.NewIndexer`).
///
/// One `RwLock` guards everything: readers run in parallel, a writer excludes everyone. See
/// [`sharded::IndexedStore`](crate::sharded::IndexedStore) for the concurrent version with the
/// same contract.
///
/// Index functions run under that lock, as in client-go: they must not call back into the
/// store. Every write computes all the index values it needs before it changes anything, so an
/// index function that panics leaves the store as it was.
///
/// ```
/// use std::sync::Arc;
/// use kcache::{reference, IndexFunc, Indexer as _, Key, KeyFn, Store as _};
///
/// struct Pod { key: &'static str, node: &'static str }
/// let key_fn: KeyFn<Pod> = Arc::new(|p: &Pod| Ok(Key::new(p.key)));
/// let by_node: IndexFunc<Pod> = Arc::new(|p: &Pod| [Key::new(p.node)].into_iter().collect());
/// let pods = reference::IndexedStore::new(key_fn, vec![("node".to_string(), by_node)]);
///
/// pods.add(Arc::new(Pod { key: "ns/a", node: "n1" })).unwrap();
/// pods.add(Arc::new(Pod { key: "ns/b", node: "n2" })).unwrap();
/// pods.update(Arc::new(Pod { key: "ns/b", node: "n1" })).unwrap(); // moves ns/b to n1
///
/// let mut on_n1 = pods.index_keys("node", "n1").unwrap();
/// on_n1.sort();
/// assert_eq!(on_n1, [Key::new("ns/a"), Key::new("ns/b")]);
/// assert!(pods.index_keys("node", "n2").unwrap().is_empty());
/// assert!(pods.by_index("zone", "z1").is_err()); // unknown index: an error, not a panic
/// ```
pub struct IndexedStore<T> {
    key_fn: KeyFn<T>,
    inner: RwLock<Inner<T>>,
}

/// Everything the lock guards.
struct Inner<T> {
    /// key → object.
    items: KeyMap<Arc<T>>,
    /// The indexes in the order they were added; names are unique (invariant 3).
    indexes: Vec<Index<T>>,
}

/// One named index: client-go's `Indexers[name]` and `Indices[name]` side by side.
struct Index<T> {
    name: String,
    func: IndexFunc<T>,
    /// index value → keys of the objects that have it; never an empty set.
    map: KeyMap<KeySet>,
}

/// The old and new values of one key for each index, computed before anything changes.
type ValueChanges = SmallVec<[(IndexValues, IndexValues); 2]>;

impl<T> Index<T> {
    fn new(name: String, func: IndexFunc<T>) -> Self {
        Self {
            name,
            func,
            map: KeyMap::default(),
        }
    }

    /// client-go's `addKeyToIndex`.
    fn add_key(&mut self, key: &Key, value: Key) {
        self.map.entry(value).or_default().insert(key.clone());
    }

    /// client-go's `deleteKeyFromIndex`: drops the set once it is empty (invariant 2).
    fn delete_key(&mut self, key: &Key, value: &Key) {
        if let Some(set) = self.map.get_mut(value) {
            set.remove(key);
            if set.is_empty() {
                self.map.remove(value);
            }
        }
    }

    /// client-go's `updateIndices` for this index, with the values already computed.
    fn update(&mut self, key: &Key, old: IndexValues, new: IndexValues) {
        // The common update leaves the values alone; then the index is not touched at all.
        if old == new {
            return;
        }
        for value in &old {
            self.delete_key(key, value);
        }
        for value in new {
            self.add_key(key, value);
        }
    }
}

impl<T> Inner<T> {
    fn index(&self, name: &str) -> Result<&Index<T>, IndexError> {
        self.indexes
            .iter()
            .find(|index| index.name == name)
            .ok_or_else(|| IndexError::UnknownIndex(name.to_owned()))
    }

    /// Every index's old and new values for a write that turns `old` into `new`.
    fn value_changes(&self, old: Option<&T>, new: Option<&T>) -> ValueChanges {
        self.indexes
            .iter()
            .map(|index| {
                let old = old.map(|obj| (index.func)(obj)).unwrap_or_default();
                let new = new.map(|obj| (index.func)(obj)).unwrap_or_default();
                (old, new)
            })
            .collect()
    }

    fn apply(&mut self, key: &Key, changes: ValueChanges) {
        for (index, (old, new)) in self.indexes.iter_mut().zip(changes) {
            index.update(key, old, new);
        }
    }

    fn objects(&self, keys: &KeySet) -> Vec<Arc<T>> {
        keys.iter()
            .filter_map(|key| self.items.get(key).cloned())
            .collect()
    }
}

impl<T> IndexedStore<T> {
    /// An empty store that keys objects with `key_fn` and maintains the `indexers`.
    ///
    /// Names are unique: when `indexers` names an index twice, the later function wins, as if
    /// the list had been collected into client-go's `Indexers` map.
    pub fn new(key_fn: KeyFn<T>, indexers: Indexers<T>) -> Self {
        let mut indexes: Vec<Index<T>> = Vec::with_capacity(indexers.len());
        for (name, func) in indexers {
            match indexes.iter_mut().find(|index| index.name == name) {
                Some(index) => index.func = func,
                None => indexes.push(Index::new(name, func)),
            }
        }
        Self {
            key_fn,
            inner: RwLock::new(Inner {
                items: KeyMap::default(),
                indexes,
            }),
        }
    }
}

impl<T: Send + Sync> KnownObjects<T> for IndexedStore<T> {
    fn list_keys(&self) -> Vec<Key> {
        read(&self.inner).items.keys().cloned().collect()
    }

    fn get_by_key(&self, key: &Key) -> Option<Arc<T>> {
        read(&self.inner).items.get(key).cloned()
    }

    fn visit_keys(&self, visit: &mut dyn FnMut(&Key)) {
        read(&self.inner).items.keys().for_each(visit);
    }

    /// Visits a copy of the content, taken under the lock: `visit` runs with no lock held (a
    /// reader of this store could otherwise wait behind a waiting writer).
    fn visit_objects(&self, visit: &mut dyn FnMut(&Key, &Arc<T>)) {
        let items: Vec<(Key, Arc<T>)> = read(&self.inner)
            .items
            .iter()
            .map(|(key, obj)| (key.clone(), Arc::clone(obj)))
            .collect();
        for (key, obj) in &items {
            visit(key, obj);
        }
    }
}

impl<T: Send + Sync> Store<T> for IndexedStore<T> {
    fn key_of(&self, obj: &T) -> Result<Key, KeyError> {
        (self.key_fn)(obj)
    }

    /// client-go's `threadSafeMap.Update`: store, then re-index from the old object's values
    /// to the new one's.
    fn insert_by_key(&self, key: Key, obj: Arc<T>) -> Option<Arc<T>> {
        let mut inner = write(&self.inner);
        let changes = inner.value_changes(inner.items.get(&key).map(|old| &**old), Some(&obj));
        let old = inner.items.insert(key.clone(), obj);
        inner.apply(&key, changes);
        old
    }

    /// client-go's `threadSafeMap.Delete`: un-index, then remove.
    fn remove_by_key(&self, key: &Key) -> Option<Arc<T>> {
        let mut inner = write(&self.inner);
        let changes = inner.value_changes(Some(&**inner.items.get(key)?), None);
        inner.apply(key, changes);
        inner.items.remove(key)
    }

    /// client-go's `cache.Replace` + `threadSafeMap.Replace`: every key is computed first (a
    /// failure changes nothing), then the items are swapped and every index rebuilt. When
    /// `list` holds a key twice, the later object wins.
    fn replace(&self, list: Vec<Arc<T>>) -> Result<(), KeyError> {
        let mut items = KeyMap::with_capacity_and_hasher(list.len(), Default::default());
        for obj in list {
            items.insert((self.key_fn)(&obj)?, obj);
        }
        let mut inner = write(&self.inner);
        let mut indexes: Vec<Index<T>> = inner
            .indexes
            .iter()
            .map(|index| Index::new(index.name.clone(), Arc::clone(&index.func)))
            .collect();
        for index in &mut indexes {
            for (key, obj) in &items {
                for value in (index.func)(obj) {
                    index.add_key(key, value);
                }
            }
        }
        let old_items = std::mem::replace(&mut inner.items, items);
        let old_indexes = std::mem::replace(&mut inner.indexes, indexes);
        drop(inner);
        // The old content may be large: free it after the lock is released.
        drop((old_items, old_indexes));
        Ok(())
    }

    fn list(&self) -> Vec<Arc<T>> {
        read(&self.inner).items.values().cloned().collect()
    }

    fn len(&self) -> usize {
        read(&self.inner).items.len()
    }
}

impl<T: Send + Sync> store::Indexer<T> for IndexedStore<T> {
    /// client-go's `threadSafeMap.Index`: the objects that share any of `obj`'s values.
    fn index(&self, name: &str, obj: &T) -> Result<Vec<Arc<T>>, IndexError> {
        let inner = read(&self.inner);
        let index = inner.index(name)?;
        let mut keys = KeySet::default();
        for value in (index.func)(obj) {
            if let Some(set) = index.map.get(&value) {
                keys.extend(set.iter().cloned());
            }
        }
        Ok(inner.objects(&keys))
    }

    fn index_keys(&self, name: &str, value: &str) -> Result<Vec<Key>, IndexError> {
        let inner = read(&self.inner);
        let index = inner.index(name)?;
        Ok(index
            .map
            .get(&Key::new(value))
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default())
    }

    fn by_index(&self, name: &str, value: &str) -> Result<Vec<Arc<T>>, IndexError> {
        let inner = read(&self.inner);
        let index = inner.index(name)?;
        Ok(index
            .map
            .get(&Key::new(value))
            .map(|set| inner.objects(set))
            .unwrap_or_default())
    }

    fn list_index_func_values(&self, name: &str) -> Result<Vec<Key>, IndexError> {
        let inner = read(&self.inner);
        Ok(inner.index(name)?.map.keys().cloned().collect())
    }

    /// client-go's `AddIndexers`: refused as a whole when a name is taken (or given twice);
    /// otherwise the new indexes are built over the stored objects at once.
    fn add_indexers(&self, indexers: Indexers<T>) -> Result<(), IndexError> {
        let mut inner = write(&self.inner);
        for (i, (name, _)) in indexers.iter().enumerate() {
            let taken = inner.indexes.iter().any(|index| index.name == *name)
                || indexers[..i].iter().any(|(earlier, _)| earlier == name);
            if taken {
                return Err(IndexError::Conflict(name.clone()));
            }
        }
        let mut added: Vec<Index<T>> = Vec::with_capacity(indexers.len());
        for (name, func) in indexers {
            let mut index = Index::new(name, func);
            for (key, obj) in &inner.items {
                for value in (index.func)(obj) {
                    index.add_key(key, value);
                }
            }
            added.push(index);
        }
        inner.indexes.extend(added);
        Ok(())
    }
}

impl<T> fmt::Debug for IndexedStore<T> {
    /// Counts only: the objects are user data and may be huge.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = read(&self.inner);
        f.debug_struct("reference::IndexedStore")
            .field("items", &inner.items.len())
            .field("indexes", &inner.indexes.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    //! What only the private state can show. The contract, as the API shows it, is checked on
    //! both indexers by `tests/indexer_contract.rs`.

    use super::*;
    use crate::reference::test_support::{by_v, key_fn, obj, sorted_key_texts};
    use crate::store::Indexer as _;

    /// Invariant 2, read from the maps themselves: an empty set the API never lists would
    /// still hold memory.
    #[test]
    fn emptied_index_sets_are_removed() {
        let idx = IndexedStore::new(key_fn(), vec![("v".into(), by_v())]);
        idx.add(obj("p1", 1)).unwrap();
        idx.add(obj("p2", 1)).unwrap();
        idx.update(obj("p1", 2)).unwrap();
        idx.delete(&obj("p2", 1)).unwrap();
        let inner = read(&idx.inner);
        for index in &inner.indexes {
            assert!(
                index.map.values().all(|set| !set.is_empty()),
                "{}",
                index.name
            );
        }
        assert!(!inner.indexes[0].map.contains_key(&Key::new("1")));
        drop(inner);
        assert_eq!(
            sorted_key_texts(&idx.list_index_func_values("v").unwrap()),
            ["2"]
        );
    }
}
