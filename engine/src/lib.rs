//! # kcache
//!
//! A fast reimplementation of the heart of Kubernetes' client-go informer (`tools/cache`): the
//! DeltaFIFO event queue and the indexed local store, with client-go's per-key semantics.
//!
//! Two engines implement the same contracts ([`DeltaQueue`] for the queue; [`Store`] and
//! [`Indexer`] for the store, implemented by each engine's `IndexedStore`):
//!
//! - [`reference`](mod@reference): a faithful port of client-go's design (one lock, one condition
//!   variable), the yardstick every measurement and every differential test is checked against.
//! - [`sharded`](mod@sharded): the fast engine. Keys are sharded by a hash computed once per
//!   key; producers lock one shard; consumers take batches of keys from one shard at a time and
//!   process them with no lock held; several consumers may run at once, each key exclusive to
//!   one of them until it is done; the store's readers never wait on a global lock.
//!
//! Beside them, [`workqueue`] is client-go's `util/workqueue` (the queue of keys a controller's
//! workers take from, with delayed and rate-limited retries), again as a faithful port and a
//! sharded queue for many workers; its module docs show a controller loop.
//!
//! Shared vocabulary lives at the top: [`Key`] (hashed once), [`Delta`], [`Deltas`],
//! [`Tombstone`], the key functions, and the consumer's [`process_deltas`]. Around them,
//! `informer` (feature `informer`, on by default) builds the whole pipeline: a reflector that
//! lists and watches a source into the queue, consumers that apply what they pop to the store,
//! and handler registrations that each get the notifications on a thread of their own; and
//! `controller` (same feature) is the reconcile loop on top: informers' handlers feed a
//! workqueue, workers reconcile keys from the indexer (`docs/controller.md`).
//!
//! # Usage
//!
//! ## A shared informer
//!
//! What a controller uses: a [`SharedInformer`](informer::SharedInformer) over a
//! [`ListerWatcher`](informer::ListerWatcher) (an API server client; here the in-memory
//! server), a key function and indexes; handlers; a tokio runtime for the watch. The objects
//! carry their resource version ([`Versioned`](informer::Versioned)).
//!
//! ```
//! # #[cfg(feature = "informer")]
//! # tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use kcache::informer::{SetResourceVersion, SharedInformer, Versioned};
//! use kcache_sim::MemoryListerWatcher;
//! use kcache::{EventHandler, IndexFunc, Key, KeyFn};
//!
//! #[derive(Clone)]
//! struct Pod { key: Key, node: Key, rv: String }
//! impl Versioned for Pod { fn resource_version(&self) -> &str { &self.rv } }
//! # impl SetResourceVersion for Pod { fn set_resource_version(&mut self, rv: &str) { self.rv = rv.into() } }
//! # let key_fn: KeyFn<Pod> = Arc::new(|p: &Pod| Ok(p.key.clone()));
//! # let server = MemoryListerWatcher::new(key_fn);
//! # server.upsert(Pod { key: Key::new("default/web-0"), node: Key::new("node-1"), rv: String::new() }).unwrap();
//!
//! struct Log;
//! impl EventHandler<Pod> for Log {
//!     fn on_add(&mut self, pod: &Arc<Pod>, initial: bool) { println!("add {} {initial}", pod.key) }
//!     fn on_update(&mut self, _: &Arc<Pod>, pod: &Arc<Pod>) { println!("update {}", pod.key) }
//! }
//!
//! let key_fn: KeyFn<Pod> = Arc::new(|p: &Pod| Ok(p.key.clone()));
//! let by_node: IndexFunc<Pod> = Arc::new(|p: &Pod| [p.node.clone()].into_iter().collect());
//! let informer = SharedInformer::builder(server, key_fn) // server: any ListerWatcher<Pod>
//!     .indexers(vec![("node".into(), by_node)])
//!     .build();
//! let registration = informer.add_event_handler(Log).unwrap();
//! informer.start().unwrap();
//! registration.wait_for_sync().await; // the initial list reached this handler
//! assert_eq!(informer.store().by_index("node", "node-1").unwrap().len(), 1);
//! informer.shutdown().await;
//! # });
//! ```
//!
//! Each handler gets its notifications on a thread of its own through a bounded buffer (or
//! inline on the consumers, or as an async task), in order per key; the store's
//! readers never wait on a global lock. The contract: `docs/informer.md`.
//!
//! ## The parts by hand
//!
//! Without tokio, or to drive the queue yourself: a store that is also the queue's *known
//! objects*, a producer (the watch), and consumers that apply what they pop to the store and
//! notify a handler. This is the loop the shared informer's consumer threads run.
//!
//! ```
//! use std::sync::Arc;
//! use kcache::{apply_deltas_coalesced, sharded, DeltaQueue, EventHandler, IndexFunc, Key, KeyFn,
//!              QueueOptions, Store as _, Indexer as _, KnownObjects};
//!
//! #[derive(Debug)]
//! struct Pod { key: Key, node: Key, version: u64 }
//!
//! let key_fn: KeyFn<Pod> = Arc::new(|p: &Pod| Ok(p.key.clone()));
//! let by_node: IndexFunc<Pod> = Arc::new(|p: &Pod| [p.node.clone()].into_iter().collect());
//! let store = Arc::new(sharded::IndexedStore::new(key_fn.clone(), vec![("node".into(), by_node)]));
//! let queue = Arc::new(sharded::DeltaFifo::new(
//!     QueueOptions::new(key_fn).known_objects(store.clone() as Arc<dyn KnownObjects<Pod>>),
//!     16,
//! ));
//!
//! #[derive(Default)]
//! struct Count { adds: usize, updates: usize }
//! impl EventHandler<Pod> for Count {
//!     fn on_add(&mut self, _: &Arc<Pod>, _: bool) { self.adds += 1 }
//!     fn on_update(&mut self, _: &Arc<Pod>, _: &Arc<Pod>) { self.updates += 1 }
//! }
//!
//! let consumer = {
//!     let (queue, store) = (queue.clone(), store.clone());
//!     std::thread::spawn(move || {
//!         let mut handler = Count::default();
//!         // Each batch is done with when pop_batch returns: no key can be left held.
//!         while queue
//!             .pop_batch(256, |deltas, initial| {
//!                 apply_deltas_coalesced(&*store, &mut handler, &deltas, initial)
//!             })
//!             .is_ok()
//!         {}
//!         handler.adds + handler.updates
//!     })
//! };
//! for v in 1..=3 {
//!     let pod = Pod { key: Key::new("default/web-0"), node: Key::new("node-1"), version: v };
//!     if v == 1 { queue.add(Arc::new(pod)).unwrap() } else { queue.update(Arc::new(pod)).unwrap() }
//! }
//! queue.close(); // consumers drain what is queued, then see Closed
//! assert_eq!(consumer.join().unwrap(), 3, "every delta reached the handler");
//! assert_eq!(store.get_by_key(&Key::new("default/web-0")).unwrap().version, 3);
//! assert_eq!(store.by_index("node", "node-1").unwrap().len(), 1);
//! ```
//!
//! # Consistency
//!
//! The queue ([`sharded::DeltaFifo`]):
//!
//! - A key's deltas come out in the order they went in, deduplicated as client-go does (two
//!   `Deleted` in a row become one), all at once when the key is popped.
//! - A key handed to one consumer is handed to no other until the first is done with it; deltas
//!   that arrive meanwhile wait, in place, and come out afterwards. Every delta is handed out
//!   exactly once.
//! - `delete`, `replace` and `resync` see the known store as client-go would under its lock, even
//!   while a consumer is between popping a key and storing it (the engine answers for in-flight
//!   keys from the popped deltas).
//! - `has_synced` turns true once every key of the first `replace` has been *processed*; each
//!   of those keys is popped with `is_in_initial_list = true`.
//! - With one shard and consumers that finish a key before popping the next, the output is the
//!   reference's exactly, pop order included (checked by differential property tests). With
//!   more shards, keys within a shard pop in arrival order and consumers visit shards
//!   round-robin; the fairness bound is stated on [`sharded::DeltaFifo`].
//! - A key error or a transform error is returned and changes nothing. A panic in user code
//!   (key function, transformer, known objects) changes nothing either; a panic in `process`
//!   loses only the key it was given. The queue never wedges: [`DeltaQueue::len`] always
//!   counts exactly the keys that can be popped.
//!
//! **The consumer's obligation.** With known objects, the queue asks the known store what
//! exists (`delete`, `replace`, `resync`), and the sharded engine answers for in-flight keys
//! from what the store *will* hold. Both are right only if the consumer applies **every**
//! popped list to the known store inside `process`, with [`process_deltas`],
//! [`apply_deltas_coalesced`] or an equivalent. Details on [`DeltaQueue`].
//!
//! The store ([`sharded::IndexedStore`]): `get_by_key` reflects every completed write; objects that
//! `by_index(name, v)` returns had `v` among their index values at some moment during the call;
//! no index keeps an empty set; once writers stop, items and indices agree exactly. Details on
//! the type.
//!
//! The shared informer (`informer::SharedInformer`): each handler registration receives the
//! notifications of one key in the order the store went through them, from its own buffer, so
//! a slow handler delays only itself. A handler registered after the start gets every key
//! exactly once as a synthetic add or in a later notification, never both and never neither.
//! A registration's `has_synced` is true once the informer synced *and* that handler was
//! delivered its initial-list notifications. Resyncs (updates whose old and new versions are
//! equal) reach only the registrations whose own resync period is due.
//!
//! # Deviations from client-go
//!
//! Where client-go's behaviour is accidental (Go map order, half-done failures) or where the
//! sharded engine must differ to run consumers outside a lock. The reference's are listed on
//! [`reference::DeltaFifo`], the sharded engine's on [`sharded::DeltaFifo`]; in short:
//!
//! - **A refused operation changes nothing**, including the `populated` flag, which client-go's
//!   `Add` sets before its key function can fail; `replace` and `resync` never stop halfway.
//! - **Deterministic order where client-go walks a Go map**: `replace` and `resync` visit known
//!   keys sorted, so pop order is reproducible and traces compare line for line.
//! - **A panic in user code changes nothing** either: client-go's `Replace` asks the known
//!   store for its keys only after queueing the list; both engines ask first.
//! - **`process` runs outside every lock** (sharded), so consumers of different keys run in
//!   parallel; the consumer's obligation above keeps `delete`/`replace`/`resync` right.
//! - **Per-key exclusivity** (sharded): a key is never handed to two consumers at once.
//! - **`has_synced`** (sharded) turns true once the last key of the initial list has been
//!   *processed*, not merely popped; `is_in_initial_list` travels with each key.
//!
//! # Performance
//!
//! - Use [`DeltaQueue::pop_batch`] with [`apply_deltas_coalesced`] for throughput: one shard lock
//!   to take up to `max` keys, one to complete them, and one store write per key however many
//!   deltas it gathered. A one-key [`DeltaQueue::pop`] goes through the shard scheduler each
//!   time (round-robin fairness) and costs more than the reference's when uncontended.
//! - When producers outrun consumers, keys gather several deltas each and consumers do less work
//!   per delta, so throughput rises with load; the price is queueing latency (the backlog).
//! - Idle consumers spin briefly, then sleep; a producer wakes them with no system call while
//!   they are busy.
//! - Figures, and where the sharded engine loses, are in `results/BENCHMARKS.md`.
//!
//! # Layout
//!
//! The crate is a stack of layers; a module imports only from its own layer or below, and no
//! two modules import each other (checked by `scripts/layers`, which reads this table).
//!
//! | layer | modules | what they hold |
//! |---|---|---|
//! | 0 | `key`, `sync`, `footprint` | keys and key functions; the sync shim (std or loom); memory footprints |
//! | 1 | `latch`, `delta`, `store` | the closing latch; deltas and tombstones; the `Store`/`Indexer` contracts |
//! | 2 | `queue`, `consumer` | the `DeltaQueue` contract and options; the consumer's `process_deltas` |
//! | 3 | [`reference`](mod@reference), [`sharded`](mod@sharded) | the two engines: client-go's port and the fast one |
//! | 4 | [`workqueue`], `informer` | client-go's workqueue; the informer pipeline over an engine |
//! | 5 | `controller` | the reconcile loop: informers' handlers feed a workqueue, workers reconcile |
//!
//! # Safety
//!
//! No safe public function of this crate can cause a double free or a use-after-free,
//! whatever order and threads it is called from, and neither can a private one given guards
//! from `crossbeam_epoch::pin` (every guard in the crate is one). The crate denies
//! `unsafe_code` except in five private modules, and `unsafe_op_in_unsafe_fn`, so every
//! unsafe operation is in an `unsafe { }` block, and each block says why it holds in a
//! `Safety:` comment (clippy's `undocumented_unsafe_blocks`, an error in CI):
//!
//! - `sharded/prefetch.rs`: one intrinsic, `PREFETCHT0`, a hint that never faults and reads
//!   nothing. The addresses it is given are computed, never dereferenced.
//! - `sharded/indexer/slot.rs`: the slot holding a key's current object, whose readers borrow
//!   it under an epoch guard (crossbeam-epoch) instead of counting references; its pointer
//!   is an `ObjectCell`, which owns the object's strong count by type and retires it on drop.
//! - `sharded/indexer/published.rs`: the store's current content, mirrored as a plain pointer
//!   for pinned readers.
//! - `sharded/indexer/writable.rs`: the one place that replaces a slot's object.
//! - `controller/nice.rs`: `gettid` and `setpriority`, two system calls on integers, for
//!   `ControllerBuilder::worker_nice`.
//!
//! How the rules of that code are carried by types, crossbeam-epoch style:
//!
//! - **A pointer is only as good as the guard it is tied to.** Every borrowed object or state
//!   is a `&'g T` from a `&'g Guard`, so it cannot outlive the pin that keeps it alive; a
//!   replaced object or state is released through the epoch only after every thread pinned
//!   before the replacement has unpinned. [`sharded::ReadGuard`] owns its pin and borrows the
//!   store; it cannot leave its thread (crossbeam's `Guard` is neither `Send` nor `Sync`), and
//!   [`ReadGuard::repin`](sharded::ReadGuard::repin) takes `&mut self`, so nothing borrowed
//!   from it is in use when it unpins. Every guard is a `Pinned`, which only
//!   `crossbeam_epoch::pin` makes (the default collector, the one releases are deferred to),
//!   so no guard of another collector can reach that code, in any build.
//! - **Writer-only operations take a proof of exclusive writing.** Publishing a new content is
//!   a method of the writers' lock held exclusively, borrowed `&mut` (`Exclusive::publish`).
//!   Replacing a slot's object (a load and a store, sound only while writers of one slot never
//!   overlap) takes `&mut Held`: the key's items-shard entry held in a state no other writer
//!   can reach meanwhile (the current one, under the writers' lock held shared, or one a
//!   single thread is building), which only a `Writable` of such a state makes. A write that
//!   holds no such entry does not compile.
//! - **A raw pointer is freed only by a function that owns it.** A slot's pointer leaves the
//!   slot only as an owned `Unpublished` count, which only the slot's own swap-out and its
//!   drop can make, and which `retire` consumes: each count is released once, by the epoch.
//!   A replaced content is released through an `Arc` clone handed to the epoch.
//! - **Nothing unsafe is public.** `Slot`, `Published`, `Writable` and their tokens are
//!   private to the sharded indexer; the public API ([`sharded::IndexedStore`], its
//!   [`ReadGuard`](sharded::ReadGuard), the [`Store`] and [`Indexer`] traits) takes no
//!   guard, pointer or token from its caller.
//!
//! What checks it: the unit tests of `slot` and `published` (a replaced object outlives the
//! guards that could read it, every object is released exactly once), the slot's loom model
//! (`--cfg kcache_loom`, `--lib loom_model`: the slot's atomics against a stand-in collector
//! with crossbeam-epoch's contract, which loom cannot run),
//! `tests/indexer_stress.rs` (writers racing on keys while guarded readers borrow what they
//! replace; no borrowed object is released while borrowed, every object exactly once in the
//! end), and the indexer's contract and differential suites, which also run through the
//! borrowed reads (`tests/indexer_guarded`). The loom models (`tests/loom.rs`, `--cfg
//! kcache_loom`) cover the queue's own synchronisation (shard hand-off, wake-ups, per-key
//! exclusivity, room); no loom model drives the indexer, since loom cannot model
//! crossbeam-epoch, which is not built on the crate's sync shim.

// No unsafe code, except where a module opts in (the five above), each block with its
// `Safety:`.
#![deny(unsafe_code)]
// An `unsafe fn`'s body is not one big unsafe block: each unsafe operation in it still needs
// its own block and `Safety:` comment (only a warning by default, from the 2024 edition on).
#![deny(unsafe_op_in_unsafe_fn)]

mod consumer;
mod delta;
mod footprint;
mod key;
pub(crate) mod latch;
mod queue;
mod store;
pub(crate) mod sync;

#[cfg(feature = "informer")]
pub mod controller;
#[cfg(feature = "informer")]
pub mod informer;
pub mod reference;
pub mod sharded;
pub mod workqueue;

pub use consumer::{apply_deltas_coalesced, process_deltas, EventHandler, NoopHandler};
pub use delta::{Delta, DeltaObject, DeltaType, Deltas, FinalState, Tombstone};
pub use footprint::{Footprint, FootprintPart};
pub use key::{
    meta_namespace_key, namespace_name_key, split_meta_namespace_key, BuildKeyHasher, Key,
    KeyError, KeyFn, KeyHasher, KeyMap, KeySet, ObjectMeta,
};
pub use queue::{
    BatchConsumer, BatchError, Closed, DeltaQueue, QueueError, QueueEvent, QueueOptions,
    TransformError, TransformFn, TryPop, WaitForRoom,
};
pub use store::{
    IndexError, IndexFunc, IndexValues, Indexer, Indexers, KnownObjects, PrefetchStep, Store,
};

/// The README's Rust examples, compiled and run as doctests so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeDoctests;
