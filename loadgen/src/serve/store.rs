//! The server's state: the current pods, the window of recent events, and the broadcast that
//! hands each event to every open watch.
//!
//! One writer (the churn) publishes batches of prepared events under the write lock: the pods
//! map, the window and the broadcast change together, so a watch that starts under the read
//! lock sees a consistent cut — the state (or the window's tail) up to some resource version,
//! and from its subscription exactly the events after it. Every event is serialised once, by
//! the churn, outside the lock; watchers share its bytes.
//!
//! Resource versions count events: event `n` has resource version `n`, so the window's events
//! are contiguous and a watch finds where to resume by subtraction.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::broadcast;

use super::objects::{event_line, EventType, Status, POD_HEAD};

/// Now, in nanoseconds since the Unix epoch: the clock the server and its clients' processes
/// share, so a lag can run from one process to another.
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A pod as the server holds it.
#[derive(Debug)]
pub struct StoredPod {
    /// `metadata.namespace`.
    pub namespace: Arc<str>,
    /// `metadata.name`.
    pub name: Arc<str>,
    /// `metadata.resourceVersion`.
    pub resource_version: u64,
    /// The serialised pod, `kind` and `apiVersion` included (a slice of its event's line).
    pub object: Bytes,
}

impl StoredPod {
    /// The pod as a list item: without `kind` and `apiVersion`, which the list carries once.
    pub fn list_item(&self) -> &[u8] {
        // `object` starts with POD_HEAD, which ends with the comma after `kind`; what follows
        // is the rest of the object, so `{` + rest is the object without the two fields.
        &self.object[POD_HEAD.len()..]
    }
}

/// One event, as every watcher sends it.
#[derive(Debug)]
pub struct WatchLine {
    /// The event's resource version.
    pub resource_version: u64,
    /// The pod's namespace (for namespaced watches).
    pub namespace: Arc<str>,
    /// `{"type":…,"object":…}\n`.
    pub line: Bytes,
}

/// An event the churn prepared, ready to publish.
#[derive(Debug)]
pub struct Change {
    /// What happened.
    pub kind: EventType,
    /// The pod after the change (for a deletion: its last state, at the deletion's version).
    pub pod: Arc<StoredPod>,
    /// The shared line.
    pub line: Arc<WatchLine>,
}

impl Change {
    /// The `kind` event of the pod serialised as `json`, at `resource_version`: the watch line
    /// is built once, and the stored object is a slice of it (serialised once, not per watcher).
    pub fn new(
        kind: EventType,
        namespace: Arc<str>,
        name: Arc<str>,
        resource_version: u64,
        json: &[u8],
    ) -> Change {
        let (line, object) = event_line(kind, json);
        Change {
            kind,
            pod: Arc::new(StoredPod {
                namespace: Arc::clone(&namespace),
                name,
                resource_version,
                object: line.slice(object),
            }),
            line: Arc::new(WatchLine {
                resource_version,
                namespace,
                line,
            }),
        }
    }
}

/// What a watch sends before its live events.
#[derive(Debug)]
pub enum Backlog {
    /// The window's events after the watch's resource version (shared lines).
    Events(Vec<Bytes>),
    /// An `ADDED` for each of these pods (the lines are written straight into the stream's
    /// chunks, so a thousand watchers starting this way do not each copy every pod first).
    Added(Vec<Arc<StoredPod>>),
}

impl Backlog {
    /// How many events it holds.
    pub fn len(&self) -> usize {
        match self {
            Backlog::Events(lines) => lines.len(),
            Backlog::Added(pods) => pods.len(),
        }
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where a watch starts.
#[derive(Debug)]
pub struct WatchStart {
    /// What to send before the live events.
    pub backlog: Backlog,
    /// The resource version the backlog brings the watcher to.
    pub resource_version: u64,
    /// The live events after it.
    pub live: broadcast::Receiver<Arc<WatchLine>>,
}

/// How long a paged list's snapshot stays available to its `continue` tokens (the real server
/// keeps etcd's history for 5 minutes).
const SNAPSHOT_TTL: Duration = Duration::from_secs(300);
/// How many paged lists can be in progress at once before the oldest loses its snapshot.
const SNAPSHOTS: usize = 64;

/// A list's view: the pods of one namespace (or all) at one resource version, in key order.
#[derive(Debug)]
pub struct Snapshot {
    /// The resource version it describes.
    pub resource_version: u64,
    /// The namespace it is limited to.
    pub namespace: Option<Arc<str>>,
    /// The pods.
    pub pods: Vec<Arc<StoredPod>>,
}

struct State {
    resource_version: u64,
    pods: BTreeMap<(Arc<str>, Arc<str>), Arc<StoredPod>>,
    window: VecDeque<Arc<WatchLine>>,
    /// A watch can resume from this version or newer: every event after it is in the window.
    oldest: u64,
}

/// The server's state (see the module documentation).
pub struct Store {
    state: RwLock<State>,
    live: broadcast::Sender<Arc<WatchLine>>,
    window: usize,
    snapshots: Mutex<VecDeque<(Instant, Arc<Snapshot>)>>,
    /// When each batch was published, if asked for (see [`Store::record_publications`]).
    publications: Mutex<Option<Vec<Publication>>>,
}

/// A batch of events handed to the watches: the first resource version in it, and the moment
/// (Unix nanoseconds) just before the first of them became visible.
pub type Publication = (u64, u64);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("resource_version", &self.resource_version())
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A store holding `initial` (the population present at start, which needs no events) at
    /// `resource_version`, keeping the last `window` events (at least 1).
    pub fn new(initial: Vec<Arc<StoredPod>>, resource_version: u64, window: usize) -> Self {
        let window = window.max(1);
        let pods = initial
            .into_iter()
            .map(|pod| ((pod.namespace.clone(), pod.name.clone()), pod))
            .collect();
        // A receiver that falls `window` events behind gets `Lagged` and so a 410: the
        // broadcast's buffer is the same window the store keeps.
        let (live, _) = broadcast::channel(window);
        Self {
            state: RwLock::new(State {
                resource_version,
                pods,
                window: VecDeque::with_capacity(window.min(1 << 20)),
                oldest: resource_version,
            }),
            live,
            window,
            snapshots: Mutex::new(VecDeque::new()),
            publications: Mutex::new(None),
        }
    }

    /// From now on, remember when each batch is published, for a lag measured from the moment
    /// an event became visible rather than from a sample of the resource version. Costs one
    /// entry per batch, so it is for bounded runs (`loadgen e2e`), not a long-lived server.
    pub fn record_publications(&self) {
        lock(&self.publications).get_or_insert_with(Vec::new);
    }

    /// The publications recorded so far, oldest first (empty unless recording).
    pub fn publications(&self) -> Vec<Publication> {
        lock(&self.publications).clone().unwrap_or_default()
    }

    fn read(&self) -> RwLockReadGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-changed in a way that
        // matters here (publish changes the map, then the window), so poisoning is ignored.
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    /// How many recent events it keeps.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The newest resource version.
    pub fn resource_version(&self) -> u64 {
        self.read().resource_version
    }

    /// The oldest resource version a watch can start from.
    pub fn oldest(&self) -> u64 {
        self.read().oldest
    }

    /// How many pods exist.
    pub fn len(&self) -> usize {
        self.read().pods.len()
    }

    /// Whether no pod exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies `changes` (consecutive resource versions after the current one) and hands them
    /// to every watch.
    pub fn publish(&self, changes: Vec<Change>) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        if let (Some(log), Some(first)) = (lock(&self.publications).as_mut(), changes.first()) {
            // Stamped before any of the batch is sent, so a lag measured from it is never
            // short.
            log.push((first.line.resource_version, unix_nanos()));
        }
        for change in changes {
            debug_assert_eq!(change.line.resource_version, state.resource_version + 1);
            state.resource_version = change.line.resource_version;
            let key = (change.pod.namespace.clone(), change.pod.name.clone());
            match change.kind {
                EventType::Deleted => {
                    state.pods.remove(&key);
                }
                EventType::Added | EventType::Modified => {
                    state.pods.insert(key, change.pod);
                }
            }
            if state.window.len() == self.window {
                if let Some(dropped) = state.window.pop_front() {
                    state.oldest = dropped.resource_version;
                }
            }
            state.window.push_back(Arc::clone(&change.line));
            // No receiver is fine: nobody is watching.
            let _ = self.live.send(change.line);
        }
    }

    /// One pod.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<StoredPod>> {
        let key: (Arc<str>, Arc<str>) = (namespace.into(), name.into());
        self.read().pods.get(&key).cloned()
    }

    /// The pods of `namespace` (all when `None`) now.
    pub fn snapshot(&self, namespace: Option<&str>) -> Snapshot {
        let state = self.read();
        Snapshot {
            resource_version: state.resource_version,
            namespace: namespace.map(Arc::from),
            pods: select(&state, namespace).cloned().collect(),
        }
    }

    /// Keeps `snapshot` for the `continue` tokens of a paged list.
    pub fn keep_snapshot(&self, snapshot: Arc<Snapshot>) {
        let mut kept = lock(&self.snapshots);
        let now = Instant::now();
        kept.retain(|(at, _)| now.duration_since(*at) < SNAPSHOT_TTL);
        if kept.iter().any(|(_, s)| same_view(s, &snapshot)) {
            return;
        }
        if kept.len() == SNAPSHOTS {
            kept.pop_front();
        }
        kept.push_back((now, snapshot));
    }

    /// The kept snapshot of `namespace` at `resource_version`, if it is still kept.
    pub fn kept_snapshot(
        &self,
        resource_version: u64,
        namespace: Option<&str>,
    ) -> Option<Arc<Snapshot>> {
        let kept = lock(&self.snapshots);
        let now = Instant::now();
        kept.iter()
            .find(|(at, s)| {
                s.resource_version == resource_version
                    && s.namespace.as_deref() == namespace
                    && now.duration_since(*at) < SNAPSHOT_TTL
            })
            .map(|(_, s)| Arc::clone(s))
    }

    /// Starts a watch of `namespace` (all when `None`): from `from` (the events after it, out
    /// of the window), or, when `from` is `None`, with an `ADDED` line per current pod.
    pub fn watch(&self, namespace: Option<&str>, from: Option<u64>) -> Result<WatchStart, Status> {
        let state = self.read();
        // Subscribing under the read lock: publish holds the write lock, so the receiver gets
        // exactly the events after `state.resource_version`.
        let live = self.live.subscribe();
        let backlog = match from {
            None => Backlog::Added(select(&state, namespace).cloned().collect()),
            Some(from) if from > state.resource_version => {
                return Err(Status::too_large(from, state.resource_version));
            }
            Some(from) if from < state.oldest => {
                return Err(Status::expired(format!(
                    "too old resource version: {from} ({})",
                    state.oldest
                )));
            }
            Some(from) => {
                // Event `n` sits at index `n - oldest - 1`.
                let skip = (from - state.oldest) as usize;
                Backlog::Events(
                    state
                        .window
                        .iter()
                        .skip(skip)
                        .filter(|e| namespace.is_none_or(|ns| *e.namespace == *ns))
                        .map(|e| e.line.clone())
                        .collect(),
                )
            }
        };
        Ok(WatchStart {
            backlog,
            resource_version: state.resource_version,
            live,
        })
    }
}

fn same_view(a: &Snapshot, b: &Snapshot) -> bool {
    a.resource_version == b.resource_version && a.namespace == b.namespace
}

fn select<'a>(
    state: &'a State,
    namespace: Option<&'a str>,
) -> impl Iterator<Item = &'a Arc<StoredPod>> + 'a {
    state
        .pods
        .values()
        .filter(move |pod| namespace.is_none_or(|ns| *pod.namespace == *ns))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::objects::{pod_json, PodState};

    fn change(kind: EventType, i: u32, rv: u64) -> Change {
        let (namespace, name) = (format!("ns-{}", i % 2), format!("pod-{i}"));
        let json = pod_json(&PodState {
            namespace: &namespace,
            name: &name,
            node: None,
            id: i,
            incarnation: 0,
            version: rv,
            resource_version: rv,
            created: 0,
        });
        Change::new(kind, namespace.into(), name.into(), rv, &json)
    }

    #[test]
    fn watches_resume_inside_the_window_and_expire_before_it() {
        let store = Store::new(Vec::new(), 10, 3);
        store.publish(
            (11..=15)
                .map(|rv| change(EventType::Added, rv as u32, rv))
                .collect(),
        );
        assert_eq!(store.resource_version(), 15);
        assert_eq!(store.oldest(), 12, "events 13..=15 are kept");
        assert_eq!(store.len(), 5);

        let start = store.watch(None, Some(13)).unwrap();
        assert_eq!(start.backlog.len(), 2, "events 14 and 15");
        assert_eq!(start.resource_version, 15);
        let start = store.watch(Some("ns-1"), Some(12)).unwrap();
        assert_eq!(start.backlog.len(), 2, "events 13 and 15 are in ns-1");
        assert_eq!(store.watch(None, Some(11)).unwrap_err().code, 410);
        assert_eq!(store.watch(None, Some(16)).unwrap_err().code, 504);
        assert_eq!(store.watch(None, None).unwrap().backlog.len(), 5);

        let mut live = store.watch(None, Some(15)).unwrap().live;
        store.publish(vec![change(EventType::Deleted, 11, 16)]);
        assert_eq!(live.try_recv().unwrap().resource_version, 16);
        assert!(store.get("ns-1", "pod-11").is_none());
        assert_eq!(store.snapshot(Some("ns-0")).pods.len(), 2);
    }

    #[test]
    fn publications_are_recorded_per_batch_only_when_asked() {
        let store = Store::new(Vec::new(), 10, 100);
        store.publish(vec![change(EventType::Added, 1, 11)]);
        assert!(store.publications().is_empty(), "off by default");

        store.record_publications();
        let before = unix_nanos();
        store.publish(
            (12..=14)
                .map(|rv| change(EventType::Added, rv as u32, rv))
                .collect(),
        );
        store.publish(Vec::new());
        store.publish(vec![change(EventType::Modified, 12, 15)]);
        let after = unix_nanos();
        let log = store.publications();
        assert_eq!(
            log.iter().map(|&(rv, _)| rv).collect::<Vec<_>>(),
            [12, 15],
            "one entry per non-empty batch, by its first version"
        );
        assert!(log.windows(2).all(|w| w[0].1 <= w[1].1));
        assert!(log.iter().all(|&(_, at)| before <= at && at <= after));
    }
}
