//! controller-runtime's priority queue (`pkg/controller/priorityqueue`), ported faithfully:
//! one lock over one ordered set of entries.
//!
//! controller-runtime funnels adds through a buffer and hands keys to getters from a
//! goroutine; what a caller can observe of it is the ordered set's rules (`entries.rs`), which
//! this port applies directly under its lock. Getters, blocking threads and async tasks alike,
//! wait in one waiter list: each entry that becomes available to a `get` wakes one waiter.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::key::Key;
use crate::sync::{lock, wait, Condvar, Mutex, MutexGuard, Ordering};

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

/// Everything the lock guards.
struct State {
    entries: Entries,
    shutting_down: bool,
    /// A `shut_down_with_drain` waits for the keys being processed.
    draining: bool,
    waiters: WaiterList,
}

/// What the queue handle and its timer share.
struct ReferencePriorityCore {
    state: Mutex<State>,
    /// Signalled when the last key being processed is done while a drain waits.
    drained: Condvar,
    book: Bookkeeping,
}

impl ReferencePriorityCore {
    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Makes the entries due now ready (not after shut-down); returns the wakers of as many
    /// waiters as entries became ready, to wake once the lock is released.
    #[must_use]
    fn catch_up(&self, state: &mut State) -> Vec<Waker> {
        if state.shutting_down {
            return Vec::new();
        }
        let Some(next) = state.entries.next_ready_at() else {
            return Vec::new();
        };
        let now = self.book.clock.now();
        if next > now {
            return Vec::new();
        }
        let moved = state.entries.promote(now, self.book.metrics.as_ref());
        (0..moved).map_while(|_| state.waiters.pop()).collect()
    }

    fn take(&self, state: &mut State) -> Option<(Key, Priority)> {
        let Taken {
            key,
            priority,
            overdue,
        } = state
            .entries
            .take(self.book.clock.now(), self.book.metrics.as_ref())?;
        if overdue {
            self.book.overdue.fetch_add(1, Ordering::Relaxed);
        }
        Some((key, priority))
    }
}

impl Promote for ReferencePriorityCore {
    fn promote_due(&self) -> Option<Time> {
        let mut state = self.lock();
        let wakers = self.catch_up(&mut state);
        let next = (!state.shutting_down)
            .then(|| state.entries.next_ready_at())
            .flatten();
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
        next
    }
}

/// controller-runtime's priority queue: one lock, one ordered set.
///
/// ```
/// use kcache::Key;
/// use kcache::workqueue::{TryGet, WorkQueue};
/// use kcache::workqueue::priority::{AddOpts, PriorityWorkQueue, ReferencePriorityQueue};
/// let q = ReferencePriorityQueue::new();
/// q.add_with_opts(AddOpts::new().priority(-100), Key::new("a"));
/// q.add(Key::new("b"));
/// q.add(Key::new("a")); // raised to 0: the back of level 0
/// let b = q.get().unwrap();
/// assert_eq!(b.as_str(), "b");
/// q.add(b.clone()); // a new entry at once, skipped while b is processed
/// assert_eq!(q.try_get(), TryGet::Item(Key::new("a")));
/// assert_eq!((q.len(), q.try_get()), (1, TryGet::Empty));
/// q.done(&b).unwrap();
/// assert_eq!(q.try_get(), TryGet::Item(b));
/// ```
pub struct ReferencePriorityQueue {
    shared: Arc<ReferencePriorityCore>,
    timer: TimerHandle,
}

impl ReferencePriorityQueue {
    /// An unnamed queue: no metrics, real clock, the default rate limiter
    /// ([`default_priority_rate_limiter`]).
    pub fn new() -> Self {
        Self::with_config(&QueueConfig::new())
    }

    /// A queue with `config`'s name, metrics provider and clock, and the default rate limiter.
    pub fn with_config(config: &QueueConfig) -> Self {
        Self::with_rate_limiter(config, default_priority_rate_limiter())
    }

    /// A queue with `config`'s name, metrics provider and clock, asking `limiter` on
    /// rate-limited adds.
    pub fn with_rate_limiter(config: &QueueConfig, limiter: Box<dyn RateLimiter<Key>>) -> Self {
        Self::with_options(config, limiter, PriorityOptions::new())
    }

    /// A queue with `config`'s name, metrics provider and clock, asking `limiter` on
    /// rate-limited adds, ordered with `options`' aging and fairness.
    pub fn with_options(
        config: &QueueConfig,
        limiter: Box<dyn RateLimiter<Key>>,
        options: PriorityOptions,
    ) -> Self {
        let shared = Arc::new(ReferencePriorityCore {
            state: Mutex::new(State {
                entries: Entries::new(options.scheduling()),
                shutting_down: false,
                draining: false,
                waiters: WaiterList::default(),
            }),
            drained: Condvar::new(),
            book: Bookkeeping::new(config, limiter, options),
        });
        let timer = TimerHandle::start(&shared.book.clock, &shared);
        Self { shared, timer }
    }

    /// Marks the queue shutting down, draining or not, stops the timer and wakes every
    /// waiter; a shut-down that does not drain also ends a draining one's wait (`drained`).
    fn begin_shut_down(&self, draining: bool) {
        let mut state = self.lock();
        state.shutting_down = true;
        state.draining = draining;
        let wakers = state.waiters.take_all();
        drop(state);
        if !draining {
            self.shared.drained.notify_all();
        }
        self.timer.stop();
        wakers.into_iter().for_each(Waker::wake);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    /// The poll behind every `get`.
    fn poll_take(
        &self,
        slot: &mut WaitSlot,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(Key, Priority), ShutDown>> {
        let mut state = self.lock();
        let wakers = self.shared.catch_up(&mut state);
        let result = if state.shutting_down {
            state.waiters.remove(slot);
            Poll::Ready(Err(ShutDown))
        } else if let Some(taken) = self.shared.take(&mut state) {
            state.waiters.remove(slot);
            Poll::Ready(Ok(taken))
        } else {
            state.waiters.register(slot, cx.waker());
            Poll::Pending
        };
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
        result
    }
}

impl Default for ReferencePriorityQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl PriorityWorkQueue for ReferencePriorityQueue {
    fn add_with_opts(&self, opts: AddOpts, key: Key) {
        let shared = &*self.shared;
        // User code (the group function) runs before the lock is taken.
        let group = shared.book.options.group_of(&key);
        let mut state = self.lock();
        if state.shutting_down {
            return;
        }
        let mut wakers = shared.catch_up(&mut state);
        let now = shared.book.clock.now();
        let delay = opts.delay(|| shared.book.limiter.when(&key, now));
        let metrics = shared.book.metrics.as_ref();
        let ready_at = (!delay.is_zero()).then(|| {
            if let Some(metrics) = metrics {
                metrics.retry();
            }
            now.saturating_add(delay)
        });
        let priority = opts.priority.unwrap_or(DEFAULT_PRIORITY);
        let processing = state.entries.is_processing(&key);
        let added = state
            .entries
            .add(key, priority, ready_at, now, group, metrics);
        if added.ready && !processing {
            wakers.extend(state.waiters.pop());
        }
        drop(state);
        if let Some(at) = added.waiting_until {
            self.timer.kick(at);
        }
        wakers.into_iter().for_each(Waker::wake);
    }

    fn get_with_priority(&self) -> Result<(Key, Priority), ShutDown> {
        let mut slot = WaitSlot::default();
        block_on(|cx| self.poll_take(&mut slot, cx))
    }

    fn try_get_with_priority(&self) -> TryGetWithPriority {
        let mut state = self.lock();
        let wakers = self.shared.catch_up(&mut state);
        let result = if state.shutting_down {
            TryGetWithPriority::ShutDown
        } else if let Some((key, priority)) = self.shared.take(&mut state) {
            TryGetWithPriority::Item(key, priority)
        } else {
            TryGetWithPriority::Empty
        };
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
        result
    }

    fn poll_get_with_priority(
        &self,
        slot: &mut WaitSlot,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(Key, Priority), ShutDown>> {
        self.poll_take(slot, cx)
    }

    fn waiting_len(&self) -> usize {
        self.lock().entries.waiting_len()
    }

    limiter_bookkeeping!();
}

impl WorkQueue for ReferencePriorityQueue {
    gets_without_priority!();

    fn cancel_get(&self, slot: &mut WaitSlot) {
        let mut state = self.lock();
        if state.waiters.remove(slot) || state.entries.available_priority().is_none() {
            return;
        }
        // Woken for an entry it will not take: pass the wake-up on.
        let waker = state.waiters.pop();
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    fn done(&self, item: &Key) -> Result<(), NotProcessing> {
        let mut state = self.lock();
        let Some(has_ready) = state.entries.done(item, self.shared.book.metrics.as_ref()) else {
            return Err(NotProcessing(item.clone()));
        };
        let waker = if has_ready && !state.shutting_down {
            state.waiters.pop()
        } else {
            None
        };
        if state.draining && state.entries.processing_len() == 0 {
            self.shared.drained.notify_all();
        }
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
        Ok(())
    }

    fn len(&self) -> usize {
        let mut state = self.lock();
        let wakers = self.shared.catch_up(&mut state);
        let len = state.entries.ready_len();
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
        len
    }

    fn processing_len(&self) -> usize {
        self.lock().entries.processing_len()
    }

    fn shut_down(&self) {
        self.begin_shut_down(false);
    }

    fn shut_down_with_drain(&self) {
        self.begin_shut_down(true);
        let mut state = self.lock();
        while state.draining && state.entries.processing_len() > 0 {
            state = wait(&self.shared.drained, state);
        }
    }

    fn shutting_down(&self) -> bool {
        self.lock().shutting_down
    }

    fn update_unfinished_work(&self) {
        if let Some(metrics) = &self.shared.book.metrics {
            let state = self.lock();
            metrics.update_unfinished(state.entries.processing_started());
        }
    }
}

impl fmt::Debug for ReferencePriorityQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("ReferencePriorityQueue")
            .field("ready", &state.entries.ready_len())
            .field("waiting", &state.entries.waiting_len())
            .field("processing", &state.entries.processing_len())
            .field("shutting_down", &state.shutting_down)
            .finish()
    }
}
