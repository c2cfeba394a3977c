//! The reference design: a faithful port of client-go's `tools/cache`, one lock and one
//! condition variable, nothing clever. It is the yardstick the sharded engine is measured and
//! checked against.

mod indexer;
pub use indexer::IndexedStore;

mod delta_fifo;
mod fifo;

pub use delta_fifo::DeltaFifo;
pub use fifo::Fifo;

#[cfg(test)]
pub(crate) mod test_support;
