//! Read handles on a shared informer's store (client-go's `GetStore`/`GetIndexer`, read side
//! only: the informer is the store's one writer).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use super::applied::AppliedVersion;
use crate::key::{Key, KeyError};
use crate::store::{IndexError, Indexer};

/// A cheap, cloneable read handle on an informer's indexed store.
///
/// Reads go straight to the store: with the sharded [`IndexedStore`](crate::sharded::IndexedStore)
/// they never wait on a global lock, and see what its consistency section promises (a `get`
/// reflects every write to that key completed before it).
pub struct StoreReader<T, I> {
    store: Arc<I>,
    applied: AppliedVersion,
    _objects: PhantomData<fn() -> T>,
}

impl<T, I> Clone for StoreReader<T, I> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            applied: self.applied.clone(),
            _objects: PhantomData,
        }
    }
}

impl<T, I> fmt::Debug for StoreReader<T, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreReader").finish_non_exhaustive()
    }
}

impl<T, I: Indexer<T>> StoreReader<T, I> {
    pub(crate) fn new(store: Arc<I>, applied: AppliedVersion) -> Self {
        Self {
            store,
            applied,
            _objects: PhantomData,
        }
    }

    /// The newest resource version the store has applied (client-go 1.36's
    /// `LastStoreSyncResourceVersion`); see
    /// [`SharedInformer::last_store_sync_resource_version`](super::SharedInformer::last_store_sync_resource_version).
    pub fn last_store_sync_resource_version(&self) -> String {
        self.applied.get()
    }

    /// The applied version as a handle, to wait for a version.
    pub fn applied_version(&self) -> &AppliedVersion {
        &self.applied
    }

    /// The object stored under `key`.
    pub fn get_by_key(&self, key: &Key) -> Option<Arc<T>> {
        self.store.get_by_key(key)
    }

    /// The stored state of `obj`'s key.
    pub fn get(&self, obj: &T) -> Result<Option<Arc<T>>, KeyError> {
        self.store.get(obj)
    }

    /// Every stored object.
    pub fn list(&self) -> Vec<Arc<T>> {
        self.store.list()
    }

    /// Every stored key.
    pub fn list_keys(&self) -> Vec<Key> {
        self.store.list_keys()
    }

    /// How many objects are stored.
    pub fn len(&self) -> usize {
        self.store.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }

    /// The objects whose `name` index values include `value`.
    pub fn by_index(&self, name: &str, value: &str) -> Result<Vec<Arc<T>>, IndexError> {
        self.store.by_index(name, value)
    }

    /// The keys of the objects whose `name` index values include `value`.
    pub fn index_keys(&self, name: &str, value: &str) -> Result<Vec<Key>, IndexError> {
        self.store.index_keys(name, value)
    }

    /// The objects that share at least one `name` index value with `obj`.
    pub fn index(&self, name: &str, obj: &T) -> Result<Vec<Arc<T>>, IndexError> {
        self.store.index(name, obj)
    }

    /// Every value of the `name` index that at least one object has.
    pub fn list_index_func_values(&self, name: &str) -> Result<Vec<Key>, IndexError> {
        self.store.list_index_func_values(name)
    }
}
