//! The shared informer: one reflector, one queue, one indexer, many handlers (client-go's
//! `sharedIndexInformer`).
//!
//! # Threads and tasks
//!
//! - The **reflector** is a tokio task: it waits on the network (or the in-memory server) and
//!   on timers, which is what async is for.
//! - The **consumers** are dedicated threads: a queue's `pop` blocks (the sharded queue parks
//!   idle consumers on a futex, the reference on a condition variable), and applying a key to
//!   the indexer is CPU work. Each takes a batch of keys, applies every key to the indexer with
//!   one write, and hands the notifications to the registrations. With the sharded queue,
//!   several consumers run at once and each key stays with one of them until it is done, so a
//!   key's notifications keep their order. If one panics (user code: an index function), the
//!   informer stops itself and [`SharedInformer::failure`] says why.
//! - Each **registration** has, by default, a bounded buffer and a delivery thread (see the
//!   processor module): handlers are synchronous and may be slow, and a slow one delays nobody
//!   else until its buffer is full; then the consumers wait for it (back-pressure) rather than
//!   let memory grow. A handler that declares itself cheap can run **inline** on the consumers
//!   ([`HandlerOptions::inline`]); an [`AsyncEventHandler`] runs as a task on the informer's
//!   runtime.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use super::applied::AppliedVersion;
use super::backoff::Backoff;
use super::handler::{
    stderr_lag_handler, AsyncEventHandler, HandlerOptions, LagHandler, DEFAULT_HANDLER_BUFFER,
};
use super::lister_watcher::{ListerWatcher, Versioned};
use super::processor::{
    effective_resync_period, Distributor, ListenerOptions, NewHandler, Processor, Registration,
    MINIMUM_RESYNC_PERIOD,
};
use super::reader::StoreReader;
use super::reflector::{
    Reflector, ReflectorHandle, ReflectorOptions, WatchErrorHandler, DEFAULT_MIN_WATCH_TIMEOUT,
    DEFAULT_PAGE_SIZE,
};
use super::stop::StopSignal;
use crate::consumer::{apply_deltas_coalesced, EventHandler};
use crate::delta::Deltas;
use crate::key::KeyFn;
use crate::queue::{BatchConsumer, DeltaQueue, QueueOptions, TransformFn};
use crate::store::{IndexError, Indexer, Indexers, KnownObjects};
use crate::sync::lock;
use crate::{reference, sharded};

/// How many keys a consumer takes from the queue at once.
pub const DEFAULT_BATCH: usize = 64;

/// A shared informer could not do what was asked.
#[derive(Debug, Error)]
pub enum InformerError {
    /// `start` was called twice.
    #[error("the informer has already started")]
    AlreadyStarted,
    /// The informer was shut down: it takes no handlers and cannot start again.
    #[error("the informer has been shut down")]
    Stopped,
    /// `start` was called outside a tokio runtime; call it from within one, or use `start_on`.
    #[error("no tokio runtime: call start from within a runtime, or use start_on(handle)")]
    NoRuntime,
    /// A consumer or delivery thread could not be spawned.
    #[error("cannot spawn a thread: {0}")]
    Spawn(#[from] std::io::Error),
    /// An index operation failed.
    #[error(transparent)]
    Index(#[from] IndexError),
}

/// Configures a [`SharedInformer`]; made by [`SharedInformer::builder`].
pub struct SharedInformerBuilder<T, L> {
    lister_watcher: L,
    key_fn: KeyFn<T>,
    indexers: Indexers<T>,
    shards: usize,
    consumers: usize,
    batch: usize,
    resync_period: Duration,
    transform: Option<TransformFn<T>>,
    reflector: ReflectorOptions,
    handler_buffer: usize,
    lag_handler: LagHandler,
    resync_last: bool,
}

impl<T, L> fmt::Debug for SharedInformerBuilder<T, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedInformerBuilder")
            .field("indexers", &self.indexers.len())
            .field("shards", &self.shards)
            .field("consumers", &self.consumers)
            .field("batch", &self.batch)
            .field("resync_period", &self.resync_period)
            .field("transform", &self.transform.is_some())
            .field("reflector", &self.reflector)
            .field("handler_buffer", &self.handler_buffer)
            .field("resync_last", &self.resync_last)
            .finish_non_exhaustive()
    }
}

impl<T, L> SharedInformerBuilder<T, L>
where
    T: Versioned + Send + Sync + 'static,
    L: ListerWatcher<T> + 'static,
{
    /// Named secondary indexes of the store.
    pub fn indexers(mut self, indexers: Indexers<T>) -> Self {
        self.indexers = indexers;
        self
    }

    /// Shards of the sharded queue (default [`sharded::DEFAULT_SHARDS`]); ignored by the
    /// reference design.
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1);
        self
    }

    /// Consumer threads (default 1). More than one pays off with the sharded queue when the
    /// indexer work is heavy; the reference queue runs one consumer at a time whatever this is.
    pub fn consumers(mut self, consumers: usize) -> Self {
        self.consumers = consumers.max(1);
        self
    }

    /// Keys a consumer takes from the queue at once (default [`DEFAULT_BATCH`]).
    pub fn batch(mut self, batch: usize) -> Self {
        self.batch = batch.max(1);
        self
    }

    /// The default resync period of handlers, and the informer's resync check period (client-go's
    /// `defaultEventHandlerResyncPeriod`). Zero (the default): no resync.
    pub fn resync_period(mut self, period: Duration) -> Self {
        self.resync_period = period;
        self
    }

    /// A transformer applied to every object before it is queued (client-go's `SetTransform`).
    pub fn transform(mut self, transform: TransformFn<T>) -> Self {
        self.transform = Some(transform);
        self
    }

    /// Where the reflector's errors go (client-go's `SetWatchErrorHandler`).
    pub fn watch_error_handler(mut self, handler: WatchErrorHandler) -> Self {
        self.reflector.error_handler = Some(handler);
        self
    }

    /// How many notifications may wait for each registration by default (at least 1; default
    /// [`DEFAULT_HANDLER_BUFFER`], which says why). A consumer that would exceed a
    /// registration's bound waits until its handler has made room: a slow handler slows the
    /// informer rather than growing memory. [`HandlerOptions::buffer`] sets one registration's.
    pub fn handler_buffer(mut self, notifications: usize) -> Self {
        self.handler_buffer = notifications.max(1);
        self
    }

    /// Called when a registration's buffer hits its bound, once per episode (until it has
    /// drained). Default: one line on stderr naming the registration and its pending count.
    pub fn lag_handler(mut self, handler: LagHandler) -> Self {
        self.lag_handler = handler;
        self
    }

    /// The reflector's backoff (default: client-go's).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.reflector.backoff = backoff;
        self
    }

    /// Items per list page (default [`DEFAULT_PAGE_SIZE`]).
    pub fn page_size(mut self, page_size: usize) -> Self {
        self.reflector.page_size = page_size;
        self
    }

    /// The shortest watch timeout asked of the server (default
    /// [`DEFAULT_MIN_WATCH_TIMEOUT`]).
    pub fn min_watch_timeout(mut self, timeout: Duration) -> Self {
        self.reflector.min_watch_timeout = timeout;
        self
    }

    /// Live changes before resyncs, for [`build`](Self::build) (default off: client-go's
    /// order). The sharded queue keeps keys queued by a resync alone in a lane of their own,
    /// popped after every key with a live change ([`sharded::DeltaFifo::resync_last`]), so a
    /// change made during a resync of many objects reaches the handlers without waiting for
    /// all of them. Per key, the notifications are exactly as without it. The reference
    /// design ([`build_reference`](Self::build_reference)) is client-go's one FIFO and has no
    /// such lane.
    pub fn resync_last(mut self, resync_last: bool) -> Self {
        self.resync_last = resync_last;
        self
    }

    /// An informer on the sharded queue and indexer.
    pub fn build(self) -> SharedInformer<T, L, sharded::DeltaFifo<T>, sharded::IndexedStore<T>> {
        let (shards, resync_last) = (self.shards, self.resync_last);
        self.build_with(sharded::IndexedStore::new, |options| {
            let queue = sharded::DeltaFifo::new(options, shards);
            if resync_last {
                queue.resync_last()
            } else {
                queue
            }
        })
    }

    /// An informer on the reference design (client-go's queue and indexer, ported).
    pub fn build_reference(
        self,
    ) -> SharedInformer<T, L, reference::DeltaFifo<T>, reference::IndexedStore<T>> {
        self.build_with(reference::IndexedStore::new, reference::DeltaFifo::new)
    }

    /// An informer on any queue and indexer: `make_store` gets the key function and the
    /// indexers, `make_queue` the queue options (the store as known objects, `emit_replaced`
    /// on as in client-go's informer, the transformer).
    pub fn build_with<Q, I>(
        self,
        make_store: impl FnOnce(KeyFn<T>, Indexers<T>) -> I,
        make_queue: impl FnOnce(QueueOptions<T>) -> Q,
    ) -> SharedInformer<T, L, Q, I>
    where
        Q: DeltaQueue<T> + 'static,
        I: Indexer<T> + 'static,
    {
        let key_fn = Arc::clone(&self.key_fn);
        let store = Arc::new(make_store(Arc::clone(&self.key_fn), self.indexers));
        let mut options = QueueOptions::new(self.key_fn)
            .known_objects(Arc::clone(&store) as Arc<dyn KnownObjects<T>>)
            .emit_replaced(true);
        if let Some(transform) = self.transform {
            options = options.transformer(transform);
        }
        let queue = Arc::new(make_queue(options));
        let synced = {
            let queue = Arc::clone(&queue);
            Arc::new(move || queue.has_synced()) as Arc<dyn Fn() -> bool + Send + Sync>
        };
        let close_queue = {
            let queue = Arc::clone(&queue);
            Box::new(move || queue.close())
        };
        let applied = {
            let queue = Arc::clone(&queue);
            AppliedVersion::new(move || queue.is_drained())
        };
        let mut reflector_options = self.reflector;
        let tracker = applied.clone();
        reflector_options.on_synced = Some(Arc::new(move |rv: &str| tracker.synced(rv)));
        SharedInformer {
            applied,
            close_queue,
            key_fn,
            failure: Arc::default(),
            lister_watcher: Mutex::new(Some(self.lister_watcher)),
            queue,
            store,
            processor: Arc::new(Processor::new(
                synced,
                self.handler_buffer,
                self.lag_handler,
            )),
            reflector_options,
            consumers: self.consumers,
            batch: self.batch,
            default_resync: self.resync_period,
            stop: StopSignal::new(),
            lifecycle: Mutex::new(Lifecycle {
                started: false,
                stopped: false,
                resync_check_period: self.resync_period,
                reflector: None,
                reflector_task: None,
                consumer_threads: Vec::new(),
            }),
        }
    }
}

/// What changes when the informer starts and stops (client-go's `startedLock` guards this).
struct Lifecycle {
    started: bool,
    stopped: bool,
    /// How often the reflector asks whether a handler's resync is due.
    resync_check_period: Duration,
    reflector: Option<ReflectorHandle>,
    reflector_task: Option<tokio::task::JoinHandle<()>>,
    consumer_threads: Vec<JoinHandle<()>>,
}

/// One reflector, one queue, one indexer, many handlers; see the module docs.
///
/// ```
/// # tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap().block_on(async {
/// use std::sync::{Arc, Mutex};
/// use kcache::informer::{SetResourceVersion, SharedInformer, Versioned};
/// use kcache_sim::MemoryListerWatcher;
/// use kcache::{EventHandler, Key};
///
/// #[derive(Clone, Debug)]
/// struct Pod { name: String, rv: String }
/// impl Versioned for Pod { fn resource_version(&self) -> &str { &self.rv } }
/// impl SetResourceVersion for Pod { fn set_resource_version(&mut self, rv: &str) { self.rv = rv.into() } }
///
/// struct Names(Arc<Mutex<Vec<String>>>);
/// impl EventHandler<Pod> for Names {
///     fn on_add(&mut self, pod: &Arc<Pod>, _initial: bool) { self.0.lock().unwrap().push(pod.name.clone()) }
/// }
///
/// let key_fn: kcache::KeyFn<Pod> = Arc::new(|p: &Pod| Ok(Key::new(&p.name)));
/// let server = MemoryListerWatcher::new(key_fn.clone());
/// server.upsert(Pod { name: "web-0".into(), rv: String::new() }).unwrap();
///
/// let informer = SharedInformer::builder(server.clone(), key_fn).build();
/// let names = Arc::new(Mutex::new(Vec::new()));
/// let registration = informer.add_event_handler(Names(names.clone())).unwrap();
/// informer.start().unwrap();
/// registration.wait_for_sync().await;
/// assert_eq!(*names.lock().unwrap(), ["web-0"]);
/// assert!(informer.store().get_by_key(&Key::new("web-0")).is_some());
/// informer.shutdown().await;
/// # });
/// ```
pub struct SharedInformer<T, L, Q, I> {
    /// Moved into the reflector task at the start.
    lister_watcher: Mutex<Option<L>>,
    queue: Arc<Q>,
    store: Arc<I>,
    processor: Arc<Processor<T>>,
    reflector_options: ReflectorOptions,
    consumers: usize,
    batch: usize,
    default_resync: Duration,
    stop: StopSignal,
    lifecycle: Mutex<Lifecycle>,
    /// Set by a consumer that panicked; see [`failure`](Self::failure).
    failure: Arc<Mutex<Option<String>>>,
    /// `queue.close()`, callable from `Drop` where the queue's trait bounds are not in scope.
    close_queue: Box<dyn Fn() + Send + Sync>,
    /// The key function the queue and the store use, for handlers that key objects too.
    key_fn: KeyFn<T>,
    /// The version the store has applied (see the `applied` module).
    applied: AppliedVersion,
}

impl<T, L> SharedInformer<T, L, sharded::DeltaFifo<T>, sharded::IndexedStore<T>>
where
    T: Versioned + Send + Sync + 'static,
    L: ListerWatcher<T> + 'static,
{
    /// Starts configuring an informer of the objects `lister_watcher` serves, keyed by
    /// `key_fn`.
    pub fn builder(lister_watcher: L, key_fn: KeyFn<T>) -> SharedInformerBuilder<T, L> {
        SharedInformerBuilder {
            lister_watcher,
            key_fn,
            indexers: Vec::new(),
            shards: sharded::DEFAULT_SHARDS,
            consumers: 1,
            batch: DEFAULT_BATCH,
            resync_period: Duration::ZERO,
            transform: None,
            reflector: ReflectorOptions {
                page_size: DEFAULT_PAGE_SIZE,
                min_watch_timeout: DEFAULT_MIN_WATCH_TIMEOUT,
                ..ReflectorOptions::default()
            },
            handler_buffer: DEFAULT_HANDLER_BUFFER,
            lag_handler: stderr_lag_handler(),
            resync_last: false,
        }
    }
}

impl<T, L, Q, I> SharedInformer<T, L, Q, I>
where
    T: Versioned + Send + Sync + 'static,
    L: ListerWatcher<T> + 'static,
    Q: DeltaQueue<T> + 'static,
    I: Indexer<T> + 'static,
{
    fn lifecycle(&self) -> MutexGuard<'_, Lifecycle> {
        lock(&self.lifecycle)
    }

    /// Registers a handler with the informer's default resync period (client-go's
    /// `AddEventHandler`), on a delivery thread of its own with a bounded buffer. Added after
    /// the start, it first gets an `on_add(obj, true)` for every object in the store.
    pub fn add_event_handler<H>(&self, handler: H) -> Result<Registration, InformerError>
    where
        H: EventHandler<T> + Send + 'static,
    {
        self.add_event_handler_with(handler, HandlerOptions::new())
    }

    /// Registers a handler with its own resync period (client-go's
    /// `AddEventHandlerWithResyncPeriod`): at least [`MINIMUM_RESYNC_PERIOD`]; before the
    /// start a shorter period than the informer's check period shortens that, after the start
    /// it is raised to it; zero never resyncs this handler.
    pub fn add_event_handler_with_resync<H>(
        &self,
        handler: H,
        resync_period: Duration,
    ) -> Result<Registration, InformerError>
    where
        H: EventHandler<T> + Send + 'static,
    {
        self.add_event_handler_with(handler, HandlerOptions::new().resync_period(resync_period))
    }

    /// Registers a cheap handler that runs on the consumer threads, right after each batch is
    /// applied, with no thread and no buffer of its own (see [`HandlerOptions::inline`]).
    pub fn add_event_handler_inline<H>(&self, handler: H) -> Result<Registration, InformerError>
    where
        H: EventHandler<T> + Send + 'static,
    {
        self.add_event_handler_with(handler, HandlerOptions::new().inline())
    }

    /// Registers a handler as `options` say: inline or on a thread of its own, its name,
    /// buffer bound and resync period.
    pub fn add_event_handler_with<H>(
        &self,
        handler: H,
        options: HandlerOptions,
    ) -> Result<Registration, InformerError>
    where
        H: EventHandler<T> + Send + 'static,
    {
        let handler = if options.inline {
            NewHandler::inline(handler)
        } else {
            NewHandler::thread(handler)
        };
        self.register(handler, options)
    }

    /// Registers an async handler: one tokio task on the informer's runtime (spawned at the
    /// start, or at once if the informer runs) awaits its calls, fed by a bounded buffer like
    /// a thread's. Otherwise as [`add_event_handler`](Self::add_event_handler).
    pub fn add_async_event_handler<H>(&self, handler: H) -> Result<Registration, InformerError>
    where
        H: AsyncEventHandler<T> + Send + 'static,
    {
        self.add_async_event_handler_with(handler, HandlerOptions::new())
    }

    /// [`add_async_event_handler`](Self::add_async_event_handler) with options
    /// ([`HandlerOptions::inline`] does not apply and is ignored).
    pub fn add_async_event_handler_with<H>(
        &self,
        handler: H,
        options: HandlerOptions,
    ) -> Result<Registration, InformerError>
    where
        H: AsyncEventHandler<T> + Send + 'static,
    {
        self.register(NewHandler::task(handler), options)
    }

    fn register(
        &self,
        handler: NewHandler<T>,
        options: HandlerOptions,
    ) -> Result<Registration, InformerError> {
        let mut lifecycle = self.lifecycle();
        if lifecycle.stopped {
            return Err(InformerError::Stopped);
        }
        let mut requested = options.resync_period.unwrap_or(self.default_resync);
        if !requested.is_zero() {
            requested = requested.max(MINIMUM_RESYNC_PERIOD);
            if requested < lifecycle.resync_check_period {
                if lifecycle.started {
                    requested = lifecycle.resync_check_period;
                } else {
                    lifecycle.resync_check_period = requested;
                    self.processor.resync_check_period_changed(requested);
                }
            }
        }
        let period = effective_resync_period(requested, lifecycle.resync_check_period);
        let store = &self.store;
        let started = lifecycle.started;
        let listener = ListenerOptions {
            name: options.name,
            bound: options.buffer,
            requested,
            period,
            coalesce_by: options.coalesce.then(|| self.key_fn()),
        };
        let registration = self.processor.add(handler, listener, || {
            if started {
                store.list()
            } else {
                Vec::new()
            }
        })?;
        Ok(registration)
    }

    /// Unregisters a handler: it gets nothing more, and what it has not been delivered yet is
    /// dropped (client-go's `RemoveEventHandler`). Returns false if it was not registered here
    /// (removed already, or another informer's).
    pub fn remove_event_handler(&self, registration: &Registration) -> bool {
        let _lifecycle = self.lifecycle();
        self.processor.remove(registration.id())
    }

    /// How many handlers are registered.
    pub fn handler_count(&self) -> usize {
        self.processor.len()
    }

    /// Adds index functions to the store, also after the start (client-go allows it only
    /// before; the indexers here index existing objects at once).
    pub fn add_indexers(&self, indexers: Indexers<T>) -> Result<(), InformerError> {
        if self.lifecycle().stopped {
            return Err(InformerError::Stopped);
        }
        Ok(self.store.add_indexers(indexers)?)
    }

    /// Starts the reflector on the current tokio runtime and the consumer threads.
    pub fn start(&self) -> Result<(), InformerError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| InformerError::NoRuntime)?;
        self.start_on(&handle)
    }

    /// Starts the reflector on `runtime` and the consumer threads.
    pub fn start_on(&self, runtime: &tokio::runtime::Handle) -> Result<(), InformerError> {
        let mut lifecycle = self.lifecycle();
        if lifecycle.stopped {
            return Err(InformerError::Stopped);
        }
        if lifecycle.started {
            return Err(InformerError::AlreadyStarted);
        }
        let Some(lister_watcher) = lock(&self.lister_watcher).take() else {
            return Err(InformerError::AlreadyStarted);
        };
        for n in 0..self.consumers {
            let (queue, store, processor) = (
                Arc::clone(&self.queue),
                Arc::clone(&self.store),
                Arc::clone(&self.processor),
            );
            let (batch, stop, failure) = (self.batch, self.stop.clone(), Arc::clone(&self.failure));
            let applied = self.applied.clone();
            let thread = std::thread::Builder::new()
                .name(format!("kcache-consumer-{n}"))
                .spawn(move || {
                    let run = catch_unwind(AssertUnwindSafe(|| {
                        consume(&*queue, &*store, &processor, &applied, batch)
                    }));
                    if let Err(panic) = run {
                        // User code (an index function) panicked while a key was half
                        // applied: the store can no longer be trusted. Stop, as client-go's
                        // crash would, but say why instead of ending the process.
                        let message = panic_message(&*panic);
                        lock(&failure).get_or_insert(message);
                        stop.stop();
                        queue.close();
                        applied.stop();
                    }
                });
            match thread {
                Ok(thread) => lifecycle.consumer_threads.push(thread),
                Err(err) => {
                    // Leave nothing half-started: the threads already running see the queue
                    // closed and end.
                    self.queue.close();
                    lifecycle.stopped = true;
                    return Err(err.into());
                }
            }
        }
        self.processor.start_tasks(runtime);
        let mut options = self.reflector_options.clone();
        options.resync_period = lifecycle.resync_check_period;
        let processor = Arc::clone(&self.processor);
        options.should_resync = Some(Arc::new(move || {
            processor.should_resync(tokio::time::Instant::now())
        }));
        let reflector = Reflector::new(lister_watcher, Arc::clone(&self.queue), options);
        lifecycle.reflector = Some(reflector.handle());
        let stop = self.stop.clone();
        lifecycle.reflector_task = Some(runtime.spawn(async move { reflector.run(stop).await }));
        lifecycle.started = true;
        Ok(())
    }

    /// The first list has been applied to the store: every key of it processed (client-go's
    /// `HasSynced`). Each registration has its own, stronger [`Registration::has_synced`].
    pub fn has_synced(&self) -> bool {
        self.queue.has_synced()
    }

    /// Completes once [`has_synced`](Self::has_synced) is true.
    pub async fn wait_for_sync(&self) {
        while !self.has_synced() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The key function of the informer's queue and store.
    pub fn key_fn(&self) -> KeyFn<T> {
        Arc::clone(&self.key_fn)
    }

    /// Read handles on the store.
    pub fn store(&self) -> StoreReader<T, I> {
        StoreReader::new(Arc::clone(&self.store), self.applied.clone())
    }

    /// The newest resource version the store has *applied* (client-go 1.36's
    /// `LastStoreSyncResourceVersion`): everything the reflector queued up to it is in the
    /// store and its notifications are with the handlers. Empty before the first list is
    /// applied. Never ahead of the store, unlike
    /// [`last_sync_resource_version`](Self::last_sync_resource_version).
    pub fn last_store_sync_resource_version(&self) -> String {
        self.applied.get()
    }

    /// The store's applied version as a handle: read it, or wait for a version
    /// ([`AppliedVersion::wait_for`], [`AppliedVersion::wait_for_blocking`]).
    pub fn applied_version(&self) -> AppliedVersion {
        self.applied.clone()
    }

    /// The newest resource version the reflector has put into the queue; empty before the
    /// start and before the first list. The consumers may not have applied it yet: see
    /// [`last_store_sync_resource_version`](Self::last_store_sync_resource_version).
    pub fn last_sync_resource_version(&self) -> String {
        self.lifecycle()
            .reflector
            .as_ref()
            .map(ReflectorHandle::last_sync_resource_version)
            .unwrap_or_default()
    }

    /// How often the reflector checks whether a handler's resync is due: the builder's
    /// period, lowered by handlers added before the start that asked for less.
    pub fn resync_check_period(&self) -> Duration {
        self.lifecycle().resync_check_period
    }

    /// Keys queued and not yet handed to a consumer.
    pub fn queued_keys(&self) -> usize {
        self.queue.len()
    }

    /// Why the informer stopped by itself, if it did: a consumer panicked (an index function
    /// panicked while a key was being applied), which leaves the store untrustworthy, so the
    /// reflector was stopped and the queue closed.
    pub fn failure(&self) -> Option<String> {
        lock(&self.failure).clone()
    }

    /// Whether [`shutdown`](Self::shutdown) has begun.
    pub fn is_stopped(&self) -> bool {
        self.lifecycle().stopped
    }

    /// Stops the informer and waits until everything has ended: the reflector stops, the
    /// consumers process what is queued, each handler is delivered what it was sent, and every
    /// thread and task ends. The informer takes no handlers after this.
    pub async fn shutdown(&self) {
        let (task, consumers) = {
            let mut lifecycle = self.lifecycle();
            lifecycle.stopped = true;
            (
                lifecycle.reflector_task.take(),
                std::mem::take(&mut lifecycle.consumer_threads),
            )
        };
        self.stop.stop();
        self.applied.stop();
        if let Some(task) = task {
            // The task only ends by returning: it catches its own errors.
            let _ = task.await;
        }
        self.queue.close();
        let processor = Arc::clone(&self.processor);
        let joined = tokio::task::spawn_blocking(move || {
            for thread in consumers {
                let _ = thread.join();
            }
            // Only now: every notification the consumers made is in a buffer.
            let stopping = processor.close();
            for thread in stopping.threads {
                let _ = thread.join();
            }
            stopping.tasks
        });
        if let Ok(tasks) = joined.await {
            for task in tasks {
                let _ = task.await;
            }
        }
    }
}

/// The text of a panic payload (a `&str` or a `String`, as `panic!` makes them).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => format!("a consumer panicked: {s}"),
        (_, Some(s)) => format!("a consumer panicked: {s}"),
        _ => "a consumer panicked".to_string(),
    }
}

/// A consumer thread: pops batches, applies each key to the store and distributes its
/// notifications, until the queue is closed and empty.
fn consume<T, Q, I>(
    queue: &Q,
    store: &I,
    processor: &Processor<T>,
    applied: &AppliedVersion,
    batch: usize,
) where
    T: Versioned + Send + Sync + 'static,
    Q: DeltaQueue<T>,
    I: Indexer<T>,
{
    let mut consumer = ConsumerBatch {
        store,
        processor,
        applied,
        distributor: None,
    };
    while queue.pop_batch_into(batch, &mut consumer).is_ok() {
        // Every batch popped had a key, so its `finish` handed it over; now that the queue has
        // completed its keys, the applied version may move.
        applied.checkpoint();
    }
}

/// What a consumer does with one batch: applies each key to the store, collecting the
/// notifications per registration, and hands them over at the batch's end, while the queue
/// still holds the batch's keys for this consumer. A key's next batch, on whichever consumer,
/// is therefore handed over after this one: each registration hears a key's notifications in
/// order, and consumers hand over in parallel.
struct ConsumerBatch<'a, T, I> {
    store: &'a I,
    processor: &'a Processor<T>,
    applied: &'a AppliedVersion,
    /// From the batch's first key to its end: the listener list held shared and the
    /// notifications collected (an idle consumer holds nothing).
    distributor: Option<Distributor<'a, T>>,
}

impl<T, I> BatchConsumer<T> for ConsumerBatch<'_, T, I>
where
    T: Versioned + Send + Sync + 'static,
    I: Indexer<T>,
{
    fn process(&mut self, deltas: Deltas<T>, is_in_initial_list: bool) {
        let (processor, applied) = (self.processor, self.applied);
        let distributor = self.distributor.get_or_insert_with(|| {
            // The first key of the batch, in flight: the applied version waits for this
            // batch's hand-over from here on.
            applied.begin_batch();
            processor.distributor()
        });
        apply_deltas_coalesced(self.store, distributor, &deltas, is_in_initial_list);
    }

    fn finish(&mut self) {
        // Dropping the distributor hands the batch over.
        if self.distributor.take().is_some() {
            self.applied.end_batch();
        }
    }
}

impl<T, L, Q, I> Drop for SharedInformer<T, L, Q, I> {
    fn drop(&mut self) {
        // Dropped without a shutdown: stop the reflector and let every thread end on its own
        // (consumers once the queue is drained, delivery threads once their buffers are).
        self.stop.stop();
        self.applied.stop();
        (self.close_queue)();
        drop(self.processor.close());
    }
}

impl<T, L, Q, I> fmt::Debug for SharedInformer<T, L, Q, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lifecycle = lock(&self.lifecycle);
        f.debug_struct("SharedInformer")
            .field("started", &lifecycle.started)
            .field("stopped", &lifecycle.stopped)
            .field("resync_check_period", &lifecycle.resync_check_period)
            .field("consumers", &self.consumers)
            .field("batch", &self.batch)
            .field("processor", &self.processor)
            .finish_non_exhaustive()
    }
}
