//! The delaying layer (client-go `delaying_queue.go`): `add_after(item, d)` over any
//! [`WorkQueue`].
//!
//! # Design
//!
//! Waiting items live in one min-heap of `(ready time, sequence)` and one map `item -> its
//! current entry`, under one lock. An item added again while it waits keeps the earlier of its
//! two ready times: an earlier time pushes a fresh heap entry and the map forgets the old one,
//! which is skipped when it surfaces (lazy deletion). Ready items are `add`ed to the queue
//! earliest first, *under* the lock, so two threads that advance at once cannot interleave
//! their batches; equal ready times come out in `add_after` order (client-go: Go's heap order).
//!
//! One timer serves every item, never one per item:
//!
//! - on a clock that advances by itself ([`RealClock`](super::RealClock)), one thread sleeps on
//!   a condition variable until the earliest ready time, and is woken early only by an
//!   `add_after` whose item is ready before that;
//! - on a clock that moves only when told ([`FakeClock`](super::FakeClock)), there is no
//!   thread: the clock calls [`advance`](DelayingQueue::advance) on the thread that moved it,
//!   before the move returns, so a test or a trace replay that steps the clock finds every
//!   ready item queued at once, deterministically.
//!
//! `shut_down` drops the waiting items (they are never added) and stops the timer. An item
//! whose ready time is [`Time::MAX`] (a delay of [`NEVER`](super::NEVER), a limiter's "never",
//! from any time) never becomes ready.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::fmt;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::key::{Key, KeyMap};
use crate::sync::{lock, wait, wait_timeout, Condvar, Mutex, MutexGuard};

use super::clock::{Clock, Subscription, Time};
use super::metrics::{CounterMetric, QueueConfig};
use super::queue::{NotProcessing, ShutDown, TryGet, WaitSlot, WorkQueue};

/// A heap entry; the heap is a max-heap, so the order is reversed: earliest first, then
/// lowest sequence.
struct Timer {
    ready: Time,
    seq: u64,
    item: Key,
}

impl PartialEq for Timer {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}
impl Eq for Timer {}
impl PartialOrd for Timer {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl Ord for Timer {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        (other.ready, other.seq).cmp(&(self.ready, self.seq))
    }
}

/// The waiting items.
#[derive(Default)]
struct Waiting {
    heap: BinaryHeap<Timer>,
    /// Each waiting item's current `(ready, seq)`; heap entries that disagree are stale.
    current: KeyMap<(Time, u64)>,
    next_seq: u64,
    /// The ready time the timer thread sleeps until, if it sleeps with a deadline.
    armed: Option<Time>,
    stopped: bool,
}

impl Waiting {
    /// The earliest live ready time, dropping stale heap entries on the way.
    fn earliest(&mut self) -> Option<Time> {
        while let Some(top) = self.heap.peek() {
            if self.current.get(&top.item) == Some(&(top.ready, top.seq)) {
                return Some(top.ready);
            }
            self.heap.pop();
        }
        None
    }

    /// Takes the next item ready at `now`, earliest first.
    fn pop_ready(&mut self, now: Time) -> Option<Key> {
        let ready = self.earliest()?;
        if ready > now || ready == Time::MAX {
            return None;
        }
        let top = self.heap.pop()?;
        self.current.remove(&top.item);
        Some(top.item)
    }

    /// Inserts `item` ready at `ready`, or moves it earlier. Returns true if the timer must be
    /// woken (the item is ready before the deadline it sleeps until).
    fn insert(&mut self, item: Key, ready: Time) -> bool {
        if let Some(&(existing, _)) = self.current.get(&item) {
            if existing <= ready {
                return false;
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.current.insert(item.clone(), (ready, seq));
        self.heap.push(Timer { ready, seq, item });
        self.armed.is_none_or(|armed| ready < armed)
    }

    fn clear(&mut self) {
        self.heap.clear();
        self.current.clear();
    }
}

/// What the queue handle and its timer share.
struct DelayingCore<Q> {
    queue: Q,
    clock: Arc<dyn Clock>,
    waiting: Mutex<Waiting>,
    timer: Condvar,
    retries: Option<Arc<dyn CounterMetric>>,
}

impl<Q: WorkQueue> DelayingCore<Q> {
    /// Adds every item ready at `now`, earliest first, under the waiting lock.
    fn add_ready(&self, waiting: &mut Waiting, now: Time) -> usize {
        let mut added = 0;
        while let Some(item) = waiting.pop_ready(now) {
            self.queue.add(item);
            added += 1;
        }
        added
    }

    /// The timer thread: add what is ready, sleep until the next ready time or an earlier
    /// `add_after`, until stopped.
    fn run_timer(&self) {
        let mut waiting = lock(&self.waiting);
        loop {
            if waiting.stopped {
                return;
            }
            let now = self.clock.now();
            self.add_ready(&mut waiting, now);
            let next = waiting.earliest().filter(|&t| t != Time::MAX);
            waiting.armed = next;
            waiting = match next {
                None => wait(&self.timer, waiting),
                Some(ready) => {
                    wait_timeout(&self.timer, waiting, ready.saturating_duration_since(now))
                }
            };
            waiting.armed = None;
        }
    }
}

/// client-go's delaying queue over any [`WorkQueue`] `Q`.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use kcache::Key;
/// use kcache::workqueue::{DelayingQueue, FakeClock, QueueConfig, ReferenceQueue, WorkQueue};
///
/// let ms = Duration::from_millis;
/// let clock = Arc::new(FakeClock::new());
/// let config = QueueConfig::new().clock(clock.clone());
/// let q = DelayingQueue::with_config(ReferenceQueue::with_config(&config), &config);
/// q.add_after(Key::new("b"), ms(20));
/// q.add_after(Key::new("a"), ms(10));
/// q.add_after(Key::new("b"), ms(5)); // earlier: wins
/// assert_eq!(q.len(), 0);
/// clock.step(ms(10)); // the clock adds what is ready before `step` returns
/// assert_eq!(q.get().unwrap().as_str(), "b");
/// assert_eq!(q.get().unwrap().as_str(), "a");
/// ```
pub struct DelayingQueue<Q: WorkQueue + 'static> {
    shared: Arc<DelayingCore<Q>>,
    thread: Option<JoinHandle<()>>,
    /// Keeps a moves-only clock calling `advance`; unregistered on drop.
    _subscription: Option<Subscription>,
}

impl<Q: WorkQueue + 'static> DelayingQueue<Q> {
    /// A delaying queue over `queue`, reading `config`'s clock; its `retries_total` metric is
    /// labelled with `config`'s name.
    pub fn with_config(queue: Q, config: &QueueConfig) -> Self {
        let shared = Arc::new(DelayingCore {
            queue,
            clock: Arc::clone(config.get_clock()),
            waiting: Mutex::new(Waiting::default()),
            timer: Condvar::new(),
            retries: config.retries_metric(),
        });
        // Weak: the clock's subscriber list must not keep the queue alive.
        let weak: Weak<DelayingCore<Q>> = Arc::downgrade(&shared);
        let subscription = shared.clock.subscribe(Arc::new(move || {
            if let Some(shared) = weak.upgrade() {
                let now = shared.clock.now();
                let mut waiting = lock(&shared.waiting);
                if !waiting.stopped {
                    shared.add_ready(&mut waiting, now);
                }
            }
        }));
        let thread = match subscription {
            Some(_) => None,
            None => {
                let shared = Arc::clone(&shared);
                Some(
                    std::thread::Builder::new()
                        .name("workqueue-timer".into())
                        .spawn(move || shared.run_timer())
                        .expect("spawning the delaying queue's timer thread"),
                )
            }
        };
        Self {
            shared,
            thread,
            _subscription: subscription,
        }
    }

    /// A delaying queue over `queue` with a real clock and no metrics.
    pub fn new(queue: Q) -> Self {
        Self::with_config(queue, &QueueConfig::new())
    }

    /// Adds `item` once `delay` has passed on the queue's clock (client-go `AddAfter`).
    /// Nothing if shutting down; a delay of zero is "now" (Go's `<= 0`: there is no negative
    /// `Duration`) and adds at once; an item already waiting keeps the earlier of its two
    /// ready times.
    pub fn add_after(&self, item: Key, delay: Duration) {
        if self.shared.queue.shutting_down() {
            return;
        }
        if let Some(retries) = &self.shared.retries {
            retries.inc();
        }
        if delay.is_zero() {
            self.shared.queue.add(item);
            return;
        }
        let ready = self.shared.clock.now().saturating_add(delay);
        let mut waiting = self.lock_waiting();
        if waiting.stopped {
            return;
        }
        if waiting.insert(item, ready) && self.thread.is_some() {
            drop(waiting);
            self.shared.timer.notify_one();
        }
    }

    /// Adds every waiting item whose ready time has come on the queue's clock, earliest first,
    /// before returning; returns how many. The timer does this by itself; a moves-only clock
    /// calls it on every move, so callers rarely need it.
    pub fn advance(&self) -> usize {
        let now = self.shared.clock.now();
        let mut waiting = self.lock_waiting();
        if waiting.stopped {
            return 0;
        }
        self.shared.add_ready(&mut waiting, now)
    }

    /// How many items wait for their ready time.
    pub fn waiting_len(&self) -> usize {
        self.lock_waiting().current.len()
    }

    /// The queue's clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.shared.clock
    }

    /// The queue underneath.
    pub fn inner(&self) -> &Q {
        &self.shared.queue
    }

    fn lock_waiting(&self) -> MutexGuard<'_, Waiting> {
        lock(&self.shared.waiting)
    }

    /// Drops the waiting items and stops the timer.
    fn stop_timer(&self) {
        let mut waiting = self.lock_waiting();
        waiting.stopped = true;
        waiting.clear();
        drop(waiting);
        self.shared.timer.notify_all();
    }
}

impl<Q: WorkQueue + 'static> Drop for DelayingQueue<Q> {
    fn drop(&mut self) {
        self.stop_timer();
        if let Some(thread) = self.thread.take() {
            // The timer only adds to the queue; it cannot panic short of a panicking queue,
            // whose panic has been reported on that thread already.
            let _ = thread.join();
        }
    }
}

impl<Q: WorkQueue + 'static> WorkQueue for DelayingQueue<Q> {
    fn add(&self, item: Key) {
        self.shared.queue.add(item);
    }
    fn get(&self) -> Result<Key, ShutDown> {
        self.shared.queue.get()
    }
    fn try_get(&self) -> TryGet {
        self.shared.queue.try_get()
    }
    fn poll_get(&self, slot: &mut WaitSlot, cx: &mut Context<'_>) -> Poll<Result<Key, ShutDown>> {
        self.shared.queue.poll_get(slot, cx)
    }
    fn cancel_get(&self, slot: &mut WaitSlot) {
        self.shared.queue.cancel_get(slot);
    }
    fn done(&self, item: &Key) -> Result<(), NotProcessing> {
        self.shared.queue.done(item)
    }
    fn len(&self) -> usize {
        self.shared.queue.len()
    }
    fn processing_len(&self) -> usize {
        self.shared.queue.processing_len()
    }
    fn shut_down(&self) {
        self.shared.queue.shut_down();
        self.stop_timer();
    }
    fn shut_down_with_drain(&self) {
        // Waiting items would be refused by the shut-down queue anyway: drop them first.
        self.stop_timer();
        self.shared.queue.shut_down_with_drain();
    }
    fn shutting_down(&self) -> bool {
        self.shared.queue.shutting_down()
    }
    fn update_unfinished_work(&self) {
        self.shared.queue.update_unfinished_work();
    }
}

impl<Q: WorkQueue + fmt::Debug + 'static> fmt::Debug for DelayingQueue<Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelayingQueue")
            .field("queue", &self.shared.queue)
            .field("waiting", &self.waiting_len())
            .field("timer_thread", &self.thread.is_some())
            .finish()
    }
}
