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
