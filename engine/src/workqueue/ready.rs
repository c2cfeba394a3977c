//! The sharded work queue's scheduler: which shards have queued items, and who waits for one.
//!
//! The algorithm is the sharded DeltaFIFO's (`sharded/scheduler.rs`), with waiters that may be
//! threads *or* async tasks. A shard with queued items holds one *token* (its index) in a
//! lock-free FIFO; a `get` takes a token, takes one item from that shard, and puts the token
//! back at the tail if the shard has more, so `get`s visit busy shards round-robin.
//!
//! Tokens are counted in one `AtomicU64` (`permits` in bits 0..32, `waiters` in bits 32..63,
//! `closed` in bit 63). Every operation on it is a read-modify-write, so they are totally
//! ordered, and the lost wake-up (a `get` deciding to wait just as an `add` decides nobody
//! waits) cannot happen:
//!
//! - `schedule` adds a permit; only if the word counts a waiter does it lock the waiter list
//!   and wake the oldest one: with workers busy, an add costs two atomic operations, no lock
//!   beyond its shard's and no system call;
//! - a `get` that finds no permit locks the waiter list and counts itself as a waiter *in the
//!   same word*, with a compare-and-swap that fails if a permit or `closed` appeared meanwhile
//!   (it then takes the permit instead). A `schedule` that follows sees the waiter and, as it
//!   takes the list's lock to wake it, finds it registered.
//!
//! The waiter count and the list change together under the list's lock, so they agree; each
//! permit that sees a waiter wakes one. A woken `get` that finds the permit taken by someone
//! else waits again; an async `get` dropped after it was woken passes the wake-up on.

use std::task::{Context, Poll, Waker};

use crate::sharded::scheduler::TokenQueue;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

use super::queue::WaitSlot;
use super::waiters::WaiterList;

const PERMIT: u64 = 1;
const PERMIT_MASK: u64 = (1 << 32) - 1;
const WAITER: u64 = 1 << 32;
const WAITER_MASK: u64 = ((1 << 31) - 1) << 32;
const CLOSED: u64 = 1 << 63;

fn permits(state: u64) -> u64 {
    state & PERMIT_MASK
}

fn waiters(state: u64) -> u64 {
    (state & WAITER_MASK) >> 32
}

fn is_closed(state: u64) -> bool {
    state & CLOSED != 0
}

/// What a non-blocking acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ready {
    /// A shard with queued items; the caller now serves it.
    Shard(usize),
    /// No shard has queued items.
    Empty,
    /// No shard has queued items and the queue is shut down.
    Closed,
}

/// Shard tokens, the semaphore that counts them, and the waiters.
pub(crate) struct ReadyShards {
    tokens: TokenQueue,
    state: AtomicU64,
    waiters: Mutex<WaiterList>,
}

impl ReadyShards {
    pub(crate) fn new() -> Self {
        Self {
            tokens: TokenQueue::new(),
            state: AtomicU64::new(0),
            waiters: Mutex::new(WaiterList::default()),
        }
    }

    /// Makes `shard` available. The caller guarantees the shard holds no other token and is
    /// not being served (it set the shard's `scheduled` flag from false under the shard lock).
    pub(crate) fn schedule(&self, shard: usize) {
        self.tokens.push(shard);
        // Release: a `get` whose Acquire RMW takes this permit also sees the token pushed above
        // (all operations on the word are RMWs, so the release sequence runs through them).
        let prev = self.state.fetch_add(PERMIT, Ordering::Release);
        if waiters(prev) > 0 {
            self.wake_one();
        }
    }

    /// Takes a shard token without waiting.
    pub(crate) fn try_acquire(&self) -> Ready {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            if permits(state) == 0 {
                return if is_closed(state) {
                    Ready::Closed
                } else {
                    Ready::Empty
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
                Ok(_) => return Ready::Shard(self.take_token()),
                Err(current) => state = current,
            }
        }
    }

    /// One poll of a waiting acquire: a shard, `None` once closed with no token left, or
    /// `Pending` with `cx`'s waker registered. A `Ready` result leaves `slot` unregistered.
    pub(crate) fn poll_acquire(
        &self,
        slot: &mut WaitSlot,
        cx: &mut Context<'_>,
    ) -> Poll<Option<usize>> {
        loop {
            match self.try_acquire() {
                Ready::Shard(shard) => {
                    self.deregister(slot);
                    return Poll::Ready(Some(shard));
                }
                Ready::Closed => {
                    self.deregister(slot);
                    return Poll::Ready(None);
                }
                Ready::Empty => {}
            }
            let mut list = lock(&self.waiters);
            if list.contains(slot) {
                // Polled again before a wake-up: still counted, just refresh the waker.
                list.register(slot, cx.waker());
                return Poll::Pending;
            }
            // Count ourselves as a waiter only if there is still nothing to take: the CAS
            // fails if a permit or `closed` arrived since `try_acquire`, and we retry.
            let mut state = self.state.load(Ordering::Acquire);
            let registered = loop {
                if permits(state) > 0 || is_closed(state) {
                    break false;
                }
                // AcqRel: orders our registration before the `schedule` whose fetch_add reads
                // it (it then wakes us under this same list lock).
                match self.state.compare_exchange_weak(
                    state,
                    state + WAITER,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break true,
                    Err(current) => state = current,
                }
            };
            if registered {
                list.register(slot, cx.waker());
                return Poll::Pending;
            }
        }
    }

    /// Abandons a waiting acquire. If the waiter had been woken but will not take the permit
    /// it was woken for, another waiter is woken in its place.
    pub(crate) fn cancel(&self, slot: &mut WaitSlot) {
        let mut list = lock(&self.waiters);
        if list.remove(slot) {
            self.state.fetch_sub(WAITER, Ordering::Relaxed);
            return;
        }
        let state = self.state.load(Ordering::Acquire);
        if permits(state) > 0 {
            let waker = self.pop_waiter(&mut list);
            drop(list);
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }

    /// Shuts down: waiters that find no token return `None` instead of waiting. Tokens
    /// scheduled later are still handed out (an item re-queued by `done`).
    pub(crate) fn close(&self) {
        // Release pairs with the Acquire loads in `try_acquire`/`poll_acquire`.
        self.state.fetch_or(CLOSED, Ordering::Release);
        let mut list = lock(&self.waiters);
        let all = list.take_all();
        self.state
            .fetch_sub(WAITER * all.len() as u64, Ordering::Relaxed);
        drop(list);
        for waker in all {
            waker.wake();
        }
    }

    /// Removes `slot` from the list if it is still registered (a `get` that found a permit
    /// without being woken).
    fn deregister(&self, slot: &mut WaitSlot) {
        if slot.id.is_none() {
            return;
        }
        let mut list = lock(&self.waiters);
        if list.remove(slot) {
            self.state.fetch_sub(WAITER, Ordering::Relaxed);
        }
    }

    fn wake_one(&self) {
        let mut list = lock(&self.waiters);
        let waker = self.pop_waiter(&mut list);
        drop(list);
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Takes the oldest waiter off the list and the count. The caller holds the list's lock.
    fn pop_waiter(&self, list: &mut WaiterList) -> Option<Waker> {
        let waker = list.pop()?;
        // Relaxed: the count only changes under the list's lock, which orders it.
        self.state.fetch_sub(WAITER, Ordering::Relaxed);
        Some(waker)
    }

    /// Pops the token a permit stands for: `schedule` pushed it before adding the permit, and
    /// nobody else holds that permit, so it is there.
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

impl std::fmt::Debug for ReadyShards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.load(Ordering::Relaxed);
        f.debug_struct("ReadyShards")
            .field("ready_shards", &permits(state))
            .field("waiters", &waiters(state))
            .field("closed", &is_closed(state))
            .finish()
    }
}
