//! What a reconcile is given and returns, and the worker loop that runs reconciles: take a
//! key, wait (bounded) until the cache holds what the key's previous reconcile wrote, read its
//! object from the indexer, reconcile, then forget the key's failures and done it (success),
//! requeue it after a delay, or retry it rate limited (error or panic).

use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::informer::{version_at_least, AppliedVersion, VersionWait};
use crate::key::{Key, KeyMap};
use crate::workqueue::AsyncGet;

use super::metrics::{ReconcileMetrics, ReconcileResult};
use super::queue::ControllerQueue;
use crate::sync::{lock, wait};

/// What a successful reconcile asks for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Nothing until the object (or one mapped to it) changes again. The key's failures are
    /// forgotten.
    Done,
    /// Reconcile the key again after this delay (a periodic check, a wait for something
    /// outside the cluster). The key's failures are forgotten.
    RequeueAfter(Duration),
}

/// One reconcile's input: the key, and its object as the informer's indexer holds it.
#[derive(Debug, Clone)]
pub struct Request<K> {
    key: Key,
    object: Option<Arc<K>>,
    worker: usize,
    retries: u64,
    /// The newest resource version this reconcile wrote ([`Request::wrote`]); shared by the
    /// request's clones, read by the worker when the reconcile is over.
    wrote: Arc<Mutex<Option<String>>>,
}

impl<K> Request<K> {
    /// The key being reconciled.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The object, shared with the indexer (no copy), as stored when the reconcile started;
    /// `None` when the indexer holds no object for the key: it was deleted ("not found").
    pub fn object(&self) -> Option<&Arc<K>> {
        self.object.as_ref()
    }

    /// Which worker runs this reconcile, `0..workers` (for per-worker state).
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// How many times the key was retried after an error since it last succeeded.
    pub fn retries(&self) -> u64 {
        self.retries
    }

    /// Tells the controller that this reconcile wrote the key's object (or another object of
    /// the primary informer) and the API server answered with `resource_version`. Whatever the
    /// reconcile returns, the key's next reconcile starts only once the informer's cache has
    /// applied that version (or the builder's
    /// [`cache_wait_timeout`](super::ControllerBuilder::cache_wait_timeout) has passed), so it
    /// never acts on a cache older than its own write. Call it after every write; the newest
    /// version counts.
    ///
    /// ```
    /// # use kcache::controller::{Action, Request};
    /// # struct Pod;
    /// fn reconcile(request: &Request<Pod>, _: &()) -> Result<Action, String> {
    ///     // ... update the object; the API server returns it with resource version "1234"
    ///     request.wrote("1234");
    ///     Ok(Action::Done)
    /// }
    /// ```
    pub fn wrote(&self, resource_version: &str) {
        let mut wrote = lock(&self.wrote);
        let newer = wrote
            .as_deref()
            .is_none_or(|old| !version_at_least(old, resource_version));
        if newer {
            *wrote = Some(resource_version.to_string());
        }
    }

    fn written(&self) -> Option<String> {
        lock(&self.wrote).clone()
    }
}

/// Reads a key's object from the primary informer's indexer.
pub(crate) type Lookup<K> = Arc<dyn Fn(&Key) -> Option<Arc<K>> + Send + Sync>;

/// Told of every failed reconcile: its key and message.
pub(crate) type ErrorReport = Arc<dyn Fn(&Key, &str) + Send + Sync>;

/// How a controller waits for its own writes to reach the cache.
pub(crate) struct CacheWait {
    /// The primary informer's applied version.
    pub(crate) applied: AppliedVersion,
    /// How long a worker waits at most; zero: never.
    pub(crate) timeout: Duration,
    /// Per key, the version its last reconcile wrote, until its next reconcile starts.
    writes: Mutex<KeyMap<String>>,
    /// Wakes async workers' waits when the controller stops.
    stopped: tokio::sync::Notify,
}

impl CacheWait {
    pub(crate) fn new(applied: AppliedVersion, timeout: Duration) -> Self {
        Self {
            applied,
            timeout,
            writes: Mutex::default(),
            stopped: tokio::sync::Notify::new(),
        }
    }

    /// The version `key`'s next reconcile must wait for, taken (a key waits once per write),
    /// if there is one and it is not applied yet.
    fn take_pending(&self, key: &Key) -> Option<String> {
        if self.timeout.is_zero() {
            return None;
        }
        let version = lock(&self.writes).remove(key)?;
        (!self.applied.has_reached(&version)).then_some(version)
    }
}

/// The state every worker of one controller shares.
pub(crate) struct WorkerContext<K> {
    pub(crate) queue: Arc<dyn ControllerQueue>,
    pub(crate) lookup: Lookup<K>,
    pub(crate) metrics: ReconcileMetrics,
    pub(crate) on_error: Option<ErrorReport>,
    pub(crate) cache_wait: CacheWait,
    /// Set by shutdown: a worker that takes a key after this leaves it unreconciled.
    pub(crate) stopping: AtomicBool,
    /// Workers between their first and last queue call after a reconcile (requeue or forget,
    /// then `done`); with `finished`, what lets [`is_idle`](WorkerContext::is_idle) read the queue's
    /// counts one after another and still be right.
    finishing: AtomicUsize,
    /// Reconciles whose queue calls are over.
    finished: AtomicU64,
    /// Workers still running, and its condition variable (threads wait on it) and notify
    /// (tasks wait on it).
    running: Mutex<usize>,
    ended: Condvar,
    ended_async: tokio::sync::Notify,
}

impl<K> WorkerContext<K> {
    pub(crate) fn new(
        queue: Arc<dyn ControllerQueue>,
        lookup: Lookup<K>,
        metrics: ReconcileMetrics,
        on_error: Option<ErrorReport>,
        cache_wait: CacheWait,
        workers: usize,
    ) -> Self {
        Self {
            queue,
            lookup,
            metrics,
            on_error,
            cache_wait,
            stopping: AtomicBool::new(false),
            finishing: AtomicUsize::new(0),
            finished: AtomicU64::new(0),
            running: Mutex::new(workers),
            ended: Condvar::new(),
            ended_async: tokio::sync::Notify::new(),
        }
    }

    /// Takes `key` (handed out by `get`): whether to reconcile it. While stopping, the key is
    /// done at once and left for the next run of the controller (its informer's list).
    fn admit(&self, key: &Key) -> bool {
        // Acquire pairs with shutdown's Release store; nothing else rides on it.
        if self.stopping.load(Ordering::Acquire) {
            self.metrics.skipped();
            let _ = self.queue.done(key);
            return false;
        }
        true
    }

    /// Stops every wait for the cache (the controller is stopping).
    pub(crate) fn stop_waits(&self) {
        self.cache_wait.stopped.notify_waiters();
        self.cache_wait.applied.wake();
    }

    /// Blocks until the cache has applied what `key`'s previous reconcile wrote, the timeout
    /// passes, the informer stops or the controller does.
    fn wait_for_cache(&self, key: &Key) {
        let wait = &self.cache_wait;
        let Some(version) = wait.take_pending(key) else {
            return;
        };
        self.metrics.cache_wait_started();
        // Acquire pairs with shutdown's Release store; `stop_waits` wakes us to read it.
        let end = wait
            .applied
            .wait_blocking_until(&version, Some(wait.timeout), || {
                self.stopping.load(Ordering::Acquire)
            });
        let stopped = self.stopping.load(Ordering::Acquire);
        self.metrics
            .cache_wait_ended(end == VersionWait::TimedOut && !stopped);
    }

    /// [`wait_for_cache`](Self::wait_for_cache) for an async worker.
    async fn wait_for_cache_async(&self, key: &Key) {
        let wait = &self.cache_wait;
        let Some(version) = wait.take_pending(key) else {
            return;
        };
        self.metrics.cache_wait_started();
        let stopped = wait.stopped.notified();
        tokio::pin!(stopped);
        // Registered before the check: a stop after it wakes this wait.
        stopped.as_mut().enable();
        let timed_out = !self.stopping.load(Ordering::Acquire)
            && tokio::select! {
                _ = wait.applied.wait_for(&version) => false,
                _ = &mut stopped => false,
                _ = tokio::time::sleep(wait.timeout) => true,
            };
        self.metrics.cache_wait_ended(timed_out);
    }

    fn request(&self, key: Key, worker: usize) -> Request<K> {
        let object = (self.lookup)(&key);
        let retries = self.queue.num_requeues(&key);
        Request {
            key,
            object,
            worker,
            retries,
            wrote: Arc::default(),
        }
    }

    /// Ends a reconcile of `key` that returned `outcome` after `took`: metrics, then the
    /// queue calls (requeue or forget, then `done`).
    fn finish<E: fmt::Display>(
        &self,
        key: &Key,
        wrote: Option<String>,
        outcome: Result<Result<Action, E>, String>,
        took: Duration,
    ) {
        // SeqCst, like every access to `finishing` and `finished`: `is_idle` relies on one
        // total order of these and its own reads (see there).
        self.finishing.fetch_add(1, Ordering::SeqCst);
        if let Some(version) = wrote {
            // Before `done`: the key's next reconcile cannot start before it, and finds this.
            lock(&self.cache_wait.writes).insert(key.clone(), version);
        }
        let (result, panicked) = match outcome {
            Ok(Ok(Action::Done)) => {
                self.queue.forget(key);
                (ReconcileResult::Success, false)
            }
            Ok(Ok(Action::RequeueAfter(delay))) => {
                self.queue.forget(key);
                self.queue.add_after(key.clone(), delay);
                (ReconcileResult::RequeueAfter, false)
            }
            Ok(Err(error)) => {
                if let Some(on_error) = &self.on_error {
                    on_error(key, &error.to_string());
                }
                self.queue.add_rate_limited(key.clone());
                (ReconcileResult::Error, false)
            }
            Err(panic) => {
                if let Some(on_error) = &self.on_error {
                    on_error(key, &panic);
                }
                self.queue.add_rate_limited(key.clone());
                (ReconcileResult::Error, true)
            }
        };
        self.metrics.observe(result, took, panicked);
        // The key was handed out by `get` and is done once, here: this cannot fail.
        let _ = self.queue.done(key);
        self.finished.fetch_add(1, Ordering::SeqCst);
        self.finishing.fetch_sub(1, Ordering::SeqCst);
    }

    /// Nothing waits for a ready time, nothing is queued, nothing is being reconciled.
    ///
    /// The counts are read one after another, not at one instant, so a key could move between
    /// them. Keys move forward only (waiting → queued by the timer, queued → processing by
    /// `get`) except through a worker's requeue and `done`, which happen while `finishing` is
    /// raised and raise `finished`. Reading waiting, then queued, then processing catches every
    /// forward move; a backward move between the first and the last read shows as `finishing`
    /// non-zero or `finished` changed. Adds from the informers are the caller's to rule out.
    pub(crate) fn is_idle(&self) -> bool {
        let before = self.finished.load(Ordering::SeqCst);
        self.finishing.load(Ordering::SeqCst) == 0
            && self.queue.waiting_len() == 0
            && self.queue.is_empty()
            && self.queue.processing_len() == 0
            && self.finishing.load(Ordering::SeqCst) == 0
            && self.finished.load(Ordering::SeqCst) == before
    }

    /// A worker returned (or was never started).
    pub(crate) fn worker_ended(&self) {
        let mut running = lock(&self.running);
        *running = running.saturating_sub(1);
        if *running == 0 {
            self.ended.notify_all();
            self.ended_async.notify_waiters();
        }
    }

    /// Blocks until every worker has returned.
    pub(crate) fn wait_workers(&self) {
        let mut running = lock(&self.running);
        while *running > 0 {
            running = wait(&self.ended, running);
        }
    }

    /// Completes once every worker has returned.
    pub(crate) async fn wait_workers_async(&self) {
        loop {
            let notified = self.ended_async.notified();
            tokio::pin!(notified);
            // Registered before the check: a last worker ending after it wakes this waiter.
            notified.as_mut().enable();
            if *lock(&self.running) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl<K> fmt::Debug for WorkerContext<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerContext")
            .field("metrics", &self.metrics)
            .field("stopping", &self.stopping)
            .finish_non_exhaustive()
    }
}

/// The text of a panic payload (a `&str` or a `String`, as `panic!` makes them).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => format!("the reconcile panicked: {s}"),
        (_, Some(s)) => format!("the reconcile panicked: {s}"),
        _ => "the reconcile panicked".to_string(),
    }
}

/// Counts the worker out when it returns, also by a panic of the controller's own code.
struct WorkerGuard<'a, K>(&'a WorkerContext<K>);

impl<K> Drop for WorkerGuard<'_, K> {
    fn drop(&mut self) {
        self.0.worker_ended();
    }
}

/// A worker thread: reconciles keys with `reconcile` until the queue shuts down and is empty.
pub(crate) fn run_sync_worker<K, C, E, F>(
    shared: &WorkerContext<K>,
    worker: usize,
    ctx: &C,
    reconcile: &F,
) where
    F: Fn(&Request<K>, &C) -> Result<Action, E>,
    E: fmt::Display,
{
    let _guard = WorkerGuard(shared);
    while let Ok(key) = shared.queue.get() {
        if !shared.admit(&key) {
            continue;
        }
        shared.wait_for_cache(&key);
        // A shutdown during the wait leaves the key unreconciled, as at `get`.
        if !shared.admit(&key) {
            continue;
        }
        let request = shared.request(key, worker);
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| reconcile(&request, ctx)))
            .map_err(|panic| panic_message(&*panic));
        let took = started.elapsed();
        shared.finish(&request.key, request.written(), outcome, took);
    }
}

/// A worker task: as [`run_sync_worker`], awaiting `reconcile`'s futures one at a time.
pub(crate) async fn run_async_worker<K, C, E, F, Fut>(
    shared: Arc<WorkerContext<K>>,
    worker: usize,
    ctx: Arc<C>,
    reconcile: Arc<F>,
) where
    F: Fn(Request<K>, Arc<C>) -> Fut,
    Fut: Future<Output = Result<Action, E>> + Send,
    E: fmt::Display,
{
    let _guard = WorkerGuard(&*shared);
    while let Ok(key) = shared.queue.get_async().await {
        if !shared.admit(&key) {
            continue;
        }
        shared.wait_for_cache_async(&key).await;
        if !shared.admit(&key) {
            continue;
        }
        let request = shared.request(key.clone(), worker);
        let wrote = Arc::clone(&request.wrote);
        let started = Instant::now();
        let outcome = match catch_unwind(AssertUnwindSafe(|| reconcile(request, Arc::clone(&ctx))))
        {
            Ok(future) => CatchUnwind(Box::pin(future)).await,
            Err(panic) => Err(panic_message(&*panic)),
        };
        let took = started.elapsed();
        let wrote = lock(&wrote).take();
        shared.finish(&key, wrote, outcome, took);
    }
}

/// A future that turns a panic of its inner future's `poll` into an error.
struct CatchUnwind<F>(Pin<Box<F>>);

impl<F: Future> Future for CatchUnwind<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(panic) => Poll::Ready(Err(panic_message(&*panic))),
        }
    }
}
