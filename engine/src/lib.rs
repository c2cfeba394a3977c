//! # kcache
//!
//! A fast reimplementation of the heart of Kubernetes' client-go informer (`tools/cache`): the
//! DeltaFIFO event queue and the indexed local store.
//!
//! Two engines implement the same contracts ([`DeltaQueue`], [`Indexer`]):
//!
//! - [`reference`](mod@reference): a faithful port of client-go's design (one lock, one condition variable),
//!   the yardstick every measurement and every differential test is checked against.
//! - [`sharded`](mod@sharded): the fast engine, sharded by key hash, with concurrent consumers.
//!
//! Shared vocabulary lives at the top: [`Key`] (hashed once), [`Delta`], [`Deltas`],
//! [`Tombstone`], the key functions, and the consumer's [`process_deltas`].

mod consumer;
mod delta;
mod key;
pub(crate) mod latch;
mod queue;
mod store;
pub(crate) mod sync;

pub mod reference;
pub mod sharded;

pub use consumer::{apply_deltas_coalesced, process_deltas, EventHandler, NoopHandler};
pub use delta::{Delta, DeltaObject, DeltaType, Deltas, Tombstone};
pub use key::{
    meta_namespace_key, split_meta_namespace_key, BuildKeyHasher, Key, KeyError, KeyFn, KeyHasher,
    KeyMap, KeySet, ObjectMeta,
};
pub use queue::{
    Closed, DeltaQueue, QueueError, QueueOptions, TransformError, TransformFn, TryPop,
};
pub use store::{IndexError, IndexFunc, IndexValues, Indexer, Indexers, KnownObjects, Store};
