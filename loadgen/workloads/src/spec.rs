//! Which workload to generate, at which size and with which seed.

/// The seed every workload uses unless told otherwise.
pub const DEFAULT_SEED: u64 = 42;
/// W3 relists this many times.
pub const W3_ROUNDS: usize = 10;

/// The workloads of docs/workloads.md.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
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
    /// Resync storm: W6's controller through the shared informer while the informer resyncs
    /// every object every few seconds; the latency of live changes, with and without priority.
    W7,
    /// Priority scheduling: a controller's workqueue saturated by one namespace's live
    /// changes, with an initial list's backlog at low priority and a trickle from the other
    /// namespaces; waits per class and each namespace's share of the workers, per queue order
    /// (first in first out, priority, aging, fairness).
    W8,
}

impl Workload {
    /// All workloads, in order.
    pub const ALL: [Workload; 8] = [
        Workload::W1,
        Workload::W2,
        Workload::W3,
        Workload::W4,
        Workload::W5,
        Workload::W6,
        Workload::W7,
        Workload::W8,
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
            Workload::W7 => "w7",
            Workload::W8 => "w8",
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
            Workload::W7 => "resync storm",
            Workload::W8 => "priority scheduling",
        }
    }

    /// The workload's key count (docs/workloads.md).
    pub fn default_keys(self) -> usize {
        match self {
            Workload::W2 => 1_000_000,
            Workload::W3 => 150_000,
            // W8's keys are the flooding namespace's objects: few enough that its churn keeps
            // every one of them queued (the workqueue merges the rest), so the queue stays
            // saturated without growing for ever.
            Workload::W8 => 1_000,
            _ => 100_000,
        }
    }

    /// The workload's churn event count (docs/workloads.md) (for W3: over all rounds).
    pub fn default_events(self) -> usize {
        match self {
            Workload::W3 => W3_ROUNDS * 100_000,
            // W8 runs for a time (`--duration-ms`), not a count of events.
            Workload::W8 => 0,
            _ => 5_000_000,
        }
    }

    /// Whether the workload goes through a queue (all but W4).
    pub fn uses_queue(self) -> bool {
        self != Workload::W4
    }
}

/// An unknown workload name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown workload {0:?}: expected one of w1, w2, w3, w4, w5, w6, w7, w8")]
pub struct UnknownWorkload(pub String);

crate::display_and_parse_by_name!(Workload, UnknownWorkload);

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkloadSpec {
    /// Which workload.
    pub workload: Workload,
    /// How many keys (K).
    pub keys: usize,
    /// How many churn events after the initial population (E; for W3, over all rounds).
    pub events: usize,
    /// The generator's seed (`fastrand::Rng::with_seed`).
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
