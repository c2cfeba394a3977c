//! Asking the CPU for memory the queue will read a little later.
//!
//! In a large cache almost everything one key's turn reads has left the CPU caches, and most of
//! it is found through something read just before: a consumer's key has its bucket in the
//! shard's map of pending keys, its new object (made or decoded a while before it is popped),
//! and in the consumer's store the items-map bucket, the key's slot and the object it replaces.
//! Read in turn, these misses follow one another, key after key: at a million keys they are
//! most of a key's cost. Wherever the next keys are known in advance, the queue asks for what
//! key `i + d` will need while key `i` is worked on, so the misses overlap the work instead:
//!
//! - taking a batch, the pending bucket of the key [`PENDING_AHEAD`] places further in the FIFO
//!   ([`bucket`]), and each taken key's newest object, which the in-flight record counts;
//! - applying it, through [`KnownObjects::prefetch`] (the store says where its memory is), the
//!   store's table lines [`TABLE_AHEAD`] keys ahead, the key's entry [`ENTRY_AHEAD`] ahead and
//!   the stored object [`AHEAD`] ahead, when the queue has known objects; and the new objects
//!   [`AHEAD`] ahead ([`objects`]);
//! - producing, the key's own pending bucket before the shard lock is taken, from a
//!   [`TableHint`] of where the shard's table is (the lock's line usually comes from the
//!   consumer's core, and the bucket's miss overlaps that transfer);
//! - in `replace` and `resync`, the listed objects [`LIST_AHEAD`] ahead of the key function,
//!   and the pending buckets [`PENDING_AHEAD`] keys ahead of the pushes; in `replace`, also
//!   the newest delta of a key whose list spilled to the heap, [`DELTAS_AHEAD`] keys ahead
//!   (found through that bucket).
//!
//! (The sharded indexer's own walk for `resync`, `visit_objects`, asks ahead for its slots and
//! objects in the same way.)
//!
//! Each step of one key reads what the previous step fetched, so the steps run some keys
//! apart. A hint only: nothing waits for a prefetch, a wrong address costs nothing but the
//! hint, and no order, count or content of anything changes.
//!
//! What they gain (`loadgen run --engine sharded`, a build with them against one without,
//! medians; the runs are in results/BENCHMARKS.md §14): the consumer's steps about 1.35× on
//! W2 (1M keys) and 1.4× on W1 at 4M keys, and 1.7× on W1's capacity (paced, a consumer meets
//! batches too once the rate is high); the producer's about 1.15× on W1 at 100k keys (where the
//! producer is the bottleneck); the relist steps about 6% on W3.
//!
//! # A build without them
//!
//! `RUSTFLAGS="--cfg kcache_no_prefetch"` builds the same engine with every hint of this
//! module turned into a no-op ([`ENABLED`] is false): no prefetch instruction, no table hint
//! recorded, and the queue asks the known store for no step (so the store takes none of the
//! shard read locks a step tries). Comparing the two builds measures what the prefetching
//! gains on the machine at hand (`docs/sharded.md`, "Batching").
//!
//! # hashbrown's raw API
//!
//! A bucket's address comes from hashbrown 0.14's `raw` API (`RawTable::data_end` and
//! `buckets`: the control bytes start at `data_end`, the entries are laid out downwards from
//! it), which hashbrown 0.15 removed. The workspace pins hashbrown to the exact 0.14 release
//! dashmap 6 is built on; the reasons are next to that dependency line in the root
//! `Cargo.toml`, and a test below checks the computed address against the table's own.

use std::mem::size_of;
// std's atomics, not crate::sync's: the table hint is outside the engine's synchronisation.
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use hashbrown::raw::RawTable;
use smallvec::SmallVec;

use crate::delta::{Delta, DeltaObject, Deltas};
use crate::store::{KnownObjects, PrefetchStep};

/// Whether the hints are asked for at all: false in a build with `--cfg kcache_no_prefetch`,
/// which makes every function of this module that asks for memory (or records where a table
/// is) return at once, so that the gain of prefetching can be measured against the same code
/// without it. A constant: the disabled paths compile away.
pub(super) const ENABLED: bool = !cfg!(kcache_no_prefetch);

/// How many keys ahead of the one being applied its new objects and the object it replaces
/// are asked for: far enough that a memory access (~100 ns) completes while the keys in
/// between are applied (a few hundred ns each), near enough that the lines are still cached
/// when their turn comes.
pub(super) const AHEAD: usize = 3;

/// How many keys ahead the known store is asked for a key's entry: before [`AHEAD`], since the
/// object is found through the entry.
pub(super) const ENTRY_AHEAD: usize = 6;

/// How many keys ahead the known store is asked for a key's table lines: before
/// [`ENTRY_AHEAD`], since the entry is found through them.
pub(super) const TABLE_AHEAD: usize = 10;

/// How many keys ahead in a shard's FIFO a consumer taking a batch asks for the key's bucket in
/// the map of pending keys. Taking a key costs less than applying one, so this runs further
/// ahead.
pub(super) const PENDING_AHEAD: usize = 8;

/// How many keys ahead `replace` asks for the newest delta of a listed key's spilled list:
/// nearer than [`PENDING_AHEAD`], since the list is found through the key's bucket.
pub(super) const DELTAS_AHEAD: usize = 4;

/// How many objects ahead of the one being keyed `replace` asks for a listed object.
pub(super) const LIST_AHEAD: usize = 8;

/// The known store's steps and how many keys ahead each is asked for, the farthest-reaching
/// first (each reads what the one before fetched).
const STORE_STEPS: [(usize, PrefetchStep); 3] = [
    (TABLE_AHEAD, PrefetchStep::Table),
    (ENTRY_AHEAD, PrefetchStep::Entry),
    (AHEAD, PrefetchStep::Object),
];

/// How many store steps [`batch_start`] asks for at most: each step for the keys up to its
/// distance, the first key excepted.
const START_STEPS: usize = TABLE_AHEAD + ENTRY_AHEAD + AHEAD - STORE_STEPS.len();

/// Starts the pipeline for a batch about to be applied: every step for its first keys, the
/// farthest-reaching first.
pub(super) fn batch_start<P, T>(
    batch: &[P],
    known: Option<&dyn KnownObjects<T>>,
    deltas: impl Fn(&P) -> &Deltas<T>,
) {
    if !ENABLED {
        return;
    }
    if let Some(known) = known {
        // Not for the first key: it is applied right away, so asking would only add the
        // steps' own cost (a lone `pop` would pay it on every key).
        let mut steps: SmallVec<[_; START_STEPS]> = SmallVec::new();
        for (ahead, step) in STORE_STEPS {
            for popped in batch.iter().take(ahead).skip(1) {
                steps.push((deltas(popped).key(), step));
            }
        }
        if !steps.is_empty() {
            known.prefetch_steps(&steps);
        }
    }
    for popped in batch.iter().take(AHEAD) {
        objects(deltas(popped));
    }
}

/// Advances the pipeline by one key: `rest` is what follows the key about to be applied.
pub(super) fn batch_next<P, T>(
    rest: &[P],
    known: Option<&dyn KnownObjects<T>>,
    deltas: impl Fn(&P) -> &Deltas<T>,
) {
    if !ENABLED {
        return;
    }
    if let Some(known) = known {
        // One call for the steps of three different keys: the store's setup is paid once.
        let steps: SmallVec<[_; STORE_STEPS.len()]> = STORE_STEPS
            .iter()
            .filter_map(|&(ahead, step)| Some((deltas(rest.get(ahead - 1)?).key(), step)))
            .collect();
        if !steps.is_empty() {
            known.prefetch_steps(&steps);
        }
    }
    if let Some(ahead) = rest.get(AHEAD - 1) {
        objects(deltas(ahead));
    }
}

/// Prefetches the objects of `deltas`' newest two deltas (what a consumer reads first: the
/// object it stores and, coalescing, the one before).
pub(super) fn objects<T>(deltas: &Deltas<T>) {
    if !ENABLED {
        return;
    }
    for delta in deltas.iter().rev().take(2) {
        if let DeltaObject::Object(obj) = &delta.object {
            value(Arc::as_ptr(obj));
        }
    }
}

/// Prefetches the object of the newest of `deltas`, the one a queue records as in flight.
pub(super) fn newest_object<T>(deltas: &[Delta<T>]) {
    if !ENABLED {
        return;
    }
    if let Some(DeltaObject::Object(obj)) = deltas.last().map(|delta| &delta.object) {
        value(Arc::as_ptr(obj));
    }
}

/// Asks for the control bytes and the entry of the bucket where a key hashed to `hash` starts
/// its probe in `table`: where it most likely sits (a key is moved on from its first bucket
/// only when that is taken, and then mostly to the next ones, on the same lines).
pub(super) fn bucket<E>(table: &RawTable<E>, hash: u64) {
    if !ENABLED {
        return;
    }
    let (control, entry) = first_bucket(table, hash);
    line(control);
    value(entry);
}

/// The addresses of the control byte and the entry of the bucket where `hash` starts its
/// probe in `table`.
fn first_bucket<E>(table: &RawTable<E>, hash: u64) -> (*const u8, *const E) {
    bucket_at(
        table.data_end().as_ptr().cast_const(),
        table.buckets() - 1,
        hash,
    )
}

/// The addresses of the control byte and the entry of the bucket where `hash` starts its
/// probe in a table whose `data_end` is `end` and whose bucket mask is `mask`. Computed only,
/// never read: hashbrown probes from bucket `hash & mask`, its control bytes start at
/// `data_end` and its entries are laid out downwards from there.
fn bucket_at<E>(end: *const E, mask: usize, hash: u64) -> (*const u8, *const E) {
    let pos = hash as usize & mask;
    // wrapping_*: addresses only; an empty table's singleton control bytes, or a table that
    // has moved since `end` was read, give addresses that are never used for more than a hint.
    (
        end.cast::<u8>().wrapping_add(pos),
        end.wrapping_sub(pos + 1),
    )
}

/// Where one shard's table is, so that a key's bucket can be asked for without the shard's
/// lock. Two users:
///
/// - the queue's pending keys: a producer asks before it takes the shard lock (the lock's
///   cache line usually comes from the consumer's core, and the bucket's miss then overlaps
///   that transfer instead of following it). Recorded by producers under the shard lock after
///   each push (so a table that `complete`, `replace` or giving room back moved is recorded
///   again at the shard's next push);
/// - the sharded indexer's items shards: the consumer's first prefetch step, which would
///   otherwise take and release the shard's read lock (two read-modify-writes) for a hint.
///   Recorded by writers after each insert of a new key, under the shard's write lock.
///
/// Read without the lock. Both fields are std atomics read and written `Relaxed`,
/// outside the engine's synchronisation (loom does not model them): a stale or torn pair
/// (the new address with the old mask) only gives an address that is not the bucket, and a
/// prefetch of any address is harmless. Nothing is ever read through it.
#[derive(Debug)]
pub(super) struct TableHint {
    end: AtomicPtr<u8>,
    mask: AtomicUsize,
}

impl Default for TableHint {
    fn default() -> Self {
        Self {
            end: AtomicPtr::new(std::ptr::null_mut()),
            mask: AtomicUsize::new(0),
        }
    }
}

impl TableHint {
    /// Records where `table` is now, if it has moved. Call it holding the table's lock.
    pub(super) fn publish<E>(&self, table: &RawTable<E>) {
        if ENABLED && !self.records(table) {
            let (end, mask) = location(table);
            self.mask.store(mask, Relaxed);
            self.end.store(end, Relaxed);
        }
    }

    /// Whether the recorded table is `table` (its address and bucket mask).
    pub(super) fn records<E>(&self, table: &RawTable<E>) -> bool {
        let (end, mask) = location(table);
        self.end.load(Relaxed) == end && self.mask.load(Relaxed) == mask
    }

    /// Asks for the bucket where a key hashed to `hash` starts its probe in the recorded table
    /// of entries of type `E` (nothing before a table was first recorded).
    pub(super) fn bucket<E>(&self, hash: u64) {
        if !ENABLED {
            return;
        }
        let end = self.end.load(Relaxed).cast_const().cast::<E>();
        if !end.is_null() {
            let (control, entry) = bucket_at(end, self.mask.load(Relaxed), hash);
            line(control);
            value(entry);
        }
    }
}

/// Where `table` is, as a [`TableHint`] records it: its `data_end` and its bucket mask.
fn location<E>(table: &RawTable<E>) -> (*mut u8, usize) {
    (table.data_end().as_ptr().cast::<u8>(), table.buckets() - 1)
}

/// Asks for the cache lines of the first and last byte of the `T` at `ptr` (all of it for
/// values of up to 64 bytes, the head and tail of larger ones). `ptr` is never dereferenced.
pub(super) fn value<T>(ptr: *const T) {
    if !ENABLED {
        return;
    }
    let start = ptr.cast::<u8>();
    line(start);
    if size_of::<T>() > 1 {
        line(start.wrapping_add(size_of::<T>() - 1));
    }
}

/// Asks for the cache line holding `addr`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[allow(unsafe_code, unused_unsafe)]
fn line(addr: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    if !ENABLED {
        return;
    }
    // Safety: PREFETCHT0 is a hint: it never faults, whatever the address, and changes neither
    // memory nor program state. It is an SSE instruction, part of the x86_64 baseline, so
    // every x86_64 CPU has it. (`unused_unsafe`: newer compilers call it safe.)
    unsafe { _mm_prefetch::<_MM_HINT_T0>(addr.cast::<i8>()) }
}

/// Other architectures: no prefetch (std has no stable portable one).
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn line(_addr: *const u8) {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{BuildKeyHasher, Key};

    /// The address `bucket` asks for is where hashbrown put a key that met no collision:
    /// otherwise every prefetch of a table would silently fetch the wrong lines.
    #[test]
    fn first_bucket_is_where_a_lone_key_sits() {
        for name in ["ns-1/pod-1", "ns-7/pod-42", "a", "kube-system/coredns"] {
            let key = Key::new(name);
            let mut map: hashbrown::HashMap<Key, u64, BuildKeyHasher> =
                hashbrown::HashMap::with_capacity_and_hasher(64, BuildKeyHasher::default());
            map.insert(key.clone(), 7);
            let table = map.raw_table();
            let found = table
                .find(key.hash_value(), |(k, _)| *k == key)
                .expect("the key was inserted");
            let (control, entry) = first_bucket(table, key.hash_value());
            assert_eq!(entry, found.as_ptr().cast_const(), "{name}");
            let pos = key.hash_value() as usize & (table.buckets() - 1);
            assert_eq!(
                control,
                table.data_end().as_ptr().cast::<u8>().wrapping_add(pos)
            );
        }
    }

    /// A store that records what the queue asks it to prefetch, in one log with the keys the
    /// consumer applies.
    #[derive(Default)]
    struct Recording(std::sync::Mutex<Vec<(String, Option<PrefetchStep>)>>);

    impl KnownObjects<u32> for Recording {
        fn list_keys(&self) -> Vec<Key> {
            Vec::new()
        }
        fn get_by_key(&self, _key: &Key) -> Option<Arc<u32>> {
            None
        }
        fn prefetch(&self, key: &Key, step: PrefetchStep) {
            self.0.lock().unwrap().push((key.to_string(), Some(step)));
        }
    }

    /// Where in the log `key` was applied (`None`) or asked for at `step`; each exactly once.
    fn position(
        log: &[(String, Option<PrefetchStep>)],
        key: &str,
        step: Option<PrefetchStep>,
    ) -> usize {
        let at: Vec<usize> = (0..log.len())
            .filter(|&i| log[i].0 == key && log[i].1 == step)
            .collect();
        assert_eq!(at.len(), 1, "{key} {step:?}: {log:?}");
        at[0]
    }

    /// Every key of a batch is asked for at every step, in the order each step needs (table,
    /// entry, object), before it is applied and no more than its step's distance ahead of it;
    /// nothing else is asked for.
    #[test]
    fn a_batch_asks_the_store_for_each_key_step_by_step_ahead_of_applying_it() {
        use crate::queue::{DeltaQueue, QueueOptions};
        use crate::sharded::DeltaFifo;

        for keys in [1, 2, AHEAD, ENTRY_AHEAD, TABLE_AHEAD, TABLE_AHEAD + 1, 40] {
            let store = Arc::new(Recording::default());
            let key_fn: crate::key::KeyFn<u32> = Arc::new(|n: &u32| Ok(Key::new(&format!("k{n}"))));
            let known: Arc<dyn KnownObjects<u32>> = store.clone();
            let fifo = DeltaFifo::new(QueueOptions::new(key_fn).known_objects(known), 1);
            for n in 0..keys as u32 {
                fifo.add(Arc::new(n)).unwrap();
            }
            let popped = fifo
                .pop_batch(256, |deltas, _| {
                    store
                        .0
                        .lock()
                        .unwrap()
                        .push((deltas.key().to_string(), None));
                })
                .unwrap();
            assert_eq!(popped, keys);

            let log = store.0.lock().unwrap().clone();
            if !ENABLED {
                // Built without prefetches: the store is asked for nothing.
                assert!(log.iter().all(|(_, step)| step.is_none()), "{log:?}");
                assert_eq!(log.len(), keys);
                continue;
            }
            assert_eq!(
                log.len(),
                keys * 4 - 3,
                "three steps and one apply per key, no steps for the first: {log:?}"
            );
            let applied = |n: usize| position(&log, &format!("k{n}"), None);
            assert!(log.iter().all(|(key, step)| key != "k0" || step.is_none()));
            for n in 1..keys {
                let key = format!("k{n}");
                let table = position(&log, &key, Some(PrefetchStep::Table));
                let entry = position(&log, &key, Some(PrefetchStep::Entry));
                let object = position(&log, &key, Some(PrefetchStep::Object));
                assert!(
                    table < entry && entry < object && object < applied(n),
                    "{key}: {log:?}"
                );
                // Asked for just before the key `distance` places earlier is applied: not
                // later (the hint would have no time to land), not earlier (after the key
                // before that one was applied; the lines would have time to leave again).
                for (at, distance) in [(table, TABLE_AHEAD), (entry, ENTRY_AHEAD), (object, AHEAD)]
                {
                    assert!(
                        at < applied(n.saturating_sub(distance)),
                        "{key} late: {log:?}"
                    );
                    if n > distance {
                        assert!(at > applied(n - distance - 1), "{key} early: {log:?}");
                    }
                }
            }
        }
    }

    /// A store whose prefetch panics once, on one key's object step.
    #[cfg(not(kcache_no_prefetch))]
    struct PanicsOnce {
        key: &'static str,
        armed: std::sync::atomic::AtomicBool,
    }

    #[cfg(not(kcache_no_prefetch))]
    impl KnownObjects<u32> for PanicsOnce {
        fn list_keys(&self) -> Vec<Key> {
            Vec::new()
        }
        fn get_by_key(&self, _key: &Key) -> Option<Arc<u32>> {
            None
        }
        fn prefetch(&self, key: &Key, step: PrefetchStep) {
            if step == PrefetchStep::Object
                && key.as_str() == self.key
                && self.armed.swap(false, Relaxed)
            {
                panic!("prefetch of {key}");
            }
        }
    }

    /// The store's prefetch is user code: a panic in it, between two keys of a batch, loses no
    /// key. The keys not yet applied are queued again, every key is applied exactly once, and
    /// the initial list still counts as synced. (Not in a build without prefetches, which never
    /// calls the store's prefetch: the test above checks that.)
    #[cfg(not(kcache_no_prefetch))]
    #[test]
    fn a_panicking_prefetch_loses_no_key() {
        use crate::queue::{DeltaQueue, QueueOptions};
        use crate::sharded::DeltaFifo;
        use std::panic::{catch_unwind, AssertUnwindSafe};

        // With ten keys the object step of k5 is asked for just before k2 is applied.
        let known = Arc::new(PanicsOnce {
            key: "k5",
            armed: std::sync::atomic::AtomicBool::new(true),
        });
        let key_fn: crate::key::KeyFn<u32> = Arc::new(|n: &u32| Ok(Key::new(&format!("k{n}"))));
        let fifo = DeltaFifo::new(QueueOptions::new(key_fn).known_objects(known), 1);
        fifo.replace((0..10).map(Arc::new).collect(), "1").unwrap();
        assert!(!fifo.has_synced());

        let mut applied = Vec::new();
        let first = catch_unwind(AssertUnwindSafe(|| {
            fifo.pop_batch(256, |deltas, _| applied.push(deltas.key().to_string()))
        }));
        assert!(first.is_err(), "the prefetch panicked");
        assert_eq!(applied, ["k0", "k1"]);
        while !fifo.is_empty() {
            fifo.pop_batch(256, |deltas, _| applied.push(deltas.key().to_string()))
                .unwrap();
        }
        let expected: Vec<String> = (0..10).map(|n| format!("k{n}")).collect();
        assert_eq!(applied, expected);
        assert!(fifo.has_synced());
    }

    /// A table hint gives the addresses the table itself gives, and follows the table when it
    /// moves (grows); before anything is recorded it asks for nothing. (Built without
    /// prefetches, it records nothing.)
    #[test]
    fn a_table_hint_follows_its_table() {
        let hint = TableHint::default();
        hint.bucket::<(Key, u64)>(42); // nothing recorded yet: no address at all
        let mut map: hashbrown::HashMap<Key, u64, BuildKeyHasher> =
            hashbrown::HashMap::with_capacity_and_hasher(16, BuildKeyHasher::default());
        let key = Key::new("ns/a");
        if !ENABLED {
            hint.publish(map.raw_table());
            assert!(
                hint.end.load(Relaxed).is_null(),
                "recorded without prefetches"
            );
            return;
        }
        let recorded = |hint: &TableHint| {
            let end = hint.end.load(Relaxed).cast_const().cast::<(Key, u64)>();
            bucket_at(end, hint.mask.load(Relaxed), key.hash_value())
        };
        hint.publish(map.raw_table());
        assert_eq!(
            recorded(&hint),
            first_bucket(map.raw_table(), key.hash_value())
        );
        let before = map.raw_table().data_end();
        map.reserve(10_000);
        assert_ne!(map.raw_table().data_end(), before, "the table moved");
        hint.publish(map.raw_table());
        assert_eq!(
            recorded(&hint),
            first_bucket(map.raw_table(), key.hash_value())
        );
        hint.bucket::<(Key, u64)>(key.hash_value());
    }

    /// An empty table (hashbrown's shared singleton) gives addresses without reading anything.
    #[test]
    fn empty_tables_are_fine_to_ask_about() {
        let map: hashbrown::HashMap<Key, u64, BuildKeyHasher> = Default::default();
        bucket(map.raw_table(), Key::new("x").hash_value());
        value(std::ptr::null::<[u8; 200]>());
    }
}
