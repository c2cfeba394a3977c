//! The concurrent indexer: the contract of client-go's `threadSafeMap` without its global lock.
//!
//! # Design
//!
//! The whole content is one immutable-shape [`State`] behind an [`ArcSwap`]: a sharded items map
//! (key → object) and one sharded map per index (index value → set of keys). Every [`Key`]
//! carries its hash and the maps use [`BuildKeyHasher`], so nothing is ever rehashed.
//!
//! - **Readers** (`get_by_key`, `by_index`, `index_keys`, `index`, `list`, `list_keys`,
//!   `list_index_func_values`) load the current `State` (lock-free) and take one shard read lock
//!   at a time, never two at once. No reader ever waits for a global lock.
//! - **A write** to key `k` (`insert_by_key`, `remove_by_key`) first runs the index functions on
//!   the new object with no lock held, then holds `k`'s items-shard entry while it computes the
//!   old object's values and updates the index sets, so two writers of one key cannot leave the
//!   indices disagreeing with the items. Lock order is items shard → index shard; readers never
//!   nest, so there is no cycle. When the values did not change (the common update) no index is
//!   touched. Index functions on the *old* object therefore run under that shard lock, as all of
//!   them run under client-go's single lock: they must not call back into the indexer.
//! - A set is removed in the same shard critical section that empties it, so no reader ever sees
//!   an empty set.
//! - **`replace`** builds a fresh `State` and swaps it in; **`add_indexers`** builds the new
//!   indexes over the current items and swaps in a `State` that shares the old indexes and holds
//!   a copy of the items map (same keys, same objects). Both
//!   exclude writers with a `RwLock<()>` that writers take shared and they take exclusive;
//!   readers never touch it and keep reading the old `State` until the swap.
//!
//! # Memory
//!
//! An item costs what it costs in client-go: the key and the object pointer. (An earlier design
//! stored every item's index values beside it to spare the index function calls on the old
//! object; it cost ~70 bytes per item, a third of the indexer at a million keys, for a saving
//! of two reference-count bumps per write with cheap index functions.)

use std::fmt;
use std::mem;
use std::sync::Arc;

use arc_swap::ArcSwap;
use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use smallvec::SmallVec;

use crate::key::{BuildKeyHasher, Key, KeyError, KeyFn, KeySet};
use crate::store::{self, IndexError, IndexFunc, IndexValues, Indexers, KnownObjects, Store};
use crate::sync::{read, write, RwLock};

/// Shards per map: enough that a writer's shard lock rarely meets a reader on two cores or
/// sixty-four, small enough that an empty map stays a few kilobytes.
const SHARDS: usize = 64;

/// An object's values for every index, in the order of [`State::indexes`].
type ValuesPerIndex = SmallVec<[IndexValues; 2]>;

/// One named index: value → keys of the objects that have it; never an empty set.
struct Index<T> {
    name: String,
    func: IndexFunc<T>,
    map: DashMap<Key, KeySet, BuildKeyHasher>,
}

/// Everything a reader needs, swapped as a whole by `replace` and `add_indexers`.
struct State<T> {
    items: DashMap<Key, Arc<T>, BuildKeyHasher>,
    /// Unique names, in the order of every [`ValuesPerIndex`].
    indexes: Vec<Arc<Index<T>>>,
}

/// A concurrent, indexed key → object store with client-go's `Indexer` contract.
///
/// Readers never wait for a global lock, writers of different keys rarely meet, and
/// [`replace`](Store::replace) swaps in a new content without stopping readers.
///
/// Index functions run on the old object of a write while that key's shard is locked (as all
/// of them run under client-go's single lock): they must not call back into the store. Every
/// write computes all the index values it needs before it changes anything, so an index
/// function that panics leaves the store as it was.
///
/// # Consistency
///
/// - `get_by_key(k)` reflects every write to `k` that completed before the call.
/// - Every object that `by_index(name, v)` (or `index`) returns had `v` among its index values
///   at some moment during the call: the set of `v` is snapshotted, then each object is kept
///   only if the index function still gives it `v` for the object *currently* stored. An object that gained
///   `v` during the call may be missing from the result, as if the call had run a moment earlier.
/// - `index_keys(name, v)` is the exact set of `v` at one moment during the call.
/// - An index never holds an empty set.
/// - Once writers stop, items and indices agree exactly.
/// - A write that overlaps a `replace` either lands before it (and is overwritten by it, as if it
///   came first) or after it; it is never lost into a discarded state. The same holds for
///   `add_indexers`, which keeps every write.
/// - `list`, `list_keys` and `len` visit the shards one after the other: under concurrent writes
///   they are not a snapshot of one moment (neither is client-go's `List` of any other moment
///   than the lock's), but every key in the result was stored during the call.
///
/// ```
/// use std::sync::Arc;
/// use kcache::{sharded, IndexFunc, Indexer as _, Key, KeyFn, Store as _};
///
/// struct Pod { key: &'static str, node: &'static str }
/// let key_fn: KeyFn<Pod> = Arc::new(|p: &Pod| Ok(Key::new(p.key)));
/// let by_node: IndexFunc<Pod> = Arc::new(|p: &Pod| [Key::new(p.node)].into_iter().collect());
/// let pods = Arc::new(sharded::IndexedStore::new(key_fn, vec![("node".to_string(), by_node)]));
///
/// let writer = {
///     let pods = Arc::clone(&pods);
///     std::thread::spawn(move || {
///         pods.add(Arc::new(Pod { key: "ns/a", node: "n1" })).unwrap();
///         pods.update(Arc::new(Pod { key: "ns/a", node: "n2" })).unwrap();
///     })
/// };
/// // Readers run alongside the writer; whatever they see is indexed under what they asked.
/// for pod in pods.by_index("node", "n1").unwrap() {
///     assert_eq!(pod.node, "n1");
/// }
/// writer.join().unwrap();
/// assert_eq!(pods.index_keys("node", "n2").unwrap(), [Key::new("ns/a")]);
/// assert!(pods.index_keys("node", "n1").unwrap().is_empty());
/// ```
pub struct IndexedStore<T> {
    key_fn: KeyFn<T>,
    state: ArcSwap<State<T>>,
    /// Writers hold it shared for the whole write; `replace` and `add_indexers` hold it
    /// exclusive around the swap, so no write lands in a state that is being discarded.
    /// Readers never touch it.
    writers: RwLock<()>,
}

fn new_map<V>(capacity: usize) -> DashMap<Key, V, BuildKeyHasher> {
    DashMap::with_capacity_and_hasher_and_shard_amount(capacity, BuildKeyHasher::default(), SHARDS)
}

impl<T> Index<T> {
    fn new(name: String, func: IndexFunc<T>) -> Self {
        Self {
            name,
            func,
            map: new_map(0),
        }
    }

    /// Adds `key` to the set of `value`.
    fn add(&self, key: &Key, value: &Key) {
        // Most values already have a set: update it without cloning the value.
        if let Some(mut set) = self.map.get_mut(value) {
            set.insert(key.clone());
            return;
        }
        self.map
            .entry(value.clone())
            .or_default()
            .insert(key.clone());
    }

    /// Removes `key` from the set of `value`, and the set with it once empty, in one shard
    /// critical section so that no reader ever sees the empty set.
    fn remove(&self, key: &Key, value: &Key) {
        self.map.remove_if_mut(value, |_, set| {
            set.remove(key);
            set.is_empty()
        });
    }

    /// Moves `key` from the `old` values to the `new` ones.
    fn update(&self, key: &Key, old: &IndexValues, new: &IndexValues) {
        if old == new {
            return;
        }
        // Add before removing, so that a key moving between values is never in neither set
        // (a reader may briefly find it in both; by_index's check of the stored values drops
        // the stale one).
        for value in new {
            if !old.contains(value) {
                self.add(key, value);
            }
        }
        for value in old {
            if !new.contains(value) {
                self.remove(key, value);
            }
        }
    }

    /// The keys of `value`'s set at one moment (the shard lock is released on return).
    fn keys(&self, value: &Key) -> Vec<Key> {
        self.map
            .get(value)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }
}

impl<T> State<T> {
    fn empty(indexes: Vec<Arc<Index<T>>>, capacity: usize) -> Self {
        Self {
            items: new_map(capacity),
            indexes,
        }
    }

    /// The position and the index named `name`.
    fn index(&self, name: &str) -> Result<(usize, &Index<T>), IndexError> {
        self.indexes
            .iter()
            .enumerate()
            .find(|(_, index)| index.name == name)
            .map(|(pos, index)| (pos, &**index))
            .ok_or_else(|| IndexError::UnknownIndex(name.to_owned()))
    }

    /// Every index's values for `obj`. Runs user code: call it before changing anything, and,
    /// for the new object of a write, with no shard lock held.
    fn values_of(&self, obj: &T) -> ValuesPerIndex {
        self.indexes.iter().map(|index| (index.func)(obj)).collect()
    }

    /// Stores `obj` under `key` with its precomputed `values` and re-indexes it, all while
    /// holding `key`'s items-shard entry. The old object's values (user code, which may panic)
    /// are computed before anything changes, so a panic leaves items and indices as they were.
    fn insert(&self, key: Key, obj: Arc<T>, values: ValuesPerIndex) -> Option<Arc<T>> {
        match self.items.entry(key) {
            Entry::Occupied(mut entry) => {
                let old_values = self.values_of(entry.get());
                let old_obj = mem::replace(entry.get_mut(), obj);
                for ((index, old), new) in self.indexes.iter().zip(&old_values).zip(&values) {
                    index.update(entry.key(), old, new);
                }
                Some(old_obj)
            }
            Entry::Vacant(entry) => {
                for (index, new) in self.indexes.iter().zip(&values) {
                    for value in new {
                        index.add(entry.key(), value);
                    }
                }
                entry.insert(obj);
                None
            }
        }
    }

    /// Removes `key` and un-indexes it while holding its items shard. Its values (user code)
    /// are computed before anything changes, so a panic leaves items and indices as they were.
    fn remove(&self, key: &Key) -> Option<Arc<T>> {
        let (_, obj) = self.items.remove_if_mut(key, |key, obj| {
            let values = self.values_of(obj);
            for (index, values) in self.indexes.iter().zip(&values) {
                for value in values {
                    index.remove(key, value);
                }
            }
            true
        })?;
        Some(obj)
    }

    /// The stored objects among `keys` whose index `pos` values still include one of `values`.
    fn objects_with(&self, keys: &[Key], pos: usize, values: &[Key]) -> Vec<Arc<T>> {
        let func = &self.indexes[pos].func;
        let mut objects = Vec::with_capacity(keys.len());
        for key in keys {
            // Clone out and release the shard before running the index function.
            let Some(obj) = self.items.get(key).map(|obj| Arc::clone(&obj)) else {
                continue;
            };
            if func(&obj).iter().any(|value| values.contains(value)) {
                objects.push(obj);
            }
        }
        objects
    }
}

impl<T> IndexedStore<T> {
    /// An empty store that keys objects with `key_fn` and maintains the `indexers`.
    ///
    /// Names are unique: when `indexers` names an index twice, the later function wins, as if
    /// the list had been collected into client-go's `Indexers` map.
    pub fn new(key_fn: KeyFn<T>, indexers: Indexers<T>) -> Self {
        let mut unique: Indexers<T> = Vec::with_capacity(indexers.len());
        for (name, func) in indexers {
            match unique.iter_mut().find(|(taken, _)| *taken == name) {
                Some((_, earlier)) => *earlier = func,
                None => unique.push((name, func)),
            }
        }
        let indexes = unique
            .into_iter()
            .map(|(name, func)| Arc::new(Index::new(name, func)))
            .collect();
        Self {
            key_fn,
            state: ArcSwap::from_pointee(State::empty(indexes, 0)),
            writers: RwLock::new(()),
        }
    }
}

impl<T: Send + Sync> KnownObjects<T> for IndexedStore<T> {
    fn list_keys(&self) -> Vec<Key> {
        let state = self.state.load();
        let mut keys = Vec::with_capacity(state.items.len());
        keys.extend(state.items.iter().map(|entry| entry.key().clone()));
        keys
    }

    fn get_by_key(&self, key: &Key) -> Option<Arc<T>> {
        let state = self.state.load();
        let obj = state.items.get(key)?;
        Some(Arc::clone(&obj))
    }
}

impl<T: Send + Sync> Store<T> for IndexedStore<T> {
    fn key_of(&self, obj: &T) -> Result<Key, KeyError> {
        (self.key_fn)(obj)
    }

    fn insert_by_key(&self, key: Key, obj: Arc<T>) -> Option<Arc<T>> {
        let _writer = read(&self.writers);
        let state = self.state.load();
        // User code runs here, before any shard lock is taken.
        let values = state.values_of(&obj);
        state.insert(key, obj, values)
    }

    fn remove_by_key(&self, key: &Key) -> Option<Arc<T>> {
        let _writer = read(&self.writers);
        self.state.load().remove(key)
    }

    /// Builds the new content aside (keys first: a key error changes nothing), then swaps it
    /// in. Readers keep reading the old content until the swap; writers wait only for the
    /// swap. When `list` holds a key twice, the later object wins.
    fn replace(&self, list: Vec<Arc<T>>) -> Result<(), KeyError> {
        let mut keyed = Vec::with_capacity(list.len());
        for obj in list {
            keyed.push(((self.key_fn)(&obj)?, obj));
        }
        // Build with no lock held; only a concurrent add_indexers (rare) forces a rebuild.
        let seen = self.state.load_full();
        let mut fresh = rebuilt(&seen, keyed);
        let exclusive = write(&self.writers);
        let current = self.state.load_full();
        if !same_index_functions(&seen, &current) {
            let entries = fresh.items.into_iter();
            fresh = rebuilt(&current, entries);
        }
        let old = self.state.swap(Arc::new(fresh));
        drop(exclusive);
        // The old content may be large: let the last reader of it free it, outside the lock.
        drop((old, current, seen));
        Ok(())
    }

    fn list(&self) -> Vec<Arc<T>> {
        let state = self.state.load();
        let mut objects = Vec::with_capacity(state.items.len());
        objects.extend(state.items.iter().map(|entry| Arc::clone(entry.value())));
        objects
    }

    fn len(&self) -> usize {
        self.state.load().items.len()
    }
}

/// A state holding `entries` (a later repeat of a key wins), indexed like `like`.
fn rebuilt<T>(like: &State<T>, entries: impl IntoIterator<Item = (Key, Arc<T>)>) -> State<T> {
    let indexes = like
        .indexes
        .iter()
        .map(|index| Arc::new(Index::new(index.name.clone(), Arc::clone(&index.func))))
        .collect();
    let entries = entries.into_iter();
    let fresh = State::empty(indexes, entries.size_hint().0);
    for (key, obj) in entries {
        let values = fresh.values_of(&obj);
        fresh.insert(key, obj, values);
    }
    fresh
}

/// Whether two states index with the same functions under the same names, in the same order.
fn same_index_functions<T>(a: &State<T>, b: &State<T>) -> bool {
    a.indexes.len() == b.indexes.len()
        && a.indexes
            .iter()
            .zip(&b.indexes)
            .all(|(x, y)| x.name == y.name && Arc::ptr_eq(&x.func, &y.func))
}

impl<T: Send + Sync> store::Indexer<T> for IndexedStore<T> {
    /// The objects that share any of `obj`'s `name` values, each checked against its current
    /// values like [`by_index`](store::Indexer::by_index).
    fn index(&self, name: &str, obj: &T) -> Result<Vec<Arc<T>>, IndexError> {
        let state = self.state.load();
        let (pos, index) = state.index(name)?;
        let values = (index.func)(obj);
        let keys = match values.as_slice() {
            [one] => index.keys(one),
            many => {
                let mut union = KeySet::default();
                for value in many {
                    if let Some(set) = index.map.get(value) {
                        union.extend(set.iter().cloned());
                    }
                }
                union.into_iter().collect()
            }
        };
        Ok(state.objects_with(&keys, pos, &values))
    }

    fn index_keys(&self, name: &str, value: &str) -> Result<Vec<Key>, IndexError> {
        let state = self.state.load();
        let (_, index) = state.index(name)?;
        Ok(index.keys(&Key::new(value)))
    }

    fn by_index(&self, name: &str, value: &str) -> Result<Vec<Arc<T>>, IndexError> {
        let state = self.state.load();
        let (pos, index) = state.index(name)?;
        let value = Key::new(value);
        let keys = index.keys(&value);
        Ok(state.objects_with(&keys, pos, std::slice::from_ref(&value)))
    }

    fn list_index_func_values(&self, name: &str) -> Result<Vec<Key>, IndexError> {
        let state = self.state.load();
        let (_, index) = state.index(name)?;
        Ok(index.map.iter().map(|entry| entry.key().clone()).collect())
    }

    /// Refused as a whole when a name is taken (or given twice). Otherwise, with writers held
    /// off, the new indexes are built over the current items, and a state holding the same
    /// objects, the old indexes (shared, untouched) and the new ones is swapped in.
    fn add_indexers(&self, indexers: Indexers<T>) -> Result<(), IndexError> {
        let exclusive = write(&self.writers);
        let current = self.state.load_full();
        for (i, (name, _)) in indexers.iter().enumerate() {
            let taken = current.index(name).is_ok()
                || indexers[..i].iter().any(|(earlier, _)| earlier == name);
            if taken {
                return Err(IndexError::Conflict(name.clone()));
            }
        }
        if indexers.is_empty() {
            return Ok(());
        }
        let added: Vec<Arc<Index<T>>> = indexers
            .into_iter()
            .map(|(name, func)| Arc::new(Index::new(name, func)))
            .collect();
        let mut indexes = current.indexes.clone();
        indexes.extend(added.iter().cloned());
        let next = State::empty(indexes, current.items.len());
        for entry in current.items.iter() {
            for index in &added {
                for value in &(index.func)(entry.value()) {
                    index.add(entry.key(), value);
                }
            }
            next.items
                .insert(entry.key().clone(), Arc::clone(entry.value()));
        }
        let old = self.state.swap(Arc::new(next));
        drop(exclusive);
        drop((old, current));
        Ok(())
    }
}

impl<T> fmt::Debug for IndexedStore<T> {
    /// Counts only: the objects are user data and may be huge.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.load();
        f.debug_struct("sharded::IndexedStore")
            .field("items", &state.items.len())
            .field("indexes", &state.indexes.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    //! What only the private state can show. The contract, as the API shows it, is checked on
    //! both indexers by `tests/indexer_contract.rs`.

    use super::*;
    use crate::reference::test_support::{by_v, key_fn, obj, sorted_key_texts, Obj};
    use crate::store::Indexer as _;

    fn indexer() -> IndexedStore<Obj> {
        IndexedStore::new(key_fn(), vec![("v".into(), by_v())])
    }

    /// No index of the current state holds an empty set.
    fn assert_no_empty_sets(idx: &IndexedStore<Obj>) {
        for index in &idx.state.load().indexes {
            for entry in index.map.iter() {
                assert!(
                    !entry.value().is_empty(),
                    "{}: {:?}",
                    index.name,
                    entry.key()
                );
            }
        }
    }

    /// Read from the maps themselves, after each kind of write that can empty a set (or
    /// build sets: `add_indexers`, `replace`); an empty set the API never lists would still
    /// hold memory.
    #[test]
    fn emptied_index_sets_are_removed_by_every_write() {
        // No index at first, so the sets below are the ones add_indexers built.
        let idx = IndexedStore::new(key_fn(), Vec::new());
        idx.add(obj("p1", 1)).unwrap();
        idx.add(obj("p2", 2)).unwrap();
        idx.add(obj("p3", 3)).unwrap();
        idx.add_indexers(vec![("v".into(), by_v())]).unwrap();
        assert_no_empty_sets(&idx);
        idx.update(obj("p1", 2)).unwrap(); // empties the set of 1
        assert_no_empty_sets(&idx);
        idx.delete(&obj("p3", 3)).unwrap(); // empties the set of 3
        assert_no_empty_sets(&idx);
        let values = idx.list_index_func_values("v").unwrap();
        assert_eq!(sorted_key_texts(&values), ["2"]);
        idx.replace(vec![obj("p4", 4)]).unwrap();
        assert_no_empty_sets(&idx);
        let values = idx.list_index_func_values("v").unwrap();
        assert_eq!(sorted_key_texts(&values), ["4"]);
    }

    #[test]
    fn by_index_drops_objects_whose_stored_values_no_longer_match() {
        // Simulate the race by_index guards against: the snapshot of 1's set still names a key
        // that a writer has since moved to 2.
        let idx = indexer();
        idx.add(obj("p1", 1)).unwrap();
        idx.add(obj("p2", 1)).unwrap();
        let state = idx.state.load();
        let (pos, index) = state.index("v").unwrap();
        let one = Key::new("1");
        let stale = index.keys(&one);
        idx.update(obj("p2", 2)).unwrap();
        let objects = state.objects_with(&stale, pos, std::slice::from_ref(&one));
        let keys: Vec<&str> = objects.iter().map(|o| o.key).collect();
        assert_eq!(keys, ["p1"]);
    }

    #[test]
    fn a_write_after_replace_lands_in_the_swapped_in_state() {
        let idx = indexer();
        idx.add(obj("p1", 1)).unwrap();
        let before = idx.state.load_full();
        idx.replace(vec![obj("p2", 2)]).unwrap();
        idx.add(obj("p3", 3)).unwrap();
        // The discarded state is frozen; the write went to the swapped-in one.
        assert_eq!(before.items.len(), 1);
        assert_eq!(sorted_key_texts(&idx.list_keys()), ["p2", "p3"]);
    }
}
