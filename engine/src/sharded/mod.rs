//! The sharded engine: state split by key hash, concurrent consumers, no global lock on the
//! add/update/delete/pop path.

mod delta_fifo;
mod scheduler;

pub use delta_fifo::{DeltaFifo, DEFAULT_SHARDS};

mod indexer;
pub use indexer::{IndexedStore, ReadGuard};
