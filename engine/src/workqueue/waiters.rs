//! The waiter registry: the `get`s waiting for an item, each a std [`Waker`].
//!
//! Runtime-agnostic: an async `get` registers its task's waker (tokio's, or any executor's);
//! a blocking `get` registers a waker that unparks its thread ([`block_on`]). The list itself
//! is plain data; each queue guards it with a lock of its own and decides when to wake whom.
//! Wakers are handed back to the caller to be woken *after* that lock is released, so a waker
//! that runs code (an executor's scheduling) never runs under a queue lock.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use super::queue::WaitSlot;

/// Waiters in arrival order, so wake-ups go to the longest waiting first.
#[derive(Debug, Default)]
pub(crate) struct WaiterList {
    next_id: u64,
    waiting: VecDeque<(u64, Waker)>,
}

impl WaiterList {
    /// Registers `slot`'s waiter with `waker`, or refreshes its waker if it is registered.
    pub(crate) fn register(&mut self, slot: &mut WaitSlot, waker: &Waker) {
        if let Some(id) = slot.id {
            if let Some((_, registered)) = self.waiting.iter_mut().find(|(i, _)| *i == id) {
                if !registered.will_wake(waker) {
                    registered.clone_from(waker);
                }
                return;
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back((id, waker.clone()));
        slot.id = Some(id);
    }

    /// Whether `slot` is registered (not yet woken).
    pub(crate) fn contains(&self, slot: &WaitSlot) -> bool {
        slot.id
            .is_some_and(|id| self.waiting.iter().any(|(i, _)| *i == id))
    }

    /// Removes `slot`'s waiter. Returns true if it was registered, false if it had been woken
    /// (taken off the list) already. Either way the slot is cleared.
    pub(crate) fn remove(&mut self, slot: &mut WaitSlot) -> bool {
        let Some(id) = slot.id.take() else {
            return false;
        };
        match self.waiting.iter().position(|(i, _)| *i == id) {
            Some(index) => {
                self.waiting.remove(index);
                true
            }
            None => false,
        }
    }

    /// Takes the longest-waiting waiter off the list; the caller wakes it after unlocking.
    pub(crate) fn pop(&mut self) -> Option<Waker> {
        self.waiting.pop_front().map(|(_, waker)| waker)
    }

    /// Takes every waiter off the list.
    pub(crate) fn take_all(&mut self) -> Vec<Waker> {
        self.waiting.drain(..).map(|(_, waker)| waker).collect()
    }

    /// How many waiters are registered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }
}

/// Unparks a blocked thread.
struct ThreadWaker(crate::sync::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// This thread's waker. Outside loom it is made once per thread and cloned (a reference-count
/// bump), so a worker that blocks often does not allocate each time; loom runs its modelled
/// threads on one OS thread, so there it is made afresh for the current modelled thread.
fn thread_waker() -> Waker {
    #[cfg(not(kcache_loom))]
    {
        thread_local! {
            static WAKER: Waker = Waker::from(Arc::new(ThreadWaker(crate::sync::current_thread())));
        }
        WAKER.with(Waker::clone)
    }
    #[cfg(kcache_loom)]
    {
        Waker::from(Arc::new(ThreadWaker(crate::sync::current_thread())))
    }
}

/// Runs `poll` on this thread until it is ready, parking between polls; the waker it is given
/// unparks this thread. Parking may return spuriously: `poll` is simply called again.
pub(crate) fn block_on<T>(mut poll: impl FnMut(&mut Context<'_>) -> Poll<T>) -> T {
    let waker = thread_waker();
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(value) = poll(&mut cx) {
            return value;
        }
        crate::sync::park();
    }
}

#[cfg(all(test, not(kcache_loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::workqueue::CountingWaker;

    #[test]
    fn waiters_are_woken_oldest_first_and_removal_reports_whether_woken() {
        let count = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        let mut list = WaiterList::default();
        let (mut a, mut b) = (WaitSlot::default(), WaitSlot::default());
        list.register(&mut a, &waker);
        list.register(&mut b, &waker);
        list.register(&mut a, &waker);
        assert_eq!(list.len(), 2, "re-registering refreshes, never duplicates");
        list.pop().unwrap().wake();
        assert!(!list.contains(&a), "the oldest waiter was woken first");
        assert!(list.contains(&b));
        assert!(
            !list.remove(&mut a),
            "a woken waiter is no longer registered"
        );
        assert!(list.remove(&mut b));
        assert_eq!(list.len(), 0);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn block_on_parks_until_woken_from_another_thread() {
        let polls = AtomicUsize::new(0);
        let value = block_on(|cx| {
            if polls.fetch_add(1, Ordering::SeqCst) == 0 {
                let waker = cx.waker().clone();
                std::thread::spawn(move || waker.wake());
                Poll::Pending
            } else {
                Poll::Ready(7)
            }
        });
        assert_eq!(value, 7);
    }
}
