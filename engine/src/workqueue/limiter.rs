//! Rate limiters: how long an item waits before it is queued again (client-go's
//! `util/workqueue/default_rate_limiters.go`, with golang.org/x/time/rate's token bucket).
//!
//! Durations are Go `time.Duration`s: `i64` nanoseconds, computed with Go's integer and `f64`
//! arithmetic so that every result matches client-go's to the nanosecond. `i64::MAX` means
//! "never" (a token bucket that can't ever grant the token).
//!
//! A limiter reads no clock of its own: [`RateLimiter::when`] is handed the queue's time, so a
//! queue on a [`FakeClock`](super::FakeClock) makes the token bucket deterministic too.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use crate::sync::{lock, Mutex};

use super::clock::Time;

/// 2^63, the smallest `f64` above `i64::MAX` (`float64(math.MaxInt64)` in Go).
const TWO_POW_63: f64 = 9_223_372_036_854_775_808.0;

/// Nanoseconds per second, as Go's `time.Second`.
const SECOND: i64 = 1_000_000_000;

/// Per-item counters; ahash because a workqueue item's hash is the hot part of every call.
type Counts<T> = HashMap<T, u64, ahash::RandomState>;

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
    max_fast_attempts: u64,
    /// Calls of `when` per item since its last `forget`; absent means 0.
    attempts: Mutex<Counts<T>>,
}

impl<T> FastSlowRateLimiter<T> {
    /// A limiter that waits `fast_ns` for an item's first `max_fast_attempts` calls, `slow_ns`
    /// from then on.
    pub fn new(fast_ns: i64, slow_ns: i64, max_fast_attempts: u64) -> Self {
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
        if attempt <= self.max_fast_attempts {
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

/// A token bucket shared by all items: `burst` tokens, refilled at `qps` per second; each call
/// takes one token and waits until it would exist (client-go's `BucketRateLimiter`, which is
/// golang.org/x/time/rate's `Limiter` asked `ReserveN(now, 1).DelayFrom(now)`).
///
/// The state is Go's: `tokens` may go negative (calls reserve tokens from the future), and the
/// first call finds the bucket full. Exactly, at time `now`:
///
/// - `qps` is `+∞` (Go's `rate.Inf`): 0, and nothing changes.
/// - `burst < 1`: `i64::MAX` (never), and nothing changes.
/// - Otherwise `t = min(tokens + secs(now − last) · qps, burst) − 1`, with no refill when
///   `qps <= 0`, `secs(d) = (d / 10^9) as f64 + (d % 10^9) as f64 / 1e9` (Go's
///   `Duration.Seconds`), and `now − last` taken as 0 if `now` is before `last` (Go's
///   `advance`); on the first call `t = burst − 1`. The wait is 0 if `t >= 0`; else `i64::MAX`
///   if `qps <= 0`; else `x = (−t / qps) · 1e9` and `i64::MAX` if `x > 2^63`, `x` truncated
///   otherwise. Then `tokens = t`, `last = now`.
///
/// It keeps no per-item state: `num_requeues` is 0 and `forget` does nothing.
///
/// ```
/// use kcache::workqueue::{BucketRateLimiter, RateLimiter, Time};
/// let bucket = BucketRateLimiter::new(10.0, 2);
/// let at = Time::ZERO;
/// assert_eq!(bucket.when(&"a", at), 0); // the first two calls take the burst
/// assert_eq!(bucket.when(&"b", at), 0);
/// assert_eq!(bucket.when(&"c", at), 100_000_000); // then one token per 1/10 s
/// assert_eq!(bucket.when(&"d", at), 200_000_000);
/// assert_eq!(bucket.when(&"e", Time::from_nanos(1_000_000_000)), 0); // refilled (capped at 2)
/// ```
#[derive(Debug)]
pub struct BucketRateLimiter {
    qps: f64,
    burst: i64,
    state: Mutex<Bucket>,
}

/// The bucket's mutable part (x/time/rate's `tokens` and `last`).
#[derive(Debug)]
struct Bucket {
    /// Tokens left after the last call; negative when calls reserved future tokens.
    tokens: f64,
    /// When the last call was made; `None` before the first ("never": Go's zero `Time`, so
    /// long ago that the first call finds the bucket full).
    last: Option<Time>,
}

impl BucketRateLimiter {
    /// A bucket of `burst` tokens (full at first), refilled with `qps` tokens per second.
    /// `qps` may have a fraction; `qps <= 0` never refills; `burst < 1` never grants a token.
    pub fn new(qps: f64, burst: i64) -> Self {
        BucketRateLimiter {
            qps,
            burst,
            state: Mutex::new(Bucket {
                tokens: burst as f64,
                last: None,
            }),
        }
    }

    /// Takes one token at `now` and returns how many nanoseconds until it exists (x/time/rate's
    /// `ReserveN(now, 1).DelayFrom(now)`); see the type's documentation for the arithmetic.
    pub fn reserve(&self, now: Time) -> i64 {
        if self.qps == f64::INFINITY {
            // rate.Inf: every reservation succeeds at once and the state is left alone.
            return 0;
        }
        if self.burst < 1 {
            // n = 1 > burst: the reservation is refused, which DelayFrom reports as
            // InfDuration, and the state is left alone.
            return i64::MAX;
        }
        let burst = self.burst as f64;
        let mut bucket = lock(&self.state);
        let mut tokens = match bucket.last {
            None => burst,
            Some(last) => {
                // Go's advance: a `now` before `last` counts as no time passed.
                let elapsed = now.nanos_since(last).max(0);
                bucket.tokens + self.tokens_from_duration(elapsed)
            }
        };
        // Go's `if tokens > burst`, not f64::min: a NaN (from a NaN qps) stays NaN, as in Go.
        if tokens > burst {
            tokens = burst;
        }
        tokens -= 1.0;
        let wait = if tokens < 0.0 {
            self.duration_from_tokens(-tokens)
        } else {
            0
        };
        bucket.tokens = tokens;
        bucket.last = Some(now);
        wait
    }

    /// x/time/rate's `Limit.tokensFromDuration`: the tokens `qps` makes in `nanos`.
    fn tokens_from_duration(&self, nanos: i64) -> f64 {
        if self.qps <= 0.0 {
            return 0.0;
        }
        let secs = (nanos / SECOND) as f64 + (nanos % SECOND) as f64 / 1e9;
        secs * self.qps
    }

    /// x/time/rate's `Limit.durationFromTokens`: the nanoseconds `qps` takes to make `tokens`.
    fn duration_from_tokens(&self, tokens: f64) -> i64 {
        if self.qps <= 0.0 {
            return i64::MAX;
        }
        let nanos = (tokens / self.qps) * 1e9;
        if nanos > TWO_POW_63 {
            return i64::MAX;
        }
        // At exactly 2^63 Go's conversion gives i64::MIN on amd64; Rust's saturates to
        // i64::MAX, which is the "never" Go meant.
        nanos as i64
    }
}

impl<T: ?Sized> RateLimiter<T> for BucketRateLimiter {
    fn when(&self, _item: &T, now: Time) -> i64 {
        self.reserve(now)
    }

    fn forget(&self, _item: &T) {}

    fn num_requeues(&self, _item: &T) -> u64 {
        0
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
