//! The DeltaFIFO contract both engines implement: [`DeltaQueue`], its options and errors.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use thiserror::Error;

use crate::delta::{DeltaObject, Deltas, Tombstone};
use crate::key::{Key, KeyError, KeyFn};
use crate::store::KnownObjects;

/// A transformer (client-go's `TransformFunc`), applied once to every object that enters the
/// queue from outside: the objects of `add`, `update` and `delete` and every object listed by
/// `replace`, whether `replace` queues it as `Replaced` or as `Sync` (a relist's `Sync` is
/// internally a `Replaced`, so the transformer applies). It is *not* applied to tombstones, nor
/// to the `Sync` deltas of `resync`, whose objects come from the known store and went through
/// it on their way in. It may fail; the operation then changes nothing.
pub type TransformFn<T> = Arc<dyn Fn(Arc<T>) -> Result<Arc<T>, TransformError> + Send + Sync>;

/// A transformer refused an object.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("transform failed: {0}")]
pub struct TransformError(pub String);

/// Why a queue operation was refused. A refused operation changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QueueError {
    /// The key function failed for an object.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// The transformer failed for an object.
    #[error(transparent)]
    Transform(#[from] TransformError),
    /// `add_if_not_present` was given an empty list, which has no key.
    #[error("zero-length Deltas object: it has no key")]
    EmptyDeltas,
}

/// One watch event for [`DeltaQueue::apply_events`]: what `add`, `update` or `delete` would be
/// given.
#[derive(Debug)]
pub enum QueueEvent<T> {
    /// [`DeltaQueue::add`].
    Added(Arc<T>),
    /// [`DeltaQueue::update`].
    Updated(Arc<T>),
    /// [`DeltaQueue::delete`].
    Deleted(Arc<T>),
}

impl<T> QueueEvent<T> {
    /// The event's object.
    pub fn object(&self) -> &Arc<T> {
        match self {
            QueueEvent::Added(obj) | QueueEvent::Updated(obj) | QueueEvent::Deleted(obj) => obj,
        }
    }
}

impl<T> Clone for QueueEvent<T> {
    fn clone(&self) -> Self {
        match self {
            QueueEvent::Added(obj) => QueueEvent::Added(Arc::clone(obj)),
            QueueEvent::Updated(obj) => QueueEvent::Updated(Arc::clone(obj)),
            QueueEvent::Deleted(obj) => QueueEvent::Deleted(Arc::clone(obj)),
        }
    }
}

/// The events of a batch that the queue refused ([`DeltaQueue::apply_events`]): each one's
/// position in the batch and the error its own `add`/`update`/`delete` would have returned.
/// Every other event of the batch was applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchError {
    /// `(position in the batch, error)`, in batch order; never empty.
    pub refused: Vec<(usize, QueueError)>,
}

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.refused.first() {
            Some((at, first)) => write!(
                f,
                "{} event(s) of the batch refused, the first (at {at}): {first}",
                self.refused.len()
            ),
            None => write!(f, "no event of the batch refused"),
        }
    }
}

impl std::error::Error for BatchError {}

impl BatchError {
    /// `Ok` when nothing was refused; `refused` must be in batch order.
    pub fn check(refused: Vec<(usize, QueueError)>) -> Result<(), BatchError> {
        if refused.is_empty() {
            Ok(())
        } else {
            Err(BatchError { refused })
        }
    }
}

/// The queue is closed and empty: nothing more will come out of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("DeltaFIFO: manipulating with closed queue")]
pub struct Closed;

/// The outcome of a non-blocking pop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryPop<R> {
    /// A key was popped and processed; this is what `process` returned.
    Popped(R),
    /// Nothing is queued right now, and the queue is open.
    Empty,
    /// Nothing is queued and the queue is closed.
    Closed,
}

/// How a queue is built: what client-go's `DeltaFIFOOptions` holds.
pub struct QueueOptions<T> {
    /// Computes an object's key. There is no implicit default: [`QueueOptions::new`] takes it,
    /// and [`QueueOptions::meta_namespace`] sets client-go's default,
    /// [`meta_namespace_key`](crate::meta_namespace_key) (`namespace/name`, through the
    /// object's [`ObjectMeta`](crate::ObjectMeta)).
    pub key_fn: KeyFn<T>,
    /// The consumer's store, consulted by `delete`, `replace` and `resync`. The consumer must
    /// apply every popped list to it (see [`DeltaQueue`]'s *consumer's obligation*).
    pub known_objects: Option<Arc<dyn KnownObjects<T>>>,
    /// Emit `Replaced` rather than `Sync` for objects listed by `replace`.
    pub emit_replaced: bool,
    /// Applied to incoming objects; see [`TransformFn`] for which ones.
    pub transformer: Option<TransformFn<T>>,
    /// The backlog bound: `add`, `update` and `delete` wait while this many deltas are queued.
    /// 0 (the default) means unbounded, as client-go. See
    /// [`max_queued_deltas`](Self::max_queued_deltas).
    pub max_queued_deltas: usize,
    /// Level-triggered mode: consecutive `Updated`/`Sync`/`Replaced` deltas of a key compact
    /// into the newest. Off by default. See [`compact_updates`](Self::compact_updates).
    pub compact_updates: bool,
}

impl<T> QueueOptions<T> {
    /// Options with `key_fn`, no known objects, `emit_replaced` off and no transformer.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kcache::{Key, QueueOptions};
    /// let opts = QueueOptions::new(Arc::new(|s: &String| Ok(Key::new(s))));
    /// assert!(opts.known_objects.is_none() && !opts.emit_replaced && opts.transformer.is_none());
    /// ```
    pub fn new(key_fn: KeyFn<T>) -> Self {
        Self {
            key_fn,
            known_objects: None,
            emit_replaced: false,
            transformer: None,
            max_queued_deltas: 0,
            compact_updates: false,
        }
    }

    /// Sets the known objects (the consumer's store).
    pub fn known_objects(mut self, known: Arc<dyn KnownObjects<T>>) -> Self {
        self.known_objects = Some(known);
        self
    }

    /// Sets `emit_replaced`.
    pub fn emit_replaced(mut self, emit: bool) -> Self {
        self.emit_replaced = emit;
        self
    }

    /// Sets the transformer.
    pub fn transformer(mut self, transformer: TransformFn<T>) -> Self {
        self.transformer = Some(transformer);
        self
    }

    /// Bounds the backlog (opt-in; 0 means unbounded, the default and client-go's behaviour).
    ///
    /// The queue counts its *queued deltas*: those not yet popped, after dedup and compaction
    /// (a delta absorbed by the key's newest one adds nothing; deltas handed to a consumer no
    /// longer count). While `n` or more are queued, `add`, `update`, `delete` and
    /// `delete_tombstone` **wait** (block the thread) until pops free room, then queue their
    /// delta; a producer whose delta would be absorbed, or whose delete is ignored, never
    /// waits. Async producers await [`DeltaQueue::wait_for_room`] first. So `add`, `update`
    /// and `delete` alone never take the count above `n`.
    ///
    /// `replace`, `resync` and `add_if_not_present` never wait: a relist must not deadlock
    /// against itself, and a consumer handing a key back must not wait for itself. They may
    /// take the count above `n` by the deltas they queue; later producers then wait until pops
    /// bring it under `n` again. After [`close`](DeltaQueue::close) the bound no longer
    /// applies: waiting producers wake and queue their delta (producing after close is allowed,
    /// docs/semantics.md), so shutdown never hangs on a full queue.
    ///
    /// A consumer's `process` must not call a waiting producer on the queue it pops from: with
    /// the queue full, it would wait for itself.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kcache::{Key, QueueOptions};
    /// let opts = QueueOptions::new(Arc::new(|s: &String| Ok(Key::new(s)))).max_queued_deltas(64);
    /// assert_eq!(opts.max_queued_deltas, 64);
    /// ```
    pub fn max_queued_deltas(mut self, n: usize) -> Self {
        self.max_queued_deltas = n;
        self
    }

    /// Level-triggered mode (opt-in, off by default): for controllers that only want an
    /// object's newest state.
    ///
    /// When a delta of type `Updated`, `Sync` or `Replaced` is queued and the key's newest
    /// queued delta is one of those three too, the new delta **replaces** it (the newer object,
    /// the newer type). `Added` and `Deleted` deltas (tombstones included) are never compacted
    /// and never compact anything; dedup of two `Deleted` is unchanged. A key that is only
    /// updated then holds at most `Added, <newest state>` however hot it is.
    ///
    /// What a handler fed by [`process_deltas`](crate::process_deltas) sees: fewer `on_update`
    /// calls, each with the newest object, `old` being the store's state before the pop; every
    /// `on_add` and `on_delete` as before (an object first seen through an update is still
    /// `on_add`ed, with its newest state); `is_in_initial_list` unchanged (it is per key).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kcache::{reference::DeltaFifo, DeltaQueue, DeltaType, Key, QueueOptions};
    /// let key_fn = Arc::new(|s: &String| Ok(Key::new(s.split('=').next().unwrap_or(""))));
    /// let q = DeltaFifo::new(QueueOptions::new(key_fn).compact_updates(true));
    /// for v in ["a=1", "a=2", "a=3", "a=4"] {
    ///     q.update(Arc::new(v.to_string())).unwrap();
    /// }
    /// let popped = q.pop(|d, _| d.iter().map(|d| d.kind).collect::<Vec<_>>()).unwrap();
    /// assert_eq!(popped, [DeltaType::Updated]);
    /// ```
    pub fn compact_updates(mut self, compact: bool) -> Self {
        self.compact_updates = compact;
        self
    }
}

impl<T: crate::ObjectMeta + 'static> QueueOptions<T> {
    /// Options keyed by client-go's default key function, `namespace/name`
    /// ([`meta_namespace_key`](crate::meta_namespace_key)); otherwise as [`QueueOptions::new`].
    pub fn meta_namespace() -> Self {
        Self::new(Arc::new(|obj: &T| crate::meta_namespace_key(obj)))
    }
}

impl<T> Clone for QueueOptions<T> {
    fn clone(&self) -> Self {
        Self {
            key_fn: Arc::clone(&self.key_fn),
            known_objects: self.known_objects.clone(),
            emit_replaced: self.emit_replaced,
            transformer: self.transformer.clone(),
            max_queued_deltas: self.max_queued_deltas,
            compact_updates: self.compact_updates,
        }
    }
}

impl<T> fmt::Debug for QueueOptions<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueOptions")
            .field("known_objects", &self.known_objects.is_some())
            .field("emit_replaced", &self.emit_replaced)
            .field("transformer", &self.transformer.is_some())
            .field("max_queued_deltas", &self.max_queued_deltas)
            .field("compact_updates", &self.compact_updates)
            .finish_non_exhaustive()
    }
}

/// What a consumer does with a batch taken by [`DeltaQueue::pop_batch_into`]: each key's
/// deltas in pop order, then the end of the batch while its keys are still the consumer's.
pub trait BatchConsumer<T> {
    /// One key of the batch: all its deltas, and whether it is of the initial list.
    fn process(&mut self, deltas: Deltas<T>, is_in_initial_list: bool);

    /// The batch's end: no other consumer can pop any key of the batch until this returns.
    fn finish(&mut self);
}

/// A closure as a [`BatchConsumer`] with nothing to do at a batch's end: what `pop`,
/// `try_pop` and `pop_batch` take their keys through.
pub(crate) struct Processing<F>(pub(crate) F);

impl<T, F: FnMut(Deltas<T>, bool)> BatchConsumer<T> for Processing<F> {
    fn process(&mut self, deltas: Deltas<T>, is_in_initial_list: bool) {
        (self.0)(deltas, is_in_initial_list);
    }

    fn finish(&mut self) {}
}

/// Calls a consumer's [`finish`](BatchConsumer::finish) when dropped, once it has been handed
/// a key: the queues declare it after what completes their batch, so that it runs first, on
/// a normal end and on a panic alike.
pub(crate) struct FinishOnDrop<'c, T, C: BatchConsumer<T> + ?Sized> {
    consumer: &'c mut C,
    armed: bool,
    _deltas: std::marker::PhantomData<fn(Deltas<T>)>,
}

impl<'c, T, C: BatchConsumer<T> + ?Sized> FinishOnDrop<'c, T, C> {
    pub(crate) fn new(consumer: &'c mut C) -> Self {
        Self {
            consumer,
            armed: false,
            _deltas: std::marker::PhantomData,
        }
    }

    /// Hands one key to the consumer; from now on, dropping this calls `finish`.
    pub(crate) fn process(&mut self, deltas: Deltas<T>, is_in_initial_list: bool) {
        self.armed = true;
        self.consumer.process(deltas, is_in_initial_list);
    }
}

impl<T, C: BatchConsumer<T> + ?Sized> Drop for FinishOnDrop<'_, T, C> {
    fn drop(&mut self) {
        if self.armed {
            self.consumer.finish();
        }
    }
}

/// The DeltaFIFO operations of docs/semantics.md, implemented by [`reference::DeltaFifo`] (the
/// faithful port) and [`sharded::DeltaFifo`] (the fast engine), so callers are written once.
///
/// Every mutating operation either succeeds or returns an error and changes nothing.
///
/// # The consumer's obligation
///
/// With known objects, the queue's idea of what exists *is* the known store: `delete` ignores a
/// key that is neither queued nor known, `replace` queues tombstones for known keys the list
/// lacks, and `resync` queues `Sync` for known keys. So a consumer must apply **every** popped
/// list to the known store, in full, before it is done with the key: with
/// [`process_deltas`](crate::process_deltas), [`apply_deltas_coalesced`](crate::apply_deltas_coalesced)
/// or an equivalent (store the newest object, or remove the key when the newest delta is
/// `Deleted`). A consumer that skips a list, or stores something else, makes later `delete`s
/// vanish, `replace` tombstone objects that still exist, or `resync` send stale objects.
///
/// The sharded engine relies on this further: while a key is in flight it answers "is this key
/// known, and as what?" from the popped deltas, i.e. from what the store *will* hold once the
/// consumer is done (client-go processes under its lock, so it only ever sees the store before
/// or after a key is applied; this gives the same answers without the lock).
///
/// # User code and panics
///
/// A queue calls user code: the key function, the transformer, the known objects
/// (`list_keys`, `get_by_key`) and `process`. A key error or a transform error is returned and
/// changes nothing. A *panic* in any of them propagates to the caller and never wedges the
/// queue: every call into the key function, the transformer or the known objects happens
/// before the operation changes anything, so the operation has no effect; a panic in `process`
/// loses the key being processed (as in client-go, it was taken off the queue first) and
/// nothing else. Afterwards [`len`](Self::len) counts exactly the keys that can be popped.
/// [`reference::DeltaFifo`] runs user code under its lock, which the panic poisons; both
/// engines ignore lock poisoning, because their state is consistent wherever user code runs.
///
/// The known objects, and in `resync` the key function, are called while the queue's locks
/// are held (as client-go does, so that they see a consistent queue): they must not call back
/// into the queue.
///
/// [`reference::DeltaFifo`]: crate::reference::DeltaFifo
/// [`sharded::DeltaFifo`]: crate::sharded::DeltaFifo
pub trait DeltaQueue<T>: Send + Sync {
    /// Queues an `Added` delta; marks the queue populated. With a backlog bound
    /// ([`QueueOptions::max_queued_deltas`]) it may wait for room first.
    fn add(&self, obj: Arc<T>) -> Result<(), QueueError>;

    /// Queues an `Updated` delta; marks the queue populated.
    fn update(&self, obj: Arc<T>) -> Result<(), QueueError>;

    /// Queues a `Deleted` delta, unless the key is neither queued nor known (docs/semantics.md); marks
    /// the queue populated.
    fn delete(&self, obj: Arc<T>) -> Result<(), QueueError>;

    /// `delete` of a tombstone ([`Tombstone::key`] is its key).
    fn delete_tombstone(&self, tombstone: Tombstone<T>) -> Result<(), QueueError>;

    /// A relist: `Replaced` (or `Sync`) for every listed object, tombstones for queued and known
    /// keys missing from `list` (a known key's tombstone is queued under the store's key, as
    /// client-go does), and on the first call the initial population count.
    fn replace(&self, list: Vec<Arc<T>>, resource_version: &str) -> Result<(), QueueError>;

    /// Queues `Sync(known object)` for every known object whose key has nothing queued. As
    /// client-go's `syncKeyLocked` does, the key is the key function's for the known object
    /// (not the store's key), and a key error is returned (changing nothing). Without known
    /// objects, nothing.
    fn resync(&self) -> Result<(), QueueError>;

    /// Applies a batch of watch events, each as its own `add`, `update` or `delete` would, in
    /// order: the result equals calling those one by one (same deltas per key, same dedup and
    /// compaction, same delete-ignore rule, same `populated`), except for how the batch waits
    /// for room and wakes consumers. What the engines save is the per-event overhead: the
    /// sharded engine takes each shard's lock once per batch (events grouped by shard, each
    /// key's order kept) and schedules each shard once; the reference takes its lock once and
    /// broadcasts once.
    ///
    /// **Errors**: an event the queue refuses (its key function or transformer fails) changes
    /// nothing and is reported in [`BatchError::refused`] with its position; every other event,
    /// before or after it, is applied. A closed queue refuses nothing (producing after close
    /// is allowed, docs/semantics.md).
    ///
    /// **Backlog bound** ([`QueueOptions::max_queued_deltas`]): the batch waits (blocks the
    /// thread) while the queue is full, as a single `add` does, then queues all its events
    /// without waiting again; so a lone producer takes the count at most `events.len() - 1`
    /// past the bound. Async producers await [`wait_for_room`](Self::wait_for_room) first.
    /// The default method calls `add`/`update`/`delete` in a loop (which wait per event).
    ///
    /// **Panics** in user code (key function, transformer, known objects) propagate; events
    /// already applied stay applied, each event being all or nothing.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kcache::{sharded::DeltaFifo, DeltaQueue, DeltaType, Key, KeyError, QueueEvent, QueueOptions};
    /// let key_fn = Arc::new(|s: &String| match s.split('=').next() {
    ///     Some("") | None => Err(KeyError::new("no key")),
    ///     Some(key) => Ok(Key::new(key)),
    /// });
    /// let q = DeltaFifo::new(QueueOptions::new(key_fn), 4);
    /// let event = |s: &str| Arc::new(s.to_string());
    /// let refused = q.apply_events(vec![
    ///     QueueEvent::Added(event("a=1")),
    ///     QueueEvent::Added(event("=oops")),
    ///     QueueEvent::Updated(event("a=2")),
    /// ]);
    /// assert_eq!(refused.unwrap_err().refused[0].0, 1);
    /// let kinds = q.pop(|d, _| d.iter().map(|d| d.kind).collect::<Vec<_>>()).unwrap();
    /// assert_eq!(kinds, [DeltaType::Added, DeltaType::Updated]);
    /// ```
    fn apply_events(&self, events: Vec<QueueEvent<T>>) -> Result<(), BatchError> {
        let mut refused = Vec::new();
        for (at, event) in events.into_iter().enumerate() {
            let applied = match event {
                QueueEvent::Added(obj) => self.add(obj),
                QueueEvent::Updated(obj) => self.update(obj),
                QueueEvent::Deleted(obj) => self.delete(obj),
            };
            if let Err(err) = applied {
                refused.push((at, err));
            }
        }
        BatchError::check(refused)
    }

    /// Puts a popped list back unless its key has been queued again meanwhile.
    fn add_if_not_present(&self, deltas: Deltas<T>) -> Result<(), QueueError>;

    /// Blocks until a key is queued, takes all its deltas and calls
    /// `process(deltas, is_in_initial_list)`. Returns [`Closed`] once closed and empty.
    ///
    /// If `process` panics, the panic propagates; the key counts as popped and its deltas are
    /// gone, the rest of the queue is untouched.
    fn pop<R, F>(&self, process: F) -> Result<R, Closed>
    where
        F: FnOnce(Deltas<T>, bool) -> R;

    /// Like [`pop`](Self::pop), but returns at once when nothing is queued.
    fn try_pop<R, F>(&self, process: F) -> TryPop<R>
    where
        F: FnOnce(Deltas<T>, bool) -> R;

    /// Blocks until at least one key is queued, then pops up to `max` keys (at least one) and
    /// calls `process` on each, in pop order. Returns how many keys were processed. Every key
    /// is done with when this returns.
    ///
    /// If `process` panics, the key it was given is lost as with [`pop`](Self::pop); the keys
    /// not yet given to it stay queued, at the head.
    fn pop_batch<F>(&self, max: usize, process: F) -> Result<usize, Closed>
    where
        F: FnMut(Deltas<T>, bool);

    /// Like [`pop_batch`](Self::pop_batch), but the batch's keys stay the consumer's until
    /// `consumer`'s [`finish`](BatchConsumer::finish) has returned: no other consumer can pop
    /// any of them before. A consumer that hands what it made of the keys on (a shared
    /// informer's notifications to its handlers) does so in `finish`, and each key's hand-overs
    /// follow the key's order with no turnstile between consumers.
    ///
    /// `finish` runs once per batch that gave `process` at least one key, also when `process`
    /// panicked (with what the keys before made). The sharded engine runs it before the
    /// batch's keys complete; the reference, which lets one consumer at a time take a batch
    /// this way (client-go has one), after its queue lock is released, so producers never
    /// wait for a hand-over.
    fn pop_batch_into<C>(&self, max: usize, consumer: &mut C) -> Result<usize, Closed>
    where
        C: BatchConsumer<T> + ?Sized;

    /// Closes the queue: pops on an empty queue return [`Closed`]; queued keys stay poppable.
    fn close(&self);

    /// Whether [`close`](Self::close) was called.
    fn is_closed(&self) -> bool;
    /// Nothing is queued and no popped key is still being processed: every delta queued
    /// before this call began has been popped and its `process` has returned. (A key whose
    /// `process` has not begun yet counts as still being processed.) What a shared informer
    /// checks before it reports the version it has applied; a snapshot, taken shard by shard
    /// by the sharded engine, which is enough for that: a key cannot move between shards.
    fn is_drained(&self) -> bool;

    /// Populated, and every key of the initial list has been popped (by the sharded engine:
    /// popped and processed).
    fn has_synced(&self) -> bool;

    /// Blocks until [`has_synced`](Self::has_synced) is true, or `timeout` passes. Returns
    /// whether the queue has synced.
    fn wait_synced(&self, timeout: Option<Duration>) -> bool;

    /// The queued deltas of `obj`'s key, if any.
    fn get(&self, obj: &T) -> Result<Option<Deltas<T>>, KeyError>;

    /// The queued deltas of `key`, if any.
    fn get_by_key(&self, key: &Key) -> Option<Deltas<T>>;

    /// The newest payload of every queued key.
    fn list(&self) -> Vec<DeltaObject<T>>;

    /// Every queued key.
    fn list_keys(&self) -> Vec<Key>;

    /// How many keys are queued.
    fn len(&self) -> usize;

    /// Whether no key is queued.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many deltas are queued: not yet popped, counted after dedup and compaction. Exact
    /// when no operation is running; under concurrent pops the sharded engine may briefly count
    /// deltas just popped.
    fn queued_deltas(&self) -> usize;

    /// Whether a producer would find room now: the queue is unbounded, closed, or holds fewer
    /// deltas than [`QueueOptions::max_queued_deltas`].
    fn has_room(&self) -> bool;

    /// [`has_room`](Self::has_room) for async producers: `Ready` when there is room, otherwise
    /// `Pending`, and `cx`'s waker is woken once pops (or `close`) may have made room. Use
    /// [`wait_for_room`](Self::wait_for_room) rather than calling this directly.
    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()>;

    /// A future that completes once [`has_room`](Self::has_room) is true: how a producer on an
    /// async runtime applies backpressure without blocking a thread. Await it, then call
    /// `add`/`update`/`delete`: they do not wait unless another producer took the room
    /// meanwhile (with one producer, as a reflector is, they never do).
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::future::Future;
    /// use std::task::{Context, Wake, Waker};
    /// use kcache::{reference::DeltaFifo, DeltaQueue, Key, QueueOptions};
    /// struct Noop;
    /// impl Wake for Noop {
    ///     fn wake(self: Arc<Self>) {}
    /// }
    /// let q = DeltaFifo::new(
    ///     QueueOptions::new(Arc::new(|s: &String| Ok(Key::new(s)))).max_queued_deltas(1),
    /// );
    /// q.add(Arc::new("a".to_string())).unwrap();
    /// let mut room = std::pin::pin!(q.wait_for_room());
    /// let waker = Waker::from(Arc::new(Noop));
    /// let mut cx = Context::from_waker(&waker);
    /// assert!(room.as_mut().poll(&mut cx).is_pending());
    /// q.pop(|_, _| ()).unwrap();
    /// assert!(room.as_mut().poll(&mut cx).is_ready());
    /// ```
    fn wait_for_room(&self) -> WaitForRoom<'_, T, Self>
    where
        Self: Sized,
    {
        WaitForRoom {
            queue: self,
            _objects: PhantomData,
        }
    }
}

/// The future of [`DeltaQueue::wait_for_room`].
pub struct WaitForRoom<'a, T, Q: ?Sized> {
    queue: &'a Q,
    /// The queue's object type; `fn() -> T` keeps the future `Send` and `Unpin` whatever `T`.
    _objects: PhantomData<fn() -> T>,
}

impl<T, Q: DeltaQueue<T> + ?Sized> Future for WaitForRoom<'_, T, Q> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.queue.poll_room(cx)
    }
}

impl<T, Q: ?Sized> fmt::Debug for WaitForRoom<'_, T, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitForRoom").finish_non_exhaustive()
    }
}
