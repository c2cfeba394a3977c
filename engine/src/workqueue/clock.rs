//! The workqueue's injectable clock: every time-dependent part of the workqueue (the delaying
//! layer's ready times, the token bucket's refill, the metrics' durations) reads one [`Clock`],
//! so tests and traces run on a [`FakeClock`] that only moves when told to.
//!
//! Durations are [`std::time::Duration`]s; a [`Time`] is a point on the clock's line, the
//! `Duration` since its origin. Arithmetic saturates at [`Time::MAX`] instead of overflowing.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::sync::{lock, Mutex};

/// A point on a monotonic clock: how long after the clock's origin.
///
/// Adding a duration saturates at [`Time::MAX`], as Go's `time.Time.Add` does at its ends, so
/// "now plus [`NEVER`](super::NEVER)" is [`Time::MAX`], a time no clock reaches: an item ready
/// then is never added.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(Duration);

impl Time {
    /// The clock's origin: where [`RealClock`] and [`FakeClock`] start.
    pub const ZERO: Time = Time(Duration::ZERO);
    /// The end of the line, "never": what a delay of [`NEVER`](super::NEVER) makes of any time.
    pub const MAX: Time = Time(Duration::MAX);

    /// The time `since_origin` after the origin.
    ///
    /// ```
    /// use std::time::Duration;
    /// use kcache::workqueue::Time;
    /// let t = Time::after_origin(Duration::from_nanos(5));
    /// assert_eq!(t.since_origin(), Duration::from_nanos(5));
    /// ```
    pub const fn after_origin(since_origin: Duration) -> Time {
        Time(since_origin)
    }

    /// How long after the origin.
    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// The time `delay` later, saturating at [`Time::MAX`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use kcache::workqueue::{Time, NEVER};
    /// let t = Time::after_origin(Duration::from_millis(1));
    /// assert_eq!(t.saturating_add(Duration::from_millis(2)).since_origin(), Duration::from_millis(3));
    /// assert_eq!(t.saturating_add(NEVER), Time::MAX);
    /// ```
    pub fn saturating_add(self, delay: Duration) -> Time {
        self.0.checked_add(delay).map_or(Time::MAX, Time)
    }

    /// How long from `earlier` to `self`; zero when `earlier` is later (Go's `t.Sub(earlier)`
    /// clamped at zero, which is all the workqueue needs of it).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kcache::workqueue::Time;
    /// let (a, b) = (Time::after_origin(Duration::from_nanos(4)), Time::after_origin(Duration::from_nanos(9)));
    /// assert_eq!(b.saturating_duration_since(a), Duration::from_nanos(5));
    /// assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
    /// ```
    pub fn saturating_duration_since(self, earlier: Time) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

/// A monotonic source of [`Time`].
///
/// A waiter that needs to act at a future time (the delaying layer's timer) asks
/// [`Clock::subscribe`] how the clock moves:
///
/// - `None` (the default, [`RealClock`]): the clock advances by itself with real time; sleep
///   for the remaining time, with a timeout on the waiter's own condition variable.
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
        Time(self.origin.elapsed())
    }
}

/// A move of a [`FakeClock`] that was refused because it would go back in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ClockError {
    /// [`FakeClock::set`] was given a time before the current one.
    #[error("a monotonic clock can't go back from {:?} to {:?}", now.since_origin(), to.since_origin())]
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
/// use std::time::Duration;
/// use kcache::workqueue::{Clock, FakeClock, Time};
///
/// let ms = Duration::from_millis;
/// let clock = FakeClock::new();
/// let moves = Arc::new(AtomicUsize::new(0));
/// let counter = moves.clone();
/// let subscription = clock.subscribe(Arc::new(move || {
///     counter.fetch_add(1, Ordering::Relaxed);
/// }));
/// assert_eq!(clock.step(ms(5)), Time::after_origin(ms(5)));
/// clock.set(Time::after_origin(ms(7))).unwrap();
/// assert!(clock.set(Time::ZERO).is_err(), "going back is refused and changes nothing");
/// assert_eq!(clock.now(), Time::after_origin(ms(7)));
/// assert_eq!(moves.load(Ordering::Relaxed), 2);
/// drop(subscription);
/// clock.step(ms(1));
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

    /// Advances the clock by `by` (saturating at [`Time::MAX`]) and returns the new time. A
    /// step of zero is a move too: subscribers are called.
    pub fn step(&self, by: Duration) -> Time {
        let now = {
            let mut now = lock(&self.now);
            *now = now.saturating_add(by);
            *now
        };
        self.notify();
        now
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
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

    fn ns(nanos: u64) -> Duration {
        Duration::from_nanos(nanos)
    }

    fn at(nanos: u64) -> Time {
        Time::after_origin(ns(nanos))
    }

    #[test]
    fn time_arithmetic_saturates() {
        let t = at(3);
        assert_eq!(t.since_origin(), ns(3));
        assert_eq!(t.saturating_add(ns(10)), at(13));
        assert_eq!(Time::MAX.saturating_add(ns(1)), Time::MAX);
        assert_eq!(at(1).saturating_add(Duration::MAX), Time::MAX);
        assert_eq!(at(2).saturating_duration_since(at(7)), Duration::ZERO);
        assert_eq!(
            Time::MAX.saturating_duration_since(Time::ZERO),
            Duration::MAX
        );
        assert!(at(1) < at(2));
        assert_eq!(Time::default(), Time::ZERO);
    }

    #[test]
    fn fake_clock_steps_sets_and_refuses_to_go_back() {
        let clock = FakeClock::new();
        assert_eq!(clock.now(), Time::ZERO);
        assert_eq!(clock.step(Duration::ZERO), Time::ZERO);
        assert_eq!(clock.step(ns(1_500)), at(1_500));
        assert_eq!(
            clock.set(at(1_500)),
            Ok(()),
            "setting the same time is fine"
        );
        assert_eq!(
            clock.set(at(1_499)),
            Err(ClockError::Backwards {
                now: at(1_500),
                to: at(1_499)
            })
        );
        assert_eq!(clock.now(), at(1_500), "a refused set changes nothing");
        assert_eq!(clock.set(at(9_000)), Ok(()));
        assert_eq!(clock.step(Duration::MAX), Time::MAX, "steps saturate");
        assert_eq!(clock.step(ns(1)), Time::MAX);
        assert_eq!(
            ClockError::Backwards {
                now: at(1_500),
                to: at(1_499)
            }
            .to_string(),
            "a monotonic clock can't go back from 1.5µs to 1.499µs"
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
                    let now = clock_seen.upgrade().map(|c| c.now().since_origin());
                    lock(&seen).push((who, now));
                }))
            })
            .collect();
        clock.step(ns(5));
        clock.set(at(8)).unwrap();
        assert!(clock.set(at(1)).is_err());
        let (five, eight) = (Some(ns(5)), Some(ns(8)));
        assert_eq!(
            *lock(&seen),
            [(0, five), (1, five), (0, eight), (1, eight)],
            "refused moves call nobody"
        );
        drop(subscriptions);
        clock.step(ns(1));
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
        clock.step(ns(1));
        clock.step(ns(1));
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
        let woke_at = Arc::new(AtomicU64::new(0));
        let timer = {
            let (clock, wake, woke_at) = (clock.clone(), wake.clone(), woke_at.clone());
            std::thread::spawn(move || {
                let deadline = at(1_000);
                let mut guard = lock(&wake.0);
                while clock.now() < deadline {
                    guard = match wake.1.wait(guard) {
                        Ok(guard) => guard,
                        Err(poisoned) => poisoned.into_inner(),
                    };
                }
                let now = clock.now().since_origin();
                woke_at.store(now.as_nanos() as u64, Ordering::Relaxed);
            })
        };
        clock.step(ns(400));
        clock.step(ns(600));
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
        // A lower bound, measured from `last`, which was read before the sleep began.
        std::thread::sleep(Duration::from_millis(2));
        assert!(clock.now().saturating_duration_since(last) >= Duration::from_millis(2));
        assert!(Clock::subscribe(&clock, Arc::new(|| {})).is_none());
    }
}
