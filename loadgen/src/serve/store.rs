//! The pods as `loadgen serve` holds them: the engine's simulated API server
//! ([`kcache_sim::apiserver`], the same one behind the in-memory `ListerWatcher`) with
//! pods keyed by namespace and name, each event serialised once.
//!
//! The engine's server keeps the resource version, the current pods, the window of recent
//! events (and its `410 Expired`), the snapshots of paged lists, and the fan-out to every open
//! watch. What this module adds is what only the HTTP server needs: the pods' encodings (an
//! event's JSON line is written once, by the first JSON reader, and every watch sends the same
//! bytes, the stored pod being a slice of it; the protobuf frame is written once, by the first
//! protobuf reader, and shared the same way), namespaces as list and watch views, and the
//! timeline of publications.
//!
//! Resource versions count events: event `n` has resource version `n`, so the window's events
//! are contiguous. A client's writes (`serve --writes`, [`Store::write`]) are events in the same
//! log, their pods held whole (typed) rather than as a template's fields; the churn's events
//! take the versions that come next, whatever writes came between.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use kcache_sim::apiserver::{self, ApiServer, ContinueError, Kind, Pager, Start};

use k8s_openapi::api::core::v1::Pod;
use prost::Message;

use super::convert::written_pod;
use super::encode::{pod_protobuf, write_pod_json, PodFields};
use super::objects::{event_line, EventType, Status, POD_HEAD};
use super::protobuf::ProtobufPod;
use crate::sync::lock;

/// Now, in nanoseconds since the Unix epoch: the clock the server and its clients' processes
/// share, so a lag can run from one process to another.
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A pod as the server holds it, with the watch line of the event that made it.
#[derive(Debug)]
pub struct StoredPod {
    /// `metadata.namespace`.
    pub namespace: Arc<str>,
    /// `metadata.name`.
    pub name: Arc<str>,
    /// `metadata.resourceVersion`.
    pub resource_version: u64,
    /// What made this state.
    pub kind: EventType,
    /// What the encodings are written from.
    source: Source,
    /// The JSON forms, written by the first JSON reader and then shared by all.
    json: OnceLock<JsonPod>,
    /// The protobuf forms, written by the first protobuf reader and then shared by all.
    protobuf: OnceLock<ProtobufPod>,
}

/// What a stored pod's encodings are written from.
#[derive(Debug)]
enum Source {
    /// The churn's pods: a template's varying fields.
    Churn(PodFields),
    /// A pod a client wrote (`serve --writes`), whole, its metadata already the server's.
    Written(Box<Pod>),
}

/// A pod's JSON forms: one buffer, `{"type":…,"object":…}\n`, the event line every watch
/// sends, with the object and its `metadata` as slices of it.
#[derive(Debug)]
struct JsonPod {
    line: Bytes,
    object: std::ops::Range<usize>,
    metadata: std::ops::Range<usize>,
}

impl JsonPod {
    /// Written in one buffer: the event's head, the pod, the event's tail.
    fn new(kind: EventType, source: &Source) -> Self {
        let (line, object, metadata) = event_line(kind, |out| match source {
            Source::Churn(fields) => write_pod_json(out, &fields.state()),
            Source::Written(pod) => write_written_json(out, pod),
        });
        Self {
            line,
            object,
            metadata,
        }
    }
}

impl StoredPod {
    /// The pod with `fields`, made by a `kind` event; its encodings are written when first
    /// asked for, once per format, so a server whose watchers all read protobuf never writes
    /// JSON and the other way round.
    pub fn new(kind: EventType, fields: PodFields) -> StoredPod {
        StoredPod {
            namespace: Arc::clone(&fields.namespace),
            name: Arc::clone(&fields.name),
            resource_version: fields.resource_version,
            kind,
            source: Source::Churn(fields),
            json: OnceLock::new(),
            protobuf: OnceLock::new(),
        }
    }

    /// A pod a client wrote, made by a `kind` event at `resource_version`, which becomes its
    /// `metadata.resourceVersion`.
    fn written(kind: EventType, mut pod: Pod, resource_version: u64) -> StoredPod {
        pod.metadata.resource_version = Some(resource_version.to_string());
        StoredPod {
            namespace: pod.metadata.namespace.as_deref().unwrap_or_default().into(),
            name: pod.metadata.name.as_deref().unwrap_or_default().into(),
            resource_version,
            kind,
            source: Source::Written(Box::new(pod)),
            json: OnceLock::new(),
            protobuf: OnceLock::new(),
        }
    }

    /// This pod as a `kind` event at `resource_version` makes it (a churn's event published
    /// after writes took the versions it expected, or a deletion's last state).
    fn at(&self, kind: EventType, resource_version: u64) -> StoredPod {
        match &self.source {
            Source::Churn(fields) => StoredPod::new(
                kind,
                PodFields {
                    resource_version,
                    ..fields.clone()
                },
            ),
            Source::Written(pod) => StoredPod::written(kind, (**pod).clone(), resource_version),
        }
    }

    fn json(&self) -> &JsonPod {
        self.json
            .get_or_init(|| JsonPod::new(self.kind, &self.source))
    }

    /// `{"type":…,"object":…}\n`: the event that made this state, as every watch sends it
    /// (for the initial population, which had no event, an `ADDED`).
    pub fn line(&self) -> &[u8] {
        &self.json().line
    }

    /// The serialised pod, `kind` and `apiVersion` included.
    pub fn object(&self) -> &[u8] {
        let json = self.json();
        &json.line[json.object.clone()]
    }

    /// [`object`](Self::object), shared rather than copied.
    pub fn object_bytes(&self) -> Bytes {
        let json = self.json();
        json.line.slice(json.object.clone())
    }

    /// The pod as a list item: without `kind` and `apiVersion`, which the list carries once.
    pub fn list_item(&self) -> &[u8] {
        // The object starts with POD_HEAD, which ends with the comma after `kind`; what
        // follows is the rest of the object, so `{` + rest is the object without the two.
        &self.object()[POD_HEAD.len()..]
    }

    /// The protobuf forms (the event's frame, the pod's body, the bare pod), encoded by the
    /// first caller and shared after.
    pub fn protobuf(&self) -> &ProtobufPod {
        self.protobuf.get_or_init(|| {
            let message = match &self.source {
                Source::Churn(fields) => pod_protobuf(&fields.state()),
                Source::Written(pod) => written_pod(pod).encode_to_vec(),
            };
            ProtobufPod::new(self.kind.as_str(), &message)
        })
    }

    /// The pod's `metadata` object, as JSON.
    pub fn metadata_json(&self) -> &[u8] {
        let json = self.json();
        &json.line[json.metadata.clone()]
    }

    /// The fields a churn's pod was written from (`None` for a pod a client wrote).
    pub fn fields(&self) -> Option<&PodFields> {
        match &self.source {
            Source::Churn(fields) => Some(fields),
            Source::Written(_) => None,
        }
    }

    /// The pod as a typed object, for a write that starts from it (a patch, an update).
    pub fn typed(&self) -> Result<Pod, Status> {
        match &self.source {
            Source::Written(pod) => Ok((**pod).clone()),
            // The churn's JSON is held to the typed encoder by encode.rs' tests, so this only
            // fails if those fail.
            Source::Churn(_) => serde_json::from_slice(self.object()).map_err(|e| {
                Status::internal_error(format!("the stored pod does not decode: {e}"))
            }),
        }
    }

    fn in_namespace(&self, namespace: Option<&str>) -> bool {
        namespace.is_none_or(|ns| *self.namespace == *ns)
    }
}

/// A written pod as JSON, as `k8s-openapi` serialises it (apiVersion, kind, metadata, spec,
/// status), appended to `out`; returns where its `metadata` object is.
fn write_written_json(out: &mut Vec<u8>, pod: &Pod) -> std::ops::Range<usize> {
    out.extend_from_slice(POD_HEAD);
    out.extend_from_slice(br#""metadata":"#);
    let start = out.len();
    // Writing typed values into a Vec cannot fail.
    serde_json::to_writer(&mut *out, &pod.metadata).expect("metadata serialises");
    let metadata = start..out.len();
    if let Some(spec) = &pod.spec {
        out.extend_from_slice(br#","spec":"#);
        serde_json::to_writer(&mut *out, spec).expect("a pod spec serialises");
    }
    if let Some(status) = &pod.status {
        out.extend_from_slice(br#","status":"#);
        serde_json::to_writer(&mut *out, status).expect("a pod status serialises");
    }
    out.push(b'}');
    metadata
}

/// What a write does to a pod, decided under the store's lock from its current state.
#[derive(Debug)]
pub enum Write {
    /// Store this pod (created if there was none, else modified).
    Put(Box<Pod>),
    /// Delete the current pod.
    Delete,
    /// Leave the pod as it is (an update that changes nothing): no new version, no event.
    Keep,
}

/// An event the churn prepared, ready to publish.
#[derive(Debug)]
pub struct Change {
    /// What happened.
    pub kind: EventType,
    /// The pod after the change (for a deletion: its last state, at the deletion's version).
    pub pod: Arc<StoredPod>,
}

impl Change {
    /// The `kind` event of the pod with `fields`.
    pub fn new(kind: EventType, fields: PodFields) -> Change {
        Change {
            kind,
            pod: Arc::new(StoredPod::new(kind, fields)),
        }
    }
}

/// How long a paged list's snapshot stays available to its `continue` tokens (the real server
/// keeps etcd's history for 5 minutes).
const SNAPSHOT_TTL: Duration = Duration::from_secs(300);
/// How many paged lists can be in progress at once before the oldest loses its snapshot.
const SNAPSHOTS: usize = 64;

/// A pod's key: namespace, name (the order of a list).
type PodKey = (Arc<str>, Arc<str>);
/// What a list or a watch selects: one namespace, or all.
type View = Option<Arc<str>>;

/// The pods of one namespace (or all) at one resource version, in key order.
#[derive(Debug)]
pub struct Snapshot {
    /// The resource version it describes.
    pub resource_version: u64,
    /// The namespace it is limited to.
    pub namespace: Option<Arc<str>>,
    /// The pods.
    pub pods: Vec<Arc<StoredPod>>,
}

/// One page of a list.
pub type Page = apiserver::Paged<Arc<StoredPod>, View>;
/// A watch that started: the initial pods (for a watch with initial events), then its cursor.
pub type WatchStart = apiserver::WatchStart<Arc<StoredPod>>;

/// The server's state (see the module documentation).
pub struct Store {
    server: ApiServer<PodKey, Arc<StoredPod>>,
    pager: Pager<Arc<StoredPod>, View>,
    /// When each batch was published, if asked for (see [`Store::record_publications`]).
    publications: Mutex<Option<Vec<Publication>>>,
}

/// A batch of events handed to the watches: the first resource version in it, and the moment
/// (Unix nanoseconds) just before the first of them became visible.
pub type Publication = (u64, u64);

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A store holding `initial` (the population present at start, which needs no events) at
    /// `resource_version`, keeping the last `window` events (at least 1).
    pub fn new(initial: Vec<Arc<StoredPod>>, resource_version: u64, window: usize) -> Self {
        let pods = initial
            .into_iter()
            .map(|pod| ((pod.namespace.clone(), pod.name.clone()), pod));
        Self {
            server: ApiServer::new(pods, resource_version, window),
            pager: Pager::new(SNAPSHOTS, Some(SNAPSHOT_TTL)),
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

    /// How many recent events it keeps.
    pub fn window(&self) -> usize {
        self.server.window()
    }

    /// The newest resource version.
    pub fn resource_version(&self) -> u64 {
        self.server.resource_version()
    }

    /// The oldest resource version a watch can start from.
    pub fn oldest(&self) -> u64 {
        self.server.oldest()
    }

    /// How many pods exist.
    pub fn len(&self) -> usize {
        self.server.len()
    }

    /// Whether no pod exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Applies `changes` (consecutive resource versions after the current one) and hands them
    /// to every watch, as one batch.
    pub fn publish(&self, changes: Vec<Change>) {
        self.publish_late(changes, Duration::ZERO);
    }

    /// [`Self::publish`] for a batch whose first event was due `late` ago: its publication is
    /// recorded as of then.
    pub fn publish_late(&self, changes: Vec<Change>, late: Duration) {
        if changes.is_empty() {
            return;
        }
        self.server.write(|w| {
            if let Some(log) = lock(&self.publications).as_mut() {
                // Stamped under the server's lock, before any of the batch is visible, so a
                // lag measured from it is never short.
                let at = unix_nanos().saturating_sub(late.as_nanos() as u64);
                log.push((w.resource_version() + 1, at));
            }
            for change in changes {
                let key = (change.pod.namespace.clone(), change.pod.name.clone());
                // The churn numbers its events as if it were the only writer; a client's
                // writes (`--writes`) take versions too, so an event whose version was taken
                // is written again at the version it gets.
                let next = w.resource_version() + 1;
                let pod = if change.pod.resource_version == next {
                    change.pod
                } else {
                    Arc::new(change.pod.at(change.kind, next))
                };
                w.push(key, kind_of(change.kind), pod);
            }
        });
    }

    /// A client's write of the pod `namespace/name`: `decide` sees its current state and the
    /// resource version the write will get, and says what to do (or refuses with a `Status`),
    /// all under the lock that orders writes, so a precondition it checks still holds when the
    /// write is applied. Returns the pod the event carries (its `kind` says whether it was
    /// created; for a deletion, the pod's last state at the deletion's version). With
    /// `dry_run`, the same answer, nothing stored.
    pub fn write(
        &self,
        namespace: &str,
        name: &str,
        dry_run: bool,
        decide: impl FnOnce(Option<&Arc<StoredPod>>, u64) -> Result<Write, Status>,
    ) -> Result<Arc<StoredPod>, Status> {
        let key: PodKey = (namespace.into(), name.into());
        self.server.write(|w| {
            let next = w.resource_version() + 1;
            let current = w.get(&key).cloned();
            let (kind, pod) = match decide(current.as_ref(), next)? {
                Write::Keep => {
                    return current.ok_or_else(|| Status::pod_not_found(name));
                }
                Write::Put(pod) => {
                    let kind = match current {
                        None => EventType::Added,
                        Some(_) => EventType::Modified,
                    };
                    (kind, StoredPod::written(kind, *pod, next))
                }
                Write::Delete => match current {
                    Some(current) => (EventType::Deleted, current.at(EventType::Deleted, next)),
                    None => return Err(Status::pod_not_found(name)),
                },
            };
            let pod = Arc::new(pod);
            if !dry_run {
                w.push(key, kind_of(kind), Arc::clone(&pod));
            }
            Ok(pod)
        })
    }

    /// One pod.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<StoredPod>> {
        let key: PodKey = (namespace.into(), name.into());
        self.server.get(&key)
    }

    /// The pods of `namespace` (all when `None`) now.
    pub fn snapshot(&self, namespace: Option<&str>) -> Snapshot {
        let snapshot = self
            .server
            .snapshot(namespace.map(Arc::from), |pod| pod.in_namespace(namespace));
        Snapshot {
            resource_version: snapshot.resource_version,
            namespace: snapshot.view,
            pods: snapshot.items,
        }
    }

    /// The first page of a list of `namespace` (all when `None`) now, at most `limit` pods
    /// (0: all).
    pub fn first_page(&self, namespace: Option<&str>, limit: usize) -> Page {
        let snapshot = self
            .server
            .snapshot(namespace.map(Arc::from), |pod| pod.in_namespace(namespace));
        self.pager.first(snapshot, limit)
    }

    /// The page of a list of `namespace` that `token` continues.
    pub fn next_page(
        &self,
        token: &str,
        namespace: Option<&str>,
        limit: usize,
    ) -> Result<Page, ContinueError> {
        self.pager.next(token, &namespace.map(Arc::from), limit)
    }

    /// Starts a watch of `namespace` (all when `None`): from `from` (the events after it, out
    /// of the window), or, when `from` is `None`, with the current pods first.
    pub fn watch(&self, namespace: Option<&str>, from: Option<u64>) -> Result<WatchStart, Status> {
        let start = match from {
            None => Start::Initial,
            Some(from) => {
                // Versions only grow: one not too large now is not too large below.
                let current = self.server.resource_version();
                if from > current {
                    return Err(Status::too_large(from, current));
                }
                Start::After(from)
            }
        };
        self.server
            .watch(start, false, |pod| pod.in_namespace(namespace))
            .map_err(|too_old| Status::expired(too_old.to_string()))
    }
}

fn kind_of(kind: EventType) -> Kind {
    match kind {
        EventType::Added => Kind::Added,
        EventType::Modified => Kind::Modified,
        EventType::Deleted => Kind::Deleted,
    }
}

/// A change of a minimal pod `pod-<i>` in namespace `ns-<i % 2>`, for the unit tests of the
/// store and the watches.
#[cfg(test)]
pub(crate) fn test_change(kind: EventType, i: u32, version: u64, rv: u64) -> Change {
    Change::new(
        kind,
        PodFields {
            namespace: format!("ns-{}", i % 2).into(),
            name: format!("pod-{i}").into(),
            node: None,
            id: i,
            incarnation: 0,
            version,
            resource_version: rv,
            created: 0,
            profile: workloads::PodProfile::Minimal,
            revision: Default::default(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kcache_sim::apiserver::Item;

    fn change(kind: EventType, i: u32, rv: u64) -> Change {
        test_change(kind, i, rv, rv)
    }

    /// One add per resource version in `rvs`, of the pod numbered as its version.
    fn added(rvs: std::ops::RangeInclusive<u64>) -> Vec<Change> {
        rvs.map(|rv| change(EventType::Added, rv as u32, rv))
            .collect()
    }

    #[test]
    fn watches_resume_inside_the_window_and_expire_before_it() {
        let store = Store::new(Vec::new(), 10, 3);
        store.publish(added(11..=15));
        assert_eq!(store.resource_version(), 15);
        assert_eq!(store.oldest(), 12, "events 13..=15 are kept");
        assert_eq!(store.len(), 5);

        let mut start = store.watch(None, Some(13)).unwrap();
        let replay: Vec<u64> = std::iter::from_fn(|| start.cursor.try_next())
            .map(|item| match item {
                Item::Event(e) => e.resource_version,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(replay, [14, 15]);
        assert_eq!(store.watch(None, Some(11)).unwrap_err().code, 410);
        assert_eq!(store.watch(None, Some(16)).unwrap_err().code, 504);
        assert_eq!(store.watch(None, None).unwrap().initial.len(), 5);
        assert_eq!(store.watch(Some("ns-1"), None).unwrap().initial.len(), 3);

        store.publish(vec![change(EventType::Deleted, 11, 16)]);
        assert!(matches!(
            start.cursor.try_next(),
            Some(Item::Event(e)) if e.resource_version == 16
        ));
        assert!(store.get("ns-1", "pod-11").is_none());
        assert_eq!(store.snapshot(Some("ns-0")).pods.len(), 2);
    }

    #[test]
    fn a_written_pod_is_what_serde_writes_and_the_churn_moves_past_its_version() {
        let store = Store::new(Vec::new(), 10, 100);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w", "namespace": "ns-0", "labels": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap();
        let written = store
            .write("ns-0", "w", false, |current, next| {
                assert!(current.is_none());
                assert_eq!(next, 11);
                Ok(Write::Put(Box::new(pod)))
            })
            .unwrap();
        assert_eq!(
            (written.kind, written.resource_version),
            (EventType::Added, 11)
        );
        let typed = written.typed().unwrap();
        assert_eq!(written.object(), &serde_json::to_vec(&typed).unwrap()[..]);
        let metadata: serde_json::Value = serde_json::from_slice(written.metadata_json()).unwrap();
        assert_eq!(metadata["resourceVersion"], "11");
        assert!(!written.protobuf().frame().is_empty());

        // The churn numbered its next event 11 too: it is published at 12.
        store.publish(vec![change(EventType::Added, 1, 11)]);
        assert_eq!(store.resource_version(), 12);
        let churned = store.get("ns-1", "pod-1").unwrap();
        assert_eq!(churned.resource_version, 12);
        let json: serde_json::Value = serde_json::from_slice(churned.object()).unwrap();
        assert_eq!(json["metadata"]["resourceVersion"], "12");

        let deleted = store
            .write("ns-0", "w", false, |_, _| Ok(Write::Delete))
            .unwrap();
        assert_eq!(
            (deleted.kind, deleted.resource_version),
            (EventType::Deleted, 13)
        );
        assert!(store.get("ns-0", "w").is_none());
        let dry = store.write("ns-1", "pod-1", true, |_, _| Ok(Write::Delete));
        assert_eq!(dry.unwrap().resource_version, 14);
        assert_eq!(store.resource_version(), 13, "a dry run stores nothing");
        assert!(store.get("ns-1", "pod-1").is_some());
    }

    #[test]
    fn pages_are_per_namespace_and_tokens_are_checked() {
        let store = Store::new(Vec::new(), 0, 100);
        store.publish(added(1..=6));
        let first = store.first_page(Some("ns-1"), 2);
        assert_eq!(first.items().len(), 2);
        let token = first.continue_token.clone().unwrap();
        assert_eq!(token, "6-2");
        let rest = store.next_page(&token, Some("ns-1"), 2).unwrap();
        assert_eq!((rest.items().len(), rest.continue_token), (1, None));
        assert_eq!(
            store.next_page(&token, None, 2).unwrap_err(),
            ContinueError::Expired,
            "another namespace's snapshot"
        );
        assert_eq!(
            store.next_page("junk", Some("ns-1"), 2).unwrap_err(),
            ContinueError::Malformed
        );
    }

    #[test]
    fn encodings_are_written_on_first_use_and_shared_after() {
        let store = Store::new(Vec::new(), 0, 100);
        store.publish(vec![change(EventType::Added, 1, 1)]);
        let pod = store.get("ns-1", "pod-1").expect("published");
        assert!(pod.json.get().is_none() && pod.protobuf.get().is_none());
        let line = pod.line().as_ptr();
        assert!(pod
            .line()
            .starts_with(br#"{"type":"ADDED","object":{"apiVersion":"v1""#));
        assert_eq!(pod.line().as_ptr(), line, "written once");
        assert!(pod.protobuf.get().is_none(), "JSON alone was asked for");
        assert!(!pod.protobuf().frame().is_empty());
        let body = pod.object_bytes();
        assert_eq!(&body[..], pod.object());
        assert!(pod.line()[..].windows(body.len()).any(|w| w == &body[..]));
    }

    #[test]
    fn publications_are_recorded_per_batch_only_when_asked() {
        let store = Store::new(Vec::new(), 10, 100);
        store.publish(vec![change(EventType::Added, 1, 11)]);
        assert!(store.publications().is_empty(), "off by default");

        store.record_publications();
        let before = unix_nanos();
        store.publish(added(12..=14));
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

    #[test]
    fn a_late_batch_is_stamped_as_of_when_it_was_due() {
        let store = Store::new(Vec::new(), 10, 100);
        store.record_publications();
        let late = Duration::from_secs(5);
        let before = unix_nanos();
        store.publish_late(vec![change(EventType::Added, 1, 11)], late);
        let after = unix_nanos();
        let late = late.as_nanos() as u64;
        let [(rv, at)] = store.publications()[..] else {
            panic!("one batch")
        };
        assert_eq!(rv, 11);
        assert!(before - late <= at && at <= after - late, "{at}");
    }
}
