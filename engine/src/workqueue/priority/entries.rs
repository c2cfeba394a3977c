//! The ordered entries of a priority queue: controller-runtime's `priorityqueue` state (its
//! `items` map, `ready` and `waiting` btrees, `locked` set and `addedCounter`) as plain data.
//!
//! Both priority queues keep their keys here: the reference queue one `Entries` under its one
//! lock, the sharded queue one per shard under the shard's lock. Every per-key rule lives in
//! this file, so the two queues cannot disagree on them.
//!
//! # The rules
//!
//! - A key with no entry gets one: its priority, the next value of the insertion counter, and
//!   its ready time (`None`: ready now).
//! - A key with an entry keeps it. It is ready now if either add is ready now, else it waits
//!   until the earlier time; its priority becomes the higher one; only if the priority rose does
//!   it take the next counter (the back of its new level), also when a waiting entry is made
//!   ready by this add (it then keeps its old counter and may go before keys added meanwhile).
//! - The ready order is priority descending, then counter ascending.
//! - Waiting entries whose time the clock reached become ready in waiting order (ready time,
//!   then priority descending, then counter), each taking the next counter.
//! - `take` hands out the first ready entry whose key is not being processed and removes the
//!   entry; a key added while it is processed gets a new entry, skipped until `done`.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use crate::key::{Key, KeyMap};

use super::super::clock::Time;
use super::metrics::PriorityMetrics;
use super::Priority;

/// Where a ready entry sits: priority descending, then insertion counter ascending.
type ReadySlot = (Reverse<Priority>, u64);
/// Where a waiting entry sits: ready time, then the ready order.
type WaitingSlot = (Time, Reverse<Priority>, u64);

/// One key's entry.
#[derive(Debug, Clone, Copy)]
struct Entry {
    priority: Priority,
    counter: u64,
    /// `None`: ready now (in `ready`); `Some(t)`: waits until `t` (in `waiting`).
    ready_at: Option<Time>,
    /// When the entry became ready, for the queue-duration metric (`Time::ZERO` without
    /// metrics, or while waiting).
    ready_since: Time,
}

impl Entry {
    fn ready_slot(&self) -> ReadySlot {
        (Reverse(self.priority), self.counter)
    }
}

/// What an add changed, for the caller's wake-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Added {
    /// A ready entry was created, or a waiting one made ready: a `get` may have work.
    pub(crate) ready: bool,
    /// A waiting entry was created or moved earlier: it waits until this time.
    pub(crate) waiting_until: Option<Time>,
}

/// The entries of one lock's worth of keys.
#[derive(Debug, Default)]
pub(crate) struct Entries {
    /// Every key with an entry, ready or waiting.
    items: KeyMap<Entry>,
    ready: BTreeMap<ReadySlot, Key>,
    waiting: BTreeMap<WaitingSlot, Key>,
    /// Keys handed out by `take` and not yet done, with the time `take` handed them out
    /// (kept for the metrics only; `Time::ZERO` without them).
    processing: KeyMap<Time>,
    /// The insertion counter (controller-runtime `addedCounter`).
    counter: u64,
}

impl Entries {
    fn next_counter(&mut self) -> u64 {
        let counter = self.counter;
        self.counter += 1;
        counter
    }

    /// Adds `key` at `priority`, ready now (`ready_at` `None`) or at `ready_at`.
    pub(crate) fn add(
        &mut self,
        key: Key,
        priority: Priority,
        ready_at: Option<Time>,
        metrics: Option<&PriorityMetrics>,
    ) -> Added {
        let Some(&old) = self.items.get(&key) else {
            let mut entry = Entry {
                priority,
                counter: self.next_counter(),
                ready_at,
                ready_since: Time::ZERO,
            };
            self.items.insert(key.clone(), entry);
            return match ready_at {
                Some(at) => {
                    self.waiting
                        .insert((at, Reverse(priority), entry.counter), key);
                    Added {
                        ready: false,
                        waiting_until: Some(at),
                    }
                }
                None => {
                    if let Some(metrics) = metrics {
                        entry.ready_since = metrics.add(priority);
                        self.items.insert(key.clone(), entry);
                    }
                    self.ready.insert(entry.ready_slot(), key);
                    Added {
                        ready: true,
                        waiting_until: None,
                    }
                }
            };
        };
        // Ready now if either add is; else the earlier of the two times.
        let ready_at = match (old.ready_at, ready_at) {
            (None, _) | (_, None) => None,
            (Some(a), Some(b)) => Some(a.min(b)),
        };
        let mut entry = old;
        if priority > old.priority {
            if old.ready_at.is_none() {
                if let Some(metrics) = metrics {
                    metrics.move_depth(old.priority, priority);
                }
            }
            entry.priority = priority;
            entry.counter = self.next_counter();
        }
        entry.ready_at = ready_at;
        if ready_at.is_none() && old.ready_at.is_some() {
            if let Some(metrics) = metrics {
                entry.ready_since = metrics.add(entry.priority);
            }
        }
        // Take the old slot out, put the new one in.
        let key = match old.ready_at {
            None => self.ready.remove(&old.ready_slot()),
            Some(at) => self
                .waiting
                .remove(&(at, Reverse(old.priority), old.counter)),
        }
        .expect("an entry is in the tree its ready time says");
        self.items.insert(key.clone(), entry);
        let mut added = Added::default();
        match ready_at {
            None => {
                added.ready = old.ready_at.is_some();
                self.ready.insert(entry.ready_slot(), key);
            }
            Some(at) => {
                self.waiting
                    .insert((at, Reverse(entry.priority), entry.counter), key);
                added.waiting_until = Some(at);
            }
        }
        added
    }

    /// Makes every waiting entry whose time is `<= now` ready, in waiting order, each taking
    /// the next counter. Returns how many. [`Time::MAX`] is "never" and never becomes ready.
    pub(crate) fn promote(&mut self, now: Time, metrics: Option<&PriorityMetrics>) -> usize {
        let mut moved = 0;
        while let Some(entry) = self.waiting.first_entry() {
            let (at, Reverse(priority), _) = *entry.key();
            if at > now || at == Time::MAX {
                break;
            }
            let key = entry.remove();
            let counter = self.next_counter();
            let item = self
                .items
                .get_mut(&key)
                .expect("a waiting key has an entry");
            item.ready_at = None;
            item.counter = counter;
            if let Some(metrics) = metrics {
                item.ready_since = metrics.add(priority);
            }
            self.ready.insert((Reverse(priority), counter), key);
            moved += 1;
        }
        moved
    }

    /// The earliest time a waiting entry becomes ready, if any can.
    pub(crate) fn next_ready_at(&self) -> Option<Time> {
        self.waiting
            .first_key_value()
            .map(|((at, _, _), _)| *at)
            .filter(|&at| at != Time::MAX)
    }

    /// The first ready entry whose key is not being processed.
    fn first_available(&self) -> Option<(&ReadySlot, &Key)> {
        self.ready
            .iter()
            .find(|(_, key)| !self.processing.contains_key(*key))
    }

    /// The priority of the entry [`take`](Entries::take) would hand out.
    pub(crate) fn available_priority(&self) -> Option<Priority> {
        self.first_available().map(|((Reverse(p), _), _)| *p)
    }

    /// Hands out the first ready entry whose key is not being processed: removes the entry and
    /// marks the key processing.
    pub(crate) fn take(&mut self, metrics: Option<&PriorityMetrics>) -> Option<(Key, Priority)> {
        let slot = *self.first_available()?.0;
        let key = self.ready.remove(&slot).expect("found just above");
        let entry = self.items.remove(&key).expect("a ready key has an entry");
        let priority = slot.0 .0;
        let started = match metrics {
            Some(metrics) => metrics.get(priority, entry.ready_since),
            None => Time::ZERO,
        };
        self.processing.insert(key.clone(), started);
        Some((key, priority))
    }

    /// Ends the processing of `key`. `None` if it was not being processed; else whether it has
    /// a ready entry (added while processed), which a `get` can take now.
    pub(crate) fn done(&mut self, key: &Key, metrics: Option<&PriorityMetrics>) -> Option<bool> {
        let started = self.processing.remove(key)?;
        if let Some(metrics) = metrics {
            metrics.done(started);
        }
        Some(self.items.get(key).is_some_and(|e| e.ready_at.is_none()))
    }

    /// Whether `key` is being processed.
    pub(crate) fn is_processing(&self, key: &Key) -> bool {
        self.processing.contains_key(key)
    }

    /// Ready entries, including those of keys being processed.
    pub(crate) fn ready_len(&self) -> usize {
        self.ready.len()
    }

    /// Waiting entries.
    pub(crate) fn waiting_len(&self) -> usize {
        self.waiting.len()
    }

    /// Keys being processed.
    pub(crate) fn processing_len(&self) -> usize {
        self.processing.len()
    }

    /// When each key being processed was handed out.
    pub(crate) fn processing_started(&self) -> impl Iterator<Item = Time> + '_ {
        self.processing.values().copied()
    }
}
