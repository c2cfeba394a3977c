//! The churn: a workload of docs/workloads.md turned into pod events, published at an offered
//! rate.
//!
//! The workload's leading adds (W3: its first relist) are the population present at start; they
//! get resource versions `1..=K` and no events. After that every `Added`, `Updated` and
//! `Deleted` op is one `ADDED`, `MODIFIED` or `DELETED` event; a later relist (W3) deletes the
//! pods it leaves out, as `DELETED` events (the server has no watch to miss them); a resync
//! changes nothing. Event `n` (counting from the start) gets resource version `K + n`.
//!
//! For the `typical` and `large` pod profiles an update is, as on a real cluster, mostly the
//! kubelet's: 80% are status updates (a container restarts: its restart count, container id
//! and start time, the Ready conditions' transition time and the kubelet's `managedFields`
//! time change), 10% metadata changes (the `loadgen/touched` annotation) and 10% spec changes
//! (the first container's image tag, and `metadata.generation`). Which one is a function of
//! the key and its version, and each key's [`Revision`] lives here, so one seed gives one
//! stream (times aside: they are the churn's clock, as the creation time always was).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::encode::PodFields;
use super::objects::{EventType, Revision};
use super::profile::mix;
use super::store::{Change, Store, StoredPod};
use kcache::{Key, KeyMap};
use workloads::{Generated, Op, Pod, PodProfile};

/// At most this many events go into the store under one lock.
const BATCH: u64 = 4096;
/// The churn looks at its stop flag at least this often.
const STOP_POLL: Duration = Duration::from_millis(20);

/// How the churn ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChurnSummary {
    /// Events published.
    pub events: u64,
    /// The resource version after the last of them.
    pub resource_version: u64,
    /// Pods alive at the end.
    pub pods: usize,
    /// Seconds from the first event's schedule to the last one's publication.
    pub seconds: f64,
    /// Whether the churn was stopped before the workload ran out.
    pub stopped: bool,
}

/// The churn's state: the workload, and what the server made of it so far.
#[derive(Debug)]
pub struct Churn {
    generated: Generated,
    /// The first op after the initial population.
    next_op: usize,
    namespaces: Vec<Arc<str>>,
    alive: Vec<bool>,
    /// The last state of each key, for the deletions a relist implies.
    last: Vec<Option<Arc<Pod>>>,
    /// How many times each key was created after the start (part of its uid).
    incarnation: Vec<u32>,
    /// When each key's incarnation was created, in Unix seconds.
    created: Vec<i64>,
    /// Each key's `metadata.name`, made the first time the key is written and shared after.
    names: Vec<Option<Arc<str>>>,
    /// Each node name as the pods' `spec.nodeName`, shared by every pod on it.
    nodes: KeyMap<Arc<str>>,
    /// How much of a real pod each event carries.
    profile: PodProfile,
    /// What each key's incarnation went through (empty for `minimal`, which shows none of it).
    revisions: Vec<Revision>,
    resource_version: u64,
    pods: usize,
}

impl Churn {
    /// Takes the workload's initial population: the pods present at start and the resource
    /// version after them, as pods of `profile`.
    pub fn new(generated: Generated, profile: PodProfile) -> (Self, Vec<Arc<StoredPod>>, u64) {
        let keys = generated.universe.keys.len();
        let namespaces = generated
            .universe
            .namespaces
            .iter()
            .map(|ns| Arc::from(ns.as_str()))
            .collect();
        let mut churn = Self {
            generated,
            next_op: 0,
            namespaces,
            alive: vec![false; keys],
            last: vec![None; keys],
            incarnation: vec![0; keys],
            created: vec![unix_now(); keys],
            names: vec![None; keys],
            nodes: KeyMap::default(),
            profile,
            revisions: if profile == PodProfile::Minimal {
                Vec::new()
            } else {
                vec![Revision::default(); keys]
            },
            resource_version: 0,
            pods: 0,
        };
        let mut initial = Vec::with_capacity(keys);
        let initial_pod = |churn: &mut Self, pod: &Arc<Pod>, initial: &mut Vec<Arc<StoredPod>>| {
            churn.resource_version += 1;
            churn.mark(pod, true);
            let fields = churn.fields(pod, churn.resource_version);
            initial.push(Arc::new(StoredPod::new(EventType::Added, fields)));
        };
        let ops = std::mem::take(&mut churn.generated.ops);
        match ops.first() {
            Some(Op::Replace(relist)) => {
                for pod in &relist.objects {
                    initial_pod(&mut churn, pod, &mut initial);
                }
                churn.next_op = 1;
            }
            _ => {
                for op in &ops {
                    let Op::Add(pod) = op else { break };
                    initial_pod(&mut churn, pod, &mut initial);
                    churn.next_op += 1;
                }
            }
        }
        churn.generated.ops = ops;
        let resource_version = churn.resource_version;
        (churn, initial, resource_version)
    }

    fn names(&mut self, pod: &Pod) -> (Arc<str>, Arc<str>) {
        let name = self.names[pod.id as usize].get_or_insert_with(|| {
            let key = pod.key.as_str();
            Arc::from(key.split_once('/').map_or(key, |(_, name)| name))
        });
        (
            Arc::clone(&self.namespaces[pod.id as usize % self.namespaces.len()]),
            Arc::clone(name),
        )
    }

    fn node(&mut self, node: &Key) -> Arc<str> {
        if let Some(name) = self.nodes.get(node) {
            return Arc::clone(name);
        }
        let name: Arc<str> = Arc::from(node.as_str());
        self.nodes.insert(node.clone(), Arc::clone(&name));
        name
    }

    fn mark(&mut self, pod: &Arc<Pod>, alive: bool) {
        let id = pod.id as usize;
        if alive && !self.alive[id] {
            self.pods += 1;
        } else if !alive && self.alive[id] {
            self.pods -= 1;
        }
        self.alive[id] = alive;
        self.last[id] = alive.then(|| Arc::clone(pod));
    }

    fn fields(&mut self, pod: &Pod, resource_version: u64) -> PodFields {
        let (namespace, name) = self.names(pod);
        PodFields {
            namespace,
            name,
            node: pod.node.as_ref().map(|n| self.node(n)),
            id: pod.id,
            incarnation: self.incarnation[pod.id as usize],
            version: pod.version,
            resource_version,
            created: self.created[pod.id as usize],
            profile: self.profile,
            revision: self
                .revisions
                .get(pod.id as usize)
                .copied()
                .unwrap_or_default(),
        }
    }

    /// Moves the key's revision on for a `kind` event of `pod`: a new incarnation starts
    /// afresh; an update is a status, metadata or spec change (see the module documentation).
    fn revise(&mut self, kind: EventType, pod: &Pod) {
        let id = pod.id as usize;
        let Some(revision) = self.revisions.get_mut(id) else {
            return;
        };
        let since_created = || (unix_now() - self.created[id]).clamp(0, i64::from(u32::MAX)) as u32;
        match kind {
            EventType::Added => *revision = Revision::default(),
            EventType::Deleted => {}
            EventType::Modified => match mix(u64::from(pod.id) << 32 ^ pod.version) % 10 {
                0 => {
                    revision.spec = revision.spec.wrapping_add(1);
                    revision.touched_at = since_created();
                }
                1 => {
                    revision.touched = revision.touched.wrapping_add(1);
                    revision.touched_at = since_created();
                }
                _ => {
                    revision.restarts = revision.restarts.wrapping_add(1);
                    revision.status_at = since_created();
                }
            },
        }
    }

    /// The next event for `pod`.
    fn change(&mut self, kind: EventType, pod: &Arc<Pod>) -> Change {
        if kind == EventType::Added && !self.alive[pod.id as usize] {
            self.incarnation[pod.id as usize] += 1;
            self.created[pod.id as usize] = unix_now();
        }
        self.revise(kind, pod);
        self.mark(pod, kind != EventType::Deleted);
        self.resource_version += 1;
        Change::new(kind, self.fields(pod, self.resource_version))
    }

    /// The events of the next op into `out`; false when the workload is done.
    fn next_events(&mut self, out: &mut VecDeque<Change>) -> bool {
        // The ops move out while one is read, so `self` can change meanwhile.
        let ops = std::mem::take(&mut self.generated.ops);
        let more = match ops.get(self.next_op) {
            None => false,
            Some(op) => {
                self.next_op += 1;
                self.events_of(op, out);
                true
            }
        };
        self.generated.ops = ops;
        more
    }

    fn events_of(&mut self, op: &Op, out: &mut VecDeque<Change>) {
        match op {
            Op::Add(pod) => out.push_back(self.change(EventType::Added, pod)),
            Op::Update(pod) => out.push_back(self.change(EventType::Modified, pod)),
            Op::Delete(pod) => out.push_back(self.change(EventType::Deleted, pod)),
            Op::Replace(relist) => {
                let mut listed = vec![false; self.alive.len()];
                for pod in &relist.objects {
                    let id = pod.id as usize;
                    listed[id] = true;
                    match &self.last[id] {
                        None => out.push_back(self.change(EventType::Added, pod)),
                        Some(last) if last.version != pod.version => {
                            out.push_back(self.change(EventType::Modified, pod))
                        }
                        Some(_) => {}
                    }
                }
                for (id, listed) in listed.into_iter().enumerate() {
                    if let (false, Some(last)) = (listed, self.last[id].clone()) {
                        out.push_back(self.change(EventType::Deleted, &last));
                    }
                }
            }
            Op::Resync => {}
        }
    }

    /// Publishes every event into `store` as `pace` says, until the workload runs out or
    /// `stop` is set.
    pub fn run(mut self, store: &Store, pace: Pace, stop: &AtomicBool) -> ChurnSummary {
        let rate = pace.rate;
        // A batch reaches every watcher at once: one larger than the window would put each
        // watcher past it before it could read a single event.
        let batch = BATCH.min((store.window() as u64 / 4).max(1));
        let start = Instant::now();
        let mut sent: u64 = 0;
        // When the last batch went out, from `start`.
        let mut published = Duration::ZERO;
        let mut queue = VecDeque::new();
        let mut exhausted = false;
        let mut stopped = false;
        loop {
            // Relaxed: the flag carries no data; the churn only needs to see it eventually.
            if stop.load(Ordering::Relaxed) {
                stopped = true;
                break;
            }
            let elapsed = start.elapsed();
            let due = (elapsed.as_secs_f64() * rate) as u64;
            let next_due =
                Duration::try_from_secs_f64((sent + 1) as f64 / rate).unwrap_or(Duration::MAX);
            // Behind by a whole batch, publish at once; otherwise not twice in one interval.
            let too_soon = elapsed < published + pace.interval && due.saturating_sub(sent) < batch;
            if due <= sent || too_soon {
                let wake = next_due.max(published + pace.interval);
                std::thread::sleep(wake.saturating_sub(elapsed).min(STOP_POLL));
                continue;
            }
            let want = (due - sent).min(batch) as usize;
            while queue.len() < want && !exhausted {
                exhausted = !self.next_events(&mut queue);
            }
            if queue.is_empty() {
                break;
            }
            let batch: Vec<Change> = queue.drain(..want.min(queue.len())).collect();
            sent += batch.len() as u64;
            // Its first event was due at `next_due`: a lag is measured from then, so the
            // interval's wait counts against the client, never for it.
            published = start.elapsed();
            store.publish_late(batch, published.saturating_sub(next_due));
        }
        ChurnSummary {
            events: sent,
            resource_version: store.resource_version(),
            pods: store.len(),
            seconds: start.elapsed().as_secs_f64(),
            stopped,
        }
    }
}

/// How fast the churn publishes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    /// Events per second.
    pub rate: f64,
    /// The churn publishes what is due at most once per interval (zero: each event when it is
    /// due). Under load a real API server hears etcd's changes in batches too; a batch per
    /// millisecond spares the load generator a wake-up per event, which at tens of thousands
    /// of events a second cost as much CPU as the client it measures.
    pub interval: Duration,
}

impl Pace {
    /// The default interval: one millisecond.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(1);
}

/// Seconds since the Unix epoch (0 if the clock is set before it).
fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::{generate, Workload, WorkloadSpec};

    #[test]
    fn the_server_ends_in_the_workloads_final_state() {
        for workload in [Workload::W1, Workload::W2, Workload::W3] {
            let spec = WorkloadSpec::new(workload).keys(300).events(2000);
            let generated = generate(&spec);
            let model = generated.model.clone();
            let (churn, initial, rv) = Churn::new(generated, PodProfile::Typical);
            assert_eq!(initial.len(), 300, "{workload}");
            assert_eq!(rv, 300);
            let store = Store::new(initial, rv, 100_000);
            let pace = Pace {
                rate: 1e9,
                interval: Pace::DEFAULT_INTERVAL,
            };
            let summary = churn.run(&store, pace, &AtomicBool::new(false));
            assert!(!summary.stopped);
            assert_eq!(summary.resource_version, 300 + summary.events);
            assert_eq!(summary.pods, model.alive_count(), "{workload}");
            for pod in model.alive.iter().flatten() {
                let (ns, name) = pod.key.as_str().split_once('/').unwrap();
                let stored = store.get(ns, name).expect("alive in the model");
                let json: serde_json::Value = serde_json::from_slice(stored.object()).unwrap();
                assert_eq!(
                    json["metadata"]["labels"][super::super::objects::VERSION_LABEL],
                    pod.version.to_string(),
                    "{workload} {}",
                    pod.key
                );
            }
        }
    }

    /// Every change of a W1 run as (event, key, revision without its times).
    fn stream(seed: u64) -> Vec<(EventType, u32, (u32, u32, u32))> {
        let spec = WorkloadSpec::new(Workload::W1)
            .keys(200)
            .events(5000)
            .seed(seed);
        let (mut churn, _, _) = Churn::new(generate(&spec), PodProfile::Typical);
        let mut queue = VecDeque::new();
        while churn.next_events(&mut queue) {}
        queue
            .into_iter()
            .map(|change| {
                let f = change.pod.fields().expect("a churn pod");
                let r = f.revision;
                (change.kind, f.id, (r.restarts, r.spec, r.touched))
            })
            .collect()
    }

    #[test]
    fn updates_are_mostly_status_and_the_stream_follows_the_seed() {
        let events = stream(7);
        assert_eq!(events, stream(7), "the same seed, the same stream");
        let (mut status, mut spec, mut metadata) = (0, 0, 0);
        let mut last = std::collections::HashMap::new();
        for &(kind, id, revision) in &events {
            if let (EventType::Modified, Some(&(restarts, specs, touched))) = (kind, last.get(&id))
            {
                match revision {
                    (r, _, _) if r == restarts + 1 => status += 1,
                    (_, s, _) if s == specs + 1 => spec += 1,
                    (_, _, t) if t == touched + 1 => metadata += 1,
                    other => panic!("{other:?} after {:?}", last[&id]),
                }
            }
            last.insert(id, revision);
        }
        let updates = f64::from(status + spec + metadata);
        assert!(updates > 3000.0, "{updates}");
        for (share, expected) in [(status, 0.8), (spec, 0.1), (metadata, 0.1)] {
            assert!(
                (f64::from(share) / updates - expected).abs() < 0.04,
                "{status} {spec} {metadata}"
            );
        }
    }
}
