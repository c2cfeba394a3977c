//! The synthetic workloads of docs/workloads.md, generated up front from one seed.
//!
//! Everything an engine run touches is made here, before the clock starts: one `Arc<Pod>` per
//! event (the producer stamps a sample of them, so an `Arc` is never enqueued twice in one
//! run), every [`Key`] interned once (a pod's key, its namespace's and its node's), and the
//! generator's own [`Model`] of the final state, which the verdict compares the consumer's
//! indexer to. The timed loop therefore formats nothing and hashes nothing.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use kcache::{DeltaQueue, IndexFunc, IndexValues, Indexers, Key, KeyFn, QueueError};
use smallvec::smallvec;

/// How many namespaces the objects are spread over (`ns-{i % 1000}`).
pub const NAMESPACES: usize = 1000;
/// How many nodes the objects are spread over (`node-{i % 5000}`).
pub const NODES: usize = 5000;
/// The seed every workload uses unless told otherwise.
pub const DEFAULT_SEED: u64 = 42;
/// W3 relists this many times.
pub const W3_ROUNDS: usize = 10;
/// The name of the namespace index.
pub const NAMESPACE_INDEX: &str = "namespace";
/// The name of the node index.
pub const NODE_INDEX: &str = "node";

/// The workloads' random source (docs/workloads.md): splitmix64, wrapping arithmetic.
///
/// ```
/// use loadgen::workload::SplitMix64;
/// let mut a = SplitMix64::new(42);
/// let mut b = SplitMix64::new(42);
/// assert_eq!(a.next_u64(), b.next_u64());
/// ```
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next value: `state += 0x9E3779B97F4A7C15`, then the splitmix64 finaliser.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `next() % n`, as docs/workloads.md writes it (the modulo bias is part of the definition).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The object every workload moves: a pod reduced to what the queue and the indexes need.
///
/// `id` is the dense number of its key in the [`Universe`]: a compact name for the key (see
/// [`Op::summary`]) that needs no string comparison.
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
    fn synthetic_pod(&self, id: usize, version: u64) -> Arc<Pod> {
        Arc::new(Pod::new(
            id as u32,
            self.keys[id].clone(),
            self.namespaces[id % NAMESPACES].clone(),
            Some(self.nodes[id % NODES].clone()),
            version,
        ))
    }
}

/// A relist: what `replace` is called with.
#[derive(Debug)]
pub struct Relist {
    /// The listed objects (fresh allocations, never enqueued elsewhere).
    pub objects: Vec<Arc<Pod>>,
    /// The resource version passed along (the engines ignore it; client-go logs it).
    pub resource_version: String,
}

/// One call the producer makes on the queue (or, in W4, the writer on the indexer).
#[derive(Debug)]
pub enum Op {
    /// `add(obj)`.
    Add(Arc<Pod>),
    /// `update(obj)`.
    Update(Arc<Pod>),
    /// `delete(obj)`.
    Delete(Arc<Pod>),
    /// `replace(list)`; boxed so an op stays two words wide.
    Replace(Box<Relist>),
    /// `resync()`.
    Resync,
}

impl Op {
    /// Performs this op on `queue`, as a producer does (a relist hands over a copy of its list).
    pub fn perform_on(&self, queue: &impl DeltaQueue<Pod>) -> Result<(), QueueError> {
        match self {
            Op::Add(pod) => queue.add(Arc::clone(pod)),
            Op::Update(pod) => queue.update(Arc::clone(pod)),
            Op::Delete(pod) => queue.delete(Arc::clone(pod)),
            Op::Replace(relist) => queue.replace(relist.objects.clone(), &relist.resource_version),
            Op::Resync => queue.resync(),
        }
    }

    /// The events this op carries, as runs count them: one per add, update or delete, one per
    /// listed object of a relist, none for a resync.
    pub fn events(&self) -> usize {
        match self {
            Op::Add(_) | Op::Update(_) | Op::Delete(_) => 1,
            Op::Replace(relist) => relist.objects.len(),
            Op::Resync => 0,
        }
    }

    /// A comparable summary `(kind, id, version)`: `kind` is `A`, `U`, `D`, `R` (id = list
    /// length, version = sum of listed versions) or `S`.
    pub fn summary(&self) -> (char, u64, u64) {
        match self {
            Op::Add(p) => ('A', u64::from(p.id), p.version),
            Op::Update(p) => ('U', u64::from(p.id), p.version),
            Op::Delete(p) => ('D', u64::from(p.id), p.version),
            Op::Replace(r) => (
                'R',
                r.objects.len() as u64,
                r.objects.iter().map(|p| p.version).sum(),
            ),
            Op::Resync => ('S', 0, 0),
        }
    }
}

/// What the generator expects the consumer to receive, counted while generating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Expected {
    /// `Added` deltas enqueued.
    pub added: u64,
    /// `Updated` deltas enqueued.
    pub updated: u64,
    /// `Deleted` deltas (not tombstones) enqueued.
    pub deleted: u64,
    /// `Replaced` deltas: the total length of every relist.
    pub replaced: u64,
    /// Deletions the relists must discover: alive keys left out of a relist (W3).
    pub tombstones: u64,
}

/// The generator's own model of the final state, which the verdict holds the store to.
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// The final state of every key by id; `None` when the key ends deleted.
    pub alive: Vec<Option<Arc<Pod>>>,
    /// What the consumer must receive.
    pub expected: Expected,
}

impl Model {
    /// A model of `keys` keys, all absent.
    pub fn with_keys(keys: usize) -> Self {
        Self {
            alive: vec![None; keys],
            expected: Expected::default(),
        }
    }

    /// How many keys end alive.
    pub fn alive_count(&self) -> usize {
        self.alive.iter().filter(|p| p.is_some()).count()
    }
}

/// The workloads of docs/workloads.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Workload {
    /// Steady churn: adds, updates (95%) and deletes (5%) over K keys.
    W1,
    /// Hot keys: updates, half of them on the first 1000 keys.
    W2,
    /// Relist storm: 10 rounds of W1 churn, each ending in a relist that misses 1% of the
    /// deletions, and a resync.
    W3,
    /// Read heavy: W1's writes straight into the indexer while readers query it.
    W4,
    /// Slow handlers: W1 with a handler that burns CPU per delta.
    W5,
    /// Controller loop: W1 through the queue and indexer, a handler that adds every key to a
    /// workqueue, and workers that reconcile from the indexer.
    W6,
}

impl Workload {
    /// All workloads, in order.
    pub const ALL: [Workload; 6] = [
        Workload::W1,
        Workload::W2,
        Workload::W3,
        Workload::W4,
        Workload::W5,
        Workload::W6,
    ];

    /// `w1` .. `w5`.
    pub fn name(self) -> &'static str {
        match self {
            Workload::W1 => "w1",
            Workload::W2 => "w2",
            Workload::W3 => "w3",
            Workload::W4 => "w4",
            Workload::W5 => "w5",
            Workload::W6 => "w6",
        }
    }

    /// What the workload stresses, for tables.
    pub fn title(self) -> &'static str {
        match self {
            Workload::W1 => "steady churn",
            Workload::W2 => "hot keys",
            Workload::W3 => "relist storm",
            Workload::W4 => "read heavy",
            Workload::W5 => "slow handlers",
            Workload::W6 => "controller loop",
        }
    }

    /// The workload's key count (docs/workloads.md).
    pub fn default_keys(self) -> usize {
        match self {
            Workload::W2 => 1_000_000,
            Workload::W3 => 150_000,
            _ => 100_000,
        }
    }

    /// The workload's churn event count (docs/workloads.md) (for W3: over all rounds).
    pub fn default_events(self) -> usize {
        match self {
            Workload::W3 => W3_ROUNDS * 100_000,
            _ => 5_000_000,
        }
    }

    /// Whether the workload goes through a queue (all but W4).
    pub fn uses_queue(self) -> bool {
        self != Workload::W4
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown workload name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown workload {0:?}: expected one of w1, w2, w3, w4, w5, w6")]
pub struct UnknownWorkload(pub String);

impl FromStr for Workload {
    type Err = UnknownWorkload;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownWorkload(s.to_string()))
    }
}

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadSpec {
    /// Which workload.
    pub workload: Workload,
    /// How many keys (K).
    pub keys: usize,
    /// How many churn events after the initial population (E; for W3, over all rounds).
    pub events: usize,
    /// The splitmix64 seed.
    pub seed: u64,
}

impl WorkloadSpec {
    /// The sizes of docs/workloads.md and the default seed.
    pub fn new(workload: Workload) -> Self {
        Self {
            workload,
            keys: workload.default_keys(),
            events: workload.default_events(),
            seed: DEFAULT_SEED,
        }
    }

    /// Sets the key count.
    pub fn keys(mut self, keys: usize) -> Self {
        self.keys = keys;
        self
    }

    /// Sets the churn event count.
    pub fn events(mut self, events: usize) -> Self {
        self.events = events;
        self
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// A generated workload: the ops in order, the keys, and the expected outcome.
#[derive(Debug)]
pub struct Generated {
    /// What was asked for (or, for a replay, a description of the trace).
    pub label: String,
    /// The ops the producer performs, in order.
    pub ops: Vec<Op>,
    /// Every key and index value.
    pub universe: Universe,
    /// The final state and the delta accounting the verdict expects.
    pub model: Model,
}

impl Generated {
    /// Clears every object's `delivered` flag and latency stamp, so the same events can run
    /// through another engine (in one process, engines run one after the other on one
    /// `Generated`). Call before the clock starts.
    pub fn reset_delivery(&self) {
        for op in &self.ops {
            let pods: &[Arc<Pod>] = match op {
                Op::Add(pod) | Op::Update(pod) | Op::Delete(pod) => std::slice::from_ref(pod),
                Op::Replace(relist) => &relist.objects,
                Op::Resync => &[],
            };
            for pod in pods {
                pod.delivered.store(false, Ordering::Relaxed);
                pod.enqueued_ns.store(0, Ordering::Relaxed);
            }
        }
    }

    /// How many objects the producer hands the queue: one per add/update/delete, plus every
    /// object of every relist. (Resyncs are not counted: what they queue depends on timing.)
    pub fn event_count(&self) -> u64 {
        let e = &self.model.expected;
        e.added + e.updated + e.deleted + e.replaced
    }
}

/// Generates `spec`'s workload. Deterministic: one spec gives the same ops every time.
///
/// ```
/// use loadgen::workload::{generate, Workload, WorkloadSpec};
/// let spec = WorkloadSpec::new(Workload::W1).keys(100).events(1000);
/// let a = generate(&spec);
/// let b = generate(&spec);
/// assert_eq!(a.ops.len(), 1100);
/// let summary = |g: &loadgen::workload::Generated| g.ops.iter().map(|o| o.summary()).collect::<Vec<_>>();
/// assert_eq!(summary(&a), summary(&b));
/// ```
pub fn generate(spec: &WorkloadSpec) -> Generated {
    let universe = Universe::synthetic(spec.keys);
    let mut g = Generator::new(spec, universe);
    match spec.workload {
        Workload::W1 | Workload::W4 | Workload::W5 | Workload::W6 => {
            g.add_all();
            for _ in 0..spec.events {
                g.churn_event();
            }
        }
        Workload::W2 => {
            g.add_all();
            let hot = 1000.min(spec.keys);
            for _ in 0..spec.events {
                let i = if g.rng.next_u64() % 2 == 0 {
                    g.rng.below(spec.keys)
                } else {
                    g.rng.below(hot)
                };
                g.update(i);
            }
        }
        Workload::W3 => {
            g.relist_all();
            let per_round = spec.events / W3_ROUNDS;
            for round in 0..W3_ROUNDS {
                // The remainder goes to the last round so `events` is honoured exactly.
                let n = if round + 1 == W3_ROUNDS {
                    spec.events - per_round * (W3_ROUNDS - 1)
                } else {
                    per_round
                };
                for _ in 0..n {
                    g.churn_event();
                }
                g.relist_missing_some(round + 1);
                g.ops.push(Op::Resync);
            }
        }
    }
    g.finish(format!(
        "{} keys={} events={} seed={}",
        spec.workload, spec.keys, spec.events, spec.seed
    ))
}

/// The generator's state: the model it keeps as it goes.
struct Generator {
    rng: SplitMix64,
    universe: Universe,
    keys: usize,
    /// Current version per key; it keeps counting across a delete and a re-add.
    version: Vec<u64>,
    alive: Vec<bool>,
    ops: Vec<Op>,
    expected: Expected,
    /// The last object made for each alive key: the model's final state.
    last: Vec<Option<Arc<Pod>>>,
}

impl Generator {
    fn new(spec: &WorkloadSpec, universe: Universe) -> Self {
        let keys = spec.keys;
        let capacity = keys
            + spec.events
            + if spec.workload == Workload::W3 {
                2 * W3_ROUNDS
            } else {
                0
            };
        Self {
            rng: SplitMix64::new(spec.seed),
            universe,
            keys,
            version: vec![0; keys],
            alive: vec![false; keys],
            ops: Vec::with_capacity(capacity),
            expected: Expected::default(),
            last: vec![None; keys],
        }
    }

    /// `Added` at version 1 for every key.
    fn add_all(&mut self) {
        for i in 0..self.keys {
            self.add(i);
        }
    }

    fn add(&mut self, i: usize) {
        self.version[i] += 1;
        self.alive[i] = true;
        let pod = self.universe.synthetic_pod(i, self.version[i]);
        self.last[i] = Some(Arc::clone(&pod));
        self.ops.push(Op::Add(pod));
        self.expected.added += 1;
    }

    fn update(&mut self, i: usize) {
        self.version[i] += 1;
        let pod = self.universe.synthetic_pod(i, self.version[i]);
        self.last[i] = Some(Arc::clone(&pod));
        self.ops.push(Op::Update(pod));
        self.expected.updated += 1;
    }

    /// The deletion carries the last state (a delete does not change the object).
    fn delete(&mut self, i: usize) {
        self.alive[i] = false;
        let pod = self.universe.synthetic_pod(i, self.version[i]);
        self.last[i] = None;
        self.ops.push(Op::Delete(pod));
        self.expected.deleted += 1;
    }

    /// W1's rule for one event.
    fn churn_event(&mut self) {
        let i = self.rng.below(self.keys);
        if self.alive[i] {
            if self.rng.next_u64() % 100 < 95 {
                self.update(i);
            } else {
                self.delete(i);
            }
        } else {
            self.add(i);
        }
    }

    /// W3's first step: `replace` with every key at version 1.
    fn relist_all(&mut self) {
        let mut objects = Vec::with_capacity(self.keys);
        for i in 0..self.keys {
            self.version[i] = 1;
            self.alive[i] = true;
            let pod = self.universe.synthetic_pod(i, 1);
            self.last[i] = Some(Arc::clone(&pod));
            objects.push(pod);
        }
        self.push_relist(objects, 0);
    }

    /// W3's relist: every alive key except those with `next() % 100 == 0`, whose deletion the
    /// relist "missed": the model counts them deleted, and expects a tombstone for each.
    fn relist_missing_some(&mut self, round: usize) {
        let mut objects = Vec::with_capacity(self.keys);
        for i in 0..self.keys {
            if !self.alive[i] {
                continue;
            }
            if self.rng.next_u64() % 100 == 0 {
                self.alive[i] = false;
                self.last[i] = None;
                self.expected.tombstones += 1;
            } else {
                objects.push(self.universe.synthetic_pod(i, self.version[i]));
            }
        }
        self.push_relist(objects, round);
    }

    fn push_relist(&mut self, objects: Vec<Arc<Pod>>, round: usize) {
        self.expected.replaced += objects.len() as u64;
        self.ops.push(Op::Replace(Box::new(Relist {
            objects,
            resource_version: format!("relist-{round}"),
        })));
    }

    fn finish(self, label: String) -> Generated {
        Generated {
            label,
            ops: self.ops,
            universe: self.universe,
            model: Model {
                alive: self.last,
                expected: self.expected,
            },
        }
    }
}
