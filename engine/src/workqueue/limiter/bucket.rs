//! The token bucket (golang.org/x/time/rate's `Limiter`), shared by all items.

use std::time::Duration;

use crate::sync::{lock, Mutex};
use crate::workqueue::clock::Time;

use super::{RateLimiter, NEVER, TWO_POW_63};

/// A token bucket shared by all items: `burst` tokens, refilled at `qps` per second; each call
/// takes one token and waits until it would exist (client-go's `BucketRateLimiter`, which is
/// golang.org/x/time/rate's `Limiter` asked `ReserveN(now, 1).DelayFrom(now)`).
///
/// The state is Go's: `tokens` may go negative (calls reserve tokens from the future), and the
/// first call finds the bucket full. Exactly, at time `now`:
///
/// - `qps` is `+∞` (Go's `rate.Inf`): 0, and nothing changes.
/// - `burst < 1`: [`NEVER`], and nothing changes.
/// - Otherwise `t = min(tokens + secs(now − last) · qps, burst) − 1`, with no refill when
///   `qps <= 0`, `secs(d) = d.as_secs() as f64 + d.subsec_nanos() as f64 / 1e9` (Go's
///   `Duration.Seconds`), and `now − last` taken as 0 if `now` is before `last` (Go's
///   `advance`); on the first call `t = burst − 1`. The wait is 0 if `t >= 0`; else [`NEVER`]
///   if `qps <= 0`; else `x = (−t / qps) · 1e9` nanoseconds, [`NEVER`] if `x >= 2^63` (Go's
///   `InfDuration`), `x` truncated otherwise. Then `tokens = t`, `last = now`.
///
/// It keeps no per-item state: `num_requeues` is 0 and `forget` does nothing.
///
/// ```
/// use std::time::Duration;
/// use kcache::workqueue::{BucketRateLimiter, RateLimiter, Time};
/// let bucket = BucketRateLimiter::new(10.0, 2);
/// let (at, ms) = (Time::ZERO, Duration::from_millis);
/// assert_eq!(bucket.when(&"a", at), Duration::ZERO); // the first two calls take the burst
/// assert_eq!(bucket.when(&"b", at), Duration::ZERO);
/// assert_eq!(bucket.when(&"c", at), ms(100)); // then one token per 1/10 s
/// assert_eq!(bucket.when(&"d", at), ms(200));
/// let later = Time::after_origin(Duration::from_secs(1));
/// assert_eq!(bucket.when(&"e", later), Duration::ZERO); // refilled (capped at 2)
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

    /// Takes one token at `now` and returns how long until it exists (x/time/rate's
    /// `ReserveN(now, 1).DelayFrom(now)`); see the type's documentation for the arithmetic.
    pub fn reserve(&self, now: Time) -> Duration {
        if self.qps == f64::INFINITY {
            // rate.Inf: every reservation succeeds at once and the state is left alone.
            return Duration::ZERO;
        }
        if self.burst < 1 {
            // n = 1 > burst: the reservation is refused, which DelayFrom reports as
            // InfDuration, and the state is left alone.
            return NEVER;
        }
        let burst = self.burst as f64;
        let mut bucket = lock(&self.state);
        let mut tokens = match bucket.last {
            None => burst,
            Some(last) => {
                // Go's advance: a `now` before `last` counts as no time passed.
                let elapsed = now.saturating_duration_since(last);
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
            Duration::ZERO
        };
        bucket.tokens = tokens;
        bucket.last = Some(now);
        wait
    }

    /// x/time/rate's `Limit.tokensFromDuration`: the tokens `qps` makes in `elapsed`.
    fn tokens_from_duration(&self, elapsed: Duration) -> f64 {
        if self.qps <= 0.0 {
            return 0.0;
        }
        // Go's Duration.Seconds: whole seconds and the nanosecond rest, converted apart.
        let secs = elapsed.as_secs() as f64 + f64::from(elapsed.subsec_nanos()) / 1e9;
        secs * self.qps
    }

    /// x/time/rate's `Limit.durationFromTokens`: how long `qps` takes to make `tokens`.
    fn duration_from_tokens(&self, tokens: f64) -> Duration {
        if self.qps <= 0.0 {
            return NEVER;
        }
        let nanos = (tokens / self.qps) * 1e9;
        // Go: above 2^63, InfDuration. At exactly 2^63 Go's conversion gives i64::MIN on amd64,
        // a negative wait it never meant: "never" as well.
        if nanos >= TWO_POW_63 {
            return NEVER;
        }
        // Truncation, as Go's conversion (a NaN, from a NaN qps, gives 0 as before).
        Duration::from_nanos(nanos as u64)
    }
}

impl<T: ?Sized> RateLimiter<T> for BucketRateLimiter {
    fn when(&self, _item: &T, now: Time) -> Duration {
        self.reserve(now)
    }

    fn forget(&self, _item: &T) {}

    fn num_requeues(&self, _item: &T) -> u64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{at_ms, ns, whens, MS, T0};
    use super::*;

    #[test]
    fn bucket_burst_then_one_token_per_interval() {
        let bucket = BucketRateLimiter::new(10.0, 100);
        assert_eq!(whens(&bucket, "a", 100), [Duration::ZERO; 100]);
        // 101st at the same instant: tokens −1, (1 / 10) s; then −2, 0.2 s.
        assert_eq!(whens(&bucket, "a", 2), [100 * MS, 200 * MS]);
        assert_eq!(RateLimiter::<&str>::num_requeues(&bucket, &"a"), 0);
    }

    /// The waits of one reservation at each of `at` (milliseconds from the origin), in order.
    fn reserves(bucket: &BucketRateLimiter, at: &[u64]) -> Vec<Duration> {
        at.iter().map(|&ms| bucket.reserve(at_ms(ms))).collect()
    }

    #[test]
    fn bucket_refill_uses_elapsed_seconds_and_caps_at_burst() {
        let bucket = BucketRateLimiter::new(10.0, 1);
        // tokens 0; 0 + 1.5 capped at 1, −1 → 0; 0 + 0.5 − 1 = −0.5 → 0.05 s;
        // −0.5 + 2.5 s · 10 = 24.5, capped at 1 (secs() splits 2 s and 0.5 s).
        let waits = [Duration::ZERO, Duration::ZERO, 50 * MS, Duration::ZERO];
        assert_eq!(reserves(&bucket, &[0, 150, 200, 2_700]), waits);
    }

    #[test]
    fn bucket_tokens_go_negative_and_refill_from_there() {
        let bucket = BucketRateLimiter::new(1.0, 1);
        // Three at once: 0, 1 s, 2 s. Then tokens −2, one second refills one: −1, minus the
        // call's token: −2. Then −2 + 3 = 1, minus 1: 0.
        let waits = [
            Duration::ZERO,
            1_000 * MS,
            2_000 * MS,
            2_000 * MS,
            Duration::ZERO,
        ];
        assert_eq!(reserves(&bucket, &[0, 0, 0, 1_000, 4_000]), waits);
    }

    #[test]
    fn bucket_fractional_qps() {
        // One token per two seconds; then −1 + 1 s · 0.5 = −0.5, minus 1: −1.5 → 3 s.
        let bucket = BucketRateLimiter::new(0.5, 1);
        let waits = [Duration::ZERO, 2_000 * MS, 3_000 * MS];
        assert_eq!(reserves(&bucket, &[0, 0, 1_000]), waits);
        // qps 3: 1/3 s is 333_333_333.33 ns, truncated.
        let thirds = BucketRateLimiter::new(3.0, 1);
        assert_eq!(
            reserves(&thirds, &[0, 0]),
            [Duration::ZERO, ns(333_333_333)]
        );
        // qps 0.7, refilled for one second after the burst: 0.7 − 1 is −0.30000000000000004
        // in f64, and (0.30000000000000004 / 0.7) · 1e9 = 428_571_428.57 ns; then
        // −0.30000000000000004 + 0.7 − 1 = −0.6000000000000001 → 857_142_857.14 ns.
        let sevenths = BucketRateLimiter::new(0.7, 1);
        let waits = [Duration::ZERO, ns(428_571_428), ns(857_142_857)];
        assert_eq!(reserves(&sevenths, &[0, 1_000, 2_000]), waits);
    }

    #[test]
    fn bucket_with_burst_below_one_never_grants_and_keeps_its_state() {
        for burst in [0, -3] {
            let bucket = BucketRateLimiter::new(10.0, burst);
            assert_eq!(bucket.reserve(T0), NEVER);
            assert_eq!(bucket.reserve(at_ms(100_000)), NEVER);
            let state = lock(&bucket.state);
            assert_eq!((state.tokens, state.last), (burst as f64, None));
        }
    }

    #[test]
    fn bucket_with_qps_zero_or_negative_spends_the_burst_then_never() {
        for qps in [0.0, -1.0] {
            let bucket = BucketRateLimiter::new(qps, 2);
            assert_eq!(bucket.reserve(T0), Duration::ZERO);
            assert_eq!(bucket.reserve(T0), Duration::ZERO);
            assert_eq!(bucket.reserve(T0), NEVER);
            assert_eq!(bucket.reserve(at_ms(1_000_000)), NEVER, "no refill");
            assert_eq!(
                lock(&bucket.state).tokens,
                -2.0,
                "each call still takes a token"
            );
        }
    }

    #[test]
    fn bucket_waits_beyond_two_pow_63_are_never() {
        // 1 token at 1e-10 qps is 1e19 ns > 2^63.
        let bucket = BucketRateLimiter::new(1e-10, 1);
        assert_eq!(bucket.reserve(T0), Duration::ZERO);
        assert_eq!(bucket.reserve(T0), NEVER);
        // At 1e-9 qps it is (1 / 1e-9) · 1e9 = 999_999_999_999_999_872 in f64, which fits.
        let slow = BucketRateLimiter::new(1e-9, 1);
        assert_eq!(slow.reserve(T0), Duration::ZERO);
        assert_eq!(slow.reserve(T0), ns(999_999_999_999_999_872));
    }

    #[test]
    fn bucket_time_going_back_counts_as_no_time() {
        let bucket = BucketRateLimiter::new(1.0, 1);
        assert_eq!(bucket.reserve(at_ms(1_000)), Duration::ZERO);
        assert_eq!(bucket.reserve(at_ms(500)), 1_000 * MS);
        // last moved back to 500 ms (Go sets last = t): 0.5 s later refills half a token.
        assert_eq!(bucket.reserve(at_ms(1_000)), 1_500 * MS);
    }

    #[test]
    fn bucket_with_infinite_qps_always_grants() {
        let bucket = BucketRateLimiter::new(f64::INFINITY, 0);
        assert_eq!(bucket.reserve(T0), Duration::ZERO);
        assert_eq!(bucket.reserve(T0), Duration::ZERO);
    }
}
