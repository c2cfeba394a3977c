//! The hand-off between the consumers and one handler registration: a bounded buffer of
//! batches of notifications, with back-pressure.
//!
//! # Algorithm
//!
//! One mutex guards a `VecDeque` of batches and the count of notifications not yet delivered;
//! two condition variables carry the two waits:
//!
//! - **`data`**: the receiver (a delivery thread) waits for a batch. A sender wakes it only if
//!   it said it was waiting (`receiver_waiting`), so a busy receiver costs the senders no
//!   system call, and an idle one is woken at most once per batch (the wake comes with the
//!   batch, before a sender may wait for room). A receiver that is a tokio task waits on a
//!   [`Notify`] instead (its permit makes the wake that lands between "nothing here" and the
//!   `.await` count).
//! - **`room`**: a sender that would take the buffer over its bound waits until the receiver
//!   has delivered a batch (`senders_waiting` again spares the receiver a wake nobody needs).
//!   A batch larger than the room is handed over in parts, in order, so the pending count
//!   never exceeds the bound.
//!
//! The receiver takes every queued batch at once and releases their room batch by batch, as it
//! delivers them: "pending" counts what a handler has not been given yet, including what the
//! receiver holds in hand, so the bound is a bound on memory.
//!
//! [`close`](Handoff::close) refuses new batches and lets the receiver drain what is queued;
//! [`remove`](Handoff::remove) also drops what is queued. Both wake every waiter. The loom model
//! (`engine/tests/loom_fanout.rs`) checks that no wake is lost: not the receiver's, not a
//! blocked sender's, and not on close or remove.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::sync::{lock, wait, AtomicU64, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

/// The buffer no longer takes batches (closed or removed); the batch was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandoffClosed;

/// Figures about one hand-off, readable without its lock (written under it).
#[derive(Debug, Default)]
pub struct HandoffCounters {
    /// Notifications sent and not yet delivered (queued or in the receiver's hand).
    pending: AtomicUsize,
    /// The highest `pending` seen.
    peak: AtomicUsize,
    /// Sends that had to wait for room.
    waits: AtomicU64,
    /// Nanoseconds senders spent waiting for room, in total.
    waited_nanos: AtomicU64,
}

impl HandoffCounters {
    /// Notifications sent and not yet delivered.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// The highest [`pending`](Self::pending) count so far.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// How many sends had to wait for room.
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// How long sends waited for room, in total.
    pub fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited_nanos.load(Ordering::Relaxed))
    }
}

/// What the mutex guards.
struct State<N> {
    batches: VecDeque<Vec<N>>,
    /// Notifications sent and not yet released by the receiver. Invariant: at most `bound`,
    /// except after [`Handoff::send_over_bound`].
    pending: usize,
    /// No more batches are taken; the receiver drains what is queued and ends.
    closed: bool,
    /// Like `closed`, and what was queued is dropped.
    removed: bool,
    /// The receiver is waiting (or about to wait) for a batch.
    receiver_waiting: bool,
    /// Senders waiting for room.
    senders_waiting: usize,
    /// The buffer hit its bound and has not caught up since (drained with no sender
    /// waiting): one lag episode.
    lagging: bool,
}

/// How the receiver waits for batches.
enum ReceiverWait {
    /// A delivery thread, on a condition variable.
    Thread(Condvar),
    /// A tokio task, on a `Notify`.
    Task(Notify),
}

/// A bounded buffer of batches of `N` from any number of senders to one receiver; see the
/// module docs.
pub struct Handoff<N> {
    state: Mutex<State<N>>,
    data: ReceiverWait,
    room: Condvar,
    bound: usize,
    counters: Arc<HandoffCounters>,
}

impl<N> fmt::Debug for Handoff<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handoff")
            .field("bound", &self.bound)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// What [`Handoff::try_recv`] found.
#[derive(Debug)]
pub enum TryRecv<N> {
    /// Every batch queued, oldest first.
    Batches(VecDeque<Vec<N>>),
    /// Nothing queued: the receiver is marked waiting, and the next send wakes it.
    Empty,
    /// Closed and drained, or removed: nothing more will come.
    Ended,
}

impl<N> Handoff<N> {
    /// A buffer of at most `bound` pending notifications (at least 1) for a receiver that is a
    /// thread ([`recv`](Self::recv)).
    pub fn for_thread(bound: usize) -> Self {
        Self::new(bound, ReceiverWait::Thread(Condvar::new()))
    }

    /// The same for a receiver that is a tokio task ([`recv_async`](Self::recv_async)).
    pub fn for_task(bound: usize) -> Self {
        Self::new(bound, ReceiverWait::Task(Notify::new()))
    }

    fn new(bound: usize, data: ReceiverWait) -> Self {
        Self {
            state: Mutex::new(State {
                batches: VecDeque::new(),
                pending: 0,
                closed: false,
                removed: false,
                receiver_waiting: false,
                senders_waiting: 0,
                lagging: false,
            }),
            data,
            room: Condvar::new(),
            bound: bound.max(1),
            counters: Arc::default(),
        }
    }

    /// The most notifications that may be pending.
    pub fn bound(&self) -> usize {
        self.bound
    }

    /// The figures, shared.
    pub fn counters(&self) -> &Arc<HandoffCounters> {
        &self.counters
    }

    /// Hands `items` over in order, waiting for room whenever the bound would be exceeded:
    /// one batch if it fits. `on_full(pending)` runs (without the lock) when a send finds the
    /// buffer full at the start of a lag episode; an episode ends when the buffer has drained
    /// with no sender waiting.
    /// On close or removal the rest of `items` is dropped and the call returns
    /// [`HandoffClosed`].
    pub fn send(
        &self,
        mut items: Vec<N>,
        mut on_full: impl FnMut(usize),
    ) -> Result<(), HandoffClosed> {
        if items.is_empty() {
            return Ok(());
        }
        let mut waited_since: Option<Instant> = None;
        let mut state = lock(&self.state);
        let result = loop {
            if state.closed {
                break Err(HandoffClosed);
            }
            let room = self.bound.saturating_sub(state.pending);
            if room == 0 {
                if !state.lagging {
                    state.lagging = true;
                    let pending = state.pending;
                    // User code (the lag hook) runs without the lock; the state is looked at
                    // afresh afterwards.
                    drop(state);
                    on_full(pending);
                    state = lock(&self.state);
                    continue;
                }
                waited_since.get_or_insert_with(Instant::now);
                state.senders_waiting += 1;
                state = wait(&self.room, state);
                state.senders_waiting -= 1;
                continue;
            }
            let part = if items.len() <= room {
                std::mem::take(&mut items)
            } else {
                let rest = items.split_off(room);
                std::mem::replace(&mut items, rest)
            };
            self.enqueue(&mut state, part);
            if items.is_empty() {
                break Ok(());
            }
        };
        drop(state);
        if let Some(since) = waited_since {
            self.counters.waits.fetch_add(1, Ordering::Relaxed);
            let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.counters
                .waited_nanos
                .fetch_add(nanos, Ordering::Relaxed);
        }
        result
    }

    /// Hands `items` over as one batch without waiting, even past the bound: for the snapshot
    /// of a registration added late, sent under the informer's exclusive lock, where waiting
    /// would stall every consumer (as the queue lets a relist go over its own bound).
    pub fn send_over_bound(&self, items: Vec<N>) -> Result<(), HandoffClosed> {
        if items.is_empty() {
            return Ok(());
        }
        let mut state = lock(&self.state);
        if state.closed {
            return Err(HandoffClosed);
        }
        self.enqueue(&mut state, items);
        Ok(())
    }

    /// Queues a batch and wakes the receiver if it waits: before a sender waits for room,
    /// the receiver must know there is something to make room with.
    fn enqueue(&self, state: &mut State<N>, part: Vec<N>) {
        state.pending += part.len();
        state.batches.push_back(part);
        self.wake_receiver(state);
        self.counters
            .pending
            .store(state.pending, Ordering::Relaxed);
        // Written only under the lock, so a load-compare-store cannot lose a higher value.
        if state.pending > self.counters.peak.load(Ordering::Relaxed) {
            self.counters.peak.store(state.pending, Ordering::Relaxed);
        }
    }

    /// Wakes the receiver if it waits for a batch.
    fn wake_receiver(&self, state: &mut State<N>) {
        if std::mem::take(&mut state.receiver_waiting) {
            match &self.data {
                ReceiverWait::Thread(data) => data.notify_one(),
                // Under our lock is fine: the task never waits for the `Notify` holding it.
                ReceiverWait::Task(notify) => notify.notify_one(),
            }
        }
    }

    /// Blocks until batches are queued and takes them all, oldest first; `None` once closed
    /// and drained, or removed. For a thread receiver.
    pub fn recv(&self) -> Option<VecDeque<Vec<N>>> {
        let mut state = lock(&self.state);
        loop {
            match self.take(&mut state, true) {
                TryRecv::Batches(batches) => return Some(batches),
                TryRecv::Ended => return None,
                TryRecv::Empty => {}
            }
            state = match &self.data {
                ReceiverWait::Thread(data) => wait(data, state),
                ReceiverWait::Task(_) => panic!("recv on a hand-off made for a task"),
            };
        }
    }

    /// Takes every queued batch without waiting; see [`TryRecv`].
    pub fn try_recv(&self) -> TryRecv<N> {
        self.take(&mut lock(&self.state), true)
    }

    /// [`try_recv`](Self::try_recv) for a receiver that has other work and will not wait:
    /// `Empty` does not mark it waiting, so no sender pays for a wake nobody needs.
    pub fn poll(&self) -> TryRecv<N> {
        self.take(&mut lock(&self.state), false)
    }

    /// [`recv`](Self::recv) for a task receiver: waits without blocking the runtime's thread.
    pub async fn recv_async(&self) -> Option<VecDeque<Vec<N>>> {
        loop {
            match self.try_recv() {
                TryRecv::Batches(batches) => return Some(batches),
                TryRecv::Ended => return None,
                TryRecv::Empty => match &self.data {
                    // A send between `try_recv` and here stored a permit: no wake is lost.
                    ReceiverWait::Task(notify) => notify.notified().await,
                    ReceiverWait::Thread(_) => panic!("recv_async on a hand-off made for a thread"),
                },
            }
        }
    }

    fn take(&self, state: &mut MutexGuard<'_, State<N>>, mark_waiting: bool) -> TryRecv<N> {
        if state.removed {
            TryRecv::Ended
        } else if !state.batches.is_empty() {
            TryRecv::Batches(std::mem::take(&mut state.batches))
        } else if state.closed {
            TryRecv::Ended
        } else {
            state.receiver_waiting |= mark_waiting;
            TryRecv::Empty
        }
    }

    /// The receiver has delivered `n` notifications it took: their room is free again.
    pub fn delivered(&self, n: usize) {
        let mut state = lock(&self.state);
        state.pending = state.pending.saturating_sub(n);
        if state.pending == 0 && state.senders_waiting == 0 {
            // Caught up, with nobody waiting to hand more over: the next time the buffer
            // fills is a new episode.
            state.lagging = false;
        }
        self.counters
            .pending
            .store(state.pending, Ordering::Relaxed);
        if state.senders_waiting > 0 {
            self.room.notify_all();
        }
    }

    /// Takes no more batches; the receiver drains what is queued, then ends. Wakes everyone.
    pub fn close(&self) {
        let mut state = lock(&self.state);
        state.closed = true;
        self.wake_all(state);
    }

    /// Takes no more batches and drops what is queued; the receiver ends. Wakes everyone.
    pub fn remove(&self) {
        let mut state = lock(&self.state);
        state.closed = true;
        state.removed = true;
        let dropped: usize = state.batches.drain(..).map(|b| b.len()).sum();
        state.pending = state.pending.saturating_sub(dropped);
        self.counters
            .pending
            .store(state.pending, Ordering::Relaxed);
        self.wake_all(state);
    }

    fn wake_all(&self, mut state: MutexGuard<'_, State<N>>) {
        state.receiver_waiting = false;
        self.room.notify_all();
        match &self.data {
            ReceiverWait::Thread(data) => data.notify_all(),
            ReceiverWait::Task(notify) => notify.notify_one(),
        }
    }
}
