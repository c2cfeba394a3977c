//! The event log: an append-only sequence of entries, published in segments (one per write
//! batch), that every watch reads through its own [`Cursor`](super::Cursor).
//!
//! A writer appends one segment per batch under the log's lock; a reader takes the same lock
//! once to clone the `Arc`s of every segment after its position, then reads their entries with
//! no lock at all. So a batch of `n` events costs the writer one lock and each watcher one
//! lock, not `n`.
//!
//! Every entry has a sequence number (its position in the log, counting from 0); events also
//! carry their resource version, which grows by one per event. The log keeps the segments that
//! hold at least one of the newest `window` events (the window); older segments are dropped, so
//! a watcher that fell more than the window behind finds the events it needs gone and ends
//! with `410 Expired` instead of holding them in memory.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::lock;
use tokio::sync::watch;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// It was created.
    Added,
    /// It changed.
    Modified,
    /// It was deleted; the event carries its last state.
    Deleted,
}

/// One change, as the log keeps it and a watch receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event<O> {
    /// What happened.
    pub kind: Kind,
    /// The event's resource version: one more than the previous event's.
    pub resource_version: u64,
    /// The object after the change (for a deletion, its last state).
    pub object: O,
}

/// One entry of the log.
#[derive(Debug)]
pub(super) enum Entry<O> {
    /// A change.
    Event(Event<O>),
    /// A bookmark at this resource version, for the watches that allow them.
    Bookmark(u64),
    /// Every watch open when it was appended ends here.
    Close,
}

/// The entries of one batch.
#[derive(Debug)]
pub(super) struct Segment<O> {
    /// The sequence number of `entries[0]`.
    pub(super) first: u64,
    pub(super) entries: Box<[Entry<O>]>,
    /// The resource version after the batch: the newest event's, in it or before it.
    last_resource_version: u64,
}

impl<O> Segment<O> {
    /// The sequence number after its last entry.
    pub(super) fn end(&self) -> u64 {
        self.first + self.entries.len() as u64
    }
}

/// What a reader found after its position.
pub(super) enum Fetched {
    /// The segments holding its next entries were appended to the reader's queue.
    Segments,
    /// Events it has not read fell out of the window.
    Expired,
    /// Events it has not read fell out of the window, but a close after its position ends it
    /// first: it ends as closed, and whoever resumes from its version learns of the rest.
    Closed,
}

struct Segments<O> {
    segments: VecDeque<Arc<Segment<O>>>,
    /// The sequence number of the next entry.
    end: u64,
    /// The newest event's resource version.
    resource_version: u64,
    /// The sequence number of the newest `Close` entry.
    last_close: Option<u64>,
}

/// The log (see the module documentation).
pub(super) struct Log<O> {
    segments: Mutex<Segments<O>>,
    /// `Segments::end`, readable without the lock: a reader with nothing left in hand looks
    /// here before taking it. Stored with `Release` under the lock after the segment is pushed;
    /// loaded with `Acquire` by readers, so a reader that sees the new end finds the segment.
    end: AtomicU64,
    /// Wakes the readers waiting for new entries (its value is `end`).
    wake: watch::Sender<u64>,
    /// How many of the newest events the log keeps (at least 1).
    window: u64,
}

impl<O> Log<O> {
    /// An empty log at `resource_version`, keeping the newest `window` events (at least 1).
    pub(super) fn new(resource_version: u64, window: usize) -> Self {
        Self {
            segments: Mutex::new(Segments {
                segments: VecDeque::new(),
                end: 0,
                resource_version,
                last_close: None,
            }),
            end: AtomicU64::new(0),
            wake: watch::Sender::new(0),
            window: window.max(1) as u64,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Segments<O>> {
        // Every change under the lock completes before anything that can panic runs.
        lock(&self.segments)
    }

    /// The sequence number of the next entry: a reader at it has read everything.
    pub(super) fn end(&self) -> u64 {
        // Pairs with the `Release` store in `append`.
        self.end.load(Ordering::Acquire)
    }

    /// A receiver that wakes when entries are appended.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.wake.subscribe()
    }

    /// Appends a batch of entries; `resource_version` is the newest event's after it. Events
    /// must come in resource version order; the caller serialises writers.
    pub(super) fn append(&self, entries: Vec<Entry<O>>, resource_version: Option<u64>) {
        if entries.is_empty() {
            return;
        }
        let mut log = self.lock();
        if let Some(rv) = resource_version {
            log.resource_version = rv;
        }
        let first = log.end;
        if let Some(i) = entries.iter().rposition(|e| matches!(e, Entry::Close)) {
            log.last_close = Some(first + i as u64);
        }
        let segment = Segment {
            first,
            entries: entries.into_boxed_slice(),
            last_resource_version: log.resource_version,
        };
        log.end = segment.end();
        log.segments.push_back(Arc::new(segment));
        // Events up to `newest_dropped` are out of the window: a segment whose newest event is
        // one of them holds nothing a watcher may still read. The segment just pushed always
        // stays (its resource version is above that since the window is at least 1).
        let newest_dropped = log.resource_version.saturating_sub(self.window);
        while log
            .segments
            .front()
            .is_some_and(|s| s.last_resource_version <= newest_dropped)
        {
            log.segments.pop_front();
        }
        let end = log.end;
        // Under the lock so that concurrent appends publish their ends in order.
        // Release: pairs with the `Acquire` load in `end`.
        self.end.store(end, Ordering::Release);
        self.wake.send_replace(end);
    }

    /// The sequence number where a reader that has every event up to `resource_version` starts:
    /// the first kept segment that may hold a newer event, or the end.
    pub(super) fn position_after(&self, resource_version: u64) -> u64 {
        let log = self.lock();
        log.segments
            .iter()
            .find(|s| s.last_resource_version > resource_version)
            .map_or(log.end, |s| s.first)
    }

    /// Appends to `into` the segments holding the entries from sequence number `from` on, for a
    /// reader that has read every event up to `resource_version` and started at `started_at`
    /// (closes before it are not for it).
    pub(super) fn fetch(
        &self,
        from: u64,
        started_at: u64,
        resource_version: u64,
        into: &mut VecDeque<Arc<Segment<O>>>,
    ) -> Fetched {
        let log = self.lock();
        if resource_version < log.resource_version.saturating_sub(self.window) {
            // An event after `resource_version` (there is one: the newest is past the window's start)
            // is out of the window.
            return match log.last_close {
                Some(close) if close >= from && close >= started_at => Fetched::Closed,
                _ => Fetched::Expired,
            };
        }
        let start = log.segments.partition_point(|s| s.end() <= from);
        into.extend(log.segments.range(start..).cloned());
        Fetched::Segments
    }

    /// How many segments it keeps (for tests of the window).
    #[cfg(test)]
    pub(super) fn kept_segments(&self) -> usize {
        self.lock().segments.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(from: u64, n: u64) -> Vec<Entry<u64>> {
        (from..from + n)
            .map(|rv| {
                Entry::Event(Event {
                    kind: Kind::Added,
                    resource_version: rv,
                    object: rv,
                })
            })
            .collect()
    }

    #[test]
    fn the_log_keeps_the_segments_holding_the_window_and_expires_readers_behind_it() {
        let log = Log::new(0, 4);
        for batch in 0..5 {
            log.append(events(batch * 2 + 1, 2), Some(batch * 2 + 2));
        }
        // Events 1..=10 in batches of 2: the window is 7..=10, in the last two segments.
        assert_eq!(log.end(), 10);
        assert_eq!(log.kept_segments(), 2);
        let mut got = VecDeque::new();
        assert!(matches!(log.fetch(0, 0, 5, &mut got), Fetched::Expired));
        assert!(matches!(log.fetch(0, 0, 6, &mut got), Fetched::Segments));
        assert_eq!(got.iter().map(|s| s.first).collect::<Vec<_>>(), [6, 8]);
        got.clear();
        log.fetch(9, 0, 9, &mut got);
        assert_eq!(got.iter().map(|s| s.first).collect::<Vec<_>>(), [8]);
        assert_eq!(log.position_after(7), 6);
        assert_eq!(log.position_after(8), 8);
        assert_eq!(log.position_after(10), 10);
        // A marker is an entry, not an event: the window does not move.
        log.append(vec![Entry::Bookmark(10)], None);
        assert_eq!((log.end(), log.kept_segments()), (11, 3));
        // A reader behind the window whose next entries include a close ends closed; a close
        // from before it started is not for it.
        log.append(vec![Entry::Close], None);
        log.append(events(11, 8), Some(18));
        assert!(matches!(log.fetch(11, 0, 10, &mut got), Fetched::Closed));
        assert!(matches!(log.fetch(11, 12, 10, &mut got), Fetched::Expired));
        assert!(matches!(log.fetch(12, 0, 10, &mut got), Fetched::Expired));
    }
}
