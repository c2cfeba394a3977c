//! client-go's work queue (`util/workqueue/queue.go`, `Typed`), ported faithfully: one mutex,
//! one condition variable, three sets.
//!
//! The yardstick the [sharded](super::ShardedQueue) queue is checked against, quirk included:
//! `done` of an item that was never handed out queues it a second time if it is dirty
//! (`add(a); done(a)` leaves `a` in the queue twice, and two `get`s hand it out twice).
//!
//! Async `get`s wait in a waiter list (`waiters.rs`) under the same mutex. A signal (client-go
//! `cond.Signal`) goes to a blocked thread if one has not been signalled yet, else to the oldest
//! waiting task, so each add wakes exactly one waiter, thread or task.

use std::collections::VecDeque;
use std::fmt;
use std::task::{Context, Poll, Waker};

use crate::key::{Key, KeyMap, KeySet};
use crate::sync::{lock, wait, Condvar, Mutex, MutexGuard};

use super::clock::Time;
use super::metrics::{QueueConfig, QueueMetrics};
use super::queue::{NotProcessing, ShutDown, TryGet, WaitSlot, WorkQueue};
use super::waiters::WaiterList;

/// Everything the lock guards.
struct State {
    /// Items to hand out, in order. Every item here is in `dirty`, except after the quirk.
    queue: VecDeque<Key>,
    /// Items that need processing.
    dirty: KeySet,
    /// Items handed out and not yet done.
    processing: KeySet,
    shutting_down: bool,
    /// `shut_down_with_drain` is waiting; a plain `shut_down` clears it (client-go `drain`).
    drain: bool,
    /// Threads blocked in `get`, and how many of them were signalled and have not woken yet.
    threads_waiting: usize,
    threads_signalled: usize,
    tasks: WaiterList,
    /// Metrics only: first add time of queued items, start time of processing ones.
    add_times: KeyMap<Time>,
    start_times: KeyMap<Time>,
}

/// client-go's work queue: one lock, one condition variable.
///
/// ```
/// use kcache::Key;
/// use kcache::workqueue::{ReferenceQueue, WorkQueue};
/// let q = ReferenceQueue::new();
/// q.add(Key::new("a"));
/// q.add(Key::new("a")); // dirty already: deduplicated
/// assert_eq!(q.len(), 1);
/// let a = q.get().unwrap();
/// q.add(a.clone()); // processing: re-queued by done
/// assert_eq!(q.len(), 0);
/// q.done(&a).unwrap();
/// assert_eq!(q.len(), 1);
/// ```
pub struct ReferenceQueue {
    state: Mutex<State>,
    cond: Condvar,
    metrics: Option<QueueMetrics>,
}

impl ReferenceQueue {
    /// An unnamed queue: no metrics, real clock.
    pub fn new() -> Self {
        Self::with_config(&QueueConfig::new())
    }

    /// A queue with `config`'s name, metrics provider and clock.
    pub fn with_config(config: &QueueConfig) -> Self {
        Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                dirty: KeySet::default(),
                processing: KeySet::default(),
                shutting_down: false,
                drain: false,
                threads_waiting: 0,
                threads_signalled: 0,
                tasks: WaiterList::default(),
                add_times: KeyMap::default(),
                start_times: KeyMap::default(),
            }),
            cond: Condvar::new(),
            metrics: config.queue_metrics(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// client-go `cond.Signal()`: wakes one waiter, a thread if an unsignalled one is blocked,
    /// else the oldest task (returned, to be woken once the lock is released).
    #[must_use]
    fn signal(&self, state: &mut State) -> Option<Waker> {
        if state.threads_waiting > state.threads_signalled {
            state.threads_signalled += 1;
            self.cond.notify_one();
            None
        } else {
            state.tasks.pop()
        }
    }

    /// Marks the queue shutting down (draining or not) and wakes every waiter: the first
    /// half of client-go's `ShutDown` and `ShutDownWithDrain`.
    fn begin_shut_down(&self, drain: bool) {
        let mut state = self.lock();
        state.drain = drain;
        state.shutting_down = true;
        let wakers = self.broadcast(&mut state);
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
    }

    /// client-go `cond.Broadcast()`.
    #[must_use]
    fn broadcast(&self, state: &mut State) -> Vec<Waker> {
        state.threads_signalled = state.threads_waiting;
        self.cond.notify_all();
        state.tasks.take_all()
    }

    /// Hands out the queue's head. The caller checked the queue is not empty.
    fn take_head(&self, state: &mut State) -> Key {
        let item = state
            .queue
            .pop_front()
            .expect("take_head is called on a non-empty queue");
        if let Some(metrics) = &self.metrics {
            let started = metrics.got(state.add_times.remove(&item));
            state.start_times.insert(item.clone(), started);
        }
        state.processing.insert(item.clone());
        state.dirty.remove(&item);
        item
    }

    /// Blocks on the condition variable, counted as a waiting thread.
    fn wait<'a>(&self, mut state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        state.threads_waiting += 1;
        state = wait(&self.cond, state);
        state.threads_waiting -= 1;
        // A woken thread consumes one signal (a spurious wake-up may take another thread's;
        // that thread then re-checks too and at worst waits again: no item is left unserved
        // while a thread is awake to take it).
        state.threads_signalled = state.threads_signalled.saturating_sub(1);
        state
    }
}

impl Default for ReferenceQueue {
    fn default() -> Self {
        Self::new()
    }
}

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
    }
}

impl WorkQueue for ReferenceQueue {
    fn add(&self, item: Key) {
        let mut state = self.lock();
        if state.shutting_down || state.dirty.contains(&item) {
            return;
        }
        if let Some(metrics) = &self.metrics {
            let now = metrics.added();
            state.add_times.entry(item.clone()).or_insert(now);
        }
        state.dirty.insert(item.clone());
        if state.processing.contains(&item) {
            return;
        }
        state.queue.push_back(item);
        let waker = self.signal(&mut state);
        drop(state);
        wake(waker);
    }

    fn get(&self) -> Result<Key, ShutDown> {
        let mut state = self.lock();
        while state.queue.is_empty() && !state.shutting_down {
            state = self.wait(state);
        }
        if state.queue.is_empty() {
            return Err(ShutDown);
        }
        Ok(self.take_head(&mut state))
    }

    fn try_get(&self) -> TryGet {
        let mut state = self.lock();
        if !state.queue.is_empty() {
            TryGet::Item(self.take_head(&mut state))
        } else if state.shutting_down {
            TryGet::ShutDown
        } else {
            TryGet::Empty
        }
    }

    fn poll_get(&self, slot: &mut WaitSlot, cx: &mut Context<'_>) -> Poll<Result<Key, ShutDown>> {
        let mut state = self.lock();
        if !state.queue.is_empty() {
            state.tasks.remove(slot);
            return Poll::Ready(Ok(self.take_head(&mut state)));
        }
        if state.shutting_down {
            state.tasks.remove(slot);
            return Poll::Ready(Err(ShutDown));
        }
        state.tasks.register(slot, cx.waker());
        Poll::Pending
    }

    fn cancel_get(&self, slot: &mut WaitSlot) {
        let mut state = self.lock();
        if state.tasks.remove(slot) || state.queue.is_empty() {
            return;
        }
        // Woken for an item it will not take: pass the signal on.
        let waker = self.signal(&mut state);
        drop(state);
        wake(waker);
    }

    fn done(&self, item: &Key) -> Result<(), NotProcessing> {
        let mut state = self.lock();
        if let Some(metrics) = &self.metrics {
            metrics.done(state.start_times.remove(item));
        }
        state.processing.remove(item);
        let mut waker = None;
        if state.dirty.contains(item) {
            state.queue.push_back(item.clone());
            waker = self.signal(&mut state);
        } else if state.processing.is_empty() && state.drain {
            // client-go signals here for ShutDownWithDrain; its waiter is not a counted `get`.
            self.cond.notify_all();
        }
        drop(state);
        wake(waker);
        Ok(())
    }

    fn len(&self) -> usize {
        self.lock().queue.len()
    }

    fn processing_len(&self) -> usize {
        self.lock().processing.len()
    }

    fn shut_down(&self) {
        self.begin_shut_down(false);
    }

    fn shut_down_with_drain(&self) {
        self.begin_shut_down(true);
        let mut state = self.lock();
        while !state.processing.is_empty() && state.drain {
            state = wait(&self.cond, state);
        }
    }

    fn shutting_down(&self) -> bool {
        self.lock().shutting_down
    }

    fn update_unfinished_work(&self) {
        if let Some(metrics) = &self.metrics {
            let state = self.lock();
            metrics.update_unfinished(state.start_times.values().copied());
        }
    }
}

impl fmt::Debug for ReferenceQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("ReferenceQueue")
            .field("queue", &state.queue)
            .field("processing", &state.processing.len())
            .field("shutting_down", &state.shutting_down)
            .finish()
    }
}
