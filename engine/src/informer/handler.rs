//! What a handler registration can ask for: how its notifications are delivered (a thread of
//! its own, inline on the consumers, or a tokio task for an async handler), how many may wait
//! for it, and what happens when it lags.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::delta::DeltaObject;

/// How many notifications may wait for one registration by default before the consumers wait
/// for it (back-pressure; see [`HandlerOptions::buffer`]).
///
/// Why 65,536: it is a thousand full consumer batches ([`DEFAULT_BATCH`](super::DEFAULT_BATCH)
/// keys each), so a handler that is only momentarily slow (a pause, a lock it waits for) never
/// slows the informer: at 10,000 events a second that is over six seconds of slack, and a
/// relist of a kind with tens of thousands of objects fits. And it bounds what a stuck handler
/// can hold: a notification is a few dozen bytes, about 2 MiB of buffer, plus the old object
/// versions that its pending updates keep alive — where client-go's unbounded buffer grows
/// until the process runs out of memory.
pub const DEFAULT_HANDLER_BUFFER: usize = 1 << 16;

/// How a registration is delivered to and how much it may lag; given to
/// [`SharedInformer::add_event_handler_with`](super::SharedInformer::add_event_handler_with)
/// and [`add_async_event_handler_with`](super::SharedInformer::add_async_event_handler_with).
///
/// ```
/// use std::time::Duration;
/// use kcache::informer::HandlerOptions;
///
/// let options = HandlerOptions::new()
///     .name("pod-metrics")
///     .buffer(1024)
///     .resync_period(Duration::from_secs(30));
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default)]
pub struct HandlerOptions {
    pub(crate) name: Option<String>,
    pub(crate) resync_period: Option<Duration>,
    pub(crate) buffer: Option<usize>,
    pub(crate) inline: bool,
    pub(crate) coalesce: bool,
}

impl HandlerOptions {
    /// Delivery on a thread of its own, the informer's default resync period and buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// A name for the lag report and `Debug` (default `handler-{id}`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The handler's own resync period (client-go's `AddEventHandlerWithResyncPeriod`; see
    /// [`SharedInformer::add_event_handler_with_resync`](super::SharedInformer::add_event_handler_with_resync)).
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync_period = Some(period);
        self
    }

    /// The most notifications that may wait for this handler (at least 1; default: the
    /// builder's [`handler_buffer`](super::SharedInformerBuilder::handler_buffer),
    /// [`DEFAULT_HANDLER_BUFFER`] unless set). A consumer that would exceed it waits until the
    /// handler has caught up with a batch. Ignored by inline delivery, which has no buffer.
    pub fn buffer(mut self, notifications: usize) -> Self {
        self.buffer = Some(notifications.max(1));
        self
    }

    /// Runs the handler on the consumer threads, right after each batch is applied to the
    /// store, instead of on a thread of its own (what kube-rs does with every handler). For
    /// cheap handlers only: while it runs, no consumer hands a batch to anyone. Its calls are
    /// serialised (one at a time, whatever the consumer count) and each key's stay in order.
    /// It must not add or remove handlers of the same informer (that would wait for itself).
    pub fn inline(mut self) -> Self {
        self.inline = true;
        self
    }

    /// Deliver each key's latest state: notifications waiting for this handler are merged,
    /// one pending change per key, so a handler slower than the informer neither holds the
    /// consumers back nor grows memory beyond one entry per key. Its delivery takes in what
    /// arrived between any two calls, so its buffer drains as fast as it fills and the
    /// consumers wait only if even that falls behind.
    ///
    /// The handler hears, per key and in order, a subsequence of what it would have heard that
    /// ends in the key's latest state: an update's `old` is always the state it last heard; a
    /// key deleted and re-added is heard as a deletion, then an add; a key added and deleted
    /// unheard is not heard at all. Keys come in the order of their first pending change. For
    /// level-triggered handlers (a controller that enqueues keys): what a relist already gives
    /// them. The default delivers every notification (client-go's contract) and back-pressures
    /// the informer when the handler falls a buffer behind. Ignored by inline delivery.
    pub fn coalesce(mut self) -> Self {
        self.coalesce = true;
        self
    }
}

/// A registration's buffer hit its bound: reported once per episode (until the buffer has
/// caught up: drained, with no consumer waiting), through the builder's
/// [`lag_handler`](super::SharedInformerBuilder::lag_handler).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lag {
    /// The registration's id ([`Registration::id`](super::Registration::id)).
    pub id: u64,
    /// Its name ([`HandlerOptions::name`], or `handler-{id}`).
    pub name: String,
    /// Notifications waiting for it.
    pub pending: usize,
    /// Its bound.
    pub bound: usize,
    /// Whether it coalesces per key ([`HandlerOptions::coalesce`]): then even merging what
    /// arrives falls behind.
    pub coalescing: bool,
}

impl fmt::Display for Lag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let coalescing = if self.coalescing {
            " (it coalesces per key, and cannot even take in what arrives)"
        } else {
            ""
        };
        write!(
            f,
            "kcache: handler {} lags: {} notifications pending, at its bound of {}; \
             the informer's consumers wait for it{coalescing}",
            self.name, self.pending, self.bound
        )
    }
}

/// Called when a registration starts lagging; see [`Lag`].
pub type LagHandler = Arc<dyn Fn(&Lag) + Send + Sync>;

/// The default lag handler: one line on stderr (the engine has no logging dependency).
pub(crate) fn stderr_lag_handler() -> LagHandler {
    Arc::new(|lag: &Lag| eprintln!("{lag}"))
}

/// A handler whose calls are async, run as one tokio task per registration on the informer's
/// runtime ([`SharedInformer::add_async_event_handler`](super::SharedInformer::add_async_event_handler)).
/// Its calls are awaited one at a time, in order, and get owned values so their futures
/// borrow only the handler. Write the methods as `async fn`:
///
/// ```
/// use std::sync::Arc;
/// use kcache::informer::AsyncEventHandler;
///
/// struct Notify(tokio::sync::mpsc::Sender<String>);
/// impl AsyncEventHandler<String> for Notify {
///     async fn on_add(&mut self, obj: Arc<String>, _initial: bool) {
///         let _ = self.0.send(obj.to_string()).await;
///     }
/// }
/// ```
pub trait AsyncEventHandler<T> {
    /// A key appeared in the store. `is_in_initial_list` is true for objects of the first list.
    fn on_add(&mut self, obj: Arc<T>, is_in_initial_list: bool) -> impl Future<Output = ()> + Send {
        let _ = (obj, is_in_initial_list);
        async {}
    }

    /// A stored key got a new state (also on resync, where `old` and `new` may be the same).
    fn on_update(&mut self, old: Arc<T>, new: Arc<T>) -> impl Future<Output = ()> + Send {
        let _ = (old, new);
        async {}
    }

    /// A key was deleted; the payload may be a tombstone.
    fn on_delete(&mut self, obj: DeltaObject<T>) -> impl Future<Output = ()> + Send {
        let _ = obj;
        async {}
    }
}
