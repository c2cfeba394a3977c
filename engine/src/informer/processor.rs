//! The shared processor: fans a shared informer's notifications out to its handler
//! registrations (client-go's `sharedProcessor` and `processorListener`).
//!
//! # Design
//!
//! Each registration owns an unbounded channel and one delivery thread that calls its handler,
//! so a slow handler delays only itself: the consumers that distribute never wait for a handler,
//! and a handler's backlog grows in its own buffer. Notifications of one key are sent by one
//! consumer at a time (the queue hands a key to one consumer until it is done), so each
//! registration receives them in order.
//!
//! Handlers are synchronous ([`EventHandler`] takes `&mut self`) and may block or burn CPU, so
//! they run on threads of their own rather than on an async runtime's workers.
//!
//! The listener list is behind a read-write lock. Consumers hold it shared while they apply a
//! batch of keys to the store and distribute its notifications; adding a registration after the
//! start holds it exclusively while it sends the synthetic `on_add`s of the store's content, so
//! the new handler sees every key exactly once: in the snapshot, or in a later notification,
//! never both and never neither (client-go's `blockDeltas`).

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::time::Instant;

use super::lister_watcher::Versioned;
use crate::consumer::EventHandler;
use crate::delta::DeltaObject;

/// client-go's `minimumResyncPeriod`: a handler cannot ask to resync more often.
pub const MINIMUM_RESYNC_PERIOD: Duration = Duration::from_secs(1);

/// How often the async `wait_*` methods look again (client-go's `WaitForCacheSync` polls
/// every 100 ms).
const POLL: Duration = Duration::from_millis(5);

/// Registration ids, unique across informers, so a registration given to the wrong informer's
/// `remove_event_handler` removes nothing there.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// One notification for one handler.
enum Notification<T> {
    Add { obj: Arc<T>, initial: bool },
    Update { old: Arc<T>, new: Arc<T> },
    Delete(DeltaObject<T>),
}

/// What a registration and its delivery thread share.
#[derive(Debug, Default)]
struct Shared {
    /// Initial-list notifications sent but not yet delivered (client-go's `synctrack`).
    initial_pending: AtomicUsize,
    /// Notifications sent but not yet delivered.
    queued: AtomicUsize,
    delivered: AtomicU64,
    /// Handler calls that panicked (the delivery thread goes on).
    panics: AtomicU64,
    /// Removed: the delivery thread drops what is left and stops.
    removed: AtomicBool,
    /// The delivery thread has stopped.
    finished: AtomicBool,
}

/// The resync schedule of one registration.
#[derive(Debug)]
struct Resync {
    /// What the handler asked for.
    requested: Duration,
    /// What it gets: `requested`, raised to the informer's check period (0: never).
    period: Duration,
    next: Instant,
}

/// A registration as the processor holds it.
struct Listener<T> {
    id: u64,
    tx: mpsc::Sender<Notification<T>>,
    shared: Arc<Shared>,
    resync: Mutex<Resync>,
    /// Due in the resync under way: `Sync` updates go only to such listeners.
    syncing: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl<T> Listener<T> {
    fn send(&self, notification: Notification<T>) {
        let initial = matches!(notification, Notification::Add { initial: true, .. });
        if initial {
            self.shared.initial_pending.fetch_add(1, Ordering::Relaxed);
        }
        self.shared.queued.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(notification).is_err() {
            // The delivery thread is gone (removed): nobody will deliver it.
            if initial {
                self.shared.initial_pending.fetch_sub(1, Ordering::Relaxed);
            }
            self.shared.queued.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A handler's registration with a shared informer (client-go's
/// `ResourceEventHandlerRegistration`): its own sync state, backlog, and removal.
pub struct Registration {
    id: u64,
    shared: Arc<Shared>,
    upstream_synced: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.id)
            .field("has_synced", &self.has_synced())
            .field("shared", &self.shared)
            .finish()
    }
}

impl Registration {
    /// The informer has synced and this handler has been given every notification of the
    /// initial list (or, if added after the start, of the store's content then).
    pub fn has_synced(&self) -> bool {
        // Upstream first: once it is true, every initial notification was sent (a key counts
        // as processed only after its notifications went out), so `initial_pending` counts
        // them all. Acquire pairs with the delivery thread's Release decrement.
        (self.upstream_synced)() && self.shared.initial_pending.load(Ordering::Acquire) == 0
    }

    /// Completes once [`has_synced`](Self::has_synced) is true.
    pub async fn wait_for_sync(&self) {
        while !self.has_synced() {
            tokio::time::sleep(POLL).await;
        }
    }

    /// Notifications waiting for this handler.
    pub fn pending(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// Handler calls made so far.
    pub fn delivered(&self) -> u64 {
        self.shared.delivered.load(Ordering::Acquire)
    }

    /// Handler calls that panicked (the delivery went on with the next notification).
    pub fn panics(&self) -> u64 {
        self.shared.panics.load(Ordering::Relaxed)
    }

    /// Whether the delivery thread has stopped (after removal or the informer's shutdown).
    pub fn is_stopped(&self) -> bool {
        self.shared.finished.load(Ordering::Acquire)
    }

    /// Completes once the delivery thread has stopped.
    pub async fn stopped(&self) {
        while !self.is_stopped() {
            tokio::time::sleep(POLL).await;
        }
    }

    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

/// The handler registrations of one informer.
pub(crate) struct Processor<T> {
    listeners: RwLock<Vec<Arc<Listener<T>>>>,
    upstream_synced: Arc<dyn Fn() -> bool + Send + Sync>,
}

/// The listeners, held shared while a consumer distributes a batch.
pub(crate) struct Distributor<'a, T> {
    listeners: RwLockReadGuard<'a, Vec<Arc<Listener<T>>>>,
}

impl<T: Versioned> EventHandler<T> for Distributor<'_, T> {
    fn on_add(&mut self, obj: &Arc<T>, is_in_initial_list: bool) {
        for listener in self.listeners.iter() {
            listener.send(Notification::Add {
                obj: Arc::clone(obj),
                initial: is_in_initial_list,
            });
        }
    }

    fn on_update(&mut self, old: &Arc<T>, new: &Arc<T>) {
        // Same version: nothing changed, this is a resync (or a relist of an unchanged
        // object), and it goes only to the handlers whose resync is due.
        let is_sync = old.resource_version() == new.resource_version();
        for listener in self.listeners.iter() {
            // Relaxed: `should_resync` set the flag before it asked the queue to resync, and
            // the queue's locks order that before this pop of the resulting `Sync` delta.
            if !is_sync || listener.syncing.load(Ordering::Relaxed) {
                listener.send(Notification::Update {
                    old: Arc::clone(old),
                    new: Arc::clone(new),
                });
            }
        }
    }

    fn on_delete(&mut self, obj: &DeltaObject<T>) {
        for listener in self.listeners.iter() {
            listener.send(Notification::Delete(obj.clone()));
        }
    }
}

/// client-go's `determineResyncPeriod`: a handler's period, given the informer's check period.
pub(crate) fn effective_resync_period(requested: Duration, check: Duration) -> Duration {
    if requested.is_zero() || check.is_zero() {
        Duration::ZERO
    } else {
        requested.max(check)
    }
}

impl<T: Send + Sync + 'static> Processor<T> {
    pub(crate) fn new(upstream_synced: Arc<dyn Fn() -> bool + Send + Sync>) -> Self {
        Self {
            listeners: RwLock::new(Vec::new()),
            upstream_synced,
        }
    }

    /// Holds the listener list shared; notifications go through the returned handler.
    pub(crate) fn distributor(&self) -> Distributor<'_, T> {
        Distributor {
            listeners: self.listeners.read().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Registers `handler` with its own delivery thread. Under the exclusive lock, `initial()`
    /// gives the objects it first gets a synthetic `on_add(obj, true)` for.
    pub(crate) fn add<H>(
        &self,
        handler: H,
        requested: Duration,
        period: Duration,
        initial: impl FnOnce() -> Vec<Arc<T>>,
    ) -> std::io::Result<Registration>
    where
        H: EventHandler<T> + Send + 'static,
    {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(Shared::default());
        let (tx, rx) = mpsc::channel();
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("kcache-handler-{id}"))
                .spawn(move || deliver(rx, handler, &shared))?
        };
        let listener = Arc::new(Listener {
            id,
            tx,
            shared: Arc::clone(&shared),
            resync: Mutex::new(Resync {
                requested,
                period,
                next: Instant::now() + period,
            }),
            syncing: AtomicBool::new(false),
            thread: Mutex::new(Some(thread)),
        });
        let mut listeners = self.listeners.write().unwrap_or_else(|e| e.into_inner());
        for obj in initial() {
            listener.send(Notification::Add { obj, initial: true });
        }
        listeners.push(listener);
        drop(listeners);
        Ok(Registration {
            id,
            shared,
            upstream_synced: Arc::clone(&self.upstream_synced),
        })
    }
}

impl<T> Processor<T> {
    /// Removes a registration: its delivery thread drops what it has not delivered yet and
    /// stops. Returns false if it was not registered (removed already, or another informer's).
    pub(crate) fn remove(&self, id: u64) -> bool {
        let mut listeners = self.listeners.write().unwrap_or_else(|e| e.into_inner());
        let Some(at) = listeners.iter().position(|l| l.id == id) else {
            return false;
        };
        let listener = listeners.remove(at);
        // Release pairs with the Acquire in `deliver`: it stops before the next call.
        listener.shared.removed.store(true, Ordering::Release);
        true
    }

    /// Unregisters everything; each delivery thread delivers what it holds, then stops.
    /// Returns the threads to join.
    pub(crate) fn close(&self) -> Vec<JoinHandle<()>> {
        let mut listeners = self.listeners.write().unwrap_or_else(|e| e.into_inner());
        listeners
            .drain(..)
            .filter_map(|l| l.thread.lock().unwrap_or_else(|e| e.into_inner()).take())
            .collect()
    }

    /// How many registrations there are.
    pub(crate) fn len(&self) -> usize {
        self.listeners
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Marks the registrations whose resync is due at `now` and schedules their next one;
    /// true if any is due (client-go's `shouldResync`).
    pub(crate) fn should_resync(&self, now: Instant) -> bool {
        let listeners = self.listeners.read().unwrap_or_else(|e| e.into_inner());
        let mut any = false;
        for listener in listeners.iter() {
            let mut resync = listener.resync.lock().unwrap_or_else(|e| e.into_inner());
            let due = !resync.period.is_zero() && now >= resync.next;
            if due {
                resync.next = now + resync.period;
                any = true;
            }
            listener.syncing.store(due, Ordering::Relaxed);
        }
        any
    }

    /// The informer's check period changed before the start: recompute every period.
    pub(crate) fn resync_check_period_changed(&self, check: Duration) {
        let listeners = self.listeners.read().unwrap_or_else(|e| e.into_inner());
        for listener in listeners.iter() {
            let mut resync = listener.resync.lock().unwrap_or_else(|e| e.into_inner());
            resync.period = effective_resync_period(resync.requested, check);
        }
    }
}

impl<T> fmt::Debug for Processor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listeners = self.listeners.read().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Processor")
            .field("listeners", &listeners.len())
            .finish_non_exhaustive()
    }
}

/// A registration's delivery thread: calls the handler for each notification, in order, until
/// the channel ends or the registration is removed. A panicking call is counted and skipped.
fn deliver<T, H: EventHandler<T>>(
    rx: mpsc::Receiver<Notification<T>>,
    mut handler: H,
    shared: &Shared,
) {
    for notification in rx {
        // Acquire pairs with the Release in `Processor::remove`.
        if shared.removed.load(Ordering::Acquire) {
            break;
        }
        let initial = matches!(notification, Notification::Add { initial: true, .. });
        let call = catch_unwind(AssertUnwindSafe(|| match &notification {
            Notification::Add { obj, initial } => handler.on_add(obj, *initial),
            Notification::Update { old, new } => handler.on_update(old, new),
            Notification::Delete(obj) => handler.on_delete(obj),
        }));
        if call.is_err() {
            shared.panics.fetch_add(1, Ordering::Relaxed);
        }
        shared.delivered.fetch_add(1, Ordering::Release);
        // Release: whoever sees the count drop also sees what the handler did.
        if initial {
            shared.initial_pending.fetch_sub(1, Ordering::Release);
        }
        shared.queued.fetch_sub(1, Ordering::Release);
    }
    // Release pairs with the Acquire in `Registration::is_stopped`.
    shared.finished.store(true, Ordering::Release);
}
