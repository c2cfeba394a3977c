//! Test fixtures shared by the engine's integration tests.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use kcache::{Key, KeyError, KeyMap, KnownObjects, QueueOptions, Store};

pub mod workqueue_stress;

/// The stress tests' size factor, from `KCACHE_STRESS_SCALE` (default 1, CI-sized): a long
/// soak is one variable away.
pub fn stress_scale() -> usize {
    std::env::var("KCACHE_STRESS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1)
}

/// A test object: a key and a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Obj {
    pub key: Key,
    pub v: u64,
}

pub fn obj(key: &str, v: u64) -> Arc<Obj> {
    Arc::new(Obj {
        key: Key::new(key),
        v,
    })
}

pub fn key_of(o: &Obj) -> Result<Key, KeyError> {
    if o.key.as_str().is_empty() {
        Err(KeyError::new("empty key"))
    } else {
        Ok(o.key.clone())
    }
}

pub fn options() -> QueueOptions<Obj> {
    QueueOptions::new(Arc::new(key_of))
}

/// A minimal thread-safe store, so these tests do not depend on either indexer.
#[derive(Debug, Default)]
pub struct MapStore(Mutex<KeyMap<Arc<Obj>>>);

impl MapStore {
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        let mut out: Vec<_> = self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(k, o)| (k.to_string(), o.v))
            .collect();
        out.sort();
        out
    }
}

impl KnownObjects<Obj> for MapStore {
    fn list_keys(&self) -> Vec<Key> {
        self.0.lock().unwrap().keys().cloned().collect()
    }
    fn get_by_key(&self, key: &Key) -> Option<Arc<Obj>> {
        self.0.lock().unwrap().get(key).cloned()
    }
}

impl Store<Obj> for MapStore {
    fn key_of(&self, obj: &Obj) -> Result<Key, KeyError> {
        key_of(obj)
    }
    fn insert_by_key(&self, key: Key, obj: Arc<Obj>) -> Option<Arc<Obj>> {
        self.0.lock().unwrap().insert(key, obj)
    }
    fn remove_by_key(&self, key: &Key) -> Option<Arc<Obj>> {
        self.0.lock().unwrap().remove(key)
    }
    fn replace(&self, list: Vec<Arc<Obj>>) -> Result<(), KeyError> {
        let mut map = KeyMap::default();
        for o in list {
            map.insert(key_of(&o)?, o);
        }
        *self.0.lock().unwrap() = map;
        Ok(())
    }
    fn list(&self) -> Vec<Arc<Obj>> {
        self.0.lock().unwrap().values().cloned().collect()
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// A delta as (type, tombstone?, version), for compact assertions.
pub fn summary(deltas: &kcache::Deltas<Obj>) -> Vec<(kcache::DeltaType, bool, Option<u64>)> {
    deltas
        .iter()
        .map(|d| {
            (
                d.kind,
                d.object.is_tombstone(),
                d.object.last_known().map(|o| o.v),
            )
        })
        .collect()
}

/// [`summary`] with each delta type by name, as the differential tests' output lines write it.
pub fn named_summary(deltas: &kcache::Deltas<Obj>) -> Vec<(String, bool, Option<u64>)> {
    summary(deltas)
        .into_iter()
        .map(|(kind, tombstone, v)| (kind.to_string(), tombstone, v))
        .collect()
}

/// An output line of a differential run that may be a pop of a key.
pub trait PopLine {
    fn popped_key(&self) -> Option<&str>;
}

/// Pop lines grouped by key, everything else in order: what a run on several shards must
/// agree with the reference on, as pops of different keys may come in another order.
pub fn grouped<L: PopLine>(lines: Vec<L>) -> (Vec<L>, std::collections::BTreeMap<String, Vec<L>>) {
    let mut other = Vec::new();
    let mut by_key: std::collections::BTreeMap<String, Vec<L>> = Default::default();
    for line in lines {
        match line.popped_key() {
            Some(key) => by_key.entry(key.to_owned()).or_default().push(line),
            None => other.push(line),
        }
    }
    (other, by_key)
}
