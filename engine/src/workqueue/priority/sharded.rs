//! The sharded priority queue: controller-runtime's per-key rules with one lock per shard
//! instead of one for the whole queue.
//!
//! # Design
//!
//! Keys are split into `N` shards (a power of two) by their [`Key`]'s precomputed hash; each
//! shard is one mutex over the same ordered entries the reference queue keeps (`entries.rs`),
//! so every per-key rule is the reference's by construction, and one shard *is* the reference.
//!
//! Beside each shard, one atomic word advertises the priority of the entry its next `get`
//! would take (its *head*), or nothing. It is written under the shard's lock after every
//! change to the shard. A `get` reads the heads, locks the shard with the highest one
//! (between equal heads, starting from a rotating position so no shard starves), and takes
//! that shard's first available entry. So a ready entry is never overtaken by one of a lower
//! priority in another shard; only the order within one priority is relaxed across shards.
//!
//! # Waking
//!
//! Waiting `get`s register in one list and count themselves in `waiters`; a change that makes
//! an entry available publishes the shard's head, then reads `waiters`; a `get` about to sleep
//! counts itself, then reads the heads once more. Both pairs are `SeqCst`, so at least one side
//! sees the other (the store-then-load pattern): a `get` never sleeps past an available entry.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::key::Key;
use crate::sync::{lock, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

use super::super::clock::{Clock, Time};
use super::super::limiter::RateLimiter;
use super::super::metrics::QueueConfig;
use super::super::queue::{NotProcessing, ShutDown, TryGet, WaitSlot, WorkQueue};
use super::super::waiters::{block_on, WaiterList};
use super::entries::Entries;
use super::metrics::PriorityMetrics;
use super::timer::{Promote, TimerHandle};
use super::{
    default_priority_rate_limiter, AddOpts, Priority, PriorityWorkQueue, TryGetWithPriority,
    DEFAULT_PRIORITY,
};

/// A head word: 0 for "nothing to take", else the priority shifted to be positive, so that
/// comparing words compares priorities.
const NO_HEAD: u64 = 0;

fn encode(priority: Option<Priority>) -> u64 {
    match priority {
        None => NO_HEAD,
        Some(p) => (i64::from(p) - i64::from(Priority::MIN) + 1) as u64,
    }
}

/// Shard selection uses bits 32.. of the hash, which the shard maps' own bucket index (low
/// bits) and control bytes (top 7 bits) do not depend on.
const SHARD_BITS_OFFSET: u32 = 32;

/// What the queue handle and its timer share.
struct Shared {
    shards: Box<[CachePadded<Mutex<Entries>>]>,
    /// Per shard, the encoded priority its next `get` would take; written under its lock.
    heads: Box<[CachePadded<AtomicU64>]>,
    mask: usize,
    /// Where the next scan of the heads starts, to rotate between equal heads.
    cursor: CachePadded<AtomicUsize>,
    shutting_down: AtomicBool,
    /// Waiting `get`s; `waiters` counts them (changed under the list's lock).
    waiting: Mutex<WaiterList>,
    waiters: AtomicUsize,
    /// A `shut_down_with_drain` is waiting; a plain `shut_down` clears it.
    draining: AtomicBool,
    drain_lock: Mutex<()>,
    drained: Condvar,
    clock: Arc<dyn Clock>,
    limiter: Box<dyn RateLimiter<Key>>,
    metrics: Option<PriorityMetrics>,
}

impl Shared {
    fn shard_of(&self, key: &Key) -> usize {
        (key.hash_value() >> SHARD_BITS_OFFSET) as usize & self.mask
    }

    fn lock_shard(&self, index: usize) -> MutexGuard<'_, Entries> {
        lock(&self.shards[index])
    }

    /// Publishes `shard`'s head; the caller holds its lock. Returns the new head.
    fn publish(&self, index: usize, shard: &Entries) -> u64 {
        let head = encode(shard.available_priority());
        // SeqCst: the store-then-load pair with `waiters` (see the module docs).
        self.heads[index].store(head, Ordering::SeqCst);
        head
    }

    /// Makes `shard`'s due entries ready (not after shut-down); returns how many.
    fn catch_up(&self, shard: &mut Entries) -> usize {
        if self.shutting_down.load(Ordering::Acquire) {
            return 0;
        }
        match shard.next_ready_at() {
            Some(next) => {
                let now = self.clock.now();
                if next > now {
                    return 0;
                }
                shard.promote(now, self.metrics.as_ref())
            }
            None => 0,
        }
    }

    /// Wakes up to `count` waiting `get`s, if any wait. The caller published the head that
    /// makes the entries available first.
    fn wake(&self, count: usize) {
        if count == 0 || self.waiters.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut list = lock(&self.waiting);
        let wakers: Vec<Waker> = (0..count).map_while(|_| list.pop()).collect();
        self.waiters.fetch_sub(wakers.len(), Ordering::Relaxed);
        drop(list);
        wakers.into_iter().for_each(Waker::wake);
    }

    /// The shard with the highest head, if any has one.
    fn best_shard(&self) -> Option<usize> {
        let n = self.heads.len();
        let start = if n == 1 {
            0
        } else {
            self.cursor.fetch_add(1, Ordering::Relaxed) & self.mask
        };
        let mut best = (NO_HEAD, 0);
        for offset in 0..n {
            let index = (start + offset) & self.mask;
            let head = self.heads[index].load(Ordering::SeqCst);
            if head > best.0 {
                best = (head, index);
            }
        }
        (best.0 != NO_HEAD).then_some(best.1)
    }

    /// Takes the highest available entry, if any.
    fn try_take(&self) -> Option<(Key, Priority)> {
        loop {
            let index = self.best_shard()?;
            let mut shard = self.lock_shard(index);
            let taken = shard.take(self.metrics.as_ref());
            self.publish(index, &shard);
            if taken.is_some() {
                return taken;
            }
            // The head was stale (another `get` took it): look again.
        }
    }

    /// The poll behind every `get`.
    fn poll_take(
        &self,
        slot: &mut WaitSlot,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(Key, Priority), ShutDown>> {
        loop {
            if self.shutting_down.load(Ordering::Acquire) {
                self.deregister(slot);
                return Poll::Ready(Err(ShutDown));
            }
            if let Some(taken) = self.try_take() {
                self.deregister(slot);
                return Poll::Ready(Ok(taken));
            }
            let mut list = lock(&self.waiting);
            if !list.contains(slot) {
                // SeqCst: counted before the heads are read again (the store-then-load pair).
                self.waiters.fetch_add(1, Ordering::SeqCst);
            }
            list.register(slot, cx.waker());
            drop(list);
            let available = self
                .heads
                .iter()
                .any(|h| h.load(Ordering::SeqCst) != NO_HEAD);
            if !available && !self.shutting_down.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
            // Something arrived as we registered: take it ourselves.
        }
    }

    /// Takes `slot` off the waiting list if it is still on it.
    fn deregister(&self, slot: &mut WaitSlot) {
        if slot.id.is_none() {
            return;
        }
        let mut list = lock(&self.waiting);
        if list.remove(slot) {
            self.waiters.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn any_processing(&self) -> bool {
        (0..self.shards.len()).any(|i| self.lock_shard(i).processing_len() > 0)
    }
}

impl Promote for Shared {
    fn promote_due(&self) -> Option<Time> {
        let mut next: Option<Time> = None;
        for index in 0..self.shards.len() {
            let mut shard = self.lock_shard(index);
            let moved = self.catch_up(&mut shard);
            if moved > 0 {
                self.publish(index, &shard);
            }
            if !self.shutting_down.load(Ordering::Acquire) {
                if let Some(at) = shard.next_ready_at() {
                    next = Some(next.map_or(at, |n| n.min(at)));
                }
            }
            drop(shard);
            self.wake(moved);
        }
        next
    }
}

/// The sharded priority queue: controller-runtime's per-key rules, one lock per shard.
///
/// # Guarantees
///
/// - **Per key**, exactly the reference's rules (one entry per key, higher priority and earlier
///   time kept on a re-add, never two workers on one key, a key re-added while processed
///   handed out after `done`).
/// - **One shard** hands keys out in exactly the reference's order.
/// - **`N` shards**: a `get` takes an entry of the highest priority available in any shard
///   when it looked; within one priority, keys of one shard come out in the reference's order,
///   keys of different shards in no promised order.
///
/// ```
/// use kcache::Key;
/// use kcache::workqueue::WorkQueue;
/// use kcache::workqueue::priority::{AddOpts, PriorityWorkQueue, ShardedPriorityQueue, TryGetWithPriority};
/// let q = ShardedPriorityQueue::new(16);
/// for i in 0..10 {
///     q.add_with_opts(AddOpts::new().priority(-100), Key::new(&format!("ns/{i}")));
/// }
/// q.add(Key::new("ns/live"));
/// assert_eq!(q.try_get_with_priority(), TryGetWithPriority::Item(Key::new("ns/live"), 0));
/// ```
pub struct ShardedPriorityQueue {
    shared: Arc<Shared>,
    timer: TimerHandle,
}

impl ShardedPriorityQueue {
    /// A queue with `shards` shards (rounded up to a power of two, at least 1, at most 2^16),
    /// unnamed: no metrics, real clock, the default rate limiter.
    pub fn new(shards: usize) -> Self {
        Self::with_config(shards, &QueueConfig::new())
    }

    /// A queue with `config`'s name, metrics provider and clock, and the default rate limiter.
    pub fn with_config(shards: usize, config: &QueueConfig) -> Self {
        Self::with_rate_limiter(shards, config, default_priority_rate_limiter())
    }

    /// A queue with `config`'s name, metrics provider and clock, asking `limiter` on
    /// rate-limited adds.
    pub fn with_rate_limiter(
        shards: usize,
        config: &QueueConfig,
        limiter: Box<dyn RateLimiter<Key>>,
    ) -> Self {
        let count = shards.clamp(1, 1 << 16).next_power_of_two();
        let shared = Arc::new(Shared {
            shards: (0..count)
                .map(|_| CachePadded::new(Mutex::new(Entries::default())))
                .collect(),
            heads: (0..count)
                .map(|_| CachePadded::new(AtomicU64::new(NO_HEAD)))
                .collect(),
            mask: count - 1,
            cursor: CachePadded::new(AtomicUsize::new(0)),
            shutting_down: AtomicBool::new(false),
            waiting: Mutex::new(WaiterList::default()),
            waiters: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
            drain_lock: Mutex::new(()),
            drained: Condvar::new(),
            clock: Arc::clone(config.get_clock()),
            limiter,
            metrics: PriorityMetrics::from_config(config),
        });
        let timer = TimerHandle::start(&shared.clock, &shared);
        Self { shared, timer }
    }

    /// How many shards the queue has.
    pub fn shard_count(&self) -> usize {
        self.shared.shards.len()
    }

    fn sum(&self, of: impl Fn(&Entries) -> usize) -> usize {
        (0..self.shared.shards.len())
            .map(|i| of(&self.shared.lock_shard(i)))
            .sum()
    }

    fn wake_drainer(&self) {
        let _guard = lock(&self.shared.drain_lock);
        self.shared.drained.notify_all();
    }

    fn close(&self, drain: bool) {
        let shared = &*self.shared;
        shared.draining.store(drain, Ordering::SeqCst);
        // Release pairs with the Acquire loads in `add_with_opts` and the gets.
        shared.shutting_down.store(true, Ordering::SeqCst);
        self.timer.stop();
        let mut list = lock(&shared.waiting);
        let wakers = list.take_all();
        shared.waiters.fetch_sub(wakers.len(), Ordering::Relaxed);
        drop(list);
        wakers.into_iter().for_each(Waker::wake);
    }
}

impl PriorityWorkQueue for ShardedPriorityQueue {
    fn add_with_opts(&self, opts: AddOpts, key: Key) {
        let shared = &*self.shared;
        // Acquire pairs with the store in `close`: adds after shut-down ask no limiter.
        if shared.shutting_down.load(Ordering::Acquire) {
            return;
        }
        let now = shared.clock.now();
        let delay = opts.delay(|| shared.limiter.when(&key, now));
        let ready_at = (!delay.is_zero()).then(|| now.saturating_add(delay));
        let priority = opts.priority.unwrap_or(DEFAULT_PRIORITY);
        let index = shared.shard_of(&key);
        let mut shard = shared.lock_shard(index);
        // Read again under the shard lock: an add either precedes shut-down or is ignored.
        if shared.shutting_down.load(Ordering::Acquire) {
            return;
        }
        if ready_at.is_some() {
            if let Some(metrics) = &shared.metrics {
                metrics.retry();
            }
        }
        let mut woken = shared.catch_up(&mut shard);
        let processing = shard.is_processing(&key);
        let added = shard.add(key, priority, ready_at, shared.metrics.as_ref());
        if added.ready && !processing {
            woken += 1;
        }
        // Always: a raised priority changes the head without making anything newly ready.
        shared.publish(index, &shard);
        drop(shard);
        if let Some(at) = added.waiting_until {
            self.timer.kick(at);
        }
        shared.wake(woken);
    }

    fn forget(&self, key: &Key) {
        self.shared.limiter.forget(key);
    }

    fn num_requeues(&self, key: &Key) -> u64 {
        self.shared.limiter.num_requeues(key)
    }

    fn when(&self, key: &Key) -> Duration {
        self.shared.limiter.when(key, self.shared.clock.now())
    }

    fn get_with_priority(&self) -> Result<(Key, Priority), ShutDown> {
        let mut slot = WaitSlot::default();
        block_on(|cx| self.shared.poll_take(&mut slot, cx))
    }

    fn try_get_with_priority(&self) -> TryGetWithPriority {
        if self.shared.shutting_down.load(Ordering::Acquire) {
            return TryGetWithPriority::ShutDown;
        }
        match self.shared.try_take() {
            Some((key, priority)) => TryGetWithPriority::Item(key, priority),
            None => TryGetWithPriority::Empty,
        }
    }

    fn poll_get_with_priority(
        &self,
        slot: &mut WaitSlot,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(Key, Priority), ShutDown>> {
        self.shared.poll_take(slot, cx)
    }

    fn waiting_len(&self) -> usize {
        self.sum(Entries::waiting_len)
    }
}

impl WorkQueue for ShardedPriorityQueue {
    fn add(&self, item: Key) {
        self.add_with_opts(AddOpts::new(), item);
    }

    fn get(&self) -> Result<Key, ShutDown> {
        self.get_with_priority().map(|(key, _)| key)
    }

    fn try_get(&self) -> TryGet {
        match self.try_get_with_priority() {
            TryGetWithPriority::Item(key, _) => TryGet::Item(key),
            TryGetWithPriority::Empty => TryGet::Empty,
            TryGetWithPriority::ShutDown => TryGet::ShutDown,
        }
    }

    fn poll_get(&self, slot: &mut WaitSlot, cx: &mut Context<'_>) -> Poll<Result<Key, ShutDown>> {
        self.shared
            .poll_take(slot, cx)
            .map(|r| r.map(|(key, _)| key))
    }

    fn cancel_get(&self, slot: &mut WaitSlot) {
        let shared = &*self.shared;
        let mut list = lock(&shared.waiting);
        if list.remove(slot) {
            shared.waiters.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        drop(list);
        // Woken for an entry it will not take: pass the wake-up on if one is available.
        if shared
            .heads
            .iter()
            .any(|h| h.load(Ordering::SeqCst) != NO_HEAD)
        {
            shared.wake(1);
        }
    }

    fn done(&self, item: &Key) -> Result<(), NotProcessing> {
        let shared = &*self.shared;
        let index = shared.shard_of(item);
        let mut shard = shared.lock_shard(index);
        let Some(has_ready) = shard.done(item, shared.metrics.as_ref()) else {
            return Err(NotProcessing(item.clone()));
        };
        if has_ready {
            shared.publish(index, &shard);
        }
        let idle = shard.processing_len() == 0;
        drop(shard);
        if has_ready && !shared.shutting_down.load(Ordering::Acquire) {
            shared.wake(1);
        }
        // SeqCst pairs with the store in `close`: a drain that started after our decrement
        // finds it when it locks this shard.
        if idle && shared.draining.load(Ordering::SeqCst) {
            self.wake_drainer();
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.sum(Entries::ready_len)
    }

    fn processing_len(&self) -> usize {
        self.sum(Entries::processing_len)
    }

    fn shut_down(&self) {
        self.close(false);
        self.wake_drainer();
    }

    fn shut_down_with_drain(&self) {
        self.close(true);
        // The drain lock is held from each check to the wait, and `done` takes it to notify
        // after its decrement: a notification cannot fall between the two.
        let mut guard = lock(&self.shared.drain_lock);
        while self.shared.draining.load(Ordering::SeqCst) && self.shared.any_processing() {
            guard = self
                .shared
                .drained
                .wait(guard)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    fn shutting_down(&self) -> bool {
        self.shared.shutting_down.load(Ordering::Acquire)
    }

    fn update_unfinished_work(&self) {
        if let Some(metrics) = &self.shared.metrics {
            let mut started = Vec::new();
            for i in 0..self.shared.shards.len() {
                started.extend(self.shared.lock_shard(i).processing_started());
            }
            metrics.update_unfinished(started);
        }
    }
}

impl fmt::Debug for ShardedPriorityQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedPriorityQueue")
            .field("shards", &self.shared.shards.len())
            .field("shutting_down", &self.shutting_down())
            .finish()
    }
}
