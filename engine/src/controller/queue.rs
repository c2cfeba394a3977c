//! The queue a [`Controller`](super::Controller) feeds and its workers take from: the
//! [`ControllerQueue`] contract, over which the controller runs on client-go's rate-limiting
//! queue today and on a queue with priorities where one is given.

use std::time::Duration;

use crate::key::Key;
use crate::workqueue::{RateLimiter, RateLimitingQueue, WorkQueue};

/// The priority of an add. Higher is handed out first by a queue that orders by priority;
/// a queue without priorities ([`RateLimitingQueue`]) ignores it.
pub type Priority = i32;

/// The priority of a plain add: a live change.
pub const NORMAL_PRIORITY: Priority = 0;

/// The priority the controller gives a key that needs no work unless something else changed:
/// an object of the informer's initial list, and a resync (an update whose old and new
/// objects have the same resource version). controller-runtime's handlers use the same value.
pub const LOW_PRIORITY: Priority = -100;

/// What a [`Controller`](super::Controller) needs from its workqueue: client-go's
/// [`WorkQueue`] (`get`, async `get`, `done`, shutdown), the delaying and rate-limited adds,
/// and an add with a priority.
///
/// Implemented by [`RateLimitingQueue`] (either workqueue underneath), which has no priorities:
/// there an add's priority is dropped and the order is first in, first out.
pub trait ControllerQueue: WorkQueue {
    /// Adds `key` at `priority` ([`NORMAL_PRIORITY`] for a live change, [`LOW_PRIORITY`] for
    /// an initial list or a resync).
    fn add_with_priority(&self, key: Key, priority: Priority);

    /// Adds `key` once `delay` has passed (a reconcile asked to be run again later).
    fn add_after(&self, key: Key, delay: Duration);

    /// Adds `key` after the limiter's delay for it (a failed reconcile).
    fn add_rate_limited(&self, key: Key);

    /// Clears `key`'s failures in the limiter (a reconcile succeeded).
    fn forget(&self, key: &Key);

    /// How many times `key` was retried since it was last forgotten.
    fn num_requeues(&self, key: &Key) -> u64;

    /// How many keys wait for a ready time (retries and requeues that are not due yet).
    fn waiting_len(&self) -> usize;

    /// Whether the queue orders by priority (false: priorities are ignored).
    fn has_priorities(&self) -> bool;
}

impl<Q: WorkQueue + 'static, L: RateLimiter<Key>> ControllerQueue for RateLimitingQueue<Q, L> {
    fn add_with_priority(&self, key: Key, _priority: Priority) {
        // client-go's queue has one order for every key: first in, first out.
        self.add(key);
    }
    fn add_after(&self, key: Key, delay: Duration) {
        RateLimitingQueue::add_after(self, key, delay);
    }
    fn add_rate_limited(&self, key: Key) {
        RateLimitingQueue::add_rate_limited(self, key);
    }
    fn forget(&self, key: &Key) {
        RateLimitingQueue::forget(self, key);
    }
    fn num_requeues(&self, key: &Key) -> u64 {
        RateLimitingQueue::num_requeues(self, key)
    }
    fn waiting_len(&self) -> usize {
        self.delaying().waiting_len()
    }
    fn has_priorities(&self) -> bool {
        false
    }
}
