//! The store contracts: [`KnownObjects`] (what a queue may ask of the consumer's store),
//! [`Store`] (a key → object map) and [`Indexer`] (a store with named secondary indexes).

use std::sync::Arc;

use smallvec::SmallVec;
use thiserror::Error;

use crate::key::{Key, KeyError};

/// A read-only view of the consumer's store, as a queue sees it (client-go's `KeyListerGetter`).
///
/// Every [`Store`] is one. A queue calls these methods while holding its own locks (so it sees
/// itself and the store at one moment, as client-go does): they must not call back into the
/// queue. A panic in them propagates to the queue's caller and changes nothing in the queue.
/// The queue is only right about what exists if the consumer applies every popped list to this
/// store: see [`DeltaQueue`](crate::DeltaQueue)'s *consumer's obligation*.
pub trait KnownObjects<T>: Send + Sync {
    /// Every key in the store.
    fn list_keys(&self) -> Vec<Key>;
    /// The object stored under `key`, if any.
    fn get_by_key(&self, key: &Key) -> Option<Arc<T>>;

    /// Calls `visit` with every key in the store: what [`list_keys`](Self::list_keys) returns,
    /// without building the list. The sharded queue's `replace` walks the store with it.
    ///
    /// `visit` is the queue's own code and never calls back into the store, so an
    /// implementation may call it while holding its own locks. The default walks `list_keys`.
    fn visit_keys(&self, visit: &mut dyn FnMut(&Key)) {
        for key in self.list_keys() {
            visit(&key);
        }
    }

    /// Calls `visit` with every key in the store and the object stored under it: what
    /// `list_keys` and a `get_by_key` of each would give, without a lookup per key. The sharded
    /// queue's `resync` walks the store with it, and keys each object inside `visit` (while the
    /// walk has it in cache).
    ///
    /// So `visit` runs the queue's key function, which may read this store (never write it):
    /// an implementation may call `visit` while holding a lock of its own only if that lock
    /// never makes a reader wait for a waiting writer. The default walks `list_keys` and calls
    /// `get_by_key` for each key (skipping keys gone meanwhile), holding nothing while it
    /// visits: a store that can walk its content directly should say so here.
    fn visit_objects(&self, visit: &mut dyn FnMut(&Key, &Arc<T>)) {
        for key in self.list_keys() {
            if let Some(obj) = self.get_by_key(&key) {
                visit(&key, &obj);
            }
        }
    }

    /// A hint that `key` is about to be written: ask the CPU for the memory that write will
    /// read, one dependent step per call (see [`PrefetchStep`]). It should not wait for
    /// anything (skip the hint rather than wait for a lock), must not change anything a reader
    /// can see, and must not call back into the queue. The default does nothing. A panic in it
    /// propagates to the consumer that popped the batch, like one in `process`, and loses no
    /// key.
    ///
    /// The sharded queue calls it for the keys of a batch ahead of the one being processed,
    /// each step a few keys before the next, so that the misses of a large store overlap the
    /// consumer's work instead of following one another.
    fn prefetch(&self, _key: &Key, _step: PrefetchStep) {}

    /// Several [`prefetch`](Self::prefetch) hints in one call, in order, under the same rules.
    /// A store whose hints share a setup cost (the sharded indexer pins the epoch and loads
    /// its current tables) pays it once; the sharded queue asks this way. The default calls
    /// `prefetch` for each.
    fn prefetch_steps(&self, steps: &[(&Key, PrefetchStep)]) {
        for &(key, step) in steps {
            self.prefetch(key, step);
        }
    }
}

/// How far a [`KnownObjects::prefetch`] call reaches. Each step reads what the previous one
/// asked for, so a caller issues them in this order, some work apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchStep {
    /// The lines where the key's entry sits in the store's table: found from the key's hash
    /// alone, with no read of the table's contents.
    Table,
    /// The entry's own record, found through the table.
    Entry,
    /// The object the entry holds: what the write will replace and read index values from.
    Object,
}

/// The values an index function gives one object. Most objects have exactly one.
pub type IndexValues = SmallVec<[Key; 1]>;

/// A named index function (client-go's `IndexFunc`): the values under which an object is found.
pub type IndexFunc<T> = Arc<dyn Fn(&T) -> IndexValues + Send + Sync>;

/// Index functions by name (client-go's `Indexers`).
pub type Indexers<T> = Vec<(String, IndexFunc<T>)>;

/// An index operation was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IndexError {
    /// No index has this name.
    #[error("index with name {0:?} does not exist")]
    UnknownIndex(String),
    /// `add_indexers` was given a name that already exists.
    #[error("indexer conflict: an index named {0:?} already exists")]
    Conflict(String),
    /// The key function failed for an object.
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// A thread-safe key → object store (client-go's `Store` over a `ThreadSafeStore`).
///
/// Objects are keyed by the store's key function; the `*_by_key` forms take the key directly,
/// which is what a consumer holding popped [`Deltas`](crate::Deltas) has.
pub trait Store<T>: KnownObjects<T> {
    /// The key the store gives `obj`.
    fn key_of(&self, obj: &T) -> Result<Key, KeyError>;

    /// Stores `obj` under `key` and re-indexes it; returns what `key` held before.
    fn insert_by_key(&self, key: Key, obj: Arc<T>) -> Option<Arc<T>>;

    /// Removes `key` and un-indexes it; returns what it held.
    fn remove_by_key(&self, key: &Key) -> Option<Arc<T>>;

    /// Replaces the whole content with `list` and rebuilds every index.
    fn replace(&self, list: Vec<Arc<T>>) -> Result<(), KeyError>;

    /// Every stored object.
    fn list(&self) -> Vec<Arc<T>>;

    /// How many objects are stored.
    fn len(&self) -> usize;

    /// Stores a new object.
    fn add(&self, obj: Arc<T>) -> Result<(), KeyError> {
        let key = self.key_of(&obj)?;
        self.insert_by_key(key, obj);
        Ok(())
    }

    /// Stores a new state of an object.
    fn update(&self, obj: Arc<T>) -> Result<(), KeyError> {
        self.add(obj)
    }

    /// Removes an object.
    fn delete(&self, obj: &T) -> Result<(), KeyError> {
        let key = self.key_of(obj)?;
        self.remove_by_key(&key);
        Ok(())
    }

    /// The stored state of `obj`'s key.
    fn get(&self, obj: &T) -> Result<Option<Arc<T>>, KeyError> {
        let key = self.key_of(obj)?;
        Ok(self.get_by_key(&key))
    }

    /// Whether nothing is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A [`Store`] with named secondary indexes (client-go's `Indexer`), implemented by
/// [`reference::IndexedStore`](crate::reference::IndexedStore) and
/// [`sharded::IndexedStore`](crate::sharded::IndexedStore).
pub trait Indexer<T>: Store<T> {
    /// The objects that share at least one `name` index value with `obj`.
    fn index(&self, name: &str, obj: &T) -> Result<Vec<Arc<T>>, IndexError>;

    /// The keys of the objects whose `name` index values include `value`.
    fn index_keys(&self, name: &str, value: &str) -> Result<Vec<Key>, IndexError>;

    /// The objects whose `name` index values include `value`.
    fn by_index(&self, name: &str, value: &str) -> Result<Vec<Arc<T>>, IndexError>;

    /// Every value of the `name` index that at least one object has.
    fn list_index_func_values(&self, name: &str) -> Result<Vec<Key>, IndexError>;

    /// Adds index functions; existing objects are indexed by them at once.
    fn add_indexers(&self, indexers: Indexers<T>) -> Result<(), IndexError>;
}
