//! The sharded DeltaFIFO. What a user can rely on is documented on [`DeltaFifo`]; this is how it
//! works inside.
//!
//! # Design
//!
//! Keys are split into `N` shards (a power of two) by their precomputed hash. Each shard is one
//! mutex over its keys' state (below) and a FIFO of keys that have deltas to pop. Producers lock only
//! their key's shard. Shards with keys to pop hold one token each in the [`Scheduler`], which
//! consumers take round-robin; a consumer takes a batch of keys from one shard under one lock,
//! processes them with no lock held, and completes them under one more lock of that shard.
//!
//! # Per-key state
//!
//! A shard keeps two maps. `pending` holds the keys with deltas waiting to be popped (client-go's
//! `items`); each is also in the shard FIFO, parked, or (with [`DeltaFifo::resync_last`]) in
//! the shard's resync lane, which is popped only when the FIFO is empty. `in_flight` holds the
//! keys handed to a consumer that has not finished with them; it is small (at most a batch per
//! consumer) and stays in cache, so completing a key never touches the big map. In-flight keys are never handed to a
//! second consumer: deltas that arrive meanwhile wait in `pending`, and the key keeps its place in
//! the shard FIFO. A consumer that meets an in-flight key at the head of the FIFO *parks* it
//! (takes it out of the FIFO); completing the key puts a parked key back at the head, where it
//! was. A single consumer never parks (it finishes a key before it pops again), so with one shard
//! and one consumer the pop order is exactly client-go's.
//!
//! # The known-objects race
//!
//! client-go processes a popped key under the queue lock, so `delete`, `replace` and `resync`
//! always see the consumer's store either before or after a key is applied. Here processing runs
//! outside every lock. While a key is in flight, the engine therefore answers "is this key known,
//! and as what?" from the popped deltas themselves: after processing, the store will hold the
//! newest popped object, or nothing if the newest delta is `Deleted` (`known_after`). The answer
//! is exactly what client-go would see, whether or not the consumer has written the store yet.
//! This assumes, as an informer does, that the consumer applies every popped list to the known
//! store with [`process_deltas`](crate::process_deltas) or an equivalent.
//!
//! # Initial list
//!
//! client-go counts pops until the initial population count reaches zero. Here the first
//! `replace` flags the keys that count covers (the first `count` queued keys, which are exactly
//! the keys it queued whenever the queue was empty before, as it is for an informer), a pop hands
//! out the flag as `is_in_initial_list`, and `has_synced` turns true when the last flagged key
//! has been *processed*. With one shard and FIFO order this is the same as client-go's count;
//! across shards it keeps each key's flag right whatever the interleaving of shards.
//!
//! # User code and panics
//!
//! User code (key function, transformer, known objects, `process`) may panic; the shard locks
//! ignore poisoning, so the state must be consistent wherever user code runs. Three rules keep
//! it so: every operation calls the key function, the transformer and the known objects before
//! its first change; shards that `replace`/`resync` mark scheduled get their tokens from a drop
//! guard ([`PendingWakes`]), so a shard is never left marked scheduled without a token (its keys would
//! be counted by `len` and popped by no one); and a served batch is completed by a drop guard
//! ([`InFlightBatch`]), which also puts back the keys a panicking `process` never saw.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use hashbrown::hash_map::Entry;
use smallvec::SmallVec;

use crate::delta::{
    push_delta, push_grows, Delta, DeltaList, DeltaObject, DeltaType, Deltas, Tombstone,
};
use crate::key::{BuildKeyHasher, Key, KeyError, KeyFn, KeyMap, KeyRef, KeyRefSet};
use crate::latch::Latch;
use crate::queue::{
    BatchConsumer, BatchError, Closed, DeltaQueue, FinishOnDrop, Processing, QueueError,
    QueueEvent, QueueOptions, TransformFn, TryPop,
};
use crate::store::KnownObjects;
use crate::sync::{lock_patiently, AtomicBool, AtomicUsize, Mutex, MutexGuard, Ordering};

use super::grow;
use super::prefetch;
use super::room::Room;
use super::scheduler::{Acquired, Scheduler};

mod batch;
mod footprint;
mod release;

/// The shard count [`DeltaFifo::with_default_shards`] uses.
pub const DEFAULT_SHARDS: usize = 16;

/// The most shards a [`DeltaFifo`] has; [`DeltaFifo::new`] caps larger requests to it.
///
/// A shard is picked by bits 32 and up of the key's 64-bit hash; 16 of them (up to bit 47)
/// stay clear of the top 7 bits, which the shards' own hash maps use for their control bytes,
/// so sharding does not make those maps' probes collide more.
pub const MAX_SHARDS: usize = 1 << 16;

/// The keys of a shard with deltas waiting to be popped: hashbrown's map rather than std's,
/// whose raw table tells where a key's bucket is, so a consumer can ask for it in advance
/// ([`prefetch::bucket`]).
type PendingMap<T> = hashbrown::HashMap<Key, Pending<T>, BuildKeyHasher>;

/// A key with deltas waiting to be popped.
struct Pending<T> {
    /// Oldest first; never empty.
    deltas: DeltaList<T>,
    /// Covered by the initial population count (see module docs).
    initial: bool,
    /// Queued by a resync alone, in the shard's resync lane ([`DeltaFifo::resync_last`]).
    in_resync_lane: bool,
}

/// A key handed to a consumer that has not finished with it.
struct Flight<T> {
    /// What the known store holds once the consumer is done (see module docs). Only tracked
    /// when the queue has known objects.
    known_after: Option<Arc<T>>,
    /// Taken out of the FIFO by a consumer that met it there; completion puts it back at the
    /// head.
    parked: bool,
}

/// A shard: its keys' state and the FIFO of keys with something to pop.
struct ShardState<T> {
    /// Keys with deltas to pop (client-go's `items`); each is in `fifo`, parked or in the
    /// resync lane.
    pending: grow::Growing<PendingMap<T>>,
    /// Keys held by consumers: at most a batch per consumer, so this map stays in cache.
    in_flight: KeyMap<Flight<T>>,
    /// Keys of `pending` in arrival order, except parked ones and those in the resync lane.
    fifo: VecDeque<Key>,
    /// With [`DeltaFifo::resync_last`]: keys queued by a resync alone, popped once `fifo` is
    /// empty. A key that gets a live delta moves to the back of `fifo` and leaves a stale
    /// entry here (one whose pending entry is gone or no longer `in_resync_lane`), skipped
    /// when met: removing it would cost a scan of the lane per live change.
    resync_lane: VecDeque<Key>,
    /// Keys of `pending` waiting in `resync_lane` (its entries that are not stale).
    lane_keys: usize,
    /// Keys of `pending` taken out of `fifo` because they were in flight.
    parked: usize,
    /// The shard has a token in the scheduler or a consumer is serving it. A shard with keys in
    /// `fifo` is always scheduled.
    scheduled: bool,
    /// The shard's index: staggers `pending`'s growth against the other shards' ([`grow`]).
    salt: u64,
    /// When to give back the room a drained backlog left ([`release`]).
    release: release::Hysteresis,
}

impl<T> ShardState<T> {
    fn new(salt: u64) -> Self {
        Self {
            pending: grow::Growing::default(),
            in_flight: KeyMap::default(),
            fifo: VecDeque::new(),
            resync_lane: VecDeque::new(),
            lane_keys: 0,
            parked: 0,
            scheduled: false,
            salt,
            release: release::Hysteresis::default(),
        }
    }

    /// Whether `key` has deltas waiting to be popped.
    fn has_pending(&self, key: &Key) -> bool {
        self.pending.contains_key(key)
    }

    /// Whether a delta of type `kind` for `key` would add to the queued deltas rather than be
    /// absorbed by the key's newest one.
    fn grows(&self, key: &Key, kind: DeltaType, compact: bool) -> bool {
        self.pending
            .get(key)
            .is_none_or(|entry| push_grows(&entry.deltas, kind, compact))
    }

    /// Whether the shard has keys a consumer can take (in `fifo` or the resync lane).
    fn has_queued(&self) -> bool {
        !self.fifo.is_empty() || self.lane_keys > 0
    }

    /// Appends a delta (with dedup, and with `compact` update compaction) to `key`, queueing
    /// the key in `lane` if it had nothing pending. A live delta for a key waiting in the
    /// resync lane moves it to the back of the FIFO: it has a live change now.
    fn push(&mut self, key: Key, delta: Delta<T>, compact: bool, lane: Lane) -> Pushed {
        // The shards fill in lockstep under a backlog: double each at its own moment.
        self.pending.ahead(self.salt);
        match self.pending.entry(key) {
            Entry::Occupied(mut entry) => {
                let pending = entry.get_mut();
                let grew = push_delta(&mut pending.deltas, delta, compact);
                // Read before written: the common live push to a live key stores nothing more.
                if lane == Lane::Live && pending.in_resync_lane {
                    pending.in_resync_lane = false;
                    self.fifo.push_back(entry.key().clone());
                    self.left_lane(1);
                }
                Pushed {
                    schedule: false,
                    grew,
                }
            }
            Entry::Vacant(entry) => {
                let in_resync_lane = lane == Lane::Resync;
                if in_resync_lane {
                    self.resync_lane.push_back(entry.key().clone());
                    self.lane_keys += 1;
                } else {
                    self.fifo.push_back(entry.key().clone());
                }
                entry.insert(Pending {
                    deltas: smallvec::smallvec![delta],
                    initial: false,
                    in_resync_lane,
                });
                Pushed {
                    schedule: self.mark_scheduled(),
                    grew: true,
                }
            }
        }
    }

    /// `keys` left the resync lane (popped, parked or moved to the FIFO). Once none is left
    /// the lane holds only stale entries: dropped at once, so that an idle shard does not
    /// look busy and a big lane's room is given back.
    fn left_lane(&mut self, keys: usize) {
        self.lane_keys -= keys;
        if self.lane_keys == 0 {
            if self.resync_lane.capacity() > LANE_ROOM_KEPT {
                self.resync_lane = VecDeque::new();
            } else {
                self.resync_lane.clear();
            }
        }
    }

    /// The next key to take: the FIFO's head, else the resync lane's first key that still
    /// waits there (stale entries are dropped on the way).
    fn next_key(&mut self) -> Option<Key> {
        if let Some(key) = self.fifo.pop_front() {
            return Some(key);
        }
        while self.lane_keys > 0 {
            let key = self.resync_lane.pop_front()?;
            if self.pending.get(&key).is_some_and(|p| p.in_resync_lane) {
                return Some(key);
            }
        }
        None
    }

    /// Sets `scheduled`; returns true if the caller must hand the scheduler a token.
    fn mark_scheduled(&mut self) -> bool {
        !std::mem::replace(&mut self.scheduled, true)
    }
}

/// Where a key with nothing pending is queued ([`DeltaFifo::resync_last`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// The FIFO: every delta but a resync's with the lane on.
    Live,
    /// The resync lane: a resync's `Sync` with [`DeltaFifo::resync_last`].
    Resync,
}

/// The room a drained resync lane keeps for the next resync; a bigger one is given back.
const LANE_ROOM_KEPT: usize = 1024;

/// What [`ShardState::push`] did.
struct Pushed {
    /// The shard was not scheduled: the caller must hand the scheduler a token.
    schedule: bool,
    /// The key's deltas grew by one (the delta was not absorbed by dedup or compaction).
    grew: bool,
}

/// A key handed to a consumer.
struct Popped<T> {
    deltas: Deltas<T>,
    initial: bool,
}

/// How many keys a consumer takes from a shard per hold of its lock. Taking a key costs
/// ~0.1-0.3 µs (its pending entry was written on the producer's core), so a hold lasts a few
/// microseconds: a producer that meets it waits that long spinning (`lock_patiently`) instead
/// of sleeping in the kernel. A hold for a whole batch of 256 keys would outlast the spin, and
/// W1's producer would sleep thousands of times a second, each sleep and wake-up costing it
/// tens of microseconds.
const TAKE_PER_HOLD: usize = 32;

/// Keys handed out by one visit to a shard. Inline room for a single `pop` and small batches,
/// so the one-key path allocates nothing.
type Batch<T> = SmallVec<[Popped<T>; 4]>;

/// The keys of a [`Batch`], kept to complete them after `process` consumed the deltas.
type BatchKeys = SmallVec<[Key; 4]>;

/// The sharded DeltaFIFO: client-go's semantics per key, sharded by key hash, with any number
/// of concurrent producers and consumers.
///
/// Keys are split into shards by a hash computed once per key ([`new`](Self::new) says how
/// many). Producers lock only their key's shard; consumers take a batch of keys from one shard
/// under one lock, process them with no lock held, and complete them under one more lock of
/// that shard. `replace` and `resync` lock every shard (in index order), so they see, and
/// change, the whole queue at one moment.
///
/// # Guarantees (docs/sharded.md)
///
/// - **Per-key order and dedup** are client-go's: a key's deltas accumulate, deduplicated, until
///   the key is popped, and come out oldest first.
/// - **Per-key exclusivity**: a key handed to one consumer is handed to no other until the first
///   is done with it; deltas that arrive meanwhile come out afterwards. (Stronger than
///   client-go, which lets two poppers race on one key.)
/// - **Exactly once**: every delta queued (after dedup) is handed out once.
/// - **One shard** behaves exactly like [`reference::DeltaFifo`](crate::reference::DeltaFifo),
///   pop order included, when consumers finish a key before popping the next.
/// - **Fairness**: within a shard, keys pop in arrival order; consumers visit shards with keys
///   round-robin and take at most `max` keys per visit. A key that has `p` keys ahead of it in its
///   shard is therefore popped within `ceil((p + 1) / max)` visits to its shard, and between two
///   visits every other shard is visited at most once: at most `ceil((p + 1) / max) · (N − 1) ·
///   max` keys queued after it can be popped before it.
///
/// # Known objects and the consumer's obligation
///
/// client-go processes a popped key under the queue's lock, so `delete`, `replace` and
/// `resync` see the known store either before or after a key is applied. Here processing runs
/// outside every lock, so while a key is in flight the engine answers "is this key known, and
/// as what?" from the popped deltas: the newest popped object, or nothing if the newest delta
/// is `Deleted`. That is exactly what client-go would see, **provided the consumer applies
/// every popped list to the known store** (with [`process_deltas`](crate::process_deltas),
/// [`apply_deltas_coalesced`](crate::apply_deltas_coalesced) or an equivalent) before it
/// returns from `process`. See [`DeltaQueue`]'s *consumer's obligation*.
///
/// # Initial list
///
/// client-go counts pops until the first `replace`'s count reaches zero. Here that `replace`
/// flags the keys its count covers; a pop hands the flag out as `is_in_initial_list`, and
/// [`has_synced`](DeltaQueue::has_synced) turns true once the last flagged key has been
/// *processed* (`process` returned), not merely popped. With one shard this is client-go's
/// behaviour; across shards each key's flag stays right whatever order shards are visited in.
///
/// # Panics in user code
///
/// The key function and the transformer run outside every lock; the known objects run under
/// the shard locks (in `resync`, the key function too, inside the known store's walk: see
/// [`KnownObjects::visit_objects`]), always before anything changes, so a panic there leaves
/// the queue as it was. If `process` panics, the key it was given is done
/// with, and the keys of its batch not yet given to it are queued again at the head of their
/// shard. Nothing stays in flight, and [`len`](DeltaQueue::len) keeps counting exactly the
/// keys that can be popped. Details on [`DeltaQueue`].
///
/// # Deviations from client-go
///
/// Those of [`reference::DeltaFifo`](crate::reference::DeltaFifo) (a refused or panicking
/// operation changes nothing; known keys are walked sorted), plus the per-key exclusivity,
/// the processing outside the lock and the *processed* meaning of `has_synced` above.
///
/// # Opt-in modes
///
/// [`QueueOptions::max_queued_deltas`] bounds the backlog with one count shared by all shards
/// (touched only when a bound is set); [`QueueOptions::compact_updates`] compacts updates per
/// key. Both behave exactly as in the reference (docs/sharded.md).
///
/// ```
/// use std::sync::Arc;
/// use kcache::{sharded::DeltaFifo, DeltaQueue, DeltaType, Key, QueueOptions};
///
/// let fifo = DeltaFifo::new(QueueOptions::new(Arc::new(|s: &String| Ok(Key::new(s)))), 4);
/// fifo.add(Arc::new("a".to_string())).unwrap();
/// fifo.update(Arc::new("a".to_string())).unwrap();
/// let kinds = fifo.pop(|deltas, _initial| deltas.iter().map(|d| d.kind).collect::<Vec<_>>());
/// assert_eq!(kinds, Ok(vec![DeltaType::Added, DeltaType::Updated]));
/// ```
pub struct DeltaFifo<T> {
    shards: Box<[CachePadded<Mutex<ShardState<T>>>]>,
    /// Where each shard's pending table is, for producers to prefetch from before they lock.
    /// Apart from the shards: it changes only when a table moves, so its lines stay cached on
    /// every core.
    pending_tables: Box<[prefetch::TableHint]>,
    /// `hash >> SHARD_BITS_OFFSET & mask` picks a shard: bits 32.. of the hash, which neither
    /// the shard maps' bucket index (low bits) nor their control bytes (top 7 bits) depend on
    /// (hence [`MAX_SHARDS`]).
    mask: usize,
    scheduler: Scheduler,
    key_fn: KeyFn<T>,
    known: Option<Arc<dyn KnownObjects<T>>>,
    emit_replaced: bool,
    transformer: Option<TransformFn<T>>,
    /// [`QueueOptions::compact_updates`].
    compact: bool,
    /// [`DeltaFifo::resync_last`].
    resync_last: bool,
    /// The backlog bound and the producers waiting for room.
    room: Room,
    /// Set (under a shard lock, or under all of them by `replace`) by the first operation that
    /// populates the queue.
    populated: AtomicBool,
    /// Flagged initial keys not yet processed; `has_synced` once populated and zero.
    initial_remaining: AtomicUsize,
    closed: AtomicBool,
    synced: Latch,
}

/// The lowest hash bit that picks a shard (see [`DeltaFifo::mask`]).
const SHARD_BITS_OFFSET: u32 = 32;

impl<T: Send + Sync + 'static> DeltaFifo<T> {
    /// A queue with `shards` shards. The count is always a power of two between 1 and
    /// [`MAX_SHARDS`] (65,536): 0 means 1, a count that is not a power of two is rounded up to
    /// the next one, and a count above the cap is capped. [`shard_count`](Self::shard_count)
    /// says what was chosen.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kcache::{sharded::{DeltaFifo, MAX_SHARDS}, Key, QueueOptions};
    /// let opts = || QueueOptions::new(Arc::new(|s: &String| Ok(Key::new(s))));
    /// assert_eq!(DeltaFifo::new(opts(), 0).shard_count(), 1);
    /// assert_eq!(DeltaFifo::new(opts(), 48).shard_count(), 64);
    /// assert_eq!(DeltaFifo::new(opts(), 1 << 20).shard_count(), MAX_SHARDS);
    /// ```
    pub fn new(opts: QueueOptions<T>, shards: usize) -> Self {
        let count = shards.clamp(1, MAX_SHARDS).next_power_of_two();
        Self {
            shards: (0..count)
                .map(|i| CachePadded::new(Mutex::new(ShardState::new(i as u64))))
                .collect(),
            pending_tables: (0..count).map(|_| prefetch::TableHint::default()).collect(),
            mask: count - 1,
            scheduler: Scheduler::new(),
            key_fn: opts.key_fn,
            known: opts.known_objects,
            emit_replaced: opts.emit_replaced,
            transformer: opts.transformer,
            compact: opts.compact_updates,
            resync_last: false,
            room: Room::new(opts.max_queued_deltas),
            populated: AtomicBool::new(false),
            initial_remaining: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            synced: Latch::new(),
        }
    }

    /// Resyncs go last (opt-in; off by default): a key queued by
    /// [`resync`](DeltaQueue::resync) alone waits in a lane of its shard that is popped only
    /// when no key with a live delta (an add, update, delete or relist) is queued in that
    /// shard, and a live delta for a key waiting there moves it to the back of the live FIFO.
    ///
    /// Why: a resync queues every known key at once. In client-go's one FIFO, a change that
    /// arrives then waits behind all of them, however many, before any handler hears of it;
    /// a controller with a priority workqueue cannot put it first if it never reaches the
    /// workqueue. With this, it waits for at most the batches consumers already hold.
    ///
    /// Per key nothing changes: a key's deltas are the same, in the same order, deduplicated
    /// the same way, and popped together (a resynced key that then changes pops `Sync`, then
    /// the change, as in client-go). Only the order *between* keys changes, which the sharded
    /// queue never promised beyond its fairness bound; that bound no longer holds for keys in
    /// the lane while live keys keep arriving. The initial list is never in the lane. The
    /// [`reference`](crate::reference) queue, client-go's port, has no lane.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use kcache::sharded::{DeltaFifo, IndexedStore};
    /// use kcache::{DeltaQueue, Key, KeyFn, KnownObjects, QueueOptions, Store};
    ///
    /// let key_fn: KeyFn<String> =
    ///     Arc::new(|s: &String| Ok(Key::new(s.split('=').next().unwrap_or(""))));
    /// let store = Arc::new(IndexedStore::new(Arc::clone(&key_fn), Default::default()));
    /// for obj in ["a=1", "b=1"] {
    ///     store.add(Arc::new(obj.to_string())).unwrap();
    /// }
    /// let known = Arc::clone(&store) as Arc<dyn KnownObjects<String>>;
    /// let fifo = DeltaFifo::new(QueueOptions::new(key_fn).known_objects(known), 1).resync_last();
    /// fifo.resync().unwrap(); // a and b wait in the resync lane
    /// fifo.update(Arc::new("c=2".to_string())).unwrap(); // live: client-go pops it third
    /// let first = fifo.pop(|d, _| d.key().as_str().to_string()).unwrap();
    /// assert_eq!(first, "c");
    /// ```
    pub fn resync_last(mut self) -> Self {
        self.resync_last = true;
        self
    }

    /// A queue with [`DEFAULT_SHARDS`] shards.
    pub fn with_default_shards(opts: QueueOptions<T>) -> Self {
        Self::new(opts, DEFAULT_SHARDS)
    }

    /// How many shards the queue has.
    pub fn shard_count(&self) -> usize {
        self.shards.len()
    }

    fn shard_of(&self, key: &Key) -> usize {
        (key.hash_value() >> SHARD_BITS_OFFSET) as usize & self.mask
    }

    fn lock_shard(&self, index: usize) -> MutexGuard<'_, ShardState<T>> {
        lock_patiently(&self.shards[index])
    }

    /// Asks for `key`'s bucket in its shard's pending map, while the caller holds every shard
    /// lock (`replace` and `resync` queue thousands of keys in one go, each a miss otherwise).
    fn prefetch_pending(&self, states: &[MutexGuard<'_, ShardState<T>>], key: &Key) {
        let state = &states[self.shard_of(key)];
        prefetch::bucket(state.pending.raw_table(), key.hash_value());
    }

    /// Asks for the newest delta of `key`'s list when that list has spilled to the heap, while
    /// the caller holds every shard lock: appending reads it (dedup) and writes after it, a
    /// second miss behind the bucket's. Finds the entry through its bucket, which
    /// [`prefetch_pending`](Self::prefetch_pending) asked for a few keys earlier.
    fn prefetch_pending_deltas(&self, states: &[MutexGuard<'_, ShardState<T>>], key: &Key) {
        // The lookup below is for the hint alone: a build without prefetches skips it too.
        if !prefetch::ENABLED {
            return;
        }
        let Some(entry) = states[self.shard_of(key)].pending.get(key) else {
            return;
        };
        // Taking the reference reads only the list's header, in the bucket; the delta itself
        // is what the hint asks for.
        if let (true, Some(newest)) = (entry.deltas.spilled(), entry.deltas.last()) {
            prefetch::value(newest);
        }
    }

    /// Locks every shard, in index order (the only order anyone takes more than one in).
    fn lock_all(&self) -> Vec<MutexGuard<'_, ShardState<T>>> {
        (0..self.shards.len()).map(|i| self.lock_shard(i)).collect()
    }

    /// Whether the knownObjects store holds `key` as the consumer will leave it: after the
    /// write of its in-flight batch, if it has one, else as it holds it now. Never, without
    /// a store.
    fn is_known(&self, state: &ShardState<T>, key: &Key) -> bool {
        match &self.known {
            None => false,
            Some(known) => match state.in_flight.get(key) {
                Some(flight) => flight.known_after.is_some(),
                None => known.get_by_key(key).is_some(),
            },
        }
    }

    /// Marks the queue populated; the caller holds a shard lock (or all of them), so this is
    /// ordered with `replace`'s check of the flag.
    fn mark_populated(&self) {
        if !self.populated.load(Ordering::Relaxed) {
            // Release pairs with the Acquire in `has_synced`.
            self.populated.store(true, Ordering::Release);
            self.fire_if_synced();
        }
    }

    fn fire_if_synced(&self) {
        if self.has_synced() {
            self.synced.fire();
        }
    }

    /// Applies the transformer, if any, to an object entering the queue from outside. Callers
    /// never pass tombstones nor `resync`'s objects (they come from the known store and were
    /// transformed on their way in); see [`TransformFn`].
    fn transform(&self, obj: Arc<T>) -> Result<Arc<T>, QueueError> {
        match &self.transformer {
            Some(transform) => Ok(transform(obj)?),
            None => Ok(obj),
        }
    }

    /// Whether a producer holding `state` may queue a delta of type `kind` for `key` now: it
    /// would be absorbed, or room for it was reserved. Reserved under the shard lock and
    /// followed by the push before the lock is released, so the count never lags the shard.
    fn reserve(&self, state: &ShardState<T>, key: &Key, kind: DeltaType) -> bool {
        !self.room.is_bounded() || !state.grows(key, kind, self.compact) || self.room.try_reserve()
    }

    /// The add/update path: key and transform outside the lock, one shard lock to append (and,
    /// with a backlog bound and no room, waits outside every lock and tries again).
    fn enqueue_object(&self, kind: DeltaType, obj: Arc<T>) -> Result<(), QueueError> {
        let key = (self.key_fn)(&obj)?;
        let obj = self.transform(obj)?;
        let shard = self.shard_of(&key);
        self.pending_tables[shard].bucket::<(Key, Pending<T>)>(key.hash_value());
        let mut state = self.lock_shard(shard);
        while !self.reserve(&state, &key, kind) {
            drop(state);
            self.room.wait();
            state = self.lock_shard(shard);
        }
        self.mark_populated();
        let pushed = state.push(key, Delta::new(kind, obj), self.compact, Lane::Live);
        self.pending_tables[shard].publish(state.pending.raw_table());
        drop(state);
        if pushed.schedule {
            self.scheduler.schedule(shard);
        }
        Ok(())
    }

    /// The delete path (docs/semantics.md): ignored when the key is neither queued nor known.
    fn enqueue_delete(&self, key: Key, payload: DeltaObject<T>) -> Result<(), QueueError> {
        // Transform outside the lock; its error only counts if the delete is not ignored
        // (client-go decides to ignore before it transforms).
        let payload = match payload {
            DeltaObject::Object(obj) => self.transform(obj).map(DeltaObject::Object),
            tombstone => Ok(tombstone),
        };
        let shard = self.shard_of(&key);
        self.pending_tables[shard].bucket::<(Key, Pending<T>)>(key.hash_value());
        let mut state = self.lock_shard(shard);
        loop {
            let queued = state.has_pending(&key);
            if !queued && !self.is_known(&state, &key) {
                self.mark_populated();
                return Ok(());
            }
            // A refused transform is returned before any room is taken.
            if payload.is_err() || self.reserve(&state, &key, DeltaType::Deleted) {
                break;
            }
            // Full: wait outside the lock, then decide again (pops moved on meanwhile).
            drop(state);
            self.room.wait();
            state = self.lock_shard(shard);
        }
        let payload = payload?;
        self.mark_populated();
        let pushed = state.push(
            key,
            Delta {
                kind: DeltaType::Deleted,
                object: payload,
            },
            self.compact,
            Lane::Live,
        );
        self.pending_tables[shard].publish(state.pending.raw_table());
        drop(state);
        if pushed.schedule {
            self.scheduler.schedule(shard);
        }
        Ok(())
    }

    /// Takes up to `max` keys from `shard`, which the caller was handed by the scheduler.
    fn take_batch(&self, shard: usize, max: usize, out: &mut Batch<T>) {
        let mut taken_deltas = 0;
        // A few keys per hold of the shard lock, so that a producer that meets the lock waits
        // microseconds, spinning, instead of sleeping through a whole batch (see
        // `TAKE_PER_HOLD`). Between holds the shard stays scheduled to this consumer (its flag
        // stays set), and each hold leaves its keys' in-flight records complete.
        let reschedule = loop {
            let mut guard = self.lock_shard(shard);
            let hold_max = max.min(out.len() + TAKE_PER_HOLD);
            taken_deltas += self.take_some(&mut guard, hold_max, out);
            if out.len() < max && guard.has_queued() {
                continue;
            }
            let reschedule = guard.has_queued();
            guard.scheduled = reschedule;
            break reschedule;
        };
        // After the shard lock: the count may run ahead of the shard for a moment (never
        // behind), and woken producers do not find the shard locked.
        self.room.release(taken_deltas);
        if reschedule {
            // Back of the line: other shards with keys get their turn first (fairness).
            self.scheduler.schedule(shard);
        }
    }

    /// Takes keys from the head of `state`'s FIFO into `out` until it holds `max` or the FIFO
    /// is empty, and records each as in flight; returns how many deltas it took.
    fn take_some(&self, state: &mut ShardState<T>, max: usize, out: &mut Batch<T>) -> usize {
        let track_known = self.known.is_some();
        let mut taken_deltas = 0;
        let first = out.len();
        // The pending buckets of the next keys load while this one is taken.
        for ahead in state
            .fifo
            .iter()
            .take(prefetch::PENDING_AHEAD.min(max - first))
        {
            prefetch::bucket(state.pending.raw_table(), ahead.hash_value());
        }
        while out.len() < max {
            let Some(key) = state.next_key() else {
                break;
            };
            if out.len() + prefetch::PENDING_AHEAD < max {
                if let Some(ahead) = state.fifo.get(prefetch::PENDING_AHEAD - 1) {
                    prefetch::bucket(state.pending.raw_table(), ahead.hash_value());
                }
            }
            if let Some(flight) = state.in_flight.get_mut(&key) {
                flight.parked = true;
                state.parked += 1;
                // A parked key goes back to the FIFO's head when done, out of the lane.
                if let Some(pending) = state.pending.get_mut(&key) {
                    if std::mem::replace(&mut pending.in_resync_lane, false) {
                        state.left_lane(1);
                    }
                }
                continue;
            }
            let Some((owned_key, entry)) = state.pending.remove_entry(&key) else {
                debug_assert!(false, "a key in the FIFO always has pending deltas");
                continue;
            };
            if entry.in_resync_lane {
                state.left_lane(1);
            }
            // The in-flight record below takes a reference count of the newest object: ask for
            // it now, so that its miss overlaps the next keys' instead of stalling this one.
            if track_known {
                prefetch::newest_object(&entry.deltas);
            }
            taken_deltas += entry.deltas.len();
            out.push(Popped {
                deltas: Deltas::from_list(owned_key, entry.deltas),
                initial: entry.initial,
            });
            state.in_flight.insert(
                key,
                Flight {
                    known_after: None,
                    parked: false,
                },
            );
        }
        // What each taken key will leave in the known store, before the lock is released (the
        // reference count of a newest object asked for above is taken here).
        if track_known {
            for popped in &out[first..] {
                let Some(newest) = popped.deltas.last() else {
                    continue;
                };
                if newest.kind == DeltaType::Deleted {
                    continue;
                }
                if let Some(flight) = state.in_flight.get_mut(popped.deltas.key()) {
                    flight.known_after = newest.object.object().cloned();
                }
            }
        }
        taken_deltas
    }

    /// Completes keys taken from `shard`: `done` (handed to `process`, in batch order) may be
    /// handed out again, parked ones go back to the head of the FIFO in their original order, and
    /// `returned` (taken but never handed to `process`, because an earlier `process` of the batch
    /// panicked) are queued again at the head as if they had never been taken.
    fn complete(&self, shard: usize, done: &[Key], initial_done: usize, returned: Batch<T>) {
        let mut state = self.lock_shard(shard);
        let mut requeued = false;
        let mut returned_deltas = 0;
        let ShardState {
            pending,
            in_flight,
            fifo,
            parked,
            ..
        } = &mut *state;
        let mut left_lane = 0;
        // Returned keys first (they come after the done ones in the batch), back to front, so
        // that both groups end up at the head in batch order.
        for popped in returned.into_iter().rev() {
            let (key, deltas) = popped.deltas.into_list();
            let was_parked = match in_flight.remove(&key) {
                Some(flight) => flight.parked,
                None => {
                    debug_assert!(false, "a returned key is always in flight");
                    false
                }
            };
            if was_parked {
                *parked -= 1;
            }
            match pending.entry(key) {
                Entry::Occupied(mut entry) => {
                    // Deltas queued while the key was out are newer: they go after.
                    let entry_key = entry.key().clone();
                    let pending = entry.get_mut();
                    let counted = pending.deltas.len();
                    let newer = std::mem::replace(&mut pending.deltas, deltas);
                    for delta in newer {
                        push_delta(&mut pending.deltas, delta, self.compact);
                    }
                    // Merging may dedup or compact at the seam (and, rarely, shrink).
                    returned_deltas += pending.deltas.len() as isize - counted as isize;
                    pending.initial |= popped.initial;
                    // Queued again by a resync while out: it goes to the head of the FIFO
                    // now, and its lane entry turns stale.
                    if std::mem::replace(&mut pending.in_resync_lane, false) {
                        left_lane += 1;
                    }
                    if !was_parked {
                        // Queued again meanwhile, behind other keys: move it back to the head.
                        if let Some(at) = fifo.iter().position(|k| *k == entry_key) {
                            fifo.remove(at);
                        }
                    }
                    fifo.push_front(entry_key);
                }
                Entry::Vacant(entry) => {
                    fifo.push_front(entry.key().clone());
                    returned_deltas += deltas.len() as isize;
                    entry.insert(Pending {
                        deltas,
                        initial: popped.initial,
                        in_resync_lane: false,
                    });
                }
            }
            requeued = true;
        }
        for key in done.iter().rev() {
            let Some(flight) = in_flight.remove(key) else {
                debug_assert!(false, "a completed key is always in flight");
                continue;
            };
            if flight.parked {
                *parked -= 1;
                fifo.push_front(key.clone());
                requeued = true;
            }
        }
        if left_lane > 0 {
            state.left_lane(left_lane);
        }
        let schedule = requeued && state.mark_scheduled();
        // Counted under the lock, so the count never runs behind the shard; they were released
        // when taken, and come back without waiting (the consumer must not wait for itself).
        match usize::try_from(returned_deltas) {
            Ok(grown) => self.room.add(grown),
            Err(_) => self.room.release(returned_deltas.unsigned_abs()),
        }
        let released = state.release_drained(done.len());
        drop(state);
        drop(released);
        if schedule {
            self.scheduler.schedule(shard);
        }
        if initial_done > 0 {
            // AcqRel: the last decrement to zero happens after every initial key was processed,
            // and `has_synced`'s Acquire load then sees those stores.
            let before = self
                .initial_remaining
                .fetch_sub(initial_done, Ordering::AcqRel);
            if before == initial_done {
                self.fire_if_synced();
            }
        }
    }

    /// Serves one key of `shard` to `process`, which it takes: its result, or `None` if the
    /// shard had no key to hand out (the caller acquires a shard again, `process` still
    /// untaken).
    fn serve_one<R, F>(&self, shard: usize, process: &mut Option<F>) -> Option<R>
    where
        F: FnOnce(Deltas<T>, bool) -> R,
    {
        let mut result = None;
        self.serve(
            shard,
            1,
            &mut Processing(|deltas, initial| {
                if let Some(process) = process.take() {
                    result = Some(process(deltas, initial));
                }
            }),
        );
        result
    }

    /// Pops from one scheduled shard and hands the keys to `consumer`, then ends the batch
    /// ([`BatchConsumer::finish`]) while its keys are still in flight. If `process` panics,
    /// the key it was given is done with (as the reference, which took it off its queue before
    /// calling `process`), `finish` still runs, and the keys of the batch not yet given to it
    /// are queued again: nothing stays in flight, nothing else is lost.
    fn serve<C: BatchConsumer<T> + ?Sized>(
        &self,
        shard: usize,
        max: usize,
        consumer: &mut C,
    ) -> usize {
        let mut batch = Batch::new();
        self.take_batch(shard, max, &mut batch);
        let count = batch.len();
        if count == 0 {
            return 0;
        }
        let mut serving = InFlightBatch {
            fifo: self,
            shard,
            keys: batch.iter().map(|p| p.deltas.key().clone()).collect(),
            initial_done: 0,
            rest: batch.into_iter(),
        };
        // Declared after `serving`, so dropped before it: the batch ends (`finish`) while its
        // keys are still in flight, and only then do they complete.
        let mut consumer = FinishOnDrop::new(consumer);
        let known = self.known.as_deref();
        prefetch::batch_start(serving.rest.as_slice(), known, |p| &p.deltas);
        loop {
            // What the keys after the next one will read loads while that one is applied. Asked
            // before the key leaves `rest`: the store's prefetch is user code, and a key it
            // panics before is still in `rest`, so `InFlightBatch` puts it back.
            let after_next = serving.rest.as_slice().get(1..).unwrap_or_default();
            prefetch::batch_next(after_next, known, |p| &p.deltas);
            let Some(popped) = serving.rest.next() else {
                break;
            };
            // Counted before the call: a key whose `process` panics is done with too.
            serving.initial_done += usize::from(popped.initial);
            consumer.process(popped.deltas, popped.initial);
        }
        drop(consumer);
        drop(serving);
        count
    }

    /// Enqueues a tombstone or a `Replaced`/`Sync` delta, in `lane`, while `replace`/`resync`
    /// hold every shard lock; returns the shards that need a token.
    fn push_locked(
        &self,
        states: &mut [MutexGuard<'_, ShardState<T>>],
        key: Key,
        delta: Delta<T>,
        wake: &mut PendingWakes<'_>,
        lane: Lane,
    ) {
        let shard = self.shard_of(&key);
        let pushed = states[shard].push(key, delta, self.compact, lane);
        if pushed.schedule {
            wake.shards.push(shard);
        }
        // Never waits: a relist or resync may go over the bound (`max_queued_deltas`).
        self.room.add(usize::from(pushed.grew));
    }

    /// The known keys with nothing queued that `listed` does not have, each with what the known
    /// store holds for it, or will hold once in-flight keys are done: what client-go would see
    /// under its lock. Keys the store will no longer hold are left out. Sorted by key, each
    /// once. Walks the store's keys once and fetches objects only for the keys it returns.
    /// Caller holds every shard lock.
    fn known_gone(
        &self,
        states: &[MutexGuard<'_, ShardState<T>>],
        listed: &KeyRefSet<'_>,
    ) -> Vec<(Key, Option<Arc<T>>)> {
        let Some(known) = &self.known else {
            return Vec::new();
        };
        let wanted = |key: &Key, state: &ShardState<T>| {
            !listed.contains(&KeyRef::of(key)) && !state.has_pending(key)
        };
        let any_in_flight = states.iter().any(|state| !state.in_flight.is_empty());
        let mut gone = Vec::new();
        known.visit_keys(&mut |key| {
            let state = &states[self.shard_of(key)];
            // In-flight keys are answered from their popped deltas, below.
            if wanted(key, state) && !(any_in_flight && state.in_flight.contains_key(key)) {
                gone.push(key.clone());
            }
        });
        // Fetched after the walk: the store may hold its locks while it calls `visit`.
        let mut gone: Vec<(Key, Option<Arc<T>>)> = gone
            .into_iter()
            .map(|key| {
                let obj = known.get_by_key(&key);
                (key, obj)
            })
            .collect();
        gone.extend(
            Self::in_flight_known(states, wanted)
                .into_iter()
                .map(|(key, obj)| (key, Some(obj))),
        );
        gone.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        // Once per key, as the reference asks (a store could list a key twice).
        gone.dedup_by(|a, b| a.0 == b.0);
        gone
    }

    /// Calls `f` with every known key and what the known store holds for it, or will hold once
    /// in-flight keys are done (see [`known_gone`](Self::known_gone)), in the store's order, in
    /// one walk of the store: `f` sees each object while the walk has it in cache. `f` may run
    /// while the store holds a read lock of its own (see [`KnownObjects::visit_objects`]).
    /// Caller holds every shard lock.
    fn for_each_known_object(
        &self,
        states: &[MutexGuard<'_, ShardState<T>>],
        mut f: impl FnMut(&Key, &Arc<T>),
    ) {
        let Some(known) = &self.known else {
            return;
        };
        let any_in_flight = states.iter().any(|state| !state.in_flight.is_empty());
        known.visit_objects(&mut |key, obj| {
            if !(any_in_flight && states[self.shard_of(key)].in_flight.contains_key(key)) {
                f(key, obj);
            }
        });
        for (key, obj) in Self::in_flight_known(states, |_, _| true) {
            f(&key, &obj);
        }
    }

    /// The in-flight keys that `wanted` accepts and that the known store will hold once the
    /// consumer is done, with that object (an in-flight key whose newest popped delta is
    /// `Deleted` will be gone: client-go would only see it after the delete was applied).
    fn in_flight_known(
        states: &[MutexGuard<'_, ShardState<T>>],
        wanted: impl Fn(&Key, &ShardState<T>) -> bool,
    ) -> Vec<(Key, Arc<T>)> {
        let mut known = Vec::new();
        for state in states {
            for (key, flight) in &state.in_flight {
                match &flight.known_after {
                    Some(obj) if wanted(key, state) => known.push((key.clone(), Arc::clone(obj))),
                    _ => {}
                }
            }
        }
        known
    }

    /// Flags the first `count` queued keys as the initial list (see module docs). Returns how
    /// many were flagged. Caller holds every shard lock.
    fn flag_initial(states: &mut [MutexGuard<'_, ShardState<T>>], count: usize) -> usize {
        let mut flagged = 0;
        for state in states.iter_mut() {
            let ShardState { pending, fifo, .. } = &mut **state;
            for key in fifo.iter() {
                if flagged == count {
                    return flagged;
                }
                if let Some(entry) = pending.get_mut(key) {
                    entry.initial = true;
                    flagged += 1;
                }
            }
        }
        flagged
    }
}

/// A batch being processed; completes it when dropped, so a panicking `process` can leave no
/// key in flight and lose no key it was not given (see [`DeltaFifo::serve`]).
struct InFlightBatch<'a, T: Send + Sync + 'static> {
    fifo: &'a DeltaFifo<T>,
    shard: usize,
    /// Every key of the batch, in pop order.
    keys: BatchKeys,
    /// Initial keys handed to `process` so far.
    initial_done: usize,
    /// Keys not yet handed to `process`: empty unless `process` panicked.
    rest: smallvec::IntoIter<[Popped<T>; 4]>,
}

impl<T: Send + Sync + 'static> Drop for InFlightBatch<'_, T> {
    fn drop(&mut self) {
        let returned: Batch<T> = self.rest.by_ref().collect();
        let done = &self.keys[..self.keys.len() - returned.len()];
        self.fifo
            .complete(self.shard, done, self.initial_done, returned);
    }
}

/// Shards that were marked scheduled and need a token; hands the tokens out when dropped, also
/// when a panic unwinds through `replace` or `resync`, so a shard can never stay marked
/// scheduled without a token (which would hide its keys from every consumer). Declare it before
/// the shard guards: it then drops after them, and consumers it wakes find the shards unlocked.
struct PendingWakes<'a> {
    scheduler: &'a Scheduler,
    shards: Vec<usize>,
}

impl<'a> PendingWakes<'a> {
    fn new(scheduler: &'a Scheduler) -> Self {
        Self {
            scheduler,
            shards: Vec::new(),
        }
    }
}

impl Drop for PendingWakes<'_> {
    fn drop(&mut self) {
        for shard in self.shards.drain(..) {
            self.scheduler.schedule(shard);
        }
    }
}

impl<T: Send + Sync + 'static> DeltaQueue<T> for DeltaFifo<T> {
    fn add(&self, obj: Arc<T>) -> Result<(), QueueError> {
        self.enqueue_object(DeltaType::Added, obj)
    }

    fn update(&self, obj: Arc<T>) -> Result<(), QueueError> {
        self.enqueue_object(DeltaType::Updated, obj)
    }

    fn delete(&self, obj: Arc<T>) -> Result<(), QueueError> {
        let key = (self.key_fn)(&obj)?;
        self.enqueue_delete(key, DeltaObject::Object(obj))
    }

    fn delete_tombstone(&self, tombstone: Tombstone<T>) -> Result<(), QueueError> {
        let key = tombstone.key.clone();
        self.enqueue_delete(key, DeltaObject::Tombstone(Arc::new(tombstone)))
    }

    /// One lock per shard the batch touches, one token per shard: see `delta_fifo/batch.rs`.
    fn apply_events(&self, events: Vec<QueueEvent<T>>) -> Result<(), BatchError> {
        self.apply_batch(events)
    }

    // Rare and large: kept out of the callers' code (and visible in profiles).
    #[inline(never)]
    fn replace(&self, list: Vec<Arc<T>>, _resource_version: &str) -> Result<(), QueueError> {
        // Every call into user code comes before the first change, so an error or a panic in any
        // of them changes nothing. Keys and transforms first, outside any lock.
        let mut listed = Vec::with_capacity(list.len());
        let mut objects = list.into_iter();
        while let Some(obj) = objects.next() {
            // A relist's objects are mostly cold: the key function's read of an object a few
            // places on overlaps this one's.
            if let Some(ahead) = objects.as_slice().get(prefetch::LIST_AHEAD - 1) {
                prefetch::value(Arc::as_ptr(ahead));
            }
            let key = (self.key_fn)(&obj)?;
            listed.push((key, self.transform(obj)?));
        }
        let kind = if self.emit_replaced {
            DeltaType::Replaced
        } else {
            DeltaType::Sync
        };
        // Still outside the locks: the listed keys, borrowed (no reference count each).
        let mut listed_keys = KeyRefSet::with_capacity_and_hasher(listed.len(), Default::default());
        listed_keys.extend(listed.iter().map(|(key, _)| KeyRef::of(key)));
        // Declared before the shard guards, so it drops (and wakes consumers) after them.
        let mut wake = PendingWakes::new(&self.scheduler);
        let mut states = self.lock_all();

        // Known keys with nothing queued that the list no longer has: their deletion was missed.
        // Asked of the known store (user code) before anything changes. Listed keys will have
        // something queued and are excluded anyway, so "nothing queued" can be judged now.
        let gone = self.known_gone(&states, &listed_keys);

        // Keys with pending deltas that the list does not have: their deletion was missed too.
        // Judged before the list is queued, which only adds listed keys and leaves these keys'
        // newest deltas as they are.
        let mut missing = Vec::new();
        for state in states.iter() {
            for (key, entry) in state.pending.iter() {
                if listed_keys.contains(&KeyRef::of(key)) {
                    continue;
                }
                let last_known = entry
                    .deltas
                    .last()
                    .and_then(|d| d.object.last_known().cloned());
                missing.push(Tombstone {
                    key: key.clone(),
                    last_known,
                });
            }
        }
        // Same order as the reference for identical output with one shard: these keys are all
        // queued already, so the order only matters for determinism.
        missing.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        let distinct_listed = listed_keys.len();
        drop(listed_keys);

        let mut listed = listed.into_iter();
        while let Some((key, obj)) = listed.next() {
            let ahead = listed.as_slice();
            if let Some((key, _)) = ahead.get(prefetch::PENDING_AHEAD - 1) {
                self.prefetch_pending(&states, key);
            }
            // A relist queues behind a backlog: many listed keys hold spilled lists.
            if let Some((key, _)) = ahead.get(prefetch::DELTAS_AHEAD - 1) {
                self.prefetch_pending_deltas(&states, key);
            }
            self.push_locked(
                &mut states,
                key,
                Delta::new(kind, obj),
                &mut wake,
                Lane::Live,
            );
        }

        // Then the tombstones for the known keys: under the store's key, as client-go does (a
        // tombstone's key is its `key`; the known object is not keyed again).
        let gone = gone
            .into_iter()
            .map(|(key, last_known)| Tombstone { key, last_known });
        let mut tombstones = 0;
        for tombstone in missing.into_iter().chain(gone) {
            tombstones += 1;
            let key = tombstone.key.clone();
            self.push_locked(
                &mut states,
                key,
                Delta::tombstone(tombstone),
                &mut wake,
                Lane::Live,
            );
        }

        if !self.populated.load(Ordering::Relaxed) {
            let flagged = Self::flag_initial(&mut states, distinct_listed + tombstones);
            // Relaxed store, then the Release store of `populated` publishes it.
            self.initial_remaining.store(flagged, Ordering::Relaxed);
            self.populated.store(true, Ordering::Release);
        }
        drop(states);
        drop(wake);
        self.fire_if_synced();
        Ok(())
    }

    // Rare and large: kept out of the callers' code (and visible in profiles).
    #[inline(never)]
    fn resync(&self) -> Result<(), QueueError> {
        if self.known.is_none() {
            return Ok(());
        }
        let mut wake = PendingWakes::new(&self.scheduler);
        let mut states = self.lock_all();
        // Every known object is keyed again by the key function (client-go's `syncKeyLocked`
        // calls `KeyOf` on the known object and returns its error), all before anything
        // changes: a key error or a panic in user code changes nothing. Only the objects whose
        // key has nothing queued are kept, so only those are sorted (by the store's key, the
        // order the reference walks them in).
        let mut synced = Vec::new();
        let mut first_error: Option<(Key, KeyError)> = None;
        self.for_each_known_object(&states, |store_key, obj| match (self.key_fn)(obj) {
            // A key with queued deltas is skipped: its queued state is newer than the store's.
            // (Nothing is queued until every key is known, so judging it now is judging it at
            // push time, except for repeats, judged again below.)
            Ok(key) => {
                if !states[self.shard_of(&key)].has_pending(&key) {
                    synced.push((store_key.clone(), key, Arc::clone(obj)));
                }
            }
            // The reference walks the store sorted and returns at the first error: the error
            // of the smallest failing store key is the one it returns.
            Err(error) => {
                if first_error
                    .as_ref()
                    .is_none_or(|(first, _)| store_key < first)
                {
                    first_error = Some((store_key.clone(), error));
                }
            }
        });
        if let Some((_, error)) = first_error {
            return Err(error.into());
        }
        synced.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let lane = if self.resync_last {
            Lane::Resync
        } else {
            Lane::Live
        };
        let mut synced = synced.into_iter();
        while let Some((_, key, obj)) = synced.next() {
            if let Some((_, ahead, _)) = synced.as_slice().get(prefetch::PENDING_AHEAD - 1) {
                self.prefetch_pending(&states, ahead);
            }
            // Two known objects with one key: the first (by store key) is queued, the second
            // now finds it queued and is skipped, as in the reference.
            if states[self.shard_of(&key)].has_pending(&key) {
                continue;
            }
            self.push_locked(
                &mut states,
                key,
                Delta::new(DeltaType::Sync, obj),
                &mut wake,
                lane,
            );
        }
        Ok(())
    }

    fn add_if_not_present(&self, deltas: Deltas<T>) -> Result<(), QueueError> {
        if deltas.is_empty() {
            return Err(QueueError::EmptyDeltas);
        }
        let shard = self.shard_of(deltas.key());
        let mut state = self.lock_shard(shard);
        self.mark_populated();
        if state.has_pending(deltas.key()) {
            return Ok(());
        }
        let (key, deltas) = deltas.into_list();
        // Never waits: the consumer handing a key back may be the one that makes room.
        self.room.add(deltas.len());
        state.fifo.push_back(key.clone());
        state.pending.insert(
            key,
            Pending {
                deltas,
                initial: false,
                in_resync_lane: false,
            },
        );
        let schedule = state.mark_scheduled();
        drop(state);
        if schedule {
            self.scheduler.schedule(shard);
        }
        Ok(())
    }

    fn pop<R, F>(&self, process: F) -> Result<R, Closed>
    where
        F: FnOnce(Deltas<T>, bool) -> R,
    {
        let mut process = Some(process);
        loop {
            let shard = self.scheduler.acquire().ok_or(Closed)?;
            if let Some(result) = self.serve_one(shard, &mut process) {
                return Ok(result);
            }
        }
    }

    fn try_pop<R, F>(&self, process: F) -> TryPop<R>
    where
        F: FnOnce(Deltas<T>, bool) -> R,
    {
        let mut process = Some(process);
        loop {
            let shard = match self.scheduler.try_acquire() {
                Acquired::Shard(shard) => shard,
                Acquired::Empty => return TryPop::Empty,
                Acquired::Closed => return TryPop::Closed,
            };
            if let Some(result) = self.serve_one(shard, &mut process) {
                return TryPop::Popped(result);
            }
        }
    }

    fn pop_batch<F>(&self, max: usize, mut process: F) -> Result<usize, Closed>
    where
        F: FnMut(Deltas<T>, bool),
    {
        self.pop_batch_into(max, &mut Processing(&mut process))
    }

    fn pop_batch_into<C>(&self, max: usize, consumer: &mut C) -> Result<usize, Closed>
    where
        C: BatchConsumer<T> + ?Sized,
    {
        let max = max.max(1);
        loop {
            let shard = self.scheduler.acquire().ok_or(Closed)?;
            let count = self.serve(shard, max, consumer);
            if count > 0 {
                return Ok(count);
            }
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.scheduler.close();
        self.room.close();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn is_drained(&self) -> bool {
        // A popped key stays in `in_flight` from the moment it leaves `pending` until its
        // `process` has returned and the consumer releases it, under the shard's lock; so an
        // empty `pending` and `in_flight`, seen under the lock, mean every key the shard held
        // before is done with.
        (0..self.shards.len()).all(|i| {
            let state = self.lock_shard(i);
            state.pending.is_empty() && state.in_flight.is_empty()
        })
    }

    fn has_synced(&self) -> bool {
        // Acquire pairs with the Release stores of `populated`: once it reads true, the count
        // `replace` stored before it (or a later decrement) is what the next load sees.
        self.populated.load(Ordering::Acquire)
            && self.initial_remaining.load(Ordering::Acquire) == 0
    }

    fn wait_synced(&self, timeout: Option<Duration>) -> bool {
        self.synced.wait(timeout)
    }

    fn get(&self, obj: &T) -> Result<Option<Deltas<T>>, KeyError> {
        let key = (self.key_fn)(obj)?;
        Ok(self.get_by_key(&key))
    }

    fn get_by_key(&self, key: &Key) -> Option<Deltas<T>> {
        let state = self.lock_shard(self.shard_of(key));
        state
            .pending
            .get(key)
            .map(|e| Deltas::from_list(key.clone(), e.deltas.clone()))
    }

    fn list(&self) -> Vec<DeltaObject<T>> {
        let mut out = Vec::new();
        for index in 0..self.shards.len() {
            let state = self.lock_shard(index);
            out.extend(
                state
                    .pending
                    .values()
                    .filter_map(|e| e.deltas.last().map(|d| d.object.clone())),
            );
        }
        out
    }

    fn list_keys(&self) -> Vec<Key> {
        let mut out = Vec::new();
        for index in 0..self.shards.len() {
            let state = self.lock_shard(index);
            out.extend(state.pending.keys().cloned());
        }
        out
    }

    fn len(&self) -> usize {
        (0..self.shards.len())
            .map(|i| self.lock_shard(i).pending.len())
            .sum()
    }

    /// Stops at the first shard holding a key: `len() == 0` would lock every shard even when
    /// the first one answers. Like `len`, a snapshot taken shard by shard.
    fn is_empty(&self) -> bool {
        (0..self.shards.len()).all(|i| self.lock_shard(i).pending.is_empty())
    }

    fn queued_deltas(&self) -> usize {
        if self.room.is_bounded() {
            return self.room.count();
        }
        // Unbounded queues keep no shared count (it would be one more contended cache line per
        // operation): add the shards up.
        (0..self.shards.len())
            .map(|i| {
                let state = self.lock_shard(i);
                state
                    .pending
                    .values()
                    .map(|e| e.deltas.len())
                    .sum::<usize>()
            })
            .sum()
    }

    fn has_room(&self) -> bool {
        self.room.has_room()
    }

    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.room.poll(cx)
    }
}

impl<T> fmt::Debug for DeltaFifo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeltaFifo")
            .field("shards", &self.shards.len())
            .field("scheduler", &self.scheduler)
            .field("room", &self.room)
            .field("populated", &self.populated.load(Ordering::Relaxed))
            .field(
                "initial_remaining",
                &self.initial_remaining.load(Ordering::Relaxed),
            )
            .field("closed", &self.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
