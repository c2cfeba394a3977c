//! One watch's HTTP body: the initial pods, then what its cursor into the server's event log
//! reads (the window's events after its version, then live ones), bookmarks, the timeout, and
//! the 410 that ends a watcher that fell out of the window.
//!
//! The events are JSON lines or protobuf frames ([`Format`]); either way they are coalesced
//! into chunks (up to [`CHUNK`] bytes) so that a busy stream costs one
//! write per batch rather than one per event; each event is a shared `Bytes`, encoded once per
//! format for every watcher, copied only into the chunk.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kcache_sim::apiserver::{Cursor, Event, Item};
use tokio::sync::watch;
use tokio::time::Instant;

use super::format::Format;
use super::objects::Status;
use super::store::{StoredPod, WatchStart};

/// Roughly how many bytes one chunk of the stream carries at most.
const CHUNK: usize = 256 * 1024;

/// How long before `timeoutSeconds` ends a watch the real server sends its last bookmark.
const FINAL_BOOKMARK_LEAD: Duration = Duration::from_secs(2);

/// What a watch was asked for.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// Only this namespace's events (all when `None`).
    pub namespace: Option<Arc<str>>,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: end the backlog with the `initial-events-end` bookmark.
    pub initial_events_end: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// How often to send a bookmark.
    pub bookmark_interval: Duration,
    /// JSON lines or protobuf frames.
    pub format: Format,
}

/// A watch in progress; [`Watcher::next_chunk`] produces its body.
#[derive(Debug)]
pub struct Watcher {
    /// The initial pods, sent as `ADDED` first.
    added: std::vec::IntoIter<Arc<StoredPod>>,
    /// The bookmark that ends the initial events, sent right after them.
    initial_end: Option<Bytes>,
    /// The events after the start: the window's, then live ones.
    cursor: Cursor<Arc<StoredPod>>,
    /// Every event up to this version has been sent (or filtered out).
    resource_version: u64,
    options: WatchOptions,
    next_bookmark: Instant,
    /// When the last bookmark before the timeout is due; `None` once sent or when not wanted.
    final_bookmark: Option<Instant>,
    deadline: Option<Instant>,
    shutdown: watch::Receiver<bool>,
    done: bool,
}

impl Watcher {
    /// A watch starting at `start`; it ends when `shutdown` turns true.
    pub fn new(start: WatchStart, options: WatchOptions, shutdown: watch::Receiver<bool>) -> Self {
        let now = Instant::now();
        let deadline = options.timeout.map(|t| now + t);
        let final_bookmark = match (options.bookmarks, options.timeout) {
            (true, Some(t)) if t > FINAL_BOOKMARK_LEAD => Some(now + t - FINAL_BOOKMARK_LEAD),
            _ => None,
        };
        let initial_end = options
            .initial_events_end
            .then(|| options.format.bookmark(start.resource_version, true));
        Self {
            added: start.initial.into_iter(),
            initial_end,
            cursor: start.cursor,
            resource_version: start.resource_version,
            next_bookmark: now + options.bookmark_interval,
            final_bookmark,
            deadline,
            options,
            shutdown,
            done: false,
        }
    }

    /// Every event up to this version has been sent (or filtered out).
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// The next chunk of the body, or `None` when the watch ends.
    pub async fn next_chunk(&mut self) -> Option<Bytes> {
        if self.done {
            return None;
        }
        let mut chunk = BytesMut::new();
        for pod in self.added.by_ref() {
            self.options.format.push_added(&mut chunk, &pod);
            if chunk.len() >= CHUNK {
                return Some(chunk.freeze());
            }
        }
        if let Some(end) = self.initial_end.take() {
            chunk.extend_from_slice(&end);
        }
        // The window's events after the watch's version are in the log already.
        self.drain(&mut chunk);
        if !chunk.is_empty() || self.done {
            return (!chunk.is_empty()).then(|| chunk.freeze());
        }
        loop {
            let deadline = self.deadline;
            let final_bookmark = self.final_bookmark;
            tokio::select! {
                biased;
                // The receiver is a clone of one that never looked, so a stop sent before this
                // watch started counts as a change too: the watch ends at once rather than
                // holding the shutdown up.
                _ = self.shutdown.changed() => {
                    self.done = true;
                    return None;
                }
                _ = sleep_until(deadline), if deadline.is_some() => {
                    self.done = true;
                    return None;
                }
                _ = sleep_until(final_bookmark), if final_bookmark.is_some() => {
                    self.final_bookmark = None;
                    return Some(self.bookmark(chunk));
                }
                _ = tokio::time::sleep_until(self.next_bookmark), if self.options.bookmarks => {
                    self.next_bookmark += self.options.bookmark_interval;
                    return Some(self.bookmark(chunk));
                }
                _ = self.cursor.ready() => {
                    self.drain(&mut chunk);
                    if !chunk.is_empty() {
                        return Some(chunk.freeze());
                    }
                    if self.done {
                        return None;
                    }
                }
            }
        }
    }

    /// Adds `event` to `chunk` when it is this watch's namespace; either way the watcher is now
    /// past it.
    fn take(&mut self, event: &Event<Arc<StoredPod>>, chunk: &mut BytesMut) {
        self.resource_version = event.resource_version;
        if self
            .options
            .namespace
            .as_deref()
            .is_none_or(|ns| *event.object.namespace == *ns)
        {
            self.options.format.push_event(chunk, &event.object);
        }
    }

    /// Takes the events already waiting, up to a chunk's worth.
    fn drain(&mut self, chunk: &mut BytesMut) {
        while chunk.len() < CHUNK && !self.done {
            match self.cursor.try_next() {
                Some(Item::Event(event)) => self.take(&event, chunk),
                Some(Item::Expired(_)) => {
                    let expired = self.expire(std::mem::take(chunk));
                    chunk.extend_from_slice(&expired);
                }
                // The store closes no watch through the log (stopping is `shutdown`); should
                // it, the watch ends.
                Some(Item::Closed) => self.done = true,
                // Its bookmarks are per watch, by time, not the log's.
                Some(Item::Bookmark(_)) => {}
                None => break,
            }
        }
    }

    /// A bookmark after the events already waiting (so its promise holds for them too).
    fn bookmark(&mut self, mut chunk: BytesMut) -> Bytes {
        self.drain(&mut chunk);
        if !self.done {
            chunk.extend_from_slice(&self.options.format.bookmark(self.resource_version, false));
        }
        chunk.freeze()
    }

    /// The watcher fell out of the window: what it has, then a 410, then the end.
    fn expire(&mut self, mut chunk: BytesMut) -> Bytes {
        self.done = true;
        chunk.extend_from_slice(&self.options.format.error(&Status::expired(format!(
            "too old resource version: {} (the watch fell more than the window behind)",
            self.resource_version
        ))));
        chunk.freeze()
    }
}

/// Sleeps until `at`; forever when `None` (the select guards keep that branch off then).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::objects::EventType;
    use crate::serve::store::{Change, Store};
    use serde_json::Value;

    fn change(i: u32, rv: u64) -> Change {
        crate::serve::store::test_change(EventType::Added, i, 1, rv)
    }

    fn options(namespace: Option<&str>, bookmarks: bool) -> WatchOptions {
        WatchOptions {
            namespace: namespace.map(Arc::from),
            bookmarks,
            initial_events_end: false,
            timeout: None,
            bookmark_interval: Duration::from_millis(50),
            format: Format::Json,
        }
    }

    fn events(chunk: &[u8]) -> Vec<Value> {
        chunk
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn a_watcher_that_falls_out_of_the_window_gets_410_and_ends() {
        let store = Store::new(Vec::new(), 0, 8);
        let (_stop, shutdown) = watch::channel(false);
        let start = store.watch(None, Some(0)).unwrap();
        let mut watcher = Watcher::new(start, options(None, false), shutdown);
        // 40 events while the watcher reads nothing: it is far past the window of 8.
        for rv in (1..=40).step_by(4) {
            store.publish((rv..rv + 4).map(|rv| change(rv as u32, rv)).collect());
        }
        let chunk = watcher.next_chunk().await.expect("the 410");
        let got = events(&chunk);
        let last = got.last().unwrap();
        assert_eq!(last["type"], "ERROR");
        assert_eq!(last["object"]["code"], 410);
        assert_eq!(last["object"]["reason"], "Expired");
        assert!(watcher.next_chunk().await.is_none(), "then the stream ends");
    }

    #[tokio::test]
    async fn live_events_are_filtered_by_namespace_and_bookmarks_follow_them() {
        let store = Store::new(Vec::new(), 0, 1000);
        let (stop, shutdown) = watch::channel(false);
        let start = store.watch(Some("ns-1"), Some(0)).unwrap();
        let mut watcher = Watcher::new(start, options(Some("ns-1"), true), shutdown);
        store.publish((1..=10).map(|rv| change(rv as u32, rv)).collect());
        let got = events(&watcher.next_chunk().await.unwrap());
        let versions: Vec<&str> = got
            .iter()
            .map(|e| e["object"]["metadata"]["resourceVersion"].as_str().unwrap())
            .collect();
        assert_eq!(versions, ["1", "3", "5", "7", "9"], "ns-1 only, in order");
        let bookmark = events(&watcher.next_chunk().await.unwrap());
        assert_eq!(bookmark[0]["type"], "BOOKMARK");
        assert_eq!(
            bookmark[0]["object"]["metadata"]["resourceVersion"], "10",
            "the filtered-out event 10 is covered too"
        );
        stop.send(true).unwrap();
        assert!(
            watcher.next_chunk().await.is_none(),
            "stopping ends the watch"
        );
    }

    #[tokio::test]
    async fn a_watch_started_while_the_server_stops_ends_at_once() {
        let store = Store::new(Vec::new(), 0, 10);
        let (stop, shutdown) = watch::channel(false);
        stop.send(true).unwrap();
        let start = store.watch(None, Some(0)).unwrap();
        let mut watcher = Watcher::new(start, options(None, false), shutdown);
        let next = tokio::time::timeout(Duration::from_secs(5), watcher.next_chunk()).await;
        assert_eq!(next, Ok(None));
    }

    #[tokio::test]
    async fn initial_events_then_the_end_bookmark() {
        let store = Store::new(Vec::new(), 0, 1000);
        store.publish((1..=4).map(|rv| change(rv as u32, rv)).collect());
        let (_stop, shutdown) = watch::channel(false);
        let mut opts = options(None, true);
        opts.initial_events_end = true;
        let mut watcher = Watcher::new(store.watch(None, None).unwrap(), opts, shutdown);
        let got = events(&watcher.next_chunk().await.unwrap());
        assert_eq!(got.len(), 5);
        assert!(got[..4]
            .iter()
            .all(|e| e["type"] == "ADDED" && e["object"]["kind"] == "Pod"));
        assert_eq!(got[4]["type"], "BOOKMARK");
        assert_eq!(
            got[4]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
        assert_eq!(got[4]["object"]["metadata"]["resourceVersion"], "4");
    }
}
