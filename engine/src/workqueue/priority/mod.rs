//! Priority work queues: controller-runtime's `priorityqueue`, whose keys carry a priority so
//! that live changes are not stuck behind the thousands of keys an informer's initial list or
//! resync enqueues.
//!
//! # The rules
//!
//! A key is added with [`AddOpts`]: a delay (`after`), whether to ask the rate limiter
//! (`rate_limited`), and a priority (none means [`DEFAULT_PRIORITY`], 0; handlers use
//! [`LOW_PRIORITY`], -100, for keys that need no work). Higher priorities are handed out first,
//! first-in first-out within one priority.
//!
//! - **The delay**: `after`; with `rate_limited`, the limiter's delay replaces it when `after`
//!   is zero or the limiter's is shorter. A key with a delay waits until `now + delay`.
//! - **One entry per key**: a key that is queued (ready or waiting) and added again keeps its
//!   entry, with the *higher* priority and the *earlier* ready time. It moves to the back of
//!   its level only if its priority rose; otherwise it keeps its place, also when a waiting
//!   entry is made ready by the add (so it may go before keys added while it waited).
//! - **The clock**: a waiting entry whose time comes takes its place at the back of its level
//!   at that moment; entries due at the same moment are placed in order of ready time, then
//!   priority, then their order of addition.
//! - **One worker per key**: `get` hands out the first ready entry whose key is not being
//!   processed. A key added while it is processed gets a new entry at once, placed by that add
//!   (unlike client-go's queue, which re-queues it at `done`), and `get` skips it until `done`.
//!   [`len`](super::WorkQueue::len) counts ready entries, such a one included, so `len` can be
//!   1 while `get` would block; waiting entries are not counted.
//! - **Shut-down**: `get` answers [`ShutDown`](super::ShutDown) at once, even with ready
//!   entries left; adds are ignored (a rate-limited add does not ask the limiter); the clock
//!   makes nothing ready any more. `shut_down_with_drain` also waits for the keys being
//!   processed to be done (controller-runtime's does not wait); a second shut-down does nothing.
//!
//! Two queues implement [`PriorityWorkQueue`] (and [`WorkQueue`](super::WorkQueue), whose
//! `add` is an add at the default priority):
//!
//! - [`ReferencePriorityQueue`]: controller-runtime's queue ported faithfully, one lock over
//!   one ordered set; the yardstick.
//! - [`ShardedPriorityQueue`]: the same rules per key, keys split over shards by hash. Across
//!   shards the order *within* a priority is relaxed, but a ready entry of a higher priority is
//!   never overtaken by one of a lower priority.
//!
//! Two ordering rules are kcache's own, opt-in through [`PriorityOptions`] (off, the order is
//! controller-runtime's exactly):
//!
//! - **Aging** ([`PriorityOptions::max_wait`]): an entry that has been ready for `max_wait` is
//!   *overdue* and goes before every entry that is not, oldest first; so no ready key waits
//!   behind higher priorities for longer than `max_wait`.
//! - **Fairness** ([`PriorityOptions::fair`]): keys carry a group (the namespace by default);
//!   within one priority, groups are served round robin, so a group with one key among a
//!   thousand of another's is served within a turn.
//!
//! The exact rules are in `docs/workqueue.md` ("Aging", "Fairness").
//!
//! Metrics are client-go's workqueue metrics with the depth per priority
//! ([`DepthWithPriorityMetric`](super::DepthWithPriorityMetric)).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use kcache::Key;
//! use kcache::workqueue::{FakeClock, QueueConfig, TryGet, WorkQueue};
//! use kcache::workqueue::priority::{AddOpts, PriorityWorkQueue, ReferencePriorityQueue, LOW_PRIORITY};
//!
//! let clock = Arc::new(FakeClock::new());
//! let q = ReferencePriorityQueue::with_config(&QueueConfig::new().clock(clock.clone()));
//! // The initial list: every key at low priority.
//! for name in ["ns/a", "ns/b", "ns/c"] {
//!     q.add_with_opts(AddOpts::new().priority(LOW_PRIORITY), Key::new(name));
//! }
//! // A live change goes first; a retry waits for its delay.
//! q.add(Key::new("ns/live"));
//! q.add_after(Key::new("ns/retry"), Duration::from_millis(10));
//! assert_eq!(q.try_get(), TryGet::Item(Key::new("ns/live")));
//! assert_eq!(q.try_get(), TryGet::Item(Key::new("ns/a")));
//! clock.step(Duration::from_millis(10));
//! assert_eq!(q.try_get(), TryGet::Item(Key::new("ns/retry")), "priority 0 before -100");
//! ```

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::key::Key;
use crate::sync::AtomicU64;

use super::clock::Clock;
use super::limiter::{ExponentialFailureRateLimiter, RateLimiter};
use super::metrics::QueueConfig;
use super::queue::{ShutDown, WaitSlot, WorkQueue};

/// The `PriorityWorkQueue` methods both queues answer alike, from their `shared` part's rate
/// limiter, clock and overdue count (invoked inside each `impl PriorityWorkQueue`).
macro_rules! limiter_bookkeeping {
    () => {
        fn forget(&self, key: &Key) {
            self.shared.book.limiter.forget(key);
        }

        fn num_requeues(&self, key: &Key) -> u64 {
            self.shared.book.limiter.num_requeues(key)
        }

        fn when(&self, key: &Key) -> Duration {
            self.shared
                .book
                .limiter
                .when(key, self.shared.book.clock.now())
        }

        fn overdue_handouts(&self) -> u64 {
            self.shared.book.overdue.load(Ordering::Relaxed)
        }
    };
}

/// A priority queue's `WorkQueue` add and gets: its priority ones, adding at the default
/// priority and handing out the key without its priority (invoked inside each
/// `impl WorkQueue`).
macro_rules! gets_without_priority {
    () => {
        fn add(&self, item: Key) {
            self.add_with_opts(AddOpts::new(), item);
        }

        fn get(&self) -> Result<Key, ShutDown> {
            self.get_with_priority().map(|(key, _)| key)
        }

        fn try_get(&self) -> TryGet {
            match self.try_get_with_priority() {
                TryGetWithPriority::Item(key, _) => TryGet::Item(key),
                TryGetWithPriority::Empty => TryGet::Empty,
                TryGetWithPriority::ShutDown => TryGet::ShutDown,
            }
        }

        fn poll_get(
            &self,
            slot: &mut WaitSlot,
            cx: &mut Context<'_>,
        ) -> Poll<Result<Key, ShutDown>> {
            self.poll_get_with_priority(slot, cx)
                .map(|r| r.map(|(key, _)| key))
        }
    };
}

mod entries;
mod metrics;
mod reference;
mod sharded;
mod timer;

pub use reference::ReferencePriorityQueue;
pub use sharded::ShardedPriorityQueue;

/// What both queues keep the same way beside their entries and waiters.
struct Bookkeeping {
    clock: Arc<dyn Clock>,
    limiter: Box<dyn RateLimiter<Key>>,
    metrics: Option<PriorityMetrics>,
    options: PriorityOptions,
    /// Keys handed out overdue; a statistic, read alone (Relaxed throughout).
    overdue: AtomicU64,
}

impl Bookkeeping {
    fn new(
        config: &QueueConfig,
        limiter: Box<dyn RateLimiter<Key>>,
        options: PriorityOptions,
    ) -> Self {
        Self {
            clock: Arc::clone(config.get_clock()),
            limiter,
            metrics: PriorityMetrics::from_config(config),
            options,
            overdue: AtomicU64::new(0),
        }
    }
}

use entries::Scheduling;
use metrics::PriorityMetrics;

/// A key's priority: higher is handed out first (Go's `int` in controller-runtime).
pub type Priority = i32;

/// The priority of an add that gives none.
pub const DEFAULT_PRIORITY: Priority = 0;

/// The priority controller-runtime's handlers give keys that likely need no work: objects of
/// the initial list and resyncs (updates whose old and new resource versions are equal).
pub const LOW_PRIORITY: Priority = -100;

/// How to add a key (controller-runtime `AddOpts`).
///
/// ```
/// use std::time::Duration;
/// use kcache::workqueue::priority::{AddOpts, LOW_PRIORITY};
/// let opts = AddOpts::new().priority(LOW_PRIORITY).after(Duration::from_secs(1));
/// assert_eq!(opts.priority, Some(LOW_PRIORITY));
/// assert!(!opts.rate_limited);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddOpts {
    /// Wait this long before the key is ready (zero: ready now).
    pub after: Duration,
    /// Ask the queue's rate limiter for the delay; it replaces `after` when `after` is zero or
    /// the limiter's delay is shorter.
    pub rate_limited: bool,
    /// The key's priority; `None` is [`DEFAULT_PRIORITY`].
    pub priority: Option<Priority>,
}

impl AddOpts {
    /// No delay, no rate limiting, the default priority.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `after`.
    pub fn after(mut self, delay: Duration) -> Self {
        self.after = delay;
        self
    }

    /// Sets `rate_limited`.
    pub fn rate_limited(mut self) -> Self {
        self.rate_limited = true;
        self
    }

    /// Sets the priority.
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = Some(priority);
        self
    }

    /// The delay this add asks for; `limiter_delay` is called only when rate limited.
    pub(crate) fn delay(&self, limiter_delay: impl FnOnce() -> Duration) -> Duration {
        if !self.rate_limited {
            return self.after;
        }
        let limited = limiter_delay();
        if self.after.is_zero() || limited < self.after {
            limited
        } else {
            self.after
        }
    }
}

/// A key's group for fairness: keys of one group share the turns of their priority level.
pub type GroupFn = Arc<dyn Fn(&Key) -> Key + Send + Sync>;

/// The default group: the namespace, i.e. the part of the key before its first `/` (the empty
/// group for a cluster-scoped key, which has no `/`).
///
/// ```
/// use kcache::Key;
/// use kcache::workqueue::priority::namespace_group;
/// assert_eq!(namespace_group(&Key::new("team-a/web-0")).as_str(), "team-a");
/// assert_eq!(namespace_group(&Key::new("node-1")).as_str(), "");
/// ```
pub fn namespace_group(key: &Key) -> Key {
    Key::new(key.as_str().split_once('/').map_or("", |(ns, _)| ns))
}

/// kcache's opt-in ordering rules for the priority queues (none by default: the order is
/// controller-runtime's).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use kcache::Key;
/// use kcache::workqueue::{FakeClock, QueueConfig, TryGet, WorkQueue};
/// use kcache::workqueue::priority::{
///     default_priority_rate_limiter, AddOpts, PriorityOptions, PriorityWorkQueue,
///     ReferencePriorityQueue, LOW_PRIORITY,
/// };
///
/// let clock = Arc::new(FakeClock::new());
/// let q = ReferencePriorityQueue::with_options(
///     &QueueConfig::new().clock(clock.clone()),
///     default_priority_rate_limiter(),
///     PriorityOptions::new().max_wait(Duration::from_secs(10)),
/// );
/// q.add_with_opts(AddOpts::new().priority(LOW_PRIORITY), Key::new("ns/resync"));
/// clock.step(Duration::from_secs(10));
/// q.add(Key::new("ns/live"));
/// // Ready for 10 s: overdue, so it goes before the live change.
/// assert_eq!(q.try_get(), TryGet::Item(Key::new("ns/resync")));
/// assert_eq!(q.overdue_handouts(), 1);
/// ```
#[derive(Clone, Default)]
pub struct PriorityOptions {
    max_wait: Option<Duration>,
    group: Option<GroupFn>,
}

impl PriorityOptions {
    /// No aging, no fairness.
    pub fn new() -> Self {
        Self::default()
    }

    /// Aging: an entry ready since at least `max_wait` is overdue and goes before every entry
    /// that is not, oldest first (docs/workqueue.md, "Aging").
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// Fairness by namespace ([`namespace_group`]): within a priority, namespaces are served
    /// round robin (docs/workqueue.md, "Fairness").
    pub fn fair(self) -> Self {
        self.fair_by(namespace_group)
    }

    /// Fairness by `group`: within a priority, groups are served round robin. `group` is
    /// called once per add, outside the queue's locks; it must return the same group for the
    /// same key every time.
    pub fn fair_by(mut self, group: impl Fn(&Key) -> Key + Send + Sync + 'static) -> Self {
        self.group = Some(Arc::new(group));
        self
    }

    pub(crate) fn scheduling(&self) -> Scheduling {
        Scheduling {
            max_wait: self.max_wait,
            fair: self.group.is_some(),
        }
    }

    /// `key`'s group, with fairness on.
    pub(crate) fn group_of(&self, key: &Key) -> Option<Key> {
        self.group.as_ref().map(|group| group(key))
    }
}

impl fmt::Debug for PriorityOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PriorityOptions")
            .field("max_wait", &self.max_wait)
            .field("fair", &self.group.is_some())
            .finish()
    }
}

/// What [`PriorityWorkQueue::try_get_with_priority`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TryGetWithPriority {
    /// A key and the priority it was handed out at; call `done` when finished with it.
    Item(Key, Priority),
    /// No ready entry of a key that is not being processed: `get` would block.
    Empty,
    /// The queue is shut down: `get` returns [`ShutDown`].
    ShutDown,
}

/// controller-runtime's `PriorityQueue` over [`Key`]s: a [`WorkQueue`] (whose `add` adds at the
/// default priority) with options on add, the rate limiter's bookkeeping, and gets that tell
/// the priority.
pub trait PriorityWorkQueue: WorkQueue {
    /// Adds `key` with `opts` (controller-runtime `AddWithOpts`). Nothing after shut-down.
    fn add_with_opts(&self, opts: AddOpts, key: Key);

    /// Adds `key` once `delay` has passed, at the default priority.
    fn add_after(&self, key: Key, delay: Duration) {
        self.add_with_opts(AddOpts::new().after(delay), key);
    }

    /// Adds `key` after the rate limiter's delay for it, at the default priority.
    fn add_rate_limited(&self, key: Key) {
        self.add_with_opts(AddOpts::new().rate_limited(), key);
    }

    /// Forgets `key`'s failures in the rate limiter.
    fn forget(&self, key: &Key);

    /// How many times the rate limiter counted `key` since it was last forgotten.
    fn num_requeues(&self, key: &Key) -> u64;

    /// The rate limiter's delay for `key` now, counted as one more failure: what a
    /// rate-limited add would ask (trace replays call it directly).
    fn when(&self, key: &Key) -> Duration;

    /// Blocks until a key is ready and not being processed, and hands it out with its
    /// priority; [`ShutDown`] once the queue is shut down.
    fn get_with_priority(&self) -> Result<(Key, Priority), ShutDown>;

    /// `get_with_priority` if it would not block.
    fn try_get_with_priority(&self) -> TryGetWithPriority;

    /// One poll of an async `get` that tells the priority; the contract of
    /// [`WorkQueue::poll_get`] (the same `slot` on every poll; `cancel_get` if abandoned).
    fn poll_get_with_priority(
        &self,
        slot: &mut WaitSlot,
        cx: &mut Context<'_>,
    ) -> Poll<Result<(Key, Priority), ShutDown>>;

    /// How many entries wait for their ready time.
    fn waiting_len(&self) -> usize;

    /// How many keys were handed out because aging made them overdue
    /// ([`PriorityOptions::max_wait`]): how often aging changed the order. Always 0 without
    /// aging.
    fn overdue_handouts(&self) -> u64 {
        0
    }
}

/// The rate limiter controller-runtime's priority queue uses by default: per-key exponential
/// backoff from 5 ms to 1000 s.
pub fn default_priority_rate_limiter() -> Box<dyn RateLimiter<Key>> {
    Box::new(ExponentialFailureRateLimiter::new(
        Duration::from_millis(5),
        Duration::from_secs(1000),
    ))
}
