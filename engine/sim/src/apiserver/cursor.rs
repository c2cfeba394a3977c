//! The fan-out: every watch is a [`Cursor`] into the shared [`Log`], reading at its own pace.
//!
//! Nothing is sent to a watcher: a write appends one segment and wakes the waiting cursors
//! (one `tokio::sync::watch` send per batch); each cursor then clones the new segments' `Arc`s
//! under the log's lock once and reads their entries without a lock. Events are shared, never
//! copied per watcher. A cursor that fell more than the window behind ends with
//! [`Item::Expired`] (the API server's `410 Expired`), and one that is never polled holds only
//! the segments it had already fetched.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::watch;

use super::log::{Entry, Event, Fetched, Log, Segment};

/// What a cursor reads next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item<O> {
    /// A change.
    Event(Event<O>),
    /// A bookmark at this resource version (only for cursors that allow them).
    Bookmark(u64),
    /// The server ended every open watch ([`ApiServer::close_watches`](super::ApiServer::close_watches)):
    /// nothing follows.
    Closed,
    /// The cursor fell more than the window behind: events it has not read are gone. Nothing
    /// follows; the resource version is the newest event it did read.
    Expired(u64),
}

/// Counts the open watches of one epoch of the server (a new epoch starts when every watch is
/// closed); a cursor holds one until it ends or is dropped.
#[derive(Debug)]
pub(super) struct OpenGuard(Arc<AtomicUsize>);

impl OpenGuard {
    pub(super) fn new(count: &Arc<AtomicUsize>) -> Self {
        // Relaxed: a statistic; nothing is published through it.
        count.fetch_add(1, Ordering::Relaxed);
        Self(Arc::clone(count))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        // Relaxed: see `new`.
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One watch's position in the log.
pub struct Cursor<O> {
    log: Arc<Log<O>>,
    /// Segments fetched and not yet read past, oldest first.
    segments: VecDeque<Arc<Segment<O>>>,
    /// The sequence number of the next entry to read.
    next: u64,
    /// Entries before this one were in the log when the watch started: their events are the
    /// replay, and their bookmarks and closes were meant for older watches.
    started_at: u64,
    /// Every event up to this resource version has been read (or was before the start).
    resource_version: u64,
    bookmarks: bool,
    wake: watch::Receiver<u64>,
    /// A pending wait for new entries (boxed once per wait, not per event).
    waiting: Option<Wait>,
    open: Option<OpenGuard>,
    done: bool,
}

impl<O> fmt::Debug for Cursor<O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cursor")
            .field("next", &self.next)
            .field("resource_version", &self.resource_version)
            .field("bookmarks", &self.bookmarks)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<O: Clone + Send + Sync + 'static> Cursor<O> {
    /// A cursor that has every event up to `resource_version`, reading from sequence number
    /// `next`; the log's entries before `started_at` were there before the watch.
    pub(super) fn new(
        log: Arc<Log<O>>,
        next: u64,
        started_at: u64,
        resource_version: u64,
        bookmarks: bool,
        open: OpenGuard,
    ) -> Self {
        let wake = log.subscribe();
        Self {
            log,
            segments: VecDeque::new(),
            next,
            started_at,
            resource_version,
            bookmarks,
            wake,
            waiting: None,
            open: Some(open),
            done: false,
        }
    }

    /// Every event up to this resource version has been read (or skipped as older than the
    /// watch).
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// Whether the cursor ended (closed or expired): it returns nothing more.
    pub fn is_done(&self) -> bool {
        self.done
    }

    fn finish(&mut self, item: Item<O>) -> Option<Item<O>> {
        self.done = true;
        self.segments.clear();
        self.waiting = None;
        self.open = None;
        Some(item)
    }

    /// The next item if one is in the log, without waiting.
    pub fn try_next(&mut self) -> Option<Item<O>> {
        loop {
            if self.done {
                return None;
            }
            let Some(segment) = self.segments.front() else {
                if self.next >= self.log.end() {
                    return None;
                }
                match self.log.fetch(
                    self.next,
                    self.started_at,
                    self.resource_version,
                    &mut self.segments,
                ) {
                    Fetched::Segments if self.segments.is_empty() => {
                        // Cannot happen (the newest segment is always kept); if it did, the
                        // cursor would have nothing to read, so it moves to the end.
                        self.next = self.log.end();
                        return None;
                    }
                    Fetched::Segments => continue,
                    Fetched::Expired => return self.finish(Item::Expired(self.resource_version)),
                    Fetched::Closed => return self.finish(Item::Closed),
                }
            };
            // Entries the log dropped before this segment held no event this cursor needs
            // (`fetch` checked), only markers: skip to what is kept.
            let seq = self.next.max(segment.first);
            let Some(entry) = segment.entries.get((seq - segment.first) as usize) else {
                self.segments.pop_front();
                continue;
            };
            self.next = seq + 1;
            let replayed = seq < self.started_at;
            match entry {
                Entry::Event(event) if event.resource_version > self.resource_version => {
                    self.resource_version = event.resource_version;
                    return Some(Item::Event(event.clone()));
                }
                Entry::Bookmark(rv) if self.bookmarks && !replayed => {
                    return Some(Item::Bookmark(*rv));
                }
                Entry::Close if !replayed => return self.finish(Item::Closed),
                // An event the watch started after, or a marker that is not for it.
                _ => {}
            }
        }
    }

    /// Ready when [`try_next`](Self::try_next) may have something new (or the cursor ended).
    pub fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            if self.done || !self.segments.is_empty() || self.next < self.log.end() {
                self.waiting = None;
                return Poll::Ready(());
            }
            let wait = match self.waiting.as_mut() {
                Some(wait) => wait,
                None => {
                    // Mark the current end seen, then look again: an append after this point
                    // changes the channel, so the wait below cannot miss it.
                    self.wake.borrow_and_update();
                    if self.next < self.log.end() {
                        continue;
                    }
                    let mut wake = self.wake.clone();
                    self.waiting.insert(Box::pin(async move {
                        // Never an error: the sender lives in the log this cursor holds.
                        let _ = wake.changed().await;
                    }))
                }
            };
            match wait.as_mut().poll(cx) {
                // The log holds the sender, and the cursor holds the log: the wait ends only
                // because entries were appended; the loop looks at them.
                Poll::Ready(()) => self.waiting = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Waits until [`try_next`](Self::try_next) may have something new. Cancel-safe.
    pub async fn ready(&mut self) {
        std::future::poll_fn(|cx| self.poll_ready(cx)).await
    }

    /// The next item, waiting for one; `None` once the cursor ended.
    pub async fn next(&mut self) -> Option<Item<O>> {
        loop {
            if let Some(item) = self.try_next() {
                return Some(item);
            }
            if self.done {
                return None;
            }
            self.ready().await;
        }
    }
}
