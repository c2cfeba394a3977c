//! Fixtures shared by kcache's benchmarks: the objects, the engines built the same way for every
//! bench, the [`floor`] every competitor is measured against, the [`alloc`] counter and the
//! [`mem`] driver of the `membench` binary.
//!
//! # What is compared
//!
//! Every criterion group puts up to four competitors side by side on one operation:
//!
//! - `reference`: [`kcache::reference`], the faithful client-go port (one lock, one condvar);
//! - `sharded`: [`kcache::sharded`] with [`DEFAULT_SHARDS`](kcache::sharded::DEFAULT_SHARDS)
//!   (16) shards;
//! - `sharded_1shard`: the sharded engine with one shard, where the cost of the machinery
//!   without the sharding is instructive (queue operations);
//! - `floor`: [`floor::FloorQueue`] / [`floor::FloorIndexer`], the same bookkeeping in a plain
//!   single-threaded map with no lock at all: the lower bound. Its index sets hold keys, as
//!   client-go's and both engines' do. The `eventcost` binary runs whole workloads through it
//!   (`--engine floor`) for the ceiling of a machine: its cores over the floor's time per event.
//!
//! # Objects
//!
//! The objects are the workloads' [`Pod`]s (docs/workloads.md: `ns-{i % 1000}/pod-{i}` on `node-{i % 5000}`),
//! with every [`Key`] interned once in a [`Universe`]. Everything a timed loop touches is built
//! before the clock starts: the loop formats nothing and hashes nothing.
//!
//! ```
//! let universe = bench::universe(10);
//! let pods = bench::pods(&universe, 1);
//! assert_eq!(pods[3].key.as_str(), "ns-3/pod-3");
//! assert_eq!(pods[3].node.as_ref().unwrap().as_str(), "node-3");
//! ```

//!
//! # Layout
//!
//! Layers, imports only going down (checked by `scripts/layers`, which reads this table):
//!
//! | layer | modules | what they hold |
//! |---|---|---|
//! | 0 | `crate` (this file), [`alloc`] | the objects and engines every bench builds; the counting allocator |
//! | 1 | [`floor`], [`mem`] | the lower bound every competitor is measured against; the `membench` driver |

use std::sync::Arc;
use std::time::{Duration, Instant};

use kcache::{Key, KnownObjects, QueueOptions};

pub use workloads::{
    pod_indexers, pod_key_fn, Pod, Universe, NAMESPACES, NAMESPACE_INDEX, NODES, NODE_INDEX,
};

pub mod alloc;
pub mod floor;
pub mod mem;

/// How many keys a sharded consumer takes per `pop_batch` (the same as loadgen's).
pub const BATCH: usize = 256;

/// The workloads' objects `0..keys` (docs/workloads.md), every key made once.
///
/// ```
/// let universe = bench::universe(3);
/// assert_eq!(universe.keys.len(), 3);
/// ```
pub fn universe(keys: usize) -> Universe {
    // Always the full namespace and node lists, so `node-{i % 5000}` exists for small sizes too.
    let mut universe = Universe::synthetic(keys);
    universe.namespaces = (0..NAMESPACES)
        .map(|i| Key::new(&format!("ns-{i}")))
        .collect();
    universe.nodes = (0..NODES).map(|i| Key::new(&format!("node-{i}"))).collect();
    universe
}

/// Object `id` at `version` on node `node-{(id + node_shift) % 5000}`.
pub fn pod(universe: &Universe, id: usize, version: u64, node_shift: usize) -> Arc<Pod> {
    Arc::new(Pod::new(
        u32::try_from(id).unwrap_or(u32::MAX),
        universe.keys[id].clone(),
        universe.namespaces[id % NAMESPACES].clone(),
        Some(universe.nodes[(id + node_shift) % NODES].clone()),
        version,
    ))
}

/// Every object of `universe` at `version`, on its docs/workloads.md node.
///
/// ```
/// let u = bench::universe(4);
/// assert!(bench::pods(&u, 7).iter().all(|p| p.version == 7));
/// ```
pub fn pods(universe: &Universe, version: u64) -> Vec<Arc<Pod>> {
    (0..universe.keys.len())
        .map(|id| pod(universe, id, version, 0))
        .collect()
}

/// Every object of `universe` at `version`, with the objects whose `id % every == 0` moved to
/// the next node (their `node` index value changes; the others keep theirs).
///
/// ```
/// let u = bench::universe(4);
/// let moved = bench::pods_moving(&u, 2, 2);
/// assert_eq!(moved[0].node.as_ref().unwrap().as_str(), "node-1");
/// assert_eq!(moved[1].node.as_ref().unwrap().as_str(), "node-1");
/// ```
pub fn pods_moving(universe: &Universe, version: u64, every: usize) -> Vec<Arc<Pod>> {
    let every = every.max(1);
    (0..universe.keys.len())
        .map(|id| pod(universe, id, version, usize::from(id % every == 0)))
        .collect()
}

/// `count` indices below `n`, drawn with `fastrand` seeded with `seed`: the keys a reader
/// looks up, precomputed so the timed loop only indexes an array.
///
/// ```
/// let picks = bench::random_indices(10, 100, 42);
/// assert_eq!(picks.len(), 100);
/// assert!(picks.iter().all(|&i| i < 10));
/// assert_eq!(picks, bench::random_indices(10, 100, 42));
/// ```
pub fn random_indices(n: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..count).map(|_| rng.usize(..n.max(1))).collect()
}

/// Queue options keyed by the pod's precomputed key, optionally with known objects.
pub fn queue_options(known: Option<Arc<dyn KnownObjects<Pod>>>) -> QueueOptions<Pod> {
    let opts = QueueOptions::new(pod_key_fn());
    match known {
        Some(known) => opts.known_objects(known),
        None => opts,
    }
}

/// The reference queue, as every bench builds it.
pub fn reference_queue(
    known: Option<Arc<dyn KnownObjects<Pod>>>,
) -> kcache::reference::DeltaFifo<Pod> {
    kcache::reference::DeltaFifo::new(queue_options(known))
}

/// The sharded queue with `shards` shards, as every bench builds it.
pub fn sharded_queue(
    known: Option<Arc<dyn KnownObjects<Pod>>>,
    shards: usize,
) -> kcache::sharded::DeltaFifo<Pod> {
    kcache::sharded::DeltaFifo::new(queue_options(known), shards)
}

/// The reference indexer with the `namespace` and `node` indexes.
pub fn reference_indexer() -> kcache::reference::IndexedStore<Pod> {
    kcache::reference::IndexedStore::new(pod_key_fn(), pod_indexers())
}

/// The sharded indexer with the `namespace` and `node` indexes.
pub fn sharded_indexer() -> kcache::sharded::IndexedStore<Pod> {
    kcache::sharded::IndexedStore::new(pod_key_fn(), pod_indexers())
}

/// The floor indexer with the `namespace` and `node` indexes.
pub fn floor_indexer() -> floor::FloorIndexer<Pod> {
    floor::FloorIndexer::new(pod_key_fn(), pod_indexers())
}

/// Times `iters` runs of `routine`, each on a fresh `setup()`, for criterion's `iter_custom`.
///
/// Only `routine` is on the clock. It takes the state by value and hands back whatever should
/// be dropped, so tearing down a queue of 100,000 keys is not counted either.
///
/// ```
/// let mut runs = 0;
/// let took = bench::time_with_setup(3, || vec![1u8; 16], |v| { runs += 1; v });
/// assert_eq!(runs, 3);
/// assert!(took < std::time::Duration::from_secs(1));
/// ```
pub fn time_with_setup<S, O>(
    iters: u64,
    mut setup: impl FnMut() -> S,
    mut routine: impl FnMut(S) -> O,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let state = setup();
        let start = Instant::now();
        let leftover = routine(state);
        total += start.elapsed();
        drop(std::hint::black_box(leftover));
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_universes_still_have_every_node_and_namespace() {
        let u = universe(2);
        assert_eq!(u.nodes.len(), NODES);
        assert_eq!(u.namespaces.len(), NAMESPACES);
        let p = pod(&u, 1, 3, NODES - 1);
        assert_eq!(p.node.as_ref().map(Key::as_str), Some("node-0"));
        assert_eq!(p.namespace.as_str(), "ns-1");
        assert_eq!(p.version, 3);
    }

    #[test]
    fn pods_moving_changes_the_node_of_exactly_one_in_every() {
        let u = universe(100);
        let base = pods(&u, 1);
        let moved = pods_moving(&u, 2, 10);
        let changed = base
            .iter()
            .zip(&moved)
            .filter(|(a, b)| a.node != b.node)
            .count();
        assert_eq!(changed, 10);
        assert!(base.iter().zip(&moved).all(|(a, b)| a.key == b.key));
    }
}
