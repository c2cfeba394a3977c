//! An in-memory API server for one resource, as a [`ListerWatcher`]: what tests and the load
//! generator drive an informer with.
//!
//! The server itself is [`ApiServer`] (module [`apiserver`](crate::apiserver), the same one
//! `loadgen serve` puts behind HTTP): the current objects, a resource version that every write
//! increments, and a bounded window of recent events. A watch from a version still in the
//! window replays what came after it and then follows live writes; a watch from an older
//! version gets `410 Expired`, as from the real server (an `Error` event, then the end of the
//! stream), and so does a watch whose reader falls more than the window behind. Lists are
//! paged with `continue` tokens over a snapshot taken by the first page, so the pages of one
//! list are consistent with each other. This module turns typed objects into the server's
//! events and its items into [`WatchEvent`]s.
//!
//! Scripting hooks make the failures an informer must survive happen on demand: end every open
//! watch, answer 410 to the next watches, fail the next lists or watches as a refused
//! connection would, go down for a while (writes go on unseen), forget the window, slow every
//! call down.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use tokio::time::Sleep;

use kcache::informer::{
    Error, ListOptions, ListerWatcher, Page, SetResourceVersion, Status, WatchEvent, WatchOptions,
    WatchStream,
};
use kcache::{Key, KeyError, KeyFn};

use crate::apiserver::{ApiServer, ContinueError, Cursor, Item, Kind, Pager, Start, Writer};
use crate::lock;

/// How many events the window keeps by default (the API server's watch cache keeps about as
/// many per resource).
pub const DEFAULT_WINDOW: usize = 1000;

/// How many unfinished paged lists the server remembers; an older `continue` token is expired.
const MAX_SNAPSHOTS: usize = 16;

/// The writes of one batch ([`MemoryListerWatcher::write_batch`]).
pub struct Writes<'a, 'w, T> {
    writer: &'a mut Writer<'w, Key, Arc<T>>,
    key_fn: &'a KeyFn<T>,
    /// The next resource version as text, formatted into one buffer for the whole batch.
    version: String,
}

impl<T> fmt::Debug for Writes<'_, '_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writes")
            .field("writer", &self.writer)
            .finish_non_exhaustive()
    }
}

impl<T: SetResourceVersion + Clone> Writes<'_, '_, T> {
    /// The next write's resource version, as the objects carry it.
    fn next_version(&mut self) -> &str {
        use std::fmt::Write as _;
        self.version.clear();
        // Writing to a String cannot fail.
        let _ = write!(self.version, "{}", self.writer.resource_version() + 1);
        &self.version
    }

    /// [`MemoryListerWatcher::upsert`] within the batch; a refused object (its key function
    /// failed) changes nothing.
    pub fn upsert(&mut self, mut obj: T) -> Result<Arc<T>, KeyError> {
        let key = (self.key_fn)(&obj)?;
        obj.set_resource_version(self.next_version());
        let obj = Arc::new(obj);
        self.writer.upsert(key, Arc::clone(&obj));
        Ok(obj)
    }

    /// [`MemoryListerWatcher::delete`] within the batch.
    pub fn delete(&mut self, key: &Key) -> Option<Arc<T>> {
        let mut last = (**self.writer.get(key)?).clone();
        last.set_resource_version(self.next_version());
        let last = Arc::new(last);
        self.writer
            .push(key.clone(), Kind::Deleted, Arc::clone(&last));
        Some(last)
    }
}

/// An in-memory [`ListerWatcher`]; clones share one server.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// use std::sync::Arc;
/// use kcache::informer::{ListerWatcher, ListOptions, SetResourceVersion, Versioned};
/// use kcache_sim::MemoryListerWatcher;
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
    /// The objects, the window and the watches.
    server: ApiServer<Key, Arc<T>>,
    /// The snapshots of paged lists (one view: everything).
    pager: Pager<Arc<T>, ()>,
    /// The scripted failures and the call counts. Taken before the server's own locks, never
    /// after (a watch holds it while it starts: see `serve_watch`).
    control: Mutex<Control>,
}

/// Failures scripted to happen on the next calls.
#[derive(Debug, Default)]
struct Faults {
    fail_lists: usize,
    fail_watches: usize,
    /// The next lists and watches answered 429 with this `Retry-After`.
    throttle_lists: usize,
    throttle_watches: usize,
    retry_after: Duration,
    expire_watches: usize,
    /// Every list and watch fails as a refused connection until this is cleared.
    unavailable: bool,
    latency: Duration,
}

/// The two calls a fault can be scripted for.
#[derive(Debug, Clone, Copy)]
enum Verb {
    List,
    Watch,
}

impl Faults {
    /// The failure scripted for this call of `verb`, if any, used up: while unavailable a
    /// refused connection, then the scripted refused connections, then the scripted 429s.
    fn take(&mut self, verb: Verb) -> Result<(), Error> {
        let (what, fail, throttle) = match verb {
            Verb::List => ("list", &mut self.fail_lists, &mut self.throttle_lists),
            Verb::Watch => ("watch", &mut self.fail_watches, &mut self.throttle_watches),
        };
        if self.unavailable {
            return Err(injected_connection_refused(what));
        }
        if *fail > 0 {
            *fail -= 1;
            return Err(injected_connection_refused(what));
        }
        if *throttle > 0 {
            *throttle -= 1;
            return Err(injected_too_many_requests(self.retry_after));
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct Control {
    faults: Faults,
    list_calls: u64,
    watch_calls: u64,
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

fn injected_too_many_requests(retry_after: Duration) -> Error {
    Error::Api(
        Status::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later (injected)",
        )
        .with_retry_after(Some(retry_after)),
    )
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
                server: ApiServer::new([], 0, window),
                pager: Pager::new(MAX_SNAPSHOTS, None),
                control: Mutex::new(Control::default()),
            }),
        }
    }

    fn control(&self) -> MutexGuard<'_, Control> {
        // Counters and flags: a panic cannot leave them half-written.
        lock(&self.inner.control)
    }

    /// Creates or replaces an object: stamps it with the next resource version and sends
    /// `Added` (new key) or `Modified` to every watcher. Returns the stored object.
    ///
    /// One write is a batch of one: a producer with many writes at hand makes them with
    /// [`write_batch`](Self::write_batch).
    pub fn upsert(&self, obj: T) -> Result<Arc<T>, KeyError> {
        self.write_batch(|w| w.upsert(obj))
    }

    /// Deletes `key`: the `Deleted` event carries its last state stamped with the deletion's
    /// resource version, as the API server sends it. Returns that, or `None` if there was no
    /// such object (then nothing happens).
    pub fn delete(&self, key: &Key) -> Option<Arc<T>> {
        self.write_batch(|w| w.delete(key))
    }

    /// Makes every write of `f` as one batch: each gets its own resource version and event,
    /// as with [`upsert`](Self::upsert) and [`delete`](Self::delete) one by one, but the batch
    /// takes the server's locks once, is appended to the event log as one segment, and wakes
    /// each watch once. A watch that starts meanwhile sees all of the batch or none of it.
    ///
    /// ```
    /// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
    /// use std::sync::Arc;
    /// use kcache::informer::{ListerWatcher, ListOptions, SetResourceVersion, Versioned};
    /// use kcache_sim::MemoryListerWatcher;
    /// use kcache::Key;
    ///
    /// #[derive(Clone, Debug)]
    /// struct Pod { name: String, rv: String }
    /// impl Versioned for Pod { fn resource_version(&self) -> &str { &self.rv } }
    /// impl SetResourceVersion for Pod { fn set_resource_version(&mut self, rv: &str) { self.rv = rv.into() } }
    /// let pod = |name: &str| Pod { name: name.into(), rv: String::new() };
    ///
    /// let server = MemoryListerWatcher::new(Arc::new(|p: &Pod| Ok(Key::new(&p.name))));
    /// server.write_batch(|w| {
    ///     for name in ["a", "b", "c"] {
    ///         w.upsert(pod(name)).unwrap();
    ///     }
    ///     w.delete(&Key::new("b"));
    /// });
    /// let page = server.list(ListOptions::default()).await.unwrap();
    /// assert_eq!(page.resource_version, "4");
    /// assert_eq!(page.items.iter().map(|p| p.rv.as_str()).collect::<Vec<_>>(), ["1", "3"]);
    /// # });
    /// ```
    pub fn write_batch<R>(&self, f: impl FnOnce(&mut Writes<'_, '_, T>) -> R) -> R {
        self.inner.server.write(|writer| {
            f(&mut Writes {
                writer,
                key_fn: &self.inner.key_fn,
                version: String::new(),
            })
        })
    }

    /// Sends a bookmark at the current resource version to every watch that allows them.
    pub fn bookmark(&self) {
        self.inner.server.bookmark();
    }

    /// Ends every open watch (their streams end after what was already sent).
    pub fn close_watches(&self) {
        // Under the control lock, as a watch registers (see `serve_watch`).
        let _control = self.control();
        self.inner.server.close_watches();
    }

    /// The next `n` watches get `410 Expired` whatever version they ask for.
    pub fn expire_next_watches(&self, n: usize) {
        self.control().faults.expire_watches += n;
    }

    /// How many of the 410s scripted by [`expire_next_watches`](Self::expire_next_watches) no
    /// watch has received yet.
    pub fn expired_watches_pending(&self) -> usize {
        self.control().faults.expire_watches
    }

    /// The next `n` lists fail as a refused connection.
    pub fn fail_next_lists(&self, n: usize) {
        self.control().faults.fail_lists += n;
    }

    /// The next `n` lists are answered `429 TooManyRequests` with `Retry-After: retry_after`.
    pub fn throttle_next_lists(&self, n: usize, retry_after: Duration) {
        let mut control = self.control();
        control.faults.throttle_lists += n;
        control.faults.retry_after = retry_after;
    }

    /// The next `n` watches are refused with `429 TooManyRequests` and `Retry-After:
    /// retry_after`.
    pub fn throttle_next_watches(&self, n: usize, retry_after: Duration) {
        let mut control = self.control();
        control.faults.throttle_watches += n;
        control.faults.retry_after = retry_after;
    }

    /// The next `n` watches fail to open as a refused connection.
    pub fn fail_next_watches(&self, n: usize) {
        self.control().faults.fail_watches += n;
    }

    /// Takes the server down (`true`: every list and watch call fails as a refused connection,
    /// and the open watches end) or brings it back (`false`). Writes go on while it is down:
    /// no watch sees them, so a client learns of them only from its next list (or from a
    /// watch that resumes from a version still in the window). Scripted failures counted by
    /// the other hooks wait for the server to be back.
    pub fn set_unavailable(&self, down: bool) {
        let mut control = self.control();
        control.faults.unavailable = down;
        if down {
            // Under the control lock, which a watch holds from its checks to its start (see
            // `serve_watch`): no watch can slip between the two.
            self.inner.server.close_watches();
        }
    }

    /// Every later list and watch call waits this long before it is served.
    pub fn set_latency(&self, latency: Duration) {
        self.control().faults.latency = latency;
    }

    /// Forgets the event window: a watch from any version older than the current one gets
    /// `410 Expired` (as after the API server's watch cache moved on).
    pub fn compact(&self) {
        self.inner.server.compact();
    }

    /// The current resource version.
    pub fn resource_version(&self) -> String {
        self.inner.server.resource_version().to_string()
    }

    /// The current objects, sorted by key.
    pub fn objects(&self) -> Vec<Arc<T>> {
        self.inner.server.objects(|_| true)
    }

    /// The current object of `key`.
    pub fn get(&self, key: &Key) -> Option<Arc<T>> {
        self.inner.server.get(key)
    }

    /// How many objects exist.
    pub fn len(&self) -> usize {
        self.inner.server.len()
    }

    /// Whether no object exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many list calls (pages) were made, failed ones included.
    pub fn list_calls(&self) -> u64 {
        self.control().list_calls
    }

    /// How many watch calls were made, failed ones included.
    pub fn watch_calls(&self) -> u64 {
        self.control().watch_calls
    }

    /// How many watches are open.
    pub fn open_watches(&self) -> usize {
        self.inner.server.open_watches()
    }

    async fn delay(&self) {
        let latency = self.control().faults.latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    fn serve_list(&self, options: ListOptions) -> Result<Page<T>, Error> {
        {
            let mut control = self.control();
            control.list_calls += 1;
            control.faults.take(Verb::List)?;
        }
        let paged = match &options.continue_token {
            Some(token) => {
                self.inner
                    .pager
                    .next(token, &(), options.limit)
                    .map_err(|e| match e {
                        ContinueError::Expired => Error::Api(Status::expired(e.to_string())),
                        ContinueError::Malformed | ContinueError::PastEnd => {
                            bad_request(format!("continue token {token:?}: {e}"))
                        }
                    })?
            }
            None => {
                let asked = parse_resource_version(&options.resource_version)?;
                let snapshot = self.inner.server.snapshot((), |_| true);
                let current = snapshot.resource_version;
                if let Some(asked) = asked.filter(|&asked| asked > current) {
                    return Err(Error::Api(Status::new(
                        504,
                        "Timeout",
                        format!("Too large resource version: {asked}, current: {current}"),
                    )));
                }
                self.inner.pager.first(snapshot, options.limit)
            }
        };
        Ok(Page {
            items: paged.items().to_vec(),
            resource_version: paged.snapshot.resource_version.to_string(),
            continue_token: paged.continue_token,
        })
    }

    fn serve_watch(&self, options: WatchOptions) -> Result<WatchStream<T>, Error> {
        // Held until the watch has started (to the end): a scripted outage
        // (`set_unavailable`, which closes the open watches under this lock) or 410 then
        // comes either before this watch's checks, which see it, or after its start, and
        // `close_watches` ends it. Released between the two, a watch could pass the checks
        // before an outage and start after its `close_watches`: open, and blind to the
        // outage and to the 410 scripted for it.
        let mut control = self.control();
        control.watch_calls += 1;
        control.faults.take(Verb::Watch)?;
        parse_resource_version(&options.resource_version)?;
        let expired = control.faults.expire_watches > 0;
        if expired {
            control.faults.expire_watches -= 1;
        }
        let deadline = options.timeout.map(|t| Box::pin(tokio::time::sleep(t)));
        let start = match parse_resource_version(&options.resource_version)? {
            None => Start::Initial,
            Some(from) => Start::After(from),
        };
        let refused = |message: String| -> Result<WatchStream<T>, Error> {
            Ok(Box::pin(MemoryWatch {
                initial: Vec::new().into_iter(),
                error: Some(Status::expired(message)),
                cursor: None,
                deadline: None,
            }))
        };
        if expired {
            let message = format!(
                "too old resource version: {} ({})",
                options.resource_version,
                self.inner.server.oldest()
            );
            return refused(message);
        }
        let started = self
            .inner
            .server
            .watch(start, options.allow_bookmarks, |_| true);
        drop(control);
        match started {
            Err(too_old) => refused(too_old.to_string()),
            Ok(start) => Ok(Box::pin(MemoryWatch {
                initial: start.initial.into_iter(),
                error: None,
                cursor: Some(start.cursor),
                deadline,
            })),
        }
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
        let control = lock(&self.inner.control);
        f.debug_struct("MemoryListerWatcher")
            .field("server", &self.inner.server)
            .field("faults", &control.faults)
            .finish()
    }
}

/// One watch: the current objects as `Added` (a watch from `""`/`"0"`), then what its cursor
/// reads; or a single 410. It ends when the server closes it, at the timeout, or after a 410.
struct MemoryWatch<T> {
    initial: std::vec::IntoIter<Arc<T>>,
    /// A refusal to send as the only event.
    error: Option<Status>,
    /// `None` once the watch ended (dropping it stops counting the watch as open).
    cursor: Option<Cursor<Arc<T>>>,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<T: Send + Sync + 'static> Stream for MemoryWatch<T> {
    type Item = Result<WatchEvent<T>, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(deadline) = this.deadline.as_mut() {
            if deadline.as_mut().poll(cx).is_ready() {
                this.cursor = None;
                this.deadline = None;
                this.initial = Vec::new().into_iter();
                return Poll::Ready(None);
            }
        }
        if let Some(status) = this.error.take() {
            return Poll::Ready(Some(Ok(WatchEvent::Error(status))));
        }
        if let Some(obj) = this.initial.next() {
            return Poll::Ready(Some(Ok(WatchEvent::Added(obj))));
        }
        let Some(cursor) = this.cursor.as_mut() else {
            return Poll::Ready(None);
        };
        loop {
            let event = match cursor.try_next() {
                Some(Item::Event(e)) => match e.kind {
                    Kind::Added => WatchEvent::Added(e.object),
                    Kind::Modified => WatchEvent::Modified(e.object),
                    Kind::Deleted => WatchEvent::Deleted(e.object),
                },
                Some(Item::Bookmark(rv)) => WatchEvent::Bookmark {
                    resource_version: rv.to_string(),
                },
                Some(Item::Expired(rv)) => WatchEvent::Error(Status::expired(format!(
                    "too old resource version: {rv} (the watch fell more than the window behind)"
                ))),
                Some(Item::Closed) | None if cursor.is_done() => {
                    this.cursor = None;
                    return Poll::Ready(None);
                }
                Some(Item::Closed) | None => match cursor.poll_ready(cx) {
                    Poll::Ready(()) => continue,
                    Poll::Pending => return Poll::Pending,
                },
            };
            return Poll::Ready(Some(Ok(event)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kcache::informer::Versioned;
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
    fn a_watch_that_falls_more_than_the_window_behind_gets_410_then_ends() {
        rt().block_on(async {
            let s = server(3);
            let mut slow = s.watch(WatchOptions::default()).await.unwrap();
            let mut steady = s.watch(WatchOptions::default()).await.unwrap();
            s.upsert(obj("a")).unwrap();
            assert_eq!(describe(next(&mut slow).await), "added a 1");
            assert_eq!(describe(next(&mut steady).await), "added a 1");
            for rv in 2..=4 {
                s.upsert(obj("a")).unwrap();
                assert_eq!(
                    describe(next(&mut steady).await),
                    format!("modified a {rv}")
                );
            }
            // `slow` read nothing since version 1; the window is now 2..=4, then 3..=5.
            s.upsert(obj("a")).unwrap();
            assert_eq!(describe(next(&mut slow).await), "error 410");
            assert_eq!(describe(next(&mut slow).await), "end");
            assert_eq!(describe(next(&mut steady).await), "modified a 5");
            assert_eq!(s.open_watches(), 1);
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
            // A list from `continue_token` or at `resource_version` that the server refuses.
            let refused = |continue_token: Option<&str>, resource_version: &str| {
                let options = ListOptions {
                    continue_token: continue_token.map(Into::into),
                    resource_version: resource_version.into(),
                    ..Default::default()
                };
                let s = &s;
                async move { s.list(options).await.err().unwrap() }
            };
            let bad = refused(Some("nonsense"), "").await;
            assert_eq!(bad.status().map(|s| s.code), Some(400));
            let gone = refused(Some("4-2"), "").await;
            assert!(gone.is_expired(), "no list kept a snapshot at version 4");
            let future = refused(None, "99").await;
            assert!(future.is_too_large_resource_version());
        });
    }
}
