//! [`Controller`] and its builder: the informers' handlers feed one workqueue, and workers
//! (threads for a sync reconcile, tokio tasks for an async one) reconcile its keys.

use std::fmt;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use thiserror::Error;

use crate::informer::{
    AppliedVersion, HandlerOptions, InformerError, ListerWatcher, Registration, SharedInformer,
    Versioned,
};
use crate::key::{Key, KeyFn};
use crate::queue::DeltaQueue;
use crate::store::Indexer;
use crate::workqueue::priority::{PriorityOptions, ShardedPriorityQueue};
use crate::workqueue::{
    default_controller_rate_limiter, DelayingQueue, QueueConfig, RateLimiter, RateLimitingQueue,
    ShardedQueue, DEFAULT_WORKQUEUE_SHARDS,
};

use super::handler::{EnqueueMapped, EnqueuePrimary, Event, EventFilter, Priorities};
use super::mapping::{owner_mapper, Mapper, Owned};
use super::metrics::{ReconcileMetrics, ReconcileMetricsProvider, ReconcileStats};
use super::nice::lower_this_thread;
use super::queue::ControllerQueue;
use super::reconcile::{
    run_async_worker, run_sync_worker, Action, CacheWait, ErrorReport, Lookup, Request,
    WorkerContext,
};
use crate::sync::lock;

/// How long a reconcile waits by default for the cache to apply its key's last write.
pub const DEFAULT_CACHE_WAIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a controller could not start.
#[derive(Debug, Error)]
pub enum ControllerError {
    /// An informer refused the controller's handler (it was shut down).
    #[error("cannot register the controller's handler: {0}")]
    Informer(#[from] InformerError),
    /// `run_async` was called outside a tokio runtime.
    #[error("run_async needs a tokio runtime: call it from within one (or use run)")]
    NoRuntime,
    /// A worker thread could not be spawned.
    #[error("cannot spawn a worker thread: {0}")]
    Spawn(#[from] std::io::Error),
    /// Zero workers were asked for.
    #[error("a controller needs at least one worker")]
    NoWorkers,
    /// [`ControllerBuilder::worker_nice`] was refused by the system.
    #[error("cannot lower the workers' priority: {0}")]
    Nice(std::io::Error),
}

/// Registers a secondary informer's handler, once the queue exists.
type Registrar<'a> = Box<
    dyn FnOnce(
            &Arc<dyn ControllerQueue>,
            Priorities,
            HandlerOptions,
        ) -> Result<Registration, InformerError>
        + 'a,
>;

/// Registers the primary informer's handler.
type PrimaryRegistrar<'a, K> =
    Box<dyn FnOnce(EnqueuePrimary<K>, HandlerOptions) -> Result<Registration, InformerError> + 'a>;

/// Configures a [`Controller`]; made by [`Controller::builder`].
pub struct ControllerBuilder<'a, K> {
    name: String,
    workers: usize,
    queue: Option<Arc<dyn ControllerQueue>>,
    limiter: Option<Box<dyn RateLimiter<Key>>>,
    queue_config: Option<QueueConfig>,
    priority_queue: bool,
    priority_options: PriorityOptions,
    lookup: Lookup<K>,
    key_fn: KeyFn<K>,
    primary: PrimaryRegistrar<'a, K>,
    secondaries: Vec<Registrar<'a>>,
    filter: Option<EventFilter<K>>,
    low_priority_when_unchanged: bool,
    /// The worker threads' `nice` value, if they are to yield to the informer.
    worker_nice: Option<i32>,
    handler_options: HandlerOptions,
    metrics: Option<Arc<dyn ReconcileMetricsProvider>>,
    on_error: Option<ErrorReport>,
    /// The primary informer's applied version, and how long to wait for it.
    applied: AppliedVersion,
    cache_wait_timeout: Duration,
}

/// Workers: threads or tokio tasks.
enum Workers {
    Threads(Vec<JoinHandle<()>>),
    Tasks(Vec<tokio::task::JoinHandle<()>>),
}

/// A reconcile loop over a [`SharedInformer`] and a workqueue (kube-rs' `Controller`,
/// controller-runtime's controller): every change of a primary object, or of a secondary
/// object mapped to one, enqueues the primary's key; workers reconcile keys, one worker per
/// key at a time, reading the object from the informer's indexer. See the [module
/// docs](super) for an example and the guarantees.
pub struct Controller<K> {
    name: String,
    shared: Arc<WorkerContext<K>>,
    workers: Mutex<Option<Workers>>,
    registrations: Vec<Registration>,
}

impl<K: Versioned + Send + Sync + 'static> Controller<K> {
    /// Starts configuring a controller of `primary`'s objects: one worker, a sharded
    /// rate-limiting workqueue with client-go's default limiter, initial-list and resync keys
    /// at low priority (where the queue has priorities).
    pub fn builder<L, Q, I>(primary: &SharedInformer<K, L, Q, I>) -> ControllerBuilder<'_, K>
    where
        L: ListerWatcher<K> + 'static,
        Q: DeltaQueue<K> + 'static,
        I: Indexer<K> + 'static,
    {
        let store = primary.store();
        ControllerBuilder {
            name: "controller".to_string(),
            workers: 1,
            queue: None,
            limiter: None,
            queue_config: None,
            priority_queue: false,
            priority_options: PriorityOptions::new(),
            lookup: Arc::new(move |key: &Key| store.get_by_key(key)),
            key_fn: primary.key_fn(),
            primary: Box::new(move |handler, options| {
                primary.add_event_handler_with(handler, options)
            }),
            secondaries: Vec::new(),
            filter: None,
            low_priority_when_unchanged: true,
            worker_nice: None,
            handler_options: HandlerOptions::new(),
            metrics: None,
            on_error: None,
            applied: primary.applied_version(),
            cache_wait_timeout: DEFAULT_CACHE_WAIT_TIMEOUT,
        }
    }
}

impl<'a, K: Versioned + Send + Sync + 'static> ControllerBuilder<'a, K> {
    /// The controller's name: the `controller` label of its metrics, the workqueue's name
    /// (when the builder makes the queue) and its handler registrations'.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How many reconciles may run at once (controller-runtime's `MaxConcurrentReconciles`);
    /// at least 1. Default 1.
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// Runs the worker threads of [`run`](Self::run) at this `nice` value (1..=19; Linux):
    /// below the informer's own threads, so that CPU-bound reconciles on a machine with fewer
    /// cores than busy threads do not starve the reflector and the consumers. Without it a
    /// reconcile storm delays every event before its key reaches the workqueue, where its
    /// priority would have put it first (W7 in docs/workloads.md measures this). Raising
    /// niceness needs no privilege. [`run`](Self::run) fails if the system refuses; async
    /// workers (tokio tasks) are not affected. Default: the workers inherit the caller's.
    pub fn worker_nice(mut self, nice: i32) -> Self {
        self.worker_nice = Some(nice.clamp(1, 19));
        self
    }

    /// The limiter of the builder's workqueue: how long a key waits after a failed reconcile.
    /// Default: client-go's [`default_controller_rate_limiter`]. Ignored with
    /// [`queue`](Self::queue), whose own limiter is used.
    pub fn rate_limiter(mut self, limiter: impl RateLimiter<Key> + 'static) -> Self {
        self.limiter = Some(Box::new(limiter));
        self
    }

    /// The builder's workqueue's configuration (clock, metrics provider; the name defaults
    /// to the controller's). Ignored with [`queue`](Self::queue).
    pub fn queue_config(mut self, config: QueueConfig) -> Self {
        self.queue_config = Some(config);
        self
    }

    /// Makes the builder's workqueue a [`ShardedPriorityQueue`] (controller-runtime's priority
    /// queue, sharded) instead of the rate-limiting queue: live changes are handed out before
    /// the low-priority keys of an initial list or a resync. Ignored with
    /// [`queue`](Self::queue).
    pub fn priority_queue(mut self, on: bool) -> Self {
        self.priority_queue = on;
        self
    }

    /// Aging and fairness for the builder's priority queue ([`PriorityOptions`]:
    /// `max_wait`, `fair`, `fair_by`); implies [`priority_queue(true)`](Self::priority_queue).
    /// Ignored with [`queue`](Self::queue). See docs/controller.md for when to turn them on.
    pub fn priority_options(mut self, options: PriorityOptions) -> Self {
        self.priority_queue = true;
        self.priority_options = options;
        self
    }

    /// Runs on this workqueue instead of the builder's (for instance a
    /// [`ReferenceQueue`](crate::workqueue::ReferenceQueue) under the rate-limiting layer, or
    /// a queue with priorities). The controller shuts it down when it stops.
    pub fn queue(mut self, queue: Arc<dyn ControllerQueue>) -> Self {
        self.queue = Some(queue);
        self
    }

    /// Reconciles the keys `mapper` returns for every change of `secondary`'s objects
    /// (controller-runtime's `Watches` with `EnqueueRequestsFromMapFunc`). An update enqueues
    /// the keys of both the old and the new object.
    pub fn watches<S, L, Q, I>(
        mut self,
        secondary: &'a SharedInformer<S, L, Q, I>,
        mapper: Mapper<S>,
    ) -> Self
    where
        S: Versioned + Send + Sync + 'static,
        L: ListerWatcher<S> + 'static,
        Q: DeltaQueue<S> + 'static,
        I: Indexer<S> + 'static,
    {
        self.secondaries
            .push(Box::new(move |queue, priorities, options| {
                let handler = EnqueueMapped {
                    queue: Arc::clone(queue),
                    mapper,
                    priorities,
                };
                secondary.add_event_handler_with(handler, options)
            }));
        self
    }

    /// Reconciles the owner of kind `owner_kind` of every changed object of `secondary`
    /// (controller-runtime's `Owns`: the owner reference marked as controller).
    pub fn owns<S, L, Q, I>(
        self,
        secondary: &'a SharedInformer<S, L, Q, I>,
        owner_kind: &str,
    ) -> Self
    where
        S: Versioned + Owned + Send + Sync + 'static,
        L: ListerWatcher<S> + 'static,
        Q: DeltaQueue<S> + 'static,
        I: Indexer<S> + 'static,
    {
        self.watches(secondary, owner_mapper(owner_kind, true))
    }

    /// Enqueues a primary notification only when `filter` says so (controller-runtime's
    /// predicates). It runs on the handler's delivery thread, before the key is added.
    pub fn event_filter(
        mut self,
        filter: impl Fn(&Event<'_, K>) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.filter = Some(Arc::new(filter));
        self
    }

    /// Whether keys of the initial list and of resyncs go in at
    /// [`LOW_PRIORITY`](super::LOW_PRIORITY) (default true, as controller-runtime's
    /// controllers do), so live changes pass them in a queue with priorities. Without, every
    /// add has the normal priority.
    pub fn low_priority_when_unchanged(mut self, low: bool) -> Self {
        self.low_priority_when_unchanged = low;
        self
    }

    /// How the controller's handlers are delivered to (default: a thread of their own, with
    /// the informer's buffer; see [`HandlerOptions`]). The name is set by the controller.
    pub fn handler_options(mut self, options: HandlerOptions) -> Self {
        self.handler_options = options;
        self
    }

    /// Exports the reconcile metrics through `provider` (with the `prometheus` feature,
    /// [`ControllerPrometheus`](super::ControllerPrometheus)).
    pub fn metrics(mut self, provider: Arc<dyn ReconcileMetricsProvider>) -> Self {
        self.metrics = Some(provider);
        self
    }

    /// How long a worker waits, before it reconciles a key, for the primary informer's cache
    /// to apply the version the key's previous reconcile wrote ([`Request::wrote`]); after
    /// that it reconciles anyway and counts a `cache_wait_timeouts`. Default
    /// [`DEFAULT_CACHE_WAIT_TIMEOUT`] (10 s); `Duration::ZERO` never waits. A reconcile that
    /// never calls `wrote` never waits. The worker (thread or task) is busy while it waits.
    pub fn cache_wait_timeout(mut self, timeout: Duration) -> Self {
        self.cache_wait_timeout = timeout;
        self
    }

    /// Called with the key and the message of every failed reconcile (an error or a panic),
    /// before its retry is scheduled. Failures are counted either way.
    pub fn on_error(mut self, report: impl Fn(&Key, &str) + Send + Sync + 'static) -> Self {
        self.on_error = Some(Arc::new(report));
        self
    }

    /// Starts `workers` threads that reconcile with `reconcile`, handed `ctx` (the state
    /// every reconcile shares: clients, caches, a recorder).
    pub fn run<C, E, F>(self, reconcile: F, ctx: Arc<C>) -> Result<Controller<K>, ControllerError>
    where
        C: Send + Sync + 'static,
        E: fmt::Display + 'static,
        F: Fn(&Request<K>, &C) -> Result<Action, E> + Send + Sync + 'static,
    {
        let workers = self.workers;
        let nice = self.worker_nice;
        let (mut controller, shared) = self.start()?;
        let reconcile = Arc::new(reconcile);
        let mut threads = Vec::with_capacity(workers);
        // Each worker lowers its own priority before its first reconcile and says whether it
        // could; `run` waits for every answer.
        let (niced, nice_results) = std::sync::mpsc::channel();
        for worker in 0..workers {
            let (own_shared, ctx, reconcile, niced) = (
                Arc::clone(&shared),
                Arc::clone(&ctx),
                Arc::clone(&reconcile),
                niced.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name(format!("kcache-reconcile-{worker}"))
                .spawn(move || {
                    let _ = niced.send(nice.map_or(Ok(()), lower_this_thread));
                    drop(niced);
                    run_sync_worker(&own_shared, worker, &*ctx, &*reconcile);
                });
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(err) => {
                    // The workers already running see the queue shut down and end; the ones
                    // never started are counted out.
                    for _ in worker..workers {
                        shared.worker_ended();
                    }
                    controller.stop();
                    return Err(err.into());
                }
            }
        }
        controller.workers = Mutex::new(Some(Workers::Threads(threads)));
        drop(niced);
        // Every sender is dropped once its answer is sent: this ends after `workers` answers.
        if let Some(Err(err)) = nice_results.iter().find(Result::is_err) {
            controller.stop();
            return Err(ControllerError::Nice(err));
        }
        Ok(controller)
    }

    /// Starts `workers` tasks on the current tokio runtime that reconcile with the async
    /// `reconcile`, handed `ctx`. Each task awaits one reconcile at a time.
    pub fn run_async<C, E, F, Fut>(
        self,
        reconcile: F,
        ctx: Arc<C>,
    ) -> Result<Controller<K>, ControllerError>
    where
        C: Send + Sync + 'static,
        E: fmt::Display + 'static,
        F: Fn(Request<K>, Arc<C>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| ControllerError::NoRuntime)?;
        let workers = self.workers;
        let (mut controller, shared) = self.start()?;
        let reconcile = Arc::new(reconcile);
        let tasks = (0..workers)
            .map(|worker| {
                runtime.spawn(run_async_worker(
                    Arc::clone(&shared),
                    worker,
                    Arc::clone(&ctx),
                    Arc::clone(&reconcile),
                ))
            })
            .collect();
        controller.workers = Mutex::new(Some(Workers::Tasks(tasks)));
        Ok(controller)
    }

    /// Makes the queue and the shared state, and registers the handlers.
    fn start(self) -> Result<(Controller<K>, Arc<WorkerContext<K>>), ControllerError> {
        if self.workers == 0 {
            return Err(ControllerError::NoWorkers);
        }
        let queue = match self.queue {
            Some(queue) => queue,
            None => {
                let config = self
                    .queue_config
                    .unwrap_or_else(|| QueueConfig::new().name(self.name.clone()));
                let limiter = self
                    .limiter
                    .unwrap_or_else(|| Box::new(default_controller_rate_limiter()));
                let queue: Arc<dyn ControllerQueue> = if self.priority_queue {
                    Arc::new(ShardedPriorityQueue::with_options(
                        DEFAULT_WORKQUEUE_SHARDS,
                        &config,
                        limiter,
                        self.priority_options,
                    ))
                } else {
                    Arc::new(RateLimitingQueue::new(
                        DelayingQueue::with_config(
                            ShardedQueue::with_config(DEFAULT_WORKQUEUE_SHARDS, &config),
                            &config,
                        ),
                        limiter,
                    ))
                };
                queue
            }
        };
        let metrics = ReconcileMetrics::new(&self.name, self.metrics.as_deref());
        let shared = Arc::new(WorkerContext::new(
            Arc::clone(&queue),
            self.lookup,
            metrics,
            self.on_error,
            CacheWait::new(self.applied, self.cache_wait_timeout),
            self.workers,
        ));
        let mut controller = Controller {
            name: self.name.clone(),
            shared: Arc::clone(&shared),
            workers: Mutex::new(None),
            registrations: Vec::new(),
        };
        let priorities = Priorities::new(self.low_priority_when_unchanged);
        let options = |n: usize| {
            self.handler_options
                .clone()
                .name(format!("{}-{n}", self.name))
        };
        let primary = EnqueuePrimary {
            queue: Arc::clone(&queue),
            key_fn: self.key_fn,
            filter: self.filter,
            priorities,
        };
        let primary_registration = (self.primary)(primary, options(0));
        let registered = primary_registration.and_then(|first| {
            let mut registrations = vec![first];
            for (n, secondary) in self.secondaries.into_iter().enumerate() {
                registrations.push(secondary(&queue, priorities, options(n + 1))?);
            }
            Ok(registrations)
        });
        match registered {
            Ok(registrations) => controller.registrations = registrations,
            Err(err) => {
                controller.stop();
                for _ in 0..self.workers {
                    shared.worker_ended();
                }
                return Err(err.into());
            }
        }
        Ok((controller, shared))
    }
}

impl<K> Controller<K> {
    /// The controller's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The workqueue (its lengths, its metrics).
    pub fn queue(&self) -> &Arc<dyn ControllerQueue> {
        &self.shared.queue
    }

    /// The handler registrations on the primary informer (first) and the secondary ones, in
    /// the order they were given: their `has_synced`, or to remove them.
    pub fn registrations(&self) -> &[Registration] {
        &self.registrations
    }

    /// Completes once every registration has been delivered its informer's initial list
    /// (so every object of it has been enqueued).
    pub async fn wait_for_sync(&self) {
        for registration in &self.registrations {
            registration.wait_for_sync().await;
        }
    }

    /// The reconcile counts so far.
    pub fn stats(&self) -> ReconcileStats {
        self.shared.metrics.snapshot()
    }

    /// Nothing waits for a retry or a requeue, nothing is queued, nothing is being
    /// reconciled. Whether a handler is about to add a key is the caller's to know (an
    /// informer that has delivered everything, a quiet server).
    pub fn is_idle(&self) -> bool {
        self.shared.is_idle()
    }

    /// Whether [`shutdown`](Self::shutdown) has begun.
    pub fn is_stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Acquire)
    }

    /// Stops taking keys: reconciles in flight finish (and their requeues are dropped with
    /// the queue's waiting keys); keys still queued are left unreconciled.
    fn stop(&self) {
        // Release pairs with the workers' Acquire loads in `admit` and in their waits for the
        // cache, which `stop_waits` wakes to read it.
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.stop_waits();
        self.shared.queue.shut_down();
    }

    /// Graceful shutdown: no new reconcile starts, the ones in flight finish, then every
    /// worker has returned. The handlers stay registered but add nothing (the queue is shut
    /// down); remove them with the informer's `remove_event_handler` if the informer lives on.
    pub async fn shutdown(&self) {
        self.stop();
        self.shared.wait_workers_async().await;
        self.join_workers().await;
    }

    /// [`shutdown`](Self::shutdown) for a caller outside any async runtime (a controller
    /// started with [`run`](ControllerBuilder::run)). Do not call it from within an async
    /// task: it blocks the thread until the workers return.
    pub fn shutdown_blocking(&self) {
        self.stop();
        self.shared.wait_workers();
        let workers = lock(&self.workers).take();
        if let Some(Workers::Threads(threads)) = workers {
            for thread in threads {
                let _ = thread.join();
            }
        }
    }

    async fn join_workers(&self) {
        let workers = lock(&self.workers).take();
        match workers {
            // Every worker has counted itself out: each thread is returning, so joining is
            // immediate.
            Some(Workers::Threads(threads)) => {
                for thread in threads {
                    let _ = thread.join();
                }
            }
            Some(Workers::Tasks(tasks)) => {
                for task in tasks {
                    let _ = task.await;
                }
            }
            None => {}
        }
    }
}

impl<K> Drop for Controller<K> {
    fn drop(&mut self) {
        // Dropped without a shutdown: the workers end on their own once the reconciles in
        // flight are over.
        self.stop();
    }
}

impl<K> fmt::Debug for Controller<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("name", &self.name)
            .field("shared", &self.shared)
            .field("registrations", &self.registrations.len())
            .finish_non_exhaustive()
    }
}

impl<K> fmt::Debug for ControllerBuilder<'_, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControllerBuilder")
            .field("name", &self.name)
            .field("workers", &self.workers)
            .field("secondaries", &self.secondaries.len())
            .field(
                "low_priority_when_unchanged",
                &self.low_priority_when_unchanged,
            )
            .finish_non_exhaustive()
    }
}
