//! The reflector: keeps a [`DeltaQueue`] in step with a [`ListerWatcher`] (client-go's
//! `Reflector`).
//!
//! # Algorithm
//!
//! `run` repeats *list and watch* until stopped, waiting a [`Backoff`] delay between two
//! rounds (client-go's `BackoffUntil` with sliding delays):
//!
//! 1. **List**, in pages of `page_size` following `continue`, from the last resource version
//!    seen (`"0"` before the first list). If the server says that version is too old (410) or
//!    too new, list again from `""` (the newest state). `replace` the queue with every item and
//!    the list's resource version, and remember that version.
//! 2. **Watch** from the remembered version, with bookmarks. Apply each event to the queue
//!    (`Added` → add, `Modified` → update, `Deleted` → delete), the events already received
//!    in one [`DeltaQueue::apply_events`] batch, and remember the newest version; a bookmark
//!    only moves the version. A watch that ends (its timeout, a broken connection)
//!    is re-opened from the remembered version, without a list. A watch that cannot be opened
//!    because the connection was refused, or that the server ends with 429, is re-opened after
//!    a backoff delay, also without a list.
//! 3. Anything else ends the round and so forces a fresh list: a `410 Expired` (the version
//!    fell out of the server's window), any other server error event, a watch that closed
//!    within a second without an event (the server is unwell), a failed list.
//!
//! A wait is never shorter than the server's `Retry-After` (a 429's), as client-go's REST
//! client sleeps it before retrying.
//!
//! Meanwhile a resync timer calls the queue's `resync` every `resync_period` when
//! `should_resync` agrees.
//!
//! # Never blocking the runtime
//!
//! The reflector runs on tokio's worker threads, so nothing it calls blocks: before each batch
//! it awaits the queue's [`wait_for_room`](DeltaQueue::wait_for_room) (a bounded queue's
//! blocking `add` would hold the worker until a consumer pops), and the relist's `replace`,
//! one atomic operation that cannot yield halfway and costs time in proportion to the list,
//! runs on the blocking pool (`spawn_blocking`). See docs/informer.md.
//!
//! # Differences from client-go
//!
//! - Every error that ends a list, a watch or a round goes to the error handler, once.
//!   client-go hands its `WatchErrorHandler` only what ends a round and logs the rest.
//! - No streaming list (`sendInitialEvents`), no retry of 500s within a watch
//!   (`MaxInternalErrorRetryDuration`, off by default in client-go too), no type checks of
//!   event objects (the stream is typed).

use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::time::Instant;

use super::backoff::{random_unit, Backoff, BackoffTimer};
use super::lister_watcher::{
    Error, ListOptions, ListerWatcher, Versioned, WatchEvent, WatchOptions, WatchStream,
};
use super::stop::StopSignal;
use crate::queue::{DeltaQueue, QueueEvent};
use crate::sync::lock;

/// Receives every error the reflector meets (client-go's `WatchErrorHandler`).
pub type WatchErrorHandler = Arc<dyn Fn(&Error) + Send + Sync>;

/// Asked before each periodic resync; a resync happens only if it returns true (client-go's
/// `ShouldResync`; a shared informer answers whether any handler is due).
pub type ShouldResync = Arc<dyn Fn() -> bool + Send + Sync>;

/// Told each resource version the reflector reaches, once the queue holds everything up to it.
pub type OnSynced = Arc<dyn Fn(&str) + Send + Sync>;

/// The page size client-go's pager uses.
pub const DEFAULT_PAGE_SIZE: usize = 500;

/// The shortest server-side watch timeout; each watch asks for a random one between this and
/// twice this, so watches of many clients do not end together (client-go: 5 minutes).
pub const DEFAULT_MIN_WATCH_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// How a reflector behaves.
#[derive(Clone)]
pub struct ReflectorOptions {
    /// Items per list page (0: the whole list at once).
    pub page_size: usize,
    /// How often to resync the queue; zero never.
    pub resync_period: Duration,
    /// The waits between rounds and between failed watch openings.
    pub backoff: Backoff,
    /// The shortest watch timeout asked of the server (see [`DEFAULT_MIN_WATCH_TIMEOUT`]).
    pub min_watch_timeout: Duration,
    /// The most watch events one queue batch holds: the first event and those the stream
    /// already holds behind it (see [`DEFAULT_READ_AHEAD`]; 0 counts as 1, no read-ahead).
    pub read_ahead: usize,
    /// Where errors go; `None` drops them.
    pub error_handler: Option<WatchErrorHandler>,
    /// Consulted before each periodic resync; `None` always resyncs.
    pub should_resync: Option<ShouldResync>,
    /// Called with each version the reflector reaches (a relist's, a watch batch's newest, a
    /// bookmark's), after the queue operation that carried it returned; a shared informer
    /// tracks the version its store has applied with it.
    pub on_synced: Option<OnSynced>,
}

impl Default for ReflectorOptions {
    fn default() -> Self {
        Self {
            page_size: DEFAULT_PAGE_SIZE,
            resync_period: Duration::ZERO,
            backoff: Backoff::default(),
            min_watch_timeout: DEFAULT_MIN_WATCH_TIMEOUT,
            read_ahead: DEFAULT_READ_AHEAD,
            error_handler: None,
            should_resync: None,
            on_synced: None,
        }
    }
}

impl fmt::Debug for ReflectorOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReflectorOptions")
            .field("page_size", &self.page_size)
            .field("resync_period", &self.resync_period)
            .field("backoff", &self.backoff)
            .field("min_watch_timeout", &self.min_watch_timeout)
            .field("read_ahead", &self.read_ahead)
            .field("error_handler", &self.error_handler.is_some())
            .field("should_resync", &self.should_resync.is_some())
            .field("on_synced", &self.on_synced.is_some())
            .finish()
    }
}

/// The resource version a reflector has reached, readable while it runs.
#[derive(Debug, Default)]
struct ReachedVersion {
    last_sync: Mutex<String>,
    /// The last version was refused as too old or too new: the next list starts afresh.
    unavailable: AtomicBool,
}

impl ReachedVersion {
    fn last_sync(&self) -> String {
        lock(&self.last_sync).clone()
    }

    fn set_last_sync(&self, rv: &str) {
        let mut last = lock(&self.last_sync);
        last.clear();
        last.push_str(rv);
    }
}

/// Reads a running reflector's progress.
#[derive(Debug, Clone)]
pub struct ReflectorHandle {
    progress: Arc<ReachedVersion>,
}

impl ReflectorHandle {
    /// The newest resource version the reflector has put into the queue (client-go's
    /// `LastSyncResourceVersion`); empty before the first list.
    pub fn last_sync_resource_version(&self) -> String {
        self.progress.last_sync()
    }
}

/// The next backoff delay, but at least what the server asked for with `Retry-After`
/// (client-go's REST client sleeps `Retry-After` before it retries a 429).
fn delay_honouring(backoff: &mut BackoffTimer, retry_after: Option<Duration>) -> Duration {
    backoff
        .next_delay(Instant::now())
        .max(retry_after.unwrap_or_default())
}

/// How a watch ended.
enum WatchEnd {
    /// The stream ended: re-open from the last version.
    Closed,
    /// The stop signal was raised.
    Stopped,
    /// Ends the round (a fresh list follows), or is retried per the module docs.
    Failed(Error),
}

/// The periodic resync deadline of one round.
struct ResyncTimer {
    period: Duration,
    next: Option<Instant>,
}

impl ResyncTimer {
    fn start(period: Duration) -> Self {
        Self {
            period,
            next: (!period.is_zero()).then(|| Instant::now() + period),
        }
    }

    /// Completes at the next deadline; never when resync is off.
    async fn due(&self) {
        match self.next {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    fn rearm(&mut self) {
        self.next = Some(Instant::now() + self.period);
    }
}

/// Keeps a queue in step with a [`ListerWatcher`]; see the module docs.
pub struct Reflector<T, L, Q> {
    lister_watcher: L,
    queue: Arc<Q>,
    options: ReflectorOptions,
    progress: Arc<ReachedVersion>,
    _objects: std::marker::PhantomData<fn() -> T>,
}

impl<T, L, Q> fmt::Debug for Reflector<T, L, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reflector")
            .field("options", &self.options)
            .field("last_sync_resource_version", &self.progress.last_sync())
            .finish_non_exhaustive()
    }
}

impl<T, L, Q> Reflector<T, L, Q>
where
    T: Versioned + Send + Sync + 'static,
    L: ListerWatcher<T>,
    Q: DeltaQueue<T> + 'static,
{
    /// A reflector that fills `queue` from `lister_watcher`.
    pub fn new(lister_watcher: L, queue: Arc<Q>, options: ReflectorOptions) -> Self {
        Self {
            lister_watcher,
            queue,
            options,
            progress: Arc::new(ReachedVersion::default()),
            _objects: std::marker::PhantomData,
        }
    }

    /// The queue holds everything up to `rv`: the version to resume from, and the news for
    /// whoever tracks it ([`ReflectorOptions::on_synced`]).
    fn reached(&self, rv: &str) {
        self.progress.set_last_sync(rv);
        if let Some(on_synced) = &self.options.on_synced {
            on_synced(rv);
        }
    }

    /// A handle to read the reflector's progress from elsewhere.
    pub fn handle(&self) -> ReflectorHandle {
        ReflectorHandle {
            progress: Arc::clone(&self.progress),
        }
    }

    /// The newest resource version put into the queue; empty before the first list.
    pub fn last_sync_resource_version(&self) -> String {
        self.progress.last_sync()
    }

    /// Lists and watches until `stop` is raised, waiting a backoff delay between rounds.
    /// Errors go to the error handler; this never fails.
    pub async fn run(&self, stop: StopSignal) {
        let mut backoff = self.options.backoff.timer();
        while !stop.is_stopped() {
            let mut retry_after = None;
            if let Err(err) = self.list_and_watch(&stop, &mut backoff).await {
                self.report(&err);
                retry_after = err.retry_after();
            }
            if stop.is_stopped() {
                break;
            }
            let delay = delay_honouring(&mut backoff, retry_after);
            tokio::select! {
                _ = stop.stopped() => break,
                _ = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// One round: a list, then watches until one fails in a way that needs a fresh list (the
    /// error is returned) or `stop` is raised (`Ok`).
    pub async fn list_and_watch(
        &self,
        stop: &StopSignal,
        backoff: &mut BackoffTimer,
    ) -> Result<(), Error> {
        let listed = tokio::select! {
            _ = stop.stopped() => return Ok(()),
            listed = self.list() => listed,
        };
        let (items, rv) = listed?;
        // The round's resync period starts now, not once `replace` is back from its thread:
        // whoever sees the relist applied (`has_synced`) may count on the period having
        // started, as when `replace` ran on this task. (The timer is only looked at from the
        // watch, so it cannot fire during the relist.)
        let resync = ResyncTimer::start(self.options.resync_period);
        // Not raced against `stop`: once it started, the relist is applied in full, so a
        // shutdown that waits for this task finds the queue with or without it, never half.
        if !self.replace(items, &rv).await? {
            return Ok(());
        }
        self.watch_until_round_ends(stop, backoff, resync).await
    }

    fn report(&self, err: &Error) {
        if let Some(handler) = &self.options.error_handler {
            handler(err);
        }
    }

    /// The version to list from: `""` after a refusal, `"0"` before anything was seen
    /// (client-go's `relistResourceVersion`).
    fn relist_resource_version(&self) -> String {
        if self.progress.unavailable.load(Ordering::Relaxed) {
            return String::new();
        }
        match self.progress.last_sync() {
            rv if rv.is_empty() => "0".to_string(),
            rv => rv,
        }
    }

    /// Lists every page: the items and the list's resource version.
    async fn list(&self) -> Result<(Vec<Arc<T>>, String), Error> {
        let listed = match self.list_pages(self.relist_resource_version()).await {
            Err(err) if err.is_expired() || err.is_too_large_resource_version() => {
                self.report(&err);
                self.progress.unavailable.store(true, Ordering::Relaxed);
                self.list_pages(self.relist_resource_version()).await?
            }
            listed => listed?,
        };
        self.progress.unavailable.store(false, Ordering::Relaxed);
        Ok(listed)
    }

    /// Replaces the queue's content with a list, off the runtime's worker threads, and
    /// remembers its version. `Ok(false)` if the runtime is shutting down and it never ran.
    ///
    /// Why a blocking-pool thread: `replace` is one atomic queue operation (it locks every
    /// shard and judges tombstones against the whole list), so it cannot be split into
    /// pieces that yield in between; and it is CPU work in proportion to the list (tens of
    /// milliseconds for 100,000 objects), which on a worker thread would stall every other
    /// task of the runtime (on a current-thread runtime, all of them) for that long. A relist
    /// is rare, so the hand-off to another thread costs nothing that matters.
    async fn replace(&self, items: Vec<Arc<T>>, rv: &str) -> Result<bool, Error> {
        let queue = Arc::clone(&self.queue);
        let version = rv.to_string();
        let replaced = tokio::task::spawn_blocking(move || queue.replace(items, &version)).await;
        match replaced {
            Ok(result) => result?,
            // A panic in user code (the key function, the transformer, the known objects)
            // propagates as it did when `replace` ran on this task.
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => return Ok(false),
        }
        self.reached(rv);
        Ok(true)
    }

    async fn list_pages(&self, resource_version: String) -> Result<(Vec<Arc<T>>, String), Error> {
        let mut items = Vec::new();
        let mut options = ListOptions {
            limit: self.options.page_size,
            continue_token: None,
            resource_version,
        };
        loop {
            let page = self.lister_watcher.list(options.clone()).await?;
            items.extend(page.items);
            match page.continue_token {
                Some(token) => {
                    // The server rejects a version together with a continue token: the token
                    // already pins the list's version.
                    options.resource_version.clear();
                    options.continue_token = Some(token);
                }
                None => return Ok((items, page.resource_version)),
            }
        }
    }

    async fn watch_until_round_ends(
        &self,
        stop: &StopSignal,
        backoff: &mut BackoffTimer,
        mut resync: ResyncTimer,
    ) -> Result<(), Error> {
        loop {
            if stop.is_stopped() {
                return Ok(());
            }
            let start = Instant::now();
            let resource_version = self.progress.last_sync();
            // Events of a watch from "" or "0" are the current objects, not changes after a
            // known version: their versions say nothing about progress until something other
            // than an `Added` arrives.
            let propagate_from_start = !(resource_version.is_empty() || resource_version == "0");
            let min = self.options.min_watch_timeout;
            let options = WatchOptions {
                resource_version,
                allow_bookmarks: true,
                timeout: Some(min + min.mul_f64(random_unit())),
            };
            let opened = tokio::select! {
                _ = stop.stopped() => return Ok(()),
                opened = self.lister_watcher.watch(options) => opened,
            };
            let end = match opened {
                Ok(stream) => {
                    self.handle_watch(stream, start, stop, &mut resync, propagate_from_start)
                        .await
                }
                Err(err) => WatchEnd::Failed(err),
            };
            match end {
                WatchEnd::Closed => continue,
                WatchEnd::Stopped => return Ok(()),
                WatchEnd::Failed(err) if err.is_retriable_watch_error() => {
                    self.report(&err);
                    let delay = delay_honouring(backoff, err.retry_after());
                    if let WatchEnd::Stopped = self.pause(delay, stop, &mut resync).await? {
                        return Ok(());
                    }
                }
                WatchEnd::Failed(err) => return Err(err),
            }
        }
    }

    /// Waits `delay`, resyncing when due. `Ok(Stopped)` if the stop signal was raised.
    async fn pause(
        &self,
        delay: Duration,
        stop: &StopSignal,
        resync: &mut ResyncTimer,
    ) -> Result<WatchEnd, Error> {
        let until = Instant::now() + delay;
        loop {
            tokio::select! {
                _ = stop.stopped() => return Ok(WatchEnd::Stopped),
                _ = tokio::time::sleep_until(until) => return Ok(WatchEnd::Closed),
                _ = resync.due() => self.resync(resync)?,
            }
        }
    }

    fn resync(&self, timer: &mut ResyncTimer) -> Result<(), Error> {
        let wanted = self
            .options
            .should_resync
            .as_ref()
            .is_none_or(|should| should());
        if wanted {
            self.queue.resync()?;
        }
        timer.rearm();
        Ok(())
    }

    /// Applies one watch's events to the queue until it ends (client-go's `handleWatch`), in
    /// batches: the events the stream already holds go to the queue in one
    /// [`apply_events`](DeltaQueue::apply_events) call (at most
    /// [`ReflectorOptions::read_ahead`]).
    async fn handle_watch(
        &self,
        mut stream: WatchStream<T>,
        start: Instant,
        stop: &StopSignal,
        resync: &mut ResyncTimer,
        propagate_from_start: bool,
    ) -> WatchEnd {
        let mut events = 0usize;
        let mut besides_added = false;
        let mut ahead = VecDeque::new();
        loop {
            let next = tokio::select! {
                biased;
                _ = stop.stopped() => return WatchEnd::Stopped,
                _ = resync.due() => {
                    if let Err(err) = self.resync(resync) {
                        return WatchEnd::Failed(err);
                    }
                    continue;
                }
                next = poll_fn(|cx| stream.as_mut().poll_next(cx)) => next,
            };
            let more = matches!(next, Some(Ok(_)));
            ahead.push_back(next);
            if more {
                decode_ahead(&mut stream, &mut ahead, self.options.read_ahead.max(1));
            }
            // The object events and bookmarks form the batch; what ends the watch (an error
            // event, a broken connection, the end) can only be last, and is handled after the
            // batch is applied.
            let mut batch = Vec::with_capacity(ahead.len());
            let mut newest: Option<NewestVersion<T>> = None;
            let mut tail = None;
            while let Some(item) = ahead.pop_front() {
                let event = match item {
                    Some(Ok(WatchEvent::Error(status))) => {
                        tail = Some(WatchEnd::Failed(Error::Api(status)));
                        break;
                    }
                    Some(Ok(event)) => event,
                    Some(Err(err @ Error::Decode(_))) => {
                        // Bytes that could not be decoded (a truncated or oversized frame, bad
                        // magic): events may be lost in them, so only a fresh list makes the
                        // cache whole again. client-go does the same: its decoder's error
                        // becomes an ERROR event, which ends the round and relists.
                        tail = Some(WatchEnd::Failed(err));
                        break;
                    }
                    Some(Err(err)) => {
                        // A broken connection ends the watch like a close: re-open from the
                        // last version (unless it was very short, below).
                        self.report(&err);
                        tail = Some(WatchEnd::Closed);
                        break;
                    }
                    None => {
                        tail = Some(WatchEnd::Closed);
                        break;
                    }
                };
                events += 1;
                let (queued, obj) = match event {
                    WatchEvent::Added(obj) => (QueueEvent::Added(Arc::clone(&obj)), obj),
                    WatchEvent::Modified(obj) => {
                        besides_added = true;
                        (QueueEvent::Updated(Arc::clone(&obj)), obj)
                    }
                    WatchEvent::Deleted(obj) => {
                        besides_added = true;
                        (QueueEvent::Deleted(Arc::clone(&obj)), obj)
                    }
                    WatchEvent::Bookmark { resource_version } => {
                        besides_added = true;
                        newest = Some(NewestVersion::Bookmark(resource_version));
                        continue;
                    }
                    WatchEvent::Error(_) => unreachable!("matched above"),
                };
                batch.push(queued);
                if propagate_from_start || besides_added {
                    newest = Some(NewestVersion::Object(obj));
                }
            }
            if !batch.is_empty() {
                if !self.wait_for_room(stop).await {
                    return WatchEnd::Stopped;
                }
                if let Err(refused) = self.queue.apply_events(batch) {
                    // An object the queue refuses (its key function failed) does not stop the
                    // others; client-go logs it and goes on.
                    for (_, err) in refused.refused {
                        self.report(&Error::Queue(err));
                    }
                }
            }
            // Once per batch, after its events are queued: the version a watch resumes from
            // never runs ahead of the queue.
            if let Some(newest) = &newest {
                self.reached(newest.as_str());
            }
            match tail {
                None => {}
                Some(WatchEnd::Closed) => break,
                Some(end) => return end,
            }
        }
        if events == 0 && start.elapsed() < Duration::from_secs(1) {
            return WatchEnd::Failed(Error::VeryShortWatch);
        }
        WatchEnd::Closed
    }

    /// With a backlog bound, waits until the queue has room without blocking the runtime's
    /// thread (a blocking `add` on a full queue would stall every task of a current-thread
    /// runtime, the consumers' hand-offs included). The reflector is the queue's only producer
    /// of watch events, so the batch then queues without waiting. False if the stop signal
    /// came first; the batch is then dropped, as the events after it are.
    async fn wait_for_room(&self, stop: &StopSignal) -> bool {
        if self.queue.has_room() {
            return true;
        }
        tokio::select! {
            biased;
            _ = stop.stopped() => false,
            _ = self.queue.wait_for_room() => true,
        }
    }
}

/// The newest resource version a batch moves the reflector to, kept without copying it per
/// event: the object that carries it, or a bookmark's.
enum NewestVersion<T> {
    Object(Arc<T>),
    Bookmark(String),
}

impl<T: Versioned> NewestVersion<T> {
    fn as_str(&self) -> &str {
        match self {
            NewestVersion::Object(obj) => obj.resource_version(),
            NewestVersion::Bookmark(rv) => rv,
        }
    }
}

/// The most events one queue batch holds by default ([`ReflectorOptions::read_ahead`]).
///
/// Why 256: what a watch holds at once is what its server sent in one burst. A real API server
/// buffers each watcher's events in a channel sized by its watch cache (from ten events up to a
/// thousand for a busy, indexed resource such as pods) and writes what it holds in one go, so
/// a watcher that fell behind, or one of a busy resource, receives hundreds at once. A batch of
/// 256 takes each shard lock of a 16-shard queue about 16 times instead of 256, which is most
/// of what batching saves; a larger one saves little more and makes the stop signal and the
/// resync timer wait longer between looks.
pub const DEFAULT_READ_AHEAD: usize = 256;

/// Adds to `ahead` the events `stream` already holds (until `ahead` holds `limit`) without
/// waiting for more.
///
/// Why: decoding an event costs several times what queueing it does, so a queue consumer that
/// is handed events one at a time as they are decoded finishes each before the next arrives,
/// goes back to sleep, and is woken again: a context switch per event, the informer's largest
/// CPU cost over the wire (one per event against kube-rs' one per five). Decoding what already
/// arrived first and then queueing it in one batch ([`DeltaQueue::apply_events`]) takes each
/// shard lock once and wakes the consumers once per batch. The queue sees the same operations
/// in the same order; the first event of a batch waits for the others' decoding (a few
/// microseconds each, and only for events that already arrived).
fn decode_ahead<T>(
    stream: &mut WatchStream<T>,
    ahead: &mut VecDeque<Option<Result<WatchEvent<T>, Error>>>,
    limit: usize,
) {
    // A waker that does nothing is enough: on `Pending` the loop in `handle_watch` polls the
    // stream again with its own waker before it waits. (`Waker::noop` needs Rust 1.85.)
    struct Noop;
    impl Wake for Noop {
        fn wake(self: Arc<Self>) {}
    }
    static NOOP: OnceLock<Waker> = OnceLock::new();
    let mut cx = Context::from_waker(NOOP.get_or_init(|| Waker::from(Arc::new(Noop))));
    while ahead.len() < limit {
        match stream.as_mut().poll_next(&mut cx) {
            Poll::Ready(Some(Ok(event))) => ahead.push_back(Some(Ok(event))),
            Poll::Ready(Some(Err(err))) => {
                ahead.push_back(Some(Err(err)));
                return;
            }
            Poll::Ready(None) => {
                ahead.push_back(None);
                return;
            }
            Poll::Pending => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Item = Result<WatchEvent<()>, Error>;

    /// A stream that answers each poll with the next of `polls`, then `Pending` forever.
    struct Scripted(VecDeque<Poll<Option<Item>>>);

    impl futures_core::Stream for Scripted {
        type Item = Item;
        fn poll_next(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Item>> {
            self.0.pop_front().unwrap_or(Poll::Pending)
        }
    }

    fn bookmark(rv: usize) -> Poll<Option<Item>> {
        Poll::Ready(Some(Ok(WatchEvent::Bookmark {
            resource_version: rv.to_string(),
        })))
    }

    fn versions(ahead: &VecDeque<Option<Item>>) -> Vec<String> {
        ahead
            .iter()
            .map(|item| match item {
                Some(Ok(WatchEvent::Bookmark { resource_version })) => resource_version.clone(),
                Some(Ok(_)) => "event".into(),
                Some(Err(_)) => "error".into(),
                None => "end".into(),
            })
            .collect()
    }

    #[test]
    fn decoding_ahead_takes_what_is_ready_in_order_and_no_more() {
        let script = (1..=DEFAULT_READ_AHEAD + 5).map(bookmark).collect();
        let mut stream: WatchStream<()> = Box::pin(Scripted(script));
        let mut ahead = VecDeque::new();
        decode_ahead(&mut stream, &mut ahead, DEFAULT_READ_AHEAD);
        let expected: Vec<String> = (1..=DEFAULT_READ_AHEAD).map(|rv| rv.to_string()).collect();
        assert_eq!(versions(&ahead), expected, "at most the limit, in order");

        let script = [bookmark(1), Poll::Pending, bookmark(2)].into();
        let mut stream: WatchStream<()> = Box::pin(Scripted(script));
        let mut ahead = VecDeque::new();
        decode_ahead(&mut stream, &mut ahead, DEFAULT_READ_AHEAD);
        assert_eq!(versions(&ahead), ["1"], "stops at the first Pending");
    }

    #[test]
    fn decoding_ahead_stops_after_an_error_or_the_end() {
        let script = [
            bookmark(1),
            Poll::Ready(Some(Err(Error::Decode("bad".into())))),
            bookmark(2),
        ]
        .into();
        let mut stream: WatchStream<()> = Box::pin(Scripted(script));
        let mut ahead = VecDeque::new();
        decode_ahead(&mut stream, &mut ahead, DEFAULT_READ_AHEAD);
        assert_eq!(versions(&ahead), ["1", "error"]);

        let script = [bookmark(1), Poll::Ready(None), bookmark(2)].into();
        let mut stream: WatchStream<()> = Box::pin(Scripted(script));
        let mut ahead = VecDeque::new();
        decode_ahead(&mut stream, &mut ahead, DEFAULT_READ_AHEAD);
        assert_eq!(versions(&ahead), ["1", "end"], "never polled past its end");
    }
}
