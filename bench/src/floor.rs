//! The floor: the bookkeeping of a DeltaFIFO and of an indexer in plain single-threaded maps,
//! with no lock, no atomic, no condition variable and no scheduler.
//!
//! It is what the benchmarks call `floor`: **the lower bound** for an operation. An engine can
//! approach it but not beat it, because the floor does only what docs/semantics.md requires and nothing
//! that sharing between threads costs. The distance between an engine and the floor is the
//! price of its concurrency.
//!
//! Bookkeeping that is kept, because the contract needs it:
//!
//! - [`FloorQueue`]: client-go's `items` ([`KeyMap`] key → delta list, deduplicated by
//!   client-go's `dedupDeltas` rule) and `queue` ([`VecDeque`] of keys, each at most once), the
//!   populated flag and the initial population count, `replace`'s two kinds of tombstones and
//!   `resync`'s skip of queued keys.
//! - [`FloorIndexer`]: key → object, and per index value → the set of its keys (the layout of
//!   client-go and of both engines), with empty sets removed. Each object keeps the values it
//!   is indexed under, so an update runs the index functions on the new object only.
//!
//! Bookkeeping that is left out, because only sharing or reproducibility needs it: locking,
//! waking poppers, the sorted walk of known keys (the reference port sorts them so its pop
//! order is reproducible; the floor walks its map), and copying the known keys into a `Vec`
//! before walking them. Known objects are passed by reference to the calls that read them,
//! instead of through a shared `Arc<dyn KnownObjects>`.
//!
//! ```
//! use std::sync::Arc;
//! use bench::floor::FloorQueue;
//! use kcache::{DeltaType, Key};
//!
//! let mut q = FloorQueue::new(Arc::new(|s: &String| Ok(Key::new(s))));
//! q.add(Arc::new("a".to_string())).unwrap();
//! q.update(Arc::new("a".to_string())).unwrap();
//! let kinds = q.pop(|deltas, _| deltas.iter().map(|d| d.kind).collect::<Vec<_>>());
//! assert_eq!(kinds, Some(vec![DeltaType::Added, DeltaType::Updated]));
//! assert!(q.is_empty());
//! ```

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use smallvec::SmallVec;

use kcache::{
    Delta, DeltaObject, DeltaType, Deltas, FinalState, IndexError, IndexFunc, IndexValues,
    Indexers, Key, KeyError, KeyFn, KeyMap, KeySet, Tombstone,
};

/// One key's deltas, inline up to two (the engines' inline capacity too).
type DeltaList<T> = SmallVec<[Delta<T>; 2]>;

/// Appends `delta`, then applies client-go's `dedupDeltas` (as [`Deltas::push_dedup`] does): if
/// the two newest deltas are both `Deleted`, they become one, the older unless the older is a
/// tombstone.
fn push_dedup<T>(list: &mut DeltaList<T>, delta: Delta<T>) {
    if let Some(last) = list.last_mut() {
        if last.kind == DeltaType::Deleted && delta.kind == DeltaType::Deleted {
            if last.object.is_tombstone() {
                *last = delta;
            }
            return;
        }
    }
    list.push(delta);
}

/// A DeltaFIFO's bookkeeping with no synchronisation: see the [module docs](self).
pub struct FloorQueue<T> {
    key_fn: KeyFn<T>,
    /// Deltas per key, oldest first; never empty. Same key set as `queue`. The list does not
    /// repeat its key (a popped [`Deltas`] gets the map's key back): one fewer reference count
    /// to bump per new key, as in the sharded engine.
    items: KeyMap<DeltaList<T>>,
    /// Keys in pop order, each at most once.
    queue: VecDeque<Key>,
    /// Emit `Replaced` rather than `Sync` for listed objects.
    emit_replaced: bool,
    populated: bool,
    initial_population_count: usize,
}

impl<T> FloorQueue<T> {
    /// An empty queue keyed by `key_fn`, emitting `Sync` for listed objects.
    pub fn new(key_fn: KeyFn<T>) -> Self {
        Self {
            key_fn,
            items: KeyMap::default(),
            queue: VecDeque::new(),
            emit_replaced: false,
            populated: false,
            initial_population_count: 0,
        }
    }

    /// Sets whether `replace` emits `Replaced` (rather than `Sync`).
    pub fn emit_replaced(mut self, emit: bool) -> Self {
        self.emit_replaced = emit;
        self
    }

    /// Appends with dedup; a key that had nothing queued goes to the back of the queue.
    fn enqueue(&mut self, key: Key, delta: Delta<T>) {
        // One probe of the map whether the key is new or queued.
        match self.items.entry(key) {
            Entry::Occupied(mut queued) => push_dedup(queued.get_mut(), delta),
            Entry::Vacant(new) => {
                self.queue.push_back(new.key().clone());
                new.insert(DeltaList::new()).push(delta);
            }
        }
    }

    /// Queues an `Added` delta.
    pub fn add(&mut self, obj: Arc<T>) -> Result<(), KeyError> {
        let key = (self.key_fn)(&obj)?;
        self.populated = true;
        self.enqueue(key, Delta::new(DeltaType::Added, obj));
        Ok(())
    }

    /// Queues an `Updated` delta.
    pub fn update(&mut self, obj: Arc<T>) -> Result<(), KeyError> {
        let key = (self.key_fn)(&obj)?;
        self.populated = true;
        self.enqueue(key, Delta::new(DeltaType::Updated, obj));
        Ok(())
    }

    /// Queues a `Deleted` delta unless the key is neither queued nor in `known` (docs/semantics.md;
    /// without known objects, unless it is not queued).
    pub fn delete(&mut self, obj: Arc<T>, known: Option<&FloorIndexer<T>>) -> Result<(), KeyError> {
        let key = (self.key_fn)(&obj)?;
        self.populated = true;
        let queued = self.items.contains_key(&key);
        let known = known.is_some_and(|k| k.get_by_key(&key).is_some());
        if queued || known {
            self.enqueue(key, Delta::new(DeltaType::Deleted, obj));
        }
        Ok(())
    }

    /// A relist (docs/semantics.md): `Sync` (or `Replaced`) for every listed object, a tombstone for
    /// every queued key missing from `list` and for every key of `known` missing from `list`
    /// with nothing queued; on the first call, the initial population count.
    pub fn replace(
        &mut self,
        list: Vec<Arc<T>>,
        known: Option<&FloorIndexer<T>>,
    ) -> Result<(), KeyError> {
        let mut listed = Vec::with_capacity(list.len());
        for obj in list {
            listed.push(((self.key_fn)(&obj)?, obj));
        }
        let kind = if self.emit_replaced {
            DeltaType::Replaced
        } else {
            DeltaType::Sync
        };
        let mut keys = KeySet::with_capacity_and_hasher(listed.len(), Default::default());
        for (key, obj) in listed {
            keys.insert(key.clone());
            self.enqueue(key, Delta::new(kind, obj));
        }

        let missing: Vec<(Key, Option<Arc<T>>)> = self
            .queue
            .iter()
            .filter(|key| !keys.contains(*key))
            .map(|key| {
                let last_known = self
                    .items
                    .get(key)
                    .and_then(|list| list.last())
                    .and_then(|newest| newest.object.last_known().cloned());
                (key.clone(), last_known)
            })
            .collect();
        let mut tombstones = missing.len();
        for (key, last_known) in missing {
            self.enqueue_tombstone(key, last_known);
        }

        if let Some(known) = known {
            for (key, obj) in known.iter() {
                if keys.contains(key) || self.items.contains_key(key) {
                    continue;
                }
                tombstones += 1;
                self.enqueue_tombstone(key.clone(), Some(Arc::clone(obj)));
            }
        }

        if !self.populated {
            self.populated = true;
            self.initial_population_count = keys.len() + tombstones;
        }
        Ok(())
    }

    fn enqueue_tombstone(&mut self, key: Key, last_known: Option<Arc<T>>) {
        let tombstone = Tombstone {
            key: key.clone(),
            last_known,
        };
        self.enqueue(key, Delta::tombstone(tombstone));
    }

    /// Queues `Sync` for every key of `known` that has nothing queued.
    pub fn resync(&mut self, known: &FloorIndexer<T>) -> Result<(), KeyError> {
        for (_, obj) in known.iter() {
            // client-go keys the stored object again rather than trusting the store's key.
            let key = (self.key_fn)(obj)?;
            if self.items.contains_key(&key) {
                continue;
            }
            self.enqueue(key, Delta::new(DeltaType::Sync, Arc::clone(obj)));
        }
        Ok(())
    }

    /// Takes the front key and calls `process(deltas, is_in_initial_list)`; `None` when
    /// nothing is queued.
    pub fn pop<R>(&mut self, process: impl FnOnce(Deltas<T>, bool) -> R) -> Option<R> {
        let is_in_initial_list = !self.has_synced();
        let key = self.queue.pop_front()?;
        self.initial_population_count = self.initial_population_count.saturating_sub(1);
        let (key, list) = self.items.remove_entry(&key)?;
        let mut deltas = Deltas::new(key);
        for delta in list {
            deltas.push(delta);
        }
        Some(process(deltas, is_in_initial_list))
    }

    /// Pops up to `max` keys (at least one if any is queued), calling `process` on each in pop
    /// order. Returns how many were popped.
    pub fn pop_batch(&mut self, max: usize, mut process: impl FnMut(Deltas<T>, bool)) -> usize {
        let mut popped = 0;
        while popped < max.max(1) {
            if self.pop(&mut process).is_none() {
                break;
            }
            popped += 1;
        }
        popped
    }

    /// Populated, and every key of the initial list popped.
    pub fn has_synced(&self) -> bool {
        self.populated && self.initial_population_count == 0
    }

    /// The queued deltas of `key`, if any.
    pub fn get_by_key(&self, key: &Key) -> Option<&[Delta<T>]> {
        self.items.get(key).map(|list| list.as_slice())
    }

    /// How many keys are queued.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
}

impl<T> fmt::Debug for FloorQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FloorQueue")
            .field("len", &self.queue.len())
            .field("populated", &self.populated)
            .field("initial_population_count", &self.initial_population_count)
            .finish_non_exhaustive()
    }
}

/// An object's values for every index, inline for up to two indexes (no allocation per write).
type ValuesPerIndex = SmallVec<[IndexValues; 2]>;

/// A stored object and the values it is indexed under, one [`IndexValues`] per index.
struct Slot<T> {
    obj: Arc<T>,
    values: ValuesPerIndex,
}

/// The sets of one index: value → keys of the objects that have it; never an empty set.
type Sets = KeyMap<KeySet>;

/// Files `key` under the `new` values instead of the `old` ones.
fn update_sets(sets: &mut Sets, key: &Key, old: &IndexValues, new: &IndexValues) {
    // The common update keeps its values: then no set is touched.
    if old == new {
        return;
    }
    for value in old {
        if !new.contains(value) {
            // The set goes with its last key.
            if let Some(set) = sets.get_mut(value) {
                set.remove(key);
                if set.is_empty() {
                    sets.remove(value);
                }
            }
        }
    }
    for value in new {
        if !old.contains(value) {
            sets.entry(value.clone()).or_default().insert(key.clone());
        }
    }
}

/// One named index.
struct Index<T> {
    name: String,
    func: IndexFunc<T>,
    sets: Sets,
}

/// An indexer's bookkeeping with no synchronisation: see the [module docs](self).
///
/// Each stored object keeps the values it is indexed under, so a write runs the index functions
/// on the new object only; each index value's set holds keys, as in client-go and both engines.
///
/// ```
/// use std::sync::Arc;
/// use bench::floor::FloorIndexer;
/// use kcache::{IndexFunc, Key};
///
/// let by_len: IndexFunc<String> = Arc::new(|s: &String| [Key::new(&s.len().to_string())].into_iter().collect());
/// let key_fn = Arc::new(|s: &String| Ok(Key::new(s)));
/// let mut store = FloorIndexer::new(key_fn, vec![("len".into(), by_len)]);
/// store.update(Arc::new("ab".to_string())).unwrap();
/// store.update(Arc::new("cd".to_string())).unwrap();
/// assert_eq!(store.by_index("len", "2").unwrap().len(), 2);
/// assert!(store.by_index("size", "2").is_err());
/// ```
pub struct FloorIndexer<T> {
    key_fn: KeyFn<T>,
    items: KeyMap<Slot<T>>,
    indexes: Vec<Index<T>>,
}

impl<T> FloorIndexer<T> {
    /// An empty indexer keyed by `key_fn` maintaining `indexers` (a repeated name: the later
    /// function wins, as in the engines).
    pub fn new(key_fn: KeyFn<T>, indexers: Indexers<T>) -> Self {
        let mut indexes: Vec<Index<T>> = Vec::with_capacity(indexers.len());
        for (name, func) in indexers {
            match indexes.iter_mut().find(|index| index.name == name) {
                Some(index) => index.func = func,
                None => indexes.push(Index {
                    name,
                    func,
                    sets: Sets::default(),
                }),
            }
        }
        Self {
            key_fn,
            items: KeyMap::default(),
            indexes,
        }
    }

    /// Stores `obj` under `key` and re-indexes it; returns what `key` held.
    pub fn insert_by_key(&mut self, key: Key, obj: Arc<T>) -> Option<Arc<T>> {
        let values: ValuesPerIndex = self.indexes.iter().map(|i| (i.func)(&obj)).collect();
        let none = IndexValues::new();
        match self.items.get_mut(&key) {
            Some(slot) => {
                for ((index, old), new) in self.indexes.iter_mut().zip(&slot.values).zip(&values) {
                    update_sets(&mut index.sets, &key, old, new);
                }
                slot.values = values;
                Some(std::mem::replace(&mut slot.obj, obj))
            }
            None => {
                for (index, new) in self.indexes.iter_mut().zip(&values) {
                    update_sets(&mut index.sets, &key, &none, new);
                }
                self.items.insert(key, Slot { obj, values });
                None
            }
        }
    }

    /// Stores a new state of `obj`; returns what its key held.
    pub fn update(&mut self, obj: Arc<T>) -> Result<Option<Arc<T>>, KeyError> {
        let key = (self.key_fn)(&obj)?;
        Ok(self.insert_by_key(key, obj))
    }

    /// Removes `key` and un-indexes it; returns what it held.
    pub fn remove_by_key(&mut self, key: &Key) -> Option<Arc<T>> {
        let slot = self.items.remove(key)?;
        let none = IndexValues::new();
        for (index, old) in self.indexes.iter_mut().zip(&slot.values) {
            update_sets(&mut index.sets, key, old, &none);
        }
        Some(slot.obj)
    }

    /// The object stored under `key` (a reference-count bump, as the engines return).
    pub fn get_by_key(&self, key: &Key) -> Option<Arc<T>> {
        self.items.get(key).map(|slot| Arc::clone(&slot.obj))
    }

    /// The objects whose `name` index values include `value`.
    pub fn by_index(&self, name: &str, value: &str) -> Result<Vec<Arc<T>>, IndexError> {
        let index = self.index(name)?;
        // The engines take the value as a string and make a key of it; so does the floor.
        let value = Key::new(value);
        Ok(index
            .sets
            .get(&value)
            .map(|keys| {
                keys.iter()
                    .filter_map(|key| self.items.get(key).map(|slot| Arc::clone(&slot.obj)))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The keys of the objects whose `name` index values include `value`.
    pub fn index_keys(&self, name: &str, value: &str) -> Result<Vec<Key>, IndexError> {
        Ok(self
            .index(name)?
            .sets
            .get(&Key::new(value))
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default())
    }

    fn index(&self, name: &str) -> Result<&Index<T>, IndexError> {
        self.indexes
            .iter()
            .find(|index| index.name == name)
            .ok_or_else(|| IndexError::UnknownIndex(name.to_owned()))
    }

    /// Every stored key and object, in map order.
    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Arc<T>)> + '_ {
        self.items.iter().map(|(key, slot)| (key, &slot.obj))
    }

    /// How many objects are stored.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl<T> fmt::Debug for FloorIndexer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FloorIndexer")
            .field("len", &self.items.len())
            .field(
                "indexes",
                &self.indexes.iter().map(|i| &i.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Applies popped deltas to the floor store (client-go's `processDeltas` without a handler):
/// what a floor consumer does with each pop.
pub fn apply_deltas<T>(store: &mut FloorIndexer<T>, deltas: &Deltas<T>) {
    let key = deltas.key();
    for delta in deltas.iter() {
        match (delta.kind, &delta.object) {
            (DeltaType::Deleted, _) => {
                store.remove_by_key(key);
            }
            (_, DeltaObject::Object(obj)) => {
                store.insert_by_key(key.clone(), Arc::clone(obj));
            }
            (_, DeltaObject::Tombstone(_)) => {}
        }
    }
}

/// [`apply_deltas`] with the writes of one key coalesced into one, as the sharded engine's
/// consumer applies a pop (`kcache::apply_deltas_coalesced`): only the key's final state
/// ([`Deltas::final_state`]) is stored. The least a consumer can write for a pop; with no
/// handler there is nothing to replay.
pub fn apply_deltas_coalesced<T>(store: &mut FloorIndexer<T>, deltas: &Deltas<T>) {
    match deltas.final_state() {
        Some(FinalState::Stored(obj)) => {
            store.insert_by_key(deltas.key().clone(), Arc::clone(obj));
        }
        Some(FinalState::Removed) => {
            store.remove_by_key(deltas.key());
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use kcache::{process_deltas, DeltaQueue, Indexer as _, NoopHandler, Store as _};

    use super::*;
    use crate::{pod, pods, pods_moving, universe, Pod};

    /// `(kind, version or tombstone's last known version)` of each delta.
    type Summary = Vec<(DeltaType, Option<u64>)>;

    fn summary(deltas: &Deltas<Pod>) -> Summary {
        deltas
            .iter()
            .map(|d| (d.kind, d.object.last_known().map(|p| p.version)))
            .collect()
    }

    #[test]
    fn floor_pops_in_arrival_order_and_dedups_like_client_go() {
        let u = universe(3);
        let mut q = FloorQueue::new(crate::pod_key_fn());
        q.add(pod(&u, 2, 1, 0)).unwrap();
        q.add(pod(&u, 0, 1, 0)).unwrap();
        q.update(pod(&u, 2, 2, 0)).unwrap();
        q.delete(pod(&u, 0, 1, 0), None).unwrap();
        q.delete(pod(&u, 0, 1, 0), None).unwrap(); // deduplicated with the previous Deleted
        q.delete(pod(&u, 1, 1, 0), None).unwrap(); // neither queued nor known: ignored
        assert_eq!(q.len(), 2);
        let first = q.pop(|d, _| (d.key().clone(), summary(&d))).unwrap();
        assert_eq!(first.0, u.keys[2]);
        assert_eq!(
            first.1,
            [(DeltaType::Added, Some(1)), (DeltaType::Updated, Some(2))]
        );
        let second = q.pop(|d, _| summary(&d)).unwrap();
        assert_eq!(
            second,
            [(DeltaType::Added, Some(1)), (DeltaType::Deleted, Some(1))]
        );
        assert!(q.pop(|_, _| ()).is_none());
    }

    /// Random adds, updates, deletes, relists and resyncs, with a consumer applying every pop
    /// to its store, through the floor and the reference port; every drain must hand out the
    /// same deltas per key (the floor walks known keys in map order, the reference sorted, so
    /// only the order across keys may differ).
    #[test]
    fn floor_queue_drains_the_same_deltas_per_key_as_the_reference() {
        let u = universe(40);
        let mut rng = fastrand::Rng::with_seed(7);
        let reference_store = Arc::new(crate::reference_indexer());
        let reference = crate::reference_queue(Some(reference_store.clone()));
        let mut floor_store = crate::floor_indexer();
        let mut floor = FloorQueue::new(crate::pod_key_fn());
        let mut version = 1;
        for step in 0..2000 {
            version += 1;
            let id = rng.usize(..40);
            match rng.usize(..100) {
                0..=39 => {
                    reference.add(pod(&u, id, version, 0)).unwrap();
                    floor.add(pod(&u, id, version, 0)).unwrap();
                }
                40..=69 => {
                    reference.update(pod(&u, id, version, 0)).unwrap();
                    floor.update(pod(&u, id, version, 0)).unwrap();
                }
                70..=89 => {
                    reference.delete(pod(&u, id, version, 0)).unwrap();
                    floor
                        .delete(pod(&u, id, version, 0), Some(&floor_store))
                        .unwrap();
                }
                90..=94 => {
                    let list: Vec<_> = (0..40)
                        .filter(|_| rng.usize(..4) != 0)
                        .map(|i| pod(&u, i, version, 0))
                        .collect();
                    reference.replace(list.clone(), "rv").unwrap();
                    floor.replace(list, Some(&floor_store)).unwrap();
                }
                _ => {
                    reference.resync().unwrap();
                    floor.resync(&floor_store).unwrap();
                }
            }
            if step % 50 == 49 {
                let mut from_reference = BTreeMap::new();
                while let kcache::TryPop::Popped(()) = reference.try_pop(|d, initial| {
                    process_deltas(&*reference_store, &mut NoopHandler, &d, initial);
                    from_reference.insert(d.key().clone(), (summary(&d), initial));
                }) {}
                let mut from_floor = BTreeMap::new();
                while let Some(()) = floor.pop(|d, initial| {
                    apply_deltas(&mut floor_store, &d);
                    from_floor.insert(d.key().clone(), (summary(&d), initial));
                }) {}
                assert_eq!(from_floor, from_reference, "drain after step {step}");
                assert_eq!(floor.has_synced(), reference.has_synced());
                assert_eq!(floor_store.len(), reference_store.len());
            }
        }
    }

    /// Random queues drained twice over, once applying every delta and once coalesced: the two
    /// stores must end alike after every drain, key by key and version by version.
    #[test]
    fn coalesced_apply_ends_in_the_same_store_as_applying_every_delta() {
        let u = universe(30);
        let mut rng = fastrand::Rng::with_seed(11);
        let mut every = crate::floor_indexer();
        let mut coalesced = crate::floor_indexer();
        let mut queue = FloorQueue::new(crate::pod_key_fn());
        let mut version = 1;
        let mut multi_delta_pops = 0;
        for step in 0..3000 {
            version += 1;
            let id = rng.usize(..30);
            match rng.usize(..100) {
                0..=44 => queue.add(pod(&u, id, version, 0)).unwrap(),
                45..=79 => queue.update(pod(&u, id, version, id % 3)).unwrap(),
                80..=94 => queue.delete(pod(&u, id, version, 0), Some(&every)).unwrap(),
                _ => {
                    let list: Vec<_> = (0..30)
                        .filter(|_| rng.usize(..5) != 0)
                        .map(|i| pod(&u, i, version, 0))
                        .collect();
                    queue.replace(list, Some(&every)).unwrap();
                }
            }
            if step % 40 == 39 {
                while let Some(()) = queue.pop(|d, _| {
                    multi_delta_pops += usize::from(d.len() > 1);
                    apply_deltas(&mut every, &d);
                    apply_deltas_coalesced(&mut coalesced, &d);
                }) {}
                let versions = |store: &FloorIndexer<Pod>| -> BTreeMap<Key, u64> {
                    store.iter().map(|(k, p)| (k.clone(), p.version)).collect()
                };
                assert_eq!(versions(&coalesced), versions(&every), "after step {step}");
                // Index sets hold each key once: compare them as sets.
                let on_node = |store: &FloorIndexer<Pod>, node: &Key| -> BTreeSet<Key> {
                    store
                        .index_keys("node", node.as_str())
                        .unwrap()
                        .into_iter()
                        .collect()
                };
                for node in u.nodes.iter().take(3) {
                    assert_eq!(
                        on_node(&coalesced, node),
                        on_node(&every, node),
                        "node {node} after step {step}"
                    );
                }
            }
        }
        // The drains did coalesce: many pops carried several deltas.
        assert!(multi_delta_pops > 100, "{multi_delta_pops}");
    }

    #[test]
    fn floor_indexer_matches_the_reference_through_moves_and_deletes() {
        let u = universe(200);
        let reference = crate::reference_indexer();
        let mut floor = crate::floor_indexer();
        for batch in [pods(&u, 1), pods_moving(&u, 2, 3), pods(&u, 3)] {
            for p in batch {
                reference.update(Arc::clone(&p)).unwrap();
                floor.update(p).unwrap();
            }
        }
        for id in (0..200).step_by(7) {
            reference.remove_by_key(&u.keys[id]);
            floor.remove_by_key(&u.keys[id]);
        }
        for node in u.nodes.iter().take(300) {
            let mut want = reference.index_keys("node", node.as_str()).unwrap();
            let mut got = floor.index_keys("node", node.as_str()).unwrap();
            want.sort();
            got.sort();
            assert_eq!(got, want, "node {node}");
            // by_index hands out the stored objects: the newest version of each key.
            let objects = floor.by_index("node", node.as_str()).unwrap();
            assert_eq!(objects.len(), want.len(), "node {node}");
            assert!(objects.iter().all(|p| p.version == 3), "stale object");
        }
        assert_eq!(floor.len(), reference.len());
        // Index sets are dropped once empty: a node nobody runs on is simply absent.
        assert!(floor.index_keys("node", "node-4999").unwrap().is_empty());
        assert!(matches!(
            floor.by_index("zone", "z"),
            Err(IndexError::UnknownIndex(name)) if name == "zone"
        ));
    }
}
