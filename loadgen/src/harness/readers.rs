//! W4's readers: what a client of each engine reads while the writer writes.

use std::sync::atomic::{AtomicBool, Ordering};

use kcache::{Indexer, Key, KnownObjects as _};
use workloads::{Pod, Universe, NODE_INDEX};

/// One W4 read pair, as a client of the engine would make it.
pub trait W4Reads: Indexer<Pod> {
    /// `get_by_key(key)` and `by_index("node", node)`: how many objects they found.
    fn get_and_by_index(&self, key: &Key, node: &str) -> usize;
}

/// The reference (client-go's API) has only the `Arc` reads: one reference count per object.
impl W4Reads for kcache::reference::IndexedStore<Pod> {
    fn get_and_by_index(&self, key: &Key, node: &str) -> usize {
        usize::from(self.get_by_key(key).is_some())
            + self.by_index(NODE_INDEX, node).map_or(0, |v| v.len())
    }
}

/// The sharded indexer's borrowed reads: no reference count per object. Each read pins on
/// its own, as a lone call would.
impl W4Reads for kcache::sharded::IndexedStore<Pod> {
    fn get_and_by_index(&self, key: &Key, node: &str) -> usize {
        usize::from(self.pin().get_by_key(key).is_some())
            + self.pin().by_index(NODE_INDEX, node).map_or(0, |v| v.len())
    }
}

/// A W4 reader: `get_by_key(random key)` and `by_index("node", random node)` until `done`.
pub(crate) fn read_until_done<S: W4Reads>(
    store: &S,
    universe: &Universe,
    reader: u64,
    done: &AtomicBool,
) -> u64 {
    let (keys, nodes) = (&universe.keys, &universe.nodes);
    if keys.is_empty() || nodes.is_empty() {
        return 0;
    }
    let mut rng = fastrand::Rng::with_seed(0x5EED_0000 + reader);
    let mut reads = 0u64;
    let mut found = 0usize;
    while !done.load(Ordering::Relaxed) {
        // Check the flag once per small batch so the flag's cache line is not hammered.
        for _ in 0..32 {
            let key = &keys[rng.usize(..keys.len())];
            let node = &nodes[rng.usize(..nodes.len())];
            found += store.get_and_by_index(key, node.as_str());
            reads += 2;
        }
    }
    std::hint::black_box(found);
    reads
}
