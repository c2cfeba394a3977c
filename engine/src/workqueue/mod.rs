//! client-go's `util/workqueue`: a deduplicating queue of items with delayed and rate-limited
//! adds, every time-dependent part reading one injectable [`Clock`].
//!
//! # Time
//!
//! One model, [`std::time::Duration`]-based: every delay is a `Duration` (`add_after`, a
//! [`RateLimiter`]'s `when`, [`FakeClock::step`]), a [`Time`] is a point on the clock's line
//! (the `Duration` since its origin), arithmetic saturates at [`Time::MAX`], and [`NEVER`] is
//! the delay of an item that never becomes ready. Go's `time.Duration` may be negative, which
//! client-go treats as "now"; here "now" is a delay of zero. The limiters keep client-go's
//! arithmetic on nanoseconds exactly (the differential and trace tests pin it).
//!
//! The workqueue reads its injectable [`Clock`] ([`RealClock`], or a [`FakeClock`] in tests
//! and trace replays); the informer uses tokio's clock instead, paused in its tests.
//!
//! Two queues implement [`WorkQueue`]:
//!
//! - [`ReferenceQueue`]: client-go's `Type` ported faithfully (one mutex, one condition
//!   variable), quirks included; the yardstick.
//! - [`ShardedQueue`]: the same per-item rules with no global lock on `add`, `get` or `done`,
//!   for many workers; with one shard it matches the reference line for line.
//!
//! [`priority`] holds controller-runtime's priority queues, whose adds carry a priority (so
//! live changes go before the keys of an initial list or resync), a delay and a rate limit in
//! one call: a faithful port and a sharded one, both [`WorkQueue`]s too.
//!
//! Layers work over either: [`DelayingQueue`] (`add_after`, one timer thread for every waiting
//! item) and [`RateLimitingQueue`] (`add_rate_limited`, `forget`, `num_requeues`, with the
//! [`RateLimiter`]s). Workers `get` with a blocking call on threads or with
//! [`get_async`](AsyncGet::get_async) on any async runtime (the wake-ups are std `Waker`s).
//!
//! # A controller loop
//!
//! `kcache::controller` (feature `informer`) packages this loop with an informer, retries,
//! requeues, metrics and shutdown; by hand, on the queue alone, it is this. An event handler adds the key of every object that changed; workers take keys, reconcile,
//! and on failure put the key back rate limited; on success they `forget` its failures. A key
//! added while a worker holds it is handed out again once that worker is done, never to two
//! workers at once.
//!
//! ```
//! use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
//! use std::thread;
//! use kcache::Key;
//! use kcache::workqueue::{
//!     default_controller_rate_limiter, DelayingQueue, QueueConfig, RateLimitingQueue,
//!     ShardedQueue, WorkQueue,
//! };
//!
//! let config = QueueConfig::new().name("pods");
//! let queue = Arc::new(RateLimitingQueue::new(
//!     DelayingQueue::with_config(ShardedQueue::with_config(4, &config), &config),
//!     default_controller_rate_limiter(),
//! ));
//! let reconciled = Arc::new(AtomicUsize::new(0));
//! let workers: Vec<_> = (0..2)
//!     .map(|_| {
//!         let (queue, reconciled) = (queue.clone(), reconciled.clone());
//!         thread::spawn(move || {
//!             while let Ok(key) = queue.get() {
//!                 // Reconcile `key`: read the object from the informer's indexer, act on it.
//!                 // The first attempt at "ns/flaky" fails and is retried after a backoff.
//!                 let failed = key.as_str() == "ns/flaky" && queue.num_requeues(&key) == 0;
//!                 if failed {
//!                     queue.add_rate_limited(key.clone());
//!                 } else {
//!                     queue.forget(&key);
//!                     reconciled.fetch_add(1, Ordering::SeqCst);
//!                 }
//!                 queue.done(&key).unwrap();
//!             }
//!         })
//!     })
//!     .collect();
//! // The event handler: every change enqueues the object's key.
//! for name in ["ns/a", "ns/b", "ns/flaky", "ns/a"] {
//!     queue.add(Key::new(name));
//! }
//! while reconciled.load(Ordering::SeqCst) < 3 {
//!     thread::sleep(std::time::Duration::from_millis(1));
//! }
//! queue.shut_down_with_drain();
//! for worker in workers {
//!     worker.join().unwrap();
//! }
//! assert!(reconciled.load(Ordering::SeqCst) >= 3);
//! ```

mod clock;
mod delaying;
mod limiter;
mod metrics;
pub mod priority;
#[cfg(feature = "prometheus")]
pub(crate) mod prometheus;
mod queue;
mod rate_limiting;
mod ready;
mod reference;
mod sharded;
mod waiters;

/// A waker that counts its wake-ups, for the unit tests of the waiting lists (`ready`,
/// `waiters`).
#[cfg(all(test, not(kcache_loom)))]
struct CountingWaker(std::sync::atomic::AtomicUsize);

#[cfg(all(test, not(kcache_loom)))]
impl std::task::Wake for CountingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

pub use clock::{Clock, ClockError, FakeClock, RealClock, Subscription, Time};
pub use delaying::DelayingQueue;
pub use limiter::{
    default_controller_rate_limiter, BucketRateLimiter, ExponentialFailureRateLimiter,
    FastSlowRateLimiter, MaxOfRateLimiter, RateLimiter, NEVER,
};
pub use metrics::{
    CounterMetric, DepthWithPriorityMetric, GaugeMetric, HistogramMetric, MetricsProvider,
    NoopMetricsProvider, QueueConfig, SettableGaugeMetric,
};
#[cfg(feature = "prometheus")]
pub use prometheus::PrometheusMetrics;
pub use queue::{AsyncGet, Get, NotProcessing, ShutDown, TryGet, WaitSlot, WorkQueue};
pub use rate_limiting::RateLimitingQueue;
pub use reference::ReferenceQueue;
pub use sharded::{ShardedQueue, DEFAULT_WORKQUEUE_SHARDS};
