//! A one-shot latch: "has synced" becomes true once and stays true; waiters are woken then.
//!
//! client-go closes a channel when a queue first syncs; this is that channel.

use std::time::{Duration, Instant};

use crate::sync::{lock, wait, wait_timeout, AtomicBool, Condvar, Mutex, Ordering};

/// Fires once; [`wait`](Latch::wait) blocks until it has.
#[derive(Debug, Default)]
pub(crate) struct Latch {
    /// Fast-path copy of `fired`, so checking a fired latch takes no lock.
    fired_fast: AtomicBool,
    fired: Mutex<bool>,
    cond: Condvar,
}

impl Latch {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether the latch has fired.
    pub(crate) fn is_fired(&self) -> bool {
        // Acquire pairs with the Release store in `fire`: whoever sees the latch fired also sees
        // every write that happened before it fired.
        self.fired_fast.load(Ordering::Acquire)
    }

    /// Fires the latch and wakes every waiter. Later calls do nothing.
    pub(crate) fn fire(&self) {
        if self.is_fired() {
            return;
        }
        let mut fired = lock(&self.fired);
        *fired = true;
        self.fired_fast.store(true, Ordering::Release);
        drop(fired);
        self.cond.notify_all();
    }

    /// Blocks until the latch fires or `timeout` passes; returns whether it fired.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> bool {
        if self.is_fired() {
            return true;
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut fired = lock(&self.fired);
        while !*fired {
            match deadline {
                None => fired = wait(&self.cond, fired),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return false;
                    }
                    fired = wait_timeout(&self.cond, fired, deadline - now);
                }
            }
        }
        true
    }
}

#[cfg(all(test, not(kcache_loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn wait_returns_false_on_timeout_and_true_once_fired() {
        let latch = Arc::new(Latch::new());
        assert!(!latch.wait(Some(Duration::from_millis(5))));
        let waiter = {
            let latch = Arc::clone(&latch);
            std::thread::spawn(move || latch.wait(None))
        };
        latch.fire();
        assert!(waiter.join().unwrap());
        assert!(latch.is_fired());
        latch.fire();
        assert!(latch.wait(Some(Duration::ZERO)));
    }
}
