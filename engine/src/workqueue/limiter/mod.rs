//! Rate limiters: how long an item waits before it is queued again (client-go's
//! `util/workqueue/default_rate_limiters.go`, with golang.org/x/time/rate's token bucket).
//!
//! Durations are Go `time.Duration`s: `i64` nanoseconds, computed with Go's integer and `f64`
//! arithmetic so that every result matches client-go's to the nanosecond. `i64::MAX` means
//! "never" (a token bucket that can't ever grant the token).
//!
//! A limiter reads no clock of its own: [`RateLimiter::when`] is handed the queue's time, so a
//! queue on a [`FakeClock`](super::FakeClock) makes the token bucket deterministic too.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use super::clock::Time;

mod bucket;
mod per_item;

pub use bucket::BucketRateLimiter;
pub use per_item::{ExponentialFailureRateLimiter, FastSlowRateLimiter};

/// 2^63, the smallest `f64` above `i64::MAX` (`float64(math.MaxInt64)` in Go).
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// Nanoseconds per second, as Go's `time.Second`.
const SECOND: i64 = 1_000_000_000;

/// Decides how long an item waits before it is added again (client-go's
/// `workqueue.TypedRateLimiter`).
///
/// Implementations lock their own state: every method may be called from many threads at once.
pub trait RateLimiter<T: ?Sized>: Send + Sync + fmt::Debug {
    /// The nanoseconds `item` should wait, asked at time `now`; counts the call as one more
    /// failure (attempt) of `item` where the limiter counts them. May be `i64::MAX` (never)
    /// and, for limiters configured with negative delays, negative (meaning "at once").
    fn when(&self, item: &T, now: Time) -> i64;

    /// Forgets `item`'s failures: its next [`when`](RateLimiter::when) starts afresh. Limiters
    /// that keep no per-item state do nothing.
    fn forget(&self, item: &T);

    /// How many times `item` has been counted since it was last forgotten (0 for limiters that
    /// keep no per-item count). Go's `int`; here `u64`, never negative.
    fn num_requeues(&self, item: &T) -> u64;
}

impl<T: ?Sized, L: RateLimiter<T> + ?Sized> RateLimiter<T> for Box<L> {
    fn when(&self, item: &T, now: Time) -> i64 {
        (**self).when(item, now)
    }
    fn forget(&self, item: &T) {
        (**self).forget(item)
    }
    fn num_requeues(&self, item: &T) -> u64 {
        (**self).num_requeues(item)
    }
}

impl<T: ?Sized, L: RateLimiter<T> + ?Sized> RateLimiter<T> for Arc<L> {
    fn when(&self, item: &T, now: Time) -> i64 {
        (**self).when(item, now)
    }
    fn forget(&self, item: &T) {
        (**self).forget(item)
    }
    fn num_requeues(&self, item: &T) -> u64 {
        (**self).num_requeues(item)
    }
}
/// Asks every limiter and waits the longest (client-go's `MaxOfRateLimiter`).
///
/// ```
/// use kcache::workqueue::{default_controller_rate_limiter, RateLimiter, Time};
/// let limiter = default_controller_rate_limiter::<&str>();
/// assert_eq!(limiter.when(&"a", Time::ZERO), 5_000_000);
/// assert_eq!(limiter.when(&"a", Time::ZERO), 10_000_000);
/// assert_eq!(limiter.num_requeues(&"a"), 2);
/// ```
pub struct MaxOfRateLimiter<T: ?Sized> {
    limiters: Vec<Box<dyn RateLimiter<T>>>,
}

impl<T: ?Sized> fmt::Debug for MaxOfRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MaxOfRateLimiter")
            .field("limiters", &self.limiters)
            .finish()
    }
}

impl<T: ?Sized> MaxOfRateLimiter<T> {
    /// A limiter over `limiters`, asked in this order (it matters only for their side effects:
    /// every one is asked on every call).
    pub fn new(limiters: Vec<Box<dyn RateLimiter<T>>>) -> Self {
        MaxOfRateLimiter { limiters }
    }
}

impl<T: ?Sized> RateLimiter<T> for MaxOfRateLimiter<T> {
    /// Every limiter's `when`, in order; the largest, but at least 0.
    fn when(&self, item: &T, now: Time) -> i64 {
        self.limiters
            .iter()
            .map(|limiter| limiter.when(item, now))
            .fold(0, i64::max)
    }

    /// Tells every limiter.
    fn forget(&self, item: &T) {
        for limiter in &self.limiters {
            limiter.forget(item);
        }
    }

    /// The largest of the limiters' counts (0 with none).
    fn num_requeues(&self, item: &T) -> u64 {
        self.limiters
            .iter()
            .map(|limiter| limiter.num_requeues(item))
            .fold(0, u64::max)
    }
}

/// client-go's `DefaultControllerRateLimiter`: per-item exponential backoff from 5 ms to
/// 1000 s, and an overall token bucket of 10 qps with a burst of 100 — whichever waits longer.
pub fn default_controller_rate_limiter<T>() -> MaxOfRateLimiter<T>
where
    T: Hash + Eq + Clone + Send + Sync + 'static,
{
    MaxOfRateLimiter::new(vec![
        Box::new(ExponentialFailureRateLimiter::new(
            5_000_000,
            1_000 * SECOND,
        )),
        Box::new(BucketRateLimiter::new(10.0, 100)),
    ])
}
#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const MS: i64 = 1_000_000;
    pub(super) const T0: Time = Time::ZERO;

    pub(super) fn at_ms(ms: i64) -> Time {
        Time::from_nanos(ms * MS)
    }

    /// `n` calls of `when(item, now)`.
    pub(super) fn whens<L: RateLimiter<&'static str>>(
        limiter: &L,
        item: &'static str,
        n: usize,
    ) -> Vec<i64> {
        (0..n).map(|_| limiter.when(&item, T0)).collect()
    }

    #[test]
    fn max_of_takes_the_largest_but_at_least_zero() {
        let limiter = MaxOfRateLimiter::<&str>::new(vec![
            Box::new(ExponentialFailureRateLimiter::new(MS, 1_000 * MS)),
            Box::new(FastSlowRateLimiter::new(3 * MS, 100 * MS, 2)),
        ]);
        // exponential 1, 2, 4 ms; fast_slow 3, 3, 100 ms.
        assert_eq!(whens(&limiter, "a", 3), [3 * MS, 3 * MS, 100 * MS]);
        assert_eq!(limiter.num_requeues(&"a"), 3);
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0, "forget tells every limiter");
        assert_eq!(whens(&limiter, "a", 1), [3 * MS]);

        let negative = MaxOfRateLimiter::<&str>::new(vec![Box::new(
            ExponentialFailureRateLimiter::new(-5, 100),
        )]);
        assert_eq!(whens(&negative, "a", 1), [0]);
        let empty = MaxOfRateLimiter::<&str>::new(Vec::new());
        assert_eq!((empty.when(&"a", T0), empty.num_requeues(&"a")), (0, 0));
    }

    #[test]
    fn max_of_num_requeues_is_the_largest_count() {
        let exponential = Arc::new(ExponentialFailureRateLimiter::new(1, 1));
        let fast_slow = Arc::new(FastSlowRateLimiter::new(1, 1, 1));
        let limiter = MaxOfRateLimiter::<&str>::new(vec![
            Box::new(exponential.clone()),
            Box::new(fast_slow.clone()),
        ]);
        fast_slow.when(&"a", T0);
        fast_slow.when(&"a", T0);
        exponential.when(&"a", T0);
        assert_eq!(limiter.num_requeues(&"a"), 2);
    }

    #[test]
    fn default_limiter_exponential_per_item_then_the_bucket() {
        let limiter = default_controller_rate_limiter::<String>();
        let item = |i: usize| format!("item-{i}");
        // 100 distinct items at one instant: each is at its first failure (5 ms) and the
        // bucket's burst covers them.
        for i in 0..100 {
            assert_eq!(limiter.when(&item(i), T0), 5 * MS, "item {i}");
        }
        // The 101st waits for the bucket: 100 ms, then 200 ms.
        assert_eq!(limiter.when(&item(100), T0), 100 * MS);
        assert_eq!(limiter.when(&item(101), T0), 200 * MS);
        // item-0's second failure: 10 ms, but the bucket now says 300 ms.
        assert_eq!(limiter.when(&item(0), T0), 300 * MS);
        assert_eq!(limiter.num_requeues(&item(0)), 2);
        // 10 s later the bucket has refilled 100 tokens from −3 (capped at 100).
        assert_eq!(limiter.when(&item(0), at_ms(10_000)), 20 * MS);
    }
}
