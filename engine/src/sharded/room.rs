//! The backlog bound of the sharded DeltaFIFO ([`QueueOptions::max_queued_deltas`]): one count
//! of queued deltas shared by every shard, and the producers waiting for room.
//!
//! The count, a `closed` bit and a `waiting` bit live in one `AtomicU64`, and every change to it
//! is a read-modify-write. All RMWs of one atomic are totally ordered (its modification order)
//! and each reads the newest value, whatever its memory ordering, so the classic lost wake-up
//! (a producer deciding to sleep just as a consumer decides nobody sleeps) cannot happen:
//!
//! - a waiting producer takes the room lock, sets `waiting` with an RMW and looks at the count
//!   *that RMW returned*; only if it shows no room does it wait on the condition variable, which
//!   releases the lock atomically;
//! - a consumer lowers the count with an RMW; if the value it replaced had `waiting` set and the
//!   new count leaves room, it takes the room lock, clears `waiting` and wakes everyone.
//!
//! If the producer's RMW comes first in the modification order, the consumer's sees `waiting`
//! and wakes it (under the lock, so after the producer is waiting); if the consumer's comes
//! first, the producer's RMW returns the lowered count and it does not wait. `close` works like
//! a consumer. Hence every operation here is `Relaxed`: the count publishes no data (the deltas
//! are published by the shard locks), and the hand-off between a waker and a waiter is ordered
//! by the room lock. The model in `engine/tests/loom.rs` checks this.
//!
//! Without a bound nothing here is touched: the default queue pays no shared counter.
//!
//! [`QueueOptions::max_queued_deltas`]: crate::QueueOptions::max_queued_deltas

use std::fmt;
use std::task::{Context, Poll, Waker};

use crate::sync::{lock, wait, AtomicU64, Condvar, Mutex, Ordering};

/// Set while producers wait (or may wait) for room.
const WAITING: u64 = 1 << 63;
/// Set by `close`: the bound no longer applies.
const CLOSED: u64 = 1 << 62;
/// The count of queued deltas: the low 62 bits.
const COUNT: u64 = CLOSED - 1;

/// The shared count of queued deltas and the producers waiting for room.
pub(crate) struct Room {
    /// The bound; `None` when the queue is unbounded (nothing is counted then).
    max: Option<u64>,
    /// Count | `CLOSED` | `WAITING`; see the module docs.
    state: AtomicU64,
    /// The async producers waiting for room; the lock is also the condition variable's.
    wakers: Mutex<Vec<Waker>>,
    /// Where producer threads wait for room.
    cond: Condvar,
}

impl Room {
    /// A room of `max` deltas; 0 means unbounded.
    pub(crate) fn new(max: usize) -> Self {
        Self {
            // A bound at or above the count's range is no bound at all.
            max: u64::try_from(max)
                .ok()
                .filter(|&max| max > 0 && max < COUNT),
            state: AtomicU64::new(0),
            wakers: Mutex::new(Vec::new()),
            cond: Condvar::new(),
        }
    }

    /// Whether the queue is bounded (and so counts its deltas here).
    pub(crate) fn is_bounded(&self) -> bool {
        self.max.is_some()
    }

    fn has_room_in(&self, state: u64) -> bool {
        match self.max {
            None => true,
            Some(max) => state & CLOSED != 0 || state & COUNT < max,
        }
    }

    /// Whether a producer finds room now. A snapshot: other producers may take it first.
    pub(crate) fn has_room(&self) -> bool {
        // Relaxed: a producer's own reservations are always visible to it (coherence), and a
        // stale count only ever lags consumers' releases, so a lone producer is never told
        // there is room when there is none.
        self.has_room_in(self.state.load(Ordering::Relaxed))
    }

    /// The queued deltas counted (0 when unbounded: nothing is counted).
    pub(crate) fn count(&self) -> usize {
        // Relaxed: a statistic; the count fits a usize because it only counts queued deltas.
        (self.state.load(Ordering::Relaxed) & COUNT) as usize
    }

    /// Takes room for one delta if there is room (or the queue is closed, or unbounded).
    /// The caller holds the shard lock of the delta's key and queues the delta before
    /// releasing it, so the count never runs behind the shard.
    pub(crate) fn try_reserve(&self) -> bool {
        if self.max.is_none() {
            return true;
        }
        let mut state = self.state.load(Ordering::Relaxed);
        loop {
            if !self.has_room_in(state) {
                return false;
            }
            // Relaxed: see the module docs; the reservation publishes nothing.
            match self.state.compare_exchange_weak(
                state,
                state + 1,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(current) => state = current,
            }
        }
    }

    /// Counts `n` deltas queued without waiting for room (`replace`, `resync`,
    /// `add_if_not_present`, keys put back after a panic): they may go over the bound.
    pub(crate) fn add(&self, n: usize) {
        if self.max.is_some() && n > 0 {
            self.state.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    /// `n` deltas left the queue (were popped): wakes the waiting producers if that made room.
    pub(crate) fn release(&self, n: usize) {
        if self.max.is_none() || n == 0 {
            return;
        }
        let n = n as u64;
        // Relaxed RMW: reads the newest value, so a producer that set WAITING before it is seen
        // here (module docs).
        let prev = self.state.fetch_sub(n, Ordering::Relaxed);
        if prev & WAITING != 0 && self.has_room_in(prev - n) {
            self.wake_all();
        }
    }

    /// Lifts the bound for good and wakes every waiting producer.
    pub(crate) fn close(&self) {
        if self.max.is_none() {
            return;
        }
        let prev = self.state.fetch_or(CLOSED, Ordering::Relaxed);
        if prev & WAITING != 0 {
            self.wake_all();
        }
    }

    /// Clears `waiting` and wakes every waiting producer, threads and tasks. Under the room lock:
    /// a producer that set `waiting` holds that lock until it waits, so it is waiting by now.
    fn wake_all(&self) {
        let mut wakers = lock(&self.wakers);
        self.state.fetch_and(!WAITING, Ordering::Relaxed);
        let woken = std::mem::take(&mut *wakers);
        self.cond.notify_all();
        drop(wakers);
        for waker in woken {
            waker.wake();
        }
    }

    /// Blocks until there is room. Producers that still find none after a wake-up wait again;
    /// which of several waiting producers gets the room is not specified.
    pub(crate) fn wait(&self) {
        if self.max.is_none() {
            return;
        }
        let mut guard = lock(&self.wakers);
        loop {
            // The RMW returns the newest count (module docs). Leaving WAITING set when there is
            // room costs at most one needless wake-up later.
            let prev = self.state.fetch_or(WAITING, Ordering::Relaxed);
            if self.has_room_in(prev) {
                return;
            }
            guard = wait(&self.cond, guard);
        }
    }

    /// [`wait`](Self::wait) for async producers: `Ready` when there is room, else registers the
    /// task's waker, which the next release that makes room wakes.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.has_room() {
            return Poll::Ready(());
        }
        let mut wakers = lock(&self.wakers);
        let prev = self.state.fetch_or(WAITING, Ordering::Relaxed);
        if self.has_room_in(prev) {
            return Poll::Ready(());
        }
        // One entry per task, however often it polls before being woken.
        if !wakers.iter().any(|w| w.will_wake(cx.waker())) {
            wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl fmt::Debug for Room {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.load(Ordering::Relaxed);
        f.debug_struct("Room")
            .field("max", &self.max)
            .field("queued_deltas", &(state & COUNT))
            .field("waiting", &(state & WAITING != 0))
            .field("closed", &(state & CLOSED != 0))
            .finish()
    }
}
