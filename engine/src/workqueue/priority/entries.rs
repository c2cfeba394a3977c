//! The ordered entries of a priority queue: controller-runtime's `priorityqueue` state (its
//! `items` map, `ready` and `waiting` btrees, `locked` set and `addedCounter`) as plain data,
//! with kcache's two opt-in ordering rules, aging and fairness ([`Scheduling`]).
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
//! - The ready order is priority descending, then turn ascending, then counter ascending. The
//!   turn is always 0 without fairness, so the order is controller-runtime's.
//! - Waiting entries whose time the clock reached become ready in waiting order (ready time,
//!   then priority descending, then counter), each taking the next counter.
//! - `take` hands out the first ready entry whose key is not being processed and removes the
//!   entry; a key added while it is processed gets a new entry, skipped until `done`.
//!
//! # Aging (`max_wait`)
//!
//! Every ready entry remembers since when it is ready (`since`): the ready time it waited for
//! when the clock made it ready, else the time of the add that made it ready. A priority raise
//! keeps it. At a `take` at time `now`, an entry is *overdue* when `since + max_wait <= now`;
//! overdue entries go before every other entry, oldest `since` first, then lower counter.
//!
//! # Fairness (groups)
//!
//! Each entry carries a group. Within a level, an entry's *turn* is fixed when it enters the
//! level's ready set (created ready, made ready by the clock or an add, or raised into the
//! level): `max(round, last + 1)`, where `round` is the highest turn handed out at the level
//! and `last` the turn the level last gave the entry's group (no `last`: just `round`). Both are
//! forgotten when the level has no ready entry. A ready entry that stays at its level keeps its
//! turn. So each group has at most one entry per turn: a level serves its groups round robin,
//! in counter order within a turn, and a group that joins late starts in the current turn.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::key::{Key, KeyMap};

use super::super::clock::Time;
use super::metrics::PriorityMetrics;
use super::Priority;

/// Where a ready entry sits: priority descending, then turn, then insertion counter.
type ReadySlot = (Reverse<Priority>, u64, u64);
/// Where a waiting entry sits: ready time, then priority descending, then counter.
type WaitingSlot = (Time, Reverse<Priority>, u64);
/// Where a ready entry sits in the aging order: ready since, then counter.
type AgeSlot = (Time, u64);

/// The opt-in ordering rules of one set of entries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Scheduling {
    /// Aging: an entry ready for this long goes before every entry that is not.
    pub(crate) max_wait: Option<Duration>,
    /// Fairness: entries carry a group, served round robin within a level.
    pub(crate) fair: bool,
}

/// One key's entry.
#[derive(Debug, Clone)]
struct Entry {
    priority: Priority,
    counter: u64,
    /// The entry's turn within its level (0 without fairness); meaningful while ready.
    turn: u64,
    /// `None`: ready now (in `ready`); `Some(t)`: waits until `t` (in `waiting`).
    ready_at: Option<Time>,
    /// Since when the entry is ready, for aging; meaningful while ready.
    since: Time,
    /// When the entry became ready, for the queue-duration metric (`Time::ZERO` without
    /// metrics, or while waiting).
    ready_since: Time,
    /// The entry's group, with fairness on.
    group: Option<Key>,
}

impl Entry {
    fn ready_slot(&self) -> ReadySlot {
        (Reverse(self.priority), self.turn, self.counter)
    }

    fn waiting_slot(&self, at: Time) -> WaitingSlot {
        (at, Reverse(self.priority), self.counter)
    }

    fn age_slot(&self) -> AgeSlot {
        (self.since, self.counter)
    }
}

/// A key handed out by [`Entries::take`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Taken {
    pub(crate) key: Key,
    pub(crate) priority: Priority,
    /// Handed out because aging made it overdue (it may have passed higher priorities).
    pub(crate) overdue: bool,
}

/// What an add changed, for the caller's wake-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Added {
    /// A ready entry was created, or a waiting one made ready: a `get` may have work.
    pub(crate) ready: bool,
    /// A waiting entry was created or moved earlier: it waits until this time.
    pub(crate) waiting_until: Option<Time>,
}

/// One level's round-robin state (fairness).
#[derive(Debug, Default)]
struct Level {
    /// The highest turn handed out at this level.
    round: u64,
    /// Per group, the turn the level last gave it.
    last: HashMap<Key, u64>,
}

/// The entries of one lock's worth of keys.
#[derive(Debug, Default)]
pub(crate) struct Entries {
    scheduling: Scheduling,
    /// Every key with an entry, ready or waiting.
    items: KeyMap<Entry>,
    ready: BTreeMap<ReadySlot, Key>,
    waiting: BTreeMap<WaitingSlot, Key>,
    /// The ready entries in aging order; kept only with aging on.
    by_age: BTreeMap<AgeSlot, Key>,
    /// Per level with ready entries, its round-robin state; kept only with fairness on.
    levels: HashMap<Priority, Level>,
    /// Keys handed out by `take` and not yet done, with the time `take` handed them out
    /// (kept for the metrics only; `Time::ZERO` without them).
    processing: KeyMap<Time>,
    /// The insertion counter (controller-runtime `addedCounter`).
    counter: u64,
}

impl Entries {
    /// Entries ordered with `scheduling`'s rules.
    pub(crate) fn new(scheduling: Scheduling) -> Self {
        Self {
            scheduling,
            ..Self::default()
        }
    }

    fn next_counter(&mut self) -> u64 {
        let counter = self.counter;
        self.counter += 1;
        counter
    }

    /// Puts `entry` (ready, its priority, counter, `since` and group set) into the ready set,
    /// giving it its turn.
    fn insert_ready(&mut self, key: Key, mut entry: Entry) {
        entry.ready_at = None;
        entry.turn = 0;
        if let Some(group) = entry.group.as_ref().filter(|_| self.scheduling.fair) {
            let level = self.levels.entry(entry.priority).or_default();
            entry.turn = match level.last.get(group) {
                Some(&last) => level.round.max(last + 1),
                None => level.round,
            };
            level.last.insert(group.clone(), entry.turn);
        }
        if self.scheduling.max_wait.is_some() {
            self.by_age.insert(entry.age_slot(), key.clone());
        }
        self.ready.insert(entry.ready_slot(), key.clone());
        self.items.insert(key, entry);
    }

    /// Takes ready `entry` out of the ready set (it stays in `items`); forgets its level's
    /// round robin once the level has no ready entry.
    fn remove_ready(&mut self, entry: &Entry) -> Key {
        let key = self
            .ready
            .remove(&entry.ready_slot())
            .expect("a ready entry is in the ready set");
        if self.scheduling.max_wait.is_some() {
            self.by_age.remove(&entry.age_slot());
        }
        if self.scheduling.fair && !self.level_has_ready(entry.priority) {
            self.levels.remove(&entry.priority);
        }
        key
    }

    fn level_has_ready(&self, priority: Priority) -> bool {
        self.ready
            .range((Reverse(priority), 0, 0)..=(Reverse(priority), u64::MAX, u64::MAX))
            .next()
            .is_some()
    }

    /// Adds `key` at `priority`, ready now (`ready_at` `None`) or at `ready_at`; `now` is the
    /// add's time and `group` its group (fairness).
    pub(crate) fn add(
        &mut self,
        key: Key,
        priority: Priority,
        ready_at: Option<Time>,
        now: Time,
        group: Option<Key>,
        metrics: Option<&PriorityMetrics>,
    ) -> Added {
        let Some(old) = self.items.get(&key).cloned() else {
            let mut entry = Entry {
                priority,
                counter: self.next_counter(),
                turn: 0,
                ready_at,
                since: now,
                ready_since: Time::ZERO,
                group,
            };
            return match ready_at {
                Some(at) => {
                    self.waiting.insert(entry.waiting_slot(at), key.clone());
                    self.items.insert(key, entry);
                    Added {
                        ready: false,
                        waiting_until: Some(at),
                    }
                }
                None => {
                    if let Some(metrics) = metrics {
                        entry.ready_since = metrics.add(priority);
                    }
                    self.insert_ready(key, entry);
                    Added {
                        ready: true,
                        waiting_until: None,
                    }
                }
            };
        };
        let raised = priority > old.priority;
        if old.ready_at.is_none() && !raised {
            // Ready, and not raised: it keeps its place (counter, turn, since) as it is.
            return Added::default();
        }
        // Ready now if either add is; else the earlier of the two times.
        let ready_at = match (old.ready_at, ready_at) {
            (None, _) | (_, None) => None,
            (Some(a), Some(b)) => Some(a.min(b)),
        };
        let mut entry = old.clone();
        if raised {
            if old.ready_at.is_none() {
                if let Some(metrics) = metrics {
                    metrics.move_depth(old.priority, priority);
                }
            }
            entry.priority = priority;
            entry.counter = self.next_counter();
        }
        // Take the old slot out, put the new one in.
        let key = match old.ready_at {
            None => self.remove_ready(&old),
            Some(at) => self
                .waiting
                .remove(&old.waiting_slot(at))
                .expect("a waiting entry is in the waiting set"),
        };
        match ready_at {
            None => {
                if old.ready_at.is_some() {
                    entry.since = now;
                    if let Some(metrics) = metrics {
                        entry.ready_since = metrics.add(entry.priority);
                    }
                }
                self.insert_ready(key, entry);
                Added {
                    ready: old.ready_at.is_some(),
                    waiting_until: None,
                }
            }
            Some(at) => {
                entry.ready_at = Some(at);
                self.waiting.insert(entry.waiting_slot(at), key.clone());
                self.items.insert(key, entry);
                Added {
                    ready: false,
                    waiting_until: Some(at),
                }
            }
        }
    }

    /// Makes every waiting entry whose time is `<= now` ready, in waiting order, each taking
    /// the next counter and ready since its ready time. Returns how many. [`Time::MAX`] is
    /// "never" and never becomes ready.
    pub(crate) fn promote(&mut self, now: Time, metrics: Option<&PriorityMetrics>) -> usize {
        let mut moved = 0;
        while let Some(first) = self.waiting.first_entry() {
            let (at, Reverse(priority), _) = *first.key();
            if at > now || at == Time::MAX {
                break;
            }
            let key = first.remove();
            let mut entry = self.items.remove(&key).expect("a waiting key has an entry");
            entry.counter = self.next_counter();
            entry.since = at;
            if let Some(metrics) = metrics {
                entry.ready_since = metrics.add(priority);
            }
            self.insert_ready(key, entry);
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

    /// The oldest ready entry whose key is not being processed, in aging order (with aging on).
    fn oldest_available(&self) -> Option<(&AgeSlot, &Key)> {
        self.by_age
            .iter()
            .find(|(_, key)| !self.processing.contains_key(*key))
    }

    /// The first ready entry whose key is not being processed, in the ready order.
    fn first_available(&self) -> Option<&Key> {
        self.ready
            .values()
            .find(|key| !self.processing.contains_key(*key))
    }

    /// The entry [`take`](Entries::take) would hand out at `now`, and whether it is overdue.
    fn next_at(&self, now: Time) -> Option<(&Key, bool)> {
        if let Some(max_wait) = self.scheduling.max_wait {
            if let Some(((since, _), key)) = self.oldest_available() {
                if since.saturating_add(max_wait) <= now {
                    return Some((key, true));
                }
            }
        }
        self.first_available().map(|key| (key, false))
    }

    /// The priority of the entry the ready order would hand out next (overdue entries aside):
    /// what a shard advertises.
    pub(crate) fn available_priority(&self) -> Option<Priority> {
        self.first_available().map(|key| self.items[key].priority)
    }

    /// With aging on, since when the oldest entry a `take` may hand out is ready.
    pub(crate) fn oldest_available_since(&self) -> Option<Time> {
        self.oldest_available().map(|((since, _), _)| *since)
    }

    /// Hands out at `now` the first entry whose key is not being processed (an overdue one
    /// first, with aging on): removes the entry and marks the key processing.
    pub(crate) fn take(&mut self, now: Time, metrics: Option<&PriorityMetrics>) -> Option<Taken> {
        let (key, overdue) = self.next_at(now)?;
        let key = key.clone();
        let entry = self.items.remove(&key).expect("a ready key has an entry");
        if self.scheduling.fair {
            if let Some(level) = self.levels.get_mut(&entry.priority) {
                level.round = level.round.max(entry.turn);
            }
        }
        self.remove_ready(&entry);
        let started = match metrics {
            Some(metrics) => metrics.get(entry.priority, entry.ready_since),
            None => Time::ZERO,
        };
        self.processing.insert(key.clone(), started);
        Some(Taken {
            key,
            priority: entry.priority,
            overdue,
        })
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
