//! The object every workload moves, its key function and indexes, and the universe of keys.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use kcache::{IndexFunc, IndexValues, Indexers, Key, KeyFn};
use smallvec::smallvec;

/// How many namespaces the objects are spread over (`ns-{i % 1000}`).
pub const NAMESPACES: usize = 1000;
/// How many nodes the objects are spread over (`node-{i % 5000}`).
pub const NODES: usize = 5000;
/// The name of the namespace index.
pub const NAMESPACE_INDEX: &str = "namespace";
/// The name of the node index.
pub const NODE_INDEX: &str = "node";

/// The object every workload moves: a pod reduced to what the queue and the indexes need.
///
/// `id` is the dense number of its key in the [`Universe`]: a compact name for the key (see
/// [`Op::summary`](crate::Op::summary)) that needs no string comparison.
#[derive(Debug)]
pub struct Pod {
    /// Dense key number in the universe the pod was made in.
    pub id: u32,
    /// `namespace/name`.
    pub key: Key,
    /// The namespace, indexed by [`NAMESPACE_INDEX`].
    pub namespace: Key,
    /// The node the pod runs on, indexed by [`NODE_INDEX`]; `None` while unscheduled.
    pub node: Option<Key>,
    /// Increases with every change of this key.
    pub version: u64,
    /// Nanoseconds since the run started, set by the producer just before it enqueues a
    /// sampled event; 0 when the event is not sampled.
    pub enqueued_ns: AtomicU64,
    /// Set by the consumer that receives this object in an `Added`/`Updated`/`Deleted` delta:
    /// each event object is enqueued once, so finding it set means a delta was delivered twice.
    /// It lives in the object, on a cache line the consumer reads anyway.
    pub delivered: AtomicBool,
}

impl Pod {
    /// A pod with no latency stamp.
    pub fn new(id: u32, key: Key, namespace: Key, node: Option<Key>, version: u64) -> Self {
        Self {
            id,
            key,
            namespace,
            node,
            version,
            enqueued_ns: AtomicU64::new(0),
            delivered: AtomicBool::new(false),
        }
    }

    /// The same state of the same key as a fresh, unstamped allocation.
    pub fn fresh_copy(&self) -> Arc<Pod> {
        Arc::new(Pod::new(
            self.id,
            self.key.clone(),
            self.namespace.clone(),
            self.node.clone(),
            self.version,
        ))
    }

    /// The latency stamp, if the producer sampled this object.
    pub fn stamp(&self) -> Option<u64> {
        match self.enqueued_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(ns),
        }
    }
}

/// The key function of every loadgen queue and store: the precomputed key, cloned.
pub fn pod_key_fn() -> KeyFn<Pod> {
    Arc::new(|pod: &Pod| Ok(pod.key.clone()))
}

/// The `namespace` and `node` indexes, returning the precomputed keys.
pub fn pod_indexers() -> Indexers<Pod> {
    let by_namespace: IndexFunc<Pod> =
        Arc::new(|pod: &Pod| -> IndexValues { smallvec![pod.namespace.clone()] });
    let by_node: IndexFunc<Pod> =
        Arc::new(|pod: &Pod| -> IndexValues { pod.node.iter().cloned().collect() });
    vec![
        (NAMESPACE_INDEX.to_string(), by_namespace),
        (NODE_INDEX.to_string(), by_node),
    ]
}

/// Every key a workload can touch, made once: pod keys by id, and the namespace and node keys.
#[derive(Debug, Clone, Default)]
pub struct Universe {
    /// Pod keys, indexed by [`Pod::id`].
    pub keys: Vec<Key>,
    /// Every namespace value.
    pub namespaces: Vec<Key>,
    /// Every node value.
    pub nodes: Vec<Key>,
}

impl Universe {
    /// The workloads' objects `0..keys` (docs/workloads.md): `ns-{i % 1000}/pod-{i}` on `node-{i % 5000}`.
    pub fn synthetic(keys: usize) -> Self {
        let namespaces: Vec<Key> = (0..NAMESPACES.min(keys.max(1)))
            .map(|i| Key::new(&format!("ns-{i}")))
            .collect();
        let nodes: Vec<Key> = (0..NODES.min(keys.max(1)))
            .map(|i| Key::new(&format!("node-{i}")))
            .collect();
        let keys = (0..keys)
            .map(|i| Key::new(&format!("ns-{}/pod-{i}", i % NAMESPACES)))
            .collect();
        Self {
            keys,
            namespaces,
            nodes,
        }
    }

    /// Object `id` of a synthetic universe at `version`, as a fresh allocation.
    pub(crate) fn synthetic_pod(&self, id: usize, version: u64) -> Arc<Pod> {
        Arc::new(Pod::new(
            id as u32,
            self.keys[id].clone(),
            self.namespaces[id % NAMESPACES].clone(),
            Some(self.nodes[id % NODES].clone()),
            version,
        ))
    }
}
