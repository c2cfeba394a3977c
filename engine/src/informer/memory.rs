//! An in-memory API server for one resource, as a [`ListerWatcher`]: what tests and the load
//! generator drive an informer with.
//!
//! It keeps what a Kubernetes API server's watch cache keeps: the current objects, a resource
//! version that every write increments, and a bounded window of recent events. A watch from a
//! version still in the window replays what came after it and then follows live writes; a
//! watch from an older version gets `410 Expired`, as from the real server (an `Error` event,
//! then the end of the stream). Lists are paged with `continue` tokens over a snapshot taken by
//! the first page, so the pages of one list are consistent with each other.
//!
//! Scripting hooks make the failures an informer must survive happen on demand: end every open
//! watch, answer 410 to the next watches, fail the next lists or watches as a refused
//! connection would, go down for a while (writes go on unseen), forget the window, slow every
//! call down.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tokio::sync::mpsc;
use tokio::time::Sleep;

use super::lister_watcher::{
    Error, ListOptions, ListerWatcher, Page, Status, Versioned, WatchEvent, WatchOptions,
    WatchStream,
};
use crate::key::{Key, KeyError, KeyFn};

/// What the in-memory server needs to stamp objects: setting the resource version of a write.
pub trait SetResourceVersion: Versioned {
    /// Sets the object's resource version.
    fn set_resource_version(&mut self, resource_version: &str);
}

/// How many events the window keeps by default (the API server's watch cache keeps about as
/// many per resource).
pub const DEFAULT_WINDOW: usize = 1000;

/// How many unfinished paged lists the server remembers; an older `continue` token is expired.
const MAX_SNAPSHOTS: usize = 16;

/// An in-memory [`ListerWatcher`]; clones share one server.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use kcache::informer::{ListerWatcher, ListOptions, MemoryListerWatcher, SetResourceVersion, Versioned};
/// use kcache::Key;
///
/// #[derive(Clone, Debug)]
/// struct Pod { name: String, rv: String }
/// impl Versioned for Pod { fn resource_version(&self) -> &str { &self.rv } }
/// impl SetResourceVersion for Pod { fn set_resource_version(&mut self, rv: &str) { self.rv = rv.into() } }
///
/// let server = MemoryListerWatcher::new(Arc::new(|p: &Pod| Ok(Key::new(&p.name))));
/// server.upsert(Pod { name: "a".into(), rv: String::new() }).unwrap();
/// server.upsert(Pod { name: "b".into(), rv: String::new() }).unwrap();
/// let page = server.list(ListOptions { limit: 1, ..Default::default() }).await.unwrap();
/// assert_eq!((page.items.len(), page.resource_version.as_str()), (1, "2"));
/// let rest = server
///     .list(ListOptions { limit: 1, continue_token: page.continue_token, ..Default::default() })
///     .await
///     .unwrap();
/// assert_eq!(rest.items[0].name, "b");
/// assert!(rest.continue_token.is_none());
/// # });
/// ```
pub struct MemoryListerWatcher<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for MemoryListerWatcher<T> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<T> {
    key_fn: KeyFn<T>,
    state: Mutex<State<T>>,
}

type EventTx<T> = mpsc::UnboundedSender<Result<WatchEvent<T>, Error>>;

struct Watcher<T> {
    tx: EventTx<T>,
    bookmarks: bool,
}

/// A paged list in progress: the objects as of the first page.
struct Snapshot<T> {
    id: u64,
    resource_version: u64,
    items: Arc<Vec<Arc<T>>>,
}

/// Failures scripted to happen on the next calls.
#[derive(Debug, Default)]
struct Faults {
    fail_lists: usize,
    fail_watches: usize,
    expire_watches: usize,
    /// Every list and watch fails as a refused connection until this is cleared.
    unavailable: bool,
    latency: Duration,
}

struct State<T> {
    /// The newest resource version; every write increments it.
    resource_version: u64,
    /// Current objects, sorted by key (the order of a list).
    objects: BTreeMap<Key, Arc<T>>,
    /// The newest events, oldest first, each with its resource version.
    window: VecDeque<(u64, WatchEvent<T>)>,
    window_size: usize,
    /// Every event after this version is in `window`: a watch from an older one is too old.
    compacted: u64,
    watchers: Vec<Watcher<T>>,
    snapshots: VecDeque<Snapshot<T>>,
    next_snapshot: u64,
    faults: Faults,
    list_calls: u64,
    watch_calls: u64,
}

impl<T> State<T> {
    /// Records an event at the current version and sends it to every watcher.
    fn publish(&mut self, event: WatchEvent<T>) {
        let rv = self.resource_version;
        self.watchers
            .retain(|w| w.tx.send(Ok(event.clone())).is_ok());
        self.window.push_back((rv, event));
        while self.window.len() > self.window_size {
            if let Some((dropped, _)) = self.window.pop_front() {
                self.compacted = dropped;
            }
        }
    }
}

fn bad_request(message: String) -> Error {
    Error::Api(Status::new(400, "BadRequest", message))
}

/// Parses a resource version: `None` for `""` and `"0"` (no particular version).
fn parse_resource_version(rv: &str) -> Result<Option<u64>, Error> {
    match rv {
        "" | "0" => Ok(None),
        _ => rv
            .parse()
            .map(Some)
            .map_err(|_| bad_request(format!("invalid resource version {rv:?}: not a number"))),
    }
}

fn injected_connection_refused(what: &str) -> Error {
    Error::Transport(format!("{what}: connection refused (injected)"))
}

impl<T: SetResourceVersion + Clone + Send + Sync + 'static> MemoryListerWatcher<T> {
    /// An empty server whose objects are keyed by `key_fn`, with a window of
    /// [`DEFAULT_WINDOW`] events.
    pub fn new(key_fn: KeyFn<T>) -> Self {
        Self::with_window(key_fn, DEFAULT_WINDOW)
    }

    /// An empty server that keeps the newest `window` events (at least 1).
    pub fn with_window(key_fn: KeyFn<T>, window: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                key_fn,
                state: Mutex::new(State {
                    resource_version: 0,
                    objects: BTreeMap::new(),
                    window: VecDeque::new(),
                    window_size: window.max(1),
                    compacted: 0,
                    watchers: Vec::new(),
                    snapshots: VecDeque::new(),
                    next_snapshot: 0,
                    faults: Faults::default(),
                    list_calls: 0,
                    watch_calls: 0,
                }),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State<T>> {
        // A panic while the lock is held cannot leave the state half-written: every write
        // completes before anything that can panic runs.
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Creates or replaces an object: stamps it with the next resource version and sends
    /// `Added` (new key) or `Modified` to every watcher. Returns the stored object.
    pub fn upsert(&self, mut obj: T) -> Result<Arc<T>, KeyError> {
        let key = (self.inner.key_fn)(&obj)?;
        let mut state = self.state();
        state.resource_version += 1;
        obj.set_resource_version(&state.resource_version.to_string());
        let obj = Arc::new(obj);
        let event = match state.objects.insert(key, Arc::clone(&obj)) {
            None => WatchEvent::Added(Arc::clone(&obj)),
            Some(_) => WatchEvent::Modified(Arc::clone(&obj)),
        };
        state.publish(event);
        Ok(obj)
    }

    /// Deletes `key`: the `Deleted` event carries its last state stamped with the deletion's
    /// resource version, as the API server sends it. Returns that, or `None` if there was no
    /// such object (then nothing happens).
    pub fn delete(&self, key: &Key) -> Option<Arc<T>> {
        let mut state = self.state();
        let old = state.objects.remove(key)?;
        state.resource_version += 1;
        let mut last = (*old).clone();
        last.set_resource_version(&state.resource_version.to_string());
        let last = Arc::new(last);
        state.publish(WatchEvent::Deleted(Arc::clone(&last)));
        Some(last)
    }

    /// Sends a bookmark at the current resource version to every watch that allows them.
    pub fn bookmark(&self) {
        let mut state = self.state();
        let resource_version = state.resource_version.to_string();
        state.watchers.retain(|w| {
            !w.bookmarks
                || w.tx
                    .send(Ok(WatchEvent::Bookmark {
                        resource_version: resource_version.clone(),
                    }))
                    .is_ok()
        });
    }

    /// Ends every open watch (their streams end after what was already sent).
    pub fn close_watches(&self) {
        self.state().watchers.clear();
    }

    /// The next `n` watches get `410 Expired` whatever version they ask for.
    pub fn expire_next_watches(&self, n: usize) {
        self.state().faults.expire_watches += n;
    }

    /// How many of the 410s scripted by [`expire_next_watches`](Self::expire_next_watches) no
    /// watch has received yet.
    pub fn expired_watches_pending(&self) -> usize {
        self.state().faults.expire_watches
    }

    /// The next `n` lists fail as a refused connection.
    pub fn fail_next_lists(&self, n: usize) {
        self.state().faults.fail_lists += n;
    }

    /// The next `n` watches fail to open as a refused connection.
    pub fn fail_next_watches(&self, n: usize) {
        self.state().faults.fail_watches += n;
    }

    /// Takes the server down (`true`: every list and watch call fails as a refused connection,
    /// and the open watches end) or brings it back (`false`). Writes go on while it is down:
    /// no watch sees them, so a client learns of them only from its next list (or from a
    /// watch that resumes from a version still in the window). Scripted failures counted by
    /// the other hooks wait for the server to be back.
    pub fn set_unavailable(&self, down: bool) {
        let mut state = self.state();
        state.faults.unavailable = down;
        if down {
            state.watchers.clear();
        }
    }

    /// Every later list and watch call waits this long before it is served.
    pub fn set_latency(&self, latency: Duration) {
        self.state().faults.latency = latency;
    }

    /// Forgets the event window: a watch from any version older than the current one gets
    /// `410 Expired` (as after the API server's watch cache moved on).
    pub fn compact(&self) {
        let mut state = self.state();
        state.window.clear();
        state.compacted = state.resource_version;
    }

    /// The current resource version.
    pub fn resource_version(&self) -> String {
        self.state().resource_version.to_string()
    }

    /// The current objects, sorted by key.
    pub fn objects(&self) -> Vec<Arc<T>> {
        self.state().objects.values().cloned().collect()
    }

    /// The current object of `key`.
    pub fn get(&self, key: &Key) -> Option<Arc<T>> {
        self.state().objects.get(key).cloned()
    }

    /// How many objects exist.
    pub fn len(&self) -> usize {
        self.state().objects.len()
    }

    /// Whether no object exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many list calls (pages) were made, failed ones included.
    pub fn list_calls(&self) -> u64 {
        self.state().list_calls
    }

    /// How many watch calls were made, failed ones included.
    pub fn watch_calls(&self) -> u64 {
        self.state().watch_calls
    }

    /// How many watches are open.
    pub fn open_watches(&self) -> usize {
        let mut state = self.state();
        state.watchers.retain(|w| !w.tx.is_closed());
        state.watchers.len()
    }

    async fn delay(&self) {
        let latency = self.state().faults.latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    fn serve_list(&self, options: ListOptions) -> Result<Page<T>, Error> {
        let mut state = self.state();
        state.list_calls += 1;
        if state.faults.unavailable {
            return Err(injected_connection_refused("list"));
        }
        if state.faults.fail_lists > 0 {
            state.faults.fail_lists -= 1;
            return Err(injected_connection_refused("list"));
        }
        let (id, rv, items, offset): (u64, u64, Arc<Vec<Arc<T>>>, usize) = match &options
            .continue_token
        {
            Some(token) => {
                let parsed = token
                    .split_once(':')
                    .and_then(|(id, offset)| Some((id.parse().ok()?, offset.parse().ok()?)));
                let Some((id, offset)) = parsed else {
                    return Err(bad_request(format!("malformed continue token {token:?}")));
                };
                let Some(snapshot) = state.snapshots.iter().find(|s| s.id == id) else {
                    return Err(Error::Api(Status::expired(
                        "the provided continue parameter is too old to display a consistent list",
                    )));
                };
                let (rv, items) = (snapshot.resource_version, Arc::clone(&snapshot.items));
                (id, rv, items, offset)
            }
            None => {
                let current = state.resource_version;
                if let Some(asked) = parse_resource_version(&options.resource_version)? {
                    if asked > current {
                        return Err(Error::Api(Status::new(
                            504,
                            "Timeout",
                            format!("Too large resource version: {asked}, current: {current}"),
                        )));
                    }
                }
                let items: Arc<Vec<Arc<T>>> = Arc::new(state.objects.values().cloned().collect());
                let id = state.next_snapshot;
                state.next_snapshot += 1;
                (id, current, items, 0)
            }
        };
        let end = match options.limit {
            0 => items.len(),
            limit => offset.saturating_add(limit).min(items.len()),
        };
        let page = items.get(offset.min(end)..end).unwrap_or_default().to_vec();
        let continue_token = (end < items.len()).then(|| format!("{id}:{end}"));
        // Remember the snapshot while pages remain; forget it with the last page.
        state.snapshots.retain(|s| s.id != id);
        if continue_token.is_some() {
            state.snapshots.push_back(Snapshot {
                id,
                resource_version: rv,
                items,
            });
            while state.snapshots.len() > MAX_SNAPSHOTS {
                state.snapshots.pop_front();
            }
        }
        Ok(Page {
            items: page,
            resource_version: rv.to_string(),
            continue_token,
        })
    }

    fn serve_watch(&self, options: WatchOptions) -> Result<WatchStream<T>, Error> {
        let mut state = self.state();
        state.watch_calls += 1;
        if state.faults.unavailable {
            return Err(injected_connection_refused("watch"));
        }
        if state.faults.fail_watches > 0 {
            state.faults.fail_watches -= 1;
            return Err(injected_connection_refused("watch"));
        }
        let from = parse_resource_version(&options.resource_version)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let deadline = options.timeout.map(|t| Box::pin(tokio::time::sleep(t)));
        let stream = MemoryWatch { rx, deadline };
        let expired = state.faults.expire_watches > 0;
        let too_old = from.is_some_and(|from| from < state.compacted);
        if expired || too_old {
            if expired {
                state.faults.expire_watches -= 1;
            }
            let message = format!(
                "too old resource version: {} ({})",
                options.resource_version, state.compacted
            );
            // The receiver is alive: it is in `stream`.
            let _ = tx.send(Ok(WatchEvent::Error(Status::expired(message))));
            return Ok(Box::pin(stream));
        }
        match from {
            None => {
                for obj in state.objects.values() {
                    let _ = tx.send(Ok(WatchEvent::Added(Arc::clone(obj))));
                }
            }
            Some(from) => {
                for (_, event) in state.window.iter().filter(|(rv, _)| *rv > from) {
                    let _ = tx.send(Ok(event.clone()));
                }
            }
        }
        state.watchers.push(Watcher {
            tx,
            bookmarks: options.allow_bookmarks,
        });
        Ok(Box::pin(stream))
    }
}

impl<T: SetResourceVersion + Clone + Send + Sync + 'static> ListerWatcher<T>
    for MemoryListerWatcher<T>
{
    async fn list(&self, options: ListOptions) -> Result<Page<T>, Error> {
        self.delay().await;
        self.serve_list(options)
    }

    async fn watch(&self, options: WatchOptions) -> Result<WatchStream<T>, Error> {
        self.delay().await;
        self.serve_watch(options)
    }
}

impl<T> fmt::Debug for MemoryListerWatcher<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("MemoryListerWatcher")
            .field("resource_version", &state.resource_version)
            .field("objects", &state.objects.len())
            .field("window", &state.window.len())
            .field("watchers", &state.watchers.len())
            .field("faults", &state.faults)
            .finish()
    }
}

/// One watch: the server's sender feeds `rx`; the stream ends when the server drops the sender
/// or the timeout passes.
struct MemoryWatch<T> {
    rx: mpsc::UnboundedReceiver<Result<WatchEvent<T>, Error>>,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<T> Stream for MemoryWatch<T> {
    type Item = Result<WatchEvent<T>, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(deadline) = self.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                self.rx.close();
                return Poll::Ready(None);
            }
        }
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;

    #[derive(Debug, Clone, PartialEq)]
    struct Obj {
        name: String,
        rv: String,
    }

    impl Versioned for Obj {
        fn resource_version(&self) -> &str {
            &self.rv
        }
    }

    impl SetResourceVersion for Obj {
        fn set_resource_version(&mut self, rv: &str) {
            self.rv = rv.to_string();
        }
    }

    fn obj(name: &str) -> Obj {
        Obj {
            name: name.into(),
            rv: String::new(),
        }
    }

    fn server(window: usize) -> MemoryListerWatcher<Obj> {
        MemoryListerWatcher::with_window(Arc::new(|o: &Obj| Ok(Key::new(&o.name))), window)
    }

    async fn next(stream: &mut WatchStream<Obj>) -> Option<Result<WatchEvent<Obj>, Error>> {
        poll_fn(|cx| stream.as_mut().poll_next(cx)).await
    }

    fn describe(event: Option<Result<WatchEvent<Obj>, Error>>) -> String {
        match event {
            None => "end".into(),
            Some(Err(e)) => format!("err {e}"),
            Some(Ok(WatchEvent::Added(o))) => format!("added {} {}", o.name, o.rv),
            Some(Ok(WatchEvent::Modified(o))) => format!("modified {} {}", o.name, o.rv),
            Some(Ok(WatchEvent::Deleted(o))) => format!("deleted {} {}", o.name, o.rv),
            Some(Ok(WatchEvent::Bookmark { resource_version })) => {
                format!("bookmark {resource_version}")
            }
            Some(Ok(WatchEvent::Error(s))) => format!("error {}", s.code),
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    #[test]
    fn a_watch_replays_the_window_after_its_version_then_follows_live_writes() {
        rt().block_on(async {
            let s = server(10);
            s.upsert(obj("a")).unwrap();
            s.upsert(obj("a")).unwrap();
            s.upsert(obj("b")).unwrap();
            let opts = WatchOptions {
                resource_version: "1".into(),
                allow_bookmarks: true,
                timeout: None,
            };
            let mut w = s.watch(opts).await.unwrap();
            s.delete(&Key::new("a"));
            s.bookmark();
            let mut out = Vec::new();
            for _ in 0..4 {
                out.push(describe(next(&mut w).await));
            }
            assert_eq!(
                out,
                ["modified a 2", "added b 3", "deleted a 4", "bookmark 4"]
            );
            s.close_watches();
            assert_eq!(describe(next(&mut w).await), "end");
        });
    }

    #[test]
    fn every_open_watch_gets_every_event_and_bookmarks_only_if_asked() {
        rt().block_on(async {
            let s = server(10);
            let with_bookmarks = WatchOptions {
                allow_bookmarks: true,
                ..Default::default()
            };
            let mut a = s.watch(with_bookmarks).await.unwrap();
            let mut b = s.watch(WatchOptions::default()).await.unwrap();
            assert_eq!(s.open_watches(), 2);
            s.upsert(obj("x")).unwrap();
            s.bookmark();
            s.delete(&Key::new("x"));
            for expected in ["added x 1", "bookmark 1", "deleted x 2"] {
                assert_eq!(describe(next(&mut a).await), expected);
            }
            for expected in ["added x 1", "deleted x 2"] {
                assert_eq!(describe(next(&mut b).await), expected);
            }
            drop(b);
            assert_eq!(s.open_watches(), 1);
        });
    }

    #[test]
    fn a_watch_from_before_the_window_gets_410_then_ends() {
        rt().block_on(async {
            let s = server(2);
            for _ in 0..5 {
                s.upsert(obj("a")).unwrap();
            }
            let from = |rv: &str| WatchOptions {
                resource_version: rv.into(),
                ..Default::default()
            };
            let mut old = s.watch(from("2")).await.unwrap();
            assert_eq!(describe(next(&mut old).await), "error 410");
            assert_eq!(describe(next(&mut old).await), "end");
            let mut fine = s.watch(from("3")).await.unwrap();
            assert_eq!(describe(next(&mut fine).await), "modified a 4");
            s.expire_next_watches(1);
            let mut forced = s.watch(from("5")).await.unwrap();
            assert_eq!(describe(next(&mut forced).await), "error 410");
            let bad = s.watch(from("x")).await.err().unwrap();
            assert_eq!(bad.status().map(|s| s.code), Some(400));
        });
    }

    #[test]
    fn a_watch_ends_at_its_timeout_and_injected_failures_are_counted_down() {
        rt().block_on(async {
            let s = server(10);
            s.fail_next_watches(1);
            s.fail_next_lists(2);
            let opts = WatchOptions {
                timeout: Some(Duration::from_secs(5)),
                ..Default::default()
            };
            assert!(s.watch(opts.clone()).await.is_err());
            let mut w = s.watch(opts).await.unwrap();
            let start = tokio::time::Instant::now();
            assert_eq!(describe(next(&mut w).await), "end");
            assert_eq!(start.elapsed(), Duration::from_secs(5));
            assert!(s.list(ListOptions::default()).await.is_err());
            assert!(s.list(ListOptions::default()).await.is_err());
            assert!(s.list(ListOptions::default()).await.is_ok());
            assert_eq!((s.list_calls(), s.watch_calls()), (3, 2));
            s.set_latency(Duration::from_millis(250));
            let before = tokio::time::Instant::now();
            assert!(s.list(ListOptions::default()).await.is_ok());
            assert_eq!(before.elapsed(), Duration::from_millis(250));
        });
    }

    #[test]
    fn a_server_that_is_down_refuses_everything_and_keeps_its_scripted_410_for_later() {
        rt().block_on(async {
            let s = server(10);
            s.upsert(obj("a")).unwrap();
            let mut open = s.watch(WatchOptions::default()).await.unwrap();
            assert_eq!(describe(next(&mut open).await), "added a 1");
            s.expire_next_watches(1);
            s.set_unavailable(true);
            assert_eq!(describe(next(&mut open).await), "end");
            s.delete(&Key::new("a"));
            assert!(s.list(ListOptions::default()).await.is_err());
            let refused = s.watch(WatchOptions::default()).await.err().unwrap();
            assert!(refused.is_retriable_watch_error());
            s.set_unavailable(false);
            let from = WatchOptions {
                resource_version: "1".into(),
                ..Default::default()
            };
            let mut expired = s.watch(from).await.unwrap();
            assert_eq!(describe(next(&mut expired).await), "error 410");
            let list = s.list(ListOptions::default()).await.unwrap();
            assert!(
                list.items.is_empty(),
                "the list shows the deletion made while down"
            );
        });
    }

    #[test]
    fn pages_are_consistent_with_the_first_even_while_writes_go_on() {
        rt().block_on(async {
            let s = server(10);
            for name in ["a", "b", "c", "d", "e"] {
                s.upsert(obj(name)).unwrap();
            }
            let first = s
                .list(ListOptions {
                    limit: 2,
                    ..Default::default()
                })
                .await
                .unwrap();
            s.delete(&Key::new("e"));
            s.upsert(obj("f")).unwrap();
            let mut names: Vec<String> = first.items.iter().map(|o| o.name.clone()).collect();
            let mut token = first.continue_token.clone();
            while let Some(t) = token {
                let page = s
                    .list(ListOptions {
                        limit: 2,
                        continue_token: Some(t),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                assert_eq!(page.resource_version, "5");
                names.extend(page.items.iter().map(|o| o.name.clone()));
                token = page.continue_token;
            }
            assert_eq!(names, ["a", "b", "c", "d", "e"]);
            let bad = s
                .list(ListOptions {
                    continue_token: Some("nonsense".into()),
                    ..Default::default()
                })
                .await
                .err()
                .unwrap();
            assert_eq!(bad.status().map(|s| s.code), Some(400));
            let gone = s
                .list(ListOptions {
                    continue_token: Some("0:2".into()),
                    ..Default::default()
                })
                .await
                .err()
                .unwrap();
            assert!(gone.is_expired(), "a finished list's token is expired");
            let future = s
                .list(ListOptions {
                    resource_version: "99".into(),
                    ..Default::default()
                })
                .await
                .err()
                .unwrap();
            assert!(future.is_too_large_resource_version());
        });
    }
}
