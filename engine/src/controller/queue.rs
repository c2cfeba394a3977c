//! The queue a [`Controller`](super::Controller) feeds and its workers take from: the
//! [`ControllerQueue`] contract, over which the controller runs on client-go's rate-limiting
//! queue today and on a queue with priorities where one is given.

use std::time::Duration;

use crate::key::Key;
use crate::workqueue::priority::{
    AddOpts, PriorityWorkQueue, ReferencePriorityQueue, ShardedPriorityQueue, DEFAULT_PRIORITY,
};
use crate::workqueue::{RateLimiter, RateLimitingQueue, WorkQueue};

/// The priority of an add (higher is handed out first by a queue that orders by priority; a
/// queue without priorities, [`RateLimitingQueue`], ignores it), and the low one the
/// controller gives a key that needs no work unless something else changed: an object of the
/// informer's initial list, and a resync (an update whose old and new objects have the same
/// resource version), as controller-runtime's handlers do.
pub use crate::workqueue::priority::{Priority, LOW_PRIORITY};

/// The priority of a plain add: a live change.
pub const NORMAL_PRIORITY: Priority = DEFAULT_PRIORITY;

/// What a [`Controller`](super::Controller) needs from its workqueue: client-go's
/// [`WorkQueue`] (`get`, async `get`, `done`, shutdown), the delaying and rate-limited adds,
/// and an add with a priority.
///
/// Implemented by [`RateLimitingQueue`] (either workqueue underneath), which has no priorities:
/// there an add's priority is dropped and the order is first in, first out; and by the
/// priority queues ([`ShardedPriorityQueue`], [`ReferencePriorityQueue`]), which hand live
/// changes out before low-priority keys.
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

/// The priority queues: an add's priority is kept; retries and requeues go in at the default
/// priority (controller-runtime's controller does the same).
macro_rules! priority_controller_queue {
    ($queue:ty) => {
        impl ControllerQueue for $queue {
            fn add_with_priority(&self, key: Key, priority: Priority) {
                self.add_with_opts(AddOpts::new().priority(priority), key);
            }
            fn add_after(&self, key: Key, delay: Duration) {
                PriorityWorkQueue::add_after(self, key, delay);
            }
            fn add_rate_limited(&self, key: Key) {
                PriorityWorkQueue::add_rate_limited(self, key);
            }
            fn forget(&self, key: &Key) {
                PriorityWorkQueue::forget(self, key);
            }
            fn num_requeues(&self, key: &Key) -> u64 {
                PriorityWorkQueue::num_requeues(self, key)
            }
            fn waiting_len(&self) -> usize {
                PriorityWorkQueue::waiting_len(self)
            }
            fn has_priorities(&self) -> bool {
                true
            }
        }
    };
}

priority_controller_queue!(ShardedPriorityQueue);
priority_controller_queue!(ReferencePriorityQueue);
