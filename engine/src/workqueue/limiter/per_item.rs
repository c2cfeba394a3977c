//! The per-item limiters: exponential backoff and fast-then-slow, both counting calls per item.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::time::Duration;

use crate::sync::{lock, Mutex};
use crate::workqueue::clock::Time;

use super::{RateLimiter, TWO_POW_63};

/// Per-item counters; ahash because a workqueue item's hash is the hot part of every call.
type Counts<T> = HashMap<T, u64, ahash::RandomState>;

/// Adds one to `item`'s count and returns the count from before, cloning `item` only the first
/// time it is counted. The count saturates (2^64 calls are out of reach anyway).
fn count_up<T: Hash + Eq + Clone>(counts: &Mutex<Counts<T>>, item: &T) -> u64 {
    let mut counts = lock(counts);
    match counts.get_mut(item) {
        Some(count) => {
            let before = *count;
            *count = before.saturating_add(1);
            before
        }
        None => {
            counts.insert(item.clone(), 1);
            0
        }
    }
}

/// `base · 2^exp`, capped at `max`, exactly as client-go computes it in nanoseconds.
///
/// The product is taken in `f64` (one rounding, `+∞` once it overflows). Above 2^63 ns the
/// result is `max`. At exactly 2^63 (a power-of-two base) and at NaN (base 0 times `+∞`) Go's
/// conversion to `Duration` yields `i64::MIN` on amd64, so client-go returns a negative delay;
/// this port returns `max` there, as the contract allows, since a negative delay is a bug of the
/// conversion, not a backoff.
fn exponential_backoff(base: Duration, max: Duration, exp: u64) -> Duration {
    // Go's float64(base), from its int64 nanoseconds.
    let backoff = base.as_nanos() as f64 * pow2(exp);
    // Go's `> 2^63`, plus the two cases chosen above: exactly 2^63, and NaN.
    if backoff >= TWO_POW_63 || backoff.is_nan() {
        return max;
    }
    // In range: truncation, as Go's conversion.
    Duration::from_nanos(backoff as u64).min(max)
}

/// 2^exp as an `f64`, exactly (Go's `math.Pow(2, float64(exp))` is exact for integers too);
/// `+∞` from 2^1024 on.
fn pow2(exp: u64) -> f64 {
    if exp > 1023 {
        f64::INFINITY
    } else {
        // A normal f64 with a zero mantissa: sign 0, biased exponent exp + 1023.
        f64::from_bits((exp + 1023) << 52)
    }
}

/// Waits `base · 2^failures`, capped at `max` (client-go's
/// `ItemExponentialFailureRateLimiter`). Counts every [`when`](RateLimiter::when) per item.
///
/// ```
/// use std::time::Duration;
/// use kcache::workqueue::{ExponentialFailureRateLimiter, RateLimiter, Time};
/// let ms = Duration::from_millis;
/// let limiter = ExponentialFailureRateLimiter::new(ms(5), ms(20));
/// let delays: Vec<Duration> = (0..4).map(|_| limiter.when(&"a", Time::ZERO)).collect();
/// assert_eq!(delays, [ms(5), ms(10), ms(20), ms(20)]);
/// assert_eq!(limiter.num_requeues(&"a"), 4);
/// limiter.forget(&"a");
/// assert_eq!(limiter.when(&"a", Time::ZERO), ms(5));
/// ```
pub struct ExponentialFailureRateLimiter<T> {
    base: Duration,
    max: Duration,
    /// Calls of `when` per item since its last `forget`; absent means 0.
    failures: Mutex<Counts<T>>,
}

impl<T> ExponentialFailureRateLimiter<T> {
    /// A limiter that waits `base · 2^failures`, at most `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        ExponentialFailureRateLimiter {
            base,
            max,
            failures: Mutex::new(Counts::default()),
        }
    }
}

impl<T> fmt::Debug for ExponentialFailureRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExponentialFailureRateLimiter")
            .field("base", &self.base)
            .field("max", &self.max)
            .field("items", &lock(&self.failures).len())
            .finish()
    }
}

impl<T: Hash + Eq + Clone + Send + Sync> RateLimiter<T> for ExponentialFailureRateLimiter<T> {
    fn when(&self, item: &T, _now: Time) -> Duration {
        let exp = count_up(&self.failures, item);
        exponential_backoff(self.base, self.max, exp)
    }

    fn forget(&self, item: &T) {
        lock(&self.failures).remove(item);
    }

    fn num_requeues(&self, item: &T) -> u64 {
        lock(&self.failures).get(item).copied().unwrap_or(0)
    }
}

/// Waits `fast` for an item's first `max_fast_attempts` calls, then `slow` (client-go's
/// `ItemFastSlowRateLimiter`).
///
/// ```
/// use std::time::Duration;
/// use kcache::workqueue::{FastSlowRateLimiter, RateLimiter, Time};
/// let ms = Duration::from_millis;
/// let limiter = FastSlowRateLimiter::new(ms(1), ms(60), 2);
/// let delays: Vec<Duration> = (0..3).map(|_| limiter.when(&"a", Time::ZERO)).collect();
/// assert_eq!(delays, [ms(1), ms(1), ms(60)]);
/// assert_eq!(limiter.num_requeues(&"a"), 3);
/// ```
pub struct FastSlowRateLimiter<T> {
    fast: Duration,
    slow: Duration,
    max_fast_attempts: i64,
    /// Calls of `when` per item since its last `forget`; absent means 0.
    attempts: Mutex<Counts<T>>,
}

impl<T> FastSlowRateLimiter<T> {
    /// A limiter that waits `fast` for an item's first `max_fast_attempts` calls, `slow` from
    /// then on (Go's `int`: 0 or negative means always `slow`).
    pub fn new(fast: Duration, slow: Duration, max_fast_attempts: i64) -> Self {
        FastSlowRateLimiter {
            fast,
            slow,
            max_fast_attempts,
            attempts: Mutex::new(Counts::default()),
        }
    }
}

impl<T> fmt::Debug for FastSlowRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastSlowRateLimiter")
            .field("fast", &self.fast)
            .field("slow", &self.slow)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .field("items", &lock(&self.attempts).len())
            .finish()
    }
}

impl<T: Hash + Eq + Clone + Send + Sync> RateLimiter<T> for FastSlowRateLimiter<T> {
    fn when(&self, item: &T, _now: Time) -> Duration {
        // Go increments first, then compares: the attempt being made is number `before + 1`.
        let attempt = count_up(&self.attempts, item).saturating_add(1);
        // A negative maximum admits no fast attempt (try_from fails), as Go's int comparison.
        if u64::try_from(self.max_fast_attempts).is_ok_and(|max| attempt <= max) {
            self.fast
        } else {
            self.slow
        }
    }

    fn forget(&self, item: &T) {
        lock(&self.attempts).remove(item);
    }

    fn num_requeues(&self, item: &T) -> u64 {
        lock(&self.attempts).get(item).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{ns, whens, MS};
    use super::*;

    /// Go's largest `Duration`, i64::MAX nanoseconds.
    const GO_MAX: Duration = Duration::from_nanos(i64::MAX as u64);

    #[test]
    fn exponential_doubles_then_caps_at_max() {
        let limiter = ExponentialFailureRateLimiter::new(5 * MS, 1_000_000 * MS);
        let delays = whens(&limiter, "a", 20);
        // 5 ms · 2^e while below 1000 s: e = 17 gives 655.36 s, e = 18 would be 1310.72 s.
        let mut expected: Vec<Duration> = (0..18).map(|e| (5 * MS) * (1 << e)).collect();
        assert_eq!(expected[17], ns(655_360_000_000));
        expected.extend([ns(1_000_000_000_000), ns(1_000_000_000_000)]);
        assert_eq!(delays, expected);
        assert_eq!(limiter.num_requeues(&"a"), 20);
    }

    #[test]
    fn exponential_counts_items_separately_and_forget_resets_one() {
        let limiter = ExponentialFailureRateLimiter::new(MS, 1_000 * MS);
        assert_eq!(whens(&limiter, "a", 3), [MS, 2 * MS, 4 * MS]);
        assert_eq!(whens(&limiter, "b", 1), [MS]);
        assert_eq!(
            (limiter.num_requeues(&"a"), limiter.num_requeues(&"b")),
            (3, 1)
        );
        limiter.forget(&"a");
        limiter.forget(&"never-seen");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(
            limiter.num_requeues(&"b"),
            1,
            "forget touches one item only"
        );
        assert_eq!(whens(&limiter, "a", 1), [MS]);
        assert_eq!(whens(&limiter, "b", 1), [2 * MS]);
    }

    #[test]
    fn exponential_overflow_edges_with_a_power_of_two_base() {
        // base 1 ns: 2^62 is exact; 2^63 exactly is where client-go's conversion gives i64::MIN
        // (this port: max); 2^64 is above 2^63, so max in client-go too.
        let limiter = ExponentialFailureRateLimiter::new(ns(1), GO_MAX);
        let delays = whens(&limiter, "a", 65);
        assert_eq!(delays[62], ns(4_611_686_018_427_387_904));
        assert_eq!(delays[63], GO_MAX);
        assert_eq!(delays[64], GO_MAX);
        let capped = ExponentialFailureRateLimiter::new(ns(1), ns(1_000));
        assert_eq!(
            whens(&capped, "a", 64)[63],
            ns(1_000),
            "exactly 2^63 returns max"
        );
    }

    #[test]
    fn exponential_above_two_pow_63_returns_max_even_below_the_cap_arithmetic() {
        // 3 · 2^61 = 6_917_529_027_641_081_856 fits; 3 · 2^62 is above 2^63.
        let limiter = ExponentialFailureRateLimiter::new(ns(3), GO_MAX);
        let delays = whens(&limiter, "a", 63);
        assert_eq!(delays[61], ns(6_917_529_027_641_081_856));
        assert_eq!(delays[62], GO_MAX);
        let capped = ExponentialFailureRateLimiter::new(ns(3), ns(77));
        assert_eq!(whens(&capped, "a", 63)[62], ns(77));
    }

    #[test]
    fn exponential_computes_in_f64() {
        // 2^53 + 1 is not an f64: Go's float64(base) rounds it to 2^53, and so does this port.
        let limiter = ExponentialFailureRateLimiter::new(ns(9_007_199_254_740_993), GO_MAX);
        assert_eq!(
            whens(&limiter, "a", 2),
            [ns(9_007_199_254_740_992), ns(18_014_398_509_481_984)]
        );
    }

    #[test]
    fn exponential_with_base_zero_turns_nan_into_max() {
        // 0 · 2^e is 0 up to e = 1023; at e = 1024, 0 · +∞ is NaN: max here (client-go: i64::MIN).
        let limiter = ExponentialFailureRateLimiter::new(Duration::ZERO, ns(7));
        let delays = whens(&limiter, "a", 1026);
        assert!(delays[..1024].iter().all(|d| d.is_zero()));
        assert_eq!(&delays[1024..], [ns(7), ns(7)]);
    }

    #[test]
    fn exponential_max_below_base() {
        let limiter = ExponentialFailureRateLimiter::new(ns(10), ns(3));
        assert_eq!(whens(&limiter, "a", 3), [ns(3), ns(3), ns(3)]);
    }

    #[test]
    fn fast_slow_switches_after_max_fast_attempts() {
        let limiter = FastSlowRateLimiter::new(5 * MS, 10_000 * MS, 3);
        assert_eq!(
            whens(&limiter, "a", 5),
            [5 * MS, 5 * MS, 5 * MS, 10_000 * MS, 10_000 * MS]
        );
        assert_eq!(whens(&limiter, "b", 1), [5 * MS], "attempts are per item");
        assert_eq!(limiter.num_requeues(&"a"), 5);
        limiter.forget(&"a");
        assert_eq!(limiter.num_requeues(&"a"), 0);
        assert_eq!(whens(&limiter, "a", 1), [5 * MS]);
    }

    #[test]
    fn fast_slow_with_no_fast_attempts_is_always_slow() {
        for max_fast in [0, -1, i64::MIN] {
            let limiter = FastSlowRateLimiter::new(ns(1), ns(2), max_fast);
            assert_eq!(
                whens(&limiter, "a", 2),
                [ns(2), ns(2)],
                "max_fast {max_fast}"
            );
            assert_eq!(limiter.num_requeues(&"a"), 2);
        }
    }
}
