//! The generator: a [`WorkloadSpec`] in, the ops in order and the model of their outcome out.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::model::{Expected, Model};
use crate::op::{Op, Relist};
use crate::pod::{Pod, Universe};
use crate::spec::{Workload, WorkloadSpec, W3_ROUNDS};

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
/// use workloads::{generate, Workload, WorkloadSpec};
/// let spec = WorkloadSpec::new(Workload::W1).keys(100).events(1000);
/// let a = generate(&spec);
/// let b = generate(&spec);
/// assert_eq!(a.ops.len(), 1100);
/// let summary = |g: &workloads::Generated| g.ops.iter().map(|o| o.summary()).collect::<Vec<_>>();
/// assert_eq!(summary(&a), summary(&b));
/// ```
pub fn generate(spec: &WorkloadSpec) -> Generated {
    let universe = Universe::synthetic(spec.keys);
    let mut g = Generator::new(spec, universe);
    match spec.workload {
        // W8 adds keys to a workqueue on a schedule of its own and uses only the universe.
        Workload::W1 | Workload::W4 | Workload::W5 | Workload::W6 | Workload::W7 | Workload::W8 => {
            g.add_all();
            for _ in 0..spec.events {
                g.churn_event();
            }
        }
        Workload::W2 => {
            g.add_all();
            let hot = 1000.min(spec.keys);
            for _ in 0..spec.events {
                let i = if g.rng.bool() {
                    g.rng.usize(..spec.keys)
                } else {
                    g.rng.usize(..hot)
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
    rng: fastrand::Rng,
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
            rng: fastrand::Rng::with_seed(spec.seed),
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
        let i = self.rng.usize(..self.keys);
        if self.alive[i] {
            if self.rng.u32(..100) < 95 {
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

    /// W3's relist: every alive key except one in 100 (a draw below 100 that comes out 0), whose deletion the
    /// relist "missed": the model counts them deleted, and expects a tombstone for each.
    fn relist_missing_some(&mut self, round: usize) {
        let mut objects = Vec::with_capacity(self.keys);
        for i in 0..self.keys {
            if !self.alive[i] {
                continue;
            }
            if self.rng.u32(..100) == 0 {
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
