//! The version a shared informer's store has *applied* (client-go 1.36's
//! `LastStoreSyncResourceVersion`, KEP-5647): the newest resource version `V` such that
//! everything the reflector put into the queue up to `V` has been applied to the store and
//! its notifications handed to the handlers. A controller that wrote an object at `V` waits
//! for it before it trusts the cache again.
//!
//! # How it is known
//!
//! The queue hands keys to several consumers, out of order across shards, so "the consumer
//! popped `V`'s event" does not say that everything before `V` is done. Instead:
//!
//! 1. The reflector reports `V` ([`AppliedVersion::synced`]) only after the queue operation
//!    that carried `V` has returned (a relist's `replace`, a batch of watch events, a
//!    bookmark): every delta up to `V` is in the queue then.
//! 2. A *checkpoint* reads the newest reported `V`, then asks the queue whether it is drained
//!    ([`DeltaQueue::is_drained`](crate::DeltaQueue::is_drained): nothing queued, no popped key
//!    still being processed), then whether any consumer is between its first popped key and
//!    the hand-over of its batch's notifications (`busy`). If neither, everything queued
//!    before the read of `V` is applied and handed over, and `V` is published.
//! 3. Checkpoints run after each reflector report and after each consumer batch, once the
//!    queue completed the batch's keys (they stay in flight through the hand-over), so the
//!    last one to finish publishes.
//!
//! So the applied version is never ahead of the store: a relist's version is published only
//! once every key of that relist has been applied. It advances when the queue drains (between
//! batches under a steady load, at once when quiet); an informer that never drains keeps an
//! older applied version, which a waiting controller meets as a timeout.
//!
//! # Comparing versions
//!
//! Kubernetes' resource versions are opaque strings, but every built-in storage gives integers
//! that grow with each write, and client-go compares them as integers for its staleness
//! checks. [`version_at_least`] does the same when both parse as `u64`; when either does not,
//! the two cannot be ordered and the wait is over at once (the cache cannot tell stale from
//! fresh, so waiting would only delay).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sync::{lock, wait, wait_timeout, AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

/// How a wait for a version ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionWait {
    /// The applied version reached the one waited for (or the two cannot be ordered).
    Reached,
    /// The informer stopped first: the version may never be applied.
    Stopped,
    /// The timeout passed first.
    TimedOut,
}

/// Whether `applied` is at least `target`: an empty `target` always is; an empty `applied`
/// (nothing applied yet) never is otherwise; two integers compare as integers; versions that
/// are not both integers cannot be ordered and count as reached.
///
/// ```
/// use kcache::informer::version_at_least;
/// assert!(version_at_least("120", "99"));
/// assert!(!version_at_least("99", "120"));
/// assert!(!version_at_least("", "1"));
/// assert!(version_at_least("abc", "120"), "not ordered: nothing to wait for");
/// ```
pub fn version_at_least(applied: &str, target: &str) -> bool {
    if target.is_empty() {
        return true;
    }
    if applied.is_empty() {
        return false;
    }
    match (applied.parse::<u64>(), target.parse::<u64>()) {
        (Ok(applied), Ok(target)) => applied >= target,
        _ => true,
    }
}

#[derive(Debug, Default)]
struct State {
    /// The newest version the reflector reported, and how many it has reported.
    synced: String,
    synced_seq: u64,
    /// The newest published version, and the `synced_seq` it was reported as.
    applied: String,
    applied_seq: u64,
    stopped: bool,
}

struct Inner {
    state: Mutex<State>,
    /// Blocking waiters.
    changed: Condvar,
    /// Async waiters.
    notify: tokio::sync::Notify,
    /// Consumers between their batch's first popped key and the hand-over of its
    /// notifications.
    busy: AtomicUsize,
    /// Whether the informer's queue is drained ([`DeltaQueue::is_drained`](crate::DeltaQueue::is_drained)).
    drained: Box<dyn Fn() -> bool + Send + Sync>,
}

/// A read handle on the version an informer's store has applied, and the waits for it. Cheap
/// to clone; made by the informer ([`SharedInformer::applied_version`](super::SharedInformer::applied_version)).
#[derive(Clone)]
pub struct AppliedVersion {
    inner: Arc<Inner>,
}

impl AppliedVersion {
    /// A tracker whose checkpoints ask `drained` about the informer's queue.
    pub(crate) fn new(drained: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                notify: tokio::sync::Notify::new(),
                busy: AtomicUsize::new(0),
                drained: Box::new(drained),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.inner.state)
    }

    /// The newest version the store has applied (client-go's `LastStoreSyncResourceVersion`);
    /// empty before the first list is applied.
    pub fn get(&self) -> String {
        self.lock().applied.clone()
    }

    /// Whether the store has applied `version` ([`version_at_least`]).
    pub fn has_reached(&self, version: &str) -> bool {
        version_at_least(&self.lock().applied, version)
    }

    /// Whether the informer has stopped (the applied version will not move any more).
    pub fn is_stopped(&self) -> bool {
        self.lock().stopped
    }

    fn check(&self, version: &str) -> Option<VersionWait> {
        let state = self.lock();
        if version_at_least(&state.applied, version) {
            Some(VersionWait::Reached)
        } else if state.stopped {
            Some(VersionWait::Stopped)
        } else {
            None
        }
    }

    /// Completes once the store has applied `version` ([`VersionWait::Reached`]) or the
    /// informer has stopped ([`VersionWait::Stopped`]). Bound it with a timeout
    /// (`tokio::time::timeout`) where the version may never come.
    pub fn wait_for(&self, version: &str) -> impl Future<Output = VersionWait> + Send + '_ {
        let version = version.to_string();
        async move {
            loop {
                let notified = self.inner.notify.notified();
                tokio::pin!(notified);
                // Registered before the check: a publication after it wakes this waiter.
                notified.as_mut().enable();
                if let Some(end) = self.check(&version) {
                    return end;
                }
                notified.await;
            }
        }
    }

    /// Blocks until the store has applied `version`, the informer has stopped, or `timeout`
    /// (if any) has passed. Not from async code: it blocks the thread.
    pub fn wait_for_blocking(&self, version: &str, timeout: Option<Duration>) -> VersionWait {
        self.wait_blocking_until(version, timeout, || false)
    }

    /// [`wait_for_blocking`](Self::wait_for_blocking) that also ends, as a timeout, once
    /// `give_up` is true; whoever makes it true calls [`wake`](Self::wake).
    pub(crate) fn wait_blocking_until(
        &self,
        version: &str,
        timeout: Option<Duration>,
        give_up: impl Fn() -> bool,
    ) -> VersionWait {
        // Real time, not a test clock: the controller's timeout is a safety net for a version
        // that never comes; tests decide the outcome by the version, not by the clock.
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut state = self.lock();
        loop {
            if version_at_least(&state.applied, version) {
                return VersionWait::Reached;
            }
            if state.stopped {
                return VersionWait::Stopped;
            }
            if give_up() {
                return VersionWait::TimedOut;
            }
            state = match deadline {
                None => wait(&self.inner.changed, state),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return VersionWait::TimedOut;
                    }
                    wait_timeout(&self.inner.changed, state, left)
                }
            };
        }
    }

    /// Wakes every waiter to look again (a `give_up` condition changed).
    pub(crate) fn wake(&self) {
        let _guard = self.lock();
        self.inner.changed.notify_all();
        drop(_guard);
        self.inner.notify.notify_waiters();
    }

    /// The reflector's report: the queue now holds everything up to `version`.
    pub(crate) fn synced(&self, version: &str) {
        {
            let mut state = self.lock();
            state.synced.clear();
            state.synced.push_str(version);
            state.synced_seq += 1;
        }
        self.checkpoint();
    }

    /// A consumer popped the first key of a batch. Called while that key is in flight (in
    /// `process`), so a checkpoint that finds the queue drained after this key's release
    /// also finds this count.
    pub(crate) fn begin_batch(&self) {
        // AcqRel, though the lock of the queue (the key's release, then the checkpoint's
        // `is_drained`) already orders this before a checkpoint's load; see `checkpoint`.
        self.inner.busy.fetch_add(1, Ordering::AcqRel);
    }

    /// A consumer handed its batch's notifications over. The batch's keys are still in flight
    /// (the queue completes them after), so the consumer calls [`checkpoint`](Self::checkpoint)
    /// once its pop has returned.
    pub(crate) fn end_batch(&self) {
        // Release pairs with the Acquire load in `checkpoint`: a checkpoint that reads the
        // count after this decrement sees the batch's store writes and hand-overs.
        self.inner.busy.fetch_sub(1, Ordering::AcqRel);
    }

    /// Publishes the newest reported version if everything queued before it is applied.
    pub(crate) fn checkpoint(&self) {
        // 1. The version first: everything up to it was queued before it was reported.
        let (version, seq) = {
            let state = self.lock();
            if state.synced_seq == state.applied_seq || state.stopped {
                return;
            }
            (state.synced.clone(), state.synced_seq)
        };
        // 2. Then the queue: drained means every key queued before step 1 was popped and its
        //    processing returned.
        if !(self.inner.drained)() {
            return;
        }
        // 3. Then the consumers: a batch whose keys the queue has released may still be
        //    handing notifications over (the reference queue releases a batch's keys as it
        //    takes them; the sharded one only after the hand-over). Its `begin_batch` happened before its keys' release,
        //    which happened before step 2's lock of their shard, so this load sees the count
        //    raised, or lowered again by `end_batch` (Acquire: with that batch's work visible).
        if self.inner.busy.load(Ordering::Acquire) != 0 {
            return;
        }
        let mut state = self.lock();
        // Another checkpoint may have published a newer one meanwhile: never go back.
        if seq <= state.applied_seq {
            return;
        }
        state.applied = version;
        state.applied_seq = seq;
        drop(state);
        self.inner.changed.notify_all();
        self.inner.notify.notify_waiters();
    }

    /// The informer stopped: wakes every waiter with [`VersionWait::Stopped`].
    pub(crate) fn stop(&self) {
        self.lock().stopped = true;
        self.inner.changed.notify_all();
        self.inner.notify.notify_waiters();
    }
}

impl fmt::Debug for AppliedVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("AppliedVersion")
            .field("applied", &state.applied)
            .field("synced", &state.synced)
            .field("stopped", &state.stopped)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::atomic::Ordering;

    fn tracker() -> (AppliedVersion, Arc<AtomicBool>) {
        let drained = Arc::new(AtomicBool::new(true));
        let flag = Arc::clone(&drained);
        (
            AppliedVersion::new(move || flag.load(Ordering::SeqCst)),
            drained,
        )
    }

    #[test]
    fn a_version_is_published_only_once_the_queue_is_drained_and_no_batch_is_busy() {
        let (applied, drained) = tracker();
        drained.store(false, Ordering::SeqCst);
        applied.synced("10");
        assert_eq!(applied.get(), "", "queue not drained");
        drained.store(true, Ordering::SeqCst);
        applied.begin_batch();
        applied.synced("11");
        assert_eq!(applied.get(), "", "a batch is handing over");
        applied.end_batch();
        applied.checkpoint();
        assert_eq!(applied.get(), "11");
        assert!(applied.has_reached("10") && !applied.has_reached("12"));
    }

    #[test]
    fn blocking_waits_end_on_the_version_the_stop_or_give_up() {
        let (applied, _) = tracker();
        applied.synced("5");
        assert_eq!(applied.wait_for_blocking("5", None), VersionWait::Reached);
        assert_eq!(
            applied.wait_blocking_until("6", None, || true),
            VersionWait::TimedOut
        );
        assert_eq!(
            applied.wait_for_blocking("6", Some(Duration::ZERO)),
            VersionWait::TimedOut
        );
        let waiter = {
            let applied = applied.clone();
            std::thread::spawn(move || applied.wait_for_blocking("7", None))
        };
        applied.synced("7");
        assert_eq!(waiter.join().unwrap(), VersionWait::Reached);
        applied.stop();
        assert_eq!(applied.wait_for_blocking("8", None), VersionWait::Stopped);
    }

    #[tokio::test]
    async fn async_waits_end_on_the_version_or_the_stop() {
        let (applied, _) = tracker();
        let waiting = {
            let applied = applied.clone();
            tokio::spawn(async move { applied.wait_for("3").await })
        };
        tokio::task::yield_now().await;
        applied.synced("3");
        assert_eq!(waiting.await.unwrap(), VersionWait::Reached);
        let stopped = {
            let applied = applied.clone();
            tokio::spawn(async move { applied.wait_for("9").await })
        };
        tokio::task::yield_now().await;
        applied.stop();
        assert_eq!(stopped.await.unwrap(), VersionWait::Stopped);
    }
}
