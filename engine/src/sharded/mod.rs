//! The sharded engine: state split by key hash, concurrent consumers, no global lock on the
//! add/update/delete/pop path.
//!
//! - [`DeltaFifo`]: the sharded DeltaFIFO, with client-go's per-key semantics and several
//!   consumers at once; its guarantees, fairness bound and deviations are listed on it.
//! - [`IndexedStore`]: the concurrent [`Indexer`](crate::Indexer), whose readers never wait on
//!   a global lock.

mod delta_fifo;
mod grow;
pub(crate) mod idle;
mod prefetch;
mod room;
pub(crate) mod scheduler;

pub use delta_fifo::{DeltaFifo, DEFAULT_SHARDS, MAX_SHARDS};

mod indexer;
pub use indexer::{IndexedStore, ReadGuard};
