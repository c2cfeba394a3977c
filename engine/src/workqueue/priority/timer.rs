//! The clock's side of a priority queue: what makes waiting entries ready when their time
//! comes.
//!
//! - On a clock that moves only when told ([`FakeClock`](super::super::FakeClock)) there is no
//!   thread: the clock calls [`Promote::promote_due`] on the thread that moved it, before the
//!   move returns, so a test or a trace replay that steps the clock finds every due entry ready
//!   at once.
//! - On a clock that advances by itself, one thread sleeps until the earliest ready time; an
//!   add that creates an earlier waiting entry [`kick`](TimerHandle::kick)s it awake.
//!
//! The queue also promotes due entries itself at the start of each operation, so the thread
//! being late (a loaded machine) delays nothing a worker can observe.

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use crate::sync::{lock, wait, wait_timeout, Condvar, Mutex};

use super::super::clock::{Clock, Subscription, Time};

/// A queue whose waiting entries the timer makes ready.
pub(crate) trait Promote: Send + Sync + 'static {
    /// Makes every entry due at the clock's current time ready and wakes getters for them;
    /// returns the next time an entry becomes ready, if any.
    fn promote_due(&self) -> Option<Time>;
}

#[derive(Default)]
struct TimerState {
    /// The time the thread sleeps until, if it sleeps with a deadline.
    armed: Option<Time>,
    /// The thread must look again before it sleeps: an earlier entry arrived.
    kicked: bool,
    stopped: bool,
}

#[derive(Default)]
struct Timer {
    state: Mutex<TimerState>,
    cond: Condvar,
}

/// Keeps the timer running for one queue; stops it when dropped.
pub(crate) struct TimerHandle {
    /// The thread's state, on a clock that advances by itself.
    timer: Option<Arc<Timer>>,
    thread: Option<JoinHandle<()>>,
    _subscription: Option<Subscription>,
}

impl TimerHandle {
    /// Starts the timer of `queue` on `clock`. Weak: neither the clock's subscriber list nor
    /// the thread keeps the queue alive.
    pub(crate) fn start<P: Promote>(clock: &Arc<dyn Clock>, queue: &Arc<P>) -> Self {
        let weak: Weak<P> = Arc::downgrade(queue);
        let subscription = clock.subscribe(Arc::new(move || {
            if let Some(queue) = weak.upgrade() {
                queue.promote_due();
            }
        }));
        if subscription.is_some() {
            return Self {
                timer: None,
                thread: None,
                _subscription: subscription,
            };
        }
        let timer = Arc::new(Timer::default());
        let (thread_timer, weak, clock) =
            (Arc::clone(&timer), Arc::downgrade(queue), Arc::clone(clock));
        let thread = std::thread::Builder::new()
            .name("priorityqueue-timer".into())
            .spawn(move || run(&thread_timer, &weak, &*clock))
            .expect("spawning the priority queue's timer thread");
        Self {
            timer: Some(timer),
            thread: Some(thread),
            _subscription: None,
        }
    }

    /// A waiting entry now waits until `at`: wake the thread if it sleeps past that.
    pub(crate) fn kick(&self, at: Time) {
        let Some(timer) = &self.timer else { return };
        let mut state = lock(&timer.state);
        if !state.stopped && state.armed.is_none_or(|armed| at < armed) {
            state.kicked = true;
            drop(state);
            timer.cond.notify_one();
        }
    }

    /// Stops the thread (at shut-down: the clock no longer makes entries ready).
    pub(crate) fn stop(&self) {
        if let Some(timer) = &self.timer {
            lock(&timer.state).stopped = true;
            timer.cond.notify_all();
        }
    }
}

impl Drop for TimerHandle {
    fn drop(&mut self) {
        self.stop();
        if let Some(thread) = self.thread.take() {
            // The thread only promotes entries; a panic there has been reported already.
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for TimerHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerHandle")
            .field("thread", &self.thread.is_some())
            .finish()
    }
}

/// The timer thread: promote what is due, sleep until the next ready time or a kick.
fn run<P: Promote>(timer: &Timer, queue: &Weak<P>, clock: &dyn Clock) {
    loop {
        let Some(strong) = queue.upgrade() else {
            return;
        };
        let next = strong.promote_due();
        drop(strong);
        let mut state = lock(&timer.state);
        if state.stopped {
            return;
        }
        if std::mem::take(&mut state.kicked) {
            continue;
        }
        state.armed = next;
        state = match next {
            None => wait(&timer.cond, state),
            Some(at) => {
                let wait = at.saturating_duration_since(clock.now());
                wait_timeout(&timer.cond, state, wait)
            }
        };
        state.armed = None;
        state.kicked = false;
        if state.stopped {
            return;
        }
    }
}
