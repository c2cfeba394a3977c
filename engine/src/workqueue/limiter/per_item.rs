//! The per-item limiters: exponential backoff and fast-then-slow, both counting calls per item.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

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

/// `base · 2^exp` nanoseconds, capped at `max`, exactly as client-go computes it.
///
/// The product is taken in `f64` (one rounding, `+∞` once it overflows). Above 2^63 the result
/// is `max`. At exactly 2^63 (a power-of-two base) and at NaN (base 0 times `+∞`) Go's
/// conversion to `Duration` yields `i64::MIN` on amd64, so client-go returns a negative delay;
/// this port returns `max` there, as the contract allows, since a negative delay is a bug of the
/// conversion, not a backoff. A negative `base` gives negative delays (down to `i64::MIN`, as
/// Go's conversion of `-∞` on amd64), and `min` with `max` keeps them.
fn exponential_backoff(base: i64, max: i64, exp: u64) -> i64 {
    let backoff = base as f64 * pow2(exp);
    // Go's `> 2^63`, plus the two cases chosen above: exactly 2^63, and NaN.
    if backoff >= TWO_POW_63 || backoff.is_nan() {
        return max;
    }
    // In range (or negative, saturating at i64::MIN like amd64's conversion): truncation.
    (backoff as i64).min(max)
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

/// Waits `base · 2^failures` nanoseconds, capped at `max` (client-go's
/// `ItemExponentialFailureRateLimiter`). Counts every [`when`](RateLimiter::when) per item.
///
/// ```
/// use kcache::workqueue::{ExponentialFailureRateLimiter, RateLimiter, Time};
/// let limiter = ExponentialFailureRateLimiter::new(5_000_000, 20_000_000);
/// let delays: Vec<i64> = (0..4).map(|_| limiter.when(&"a", Time::ZERO)).collect();
/// assert_eq!(delays, [5_000_000, 10_000_000, 20_000_000, 20_000_000]);
/// assert_eq!(limiter.num_requeues(&"a"), 4);
/// limiter.forget(&"a");
/// assert_eq!(limiter.when(&"a", Time::ZERO), 5_000_000);
/// ```
pub struct ExponentialFailureRateLimiter<T> {
    base: i64,
    max: i64,
    /// Calls of `when` per item since its last `forget`; absent means 0.
    failures: Mutex<Counts<T>>,
}

impl<T> ExponentialFailureRateLimiter<T> {
    /// A limiter that waits `base_ns · 2^failures` nanoseconds, at most `max_ns`.
    pub fn new(base_ns: i64, max_ns: i64) -> Self {
        ExponentialFailureRateLimiter {
            base: base_ns,
            max: max_ns,
            failures: Mutex::new(Counts::default()),
        }
    }
}

impl<T> fmt::Debug for ExponentialFailureRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExponentialFailureRateLimiter")
            .field("base_ns", &self.base)
            .field("max_ns", &self.max)
            .field("items", &lock(&self.failures).len())
            .finish()
    }
}

impl<T: Hash + Eq + Clone + Send + Sync> RateLimiter<T> for ExponentialFailureRateLimiter<T> {
    fn when(&self, item: &T, _now: Time) -> i64 {
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
/// use kcache::workqueue::{FastSlowRateLimiter, RateLimiter, Time};
/// let limiter = FastSlowRateLimiter::new(1_000_000, 60_000_000, 2);
/// let delays: Vec<i64> = (0..3).map(|_| limiter.when(&"a", Time::ZERO)).collect();
/// assert_eq!(delays, [1_000_000, 1_000_000, 60_000_000]);
/// assert_eq!(limiter.num_requeues(&"a"), 3);
/// ```
pub struct FastSlowRateLimiter<T> {
    fast: i64,
    slow: i64,
    max_fast_attempts: i64,
    /// Calls of `when` per item since its last `forget`; absent means 0.
    attempts: Mutex<Counts<T>>,
}

impl<T> FastSlowRateLimiter<T> {
    /// A limiter that waits `fast_ns` for an item's first `max_fast_attempts` calls, `slow_ns`
    /// from then on (Go's `int`: 0 or negative means always `slow_ns`).
    pub fn new(fast_ns: i64, slow_ns: i64, max_fast_attempts: i64) -> Self {
        FastSlowRateLimiter {
            fast: fast_ns,
            slow: slow_ns,
            max_fast_attempts,
            attempts: Mutex::new(Counts::default()),
        }
    }
}

impl<T> fmt::Debug for FastSlowRateLimiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FastSlowRateLimiter")
            .field("fast_ns", &self.fast)
            .field("slow_ns", &self.slow)
            .field("max_fast_attempts", &self.max_fast_attempts)
            .field("items", &lock(&self.attempts).len())
            .finish()
    }
}

impl<T: Hash + Eq + Clone + Send + Sync> RateLimiter<T> for FastSlowRateLimiter<T> {
    fn when(&self, item: &T, _now: Time) -> i64 {
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
    use super::super::tests::{whens, MS};
    use super::*;

    #[test]
    fn exponential_doubles_then_caps_at_max() {
        let limiter = ExponentialFailureRateLimiter::new(5 * MS, 1_000_000 * MS);
        let delays = whens(&limiter, "a", 20);
        // 5 ms · 2^e while below 1000 s: e = 17 gives 655.36 s, e = 18 would be 1310.72 s.
        let mut expected: Vec<i64> = (0..18).map(|e| (5 * MS) << e).collect();
        assert_eq!(expected[17], 655_360_000_000);
        expected.extend([1_000_000_000_000, 1_000_000_000_000]);
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
        // base 1: 2^62 is exact; 2^63 exactly is where client-go's conversion gives i64::MIN
        // (this port: max); 2^64 is above 2^63, so max in client-go too.
        let limiter = ExponentialFailureRateLimiter::new(1, i64::MAX);
        let delays = whens(&limiter, "a", 65);
        assert_eq!(delays[62], 4_611_686_018_427_387_904);
        assert_eq!(delays[63], i64::MAX);
        assert_eq!(delays[64], i64::MAX);
        let capped = ExponentialFailureRateLimiter::new(1, 1_000);
        assert_eq!(
            whens(&capped, "a", 64)[63],
            1_000,
            "exactly 2^63 returns max"
        );
    }

    #[test]
    fn exponential_above_two_pow_63_returns_max_even_below_the_cap_arithmetic() {
        // 3 · 2^61 = 6_917_529_027_641_081_856 fits; 3 · 2^62 is above 2^63.
        let limiter = ExponentialFailureRateLimiter::new(3, i64::MAX);
        let delays = whens(&limiter, "a", 63);
        assert_eq!(delays[61], 6_917_529_027_641_081_856);
        assert_eq!(delays[62], i64::MAX);
        let capped = ExponentialFailureRateLimiter::new(3, 77);
        assert_eq!(whens(&capped, "a", 63)[62], 77);
    }

    #[test]
    fn exponential_computes_in_f64() {
        // 2^53 + 1 is not an f64: Go's float64(base) rounds it to 2^53, and so does this port.
        let limiter = ExponentialFailureRateLimiter::new(9_007_199_254_740_993, i64::MAX);
        assert_eq!(
            whens(&limiter, "a", 2),
            [9_007_199_254_740_992, 18_014_398_509_481_984]
        );
    }

    #[test]
    fn exponential_with_base_zero_turns_nan_into_max() {
        // 0 · 2^e is 0 up to e = 1023; at e = 1024, 0 · +∞ is NaN: max here (client-go: i64::MIN).
        let limiter = ExponentialFailureRateLimiter::new(0, 7);
        let delays = whens(&limiter, "a", 1026);
        assert!(delays[..1024].iter().all(|&d| d == 0));
        assert_eq!(&delays[1024..], [7, 7]);
    }

    #[test]
    fn exponential_with_negative_base_goes_down_to_i64_min() {
        let limiter = ExponentialFailureRateLimiter::new(-5, 100);
        let delays = whens(&limiter, "a", 62);
        assert_eq!(&delays[..3], [-5, -10, -20]);
        assert_eq!(delays[60], -5_764_607_523_034_234_880);
        assert_eq!(
            delays[61],
            i64::MIN,
            "below -2^63 saturates, as amd64's conversion"
        );
    }

    #[test]
    fn exponential_max_below_base() {
        let limiter = ExponentialFailureRateLimiter::new(10, 3);
        assert_eq!(whens(&limiter, "a", 3), [3, 3, 3]);
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
            let limiter = FastSlowRateLimiter::new(1, 2, max_fast);
            assert_eq!(whens(&limiter, "a", 2), [2, 2], "max_fast {max_fast}");
            assert_eq!(limiter.num_requeues(&"a"), 2);
        }
    }
}
