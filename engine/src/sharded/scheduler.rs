//! The scheduler: which shards have keys to pop, and where idle consumers sleep.
//!
//! A shard with poppable keys is represented by one *token* (its index) in a lock-free FIFO;
//! a consumer takes a token, serves that shard, and puts the token back at the tail if the
//! shard still has keys. Consumers therefore visit busy shards round-robin, which gives the
//! fairness bound stated in [`DeltaFifo`](super::DeltaFifo).
//!
//! Tokens are counted by a semaphore kept in one `AtomicU64` (`permits` in the low 32 bits,
//! `sleepers` in bits 32..63, `closed` in bit 63). Every operation on it is a read-modify-write
//! of that one word, so all of them are totally ordered by its modification order and the
//! classic lost-wake-up race (a consumer deciding to sleep just as a producer decides nobody
//! sleeps) cannot happen:
//!
//! - a producer adds a permit and, only if the word says someone sleeps, takes the sleep lock
//!   and notifies: with consumers busy, releasing a token is two atomic operations and no
//!   system call;
//! - a consumer takes a permit if there is one; otherwise it registers as a sleeper *in the same
//!   word*, so any later permit sees it; it then re-checks the word under the sleep lock before
//!   waiting, and producers notify under that lock, so a notification cannot fall between the
//!   check and the wait.

use super::idle::IdlePolicy;
use crate::sync::{lock, wait, AtomicU64, Condvar, Mutex, Ordering};

const PERMIT: u64 = 1;
const PERMIT_MASK: u64 = (1 << 32) - 1;
const SLEEPER: u64 = 1 << 32;
const SLEEPER_MASK: u64 = ((1 << 31) - 1) << 32;
const CLOSED: u64 = 1 << 63;

fn permits(state: u64) -> u64 {
    state & PERMIT_MASK
}

fn sleepers(state: u64) -> u64 {
    (state & SLEEPER_MASK) >> 32
}

fn is_closed(state: u64) -> bool {
    state & CLOSED != 0
}

/// What a non-blocking acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// A shard with keys to pop; the caller now serves it.
    Shard(usize),
    /// No shard has keys right now.
    Empty,
    /// No shard has keys and the queue is closed.
    Closed,
}

/// Shard tokens plus the semaphore that counts them and parks idle consumers.
pub(crate) struct Scheduler {
    tokens: TokenQueue,
    state: AtomicU64,
    sleep_lock: Mutex<()>,
    wake: Condvar,
    idle: IdlePolicy,
}

impl Scheduler {
    pub(crate) fn new() -> Self {
        Self {
            tokens: TokenQueue::new(),
            state: AtomicU64::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
            idle: IdlePolicy::new(),
        }
    }

    /// Makes `shard` available to consumers. The caller guarantees the shard holds no other
    /// token and is not being served (its `scheduled` flag was false and it set it).
    pub(crate) fn schedule(&self, shard: usize) {
        self.tokens.push(shard);
        // Release: a consumer whose Acquire read of the word includes this permit also sees the
        // token pushed above (every operation on `state` is an RMW, so the release sequence
        // headed here extends through every later operation on the word).
        let prev = self.state.fetch_add(PERMIT, Ordering::Release);
        if sleepers(prev) > 0 {
            // Notify under the lock: a sleeper re-checks the word under this lock before it
            // waits, so it has either seen our permit or is already waiting and gets this wake.
            let _guard = lock(&self.sleep_lock);
            self.wake.notify_one();
        }
    }

    /// Takes a shard token without blocking.
    pub(crate) fn try_acquire(&self) -> Acquired {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            if permits(state) == 0 {
                return if is_closed(state) {
                    Acquired::Closed
                } else {
                    Acquired::Empty
                };
            }
            // Acquire pairs with the Release in `schedule`: the token behind this permit is
            // visible to the pop below.
            match self.state.compare_exchange_weak(
                state,
                state - PERMIT,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => return Acquired::Shard(self.take_token()),
                Err(current) => state = current,
            }
        }
    }

    /// Takes a shard token, sleeping while there is none. Returns `None` once the queue is
    /// closed and no token is left.
    pub(crate) fn acquire(&self) -> Option<usize> {
        let mut backoff = self.idle.backoff();
        loop {
            match self.try_acquire() {
                Acquired::Shard(shard) => return Some(shard),
                Acquired::Closed => return None,
                Acquired::Empty => {}
            }
            // Under load a producer usually follows within microseconds: poll a little before
            // paying for a futex sleep and wake-up, while polling pays (see `idle`).
            if backoff.snooze() {
                continue;
            }
            self.sleep();
            backoff = self.idle.backoff();
        }
    }

    /// Registers as a sleeper and waits until a permit or close shows up.
    fn sleep(&self) {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            if permits(state) > 0 || is_closed(state) {
                return;
            }
            match self.state.compare_exchange_weak(
                state,
                state + SLEEPER,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(current) => state = current,
            }
        }
        let mut guard = lock(&self.sleep_lock);
        loop {
            let state = self.state.load(Ordering::Acquire);
            if permits(state) > 0 || is_closed(state) {
                break;
            }
            guard = wait(&self.wake, guard);
        }
        drop(guard);
        self.state.fetch_sub(SLEEPER, Ordering::Relaxed);
    }

    /// Closes: consumers that find no token return instead of sleeping.
    pub(crate) fn close(&self) {
        self.state.fetch_or(CLOSED, Ordering::Release);
        let _guard = lock(&self.sleep_lock);
        self.wake.notify_all();
    }

    /// Pops the token a permit stands for. The permit proves a token was pushed before it
    /// (see `schedule`) and not yet taken by anyone else, so the queue is not empty.
    fn take_token(&self) -> usize {
        loop {
            if let Some(shard) = self.tokens.pop() {
                return shard;
            }
            // Unreachable by the counting argument above; stay correct rather than panic.
            std::hint::spin_loop();
        }
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.load(Ordering::Relaxed);
        f.debug_struct("Scheduler")
            .field("ready_shards", &permits(state))
            .field("sleepers", &sleepers(state))
            .field("closed", &is_closed(state))
            .finish()
    }
}

/// The lock-free FIFO of shard tokens (also the workqueue's, `workqueue/ready.rs`): crossbeam's `SegQueue`, or under loom a mutex-guarded
/// deque (loom cannot see inside crossbeam, and the FIFO itself is not what we model).
pub(crate) struct TokenQueue {
    #[cfg(not(kcache_loom))]
    inner: crossbeam_queue::SegQueue<usize>,
    #[cfg(kcache_loom)]
    inner: Mutex<std::collections::VecDeque<usize>>,
}

impl TokenQueue {
    pub(crate) fn new() -> Self {
        Self {
            inner: Default::default(),
        }
    }

    pub(crate) fn push(&self, shard: usize) {
        #[cfg(not(kcache_loom))]
        self.inner.push(shard);
        #[cfg(kcache_loom)]
        lock(&self.inner).push_back(shard);
    }

    pub(crate) fn pop(&self) -> Option<usize> {
        #[cfg(not(kcache_loom))]
        return self.inner.pop();
        #[cfg(kcache_loom)]
        return lock(&self.inner).pop_front();
    }
}

#[cfg(all(test, not(kcache_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn tokens_come_out_in_schedule_order() {
        let s = Scheduler::new();
        assert_eq!(s.try_acquire(), Acquired::Empty);
        s.schedule(3);
        s.schedule(1);
        assert_eq!(s.try_acquire(), Acquired::Shard(3));
        assert_eq!(s.try_acquire(), Acquired::Shard(1));
        assert_eq!(s.try_acquire(), Acquired::Empty);
    }

    /// A scheduler and a consumer that has most likely gone to sleep in `acquire` on it.
    fn sleeping_consumer() -> (Arc<Scheduler>, std::thread::JoinHandle<Option<usize>>) {
        let s = Arc::new(Scheduler::new());
        let sleeper = {
            let s = Arc::clone(&s);
            std::thread::spawn(move || s.acquire())
        };
        std::thread::sleep(Duration::from_millis(20));
        (s, sleeper)
    }

    #[test]
    fn close_wakes_a_sleeping_consumer_and_tokens_outlive_close() {
        let (s, sleeper) = sleeping_consumer();
        s.close();
        assert_eq!(sleeper.join().unwrap(), None);
        s.schedule(7);
        assert_eq!(
            s.acquire(),
            Some(7),
            "a token scheduled after close is still handed out"
        );
        assert_eq!(s.try_acquire(), Acquired::Closed);
    }

    #[test]
    fn schedule_wakes_a_sleeping_consumer() {
        let (s, sleeper) = sleeping_consumer();
        s.schedule(5);
        assert_eq!(sleeper.join().unwrap(), Some(5));
    }
}
