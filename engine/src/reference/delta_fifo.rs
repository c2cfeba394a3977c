//! client-go's `DeltaFIFO`, ported line for line. What it does, and where it deviates from
//! client-go, is documented on [`DeltaFifo`] (rustdoc shows it there).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::delta::{push_grows, Delta, DeltaObject, DeltaType, Deltas, Tombstone};
use crate::key::{Key, KeyError, KeyFn, KeyMap, KeySet};
use crate::latch::Latch;
use crate::queue::{
    BatchConsumer, BatchError, Closed, DeltaQueue, FinishOnDrop, Processing, QueueError,
    QueueEvent, QueueOptions, TransformError, TransformFn, TryPop,
};
use crate::store::KnownObjects;
use crate::sync::{lock, wait, Condvar, Mutex, MutexGuard};

mod footprint;

/// The faithful port of client-go's `DeltaFIFO` (Kubernetes 1.36): one mutex over the whole
/// state, one condition variable, nothing clever.
///
/// It is the yardstick the sharded engine is measured and differentially tested against, so
/// its costs are client-go's on purpose: the key function and the transformer run under the
/// lock, every enqueue wakes every popper, and `process` runs under the lock (so it must not
/// call back into this queue: the lock is not reentrant).
///
/// # Algorithm (docs/semantics.md)
///
/// `items` maps a key to its deltas (oldest first); `queue` holds the keys in arrival order. A
/// key is in `queue` iff it is in `items`, and at most once, so all changes to one object
/// accumulate in one place until that key is popped. `pop` takes the front key with all of its
/// deltas. The consumer must apply every popped list to the known store: see
/// [`DeltaQueue`]'s *consumer's obligation*.
///
/// # Deviations from client-go, and why
///
/// - **A refused operation changes nothing** (docs/semantics.md). client-go's `Add` marks the
///   queue populated before the key function can fail, and its `Replace`/`Resync` can fail
///   halfway, leaving part of the list enqueued. Here every key and every transform is computed
///   first; only then is anything changed.
/// - **A panic in user code changes nothing either.** client-go's `Replace` asks the known
///   objects for their keys after it has queued the listed objects; here they are asked first,
///   so a panicking `list_keys` or `get_by_key` leaves the queue as it was. (A panic in
///   `process` loses the popped key, exactly as in client-go.)
/// - **Deterministic iteration.** client-go walks Go maps (random order) where the order decides
///   which new keys join the queue first: the known keys in `replace` and `resync`. We walk them
///   sorted, so pop order is reproducible and traces can be compared line for line.
/// - [`Deltas`] carry their key, so `add_if_not_present` needs no key function call.
/// - **Two opt-in modes**, off by default: a backlog bound
///   ([`QueueOptions::max_queued_deltas`]: producers wait on the one condition variable, which
///   pops signal when they make room) and update compaction
///   ([`QueueOptions::compact_updates`]).
///
/// ```
/// use std::sync::Arc;
/// use kcache::reference::DeltaFifo;
/// use kcache::{DeltaQueue, DeltaType, Key, QueueOptions};
///
/// // Objects are plain strings here; the key is the part before the '='.
/// let key_fn = Arc::new(|s: &String| Ok(Key::new(s.split('=').next().unwrap_or(""))));
/// let q = DeltaFifo::new(QueueOptions::new(key_fn));
/// q.add(Arc::new("a=1".to_string())).unwrap();
/// q.update(Arc::new("a=2".to_string())).unwrap();
/// let kinds = q
///     .pop(|deltas, _initial| deltas.iter().map(|d| d.kind).collect::<Vec<_>>())
///     .unwrap();
/// assert_eq!(kinds, [DeltaType::Added, DeltaType::Updated]);
/// assert!(q.is_empty());
/// ```
pub struct DeltaFifo<T> {
    key_fn: KeyFn<T>,
    /// The consumer's store; consulted by `delete`, `replace` and `resync`.
    known_objects: Option<Arc<dyn KnownObjects<T>>>,
    /// Emit `Replaced` (rather than `Sync`) for objects listed by `replace`.
    emit_replaced: bool,
    transformer: Option<TransformFn<T>>,
    /// The backlog bound ([`QueueOptions::max_queued_deltas`]); `usize::MAX` when unbounded.
    max_queued: usize,
    /// [`QueueOptions::compact_updates`].
    compact: bool,
    /// Everything mutable, behind the one lock (client-go's `f.lock`).
    state: Mutex<State<T>>,
    /// Signalled on every enqueue and on close (client-go's `f.cond`, always `Broadcast`), and,
    /// with a backlog bound, when a pop makes room for producers that wait on it.
    cond: Condvar,
    /// Fired the first time `has_synced` becomes true (client-go's `synced` channel).
    synced: Latch,
    /// Held by a [`pop_batch_into`](DeltaQueue::pop_batch_into) from its pop until its
    /// consumer's `finish` returned (not part of client-go, whose one consumer hands over
    /// inside its pop).
    batch_consumer: Mutex<()>,
}

/// The state guarded by [`DeltaFifo::state`].
struct State<T> {
    /// Deltas per key, oldest first; never empty. Same key set as `queue`.
    items: KeyMap<Deltas<T>>,
    /// Keys in pop order. Invariant: a key is here iff it is in `items`, at most once.
    queue: VecDeque<Key>,
    /// Set by the first add/update/delete/replace/add_if_not_present.
    populated: bool,
    /// Keys of the first `replace` (plus its tombstones) not yet popped.
    initial_population_count: usize,
    /// Set by `close`: pops on an empty queue then return [`Closed`].
    closed: bool,
    /// Deltas in `items`, counted as they join (after dedup and compaction) and leave.
    queued_deltas: usize,
    /// Producer threads waiting on `cond` for room.
    waiting_producers: usize,
    /// Pops waiting on `cond` for a delta: what a test checks to know a pop is blocked.
    waiting_pops: usize,
    /// Async producers waiting for room ([`DeltaQueue::poll_room`]).
    room_wakers: Vec<Waker>,
}

impl<T> State<T> {
    /// client-go's `hasSynced_locked`.
    fn has_synced(&self) -> bool {
        self.populated && self.initial_population_count == 0
    }

    /// Whether a producer may queue a delta now (see [`QueueOptions::max_queued_deltas`]).
    fn has_room(&self, max_queued: usize) -> bool {
        self.closed || self.queued_deltas < max_queued
    }

    /// Whether a delta of type `kind` for `key` would add to the count (not absorbed by the
    /// key's newest delta).
    fn grows(&self, key: &Key, kind: DeltaType, compact: bool) -> bool {
        self.items
            .get(key)
            .is_none_or(|deltas| push_grows(deltas, kind, compact))
    }
}

impl<T> DeltaFifo<T> {
    /// A queue built from `opts` (client-go's `NewDeltaFIFOWithOptions`).
    pub fn new(opts: QueueOptions<T>) -> Self {
        Self {
            key_fn: opts.key_fn,
            known_objects: opts.known_objects,
            emit_replaced: opts.emit_replaced,
            transformer: opts.transformer,
            max_queued: match opts.max_queued_deltas {
                0 => usize::MAX,
                n => n,
            },
            compact: opts.compact_updates,
            state: Mutex::new(State {
                items: KeyMap::default(),
                queue: VecDeque::new(),
                populated: false,
                initial_population_count: 0,
                closed: false,
                queued_deltas: 0,
                waiting_producers: 0,
                waiting_pops: 0,
                room_wakers: Vec::new(),
            }),
            cond: Condvar::new(),
            batch_consumer: Mutex::new(()),
            synced: Latch::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        lock(&self.state)
    }

    /// client-go's `KeyOf`: a tombstone's key is its `key`, an object's comes from `key_fn`.
    fn key_of(&self, payload: &DeltaObject<T>) -> Result<Key, KeyError> {
        match payload {
            DeltaObject::Object(obj) => (self.key_fn)(obj),
            DeltaObject::Tombstone(t) => Ok(t.key.clone()),
        }
    }

    /// Applies the transformer unless the payload is a tombstone or `internal` is `Sync`: both
    /// carry objects that already went through it (client-go's `queueActionInternalLocked`).
    fn transform(
        &self,
        internal: DeltaType,
        payload: DeltaObject<T>,
    ) -> Result<DeltaObject<T>, TransformError> {
        match (&self.transformer, payload) {
            (Some(transform), DeltaObject::Object(obj)) if internal != DeltaType::Sync => {
                Ok(DeltaObject::Object(transform(obj)?))
            }
            (_, payload) => Ok(payload),
        }
    }

    /// The second half of client-go's `queueActionInternalLocked`, once key and transform are
    /// known to have succeeded: append with dedup, queue a new key at the back, wake everyone.
    fn enqueue_locked(&self, st: &mut State<T>, key: Key, delta: Delta<T>) {
        self.push_locked(st, key, delta);
        // client-go broadcasts on every enqueue, even when the key was already queued and no
        // popper can make progress because of it. That cost is part of what is being measured.
        self.cond.notify_all();
    }

    /// [`enqueue_locked`](Self::enqueue_locked) without the broadcast: `apply_events` pushes a
    /// whole batch, then broadcasts once.
    fn push_locked(&self, st: &mut State<T>, key: Key, delta: Delta<T>) {
        let grew = match st.items.get_mut(&key) {
            Some(deltas) => deltas.push_delta(delta, self.compact),
            None => {
                let mut deltas = Deltas::new(key.clone());
                deltas.push(delta);
                st.items.insert(key.clone(), deltas);
                st.queue.push_back(key);
                true
            }
        };
        st.queued_deltas += usize::from(grew);
    }

    /// client-go's `checkSynced_locked`: fires the latch the first time the queue is synced.
    fn check_synced_locked(&self, st: &State<T>) {
        if st.has_synced() {
            self.synced.fire();
        }
    }

    /// With a backlog bound, blocks while the queue has no room and a delta of type `kind` for
    /// `key` would add to it (see [`QueueOptions::max_queued_deltas`]). Waits on the one
    /// condition variable; pops and `close` signal it when they make room.
    fn wait_for_room_locked<'a>(
        &'a self,
        mut st: MutexGuard<'a, State<T>>,
        key: &Key,
        kind: DeltaType,
    ) -> MutexGuard<'a, State<T>> {
        while !st.has_room(self.max_queued) && st.grows(key, kind, self.compact) {
            st.waiting_producers += 1;
            st = wait(&self.cond, st);
            st.waiting_producers -= 1;
        }
        st
    }

    /// After deltas left the queue (or it closed): wakes the producers waiting for room, if
    /// there is room now.
    fn room_made_locked(&self, st: &mut State<T>) {
        if !st.has_room(self.max_queued) {
            return;
        }
        if st.waiting_producers > 0 {
            self.cond.notify_all();
        }
        for waker in st.room_wakers.drain(..) {
            waker.wake();
        }
    }

    /// Blocks while the queue is empty; [`Closed`] once it is empty and closed.
    fn wait_nonempty<'a>(
        &'a self,
        mut st: MutexGuard<'a, State<T>>,
    ) -> Result<MutexGuard<'a, State<T>>, Closed> {
        while st.queue.is_empty() {
            if st.closed {
                return Err(Closed);
            }
            st.waiting_pops += 1;
            st = wait(&self.cond, st);
            st.waiting_pops -= 1;
        }
        Ok(st)
    }

    /// How many pops are blocked on an empty queue.
    #[cfg(test)]
    pub(crate) fn waiting_pops(&self) -> usize {
        self.lock().waiting_pops
    }

    /// Waits for a key, then takes up to `max` (at least one) into `consumer` under the queue
    /// lock, as client-go processes a pop under its lock; the lock is released when this
    /// returns, before the caller drops `consumer` (and so before its `finish`).
    fn pop_batch_locked<C: BatchConsumer<T> + ?Sized>(
        &self,
        max: usize,
        consumer: &mut FinishOnDrop<'_, T, C>,
    ) -> Result<usize, Closed> {
        let max = max.max(1);
        let mut st = self.lock();
        loop {
            st = self.wait_nonempty(st)?;
            let mut popped = 0;
            while popped < max && !st.queue.is_empty() {
                if let Some((deltas, is_in_initial_list)) = self.take_front_locked(&mut st) {
                    consumer.process(deltas, is_in_initial_list);
                    popped += 1;
                }
            }
            if popped > 0 {
                return Ok(popped);
            }
        }
    }

    /// Takes the front key off a non-empty queue: its deltas and `is_in_initial_list`.
    ///
    /// `None` only if the front key had no deltas, which the invariant rules out; client-go
    /// logs "Inconceivable!" and moves on to the next key, and so do the callers.
    fn take_front_locked(&self, st: &mut State<T>) -> Option<(Deltas<T>, bool)> {
        // Computed before the count is decremented: the last key of the initial list is still
        // part of it (client-go's order).
        let is_in_initial_list = !st.has_synced();
        let key = st.queue.pop_front()?;
        if st.initial_population_count > 0 {
            st.initial_population_count -= 1;
            self.check_synced_locked(st);
        }
        let deltas = st.items.remove(&key)?;
        st.queued_deltas -= deltas.len();
        self.room_made_locked(st);
        Some((deltas, is_in_initial_list))
    }

    /// `add` and `update`.
    fn add_or_update(&self, kind: DeltaType, obj: Arc<T>) -> Result<(), QueueError> {
        let st = self.lock();
        let payload = DeltaObject::Object(obj);
        let key = self.key_of(&payload)?;
        let payload = self.transform(kind, payload)?;
        let mut st = self.wait_for_room_locked(st, &key, kind);
        st.populated = true;
        self.enqueue_locked(
            &mut st,
            key,
            Delta {
                kind,
                object: payload,
            },
        );
        self.check_synced_locked(&st);
        Ok(())
    }

    /// `delete` and `delete_tombstone` (client-go's `Delete`, which takes either).
    fn delete_payload(&self, payload: DeltaObject<T>) -> Result<(), QueueError> {
        let key = self.key_of(&payload)?;
        let mut st = self.lock();
        loop {
            let queued = st.items.contains_key(&key);
            let ignore = match &self.known_objects {
                // Without known objects only the queue says what exists: the object may have
                // been deleted by a relist already, so do not report the same deletion twice.
                None => !queued,
                // client-go asks the store even when the key is queued; so do we, to cost the
                // same.
                Some(known) => {
                    let known = known.get_by_key(&key).is_some();
                    !known && !queued
                }
            };
            if ignore {
                st.populated = true;
                self.check_synced_locked(&st);
                return Ok(());
            }
            if st.has_room(self.max_queued) || !st.grows(&key, DeltaType::Deleted, self.compact) {
                break;
            }
            // Full: wait for room, then decide again (pops and the store moved on meanwhile).
            st = self.wait_for_room_locked(st, &key, DeltaType::Deleted);
        }
        let payload = self.transform(DeltaType::Deleted, payload)?;
        st.populated = true;
        self.enqueue_locked(
            &mut st,
            key,
            Delta {
                kind: DeltaType::Deleted,
                object: payload,
            },
        );
        self.check_synced_locked(&st);
        Ok(())
    }

    /// One event of `apply_events`, under the lock, exactly as `add_or_update` or
    /// `delete_payload` would apply it, but without waiting for room or broadcasting. Returns
    /// whether it queued a delta.
    fn apply_event_locked(
        &self,
        st: &mut State<T>,
        event: QueueEvent<T>,
    ) -> Result<bool, QueueError> {
        let (kind, obj) = match event {
            QueueEvent::Added(obj) => (DeltaType::Added, obj),
            QueueEvent::Updated(obj) => (DeltaType::Updated, obj),
            QueueEvent::Deleted(obj) => (DeltaType::Deleted, obj),
        };
        let payload = DeltaObject::Object(obj);
        let key = self.key_of(&payload)?;
        if kind == DeltaType::Deleted {
            let queued = st.items.contains_key(&key);
            let known = match &self.known_objects {
                None => false,
                Some(known) => known.get_by_key(&key).is_some(),
            };
            if !known && !queued {
                st.populated = true;
                self.check_synced_locked(st);
                return Ok(false);
            }
        }
        let payload = self.transform(kind, payload)?;
        st.populated = true;
        self.push_locked(
            st,
            key,
            Delta {
                kind,
                object: payload,
            },
        );
        // Per event, as `add` does: a panic in a later event's user code must not leave the
        // latch unfired.
        self.check_synced_locked(st);
        Ok(true)
    }

    /// Pushes the tombstone `replace` makes for `key`; tombstones skip the delete-ignore rule
    /// and the transformer, exactly as client-go's `queueActionLocked(Deleted, ...)` does.
    fn enqueue_tombstone_locked(&self, st: &mut State<T>, key: Key, last_known: Option<Arc<T>>) {
        let tombstone = Tombstone {
            key: key.clone(),
            last_known,
        };
        self.enqueue_locked(st, key, Delta::tombstone(tombstone));
    }
}

impl<T: Send + Sync> DeltaQueue<T> for DeltaFifo<T> {
    fn add(&self, obj: Arc<T>) -> Result<(), QueueError> {
        self.add_or_update(DeltaType::Added, obj)
    }

    fn update(&self, obj: Arc<T>) -> Result<(), QueueError> {
        self.add_or_update(DeltaType::Updated, obj)
    }

    fn delete(&self, obj: Arc<T>) -> Result<(), QueueError> {
        self.delete_payload(DeltaObject::Object(obj))
    }

    fn delete_tombstone(&self, tombstone: Tombstone<T>) -> Result<(), QueueError> {
        self.delete_payload(DeltaObject::from(tombstone))
    }

    /// The batch under one hold of the lock and one broadcast: what client-go would do with
    /// the events one by one, minus a lock and a broadcast per event. With a backlog bound it
    /// waits while the queue is full, once, before the first event.
    fn apply_events(&self, events: Vec<QueueEvent<T>>) -> Result<(), BatchError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut st = self.lock();
        while !st.has_room(self.max_queued) {
            st.waiting_producers += 1;
            st = wait(&self.cond, st);
            st.waiting_producers -= 1;
        }
        let mut refused = Vec::new();
        let mut queued = false;
        for (at, event) in events.into_iter().enumerate() {
            match self.apply_event_locked(&mut st, event) {
                Ok(pushed) => queued |= pushed,
                Err(err) => refused.push((at, err)),
            }
        }
        if queued {
            self.cond.notify_all();
        }
        BatchError::check(refused)
    }

    fn replace(&self, list: Vec<Arc<T>>, _resource_version: &str) -> Result<(), QueueError> {
        let mut st = self.lock();

        // Validation pass: every key and every transform, before anything changes (docs/semantics.md;
        // client-go would have enqueued the objects before the failing one). The internal type
        // is Replaced whatever is emitted, so the transformer applies; it runs once, here.
        let mut listed = Vec::with_capacity(list.len());
        for obj in list {
            let key = (self.key_fn)(&obj)?;
            let obj = match &self.transformer {
                Some(transform) => transform(obj)?,
                None => obj,
            };
            listed.push((key, obj));
        }

        let kind = if self.emit_replaced {
            DeltaType::Replaced
        } else {
            DeltaType::Sync
        };
        let keys: KeySet = listed.iter().map(|(key, _)| key.clone()).collect();

        // Deletions missed while the watch was down, part 2 (queued below, after part 1): known
        // keys absent from the list with nothing queued get a tombstone with the store's state.
        // client-go asks the store after queueing the list; we ask first, so a panicking store
        // changes nothing either (listed keys are excluded, so "nothing queued" is the same
        // question before and after). Sorted, and each key once: client-go walks a Go map here,
        // and this order decides where the new keys land in the queue.
        let mut known_gone = Vec::new();
        if let Some(known) = &self.known_objects {
            let mut known_keys = known.list_keys();
            known_keys.sort_unstable();
            known_keys.dedup();
            for key in known_keys {
                if keys.contains(&key) || st.items.get(&key).is_some_and(|d| !d.is_empty()) {
                    continue;
                }
                let last_known = known.get_by_key(&key);
                known_gone.push((key, last_known));
            }
        }

        for (key, obj) in listed {
            self.enqueue_locked(&mut st, key, Delta::new(kind, obj));
        }

        // Part 1: queued keys absent from the list get a tombstone with the newest state we
        // queued. These keys are already queued, so the walk order changes nothing observable;
        // queue order keeps it deterministic anyway.
        let missing: Vec<(Key, Option<Arc<T>>)> = st
            .queue
            .iter()
            .filter(|key| !keys.contains(*key))
            .map(|key| {
                let last_known = st
                    .items
                    .get(key)
                    .and_then(Deltas::newest)
                    .and_then(|newest| newest.object.last_known().cloned());
                (key.clone(), last_known)
            })
            .collect();
        let queued_deletions = missing.len() + known_gone.len();
        for (key, last_known) in missing {
            self.enqueue_tombstone_locked(&mut st, key, last_known);
        }
        // Part 2, under the store's key: a tombstone's key is its `key`, and client-go does not
        // key the known object again here.
        for (key, last_known) in known_gone {
            self.enqueue_tombstone_locked(&mut st, key, last_known);
        }

        if !st.populated {
            st.populated = true;
            st.initial_population_count = keys.len() + queued_deletions;
        }
        self.check_synced_locked(&st);
        Ok(())
    }

    fn resync(&self) -> Result<(), QueueError> {
        let Some(known) = &self.known_objects else {
            return Ok(());
        };
        let mut st = self.lock();
        // Sorted for a reproducible pop order (client-go's store lists keys in map order).
        let mut known_keys = known.list_keys();
        known_keys.sort_unstable();
        // client-go keys the object again (`KeyOf(obj)`) rather than trusting the store's key;
        // all of those keys are computed before anything is enqueued, so a key error changes
        // nothing. Keys the store no longer has are skipped, as client-go does.
        let mut found = Vec::with_capacity(known_keys.len());
        for key in &known_keys {
            if let Some(obj) = known.get_by_key(key) {
                found.push(((self.key_fn)(&obj)?, obj));
            }
        }
        for (key, obj) in found {
            // A key with queued deltas is skipped: its queued state is newer than the store's,
            // and a Sync carrying the store's older state would make the consumer go back.
            if st.items.get(&key).is_some_and(|d| !d.is_empty()) {
                continue;
            }
            // Internal type Sync: the store's objects were transformed on the way in already.
            self.enqueue_locked(&mut st, key, Delta::new(DeltaType::Sync, obj));
        }
        Ok(())
    }

    fn add_if_not_present(&self, deltas: Deltas<T>) -> Result<(), QueueError> {
        if deltas.is_empty() {
            return Err(QueueError::EmptyDeltas);
        }
        let mut st = self.lock();
        st.populated = true;
        // Newer deltas were queued for the key while it was out: they win, the old ones are
        // dropped (client-go's `addIfNotPresent`).
        if !st.items.contains_key(deltas.key()) {
            let key = deltas.key().clone();
            // Never waits for room: the consumer handing a key back may be the only one
            // making room (see `QueueOptions::max_queued_deltas`).
            st.queued_deltas += deltas.len();
            st.queue.push_back(key.clone());
            st.items.insert(key, deltas);
            self.cond.notify_all();
        }
        self.check_synced_locked(&st);
        Ok(())
    }

    /// client-go's `Pop`. `process` runs **while the queue's lock is held**, as in client-go:
    /// every other operation on this queue waits for it, and `process` must not call back into
    /// this queue (the lock is not reentrant; that would deadlock).
    fn pop<R, F>(&self, process: F) -> Result<R, Closed>
    where
        F: FnOnce(Deltas<T>, bool) -> R,
    {
        let mut st = self.lock();
        loop {
            st = self.wait_nonempty(st)?;
            if let Some((deltas, is_in_initial_list)) = self.take_front_locked(&mut st) {
                let out = process(deltas, is_in_initial_list);
                drop(st);
                return Ok(out);
            }
        }
    }

    /// Like [`pop`](Self::pop) without waiting; `process` also runs under the lock.
    fn try_pop<R, F>(&self, process: F) -> TryPop<R>
    where
        F: FnOnce(Deltas<T>, bool) -> R,
    {
        let mut st = self.lock();
        loop {
            if st.queue.is_empty() {
                return if st.closed {
                    TryPop::Closed
                } else {
                    TryPop::Empty
                };
            }
            if let Some((deltas, is_in_initial_list)) = self.take_front_locked(&mut st) {
                let out = process(deltas, is_in_initial_list);
                drop(st);
                return TryPop::Popped(out);
            }
        }
    }

    /// Waits like [`pop`](Self::pop), then pops up to `max` keys (at least one) one after
    /// another in one hold of the lock, calling `process` on each under the lock.
    fn pop_batch<F>(&self, max: usize, process: F) -> Result<usize, Closed>
    where
        F: FnMut(Deltas<T>, bool),
    {
        let mut processing = Processing(process);
        let mut consumer = FinishOnDrop::new(&mut processing);
        let popped = self.pop_batch_locked(max, &mut consumer);
        drop(consumer);
        popped
    }

    fn pop_batch_into<C>(&self, max: usize, consumer: &mut C) -> Result<usize, Closed>
    where
        C: BatchConsumer<T> + ?Sized,
    {
        // One batch-taking consumer at a time, from its pop until its `finish` returned: a
        // key popped again is then popped by the next one, after this hand-over. Declared
        // first, so dropped last; `finish` runs when `consumer` drops, after the queue lock
        // was released in `pop_batch_locked`.
        let _turn = lock(&self.batch_consumer);
        let mut consumer = FinishOnDrop::new(consumer);
        self.pop_batch_locked(max, &mut consumer)
    }

    fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        // Wakes poppers and waiting producers alike: after close the bound no longer applies.
        self.cond.notify_all();
        self.room_made_locked(&mut st);
    }

    fn is_closed(&self) -> bool {
        self.lock().closed
    }

    fn is_drained(&self) -> bool {
        // `pop` and `pop_batch` call `process` under this lock, so holding it, no key is
        // between its pop and the end of its processing.
        self.lock().queue.is_empty()
    }

    fn has_synced(&self) -> bool {
        self.lock().has_synced()
    }

    fn wait_synced(&self, timeout: Option<Duration>) -> bool {
        self.synced.wait(timeout)
    }

    fn get(&self, obj: &T) -> Result<Option<Deltas<T>>, KeyError> {
        let key = (self.key_fn)(obj)?;
        Ok(self.get_by_key(&key))
    }

    fn get_by_key(&self, key: &Key) -> Option<Deltas<T>> {
        // A copy: the caller must not see later enqueues, nor be able to change the queue.
        self.lock().items.get(key).cloned()
    }

    /// The newest payload of every queued key, in queue order (client-go: map order).
    fn list(&self) -> Vec<DeltaObject<T>> {
        let st = self.lock();
        st.queue
            .iter()
            .filter_map(|key| st.items.get(key).and_then(Deltas::newest))
            .map(|newest| newest.object.clone())
            .collect()
    }

    /// Every queued key, in queue order (client-go: map order).
    fn list_keys(&self) -> Vec<Key> {
        self.lock().queue.iter().cloned().collect()
    }

    fn len(&self) -> usize {
        self.lock().queue.len()
    }

    fn queued_deltas(&self) -> usize {
        self.lock().queued_deltas
    }

    fn has_room(&self) -> bool {
        self.lock().has_room(self.max_queued)
    }

    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.lock();
        if st.has_room(self.max_queued) {
            return Poll::Ready(());
        }
        // Registered under the lock that pops take to make room, so no wake-up can fall
        // between the check above and the registration. One entry per task.
        if !st.room_wakers.iter().any(|w| w.will_wake(cx.waker())) {
            st.room_wakers.push(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl<T> fmt::Debug for DeltaFifo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("DeltaFifo");
        d.field("known_objects", &self.known_objects.is_some())
            .field("emit_replaced", &self.emit_replaced)
            .field("transformer", &self.transformer.is_some());
        // try_lock: formatting from inside `process` (which runs under the lock) must not
        // deadlock.
        match self.state.try_lock() {
            Ok(st) => fmt_state(&mut d, &st),
            Err(std::sync::TryLockError::Poisoned(p)) => fmt_state(&mut d, &p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => {
                d.field("state", &"<locked>");
            }
        }
        d.finish()
    }
}

/// Counts only: objects can be large and need not be `Debug`.
fn fmt_state<T>(d: &mut fmt::DebugStruct<'_, '_>, st: &State<T>) {
    d.field("queued_keys", &st.queue.len())
        .field("queued_deltas", &st.queued_deltas)
        .field("populated", &st.populated)
        .field("initial_population_count", &st.initial_population_count)
        .field("closed", &st.closed)
        .field("waiting_producers", &st.waiting_producers);
}

#[cfg(all(test, not(kcache_loom)))]
mod tests {
    use std::thread;

    use super::*;
    use crate::reference::test_support::{
        blocks_until_woken, key_fn, key_texts, known, obj, Known, Obj,
    };

    /// Adds 100 to `v`, so a transformed object is recognisable; refuses `v == 666`.
    fn plus_100() -> TransformFn<Obj> {
        Arc::new(|o: Arc<Obj>| {
            if o.v == 666 {
                Err(TransformError("refused".into()))
            } else {
                Ok(obj(o.key, o.v + 100))
            }
        })
    }

    fn opts() -> QueueOptions<Obj> {
        QueueOptions::new(key_fn())
    }

    fn queue() -> DeltaFifo<Obj> {
        DeltaFifo::new(opts())
    }

    fn queue_knowing(known: Arc<Known>) -> DeltaFifo<Obj> {
        DeltaFifo::new(opts().known_objects(known))
    }

    /// One delta as text: `Added(1)`, `Deleted(tomb 2)`, `Deleted(tomb -)`.
    fn show(delta: &Delta<Obj>) -> String {
        match &delta.object {
            DeltaObject::Object(o) => format!("{}({})", delta.kind, o.v),
            DeltaObject::Tombstone(t) => match &t.last_known {
                Some(o) => format!("{}(tomb {})", delta.kind, o.v),
                None => format!("{}(tomb -)", delta.kind),
            },
        }
    }

    fn shown(deltas: &Deltas<Obj>) -> Vec<String> {
        deltas.iter().map(show).collect()
    }

    /// The queued deltas of `key`, as text (empty if not queued).
    fn queued(q: &DeltaFifo<Obj>, key: &str) -> Vec<String> {
        q.get_by_key(&Key::new(key))
            .map(|d| shown(&d))
            .unwrap_or_default()
    }

    fn keys(q: &DeltaFifo<Obj>) -> Vec<String> {
        key_texts(&q.list_keys())
    }

    /// Pops one key: (key, is_in_initial_list, deltas as text).
    fn pop1(q: &DeltaFifo<Obj>) -> (String, bool, Vec<String>) {
        match q.try_pop(|d, initial| (d.key().to_string(), initial, shown(&d))) {
            TryPop::Popped(p) => p,
            other => panic!("expected a pop, got {other:?}"),
        }
    }

    // ---- add / update -------------------------------------------------------------------

    #[test]
    fn add_and_update_append_added_and_updated_in_order() {
        let q = queue();
        q.add(obj("a", 1)).unwrap();
        q.update(obj("a", 2)).unwrap();
        assert_eq!(queued(&q, "a"), ["Added(1)", "Updated(2)"]);
    }

    #[test]
    fn add_marks_populated_so_queue_without_replace_is_synced() {
        let q = queue();
        assert!(!q.has_synced());
        q.add(obj("a", 1)).unwrap();
        assert!(q.has_synced());
        assert!(q.wait_synced(Some(Duration::ZERO)));
    }

    #[test]
    fn new_key_goes_to_the_back_and_is_queued_once() {
        let q = queue();
        q.add(obj("a", 1)).unwrap();
        q.add(obj("b", 1)).unwrap();
        q.update(obj("a", 2)).unwrap();
        assert_eq!(keys(&q), ["a", "b"]);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn seed_004_example_pops_pod1_with_added_updated_deleted_first() {
        let q = queue();
        q.add(obj("pod1", 1)).unwrap();
        q.add(obj("pod2", 2)).unwrap();
        q.add(obj("pod3", 3)).unwrap();
        q.update(obj("pod1", 11)).unwrap();
        q.delete(obj("pod1", 11)).unwrap();
        let expect = [
            ("pod1", vec!["Added(1)", "Updated(11)", "Deleted(11)"]),
            ("pod2", vec!["Added(2)"]),
            ("pod3", vec!["Added(3)"]),
        ];
        for (key, deltas) in expect {
            let (k, initial, d) = pop1(&q);
            assert_eq!(
                (k.as_str(), initial, d),
                (key, false, deltas.iter().map(|s| s.to_string()).collect())
            );
        }
        assert_eq!(q.try_pop(|_, _| ()), TryPop::Empty);
    }

    // ---- delete -------------------------------------------------------------------------

    #[test]
    fn delete_of_unknown_key_without_known_objects_is_ignored() {
        let q = queue();
        q.delete(obj("a", 1)).unwrap();
        assert!(q.is_empty());
        // Ignored, but it still counts as populating the queue (client-go sets it first).
        assert!(q.has_synced());
    }

    #[test]
    fn delete_of_queued_key_without_known_objects_is_queued() {
        let q = queue();
        q.add(obj("a", 1)).unwrap();
        q.delete(obj("a", 2)).unwrap();
        assert_eq!(queued(&q, "a"), ["Added(1)", "Deleted(2)"]);
    }

    #[test]
    fn delete_of_key_neither_known_nor_queued_is_ignored() {
        let q = queue_knowing(known(&[obj("b", 1)]));
        q.delete(obj("a", 1)).unwrap();
        assert!(q.is_empty());
        assert!(q.has_synced());
    }

    #[test]
    fn delete_of_known_key_not_queued_is_queued() {
        let q = queue_knowing(known(&[obj("a", 1)]));
        q.delete(obj("a", 2)).unwrap();
        assert_eq!(queued(&q, "a"), ["Deleted(2)"]);
    }

    #[test]
    fn delete_of_queued_key_not_known_is_queued() {
        let q = queue_knowing(known(&[]));
        q.add(obj("a", 1)).unwrap();
        q.delete(obj("a", 1)).unwrap();
        assert_eq!(queued(&q, "a"), ["Added(1)", "Deleted(1)"]);
    }

    #[test]
    fn delete_tombstone_is_keyed_by_the_tombstone_key() {
        let q = queue_knowing(known(&[obj("a", 1)]));
        q.delete_tombstone(Tombstone {
            key: Key::new("a"),
            last_known: None,
        })
        .unwrap();
        assert_eq!(queued(&q, "a"), ["Deleted(tomb -)"]);
        // Without known objects and not queued, a tombstone is ignored like any delete.
        let q = queue();
        q.delete_tombstone(Tombstone {
            key: Key::new("a"),
            last_known: Some(obj("a", 1)),
        })
        .unwrap();
        assert!(q.is_empty());
    }

    #[test]
    fn two_deletes_keep_the_older() {
        let q = queue_knowing(known(&[obj("a", 1)]));
        q.delete(obj("a", 1)).unwrap();
        q.delete(obj("a", 2)).unwrap();
        assert_eq!(queued(&q, "a"), ["Deleted(1)"]);
    }

    #[test]
    fn tombstone_then_delete_keeps_the_newer() {
        let q = queue_knowing(known(&[obj("a", 1)]));
        q.delete_tombstone(Tombstone {
            key: Key::new("a"),
            last_known: Some(obj("a", 1)),
        })
        .unwrap();
        q.delete(obj("a", 2)).unwrap();
        assert_eq!(queued(&q, "a"), ["Deleted(2)"]);
    }

    // ---- transformer --------------------------------------------------------------------

    #[test]
    fn transformer_applies_to_add_update_and_delete() {
        let q = DeltaFifo::new(opts().transformer(plus_100()));
        q.add(obj("a", 1)).unwrap();
        q.update(obj("a", 2)).unwrap();
        q.delete(obj("a", 3)).unwrap();
        assert_eq!(
            queued(&q, "a"),
            ["Added(101)", "Updated(102)", "Deleted(103)"]
        );
    }

    #[test]
    fn transformer_skips_tombstones_and_sync() {
        let store = known(&[obj("a", 1), obj("b", 2)]);
        let q = DeltaFifo::new(opts().known_objects(store).transformer(plus_100()));
        q.delete_tombstone(Tombstone {
            key: Key::new("a"),
            last_known: Some(obj("a", 1)),
        })
        .unwrap();
        q.resync().unwrap();
        assert_eq!(queued(&q, "a"), ["Deleted(tomb 1)"]);
        assert_eq!(queued(&q, "b"), ["Sync(2)"]);
    }

    #[test]
    fn transformer_applies_to_replace_without_emit_replaced() {
        let q = DeltaFifo::new(opts().transformer(plus_100()));
        q.replace(vec![obj("a", 1)], "1").unwrap();
        assert_eq!(queued(&q, "a"), ["Sync(101)"]);
        let q = DeltaFifo::new(opts().transformer(plus_100()).emit_replaced(true));
        q.replace(vec![obj("a", 1)], "1").unwrap();
        assert_eq!(queued(&q, "a"), ["Replaced(101)"]);
    }

    #[test]
    fn transform_error_changes_nothing() {
        let store = known(&[obj("k", 1)]);
        let q = DeltaFifo::new(opts().known_objects(store).transformer(plus_100()));
        let refused = |r: Result<(), QueueError>| {
            assert_eq!(
                r,
                Err(QueueError::Transform(TransformError("refused".into())))
            );
        };
        refused(q.add(obj("a", 666)));
        refused(q.update(obj("a", 666)));
        refused(q.delete(obj("k", 666)));
        refused(q.replace(vec![obj("b", 1), obj("a", 666)], "1"));
        assert!(q.is_empty());
        assert!(
            !q.has_synced(),
            "a refused operation must not mark the queue populated"
        );

        q.add(obj("c", 1)).unwrap();
        refused(q.replace(vec![obj("a", 666)], "2"));
        assert_eq!(keys(&q), ["c"]);
        assert_eq!(queued(&q, "c"), ["Added(101)"], "no tombstone for c");
    }

    // ---- key errors ---------------------------------------------------------------------

    #[test]
    fn key_error_changes_nothing() {
        let q = queue_knowing(known(&[obj("k", 1)]));
        let bad = || obj("", 1);
        assert!(matches!(q.add(bad()), Err(QueueError::Key(_))));
        assert!(matches!(q.update(bad()), Err(QueueError::Key(_))));
        assert!(matches!(q.delete(bad()), Err(QueueError::Key(_))));
        assert!(matches!(
            q.replace(vec![obj("b", 1), bad()], "1"),
            Err(QueueError::Key(_))
        ));
        assert!(q.is_empty());
        assert!(
            !q.has_synced(),
            "a refused operation must not mark the queue populated"
        );

        q.add(obj("c", 1)).unwrap();
        assert!(q.replace(vec![obj("b", 1), bad()], "2").is_err());
        assert_eq!(keys(&q), ["c"]);
        assert_eq!(
            queued(&q, "c"),
            ["Added(1)"],
            "no tombstone for c, no Sync for b"
        );
        assert!(q.get(&bad()).is_err());
    }

    #[test]
    fn key_error_in_resync_changes_nothing() {
        // The store holds an object whose own key cannot be computed; resync keys every object
        // again (client-go's KeyOf), fails, and must not have queued the good one first.
        let q = queue_knowing(known(&[obj("a", 1)]));
        let bad_store = known(&[obj("a", 1)]);
        bad_store
            .objects
            .lock()
            .unwrap()
            .insert(Key::new("z"), obj("", 2));
        let q2 = queue_knowing(bad_store);
        assert!(matches!(q2.resync(), Err(QueueError::Key(_))));
        assert!(q2.is_empty());
        q.resync().unwrap();
        assert_eq!(queued(&q, "a"), ["Sync(1)"]);
    }

    // ---- replace ------------------------------------------------------------------------

    #[test]
    fn replace_emits_sync_unless_emit_replaced() {
        let q = queue();
        q.replace(vec![obj("a", 1)], "1").unwrap();
        assert_eq!(queued(&q, "a"), ["Sync(1)"]);
        let q = DeltaFifo::new(opts().emit_replaced(true));
        q.replace(vec![obj("a", 1)], "1").unwrap();
        assert_eq!(queued(&q, "a"), ["Replaced(1)"]);
    }

    #[test]
    fn replace_tombstones_queued_items_with_newest_object() {
        let q = queue();
        q.add(obj("a", 1)).unwrap();
        q.update(obj("a", 2)).unwrap();
        q.replace(vec![obj("b", 1)], "1").unwrap();
        assert_eq!(
            queued(&q, "a"),
            ["Added(1)", "Updated(2)", "Deleted(tomb 2)"]
        );
        assert_eq!(queued(&q, "b"), ["Sync(1)"]);
        assert_eq!(keys(&q), ["a", "b"]);
    }

    #[test]
    fn replace_unwraps_tombstone_last_known() {
        // The store says v=9, the queued tombstone says v=3: the new tombstone must carry the
        // queued tombstone's object (not the tombstone itself, not the store's object).
        let q = queue_knowing(known(&[obj("a", 9)]));
        q.add(obj("a", 1)).unwrap();
        q.delete_tombstone(Tombstone {
            key: Key::new("a"),
            last_known: Some(obj("a", 3)),
        })
        .unwrap();
        q.replace(vec![], "1").unwrap();
        let deltas = q.get_by_key(&Key::new("a")).unwrap();
        assert_eq!(shown(&deltas), ["Added(1)", "Deleted(tomb 3)"]);
        let t = deltas.newest().unwrap().object.tombstone().unwrap();
        assert_eq!(t.key.as_str(), "a");
        assert_eq!(t.last_known.as_deref(), Some(&Obj { key: "a", v: 3 }));
    }

    #[test]
    fn replace_tombstones_known_keys_not_queued() {
        let q = queue_knowing(known(&[obj("c", 3), obj("a", 1), obj("b", 2)]));
        q.replace(vec![obj("b", 5)], "1").unwrap();
        // Listed keys first, then the known keys' tombstones in sorted order.
        assert_eq!(keys(&q), ["b", "a", "c"]);
        assert_eq!(queued(&q, "a"), ["Deleted(tomb 1)"]);
        assert_eq!(queued(&q, "b"), ["Sync(5)"]);
        assert_eq!(queued(&q, "c"), ["Deleted(tomb 3)"]);
    }

    #[test]
    fn replace_tombstone_of_vanished_known_key_has_no_object() {
        let store = Known {
            ghosts: vec![Key::new("g")],
            ..Known::default()
        };
        let q = queue_knowing(Arc::new(store));
        q.replace(vec![], "1").unwrap();
        assert_eq!(queued(&q, "g"), ["Deleted(tomb -)"]);
    }

    #[test]
    fn replace_known_key_with_queued_deltas_gets_no_second_tombstone() {
        let q = queue_knowing(known(&[obj("a", 9)]));
        q.add(obj("a", 2)).unwrap();
        q.replace(vec![], "1").unwrap();
        assert_eq!(queued(&q, "a"), ["Added(2)", "Deleted(tomb 2)"]);
    }

    #[test]
    fn replace_sets_initial_count_only_once() {
        let q = queue();
        q.replace(vec![obj("a", 1), obj("b", 1)], "1").unwrap();
        assert!(pop1(&q).1);
        assert!(!q.has_synced());
        q.replace(vec![obj("b", 2), obj("c", 1), obj("d", 1)], "2")
            .unwrap();
        assert_eq!(
            pop1(&q),
            ("b".into(), true, vec!["Sync(1)".into(), "Sync(2)".into()])
        );
        assert!(
            q.has_synced(),
            "the second replace must not raise the count"
        );
        assert!(!pop1(&q).1);
    }

    #[test]
    fn replace_initial_count_includes_tombstones() {
        let q = queue_knowing(known(&[obj("x", 1), obj("y", 1)]));
        q.replace(vec![obj("a", 1)], "1").unwrap();
        for _ in 0..2 {
            assert!(pop1(&q).1);
            assert!(!q.has_synced());
        }
        assert!(pop1(&q).1);
        assert!(q.has_synced());
    }

    #[test]
    fn replace_initial_count_counts_distinct_keys() {
        let q = queue();
        q.replace(vec![obj("a", 1), obj("a", 2)], "1").unwrap();
        assert_eq!(queued(&q, "a"), ["Sync(1)", "Sync(2)"]);
        assert!(pop1(&q).1);
        assert!(q.has_synced());
    }

    #[test]
    fn replace_of_empty_list_syncs_at_once() {
        let q = queue();
        q.replace(vec![], "1").unwrap();
        assert!(q.has_synced());
        assert!(q.wait_synced(Some(Duration::ZERO)));
    }

    #[test]
    fn is_in_initial_list_is_computed_before_decrement() {
        let q = queue();
        q.replace(vec![obj("a", 1)], "1").unwrap();
        assert!(!q.has_synced());
        // The last key of the initial list is still "in the initial list" ...
        assert!(pop1(&q).1);
        // ... and popping it is what syncs the queue.
        assert!(q.has_synced());
        q.add(obj("b", 1)).unwrap();
        assert!(!pop1(&q).1);
    }

    // ---- resync -------------------------------------------------------------------------

    #[test]
    fn resync_without_known_objects_does_nothing() {
        let q = queue();
        q.resync().unwrap();
        assert!(q.is_empty());
    }

    #[test]
    fn resync_skips_queued_keys() {
        let q = queue_knowing(known(&[obj("b", 2), obj("a", 1)]));
        q.add(obj("a", 5)).unwrap();
        q.resync().unwrap();
        assert_eq!(queued(&q, "a"), ["Added(5)"]);
        assert_eq!(queued(&q, "b"), ["Sync(2)"]);
        assert_eq!(keys(&q), ["a", "b"]);
    }

    #[test]
    fn resync_queues_known_keys_in_sorted_order() {
        let q = queue_knowing(known(&[obj("c", 1), obj("a", 1), obj("b", 1)]));
        q.resync().unwrap();
        assert_eq!(keys(&q), ["a", "b", "c"]);
    }

    #[test]
    fn resync_skips_keys_gone_from_the_store() {
        let store = Known {
            ghosts: vec![Key::new("g")],
            ..Known::default()
        };
        let q = queue_knowing(Arc::new(store));
        q.resync().unwrap();
        assert!(q.is_empty());
    }

    #[test]
    fn resync_does_not_mark_populated() {
        let q = queue_knowing(known(&[obj("a", 1)]));
        q.resync().unwrap();
        assert_eq!(q.len(), 1);
        assert!(!q.has_synced());
    }

    // ---- add_if_not_present -------------------------------------------------------------

    #[test]
    fn add_if_not_present_skips_queued_key() {
        let q = queue();
        q.add(obj("a", 1)).unwrap();
        let popped = q.pop(|d, _| d).unwrap();
        q.add(obj("a", 2)).unwrap();
        q.add_if_not_present(popped).unwrap();
        assert_eq!(queued(&q, "a"), ["Added(2)"]);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn add_if_not_present_requeues_deltas_as_they_are_at_the_back() {
        let q = queue();
        q.add(obj("a", 1)).unwrap();
        q.update(obj("a", 2)).unwrap();
        q.add(obj("b", 1)).unwrap();
        let popped = q.pop(|d, _| d).unwrap();
        q.add_if_not_present(popped).unwrap();
        assert_eq!(keys(&q), ["b", "a"]);
        assert_eq!(queued(&q, "a"), ["Added(1)", "Updated(2)"]);
    }

    #[test]
    fn add_if_not_present_marks_populated() {
        let q = queue();
        let mut deltas = Deltas::new(Key::new("a"));
        deltas.push(Delta::new(DeltaType::Added, obj("a", 1)));
        q.add_if_not_present(deltas).unwrap();
        assert!(q.has_synced());
    }

    #[test]
    fn add_if_not_present_rejects_empty_deltas() {
        let q = queue();
        assert_eq!(
            q.add_if_not_present(Deltas::new(Key::new("a"))),
            Err(QueueError::EmptyDeltas)
        );
        assert!(q.is_empty());
        assert!(!q.has_synced());
    }

    // ---- pop, close, sync ---------------------------------------------------------------

    #[test]
    fn close_keeps_items_poppable() {
        let q = queue();
        q.add(obj("a", 1)).unwrap();
        q.close();
        assert!(q.is_closed());
        assert_eq!(pop1(&q).0, "a");
        assert_eq!(q.pop(|_, _| ()), Err(Closed));
    }

    #[test]
    fn pop_on_closed_empty_queue_returns_closed() {
        let q = queue();
        assert_eq!(q.try_pop(|_, _| ()), TryPop::Empty);
        q.close();
        assert_eq!(q.pop(|_, _| ()), Err(Closed));
        assert_eq!(q.try_pop(|_, _| ()), TryPop::Closed);
        assert_eq!(q.pop_batch(4, |_, _| ()), Err(Closed));
    }

    #[test]
    fn pop_blocks_until_add() {
        let q = Arc::new(queue());
        let popper = Arc::clone(&q);
        let popped = blocks_until_woken(
            move || popper.pop(|d, _| shown(&d)),
            || q.waiting_pops(),
            || q.add(obj("a", 1)).unwrap(),
        );
        assert_eq!(popped, Ok(vec!["Added(1)".to_string()]));
    }

    #[test]
    fn close_wakes_a_blocked_pop() {
        let q = Arc::new(queue());
        let popper = Arc::clone(&q);
        let popped = blocks_until_woken(
            move || popper.pop(|_, _| ()),
            || q.waiting_pops(),
            || q.close(),
        );
        assert_eq!(popped, Err(Closed));
    }

    #[test]
    fn pop_runs_process_under_the_lock() {
        let q = queue();
        q.add(obj("a", 1)).unwrap();
        let locked = q.pop(|_, _| q.state.try_lock().is_err()).unwrap();
        assert!(
            locked,
            "client-go calls process while holding the queue's lock"
        );
        // Debug must not deadlock when called from inside process.
        q.add(obj("a", 1)).unwrap();
        let text = q.pop(|_, _| format!("{q:?}")).unwrap();
        assert!(text.contains("<locked>"));
    }

    #[test]
    fn pop_batch_pops_up_to_max_keys_in_order() {
        let q = queue();
        for key in ["a", "b", "c"] {
            q.add(obj(key, 1)).unwrap();
        }
        let mut seen = Vec::new();
        assert_eq!(q.pop_batch(2, |d, _| seen.push(d.key().to_string())), Ok(2));
        assert_eq!(seen, ["a", "b"]);
        assert_eq!(q.pop_batch(0, |d, _| seen.push(d.key().to_string())), Ok(1));
        assert_eq!(seen, ["a", "b", "c"]);
    }

    #[test]
    fn pop_batch_computes_initial_flag_per_key() {
        let q = queue();
        q.replace(vec![obj("a", 1), obj("b", 1)], "1").unwrap();
        q.add(obj("c", 1)).unwrap();
        let mut flags = Vec::new();
        assert_eq!(q.pop_batch(10, |_, initial| flags.push(initial)), Ok(3));
        assert_eq!(flags, [true, true, false]);
        assert!(q.has_synced());
    }

    #[test]
    fn wait_synced_wakes_when_synced() {
        let q = Arc::new(queue());
        q.replace(vec![obj("a", 1)], "1").unwrap();
        assert!(!q.wait_synced(Some(Duration::from_millis(5))));
        let waiter = {
            let q = Arc::clone(&q);
            thread::spawn(move || q.wait_synced(None))
        };
        pop1(&q);
        assert!(waiter.join().unwrap());
    }

    // ---- reads --------------------------------------------------------------------------

    #[test]
    fn get_returns_a_copy_of_queued_deltas() {
        let q = queue();
        q.add(obj("a", 1)).unwrap();
        let got = q.get(&Obj { key: "a", v: 0 }).unwrap().unwrap();
        q.update(obj("a", 2)).unwrap();
        assert_eq!(
            shown(&got),
            ["Added(1)"],
            "a copy does not see later enqueues"
        );
        assert!(q.get(&Obj { key: "b", v: 0 }).unwrap().is_none());
    }

    #[test]
    fn list_gives_newest_payload_per_key_in_queue_order() {
        let q = queue_knowing(known(&[obj("b", 7)]));
        q.add(obj("a", 1)).unwrap();
        q.update(obj("a", 2)).unwrap();
        q.delete_tombstone(Tombstone {
            key: Key::new("b"),
            last_known: Some(obj("b", 7)),
        })
        .unwrap();
        let list: Vec<(bool, u32)> = q
            .list()
            .iter()
            .map(|p| (p.is_tombstone(), p.last_known().unwrap().v))
            .collect();
        assert_eq!(list, [(false, 2), (true, 7)]);
        assert_eq!(keys(&q), ["a", "b"]);
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn debug_prints_counts_not_objects() {
        let q = queue();
        q.add(obj("secret", 1)).unwrap();
        let text = format!("{q:?}");
        assert!(text.contains("queued_keys: 1"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
}
