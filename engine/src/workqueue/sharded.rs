//! The sharded work queue: client-go's per-item rules with no global lock on add, get or done.
//!
//! # Design
//!
//! Items are split into `N` shards (a power of two) by their [`Key`]'s precomputed hash. A shard
//! is one mutex over a map `item -> phase` and a FIFO of its queued items; `add`, `get` and
//! `done` each lock one shard. Shards with queued items hold one token each in a lock-free
//! scheduler (`ReadyShards`, the sharded DeltaFIFO's design with async waiters), which `get`s
//! take round-robin: a `get` takes a token, hands out the head of that shard, and puts the
//! token back at the tail if the shard has more.
//!
//! An item's phase is client-go's three sets folded into one map entry: *queued* (in `queue`
//! and `dirty`), *processing*, or *processing and dirty*. An item is in its shard's FIFO exactly
//! when it is queued, so a token always finds an item to hand out, and a processing item is
//! never handed out again before `done` (which queues it at the back if it became dirty).
//!
//! `done` of an item that is not processing is refused with [`NotProcessing`] and changes
//! nothing: the sharded queue does not reproduce client-go's double-queueing quirk.
//!
//! # Order and fairness
//!
//! - With **one shard** the queue is the reference's line for line: one FIFO, one token.
//! - With **N shards**, items of one shard are handed out in the order they were queued (an item
//!   re-queued by `done` goes to the back, as in client-go). Across shards, each `get` serves the
//!   shard at the head of the token FIFO, one item per visit. An item with `p` items ahead of it
//!   in its shard is therefore handed out within `p + 1` visits to its shard, and between two
//!   visits every other shard is visited at most once: at most `(p + 1) · (N − 1)` items of
//!   other shards are handed out before it, however many are added meanwhile.
//!
//! # Shutdown
//!
//! `shut_down` sets a flag that `add` reads under its shard lock and closes the scheduler,
//! which wakes every waiting `get`; queued items are still handed out (tokens outlive the
//! close). `shut_down_with_drain` then waits on a condition variable that a `done` leaving its
//! shard with nothing processing signals, only while a drain is waiting.

use std::collections::hash_map::Entry;
use std::collections::VecDeque;
use std::fmt;
use std::task::{Context, Poll};

use crossbeam_utils::CachePadded;

use crate::key::{Key, KeyMap};
use crate::sharded::idle::IdlePolicy;
use crate::sync::{lock, wait, AtomicBool, Condvar, Mutex, MutexGuard, Ordering};

use super::clock::Time;
use super::metrics::{QueueConfig, QueueMetrics};
use super::queue::{NotProcessing, ShutDown, TryGet, WaitSlot, WorkQueue};
use super::ready::{Ready, ReadyShards};
use super::waiters::block_on;

/// The shard count [`ShardedQueue::with_default_shards`] uses.
pub const DEFAULT_WORKQUEUE_SHARDS: usize = 16;

/// client-go's three sets, per item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// In `queue` and `dirty`.
    Queued,
    /// In `processing`.
    Processing,
    /// In `processing` and `dirty`: `done` queues it again.
    ProcessingDirty,
}

/// An item's entry; the times are kept only when the queue has metrics.
struct Item {
    phase: Phase,
    /// First add time not yet observed by a `get` (client-go `addTimes`).
    added_at: Option<Time>,
    /// When `get` handed it out (client-go `processingStartTimes`).
    started_at: Option<Time>,
}

/// One shard.
struct Shard {
    /// Every item that is queued, processing, or both; absent items are clean and idle.
    items: KeyMap<Item>,
    /// The queued items, in order. Exactly the items whose phase is `Queued`.
    queue: VecDeque<Key>,
    /// Items in a processing phase.
    processing: usize,
    /// The shard has a token in the scheduler or a `get` is serving it. A shard with queued
    /// items is always scheduled.
    scheduled: bool,
}

impl Shard {
    /// Sets `scheduled`; true if the caller must hand the scheduler a token.
    fn mark_scheduled(&mut self) -> bool {
        !std::mem::replace(&mut self.scheduled, true)
    }
}

/// The sharded work queue: client-go's per-item rules, one lock per shard, and a lock-free
/// scheduler of shards with queued items.
///
/// # Guarantees
///
/// - **Dedup and exclusivity** are client-go's: an item queued or dirty is not queued again; an
///   item being processed is never handed to a second worker; added meanwhile, it is queued
///   again by `done`.
/// - **One shard** hands items out in exactly the reference's order.
/// - **Order and fairness with `N` shards**: items of one shard come out in the order they were
///   queued (an item re-queued by `done` goes to the back). Each `get` serves the next shard in
///   a round-robin of the shards with queued items, one item per visit. An item with `p` items
///   ahead of it in its shard is handed out within `p + 1` visits to its shard, and every other
///   shard is visited at most once between two of those: at most `(p + 1) · (N − 1)` items of
///   other shards are handed out before it, however many are added meanwhile.
/// - `done` of an item not being processed is refused ([`NotProcessing`]); client-go's
///   double-queueing quirk is not reproduced.
///
/// A `get` that finds nothing polls for about 50 µs before it sleeps, since an item usually
/// follows within microseconds under load — but only one `get` at a time polls; the others
/// sleep at once. Controllers run more workers than cores, and several polling workers would
/// take the cores from the threads that produce the items (the informer's producer and
/// consumer). While a `get` polls, or a woken one has not yet found its item, an add wakes no
/// sleeper: the searcher takes the item and wakes the next sleeper only if more are queued
/// (Go's spinning-thread rule), so a burst of adds does not wake a sleeper per shard.
///
/// ```
/// use kcache::Key;
/// use kcache::workqueue::{NotProcessing, ShardedQueue, TryGet, WorkQueue};
/// let q = ShardedQueue::new(4);
/// q.add(Key::new("a"));
/// assert_eq!(q.done(&Key::new("a")), Err(NotProcessing(Key::new("a"))), "a was never handed out");
/// let a = q.get().unwrap();
/// q.add(a.clone());
/// assert_eq!(q.try_get(), TryGet::Empty, "a is processing: not handed to a second worker");
/// q.done(&a).unwrap();
/// assert_eq!(q.try_get(), TryGet::Item(a));
/// ```
pub struct ShardedQueue {
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    mask: usize,
    ready: ReadyShards,
    shutting_down: AtomicBool,
    /// A `shut_down_with_drain` is waiting; a plain `shut_down` clears it.
    drain: AtomicBool,
    drain_lock: Mutex<()>,
    drained: Condvar,
    metrics: Option<QueueMetrics>,
    /// Whether a `get`'s poll before it waits has been paying.
    idle: IdlePolicy,
}

/// Shard selection uses bits 32.. of the hash, which the shard maps' own bucket index (low
/// bits) and control bytes (top 7 bits) do not depend on.
const SHARD_BITS_OFFSET: u32 = 32;

impl ShardedQueue {
    /// A queue with `shards` shards (rounded up to a power of two, at least 1, at most 2^16),
    /// unnamed: no metrics, real clock.
    pub fn new(shards: usize) -> Self {
        Self::with_config(shards, &QueueConfig::new())
    }

    /// A queue with [`DEFAULT_WORKQUEUE_SHARDS`] shards.
    pub fn with_default_shards() -> Self {
        Self::new(DEFAULT_WORKQUEUE_SHARDS)
    }

    /// A queue with `shards` shards and `config`'s name, metrics provider and clock.
    pub fn with_config(shards: usize, config: &QueueConfig) -> Self {
        let count = shards.clamp(1, 1 << 16).next_power_of_two();
        Self {
            shards: (0..count)
                .map(|_| {
                    CachePadded::new(Mutex::new(Shard {
                        items: KeyMap::default(),
                        queue: VecDeque::new(),
                        processing: 0,
                        scheduled: false,
                    }))
                })
                .collect(),
            mask: count - 1,
            ready: ReadyShards::new(),
            shutting_down: AtomicBool::new(false),
            drain: AtomicBool::new(false),
            drain_lock: Mutex::new(()),
            drained: Condvar::new(),
            metrics: config.queue_metrics(),
            idle: IdlePolicy::new(),
        }
    }

    /// How many shards the queue has.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    fn shard_of(&self, item: &Key) -> usize {
        (item.hash_value() >> SHARD_BITS_OFFSET) as usize & self.mask
    }

    fn lock_shard(&self, index: usize) -> MutexGuard<'_, Shard> {
        lock(&*self.shards[index])
    }

    /// Hands out the head of `shard`, which the caller took a token for. `None` only if the
    /// shard had nothing queued, which the invariant on `scheduled` rules out.
    fn serve(&self, index: usize) -> Option<Key> {
        let mut guard = self.lock_shard(index);
        let shard = &mut *guard;
        let Some(key) = shard.queue.pop_front() else {
            shard.scheduled = false;
            return None;
        };
        if let Some(item) = shard.items.get_mut(&key) {
            item.phase = Phase::Processing;
            if let Some(metrics) = &self.metrics {
                item.started_at = Some(metrics.got(item.added_at.take()));
            }
        }
        shard.processing += 1;
        let reschedule = !shard.queue.is_empty();
        shard.scheduled = reschedule;
        drop(guard);
        if reschedule {
            // Back of the line: other shards with items get their turn first (fairness).
            self.ready.schedule(index);
        }
        Some(key)
    }

    /// Whether any item is being processed. Locks each shard in turn.
    fn any_processing(&self) -> bool {
        (0..self.shards.len()).any(|i| self.lock_shard(i).processing > 0)
    }

    fn wake_drainer(&self) {
        let _guard = lock(&self.drain_lock);
        self.drained.notify_all();
    }
}

impl WorkQueue for ShardedQueue {
    fn add(&self, item: Key) {
        let index = self.shard_of(&item);
        let mut guard = self.lock_shard(index);
        // Read under the shard lock: an add either precedes `shut_down` (and its item is
        // handed out like any queued one) or sees the flag. Acquire pairs with its Release.
        if self.shutting_down.load(Ordering::Acquire) {
            return;
        }
        let shard = &mut *guard;
        let schedule = match shard.items.entry(item) {
            Entry::Occupied(mut entry) => {
                let item = entry.get_mut();
                if item.phase != Phase::Processing {
                    return; // dirty already
                }
                item.phase = Phase::ProcessingDirty;
                if let Some(metrics) = &self.metrics {
                    let now = metrics.added();
                    item.added_at.get_or_insert(now);
                }
                false
            }
            Entry::Vacant(entry) => {
                shard.queue.push_back(entry.key().clone());
                entry.insert(Item {
                    phase: Phase::Queued,
                    added_at: self.metrics.as_ref().map(QueueMetrics::added),
                    started_at: None,
                });
                shard.mark_scheduled()
            }
        };
        drop(guard);
        if schedule {
            self.ready.schedule(index);
        }
    }

    fn get(&self) -> Result<Key, ShutDown> {
        let mut slot = WaitSlot::default();
        loop {
            match self.ready.try_acquire() {
                Ready::Shard(index) => {
                    if let Some(key) = self.serve(index) {
                        return Ok(key);
                    }
                }
                Ready::Closed => return Err(ShutDown),
                Ready::Empty => break,
            }
        }
        // Poll briefly before sleeping, as the searcher: under load an item usually follows
        // within microseconds, and a park/unpark costs both sides a system call. Only one
        // `get` searches at a time (with more workers than cores, every extra poller takes a
        // core from whoever would add the item it waits for), and while one does, adds wake
        // no sleeper (ready.rs, "The searcher").
        if self.ready.claim_search() {
            slot.searching = true;
            let mut backoff = self.idle.backoff();
            loop {
                match self.ready.try_acquire_searching() {
                    Ready::Shard(index) => {
                        slot.searching = false;
                        if let Some(key) = self.serve(index) {
                            return Ok(key);
                        }
                        break;
                    }
                    Ready::Closed => return Err(ShutDown),
                    Ready::Empty if backoff.snooze() => {}
                    // Still the searcher: `poll_get` ends the search as it waits.
                    Ready::Empty => break,
                }
            }
        }
        block_on(|cx| self.poll_get(&mut slot, cx))
    }

    fn try_get(&self) -> TryGet {
        loop {
            match self.ready.try_acquire() {
                Ready::Shard(index) => {
                    if let Some(key) = self.serve(index) {
                        return TryGet::Item(key);
                    }
                }
                Ready::Empty => return TryGet::Empty,
                Ready::Closed => return TryGet::ShutDown,
            }
        }
    }

    fn poll_get(&self, slot: &mut WaitSlot, cx: &mut Context<'_>) -> Poll<Result<Key, ShutDown>> {
        loop {
            match self.ready.poll_acquire(slot, cx) {
                Poll::Ready(Some(index)) => {
                    if let Some(key) = self.serve(index) {
                        return Poll::Ready(Ok(key));
                    }
                }
                Poll::Ready(None) => return Poll::Ready(Err(ShutDown)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    fn cancel_get(&self, slot: &mut WaitSlot) {
        self.ready.cancel(slot);
    }

    fn done(&self, item: &Key) -> Result<(), NotProcessing> {
        let index = self.shard_of(item);
        let mut guard = self.lock_shard(index);
        let shard = &mut *guard;
        let Some(entry) = shard.items.get_mut(item) else {
            return Err(NotProcessing(item.clone()));
        };
        let schedule = match entry.phase {
            Phase::Queued => return Err(NotProcessing(item.clone())),
            Phase::Processing => {
                let started_at = entry.started_at;
                shard.items.remove(item);
                if let Some(metrics) = &self.metrics {
                    metrics.done(started_at);
                }
                false
            }
            Phase::ProcessingDirty => {
                entry.phase = Phase::Queued;
                if let Some(metrics) = &self.metrics {
                    metrics.done(entry.started_at.take());
                }
                shard.queue.push_back(item.clone());
                shard.mark_scheduled()
            }
        };
        shard.processing -= 1;
        let idle = shard.processing == 0;
        drop(guard);
        if schedule {
            self.ready.schedule(index);
        }
        // Acquire pairs with the Release store in `shut_down_with_drain`; a drain that started
        // after our decrement finds it by locking this shard instead.
        if idle && self.drain.load(Ordering::Acquire) {
            self.wake_drainer();
        }
        Ok(())
    }

    fn len(&self) -> usize {
        (0..self.shards.len())
            .map(|i| self.lock_shard(i).queue.len())
            .sum()
    }

    fn processing_len(&self) -> usize {
        (0..self.shards.len())
            .map(|i| self.lock_shard(i).processing)
            .sum()
    }

    fn shut_down(&self) {
        self.drain.store(false, Ordering::Release);
        // Release pairs with the Acquire load in `add`.
        self.shutting_down.store(true, Ordering::Release);
        self.ready.close();
        self.wake_drainer();
    }

    fn shut_down_with_drain(&self) {
        self.drain.store(true, Ordering::Release);
        self.shutting_down.store(true, Ordering::Release);
        self.ready.close();
        // The drain lock is held from each check to the wait, and `done` takes it to notify
        // after its decrement: a notification cannot fall between the two.
        let mut guard = lock(&self.drain_lock);
        while self.drain.load(Ordering::Acquire) && self.any_processing() {
            guard = wait(&self.drained, guard);
        }
    }

    fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    fn update_unfinished_work(&self) {
        if let Some(metrics) = &self.metrics {
            let mut started = Vec::new();
            for i in 0..self.shards.len() {
                let shard = self.lock_shard(i);
                started.extend(shard.items.values().filter_map(|item| item.started_at));
            }
            metrics.update_unfinished(started);
        }
    }
}

impl fmt::Debug for ShardedQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedQueue")
            .field("shards", &self.shards.len())
            .field("ready", &self.ready)
            .field("shutting_down", &self.shutting_down())
            .finish()
    }
}
