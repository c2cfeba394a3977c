//! The sharded work queue's scheduler: which shards have queued items, and who waits for one.
//!
//! The algorithm is the sharded DeltaFIFO's (`sharded/scheduler.rs`), with waiters that may be
//! threads *or* async tasks. A shard with queued items holds one *token* (its index) in a
//! lock-free FIFO; a `get` takes a token, takes one item from that shard, and puts the token
//! back at the tail if the shard has more, so `get`s visit busy shards round-robin.
//!
//! Tokens are counted in one `AtomicU64` (`permits` in bits 0..32, `waiters` in bits 32..62,
//! `searching` in bit 62, `closed` in bit 63). Every operation on it is a read-modify-write, so
//! they are totally ordered, and the lost wake-up (a `get` deciding to wait just as an `add`
//! decides nobody waits) cannot happen:
//!
//! - `schedule` adds a permit; only if the word counts a waiter *and no searcher* does it wake
//!   one: with workers busy, an add costs two atomic operations, no lock beyond its shard's and
//!   no system call;
//! - a `get` that finds no permit locks the waiter list and counts itself as a waiter *in the
//!   same word*, with a compare-and-swap that fails if a permit or `closed` appeared meanwhile
//!   (it then takes the permit instead). A `schedule` that follows sees the waiter and, as it
//!   takes the list's lock to wake it, finds it registered.
//!
//! # The searcher (Go's spinning-thread rule)
//!
//! A burst of adds to `N` shards that woke a sleeper each would wake `N`, most of which would
//! find the token already taken (by a worker that was polling, or by the first one woken) and
//! go back to sleep: two system calls each, for nothing. Go's scheduler has the cure: a thread that
//! readies work wakes a sleeper only if no thread is already *spinning* (looking for work), and
//! a spinner that finds work wakes the next one only if more work is left.
//!
//! Here the `searching` bit says "some `get` is looking for a token and will take one or hand
//! the search on". It is held by a `get` polling before it sleeps, or by a sleeper that a
//! wake-up made the searcher; at most one holds it. The holder gives it up in the same
//! read-modify-write that takes a permit — unless permits *and* waiters remain, in which case it
//! wakes the oldest waiter, who inherits the bit — or in the one that counts it as a waiter
//! (which fails if a permit arrived). A cancelled async `get` that held it hands it on the same
//! way. So a `schedule` that skipped the wake-up because the bit was set is always followed by
//! the holder seeing its permit: nothing is lost, and a burst of `N` adds wakes sleepers one
//! at a time, each only once the previous one has found work and seen more.
//!
//! The waiter count and the list change together under the list's lock, so they agree. A
//! woken `get` that finds the permit taken by someone else waits again (giving the bit up); an
//! async `get` dropped after it was woken passes the wake-up on.

use std::task::{Context, Poll, Waker};

use crate::sharded::scheduler::TokenQueue;
use crate::sync::{lock, AtomicU64, Mutex, Ordering};

use super::queue::WaitSlot;
use super::waiters::WaiterList;

const PERMIT: u64 = 1;
const PERMIT_MASK: u64 = (1 << 32) - 1;
const WAITER: u64 = 1 << 32;
const WAITER_MASK: u64 = ((1 << 30) - 1) << 32;
const SEARCHING: u64 = 1 << 62;
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

fn is_searching(state: u64) -> bool {
    state & SEARCHING != 0
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
        // A searcher will see this permit (see the module docs): wake nobody.
        if waiters(prev) > 0 && !is_searching(prev) {
            self.wake_searcher();
        }
    }

    /// Makes a waiter the searcher, unless there is one already or nobody waits.
    fn wake_searcher(&self) {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            if is_searching(state) || waiters(state) == 0 {
                return;
            }
            // Acquire: we may pop a waiter below, whose registration we must see.
            match self.state.compare_exchange_weak(
                state,
                state | SEARCHING,
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(current) => state = current,
            }
        }
        let list = lock(&self.waiters);
        self.hand_off(list);
    }

    /// Takes the searcher's bit if nobody holds it: the caller may then poll with
    /// [`try_acquire_searching`](ReadyShards::try_acquire_searching) and must end its search
    /// through it, [`poll_acquire`](ReadyShards::poll_acquire) or [`cancel`](ReadyShards::cancel)
    /// with `slot.searching` set.
    pub(crate) fn claim_search(&self) -> bool {
        // Relaxed: the bit carries no data; every hand-off goes through the permit RMWs.
        self.state.fetch_or(SEARCHING, Ordering::Relaxed) & SEARCHING == 0
    }

    /// The searcher ends its search: if permits and waiters remain, the oldest waiter is woken
    /// and inherits the bit; otherwise the bit is cleared. Takes the list's lock (held, so the
    /// waiter count cannot change under the decision).
    fn hand_off(&self, mut list: crate::sync::MutexGuard<'_, WaiterList>) {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            if permits(state) > 0 && waiters(state) > 0 {
                // The count and the list agree under the lock, so there is a waiter to pop;
                // if there were not, clearing the bit below is still correct.
                if let Some(waker) = self.pop_waiter(&mut list) {
                    drop(list);
                    waker.wake();
                    return;
                }
            }
            // Fails if a permit arrived meanwhile (its `schedule` saw the bit and woke nobody):
            // look again.
            match self.state.compare_exchange_weak(
                state,
                state & !SEARCHING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return,
                Err(current) => state = current,
            }
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

    /// [`try_acquire`](ReadyShards::try_acquire) by the searcher: taking a permit ends the
    /// search, in the same RMW when nothing else waits to be handed on, else by waking the
    /// oldest waiter as the next searcher. Finding none keeps the bit (the caller polls again
    /// or ends the search by waiting); finding the queue closed clears it.
    pub(crate) fn try_acquire_searching(&self) -> Ready {
        let mut state = self.state.load(Ordering::Acquire);
        loop {
            if permits(state) == 0 {
                if is_closed(state) {
                    self.state.fetch_and(!SEARCHING, Ordering::Relaxed);
                    return Ready::Closed;
                }
                return Ready::Empty;
            }
            let mut next = state - PERMIT;
            let hand_on = permits(next) > 0 && waiters(next) > 0;
            if !hand_on {
                next &= !SEARCHING;
            }
            // Acquire pairs with the Release in `schedule` (the token is visible); Release
            // orders our search's end before a `schedule` that reads the cleared bit.
            match self
                .state
                .compare_exchange_weak(state, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    let shard = self.take_token();
                    if hand_on {
                        self.hand_off(lock(&self.waiters));
                    }
                    return Ready::Shard(shard);
                }
                Err(current) => state = current,
            }
        }
    }

    /// One poll of a waiting acquire: a shard, `None` once closed with no token left, or
    /// `Pending` with `cx`'s waker registered. A `Ready` result leaves `slot` unregistered.
    /// A poll after a wake-up searches (`slot.searching`): it ends the search by taking a
    /// permit or by waiting again.
    pub(crate) fn poll_acquire(
        &self,
        slot: &mut WaitSlot,
        cx: &mut Context<'_>,
    ) -> Poll<Option<usize>> {
        if slot.id.is_some() && !slot.searching {
            let mut list = lock(&self.waiters);
            if !list.contains(slot) {
                // Woken: taken off the list by a hand-off (or by `close`), so we search now.
                list.remove(slot);
                slot.searching = true;
            }
        }
        loop {
            let found = if slot.searching {
                self.try_acquire_searching()
            } else {
                self.try_acquire()
            };
            match found {
                Ready::Shard(shard) => {
                    slot.searching = false;
                    self.deregister(slot);
                    return Poll::Ready(Some(shard));
                }
                Ready::Closed => {
                    slot.searching = false;
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
            // fails if a permit or `closed` arrived since the acquire, and we retry. A searcher
            // gives its bit up in the same RMW.
            let give_up = if slot.searching { SEARCHING } else { 0 };
            let mut state = self.state.load(Ordering::Acquire);
            let registered = loop {
                if permits(state) > 0 || is_closed(state) {
                    break false;
                }
                // AcqRel: orders our registration before the `schedule` whose fetch_add reads
                // it (it then wakes us under this same list lock).
                match self.state.compare_exchange_weak(
                    state,
                    (state + WAITER) & !give_up,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break true,
                    Err(current) => state = current,
                }
            };
            if registered {
                slot.searching = false;
                list.register(slot, cx.waker());
                return Poll::Pending;
            }
        }
    }

    /// Abandons a waiting acquire. If the waiter had been woken but will not take the permit
    /// it was woken for, another waiter is woken in its place.
    pub(crate) fn cancel(&self, slot: &mut WaitSlot) {
        let mut list = lock(&self.waiters);
        let was_woken = slot.id.is_some();
        if list.remove(slot) {
            self.state.fetch_sub(WAITER, Ordering::Relaxed);
            return;
        }
        if was_woken || std::mem::take(&mut slot.searching) {
            // We were the searcher (woken, or polling): hand the search on.
            self.hand_off(list);
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
            .field("searching", &is_searching(state))
            .field("closed", &is_closed(state))
            .finish()
    }
}

#[cfg(all(test, not(kcache_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    use crate::workqueue::CountingWaker;

    /// Three waiting tasks, a burst of three tokens: one wake-up, then one more each time the
    /// woken searcher takes a token and sees more left — never a wake-up for nothing.
    #[test]
    fn a_burst_wakes_one_searcher_at_a_time() {
        let ready = ReadyShards::new();
        let wakes = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut slots: Vec<WaitSlot> = (0..3).map(|_| WaitSlot::default()).collect();
        for slot in &mut slots {
            assert!(ready.poll_acquire(slot, &mut cx).is_pending());
        }
        for shard in 0..3 {
            ready.schedule(shard);
        }
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "one wake for the burst");
        // The oldest waiter was woken: it searches, takes a token, and hands the search on.
        assert_eq!(
            ready.poll_acquire(&mut slots[0], &mut cx),
            Poll::Ready(Some(0))
        );
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
        assert_eq!(
            ready.poll_acquire(&mut slots[1], &mut cx),
            Poll::Ready(Some(1))
        );
        assert_eq!(wakes.0.load(Ordering::SeqCst), 3);
        // The last token: nothing left to hand on, the search ends.
        assert_eq!(
            ready.poll_acquire(&mut slots[2], &mut cx),
            Poll::Ready(Some(2))
        );
        assert_eq!(wakes.0.load(Ordering::SeqCst), 3);
        assert!(!is_searching(ready.state.load(Ordering::SeqCst)));
    }

    /// While a `get` polls as the searcher, a token wakes no sleeper; the searcher takes it.
    #[test]
    fn a_polling_searcher_spares_the_sleepers() {
        let ready = ReadyShards::new();
        let wakes = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut sleeper = WaitSlot::default();
        assert!(ready.poll_acquire(&mut sleeper, &mut cx).is_pending());
        assert!(ready.claim_search());
        assert!(!ready.claim_search(), "one searcher at a time");
        ready.schedule(7);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 0);
        assert_eq!(ready.try_acquire_searching(), Ready::Shard(7));
        assert!(!is_searching(ready.state.load(Ordering::SeqCst)));
        // No searcher now: the next token wakes the sleeper.
        ready.schedule(8);
        assert_eq!(wakes.0.load(Ordering::SeqCst), 1);
    }

    /// A woken searcher robbed of its token gives the role up as it waits again, and a
    /// cancelled one hands it on.
    #[test]
    fn the_role_is_given_up_on_waiting_and_handed_on_on_cancel() {
        let ready = ReadyShards::new();
        let wakes = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let (mut a, mut b) = (WaitSlot::default(), WaitSlot::default());
        assert!(ready.poll_acquire(&mut a, &mut cx).is_pending());
        assert!(ready.poll_acquire(&mut b, &mut cx).is_pending());
        ready.schedule(1); // wakes a
        assert_eq!(ready.try_acquire(), Ready::Shard(1), "a thief takes it");
        assert!(
            ready.poll_acquire(&mut a, &mut cx).is_pending(),
            "a waits again"
        );
        assert!(!is_searching(ready.state.load(Ordering::SeqCst)));
        ready.schedule(2); // wakes b (the oldest now)
        ready.schedule(3); // b searches: no wake
        assert_eq!(wakes.0.load(Ordering::SeqCst), 2);
        ready.cancel(&mut b); // b dropped: the search goes to a
        assert_eq!(wakes.0.load(Ordering::SeqCst), 3);
        assert_eq!(ready.poll_acquire(&mut a, &mut cx), Poll::Ready(Some(2)));
        assert_eq!(
            wakes.0.load(Ordering::SeqCst),
            3,
            "nobody left to hand on to"
        );
        assert_eq!(ready.try_acquire(), Ready::Shard(3));
    }
}
