//! The concurrent indexer: the contract of client-go's `threadSafeMap` without its global lock.
//!
//! # Design
//!
//! The whole content is one immutable-shape [`State`], [`Published`] (an `ArcSwap` that pinned
//! threads read as a plain pointer): a sharded items map
//! (key → [`Slot`]) and one sharded map per index (index value → the slots of the keys that
//! have it; a slot carries its key). A slot holds the key's current object and is shared by the
//! items map and every set the key is in, so replacing an object whose index values did not
//! change touches no index. Every [`Key`] carries its hash and the maps use
//! [`BuildKeyHasher`], so nothing is ever rehashed.
//!
//! - **Readers** load the current `State` and take one shard read lock at a time, never two at
//!   once: `get_by_key` the key's items shard, `by_index` the value's index shard, whose set
//!   names the slots of exactly the objects to return. No reader ever waits for a global lock.
//! - **A write** to key `k` (`insert_by_key`, `remove_by_key`) first runs the index functions on
//!   the new object with no lock held, then holds `k`'s items-shard entry (so writers of one key
//!   never overlap) while it computes the old object's values and, in this order, removes `k`
//!   from the sets of the values it loses, publishes the new object in the slot, and adds `k`
//!   to the sets of the values it gains. Hence, whenever a reader holding the shard lock of
//!   `v` finds `k` in the set of `v`, the object in `k`'s slot has `v`: `by_index` needs no
//!   re-check. When the values did not change (the common update) no index is touched. Lock
//!   order is items shard → index shard; readers never nest, so there is no cycle. Index
//!   functions on the *old* object therefore run under that shard lock, as all of them run
//!   under client-go's single lock: they must not call back into the indexer.
//! - A set is removed in the same shard critical section that empties it, so no reader ever sees
//!   an empty set.
//! - **`replace`** builds a fresh `State` and swaps it in; **`add_indexers`** builds the new
//!   indexes over the current items and swaps in a `State` that shares the old indexes and the
//!   slots (a copy of the items map). Both exclude writers with the writers' lock of
//!   [`Published`], which writers take shared and they take exclusive; readers never touch it
//!   and keep reading the old `State` until the swap.
//!
//! # Unsafe rules carried by types
//!
//! Two operations here are sound only for an exclusive writer, and their types say so:
//!
//! - publishing a new `State` is a method of [`published::Exclusive`], the writers' lock held
//!   exclusively (and borrowed `&mut`);
//! - replacing a slot's object ([`Slot::replace`], a load and a store) takes `&mut`
//!   [`writable::Held`]: the key's items-shard entry held in a state that no other writer can
//!   reach at the same time, which only [`Writable::entry`] makes: the current state under the
//!   writers' lock held shared ([`published::SharedWriteLock`]), or a state being built by one
//!   thread ([`writable::Fresh`]).
//!
//! A slot's pointer leaves it only as the slot's own strong count, which only the epoch
//! releases ([`slot`]); every borrowed `&T` is tied to the epoch guard it was read under.
//!
//! # Borrowed reads
//!
//! [`IndexedStore::pin`] returns a [`ReadGuard`] whose reads hand out `&T` valid while the
//! guard lives, instead of an `Arc<T>` per object: an `Arc` clone is an atomic increment (and
//! later a decrement) on the object's cache line, which moves that line between cores; a
//! `by_index` returning twenty objects did forty of them. The `Arc` API stays (the `Store` and
//! `Indexer` traits) and is the guarded read plus one increment per object.
//!
//! Objects are reclaimed by epochs (`crossbeam-epoch`, see [`slot`]): a writer that replaces
//! or removes an object defers the release of the slot's reference until every thread pinned at
//! that moment has unpinned. What one guarded read writes, and where:
//!
//! | step | writes |
//! |---|---|
//! | `pin()` (once per guard) | this thread's epoch record (its own cache line; the global epoch is only read): a compare-exchange that is also the `SeqCst` fence, and a release store when the guard goes; every 128th pin of a thread also tries to advance the global epoch and runs due deferred releases (shared writes, amortised) |
//! | the current `State` | nothing: one `Acquire` load of the pointer [`Published`] mirrors (arc-swap's `load`, which paths that do not pin use, writes a debt slot of the thread's own twice) |
//! | one shard read lock (`get_by_key`: items shard; `by_index`: the value's index shard) | the shard's lock word, acquire and release: the one shared line a read writes, once per call, not per object |
//! | each object | nothing: one `Acquire` load of its slot |
//!
//! Why not the alternatives:
//!
//! - *Closures under the shard lock* (`with_by_index(name, v, |objs: &[&T]| ...)` over today's
//!   maps) writes the same lock words but still has to visit the items map once per object
//!   (another shard lock each, nested in the index lock: a cycle with writers) unless the sets
//!   hold the objects, and sets holding the objects make every update touch every index it is in
//!   (measured with such sets: the common update costs 3× as much).
//! - *A lock-free map for items and sets* (e.g. one built on `seize`) would spare the shard
//!   lock word too, but every write would allocate and retire a map node, an index set could no
//!   longer be emptied and removed in one critical section (no empty set), and `index_keys` could
//!   no longer read a set at one moment. Slots keep the writer's cost (one deferred release per
//!   replaced object) and every promise.
//! - *`ArcSwap` per slot*: a borrowed read takes one of only eight debt slots per thread, so a
//!   `by_index` returning more objects falls back to reference counts.
//!
//! A guard holds back the release of every object replaced while it lives (not the reading of
//! new ones: each read sees the current `State`, so `get_by_key` still reflects every completed
//! write). Hold one for a batch of reads, not for ever; [`ReadGuard::repin`] lets a long reader
//! release what it no longer borrows.
//!
//! # Memory
//!
//! An item costs the key in the items map, its slot (the object pointer and the key, 32 bytes,
//! behind one reference count: a 40-byte allocation) and, per index value, one slot pointer in
//! the value's set (a set finds a member's key in its slot). Replaced objects live until the epoch passes them (normally
//! within a few hundred writes of the writer's thread).

mod epoch;
mod footprint;
#[allow(unsafe_code)] // The epoch-kept mirror of the current state: see its `Safety:` comment.
mod published;
#[allow(unsafe_code)] // Epoch-reclaimed slots: see its `Safety:` comments.
mod slot;
mod writable;
mod write;

use std::borrow::Borrow;
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use dashmap::try_result::TryResult;
use dashmap::DashMap;
use smallvec::SmallVec;

use super::{grow, prefetch};
use crate::key::{BuildKeyHasher, Key, KeyError, KeyFn, KeyMap};
use crate::store::{
    self, IndexError, IndexFunc, IndexValues, Indexers, KnownObjects, PrefetchStep, Store,
};
use epoch::Pinned;
use published::Published;
use slot::{Slot, SlotRef};
use writable::{Fresh, Writable};

/// Shards per map: enough that a writer's shard lock rarely meets a reader on two cores or
/// sixty-four, small enough that an empty map stays a few kilobytes.
const SHARDS: usize = 64;

/// How many entries ahead of the one visited `visit_objects` asks for an entry's slot.
const WALK_SLOT_AHEAD: usize = 8;

/// How many entries ahead of the one visited `visit_objects` asks for the object in an entry's
/// slot: nearer than [`WALK_SLOT_AHEAD`], since the object is found through the slot.
const WALK_OBJECT_AHEAD: usize = 4;

/// An object's values for every index, in the order of [`State::indexes`].
type ValuesPerIndex = SmallVec<[IndexValues; 2]>;

/// The keys that have one index value, as their slots; never empty.
type Members<T> = grow::Growing<HashSet<Member<T>, BuildKeyHasher>>;

/// A key in an index value's set: its slot, which holds the key. A set is looked up and
/// compared by that key (with its precomputed hash), so it stores one pointer per member
/// instead of a key beside the pointer.
struct Member<T: Send + Sync + 'static>(SlotRef<T>);

impl<T: Send + Sync + 'static> Member<T> {
    fn key(&self) -> &Key {
        self.0.key()
    }
}

impl<T: Send + Sync + 'static> PartialEq for Member<T> {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl<T: Send + Sync + 'static> Eq for Member<T> {}

/// Hashes exactly as the key does, as `Borrow<Key>` requires.
impl<T: Send + Sync + 'static> Hash for Member<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl<T: Send + Sync + 'static> Borrow<Key> for Member<T> {
    fn borrow(&self) -> &Key {
        self.key()
    }
}

/// One named index: value → the slots (each with its key) of the objects that have it.
struct Index<T: Send + Sync + 'static> {
    name: String,
    func: IndexFunc<T>,
    map: DashMap<Key, Members<T>, BuildKeyHasher>,
}

/// Everything a reader needs, swapped as a whole by `replace` and `add_indexers`.
struct State<T: Send + Sync + 'static> {
    items: DashMap<Key, ItemSlot<T>, BuildKeyHasher>,
    /// Where each items shard's table is, for the consumer's first prefetch step, which then
    /// takes no shard lock (two read-modify-writes fewer a key): recorded at every insert of
    /// a new key (the only writes that move a table) and wherever a state is built.
    items_tables: Box<[prefetch::TableHint]>,
    /// Unique names, in the order of every [`ValuesPerIndex`].
    indexes: Vec<Arc<Index<T>>>,
}

/// What the items map holds per key: its slot. Named here, with the map, so that the write
/// proofs of [`writable`] (which [`slot`] takes) name the map's entries through the state they
/// belong to.
type ItemSlot<T> = SlotRef<T>;

/// An entry of an items shard's table, as dashmap lays it out.
type ItemsEntry<T> = (Key, dashmap::SharedValue<SlotRef<T>>);

/// A concurrent, indexed key → object store with client-go's `Indexer` contract.
///
/// Readers never wait for a global lock, writers of different keys rarely meet, and
/// [`replace`](Store::replace) swaps in a new content without stopping readers. Besides the
/// `Arc` API of [`Store`] and [`Indexer`](store::Indexer), [`pin`](Self::pin) gives
/// [borrowed reads](ReadGuard) that take no reference count per object.
///
/// `T: Send + Sync + 'static` because a replaced object is released later, possibly by another
/// thread (epoch reclamation: see [`ReadGuard`]).
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
///   at some moment during the call (at the moment its value's set was read). An object that
///   gained `v` during the call may be missing from the result, as if the call had run a moment
///   earlier; so may an object whose write moving it to `v` is still in progress.
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
/// The same holds for the reads of a [`ReadGuard`].
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
/// // The same without a reference count per object: borrowed while the guard lives.
/// let guard = pods.pin();
/// for pod in guard.by_index("node", "n1").unwrap() {
///     assert_eq!(pod.node, "n1");
/// }
/// drop(guard);
/// writer.join().unwrap();
/// assert_eq!(pods.index_keys("node", "n2").unwrap(), [Key::new("ns/a")]);
/// assert!(pods.index_keys("node", "n1").unwrap().is_empty());
/// ```
pub struct IndexedStore<T: Send + Sync + 'static> {
    key_fn: KeyFn<T>,
    /// The current content: paths pinned to the epoch anyway (every write, every borrowed
    /// read, the consumer's prefetches) read it with one load. Its writers' lock: writers
    /// hold it shared for the whole write; `replace` and `add_indexers` hold it exclusive
    /// around the swap, so no write lands in a state that is being discarded. Readers never
    /// touch it.
    state: Published<State<T>>,
}

/// Borrowed reads of a [`sharded::IndexedStore`](IndexedStore), from [`IndexedStore::pin`].
///
/// Each read sees the store's content at the time of the read (the promises of
/// [`IndexedStore`] hold for each, as for the `Arc` API) and hands out `&T` that stay valid
/// while the guard lives, even if a writer replaces or removes the object meanwhile: the
/// guard pins the thread to an epoch, and objects replaced after the pin are released only
/// once it unpins. No read takes a reference count of an object.
///
/// While a guard lives, no object replaced since it was pinned is released, on any thread:
/// hold it for a batch of reads, not for ever. It cannot leave its thread.
///
/// ```
/// use std::sync::Arc;
/// use kcache::{sharded, IndexFunc, Key, KeyFn, Store as _};
///
/// let key_fn: KeyFn<(u32, &str)> = Arc::new(|p: &(u32, &str)| Ok(Key::new(&p.0.to_string())));
/// let by_node: IndexFunc<(u32, &str)> = Arc::new(|p: &(u32, &str)| [Key::new(p.1)].into_iter().collect());
/// let pods = sharded::IndexedStore::new(key_fn, vec![("node".to_string(), by_node)]);
/// pods.add(Arc::new((1, "n1"))).unwrap();
///
/// let guard = pods.pin();
/// let before = guard.get_by_key(&Key::new("1")).unwrap();
/// pods.update(Arc::new((1, "n2"))).unwrap();
/// // The old object is still readable: it is released only after the guard is dropped.
/// assert_eq!(before.1, "n1");
/// // Every read sees the current content.
/// assert_eq!(guard.get_by_key(&Key::new("1")).unwrap().1, "n2");
/// assert_eq!(guard.by_index("node", "n2").unwrap().len(), 1);
/// ```
pub struct ReadGuard<'s, T: Send + Sync + 'static> {
    store: &'s IndexedStore<T>,
    epoch: Pinned,
}

fn new_map<V>(capacity: usize) -> DashMap<Key, V, BuildKeyHasher> {
    DashMap::with_capacity_and_hasher_and_shard_amount(capacity, BuildKeyHasher::default(), SHARDS)
}

impl<T: Send + Sync + 'static> Index<T> {
    fn new(name: String, func: IndexFunc<T>) -> Self {
        Self {
            name,
            func,
            map: new_map(0),
        }
    }

    /// Adds the key of `slot` (the slot carries it) to the set of `value`.
    fn add(&self, value: &Key, slot: &SlotRef<T>) {
        // Most values already have a set: update it without cloning the value.
        // The sets of many values fill in lockstep (an initial list walks them round-robin):
        // `Growing::ahead` keeps them from all doubling within a few inserts of each other.
        if let Some(mut set) = self.map.get_mut(value) {
            set.ahead(value.hash_value());
            // `replace`, not `insert`: a member already there gives way to this slot, as a
            // map entry would be overwritten.
            set.replace(Member(SlotRef::clone(slot)));
            return;
        }
        self.map
            .entry(value.clone())
            .or_default()
            .replace(Member(SlotRef::clone(slot)));
    }

    /// Removes `key` from the set of `value`, and the set with it once empty, in one shard
    /// critical section so that no reader ever sees the empty set.
    fn remove(&self, key: &Key, value: &Key) {
        self.map.remove_if_mut(value, |_, set| {
            set.remove(key);
            set.is_empty()
        });
    }

    /// The keys of `value`'s set at one moment (the shard lock is released on return).
    fn keys(&self, value: &Key) -> Vec<Key> {
        self.map
            .get(value)
            .map(|set| set.iter().map(|member| member.key().clone()).collect())
            .unwrap_or_default()
    }

    /// `read` of the object of every key in `value`'s set, all read under the set's shard lock:
    /// each of them has `value` at that moment (see the module docs for why).
    fn objects<'g, R>(
        &self,
        value: &Key,
        guard: &'g Pinned,
        read: impl Fn(&Slot<T>, &'g Pinned) -> R,
    ) -> Vec<R> {
        self.map
            .get(value)
            .map(|set| set.iter().map(|member| read(&member.0, guard)).collect())
            .unwrap_or_default()
    }

    /// Like [`objects`](Self::objects) for several values, each object once.
    fn objects_of_any<'g, R>(
        &self,
        values: &[Key],
        guard: &'g Pinned,
        read: impl Fn(&Slot<T>, &'g Pinned) -> R,
    ) -> Vec<R> {
        match values {
            [one] => self.objects(one, guard, read),
            many => {
                let mut union = KeyMap::default();
                for value in many {
                    if let Some(set) = self.map.get(value) {
                        for member in set.iter() {
                            union
                                .entry(member.key().clone())
                                .or_insert_with(|| read(&member.0, guard));
                        }
                    }
                }
                union.into_values().collect()
            }
        }
    }
}

impl<T: Send + Sync + 'static> State<T> {
    fn empty(indexes: Vec<Arc<Index<T>>>, capacity: usize) -> Self {
        let state = Self {
            items: new_map(capacity),
            items_tables: (0..SHARDS)
                .map(|_| prefetch::TableHint::default())
                .collect(),
            indexes,
        };
        state.record_items_tables();
        state
    }

    /// Records where every items shard's table is (for a state built without
    /// [`Writable`]'s insert).
    fn record_items_tables(&self) {
        for (shard, hint) in self.items.shards().iter().zip(&self.items_tables) {
            hint.publish(&shard.read());
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

    /// Asks for what a write of `key` will read, one step of [`KnownObjects::prefetch`]: the
    /// items-map bucket, then the slot it points to, then the object the slot holds (whose
    /// index values the write reads, and which it replaces). Each step tries the key's items
    /// shard read lock, as a reader would, and skips the hint rather than wait when a writer
    /// holds it; it reads what the step before fetched (and, for a key stored as another
    /// allocation of the same name, that name's bytes).
    fn prefetch(&self, key: &Key, step: PrefetchStep) {
        let slot = match step {
            PrefetchStep::Table => {
                let hash = key.hash_value();
                // The shard dashmap picks for this key (its hasher passes the key's hash
                // through), and where in that shard's table the key's probe starts, from
                // where the table was last recorded: no lock.
                let shard = self.items.determine_shard(hash as usize);
                self.items_tables[shard].bucket::<ItemsEntry<T>>(hash);
                return;
            }
            PrefetchStep::Entry | PrefetchStep::Object => match self.items.try_get(key) {
                TryResult::Present(slot) => slot,
                TryResult::Absent | TryResult::Locked => return,
            },
        };
        if step == PrefetchStep::Entry {
            prefetch::value(SlotRef::as_ptr(&slot));
        } else {
            slot.prefetch_object();
        }
    }

    /// Doubles items shard `shard` now if it is at its staggered fill (see [`grow`]): the 64
    /// shards fill evenly, and would otherwise all double within a few thousand inserts, the
    /// whole items map rehashed in one burst. Called after an insert of a new key, with no
    /// shard lock held; records where the table is now (that insert, or this, may have moved
    /// it).
    fn grow_items_shard(&self, shard: usize) {
        let mut table = self.items.shards()[shard].write();
        let full = grow::capacity_of_buckets(table.buckets());
        if grow::due(table.len(), table.capacity(), full, shard as u64) {
            let additional = table.capacity() - table.len() + 1;
            // The shard's hasher is the key's precomputed hash (BuildKeyHasher).
            table.reserve(additional, |(key, _)| key.hash_value());
        }
        self.items_tables[shard].publish(&table);
    }

    /// Removes `key` and un-indexes it while holding its items shard. Its values (user code)
    /// are computed before anything changes, so a panic leaves items and indices as they were.
    fn remove(&self, key: &Key, guard: &Pinned) -> Option<Arc<T>> {
        let (_, slot) = self.items.remove_if_mut(key, |key, slot| {
            let values = self.values_of(slot.load(guard));
            for (index, values) in self.indexes.iter().zip(&values) {
                for value in values {
                    index.remove(key, value);
                }
            }
            true
        })?;
        // The last reference to the slot: dropping it hands its object to the epoch.
        Some(slot.load_arc(guard))
    }

    /// `read` of the object of `key`, under its items-shard lock.
    fn object<'g, R>(
        &self,
        key: &Key,
        guard: &'g Pinned,
        read: impl FnOnce(&Slot<T>, &'g Pinned) -> R,
    ) -> Option<R> {
        self.items.get(key).map(|slot| read(&slot, guard))
    }

    /// `read` of every stored object, one items shard after the other.
    fn all_objects<'g, R>(
        &self,
        guard: &'g Pinned,
        read: impl Fn(&Slot<T>, &'g Pinned) -> R,
    ) -> Vec<R> {
        let mut objects = Vec::with_capacity(self.items.len());
        objects.extend(self.items.iter().map(|entry| read(entry.value(), guard)));
        objects
    }
}

impl<T: Send + Sync + 'static> IndexedStore<T> {
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
            state: Published::new(State::empty(indexes, 0)),
        }
    }

    /// Pins this thread for borrowed reads: see [`ReadGuard`].
    pub fn pin(&self) -> ReadGuard<'_, T> {
        ReadGuard {
            store: self,
            epoch: Pinned::pin(),
        }
    }
}

impl<'s, T: Send + Sync + 'static> ReadGuard<'s, T> {
    /// The object stored under `key`, if any.
    pub fn get_by_key(&self, key: &Key) -> Option<&T> {
        self.store
            .state
            .pinned(&self.epoch)
            .object(key, &self.epoch, Slot::load)
    }

    /// The stored state of `obj`'s key.
    pub fn get(&self, obj: &T) -> Result<Option<&T>, KeyError> {
        let key = (self.store.key_fn)(obj)?;
        Ok(self.get_by_key(&key))
    }

    /// The objects whose `name` index values include `value` (see
    /// [`Indexer::by_index`](store::Indexer::by_index)).
    pub fn by_index(&self, name: &str, value: &str) -> Result<Vec<&T>, IndexError> {
        let state = self.store.state.pinned(&self.epoch);
        let (_, index) = state.index(name)?;
        Ok(index.objects(&Key::new(value), &self.epoch, Slot::load))
    }

    /// The objects that share at least one `name` index value with `obj` (see
    /// [`Indexer::index`](store::Indexer::index)).
    pub fn index(&self, name: &str, obj: &T) -> Result<Vec<&T>, IndexError> {
        let state = self.store.state.pinned(&self.epoch);
        let (_, index) = state.index(name)?;
        let values = (index.func)(obj);
        Ok(index.objects_of_any(&values, &self.epoch, Slot::load))
    }

    /// Every stored object.
    pub fn list(&self) -> Vec<&T> {
        self.store
            .state
            .pinned(&self.epoch)
            .all_objects(&self.epoch, Slot::load)
    }

    /// Unpins and pins again, so that objects replaced since the pin can be released; the
    /// `&mut` guarantees nothing borrowed from the guard is still in use.
    pub fn repin(&mut self) {
        self.epoch.repin();
    }
}

impl<T: Send + Sync + 'static> KnownObjects<T> for IndexedStore<T> {
    fn list_keys(&self) -> Vec<Key> {
        let state = self.state.load();
        let mut keys = Vec::with_capacity(state.items.len());
        keys.extend(state.items.iter().map(|entry| entry.key().clone()));
        keys
    }

    fn get_by_key(&self, key: &Key) -> Option<Arc<T>> {
        let guard = Pinned::pin();
        self.state
            .pinned(&guard)
            .object(key, &guard, Slot::load_arc)
    }

    fn prefetch(&self, key: &Key, step: PrefetchStep) {
        self.prefetch_steps(&[(key, step)]);
    }

    /// One pin and one load of the current state for all of `steps`.
    fn prefetch_steps(&self, steps: &[(&Key, PrefetchStep)]) {
        let guard = Pinned::pin();
        let state = self.state.pinned(&guard);
        for &(key, step) in steps {
            state.prefetch(key, step);
        }
    }

    /// One items shard after the other, like `list_keys`.
    fn visit_keys(&self, visit: &mut dyn FnMut(&Key)) {
        for entry in self.state.load().items.iter() {
            visit(entry.key());
        }
    }

    /// One items shard after the other, like `list`; each object is lent to `visit` without a
    /// reference count (and one pin for the whole walk). `visit` runs under the read locks of
    /// the entry's shard and of the shard of the entries looked at ahead (below), which never
    /// make a reader wait for a waiting writer (dashmap's lock lets readers in unless a writer
    /// holds it), so a `visit` that reads this store cannot deadlock.
    ///
    /// The walk reads the items tables in order, which the CPU streams; each entry's slot and
    /// the object in it are two misses found one through the other, so the walk asks for the
    /// slots `WALK_SLOT_AHEAD` (8) entries ahead and their objects `WALK_OBJECT_AHEAD` (4) ahead
    /// (a resync keys every object it visits).
    fn visit_objects(&self, visit: &mut dyn FnMut(&Key, &Arc<T>)) {
        let guard = Pinned::pin();
        let state = self.state.pinned(&guard);
        let mut entries = state.items.iter();
        // The entries between the one visited and the farthest asked for, in walk order.
        let mut ahead = VecDeque::with_capacity(WALK_SLOT_AHEAD + 1);
        loop {
            while ahead.len() <= WALK_SLOT_AHEAD {
                let Some(entry) = entries.next() else { break };
                prefetch::value(SlotRef::as_ptr(entry.value()));
                ahead.push_back(entry);
            }
            let Some(entry) = ahead.pop_front() else {
                break;
            };
            if let Some(next) = ahead.get(WALK_OBJECT_AHEAD - 1) {
                next.value().prefetch_object();
            }
            entry
                .value()
                .with_arc(&guard, |obj| visit(entry.key(), obj));
        }
    }
}

impl<T: Send + Sync + 'static> Store<T> for IndexedStore<T> {
    fn key_of(&self, obj: &T) -> Result<Key, KeyError> {
        (self.key_fn)(obj)
    }

    fn insert_by_key(&self, key: Key, obj: Arc<T>) -> Option<Arc<T>> {
        let writer = self.state.shared();
        let guard = Pinned::pin();
        Writable::current(&writer, &guard).insert(key, obj, &guard)
    }

    fn remove_by_key(&self, key: &Key) -> Option<Arc<T>> {
        let writer = self.state.shared();
        let guard = Pinned::pin();
        // Replaces no slot's object (the slot leaves the maps and is dropped whole): the
        // shared hold only keeps the write out of a state being replaced.
        writer.pinned(&guard).remove(key, &guard)
    }

    /// Builds the new content aside (keys first: a key error changes nothing), then swaps it
    /// in. Readers keep reading the old content until the swap; writers wait only for the
    /// swap. When `list` holds a key twice, the later object wins.
    fn replace(&self, list: Vec<Arc<T>>) -> Result<(), KeyError> {
        let mut keyed = Vec::with_capacity(list.len());
        for obj in list {
            keyed.push(((self.key_fn)(&obj)?, obj));
        }
        let guard = Pinned::pin();
        // Build with no lock held; only a concurrent add_indexers (rare) forces a rebuild.
        let seen = self.state.load_full();
        let mut fresh = rebuilt(&seen, keyed, &guard);
        let mut exclusive = self.state.exclusive();
        let current = exclusive.load_full();
        if !same_index_functions(&seen, &current) {
            let entries = fresh.all_objects_keyed(&guard);
            fresh = rebuilt(&current, entries, &guard);
        }
        let old = exclusive.publish(Arc::new(fresh), &guard);
        drop(exclusive);
        // The old content may be large: free it outside the lock (or let the last reader, or
        // the epoch's release on a thread of its own, free it: see `published::Exclusive::publish`).
        drop((old, current, seen));
        Ok(())
    }

    fn list(&self) -> Vec<Arc<T>> {
        let guard = Pinned::pin();
        self.state.load().all_objects(&guard, Slot::load_arc)
    }

    fn len(&self) -> usize {
        self.state.load().items.len()
    }
}

impl<T: Send + Sync + 'static> State<T> {
    /// Every (key, object), for rebuilding a state no reader has seen.
    fn all_objects_keyed(&self, guard: &Pinned) -> Vec<(Key, Arc<T>)> {
        self.items
            .iter()
            .map(|entry| (entry.key().clone(), entry.value().load_arc(guard)))
            .collect()
    }
}

/// A state holding `entries` (a later repeat of a key wins), indexed like `like`.
fn rebuilt<T: Send + Sync + 'static>(
    like: &State<T>,
    entries: impl IntoIterator<Item = (Key, Arc<T>)>,
    guard: &Pinned,
) -> State<T> {
    let indexes = like
        .indexes
        .iter()
        .map(|index| Arc::new(Index::new(index.name.clone(), Arc::clone(&index.func))))
        .collect();
    let entries = entries.into_iter();
    let mut fresh = Fresh::new(indexes, entries.size_hint().0);
    for (key, obj) in entries {
        fresh.writable().insert(key, obj, guard);
    }
    fresh.into_state()
}

/// Whether two states index with the same functions under the same names, in the same order.
fn same_index_functions<T: Send + Sync + 'static>(a: &State<T>, b: &State<T>) -> bool {
    a.indexes.len() == b.indexes.len()
        && a.indexes
            .iter()
            .zip(&b.indexes)
            .all(|(x, y)| x.name == y.name && Arc::ptr_eq(&x.func, &y.func))
}

impl<T: Send + Sync + 'static> store::Indexer<T> for IndexedStore<T> {
    /// The objects that share any of `obj`'s `name` values, each read under the shard lock of
    /// a value it has, like [`by_index`](store::Indexer::by_index).
    fn index(&self, name: &str, obj: &T) -> Result<Vec<Arc<T>>, IndexError> {
        let guard = Pinned::pin();
        let state = self.state.pinned(&guard);
        let (_, index) = state.index(name)?;
        let values = (index.func)(obj);
        Ok(index.objects_of_any(&values, &guard, Slot::load_arc))
    }

    fn index_keys(&self, name: &str, value: &str) -> Result<Vec<Key>, IndexError> {
        let state = self.state.load();
        let (_, index) = state.index(name)?;
        Ok(index.keys(&Key::new(value)))
    }

    fn by_index(&self, name: &str, value: &str) -> Result<Vec<Arc<T>>, IndexError> {
        let guard = Pinned::pin();
        let state = self.state.pinned(&guard);
        let (_, index) = state.index(name)?;
        Ok(index.objects(&Key::new(value), &guard, Slot::load_arc))
    }

    fn list_index_func_values(&self, name: &str) -> Result<Vec<Key>, IndexError> {
        let state = self.state.load();
        let (_, index) = state.index(name)?;
        Ok(index.map.iter().map(|entry| entry.key().clone()).collect())
    }

    /// Refused as a whole when a name is taken (or given twice). Otherwise, with writers held
    /// off, the new indexes are built over the current items, and a state holding the same
    /// slots, the old indexes (shared, untouched) and the new ones is swapped in.
    fn add_indexers(&self, indexers: Indexers<T>) -> Result<(), IndexError> {
        let mut exclusive = self.state.exclusive();
        let current = exclusive.load_full();
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
        let guard = Pinned::pin();
        for entry in current.items.iter() {
            let obj = entry.value().load(&guard);
            for index in &added {
                for value in &(index.func)(obj) {
                    index.add(value, entry.value());
                }
            }
            next.items
                .insert(entry.key().clone(), SlotRef::clone(entry.value()));
        }
        next.record_items_tables();
        // `next` shares the current state's slots: it is published under the same exclusive
        // hold, so from here on writers reach those slots through `next` alone.
        let old = exclusive.publish(Arc::new(next), &guard);
        drop(exclusive);
        drop((old, current));
        Ok(())
    }
}

impl<T: Send + Sync + 'static> fmt::Debug for ReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("sharded::ReadGuard")
            .field("store", self.store)
            .finish_non_exhaustive()
    }
}

impl<T: Send + Sync + 'static> fmt::Debug for IndexedStore<T> {
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

    /// The hint the `Table` prefetch step reads instead of the shard lock points at each items
    /// shard's current table after the tables grew, after `replace` and after `add_indexers`
    /// (a stale hint would be harmless, but would make every such prefetch useless).
    #[test]
    fn the_items_table_hints_follow_the_tables() {
        let idx = indexer();
        let assert_hints_current = |when: &str| {
            let state = idx.state.load();
            for (shard, hint) in state.items.shards().iter().zip(&state.items_tables) {
                // Built without prefetches (`--cfg kcache_no_prefetch`), nothing is recorded.
                assert_eq!(hint.records(&shard.read()), prefetch::ENABLED, "{when}");
            }
        };
        // The test objects' keys are static strings.
        let named = |i: usize, v: u32| obj(Box::leak(format!("k{i}").into_boxed_str()), v);
        assert_hints_current("empty");
        for i in 0..5_000 {
            idx.add(named(i, 1)).unwrap();
        }
        assert_hints_current("after 5,000 adds");
        idx.replace((0..300).map(|i| named(i, 2)).collect())
            .unwrap();
        assert_hints_current("after replace");
        idx.add_indexers(vec![("again".into(), by_v())]).unwrap();
        assert_hints_current("after add_indexers");
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

    /// Every key in every set of the current state holds, in its slot, an object that has the
    /// set's value, and the slot is the one the items map holds for the key: what `by_index`
    /// relies on instead of re-checking each object.
    fn assert_sets_name_matching_slots(idx: &IndexedStore<Obj>) {
        let state = idx.state.load();
        let guard = Pinned::pin();
        for index in &state.indexes {
            for entry in index.map.iter() {
                for member in entry.value().iter() {
                    let (key, slot) = (member.key(), &member.0);
                    let obj = slot.load(&guard);
                    assert!(
                        (index.func)(obj).contains(entry.key()),
                        "{key:?} in {:?}",
                        entry.key()
                    );
                    let item = state.items.get(key).expect("an indexed key is stored");
                    assert!(
                        SlotRef::ptr_eq(&item, slot),
                        "{key:?}: the set's slot is the item's"
                    );
                }
            }
        }
    }

    #[test]
    fn sets_name_the_slots_of_objects_with_their_value_after_every_write() {
        let idx = IndexedStore::new(key_fn(), Vec::new());
        idx.add(obj("p1", 1)).unwrap();
        idx.add(obj("p2", 2)).unwrap();
        idx.add_indexers(vec![("v".into(), by_v())]).unwrap();
        assert_sets_name_matching_slots(&idx);
        idx.update(obj("p1", 2)).unwrap(); // moves p1
        idx.update(obj("p2", 2)).unwrap(); // same value: no index touched
        assert_sets_name_matching_slots(&idx);
        idx.delete(&obj("p2", 2)).unwrap();
        assert_sets_name_matching_slots(&idx);
        idx.replace(vec![obj("p3", 3), obj("p4", 3)]).unwrap();
        assert_sets_name_matching_slots(&idx);
        idx.update(obj("p4", 4)).unwrap();
        assert_sets_name_matching_slots(&idx);
        // Deleted and added again: a new slot, which the sets must name instead of the old.
        idx.delete(&obj("p3", 3)).unwrap();
        idx.add(obj("p3", 3)).unwrap();
        assert_sets_name_matching_slots(&idx);
    }

    #[test]
    fn an_unchanged_update_keeps_the_slot_and_its_sets() {
        let idx = indexer();
        idx.add(obj("p1", 1)).unwrap();
        let before = SlotRef::clone(&idx.state.load().items.get(&Key::new("p1")).unwrap());
        idx.update(obj("p1", 1)).unwrap();
        let state = idx.state.load();
        let after = state.items.get(&Key::new("p1")).unwrap();
        assert!(
            SlotRef::ptr_eq(&before, &after),
            "the object was replaced in place"
        );
        let guard = Pinned::pin();
        assert!(std::ptr::eq(
            before.load(&guard),
            &*idx.get_by_key(&Key::new("p1")).unwrap()
        ));
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
