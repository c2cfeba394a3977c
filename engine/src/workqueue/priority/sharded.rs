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
//! With aging on, a second word per shard advertises since when its oldest available entry is
//! ready. A `get` first looks for overdue entries: if a shard's oldest is overdue at the time
//! the `get` reads the clock, it serves the shard whose oldest is oldest, which hands out that
//! entry by the reference's rule. Becoming overdue makes nothing newly available, so the
//! words that wake waiters (below) are the same with aging as without.
//!
//! # Waking
//!
//! Waiting `get`s register in one list and count themselves in one atomic word, which also
//! holds a *publication count* and the *searcher* bit; every change to the word is a
//! read-modify-write, so all of them are totally ordered (an eventcount):
//!
//! - a change that may make an entry available publishes the shard's head, then bumps the
//!   publication count, reading the word as it was: if it counted a waiter and no searcher, a
//!   waiter is woken and becomes the searcher;
//! - a `get` about to sleep reads the word, looks at the heads once more, and counts itself
//!   with a compare-and-swap that fails if anything was published since (it then looks again).
//!
//! The searcher is the sharded workqueue's (`ready.rs`, Go's spinning-thread rule): the one
//! `get` polling before it sleeps, or a sleeper woken to look. While it looks, publications wake
//! nobody; it ends its search by waking the next waiter if entries and waiters remain, or by
//! clearing the bit in a compare-and-swap that fails if something was published meanwhile.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crossbeam_utils::CachePadded;

use crate::key::Key;
use crate::sharded::idle::IdlePolicy;
use crate::sync::{
    lock, wait, AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering,
};

use super::super::clock::Time;
use super::super::limiter::RateLimiter;
use super::super::metrics::QueueConfig;
use super::super::queue::{NotProcessing, ShutDown, TryGet, WaitSlot, WorkQueue};
use super::super::waiters::{block_on, WaiterList};
use super::entries::{Entries, Taken};
use super::timer::{Promote, TimerHandle};
use super::{
    default_priority_rate_limiter, AddOpts, Bookkeeping, Priority, PriorityOptions,
    PriorityWorkQueue, TryGetWithPriority, DEFAULT_PRIORITY,
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

/// An age word: no available entry (with aging on).
const NO_AGE: u64 = u64::MAX;

/// An age word: since when the shard's oldest available entry is ready, in nanoseconds since
/// the clock's origin (saturating below [`NO_AGE`]).
fn encode_age(since: Option<Time>) -> u64 {
    match since {
        None => NO_AGE,
        Some(t) => {
            u64::try_from(t.since_origin().as_nanos()).map_or(NO_AGE - 1, |n| n.min(NO_AGE - 1))
        }
    }
}

const WAITER: u64 = 1;
const WAITER_MASK: u64 = (1 << 31) - 1;
const SEARCHING: u64 = 1 << 31;
const PUBLICATION: u64 = 1 << 32;

fn waiters(word: u64) -> u64 {
    word & WAITER_MASK
}

fn is_searching(word: u64) -> bool {
    word & SEARCHING != 0
}

/// Shard selection uses bits 32.. of the hash, which the shard maps' own bucket index (low
/// bits) and control bytes (top 7 bits) do not depend on.
const SHARD_BITS_OFFSET: u32 = 32;

/// What the queue handle and its timer share.
struct ShardedPriorityCore {
    shards: Box<[CachePadded<Mutex<Entries>>]>,
    /// Per shard, the encoded priority its next `get` would take; written under its lock.
    heads: Box<[CachePadded<AtomicU64>]>,
    /// Per shard with aging on, since when its oldest available entry is ready
    /// ([`encode_age`]); written under its lock.
    ages: Box<[CachePadded<AtomicU64>]>,
    mask: usize,
    /// Where the next scan of the heads starts, to rotate between equal heads.
    cursor: CachePadded<AtomicUsize>,
    shutting_down: AtomicBool,
    /// Waiting `get`s; the word counts them (changed under the list's lock).
    waiting: Mutex<WaiterList>,
    /// Waiters (bits 0..31), the searcher bit (31) and the publication count (32..64).
    word: AtomicU64,
    /// A `shut_down_with_drain` is waiting; a plain `shut_down` clears it.
    draining: AtomicBool,
    drain_lock: Mutex<()>,
    drained: Condvar,
    book: Bookkeeping,
    /// Whether polling before sleeping has been paying (shared with the sharded workqueue).
    idle: IdlePolicy,
    /// Aging's bound, if on.
    max_wait: Option<Duration>,
}

impl ShardedPriorityCore {
    fn shard_of(&self, key: &Key) -> usize {
        (key.hash_value() >> SHARD_BITS_OFFSET) as usize & self.mask
    }

    fn lock_shard(&self, index: usize) -> MutexGuard<'_, Entries> {
        lock(&*self.shards[index])
    }

    /// Publishes `shard`'s head; the caller holds its lock. Returns the new head.
    fn publish(&self, index: usize, shard: &Entries) -> u64 {
        let head = encode(shard.available_priority());
        // Release: a `get` that reads this head (Acquire) finds the entry under the shard lock
        // anyway; the publication that wakes waiters is `notify`'s RMW.
        self.heads[index].store(head, Ordering::Release);
        if self.max_wait.is_some() {
            // Relaxed: only a hint for choosing a shard, always read beside a head and acted
            // on under the shard's lock, which decides what is taken. A stale age can only
            // make a `get` serve another shard first, the relaxation across shards.
            self.ages[index].store(
                encode_age(shard.oldest_available_since()),
                Ordering::Relaxed,
            );
        }
        head
    }

    /// Makes `shard`'s due entries ready (not after shut-down); returns how many.
    fn catch_up(&self, shard: &mut Entries) -> usize {
        if self.shutting_down.load(Ordering::Acquire) {
            return 0;
        }
        match shard.next_ready_at() {
            Some(next) => {
                let now = self.book.clock.now();
                if next > now {
                    return 0;
                }
                shard.promote(now, self.book.metrics.as_ref())
            }
            None => 0,
        }
    }

    /// Whether any shard advertises an entry to take.
    fn any_available(&self) -> bool {
        self.heads
            .iter()
            .any(|h| h.load(Ordering::Acquire) != NO_HEAD)
    }

    /// After publishing a head that may make an entry available: counts the publication and,
    /// if a waiter is counted and nobody searches, makes one the searcher.
    fn notify(&self) {
        // AcqRel: our head store is visible to whoever reads the word after this RMW; a
        // sleeping `get`'s CAS that follows it fails and looks again.
        let prev = self.word.fetch_add(PUBLICATION, Ordering::AcqRel);
        if waiters(prev) == 0 || is_searching(prev) {
            return;
        }
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if waiters(word) == 0 || is_searching(word) {
                return;
            }
            match self.word.compare_exchange_weak(
                word,
                word | SEARCHING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(current) => word = current,
            }
        }
        self.end_search();
    }

    /// Takes the searcher's bit if nobody holds it.
    fn claim_search(&self) -> bool {
        self.word.fetch_or(SEARCHING, Ordering::AcqRel) & SEARCHING == 0
    }

    /// The searcher ends its search: wakes the oldest waiter (who inherits the bit) if entries
    /// and waiters remain, else clears the bit, unless something was published meanwhile.
    fn end_search(&self) {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            if waiters(word) > 0 && self.any_available() {
                let mut list = lock(&self.waiting);
                if let Some(waker) = list.pop() {
                    // Relaxed: the count only changes under the list's lock.
                    self.word.fetch_sub(WAITER, Ordering::Relaxed);
                    drop(list);
                    waker.wake();
                    return;
                }
                drop(list);
                word = self.word.load(Ordering::Acquire);
                continue;
            }
            // Fails if a waiter came or went or something was published since `word`: look
            // again.
            match self.word.compare_exchange_weak(
                word,
                word & !SEARCHING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(current) => word = current,
            }
        }
    }

    /// The shard whose oldest available entry is the oldest overdue one at `now`, if any.
    fn overdue_shard(&self, max_wait: Duration, now: Time) -> Option<usize> {
        let mut best = (NO_AGE, 0);
        for (index, age) in self.ages.iter().enumerate() {
            let age = age.load(Ordering::Relaxed);
            if age < best.0 {
                best = (age, index);
            }
        }
        let since = Time::after_origin(Duration::from_nanos(best.0));
        (best.0 != NO_AGE && since.saturating_add(max_wait) <= now).then_some(best.1)
    }

    /// The shard to serve at `now`: the one with the oldest overdue entry (aging), else the
    /// one with the highest head, if any has one.
    fn best_shard(&self, now: Time) -> Option<usize> {
        if let Some(max_wait) = self.max_wait {
            if let Some(index) = self.overdue_shard(max_wait, now) {
                return Some(index);
            }
        }
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
            let now = self.book.clock.now();
            let index = self.best_shard(now)?;
            let mut shard = self.lock_shard(index);
            let taken = shard.take(now, self.book.metrics.as_ref());
            self.publish(index, &shard);
            drop(shard);
            if let Some(Taken {
                key,
                priority,
                overdue,
            }) = taken
            {
                if overdue {
                    self.book.overdue.fetch_add(1, Ordering::Relaxed);
                }
                return Some((key, priority));
            }
            // The head was stale (another `get` took it): look again.
        }
    }

    /// The poll behind every `get`. A poll after a wake-up searches (`slot.searching`).
    fn poll_take(
        &self,
        slot: &mut WaitSlot,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(Key, Priority), ShutDown>> {
        if slot.id.is_some() && !slot.searching {
            let mut list = lock(&self.waiting);
            if !list.contains(slot) {
                // Woken: taken off the list to search (or by shut-down).
                list.remove(slot);
                slot.searching = true;
            }
        }
        loop {
            if self.shutting_down.load(Ordering::Acquire) {
                self.deregister(slot);
                if std::mem::take(&mut slot.searching) {
                    self.word.fetch_and(!SEARCHING, Ordering::AcqRel);
                }
                return Poll::Ready(Err(ShutDown));
            }
            if let Some(taken) = self.try_take() {
                self.deregister(slot);
                if std::mem::take(&mut slot.searching) {
                    self.end_search();
                }
                return Poll::Ready(Ok(taken));
            }
            let mut list = lock(&self.waiting);
            // Under the list's lock: `close` sets the flag before it takes this lock to wake
            // every waiter, so a shut-down that emptied the list before we register is seen
            // here (without this, a `get` could register after it and sleep forever).
            if self.shutting_down.load(Ordering::Acquire) {
                continue;
            }
            if list.contains(slot) {
                // Polled again before a wake-up: still counted, just refresh the waker.
                list.register(slot, cx.waker());
                return Poll::Pending;
            }
            // Count ourselves only if nothing was published since we read the word and looked
            // at the heads; a searcher gives its bit up in the same CAS.
            let word = self.word.load(Ordering::Acquire);
            if self.any_available() {
                continue;
            }
            let give_up = if slot.searching { SEARCHING } else { 0 };
            if self
                .word
                .compare_exchange(
                    word,
                    (word + WAITER) & !give_up,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
            {
                slot.searching = false;
                list.register(slot, cx.waker());
                return Poll::Pending;
            }
        }
    }

    /// Takes `slot` off the waiting list if it is still on it.
    fn deregister(&self, slot: &mut WaitSlot) {
        if slot.id.is_none() {
            return;
        }
        let mut list = lock(&self.waiting);
        if list.remove(slot) {
            self.word.fetch_sub(WAITER, Ordering::Relaxed);
        }
    }

    fn any_processing(&self) -> bool {
        (0..self.shards.len()).any(|i| self.lock_shard(i).processing_len() > 0)
    }
}

impl Promote for ShardedPriorityCore {
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
            if moved > 0 {
                self.notify();
            }
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
/// - **Aging** (`N` shards): if any shard's oldest available entry was overdue when a `get`
///   read the clock, the `get` takes the oldest such entry of all shards (ties between shards
///   in no promised order), as the reference would.
/// - **Fairness** (`N` shards): round robin between the groups *of one shard*, by the
///   reference's rule; between shards whose heads are equal, each `get` starts its scan one
///   shard further, so over any `N` scans that find a level the highest, every shard holding
///   entries of that level is served at least once.
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
    shared: Arc<ShardedPriorityCore>,
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
        Self::with_options(shards, config, limiter, PriorityOptions::new())
    }

    /// A queue with `config`'s name, metrics provider and clock, asking `limiter` on
    /// rate-limited adds, ordered with `options`' aging and fairness (each shard applies them
    /// to its keys; see the type's guarantees).
    pub fn with_options(
        shards: usize,
        config: &QueueConfig,
        limiter: Box<dyn RateLimiter<Key>>,
        options: PriorityOptions,
    ) -> Self {
        let count = shards.clamp(1, 1 << 16).next_power_of_two();
        let scheduling = options.scheduling();
        let shared = Arc::new(ShardedPriorityCore {
            shards: (0..count)
                .map(|_| CachePadded::new(Mutex::new(Entries::new(scheduling))))
                .collect(),
            heads: (0..count)
                .map(|_| CachePadded::new(AtomicU64::new(NO_HEAD)))
                .collect(),
            ages: (0..count)
                .map(|_| CachePadded::new(AtomicU64::new(NO_AGE)))
                .collect(),
            mask: count - 1,
            cursor: CachePadded::new(AtomicUsize::new(0)),
            shutting_down: AtomicBool::new(false),
            waiting: Mutex::new(WaiterList::default()),
            word: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            drain_lock: Mutex::new(()),
            drained: Condvar::new(),
            idle: IdlePolicy::new(),
            max_wait: scheduling.max_wait,
            book: Bookkeeping::new(config, limiter, options),
        });
        let timer = TimerHandle::start(&shared.book.clock, &shared);
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
        shared
            .word
            .fetch_sub(WAITER * wakers.len() as u64, Ordering::Relaxed);
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
        // User code (the group function) runs before any lock is taken.
        let group = shared.book.options.group_of(&key);
        let now = shared.book.clock.now();
        let delay = opts.delay(|| shared.book.limiter.when(&key, now));
        let ready_at = (!delay.is_zero()).then(|| now.saturating_add(delay));
        let priority = opts.priority.unwrap_or(DEFAULT_PRIORITY);
        let index = shared.shard_of(&key);
        let mut shard = shared.lock_shard(index);
        // Read again under the shard lock: an add either precedes shut-down or is ignored.
        if shared.shutting_down.load(Ordering::Acquire) {
            return;
        }
        let metrics = shared.book.metrics.as_ref();
        if ready_at.is_some() {
            if let Some(metrics) = metrics {
                metrics.retry();
            }
        }
        let promoted = shared.catch_up(&mut shard);
        let processing = shard.is_processing(&key);
        let added = shard.add(key, priority, ready_at, now, group, metrics);
        // Always: a raised priority changes the head without making anything newly ready.
        shared.publish(index, &shard);
        drop(shard);
        if let Some(at) = added.waiting_until {
            self.timer.kick(at);
        }
        if promoted > 0 || (added.ready && !processing) {
            shared.notify();
        }
    }

    fn get_with_priority(&self) -> Result<(Key, Priority), ShutDown> {
        let shared = &*self.shared;
        let mut slot = WaitSlot::default();
        if !shared.shutting_down.load(Ordering::Acquire) {
            if let Some(taken) = shared.try_take() {
                return Ok(taken);
            }
            // Poll briefly as the searcher before sleeping (see the sharded workqueue's `get`).
            if shared.claim_search() {
                slot.searching = true;
                let mut backoff = shared.idle.backoff();
                while !shared.shutting_down.load(Ordering::Acquire) {
                    if let Some(taken) = shared.try_take() {
                        shared.end_search();
                        return Ok(taken);
                    }
                    if !backoff.snooze() {
                        break;
                    }
                }
            }
        }
        block_on(|cx| shared.poll_take(&mut slot, cx))
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

    limiter_bookkeeping!();
}

impl WorkQueue for ShardedPriorityQueue {
    gets_without_priority!();

    fn cancel_get(&self, slot: &mut WaitSlot) {
        let shared = &*self.shared;
        let mut list = lock(&shared.waiting);
        let was_woken = slot.id.is_some();
        if list.remove(slot) {
            shared.word.fetch_sub(WAITER, Ordering::Relaxed);
            return;
        }
        drop(list);
        if was_woken || std::mem::take(&mut slot.searching) {
            // We were the searcher: hand the search on.
            shared.end_search();
        }
    }

    fn done(&self, item: &Key) -> Result<(), NotProcessing> {
        let shared = &*self.shared;
        let index = shared.shard_of(item);
        let mut shard = shared.lock_shard(index);
        let Some(has_ready) = shard.done(item, shared.book.metrics.as_ref()) else {
            return Err(NotProcessing(item.clone()));
        };
        if has_ready {
            shared.publish(index, &shard);
        }
        let idle = shard.processing_len() == 0;
        drop(shard);
        if has_ready && !shared.shutting_down.load(Ordering::Acquire) {
            shared.notify();
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
            guard = wait(&self.shared.drained, guard);
        }
    }

    fn shutting_down(&self) -> bool {
        self.shared.shutting_down.load(Ordering::Acquire)
    }

    fn update_unfinished_work(&self) {
        if let Some(metrics) = &self.shared.book.metrics {
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
