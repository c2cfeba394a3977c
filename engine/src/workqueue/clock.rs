//! The workqueue's injectable clock: every time-dependent part of the workqueue (the delaying
//! layer's ready times, the token bucket's refill) reads one [`Clock`], so tests and traces run
//! on a [`FakeClock`] that only moves when told to.
//!
//! Times are integer nanoseconds on a monotonic line ([`Time`]); durations are plain `i64`
//! nanoseconds, as Go's `time.Duration` (`i64::MAX` is used as "never").

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Instant;

use thiserror::Error;

use crate::sync::{lock, Mutex};

/// A point on a monotonic clock, in nanoseconds since the clock's origin.
///
/// Arithmetic saturates at `i64::MIN` and `i64::MAX` instead of wrapping, as Go's
/// `time.Time.Add` and `Sub` do, so "now plus `i64::MAX`" is [`Time::MAX`], a time no test
/// clock reaches in practice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(i64);

impl Time {
    /// The clock's origin: where [`RealClock`] and [`FakeClock`] start.
    pub const ZERO: Time = Time(0);
    /// The latest representable time.
    pub const MAX: Time = Time(i64::MAX);

    /// The time `nanos` nanoseconds after the origin (before it when negative).
    ///
    /// ```
    /// use kcache::workqueue::Time;
    /// assert_eq!(Time::from_nanos(5).as_nanos(), 5);
    /// ```
    pub const fn from_nanos(nanos: i64) -> Time {
        Time(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> i64 {
        self.0
    }

    /// The time `nanos` later (earlier when negative), saturating at the ends of the line.
    ///
    /// ```
    /// use kcache::workqueue::Time;
    /// assert_eq!(Time::from_nanos(5).saturating_add_nanos(-7), Time::from_nanos(-2));
    /// assert_eq!(Time::from_nanos(1).saturating_add_nanos(i64::MAX), Time::MAX);
    /// ```
    pub const fn saturating_add_nanos(self, nanos: i64) -> Time {
        Time(self.0.saturating_add(nanos))
    }

    /// Nanoseconds from `earlier` to `self` (negative when `earlier` is later), saturating, as
    /// Go's `t.Sub(earlier)`.
    ///
    /// ```
    /// use kcache::workqueue::Time;
    /// assert_eq!(Time::from_nanos(9).nanos_since(Time::from_nanos(4)), 5);
    /// assert_eq!(Time::MAX.nanos_since(Time::from_nanos(-1)), i64::MAX);
    /// ```
    pub const fn nanos_since(self, earlier: Time) -> i64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// A monotonic source of [`Time`].
///
/// A waiter that needs to act at a future time (the delaying layer's timer) asks
/// [`Clock::subscribe`] how the clock moves:
///
/// - `None` (the default, [`RealClock`]): the clock advances by itself with real time; sleep
///   for the remaining nanoseconds, with a timeout on the waiter's own condition variable.
/// - `Some(subscription)` ([`FakeClock`]): the clock only jumps, and calls the registered
///   function each time it does; a waiter sleeping on its own condition variable is woken by
///   that function instead of by a timeout.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time. Never smaller than a value returned earlier (monotonic).
    fn now(&self) -> Time;

    /// Registers `on_move`, to be called after every move of a clock that moves only when told
    /// to, and returns the handle that keeps it registered; returns `None` (dropping
    /// `on_move`) for a clock that advances by itself with real time.
    ///
    /// See [`FakeClock::subscribe`] for when and where `on_move` runs.
    fn subscribe(&self, on_move: Arc<dyn Fn() + Send + Sync>) -> Option<Subscription> {
        drop(on_move);
        None
    }
}

/// Real monotonic time ([`std::time::Instant`]), measured from the moment the clock was made.
///
/// ```
/// use kcache::workqueue::{Clock, RealClock};
/// let clock = RealClock::new();
/// let (a, b) = (clock.now(), clock.now());
/// assert!(a <= b);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RealClock {
    origin: Instant,
}

impl RealClock {
    /// A clock whose origin ([`Time::ZERO`]) is now.
    pub fn new() -> RealClock {
        RealClock {
            origin: Instant::now(),
        }
    }
}

impl Default for RealClock {
    fn default() -> RealClock {
        RealClock::new()
    }
}

impl Clock for RealClock {
    fn now(&self) -> Time {
        // 2^63 ns is 292 years of uptime: saturating there is exact for any real process.
        let nanos = self.origin.elapsed().as_nanos();
        Time(i64::try_from(nanos).unwrap_or(i64::MAX))
    }
}

/// A move of a [`FakeClock`] that was refused because it would go back in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ClockError {
    /// [`FakeClock::step`] was given a negative step.
    #[error("a clock step must be zero or positive, got {0} ns")]
    NegativeStep(i64),
    /// [`FakeClock::set`] was given a time before the current one.
    #[error("a monotonic clock can't go back from {} ns to {} ns", now.as_nanos(), to.as_nanos())]
    Backwards {
        /// The clock's time, unchanged.
        now: Time,
        /// The refused target.
        to: Time,
    },
}

/// A clock that starts at [`Time::ZERO`] and moves only by [`step`](FakeClock::step) and
/// [`set`](FakeClock::set), never backwards.
///
/// Moving it calls every [subscriber](FakeClock::subscribe) on the moving thread before the
/// move returns, so a timer that sleeps on real time (the delaying layer's) can be woken, or
/// can do its work right there, when the fake time reaches its deadline.
///
/// ```
/// use std::sync::{Arc, atomic::{AtomicUsize, Ordering}};
/// use kcache::workqueue::{Clock, FakeClock, Time};
///
/// let clock = FakeClock::new();
/// let moves = Arc::new(AtomicUsize::new(0));
/// let counter = moves.clone();
/// let subscription = clock.subscribe(Arc::new(move || {
///     counter.fetch_add(1, Ordering::Relaxed);
/// }));
/// assert_eq!(clock.step(5_000_000).unwrap(), Time::from_nanos(5_000_000));
/// assert!(clock.step(-1).is_err(), "negative steps are refused and change nothing");
/// clock.set(Time::from_nanos(7_000_000)).unwrap();
/// assert_eq!(clock.now(), Time::from_nanos(7_000_000));
/// assert_eq!(moves.load(Ordering::Relaxed), 2);
/// drop(subscription);
/// clock.step(1).unwrap();
/// assert_eq!(moves.load(Ordering::Relaxed), 2, "no calls after the subscription is dropped");
/// ```
#[derive(Debug)]
pub struct FakeClock {
    now: Mutex<Time>,
    /// Shared with each [`Subscription`] (weakly), so that dropping one unregisters it.
    subscribers: Arc<Mutex<Subscribers>>,
}

/// The registered `on_move` functions, each under the id its [`Subscription`] removes.
#[derive(Default)]
struct Subscribers {
    next_id: u64,
    list: Vec<(u64, Arc<dyn Fn() + Send + Sync>)>,
}

impl fmt::Debug for Subscribers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscribers")
            .field("count", &self.list.len())
            .finish()
    }
}

impl FakeClock {
    /// A fake clock at [`Time::ZERO`] with no subscribers.
    pub fn new() -> FakeClock {
        FakeClock {
            now: Mutex::new(Time::ZERO),
            subscribers: Arc::new(Mutex::new(Subscribers::default())),
        }
    }

    /// Advances the clock by `nanos` (saturating at [`Time::MAX`]) and returns the new time.
    /// A step of 0 is a move too: subscribers are called. A negative step is refused with
    /// [`ClockError::NegativeStep`] and changes nothing.
    pub fn step(&self, nanos: i64) -> Result<Time, ClockError> {
        if nanos < 0 {
            return Err(ClockError::NegativeStep(nanos));
        }
        let now = {
            let mut now = lock(&self.now);
            *now = now.saturating_add_nanos(nanos);
            *now
        };
        self.notify();
        Ok(now)
    }

    /// Moves the clock to `to`, which may equal the current time but not precede it
    /// ([`ClockError::Backwards`], nothing changes).
    pub fn set(&self, to: Time) -> Result<(), ClockError> {
        {
            let mut now = lock(&self.now);
            if to < *now {
                return Err(ClockError::Backwards { now: *now, to });
            }
            *now = to;
        }
        self.notify();
        Ok(())
    }

    /// Registers `on_move`, called after every [`step`](FakeClock::step) and
    /// [`set`](FakeClock::set) until the returned [`Subscription`] is dropped.
    ///
    /// `on_move` runs on the thread that moved the clock, after the new time is visible to
    /// [`now`](Clock::now) and before that move returns, with no lock of the clock held: it may
    /// read the clock, subscribe, or drop subscriptions (but must not move this clock, which
    /// would recurse). Subscribers run in the order they subscribed. When two threads move the
    /// clock at once, each runs every subscriber once after its own move, so a subscriber
    /// should read [`now`](Clock::now) rather than assume which move it follows, and may run
    /// once more just after its subscription is dropped by another thread.
    ///
    /// If `on_move` refers to the object that owns the subscription (a queue holding the clock
    /// and the subscription), capture a `Weak` reference: a strong one is a cycle that keeps
    /// both alive forever.
    pub fn subscribe(&self, on_move: Arc<dyn Fn() + Send + Sync>) -> Subscription {
        let mut subscribers = lock(&self.subscribers);
        let id = subscribers.next_id;
        subscribers.next_id += 1;
        subscribers.list.push((id, on_move));
        Subscription {
            id,
            subscribers: Arc::downgrade(&self.subscribers),
        }
    }

    /// Calls every subscriber, without holding the list's lock while they run (they may
    /// subscribe or unsubscribe).
    fn notify(&self) {
        let list: Vec<_> = lock(&self.subscribers)
            .list
            .iter()
            .map(|(_, on_move)| on_move.clone())
            .collect();
        for on_move in list {
            on_move();
        }
    }
}

impl Default for FakeClock {
    fn default() -> FakeClock {
        FakeClock::new()
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Time {
        *lock(&self.now)
    }

    fn subscribe(&self, on_move: Arc<dyn Fn() + Send + Sync>) -> Option<Subscription> {
        Some(FakeClock::subscribe(self, on_move))
    }
}

/// Keeps a [`FakeClock::subscribe`] function registered; dropping it unregisters the function.
#[must_use = "dropping the subscription unregisters the function at once"]
pub struct Subscription {
    id: u64,
    /// Weak: a subscription must not keep a dropped clock's subscriber list alive.
    subscribers: Weak<Mutex<Subscribers>>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("id", &self.id)
            .finish()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(subscribers) = self.subscribers.upgrade() {
            lock(&subscribers).list.retain(|(id, _)| *id != self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Condvar;
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

    #[test]
    fn time_arithmetic_saturates() {
        let t = Time::from_nanos(-3);
        assert_eq!(t.as_nanos(), -3);
        assert_eq!(t.saturating_add_nanos(10), Time::from_nanos(7));
        assert_eq!(Time::MAX.saturating_add_nanos(1), Time::MAX);
        assert_eq!(
            Time::from_nanos(i64::MIN).saturating_add_nanos(-1),
            Time::from_nanos(i64::MIN)
        );
        assert_eq!(Time::from_nanos(2).nanos_since(Time::from_nanos(7)), -5);
        assert_eq!(Time::from_nanos(i64::MIN).nanos_since(Time::MAX), i64::MIN);
        assert!(Time::from_nanos(1) < Time::from_nanos(2));
        assert_eq!(Time::default(), Time::ZERO);
    }

    #[test]
    fn fake_clock_steps_sets_and_refuses_to_go_back() {
        let clock = FakeClock::new();
        assert_eq!(clock.now(), Time::ZERO);
        assert_eq!(clock.step(0), Ok(Time::ZERO));
        assert_eq!(clock.step(1_500), Ok(Time::from_nanos(1_500)));
        assert_eq!(clock.step(-1), Err(ClockError::NegativeStep(-1)));
        assert_eq!(
            clock.now(),
            Time::from_nanos(1_500),
            "a refused step changes nothing"
        );
        assert_eq!(
            clock.set(Time::from_nanos(1_500)),
            Ok(()),
            "setting the same time is fine"
        );
        assert_eq!(
            clock.set(Time::from_nanos(1_499)),
            Err(ClockError::Backwards {
                now: Time::from_nanos(1_500),
                to: Time::from_nanos(1_499)
            })
        );
        assert_eq!(clock.set(Time::from_nanos(9_000)), Ok(()));
        assert_eq!(clock.step(i64::MAX), Ok(Time::MAX), "steps saturate");
        assert_eq!(clock.step(1), Ok(Time::MAX));
        assert_eq!(
            ClockError::NegativeStep(-1).to_string(),
            "a clock step must be zero or positive, got -1 ns"
        );
    }

    #[test]
    fn subscribers_run_in_order_after_the_move_is_visible() {
        let clock = Arc::new(FakeClock::new());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let subscriptions: Vec<Subscription> = (0..2)
            .map(|who| {
                let (clock_seen, seen) = (Arc::downgrade(&clock), seen.clone());
                clock.subscribe(Arc::new(move || {
                    let now = clock_seen.upgrade().map(|c| c.now().as_nanos());
                    lock(&seen).push((who, now));
                }))
            })
            .collect();
        clock.step(5).unwrap();
        clock.set(Time::from_nanos(8)).unwrap();
        assert!(clock.step(-5).is_err());
        assert!(clock.set(Time::from_nanos(1)).is_err());
        assert_eq!(
            *lock(&seen),
            [(0, Some(5)), (1, Some(5)), (0, Some(8)), (1, Some(8))],
            "refused moves call nobody"
        );
        drop(subscriptions);
        clock.step(1).unwrap();
        assert_eq!(lock(&seen).len(), 4);
    }

    #[test]
    fn a_subscriber_may_unsubscribe_itself_and_subscribe_others() {
        let clock = Arc::new(FakeClock::new());
        let slot: Arc<Mutex<Option<Subscription>>> = Arc::new(Mutex::new(None));
        let added: Arc<Mutex<Vec<Subscription>>> = Arc::new(Mutex::new(Vec::new()));
        let calls = Arc::new(AtomicUsize::new(0));
        let later_calls = Arc::new(AtomicUsize::new(0));
        let subscription = {
            let (slot, added, calls, later_calls) = (
                slot.clone(),
                added.clone(),
                calls.clone(),
                later_calls.clone(),
            );
            let weak = Arc::downgrade(&clock);
            clock.subscribe(Arc::new(move || {
                calls.fetch_add(1, Ordering::Relaxed);
                // Unsubscribe itself (no deadlock: the clock holds no lock while calling).
                drop(lock(&slot).take());
                if let Some(clock) = weak.upgrade() {
                    let later_calls = later_calls.clone();
                    lock(&added).push(clock.subscribe(Arc::new(move || {
                        later_calls.fetch_add(1, Ordering::Relaxed);
                    })));
                }
            }))
        };
        *lock(&slot) = Some(subscription);
        clock.step(1).unwrap();
        clock.step(1).unwrap();
        assert_eq!(
            calls.load(Ordering::Relaxed),
            1,
            "unsubscribed during its first call"
        );
        assert_eq!(
            later_calls.load(Ordering::Relaxed),
            1,
            "subscribed during the first move"
        );
    }

    #[test]
    fn a_subscription_outliving_its_clock_drops_quietly() {
        let clock = FakeClock::new();
        let subscription = clock.subscribe(Arc::new(|| {}));
        drop(clock);
        drop(subscription);
    }

    #[test]
    fn a_subscriber_wakes_a_thread_sleeping_on_real_time() {
        // The delaying layer's pattern: a timer thread waits on its own condition variable
        // for a fake-clock deadline; the subscription wakes it when the clock moves.
        let clock = Arc::new(FakeClock::new());
        let wake = Arc::new((Mutex::new(()), Condvar::new()));
        let _subscription = {
            let wake = wake.clone();
            Clock::subscribe(
                &*clock,
                Arc::new(move || {
                    let _guard = lock(&wake.0);
                    wake.1.notify_all();
                }),
            )
            .expect("a fake clock takes subscribers")
        };
        let woke_at = Arc::new(AtomicI64::new(-1));
        let timer = {
            let (clock, wake, woke_at) = (clock.clone(), wake.clone(), woke_at.clone());
            std::thread::spawn(move || {
                let deadline = Time::from_nanos(1_000);
                let mut guard = lock(&wake.0);
                while clock.now() < deadline {
                    guard = match wake.1.wait(guard) {
                        Ok(guard) => guard,
                        Err(poisoned) => poisoned.into_inner(),
                    };
                }
                woke_at.store(clock.now().as_nanos(), Ordering::Relaxed);
            })
        };
        clock.step(400).unwrap();
        clock.step(600).unwrap();
        timer.join().unwrap();
        assert_eq!(woke_at.load(Ordering::Relaxed), 1_000);
    }

    #[test]
    fn real_clock_is_monotonic_and_takes_no_subscribers() {
        let clock = RealClock::default();
        let mut last = clock.now();
        assert!(last >= Time::ZERO);
        for _ in 0..1_000 {
            let now = clock.now();
            assert!(now >= last);
            last = now;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(clock.now().nanos_since(last) >= 2_000_000);
        assert!(Clock::subscribe(&clock, Arc::new(|| {})).is_none());
    }
}
