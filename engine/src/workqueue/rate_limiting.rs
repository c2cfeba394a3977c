//! The rate-limiting layer (client-go `rate_limiting_queue.go`): `add_rate_limited`,
//! `forget` and `num_requeues` over a [`DelayingQueue`].

use std::fmt;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::key::Key;

use super::delaying::DelayingQueue;
use super::limiter::RateLimiter;
use super::queue::{NotProcessing, ShutDown, TryGet, WaitSlot, WorkQueue};

/// client-go's rate-limiting queue: a [`DelayingQueue`] whose retries wait as long as a
/// [`RateLimiter`] says.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use kcache::Key;
/// use kcache::workqueue::{
///     DelayingQueue, ExponentialFailureRateLimiter, FakeClock, QueueConfig, RateLimitingQueue,
///     ShardedQueue, TryGet, WorkQueue,
/// };
///
/// let clock = Arc::new(FakeClock::new());
/// let config = QueueConfig::new().clock(clock.clone());
/// let q = RateLimitingQueue::new(
///     DelayingQueue::with_config(ShardedQueue::with_config(1, &config), &config),
///     ExponentialFailureRateLimiter::new(Duration::from_millis(1), Duration::from_secs(1)),
/// );
/// let key = Key::new("ns/a");
/// q.add_rate_limited(key.clone()); // waits 1 ms
/// q.add_rate_limited(key.clone()); // would wait 2 ms: the earlier ready time wins
/// assert_eq!(q.num_requeues(&key), 2);
/// clock.step(Duration::from_millis(1));
/// assert_eq!(q.try_get(), TryGet::Item(key.clone()));
/// q.forget(&key);
/// assert_eq!(q.num_requeues(&key), 0);
/// ```
pub struct RateLimitingQueue<Q: WorkQueue + 'static, L = Box<dyn RateLimiter<Key>>> {
    queue: DelayingQueue<Q>,
    limiter: L,
}

impl<Q: WorkQueue + 'static, L: RateLimiter<Key>> RateLimitingQueue<Q, L> {
    /// A rate-limiting queue over `queue` asking `limiter`. The limiter is handed the time of
    /// `queue`'s clock.
    pub fn new(queue: DelayingQueue<Q>, limiter: L) -> Self {
        Self { queue, limiter }
    }

    /// Adds `item` after the limiter's delay for it (client-go `AddRateLimited`). The limiter
    /// is asked first and always, also after shutdown, so it counts the call either way.
    pub fn add_rate_limited(&self, item: Key) {
        let delay = self.when(&item);
        self.queue.add_after(item, delay);
    }

    /// Forgets `item`'s failures (client-go `Forget`): call it when the item succeeded.
    pub fn forget(&self, item: &Key) {
        self.limiter.forget(item);
    }

    /// How many times `item` was rate limited since it was last forgotten.
    pub fn num_requeues(&self, item: &Key) -> u64 {
        self.limiter.num_requeues(item)
    }

    /// Asks the limiter directly (counts as a failure where the limiter counts them), at the
    /// queue clock's current time.
    pub fn when(&self, item: &Key) -> Duration {
        self.limiter.when(item, self.queue.clock().now())
    }

    /// [`DelayingQueue::add_after`].
    pub fn add_after(&self, item: Key, delay: Duration) {
        self.queue.add_after(item, delay);
    }

    /// The delaying queue underneath.
    pub fn delaying(&self) -> &DelayingQueue<Q> {
        &self.queue
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<Q: WorkQueue + 'static, L: RateLimiter<Key>> WorkQueue for RateLimitingQueue<Q, L> {
    fn add(&self, item: Key) {
        self.queue.add(item);
    }
    fn get(&self) -> Result<Key, ShutDown> {
        self.queue.get()
    }
    fn try_get(&self) -> TryGet {
        self.queue.try_get()
    }
    fn poll_get(&self, slot: &mut WaitSlot, cx: &mut Context<'_>) -> Poll<Result<Key, ShutDown>> {
        self.queue.poll_get(slot, cx)
    }
    fn cancel_get(&self, slot: &mut WaitSlot) {
        self.queue.cancel_get(slot);
    }
    fn done(&self, item: &Key) -> Result<(), NotProcessing> {
        self.queue.done(item)
    }
    fn len(&self) -> usize {
        self.queue.len()
    }
    fn processing_len(&self) -> usize {
        self.queue.processing_len()
    }
    fn shut_down(&self) {
        self.queue.shut_down();
    }
    fn shut_down_with_drain(&self) {
        self.queue.shut_down_with_drain();
    }
    fn shutting_down(&self) -> bool {
        self.queue.shutting_down()
    }
    fn update_unfinished_work(&self) {
        self.queue.update_unfinished_work();
    }
}

impl<Q: WorkQueue + fmt::Debug + 'static, L: fmt::Debug> fmt::Debug for RateLimitingQueue<Q, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitingQueue")
            .field("queue", &self.queue)
            .field("limiter", &self.limiter)
            .finish()
    }
}
