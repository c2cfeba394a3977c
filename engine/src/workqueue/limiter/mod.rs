//! Rate limiters: how long an item waits before it is queued again (client-go's
//! `util/workqueue/default_rate_limiters.go`, with golang.org/x/time/rate's token bucket).
//!
//! Delays are [`Duration`]s computed with Go's integer and `f64` arithmetic on nanoseconds, so
//! that every result matches client-go's to the nanosecond. [`NEVER`] means "never" (a token
//! bucket that can't ever grant the token, where x/time/rate says `InfDuration`).
//!
//! Go's `time.Duration` can be negative and client-go's limiters pass a negative configured
//! delay through (a negative base or fast delay), which its delaying queue treats as "now".
//! There is no negative `Duration`: here a delay of zero is "now", and the limiters are
//! configured with non-negative delays only.
//!
//! A limiter reads no clock of its own: [`RateLimiter::when`] is handed the queue's time, so a
//! queue on a [`FakeClock`](super::FakeClock) makes the token bucket deterministic too.

use std::fmt;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use super::clock::Time;

mod bucket;
mod per_item;

pub use bucket::BucketRateLimiter;
pub use per_item::{ExponentialFailureRateLimiter, FastSlowRateLimiter};

/// 2^63, the smallest `f64` above `i64::MAX` (`float64(math.MaxInt64)` in Go).
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// "Never": the delay of a token that will never exist (x/time/rate's `InfDuration`, which
/// is `i64::MAX` nanoseconds in Go). An item added with it is never ready: the delaying
/// layer's ready time saturates at [`Time::MAX`].
pub const NEVER: Duration = Duration::MAX;

/// Decides how long an item waits before it is added again (client-go's
/// `workqueue.TypedRateLimiter`).
///
/// Implementations lock their own state: every method may be called from many threads at once.
pub trait RateLimiter<T: ?Sized>: Send + Sync + fmt::Debug {
    /// How long `item` should wait, asked at time `now`; counts the call as one more failure
    /// (attempt) of `item` where the limiter counts them. May be [`NEVER`]; zero means "at
    /// once".
    fn when(&self, item: &T, now: Time) -> Duration;

    /// Forgets `item`'s failures: its next [`when`](RateLimiter::when) starts afresh. Limiters
    /// that keep no per-item state do nothing.
    fn forget(&self, item: &T);

    /// How many times `item` has been counted since it was last forgotten (0 for limiters that
    /// keep no per-item count). Go's `int`; here `u64`, never negative.
    fn num_requeues(&self, item: &T) -> u64;
}

/// Forwards every method, so a boxed or shared limiter (`Box<dyn RateLimiter<Key>>`,
/// `Arc<L>`) is a limiter too.
macro_rules! forward_rate_limiter {
    ($pointer:ident) => {
        impl<T: ?Sized, L: RateLimiter<T> + ?Sized> RateLimiter<T> for $pointer<L> {
            fn when(&self, item: &T, now: Time) -> Duration {
                (**self).when(item, now)
            }
            fn forget(&self, item: &T) {
                (**self).forget(item)
            }
            fn num_requeues(&self, item: &T) -> u64 {
                (**self).num_requeues(item)
            }
        }
    };
}

forward_rate_limiter!(Box);
forward_rate_limiter!(Arc);
/// Asks every limiter and waits the longest (client-go's `MaxOfRateLimiter`).
///
/// ```
/// use std::time::Duration;
/// use kcache::workqueue::{default_controller_rate_limiter, RateLimiter, Time};
/// let limiter = default_controller_rate_limiter::<&str>();
/// assert_eq!(limiter.when(&"a", Time::ZERO), Duration::from_millis(5));
/// assert_eq!(limiter.when(&"a", Time::ZERO), Duration::from_millis(10));
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
    /// Every limiter's `when`, in order; the largest (zero with none).
    fn when(&self, item: &T, now: Time) -> Duration {
        self.limiters
            .iter()
            .map(|limiter| limiter.when(item, now))
            .fold(Duration::ZERO, Duration::max)
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
            Duration::from_millis(5),
            Duration::from_secs(1_000),
        )),
        Box::new(BucketRateLimiter::new(10.0, 100)),
    ])
}
#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const MS: Duration = Duration::from_millis(1);
    pub(super) const T0: Time = Time::ZERO;

    pub(super) fn at_ms(ms: u64) -> Time {
        Time::after_origin(Duration::from_millis(ms))
    }

    pub(super) fn ns(nanos: u64) -> Duration {
        Duration::from_nanos(nanos)
    }

    /// `n` calls of `when(item, now)`.
    pub(super) fn whens<L: RateLimiter<&'static str>>(
        limiter: &L,
        item: &'static str,
        n: usize,
    ) -> Vec<Duration> {
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

        let empty = MaxOfRateLimiter::<&str>::new(Vec::new());
        assert_eq!(
            (empty.when(&"a", T0), empty.num_requeues(&"a")),
            (Duration::ZERO, 0)
        );
    }

    #[test]
    fn max_of_num_requeues_is_the_largest_count() {
        let exponential = Arc::new(ExponentialFailureRateLimiter::new(ns(1), ns(1)));
        let fast_slow = Arc::new(FastSlowRateLimiter::new(ns(1), ns(1), 1));
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
