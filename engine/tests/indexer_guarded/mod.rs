//! [`Guarded`]: the sharded indexer with its borrowed reads standing in for the `Arc` ones, so
//! that suites written against the `Indexer` trait check the guarded read path too.

use std::sync::Arc;

use kcache::{sharded, IndexError, Indexer, Indexers, Key, KeyError, KeyFn, KnownObjects, Store};

/// `get_by_key`, `get`, `by_index`, `index` and `list` are answered through
/// [`sharded::IndexedStore::pin`]; each borrowed object is copied into a fresh `Arc`, so compare
/// contents, not pointers. Writes and the reads without a borrowed form go straight through.
#[derive(Debug)]
pub struct Guarded<T: Send + Sync + 'static>(pub sharded::IndexedStore<T>);

impl<T: Clone + Send + Sync + 'static> Guarded<T> {
    /// Same signature as the engines' constructors.
    pub fn new(key_fn: KeyFn<T>, indexers: Indexers<T>) -> Self {
        Self(sharded::IndexedStore::new(key_fn, indexers))
    }
}

fn owned<T: Clone>(objs: Vec<&T>) -> Vec<Arc<T>> {
    objs.into_iter().map(|o| Arc::new(o.clone())).collect()
}

impl<T: Clone + Send + Sync + 'static> KnownObjects<T> for Guarded<T> {
    fn list_keys(&self) -> Vec<Key> {
        self.0.list_keys()
    }

    fn get_by_key(&self, key: &Key) -> Option<Arc<T>> {
        self.0.pin().get_by_key(key).map(|o| Arc::new(o.clone()))
    }
}

impl<T: Clone + Send + Sync + 'static> Store<T> for Guarded<T> {
    fn key_of(&self, obj: &T) -> Result<Key, KeyError> {
        self.0.key_of(obj)
    }

    fn insert_by_key(&self, key: Key, obj: Arc<T>) -> Option<Arc<T>> {
        self.0.insert_by_key(key, obj)
    }

    fn remove_by_key(&self, key: &Key) -> Option<Arc<T>> {
        self.0.remove_by_key(key)
    }

    fn replace(&self, list: Vec<Arc<T>>) -> Result<(), KeyError> {
        self.0.replace(list)
    }

    fn list(&self) -> Vec<Arc<T>> {
        owned(self.0.pin().list())
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn get(&self, obj: &T) -> Result<Option<Arc<T>>, KeyError> {
        Ok(self.0.pin().get(obj)?.map(|o| Arc::new(o.clone())))
    }
}

impl<T: Clone + Send + Sync + 'static> Indexer<T> for Guarded<T> {
    fn index(&self, name: &str, obj: &T) -> Result<Vec<Arc<T>>, IndexError> {
        self.0.pin().index(name, obj).map(owned)
    }

    fn index_keys(&self, name: &str, value: &str) -> Result<Vec<Key>, IndexError> {
        self.0.index_keys(name, value)
    }

    fn by_index(&self, name: &str, value: &str) -> Result<Vec<Arc<T>>, IndexError> {
        self.0.pin().by_index(name, value).map(owned)
    }

    fn list_index_func_values(&self, name: &str) -> Result<Vec<Key>, IndexError> {
        self.0.list_index_func_values(name)
    }

    fn add_indexers(&self, indexers: Indexers<T>) -> Result<(), IndexError> {
        self.0.add_indexers(indexers)
    }
}
