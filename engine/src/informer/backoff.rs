//! Exponential backoff with jitter, as a reflector waits between failed attempts
//! (client-go's `wait.Backoff` behind `DelayWithReset`).

use std::time::Duration;

use tokio::time::Instant;

/// How long to wait between attempts: `initial`, multiplied by `factor` after every attempt up
/// to `max`, each wait stretched by a random share of up to `jitter` of itself; back to
/// `initial` once an attempt has run for `reset_after` without needing another wait.
///
/// The default is client-go's reflector backoff: 800 ms, ×2, at most 30 s, jitter 1.0, reset
/// after 2 minutes. So the waits are 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30, 30, … seconds, each
/// multiplied by a random factor in `[1, 1 + jitter)`.
///
/// client-go resets its backoff every `reset_after` counted from the previous reset, even while
/// attempts keep failing; here the reset needs `reset_after` of quiet (an attempt that lasted
/// that long), which is what the name promises and what a flapping server needs.
///
/// ```
/// use std::time::Duration;
/// use kcache::informer::Backoff;
///
/// let backoff = Backoff { jitter: 0.0, ..Backoff::default() };
/// let mut timer = backoff.timer();
/// let now = tokio::time::Instant::now();
/// assert_eq!(timer.next_delay(now), Duration::from_millis(800));
/// assert_eq!(timer.next_delay(now), Duration::from_millis(1600));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait before jitter.
    pub max: Duration,
    /// Each wait is the previous one times this (at least 1).
    pub factor: f64,
    /// Each wait is stretched by a uniformly random share in `[0, jitter)` of itself.
    pub jitter: f64,
    /// An attempt that runs this long without failing resets the waits to `initial`.
    pub reset_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(800),
            max: Duration::from_secs(30),
            factor: 2.0,
            jitter: 1.0,
            reset_after: Duration::from_secs(120),
        }
    }
}

impl Backoff {
    /// A fresh sequence of waits, jittered from a random seed.
    pub fn timer(&self) -> BackoffTimer {
        self.timer_with_seed(fastrand::u64(..))
    }

    /// A fresh sequence of waits whose jitter is reproducible from `seed`.
    pub fn timer_with_seed(&self, seed: u64) -> BackoffTimer {
        BackoffTimer {
            config: self.clone(),
            current: self.initial,
            attempt_started: None,
            rng: fastrand::Rng::with_seed(seed),
        }
    }
}

/// The state of one [`Backoff`] sequence.
#[derive(Debug, Clone)]
pub struct BackoffTimer {
    config: Backoff,
    /// The next wait before jitter.
    current: Duration,
    /// When the attempt after the previous wait started (the wait's end); `None` before the
    /// first wait.
    attempt_started: Option<Instant>,
    /// The jitter's generator, seeded by [`Backoff::timer_with_seed`].
    rng: fastrand::Rng,
}

impl BackoffTimer {
    /// The wait before the next attempt, given that the previous attempt ended `now`.
    pub fn next_delay(&mut self, now: Instant) -> Duration {
        if let Some(started) = self.attempt_started {
            if now.saturating_duration_since(started) > self.config.reset_after {
                self.current = self.config.initial;
            }
        }
        let base = self.current;
        let factor = self.config.factor.max(1.0);
        self.current = base
            .mul_f64(factor)
            .min(self.config.max.max(self.config.initial));
        let delay = if self.config.jitter > 0.0 {
            base + base.mul_f64(self.rng.f64() * self.config.jitter)
        } else {
            base
        };
        self.attempt_started = Some(now + delay);
        delay
    }

    /// Back to the initial wait, as after a long quiet attempt.
    pub fn reset(&mut self) {
        self.current = self.config.initial;
        self.attempt_started = None;
    }
}

/// A uniform value in `[0, 1)`, for one-off jitter (a watch's timeout).
pub(crate) fn random_unit() -> f64 {
    fastrand::f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A timer of the default backoff without jitter: its waits are exact.
    fn unjittered() -> BackoffTimer {
        Backoff {
            jitter: 0.0,
            ..Backoff::default()
        }
        .timer()
    }

    #[test]
    fn without_jitter_the_waits_double_up_to_the_cap() {
        let mut timer = unjittered();
        let now = Instant::now();
        let waits: Vec<_> = (0..9).map(|_| timer.next_delay(now)).collect();
        assert_eq!(
            waits,
            [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000, 30000].map(ms)
        );
    }

    #[test]
    fn jitter_stretches_each_wait_by_at_most_its_share() {
        let mut timer = Backoff::default().timer_with_seed(7);
        let now = Instant::now();
        let mut base = ms(800);
        let mut stretched = 0;
        for _ in 0..200 {
            let wait = timer.next_delay(now);
            assert!(
                wait >= base && wait < base * 2,
                "{wait:?} for base {base:?}"
            );
            stretched += usize::from(wait > base);
            base = (base * 2).min(Duration::from_secs(30));
        }
        assert!(stretched > 190, "jitter is applied: {stretched}");
    }

    #[test]
    fn a_quiet_attempt_longer_than_reset_after_resets_the_waits() {
        let mut timer = unjittered();
        let start = Instant::now();
        assert_eq!(timer.next_delay(start), ms(800));
        assert_eq!(timer.next_delay(start + ms(900)), ms(1600));
        // The attempt after that wait started at 2.5 s; it failed 2 minutes later: no reset yet.
        let at = start + ms(2500) + Duration::from_secs(120);
        assert_eq!(timer.next_delay(at), ms(3200));
        // This attempt ran more than 2 minutes: reset.
        let later = at + ms(3200) + Duration::from_secs(121);
        assert_eq!(timer.next_delay(later), ms(800));
    }
}
