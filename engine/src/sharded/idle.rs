//! How an idle consumer waits: poll briefly, then sleep — and stop polling when it never pays.
//!
//! A futex sleep costs the next producer a system call and the consumer a wake-up that, on a
//! virtual machine whose idle vCPU has halted, can take hundreds of microseconds. Under steady
//! load the next event usually follows within microseconds, so polling for up to
//! [`SPIN_BEFORE_SLEEP`] first keeps a busy consumer awake (paced W1 p99 12–26 µs against
//! 300–2,000 µs when it slept at once). But when events come further apart than that — a
//! controller's informer on a real watch, where they arrive a few per millisecond — every idle
//! period burns the whole poll for nothing: 50 µs of CPU per event at 2,000 events/s is a tenth
//! of a core.
//!
//! So the queue remembers whether polling has been paying. After [`MISSES_BEFORE_SLEEPING`]
//! idle periods in a row whose poll ran out without work, consumers sleep at once, except that
//! one idle period in [`PROBE_EVERY`] polls again to notice the load coming back; the first
//! poll that finds work turns polling back on. The state is shared by the queue's consumers
//! and is only a hint: a race on it changes how long someone polls, never what it pops.

#[cfg(not(kcache_loom))]
use std::sync::atomic::{AtomicU32, Ordering};
#[cfg(not(kcache_loom))]
use std::time::{Duration, Instant};

/// How long an idle consumer polls for work before it sleeps, while polling pays.
#[cfg(not(kcache_loom))]
pub(crate) const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(50);

/// Consecutive fruitless polls after which consumers stop polling.
#[cfg(not(kcache_loom))]
pub(crate) const MISSES_BEFORE_SLEEPING: u32 = 4;

/// While polling is off, one idle period in this many polls anyway.
#[cfg(not(kcache_loom))]
pub(crate) const PROBE_EVERY: u32 = 16;

/// Whether polling has been paying, shared by one queue's consumers.
pub(crate) struct IdlePolicy {
    /// Idle periods in a row whose poll ran out without work.
    #[cfg(not(kcache_loom))]
    misses: AtomicU32,
    /// Idle periods begun while polling was off (picks the probes).
    #[cfg(not(kcache_loom))]
    skipped: AtomicU32,
    /// Polls that found work, ever (wrapping). A poll that runs out counts as a miss only if
    /// no other poll found work meanwhile: with several idle consumers one event ends one poll
    /// and leaves the others empty-handed, and that is no sign that polling does not pay.
    #[cfg(not(kcache_loom))]
    hits: AtomicU32,
}

impl IdlePolicy {
    pub(crate) fn new() -> Self {
        Self {
            #[cfg(not(kcache_loom))]
            misses: AtomicU32::new(0),
            #[cfg(not(kcache_loom))]
            skipped: AtomicU32::new(0),
            #[cfg(not(kcache_loom))]
            hits: AtomicU32::new(0),
        }
    }

    /// Begins one idle period's poll. Under loom there is no polling at all: loom explores
    /// every interleaving of a sleep anyway.
    pub(crate) fn backoff(&self) -> Backoff<'_> {
        #[cfg(not(kcache_loom))]
        {
            // Relaxed throughout: the counters publish no data, and a stale value only makes one
            // consumer poll when it need not, or not when it might have.
            let polling = self.misses.load(Ordering::Relaxed) < MISSES_BEFORE_SLEEPING
                || self.skipped.fetch_add(1, Ordering::Relaxed) % PROBE_EVERY == 0;
            Backoff {
                policy: self,
                limit: if polling {
                    SPIN_BEFORE_SLEEP
                } else {
                    Duration::ZERO
                },
                started: None,
                polls: 0,
                gave_up: false,
                hits_at_start: self.hits.load(Ordering::Relaxed),
            }
        }
        #[cfg(kcache_loom)]
        {
            Backoff { _policy: self }
        }
    }

    /// Whether consumers poll before sleeping right now (outside probes).
    #[cfg(all(test, not(kcache_loom)))]
    fn polling(&self) -> bool {
        self.misses.load(Ordering::Relaxed) < MISSES_BEFORE_SLEEPING
    }
}

/// One idle period's poll: [`Backoff::snooze`] until it says stop, then sleep. Dropped after a
/// poll that found work, it tells the policy that polling paid.
pub(crate) struct Backoff<'a> {
    #[cfg(not(kcache_loom))]
    policy: &'a IdlePolicy,
    #[cfg(not(kcache_loom))]
    limit: Duration,
    #[cfg(not(kcache_loom))]
    started: Option<Instant>,
    #[cfg(not(kcache_loom))]
    polls: u32,
    #[cfg(not(kcache_loom))]
    gave_up: bool,
    /// The policy's hit count when this poll began.
    #[cfg(not(kcache_loom))]
    hits_at_start: u32,
    #[cfg(kcache_loom)]
    _policy: &'a IdlePolicy,
}

impl Backoff<'_> {
    /// Returns true while the caller should retry before sleeping.
    pub(crate) fn snooze(&mut self) -> bool {
        #[cfg(not(kcache_loom))]
        {
            if self.gave_up {
                return false;
            }
            self.polls += 1;
            // Read the clock only every 32 polls: it costs more than a poll.
            if self.polls % 32 == 1 {
                let now = Instant::now();
                let started = *self.started.get_or_insert(now);
                if now.duration_since(started) >= self.limit {
                    self.gave_up = true;
                    // A poll that was off (limit zero) learns nothing: only a real poll that
                    // ran out while no other poll found work counts against polling.
                    let others_hit = self.policy.hits.load(Ordering::Relaxed) != self.hits_at_start;
                    if !self.limit.is_zero() && !others_hit {
                        self.policy.misses.fetch_add(1, Ordering::Relaxed);
                    }
                    return false;
                }
            }
            for _ in 0..8 {
                std::hint::spin_loop();
            }
            true
        }
        #[cfg(kcache_loom)]
        {
            false
        }
    }
}

impl Drop for Backoff<'_> {
    fn drop(&mut self) {
        #[cfg(not(kcache_loom))]
        if self.polls > 0 && !self.gave_up {
            // It polled and the wait ended before the limit: polling pays. (The wait also ends
            // when the queue closes; counting that as a hit is harmless, it happens once.)
            self.policy.misses.store(0, Ordering::Relaxed);
            self.policy.hits.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(kcache_loom)))]
mod tests {
    use super::*;

    /// Polls until the backoff gives up, as an idle period with no work does.
    fn fruitless(policy: &IdlePolicy) -> u32 {
        let mut backoff = policy.backoff();
        let mut polls = 0;
        while backoff.snooze() {
            polls += 1;
        }
        polls
    }

    #[test]
    fn polling_stops_after_fruitless_polls_and_probes_now_and_then() {
        let policy = IdlePolicy::new();
        for _ in 0..MISSES_BEFORE_SLEEPING {
            assert!(policy.polling());
            assert!(fruitless(&policy) > 0, "a poll while polling pays spins");
        }
        assert!(!policy.polling());
        let spun: Vec<bool> = (0..2 * PROBE_EVERY)
            .map(|_| fruitless(&policy) > 0)
            .collect();
        assert_eq!(
            spun.iter().filter(|&&spun| spun).count(),
            2,
            "one probe in every {PROBE_EVERY} idle periods: {spun:?}"
        );
        assert!(!policy.polling(), "fruitless probes keep polling off");
    }

    #[test]
    fn a_poll_that_finds_work_turns_polling_back_on() {
        let policy = IdlePolicy::new();
        for _ in 0..MISSES_BEFORE_SLEEPING {
            fruitless(&policy);
        }
        assert!(!policy.polling());
        // The probe: work shows up after a few polls.
        let mut probe = loop {
            let backoff = policy.backoff();
            if !backoff.limit.is_zero() {
                break backoff;
            }
        };
        assert!(probe.snooze());
        drop(probe);
        assert!(policy.polling());
    }

    #[test]
    fn a_poll_left_empty_handed_while_another_found_work_is_no_miss() {
        let policy = IdlePolicy::new();
        // Five idle consumers poll at once; one event ends one poll, the other four run out.
        let mut polls: Vec<_> = (0..=MISSES_BEFORE_SLEEPING)
            .map(|_| policy.backoff())
            .collect();
        let mut lucky = polls.pop().expect("five polls");
        assert!(lucky.snooze());
        drop(lucky);
        for mut unlucky in polls {
            while unlucky.snooze() {}
        }
        assert!(
            policy.polling(),
            "the idle period had a poll that found work"
        );
    }

    #[test]
    fn work_found_without_polling_teaches_nothing() {
        let policy = IdlePolicy::new();
        for _ in 0..MISSES_BEFORE_SLEEPING - 1 {
            fruitless(&policy);
        }
        drop(policy.backoff());
        fruitless(&policy);
        assert!(!policy.polling(), "an untouched backoff is no hit");
    }
}
