//! The contract both work queues implement: [`WorkQueue`], with a blocking and an async `get`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use thiserror::Error;

use crate::key::Key;

/// `get` found the queue shut down and empty: the worker should return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("the work queue is shut down")]
pub struct ShutDown;

/// `done` of an item that is not being processed (never handed out by `get`, or already done).
///
/// client-go accepts such a call and queues the item a second time if it is dirty; the
/// [sharded](super::ShardedQueue) queue refuses it and changes nothing. The item is handed back.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("done({0}): the item is not being processed (get did not hand it out, or done was already called)")]
pub struct NotProcessing(pub Key);

/// What [`WorkQueue::try_get`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TryGet {
    /// An item, now being processed: call [`WorkQueue::done`] when finished with it.
    Item(Key),
    /// Nothing queued: `get` would block.
    Empty,
    /// Nothing queued and the queue is shut down: `get` would return [`ShutDown`].
    ShutDown,
}

/// The state an async `get` keeps between polls: its place among the queue's waiters.
///
/// Opaque; made by [`AsyncGet::get_async`]. A queue uses it to find the waiter again, to
/// update its waker, and, when the future is dropped after it was woken but before it took an
/// item, to pass the wake-up on to another waiter (so cancelling a `get` loses no wake-up).
#[derive(Debug, Default)]
pub struct WaitSlot {
    /// The waiter's id while it is registered with the queue.
    pub(crate) id: Option<u64>,
    /// The `get` holds the sharded queue's searcher role (see `ready.rs`) and must end the
    /// search (take a token, wait, or hand it on when cancelled).
    pub(crate) searching: bool,
}

/// client-go's `workqueue.Interface` over [`Key`] items.
///
/// An item is in at most one of three states: *queued* (waiting for `get`), *processing*
/// (handed out, not yet `done`), or both *processing and dirty* (added again while processing:
/// `done` queues it again). A queued or dirty item is not queued twice however often it is
/// added; a processing item is never handed to a second worker.
///
/// Both implementations wake a blocked [`get`](WorkQueue::get) or a pending
/// [`get_async`](AsyncGet::get_async) on `add`, on a `done` that re-queues, and on shutdown.
pub trait WorkQueue: Send + Sync {
    /// Marks `item` as needing processing (client-go `Add`). Nothing if shutting down or if the
    /// item is already dirty; an item being processed is queued again by its `done`.
    fn add(&self, item: Key);

    /// Blocks until an item is queued and hands it out (now processing), or returns
    /// [`ShutDown`] once the queue is shut down and empty. Items still queued at shutdown are
    /// handed out first.
    fn get(&self) -> Result<Key, ShutDown>;

    /// `get` if it would not block.
    fn try_get(&self) -> TryGet;

    /// One poll of an async `get`; see [`AsyncGet::get_async`]. `slot` must be the same on
    /// every poll of one `get` and be passed to [`cancel_get`](WorkQueue::cancel_get) if the
    /// `get` is abandoned before it returned `Ready`. [`AsyncGet::get_async`] does both.
    fn poll_get(&self, slot: &mut WaitSlot, cx: &mut Context<'_>) -> Poll<Result<Key, ShutDown>>;

    /// Abandons an async `get` that has not returned `Ready`.
    fn cancel_get(&self, slot: &mut WaitSlot);

    /// Marks `item` as done processing (client-go `Done`); if it was added meanwhile it is
    /// queued again. Works the same after shutdown.
    fn done(&self, item: &Key) -> Result<(), NotProcessing>;

    /// How many items are queued (not counting those being processed).
    fn len(&self) -> usize;

    /// Whether no item is queued.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many items are being processed: handed out by `get` and not yet `done` (client-go
    /// keeps this set but does not expose it). With [`len`](WorkQueue::len) and a delaying
    /// layer's [`waiting_len`](super::DelayingQueue::waiting_len) it tells a caller when a
    /// controller is idle, without shutting the queue down.
    fn processing_len(&self) -> usize;

    /// Stops accepting adds and wakes every waiting `get`; queued items are still handed out.
    fn shut_down(&self);

    /// [`shut_down`](WorkQueue::shut_down), then waits until no item is being processed (or
    /// until a plain `shut_down` call cancels the wait, as in client-go).
    fn shut_down_with_drain(&self);

    /// Whether `shut_down` was called.
    fn shutting_down(&self) -> bool;

    /// Recomputes the `unfinished_work_seconds` and `longest_running_processor_seconds`
    /// metrics from the items being processed. client-go does it every 500 ms; call it as often
    /// as the metrics are read. Nothing without a metrics provider.
    fn update_unfinished_work(&self);
}

/// The async `get` of every [`WorkQueue`], trait objects included (`Arc<dyn WorkQueue>`).
///
/// ```
/// # async fn worker(queue: std::sync::Arc<dyn kcache::workqueue::WorkQueue>) {
/// use kcache::workqueue::AsyncGet;
/// while let Ok(key) = queue.get_async().await {
///     // ... reconcile `key` ...
///     queue.done(&key).unwrap();
/// }
/// # }
/// ```
pub trait AsyncGet: WorkQueue {
    /// An async `get`: waits without holding a thread, woken by `add`, by a `done` that
    /// re-queues, and by shutdown. Cancel-safe: dropping the future loses no item and no
    /// wake-up (a wake-up it received is passed on to another waiter).
    fn get_async(&self) -> Get<'_, Self> {
        Get {
            queue: self,
            slot: WaitSlot::default(),
        }
    }
}

impl<Q: WorkQueue + ?Sized> AsyncGet for Q {}

/// The future of [`AsyncGet::get_async`].
#[derive(Debug)]
#[must_use = "futures do nothing unless awaited"]
pub struct Get<'a, Q: WorkQueue + ?Sized> {
    queue: &'a Q,
    slot: WaitSlot,
}

impl<Q: WorkQueue + ?Sized> Future for Get<'_, Q> {
    type Output = Result<Key, ShutDown>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        this.queue.poll_get(&mut this.slot, cx)
    }
}

impl<Q: WorkQueue + ?Sized> Drop for Get<'_, Q> {
    fn drop(&mut self) {
        if self.slot.id.is_some() || self.slot.searching {
            self.queue.cancel_get(&mut self.slot);
        }
    }
}

/// Forwards every method, so a boxed or shared queue (`Box<dyn WorkQueue>`,
/// `Arc<ShardedQueue>`) can sit under the delaying and rate-limiting layers.
macro_rules! forward_work_queue {
    ($pointer:ident) => {
        impl<Q: WorkQueue + ?Sized> WorkQueue for $pointer<Q> {
            fn add(&self, item: Key) {
                (**self).add(item)
            }
            fn get(&self) -> Result<Key, ShutDown> {
                (**self).get()
            }
            fn try_get(&self) -> TryGet {
                (**self).try_get()
            }
            fn poll_get(
                &self,
                slot: &mut WaitSlot,
                cx: &mut Context<'_>,
            ) -> Poll<Result<Key, ShutDown>> {
                (**self).poll_get(slot, cx)
            }
            fn cancel_get(&self, slot: &mut WaitSlot) {
                (**self).cancel_get(slot)
            }
            fn done(&self, item: &Key) -> Result<(), NotProcessing> {
                (**self).done(item)
            }
            fn len(&self) -> usize {
                (**self).len()
            }
            fn processing_len(&self) -> usize {
                (**self).processing_len()
            }
            fn shut_down(&self) {
                (**self).shut_down()
            }
            fn shut_down_with_drain(&self) {
                (**self).shut_down_with_drain()
            }
            fn shutting_down(&self) -> bool {
                (**self).shutting_down()
            }
            fn update_unfinished_work(&self) {
                (**self).update_unfinished_work()
            }
        }
    };
}

forward_work_queue!(Box);
forward_work_queue!(Arc);
