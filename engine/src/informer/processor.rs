//! The shared processor: fans a shared informer's notifications out to its handler
//! registrations (client-go's `sharedProcessor` and `processorListener`).
//!
//! # Design
//!
//! A consumer applies a batch of keys to the store and collects, per registration, the
//! notifications of the whole batch ([`Distributor`]); at the batch's end, while the queue
//! still holds the batch's keys for it (`DeltaQueue::pop_batch_into`), it hands each
//! registration its part in **one send**. Registrations are of three kinds:
//!
//! - **Thread** (the default, client-go's isolation): a bounded buffer of batches
//!   (`handoff`) and a delivery thread that calls the handler. A slow handler delays only
//!   itself until its buffer is full; then the consumer that would exceed the bound waits for
//!   it (**back-pressure**), the queue fills, and the queue's own bound holds up the reflector.
//!   Memory stays bounded; client-go's buffer is unbounded.
//! - **Inline**: the handler runs on the consumer thread as the batch is handed over, behind a
//!   mutex (several consumers) — no thread, no buffer, for cheap handlers.
//! - **Async**: the same bounded buffer, drained by a tokio task on the informer's runtime that
//!   awaits the handler's futures. Consumers are threads, so their blocking sends never block a
//!   runtime worker; the task awaits.
//!
//! A key is one consumer's from its pop until its batch is handed over, so each registration
//! receives a key's notifications in order, while consumers hand over in parallel.
//!
//! The listener list is behind a read-write lock. Consumers hold it shared from the first key
//! of a batch until the batch is handed over; adding a registration after the start holds it
//! exclusively while it sends the synthetic `on_add`s of the store's content, so the new handler
//! sees every key exactly once: in the snapshot, or in a later notification, never both and
//! never neither (client-go's `blockDeltas`). Removal first closes the registration's buffer
//! (waking a consumer blocked on it, whose batch for it is dropped), then takes the lock.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::time::Instant;

use super::coalesce::Coalesced;
use super::handler::{AsyncEventHandler, Lag, LagHandler};
use super::handoff::{Handoff, HandoffCounters, TryRecv};
use super::lister_watcher::Versioned;
use super::notification::Notification;
use crate::consumer::EventHandler;
use crate::delta::DeltaObject;
use crate::key::KeyFn;
use crate::sync::{lock, read, write};

/// client-go's `minimumResyncPeriod`: a handler cannot ask to resync more often.
pub const MINIMUM_RESYNC_PERIOD: Duration = Duration::from_secs(1);

/// How often the async `wait_*` methods look again (client-go's `WaitForCacheSync` polls
/// every 100 ms).
const POLL: Duration = Duration::from_millis(5);

/// Registration ids, unique across informers, so a registration given to the wrong informer's
/// `remove_event_handler` removes nothing there.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

type Buffer<T> = Handoff<Notification<T>>;

/// What a registration, its delivery, and its [`Registration`] handle share.
#[derive(Debug)]
struct RegistrationState {
    id: u64,
    name: String,
    /// Initial-list notifications sent but not yet delivered (client-go's `synctrack`).
    initial_pending: AtomicUsize,
    /// The buffer's figures; `None` for inline delivery, which has no buffer.
    buffer: Option<Arc<HandoffCounters>>,
    /// The buffer's bound (0 for inline delivery).
    bound: usize,
    delivered: AtomicU64,
    /// Handler calls that panicked (the delivery goes on).
    panics: AtomicU64,
    /// It coalesces per key ([`HandlerOptions::coalesce`](super::HandlerOptions::coalesce)).
    coalescing: bool,
    /// Keys in its coalescing table now, and at most.
    coalesced_keys: AtomicUsize,
    peak_coalesced_keys: AtomicUsize,
    /// Notifications its coalescing table merged away.
    merged: AtomicU64,
    /// Removed: the delivery drops what is left and stops.
    removed: AtomicBool,
    /// The delivery has stopped.
    finished: AtomicBool,
}

impl RegistrationState {
    /// Whether the registration was removed: its delivery stops before the next call.
    fn is_removed(&self) -> bool {
        // Acquire pairs with the Release in `Processor::remove`.
        self.removed.load(Ordering::Acquire)
    }

    /// Counts one delivered call: whether it panicked, and whether it was an initial-list add.
    fn count_call(&self, panicked: bool, initial: bool) {
        if panicked {
            self.panics.fetch_add(1, Ordering::Relaxed);
        }
        self.count_delivered(1, usize::from(initial));
    }

    /// Counts a delivered part of a batch: `n` calls, `initial` of them initial-list adds.
    fn count_delivered(&self, n: usize, initial: usize) {
        self.delivered.fetch_add(n as u64, Ordering::Release);
        // Release: whoever sees the count drop also sees what the handler did.
        if initial > 0 {
            self.initial_pending.fetch_sub(initial, Ordering::Release);
        }
    }
}

/// Marks the delivery stopped when dropped: when the thread or task ends, whatever way, or
/// when a task that never ran is dropped.
struct Finish(Arc<RegistrationState>);

impl Drop for Finish {
    fn drop(&mut self) {
        // Release pairs with the Acquire in `Registration::is_stopped`.
        self.0.finished.store(true, Ordering::Release);
    }
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

/// Where a registration's notifications go.
enum Sink<T> {
    /// A buffer, drained by a delivery thread or task.
    Buffered(Arc<Buffer<T>>),
    /// The handler itself, called on the consumer thread.
    Inline(Mutex<Box<dyn EventHandler<T> + Send>>),
}

/// An async registration's delivery, as a task's future.
type DeliveryTask = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What runs a buffered registration's deliveries.
enum Worker {
    Thread(JoinHandle<()>),
    Task(tokio::task::JoinHandle<()>),
    /// An async registration added before the start: spawned on the informer's runtime then.
    Unspawned(DeliveryTask),
}

/// A registration as the processor holds it.
struct Listener<T> {
    sink: Sink<T>,
    shared: Arc<RegistrationState>,
    resync: Mutex<Resync>,
    /// Due in the resync under way: `Sync` updates go only to such listeners.
    syncing: AtomicBool,
    worker: Mutex<Option<Worker>>,
}

impl<T> Listener<T> {
    fn id(&self) -> u64 {
        self.shared.id
    }

    /// Hands one batch's notifications over (waiting for room under back-pressure), or calls
    /// the inline handler with them.
    fn hand_over(&self, batch: Vec<Notification<T>>, initial: usize, lag: &LagHandler) {
        if batch.is_empty() {
            return;
        }
        match &self.sink {
            Sink::Buffered(buffer) => {
                if initial > 0 {
                    // Before the send: the delivery decrements after it received the batch.
                    self.shared
                        .initial_pending
                        .fetch_add(initial, Ordering::Relaxed);
                }
                let sent = buffer.send(batch, |pending| {
                    let lag_report = Lag {
                        id: self.shared.id,
                        name: self.shared.name.clone(),
                        pending,
                        bound: buffer.bound(),
                        coalescing: self.shared.coalescing,
                    };
                    // User code on a consumer in the middle of a hand-over: a panic here
                    // would leave the turn unserved and stall every other consumer.
                    let _ = catch_unwind(AssertUnwindSafe(|| lag(&lag_report)));
                });
                if sent.is_err() && initial > 0 {
                    // Removed or closed: nobody will deliver the rest.
                    self.shared
                        .initial_pending
                        .fetch_sub(initial, Ordering::Relaxed);
                }
            }
            Sink::Inline(handler) => {
                // Acquire pairs with the Release in `Processor::remove`.
                if self.shared.removed.load(Ordering::Acquire) {
                    return;
                }
                let mut handler = lock(handler);
                deliver_inline(&mut **handler, &batch, &self.shared);
            }
        }
    }
}

fn deliver_inline<T>(
    handler: &mut dyn EventHandler<T>,
    batch: &[Notification<T>],
    shared: &RegistrationState,
) {
    for notification in batch {
        if notification.call(&mut *handler) {
            shared.panics.fetch_add(1, Ordering::Relaxed);
        }
    }
    // Inline deliveries never counted as pending: nothing to take back from `initial_pending`.
    shared
        .delivered
        .fetch_add(batch.len() as u64, Ordering::Release);
}

/// A handler's registration with a shared informer (client-go's
/// `ResourceEventHandlerRegistration`): its own sync state, backlog, and removal.
pub struct Registration {
    shared: Arc<RegistrationState>,
    upstream_synced: Arc<dyn Fn() -> bool + Send + Sync>,
    /// The processor's batches taken but not yet handed over that carry initial-list
    /// notifications (see `has_synced`).
    unflushed_initial: Arc<AtomicUsize>,
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration")
            .field("id", &self.shared.id)
            .field("name", &self.shared.name)
            .field("has_synced", &self.has_synced())
            .field("shared", &self.shared)
            .finish()
    }
}

impl Registration {
    /// The informer has synced and this handler has been given every notification of the
    /// initial list (or, if added after the start, of the store's content then).
    pub fn has_synced(&self) -> bool {
        // Upstream first: once it is true, every initial key was applied, and its
        // notifications either were handed over (and counted in `initial_pending`) or sit in
        // a batch counted in `unflushed_initial` until they are. Acquire pairs with the
        // Release decrement in `Distributor::drop` (made after the handover counted them) and
        // with the delivery's Release decrement of `initial_pending`.
        (self.upstream_synced)()
            && self.unflushed_initial.load(Ordering::Acquire) == 0
            && self.shared.initial_pending.load(Ordering::Acquire) == 0
    }

    /// Completes once [`has_synced`](Self::has_synced) is true.
    pub async fn wait_for_sync(&self) {
        while !self.has_synced() {
            tokio::time::sleep(POLL).await;
        }
    }

    /// The registration's id, unique in the process.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Its name ([`HandlerOptions::name`](super::HandlerOptions::name), or `handler-{id}`).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Notifications waiting for this handler (0 for inline delivery); for one that
    /// coalesces, plus the keys in its table.
    pub fn pending(&self) -> usize {
        self.shared.buffer.as_ref().map_or(0, |b| b.pending())
            + self.shared.coalesced_keys.load(Ordering::Relaxed)
    }

    /// The most notifications that may wait for this handler; 0 for inline delivery, which
    /// has no buffer.
    pub fn bound(&self) -> usize {
        self.shared.bound
    }

    /// The highest [`pending`](Self::pending) count so far.
    pub fn peak_pending(&self) -> usize {
        self.shared.buffer.as_ref().map_or(0, |b| b.peak())
    }

    /// Notifications merged away because this handler lagged, when it coalesces
    /// ([`HandlerOptions::coalesce`](super::HandlerOptions::coalesce)).
    pub fn merged(&self) -> u64 {
        self.shared.merged.load(Ordering::Relaxed)
    }

    /// The most keys with a change waiting in its coalescing table at once.
    pub fn peak_coalesced_keys(&self) -> usize {
        self.shared.peak_coalesced_keys.load(Ordering::Relaxed)
    }

    /// How many times a consumer had to wait for this handler to make room.
    pub fn waits(&self) -> u64 {
        self.shared.buffer.as_ref().map_or(0, |b| b.waits())
    }

    /// How long consumers waited for this handler to make room, in total.
    pub fn waited(&self) -> Duration {
        self.shared
            .buffer
            .as_ref()
            .map_or(Duration::ZERO, |b| b.waited())
    }

    /// Handler calls made so far (counted once per delivered batch).
    pub fn delivered(&self) -> u64 {
        self.shared.delivered.load(Ordering::Acquire)
    }

    /// Handler calls that panicked (the delivery went on with the next notification).
    pub fn panics(&self) -> u64 {
        self.shared.panics.load(Ordering::Relaxed)
    }

    /// Whether the delivery has stopped (after removal or the informer's shutdown).
    pub fn is_stopped(&self) -> bool {
        self.shared.finished.load(Ordering::Acquire)
    }

    /// Completes once the delivery has stopped.
    pub async fn stopped(&self) {
        while !self.is_stopped() {
            tokio::time::sleep(POLL).await;
        }
    }
}

/// How a new registration's handler is run; made by the `SharedInformer::add_*` methods.
pub(crate) enum NewHandler<T> {
    /// Runs on a delivery thread of its own.
    Thread(Box<dyn FnOnce(Delivery<T>) + Send>),
    /// Runs on the consumer threads.
    Inline(Box<dyn EventHandler<T> + Send>),
    /// Runs as a task; the closure makes the task's future.
    Task(Box<dyn FnOnce(Delivery<T>) -> DeliveryTask + Send>),
}

impl<T: Send + Sync + 'static> NewHandler<T> {
    /// A handler on a delivery thread of its own.
    pub(crate) fn thread<H: EventHandler<T> + Send + 'static>(handler: H) -> Self {
        Self::Thread(Box::new(move |delivery| delivery.run_thread(handler)))
    }

    /// A handler called on the consumer threads.
    pub(crate) fn inline<H: EventHandler<T> + Send + 'static>(handler: H) -> Self {
        Self::Inline(Box::new(handler))
    }

    /// An async handler on a task.
    pub(crate) fn task<H: AsyncEventHandler<T> + Send + 'static>(handler: H) -> Self {
        Self::Task(Box::new(move |delivery| {
            Box::pin(delivery.run_task(handler))
        }))
    }
}

/// A delivery thread's or task's end of a registration.
pub(crate) struct Delivery<T> {
    buffer: Arc<Buffer<T>>,
    shared: Arc<RegistrationState>,
    /// The per-key table of a registration that coalesces.
    table: Option<Coalesced<T>>,
    finish: Finish,
}

impl<T> Delivery<T> {
    /// A delivery thread: calls the handler for each notification, in order, until the buffer
    /// ends or the registration is removed. A panicking call is counted and skipped.
    fn run_thread<H: EventHandler<T>>(self, mut handler: H) {
        // Marks the registration finished however this returns.
        let _finish = self.finish;
        let (buffer, shared) = (&*self.buffer, &*self.shared);
        if let Some(table) = self.table {
            coalesce_thread(table, buffer, shared, &mut handler);
            return;
        }
        while let Some(batches) = buffer.recv() {
            if !deliver_batches(batches, buffer, shared, |n| n.call(&mut handler)) {
                break;
            }
        }
    }

    /// The same as a task, awaiting each call.
    async fn run_task<H: AsyncEventHandler<T>>(self, mut handler: H)
    where
        T: Send + Sync,
    {
        // Marks the registration finished however this returns.
        let _finish = self.finish;
        let (buffer, shared) = (&*self.buffer, &*self.shared);
        if let Some(table) = self.table {
            coalesce_task(table, buffer, shared, &mut handler).await;
            return;
        }
        while let Some(batches) = buffer.recv_async().await {
            for batch in batches {
                let (n, mut initial) = (batch.len(), 0);
                for notification in batch {
                    // Acquire pairs with the Release in `Processor::remove`.
                    if shared.removed.load(Ordering::Acquire) {
                        return;
                    }
                    initial += usize::from(notification.is_initial());
                    if call_async(&mut handler, notification).await.is_err() {
                        shared.panics.fetch_add(1, Ordering::Relaxed);
                    }
                }
                shared.count_delivered(n, initial);
                buffer.delivered(n);
            }
        }
    }
}

/// Moves taken batches into a coalescing registration's table, releasing their room.
fn absorb_batches<T>(
    table: &mut Coalesced<T>,
    batches: VecDeque<Vec<Notification<T>>>,
    buffer: &Buffer<T>,
    shared: &RegistrationState,
) {
    for batch in batches {
        let n = batch.len();
        let absorbed = table.absorb(batch);
        shared
            .merged
            .fetch_add(absorbed.merged as u64, Ordering::Relaxed);
        if absorbed.vanished_initial > 0 {
            // Release, as in `count_delivered`: these initial adds are done with.
            shared
                .initial_pending
                .fetch_sub(absorbed.vanished_initial, Ordering::Release);
        }
        buffer.delivered(n);
    }
    // After the room was released: `pending` adds both counts, so a reader in between sees a
    // moment's undercount, never a lasting one.
    shared.coalesced_keys.store(table.len(), Ordering::Relaxed);
    shared
        .peak_coalesced_keys
        .fetch_max(table.len(), Ordering::Relaxed);
}

/// What a coalescing delivery does next.
enum Next<T> {
    /// Batches arrived: take them into the table.
    Batches(VecDeque<Vec<Notification<T>>>),
    /// Nothing new: deliver the oldest key's change.
    Deliver,
    /// Removed, or closed with the table delivered: stop.
    Stop,
}

/// The coalescing delivery's choice, given what the buffer gave: with an empty table the
/// delivery waited for it, else it only polled.
fn next_step<T>(
    table: &Coalesced<T>,
    got: TryRecv<Notification<T>>,
    shared: &RegistrationState,
) -> Next<T> {
    match got {
        TryRecv::Batches(batches) => Next::Batches(batches),
        TryRecv::Empty => Next::Deliver,
        // Closed: deliver what the table holds first; removed: stop now.
        TryRecv::Ended if !table.is_empty() && !shared.is_removed() => Next::Deliver,
        TryRecv::Ended => Next::Stop,
    }
}

/// A coalescing delivery's next move: `None` to stop; else the oldest key's notifications to
/// call, each only while the registration is not removed (none when batches arrived: they
/// went into the table). `waited` is what the delivery blocked for (it does only when the
/// table is empty); without it, this polls the buffer.
fn next_due<'a, T>(
    table: &'a mut Coalesced<T>,
    waited: Option<Option<VecDeque<Vec<Notification<T>>>>>,
    buffer: &Buffer<T>,
    shared: &'a RegistrationState,
) -> Option<impl Iterator<Item = Notification<T>> + 'a> {
    let got = match waited {
        Some(batches) => batches.map_or(TryRecv::Ended, TryRecv::Batches),
        None => buffer.poll(),
    };
    let due = match next_step(table, got, shared) {
        Next::Batches(batches) => {
            absorb_batches(table, batches, buffer, shared);
            None
        }
        Next::Deliver => table.pop(),
        Next::Stop => return None,
    };
    Some(
        due.into_iter()
            .flatten()
            .take_while(|_| !shared.is_removed()),
    )
}

/// After a key's calls: false if the registration was removed meanwhile (the delivery stops),
/// else the table's size is published.
fn delivered<T>(table: &Coalesced<T>, shared: &RegistrationState) -> bool {
    if shared.is_removed() {
        return false;
    }
    shared.coalesced_keys.store(table.len(), Ordering::Relaxed);
    true
}

/// A coalescing delivery thread: between handler calls it takes in whatever arrived, so its
/// buffer drains as fast as the consumers fill it and only the table (one entry per key)
/// waits for the handler. It blocks for more only when the table is empty.
fn coalesce_thread<T, H: EventHandler<T>>(
    mut table: Coalesced<T>,
    buffer: &Buffer<T>,
    shared: &RegistrationState,
    handler: &mut H,
) {
    loop {
        let waited = table.is_empty().then(|| buffer.recv());
        let Some(due) = next_due(&mut table, waited, buffer, shared) else {
            return;
        };
        for notification in due {
            shared.count_call(notification.call(handler), notification.is_initial());
        }
        if !delivered(&table, shared) {
            return;
        }
    }
}

/// The same as a task, awaiting each call.
async fn coalesce_task<T, H: AsyncEventHandler<T>>(
    mut table: Coalesced<T>,
    buffer: &Buffer<T>,
    shared: &RegistrationState,
    handler: &mut H,
) where
    T: Send + Sync,
{
    loop {
        let waited = if table.is_empty() {
            Some(buffer.recv_async().await)
        } else {
            None
        };
        let Some(due) = next_due(&mut table, waited, buffer, shared) else {
            return;
        };
        for notification in due {
            let initial = notification.is_initial();
            shared.count_call(call_async(handler, notification).await.is_err(), initial);
        }
        if !delivered(&table, shared) {
            return;
        }
    }
}

/// Calls an async handler with `notification`, catching a panic.
async fn call_async<T, H: AsyncEventHandler<T>>(
    handler: &mut H,
    notification: Notification<T>,
) -> Result<(), ()>
where
    T: Send + Sync,
{
    match notification {
        Notification::Add { obj, initial } => catch_panic(handler.on_add(obj, initial)).await,
        Notification::Update { old, new } => catch_panic(handler.on_update(old, new)).await,
        Notification::Delete(obj) => catch_panic(handler.on_delete(obj)).await,
    }
}

/// Delivers taken batches with `call` (true: it panicked); false once removed.
fn deliver_batches<T>(
    batches: VecDeque<Vec<Notification<T>>>,
    buffer: &Buffer<T>,
    shared: &RegistrationState,
    mut call: impl FnMut(&Notification<T>) -> bool,
) -> bool {
    for batch in batches {
        let mut initial = 0;
        for notification in &batch {
            // Acquire pairs with the Release in `Processor::remove`.
            if shared.removed.load(Ordering::Acquire) {
                return false;
            }
            initial += usize::from(notification.is_initial());
            if call(notification) {
                shared.panics.fetch_add(1, Ordering::Relaxed);
            }
        }
        shared.count_delivered(batch.len(), initial);
        // The objects are released before the room is, so the bound bounds them too.
        let n = batch.len();
        drop(batch);
        buffer.delivered(n);
    }
    true
}

/// Awaits `future`, catching a panic in a poll of it.
async fn catch_panic<F: Future<Output = ()>>(future: F) -> Result<(), ()> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Ready(())) => Poll::Ready(Ok(())),
            Ok(Poll::Pending) => Poll::Pending,
            Err(_) => Poll::Ready(Err(())),
        },
    )
    .await
}

/// The runtime async registrations are spawned on, once the informer has one.
#[derive(Default)]
struct Runtime {
    handle: Option<tokio::runtime::Handle>,
}

/// The handler registrations of one informer.
pub(crate) struct Processor<T> {
    listeners: RwLock<Vec<Arc<Listener<T>>>>,
    /// The same registrations, for `remove` and `close` to reach a buffer without waiting for
    /// `listeners` (which a consumer blocked on that buffer holds).
    members: Mutex<Vec<Arc<Listener<T>>>>,
    upstream_synced: Arc<dyn Fn() -> bool + Send + Sync>,
    /// Batches taken but not yet handed over that carry initial-list notifications.
    unflushed_initial: Arc<AtomicUsize>,
    default_bound: usize,
    lag: LagHandler,
    runtime: Mutex<Runtime>,
}

/// The listeners, held shared while a consumer applies a batch; collects the batch's
/// notifications per listener and hands them over when dropped.
pub(crate) struct Distributor<'a, T> {
    processor: &'a Processor<T>,
    listeners: RwLockReadGuard<'a, Vec<Arc<Listener<T>>>>,
    /// Per listener (same positions), this batch's notifications.
    batches: Vec<Vec<Notification<T>>>,
    /// Initial-list adds in this batch (each goes to every listener).
    initial: usize,
}

impl<T> Distributor<'_, T> {
    fn push_all(&mut self, mut notification: impl FnMut() -> Notification<T>) {
        for batch in &mut self.batches {
            batch.push(notification());
        }
    }
}

impl<T: Versioned> EventHandler<T> for Distributor<'_, T> {
    fn on_add(&mut self, obj: &Arc<T>, is_in_initial_list: bool) {
        if is_in_initial_list {
            if self.initial == 0 {
                // Before the queue counts the key processed (it does when the batch ends), so
                // `has_synced` cannot turn true while these notifications are in our hands.
                // Relaxed: the queue's own Release/Acquire on its count carries it.
                self.processor
                    .unflushed_initial
                    .fetch_add(1, Ordering::Relaxed);
            }
            self.initial += 1;
        }
        self.push_all(|| Notification::Add {
            obj: Arc::clone(obj),
            initial: is_in_initial_list,
        });
    }

    fn on_update(&mut self, old: &Arc<T>, new: &Arc<T>) {
        // Same version: nothing changed, this is a resync (or a relist of an unchanged
        // object), and it goes only to the handlers whose resync is due.
        let is_sync = old.resource_version() == new.resource_version();
        for (listener, batch) in self.listeners.iter().zip(&mut self.batches) {
            // Relaxed: `should_resync` set the flag before it asked the queue to resync, and
            // the queue's locks order that before this pop of the resulting `Sync` delta.
            if !is_sync || listener.syncing.load(Ordering::Relaxed) {
                batch.push(Notification::Update {
                    old: Arc::clone(old),
                    new: Arc::clone(new),
                });
            }
        }
    }

    fn on_delete(&mut self, obj: &DeltaObject<T>) {
        self.push_all(|| Notification::Delete(obj.clone()));
    }
}

impl<T> Drop for Distributor<'_, T> {
    /// Hands the batch over; also when a consumer unwinds from a panic (the notifications of
    /// the keys applied before it are real). The queue still holds the batch's keys for this
    /// consumer (`DeltaQueue::pop_batch_into`), so a key's next batch is handed over after.
    fn drop(&mut self) {
        for (listener, batch) in self.listeners.iter().zip(self.batches.drain(..)) {
            listener.hand_over(batch, self.initial, &self.processor.lag);
        }
        if self.initial > 0 {
            // Release pairs with the Acquire in `Registration::has_synced`: the
            // `initial_pending` increments above are visible to whoever sees this.
            self.processor
                .unflushed_initial
                .fetch_sub(1, Ordering::Release);
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

/// What a registration asks of the processor, besides its handler.
pub(crate) struct ListenerOptions<T> {
    pub(crate) name: Option<String>,
    pub(crate) bound: Option<usize>,
    pub(crate) requested: Duration,
    pub(crate) period: Duration,
    /// Coalesce per key, by this key function (see `coalesce`).
    pub(crate) coalesce_by: Option<KeyFn<T>>,
}

impl<T: Send + Sync + 'static> Processor<T> {
    pub(crate) fn new(
        upstream_synced: Arc<dyn Fn() -> bool + Send + Sync>,
        default_bound: usize,
        lag: LagHandler,
    ) -> Self {
        Self {
            listeners: RwLock::new(Vec::new()),
            members: Mutex::new(Vec::new()),
            upstream_synced,
            unflushed_initial: Arc::default(),
            default_bound: default_bound.max(1),
            lag,
            runtime: Mutex::default(),
        }
    }

    /// Holds the listener list shared; notifications go through the returned handler, and are
    /// handed over when it is dropped. Call it once the batch has its keys, and drop it before
    /// the queue completes them.
    pub(crate) fn distributor(&self) -> Distributor<'_, T> {
        let listeners = read(&self.listeners);
        let batches = listeners.iter().map(|_| Vec::new()).collect();
        Distributor {
            processor: self,
            listeners,
            batches,
            initial: 0,
        }
    }

    /// Registers a handler. Under the exclusive lock, `initial()` gives the objects it first
    /// gets a synthetic `on_add(obj, true)` for.
    pub(crate) fn add(
        &self,
        handler: NewHandler<T>,
        options: ListenerOptions<T>,
        initial: impl FnOnce() -> Vec<Arc<T>>,
    ) -> std::io::Result<Registration> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let name = options.name.unwrap_or_else(|| format!("handler-{id}"));
        let bound = options.bound.unwrap_or(self.default_bound).max(1);
        // Held until the registration is listed, so `start_tasks` spawns it or we do.
        let runtime = lock(&self.runtime);
        let buffer = match &handler {
            NewHandler::Thread(_) => Some(Arc::new(Buffer::for_thread(bound))),
            NewHandler::Task(_) => Some(Arc::new(Buffer::for_task(bound))),
            NewHandler::Inline(_) => None,
        };
        let shared = Arc::new(RegistrationState {
            id,
            name,
            initial_pending: AtomicUsize::new(0),
            buffer: buffer.as_ref().map(|b| Arc::clone(b.counters())),
            bound: if buffer.is_some() { bound } else { 0 },
            delivered: AtomicU64::new(0),
            panics: AtomicU64::new(0),
            coalescing: options.coalesce_by.is_some() && buffer.is_some(),
            coalesced_keys: AtomicUsize::new(0),
            peak_coalesced_keys: AtomicUsize::new(0),
            merged: AtomicU64::new(0),
            removed: AtomicBool::new(false),
            finished: AtomicBool::new(false),
        });
        let coalesce_by = options.coalesce_by;
        let delivery = |buffer: &Arc<Buffer<T>>| Delivery {
            buffer: Arc::clone(buffer),
            shared: Arc::clone(&shared),
            table: coalesce_by.clone().map(Coalesced::new),
            finish: Finish(Arc::clone(&shared)),
        };
        let (sink, worker) = match (handler, buffer) {
            (NewHandler::Thread(run), Some(buffer)) => {
                let delivery = delivery(&buffer);
                let thread = std::thread::Builder::new()
                    .name(format!("kcache-handler-{id}"))
                    .spawn(move || run(delivery))?;
                (Sink::Buffered(buffer), Some(Worker::Thread(thread)))
            }
            (NewHandler::Task(make), Some(buffer)) => {
                let future = make(delivery(&buffer));
                let worker = match &runtime.handle {
                    Some(handle) => Worker::Task(handle.spawn(future)),
                    None => Worker::Unspawned(future),
                };
                (Sink::Buffered(buffer), Some(worker))
            }
            (NewHandler::Inline(handler), _) => (Sink::Inline(Mutex::new(handler)), None),
            (NewHandler::Thread(_) | NewHandler::Task(_), None) => {
                unreachable!("buffered handlers got a buffer above")
            }
        };
        let listener = Arc::new(Listener {
            sink,
            shared: Arc::clone(&shared),
            resync: Mutex::new(Resync {
                requested: options.requested,
                period: options.period,
                next: Instant::now() + options.period,
            }),
            syncing: AtomicBool::new(false),
            worker: Mutex::new(worker),
        });
        let mut listeners = write(&self.listeners);
        let snapshot: Vec<_> = initial()
            .into_iter()
            .map(|obj| Notification::Add { obj, initial: true })
            .collect();
        match &listener.sink {
            Sink::Buffered(buffer) => {
                shared
                    .initial_pending
                    .fetch_add(snapshot.len(), Ordering::Relaxed);
                // Over the bound if need be: waiting here, with every consumer held off by
                // the exclusive lock, would only stall the informer.
                let _ = buffer.send_over_bound(snapshot);
            }
            Sink::Inline(handler) => {
                let mut handler = lock(handler);
                deliver_inline(&mut **handler, &snapshot, &shared);
            }
        }
        listeners.push(Arc::clone(&listener));
        lock(&self.members).push(listener);
        drop(listeners);
        drop(runtime);
        Ok(Registration {
            shared,
            upstream_synced: Arc::clone(&self.upstream_synced),
            unflushed_initial: Arc::clone(&self.unflushed_initial),
        })
    }

    /// The informer has started on `handle`: async registrations run there from now on.
    pub(crate) fn start_tasks(&self, handle: &tokio::runtime::Handle) {
        let mut runtime = lock(&self.runtime);
        runtime.handle = Some(handle.clone());
        let members = lock(&self.members);
        for listener in members.iter() {
            let mut worker = lock(&listener.worker);
            *worker = match worker.take() {
                Some(Worker::Unspawned(future)) => Some(Worker::Task(handle.spawn(future))),
                other => other,
            };
        }
    }
}

/// What is left to wait for after [`Processor::close`]: delivery threads and tasks that end
/// once they have delivered their buffers.
#[derive(Default)]
pub(crate) struct Stopping {
    pub(crate) threads: Vec<JoinHandle<()>>,
    pub(crate) tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl<T> Processor<T> {
    /// Removes a registration: its delivery drops what it has not delivered yet and stops.
    /// Returns false if it was not registered (removed already, or another informer's).
    pub(crate) fn remove(&self, id: u64) -> bool {
        let listener = {
            let mut members = lock(&self.members);
            let Some(at) = members.iter().position(|l| l.id() == id) else {
                return false;
            };
            members.remove(at)
        };
        // Release pairs with the Acquire loads in the deliveries: they stop before the next
        // call.
        listener.shared.removed.store(true, Ordering::Release);
        // Before the lock: a consumer blocked on this full buffer holds the lock shared, and
        // this wakes it (its batch for this registration is dropped).
        if let Sink::Buffered(buffer) = &listener.sink {
            buffer.remove();
        }
        let mut listeners = write(&self.listeners);
        listeners.retain(|l| l.id() != id);
        drop(listeners);
        if let Sink::Inline(_) = &listener.sink {
            listener.shared.finished.store(true, Ordering::Release);
        }
        // A task that never ran is dropped here (which marks it stopped); a thread or task
        // ends by itself, detached.
        drop(lock(&listener.worker).take());
        true
    }

    /// Unregisters everything; each delivery delivers what its buffer holds, then stops.
    /// Returns the threads and tasks to wait for.
    pub(crate) fn close(&self) -> Stopping {
        let members = std::mem::take(&mut *lock(&self.members));
        // Before the lock, as in `remove`: a consumer still blocked on a full buffer (the
        // informer dropped without a shutdown) gives up rather than holding us.
        for listener in &members {
            if let Sink::Buffered(buffer) = &listener.sink {
                buffer.close();
            }
        }
        write(&self.listeners).clear();
        let mut stopping = Stopping::default();
        for listener in members {
            if let Sink::Inline(_) = &listener.sink {
                listener.shared.finished.store(true, Ordering::Release);
            }
            match lock(&listener.worker).take() {
                Some(Worker::Thread(thread)) => stopping.threads.push(thread),
                Some(Worker::Task(task)) => stopping.tasks.push(task),
                // Never started, so never sent anything: dropping it marks it stopped.
                Some(Worker::Unspawned(future)) => drop(future),
                None => {}
            }
        }
        stopping
    }

    /// How many registrations there are.
    pub(crate) fn len(&self) -> usize {
        read(&self.listeners).len()
    }

    /// Marks the registrations whose resync is due at `now` and schedules their next one;
    /// true if any is due (client-go's `shouldResync`).
    pub(crate) fn should_resync(&self, now: Instant) -> bool {
        let listeners = read(&self.listeners);
        let mut any = false;
        for listener in listeners.iter() {
            let mut resync = lock(&listener.resync);
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
        let listeners = read(&self.listeners);
        for listener in listeners.iter() {
            let mut resync = lock(&listener.resync);
            resync.period = effective_resync_period(resync.requested, check);
        }
    }
}

impl<T> fmt::Debug for Processor<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let listeners = read(&self.listeners);
        f.debug_struct("Processor")
            .field("listeners", &listeners.len())
            .field("default_bound", &self.default_bound)
            .finish_non_exhaustive()
    }
}
