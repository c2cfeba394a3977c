//! The DeltaFIFO contract both engines implement: [`DeltaQueue`], its options and errors.

use std::fmt;
use std::sync::Arc;
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
        }
    }
}

impl<T> fmt::Debug for QueueOptions<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueOptions")
            .field("known_objects", &self.known_objects.is_some())
            .field("emit_replaced", &self.emit_replaced)
            .field("transformer", &self.transformer.is_some())
            .finish_non_exhaustive()
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
    /// Queues an `Added` delta; marks the queue populated.
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

    /// Closes the queue: pops on an empty queue return [`Closed`]; queued keys stay poppable.
    fn close(&self);

    /// Whether [`close`](Self::close) was called.
    fn is_closed(&self) -> bool;

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
}
