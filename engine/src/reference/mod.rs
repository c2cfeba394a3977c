//! The reference design: a faithful port of client-go's `tools/cache`, one lock and one
//! condition variable, nothing clever. It is the yardstick the sharded engine is measured and
//! checked against.
//!
//! - [`DeltaFifo`]: client-go's `DeltaFIFO`; its deviations from client-go are listed on it.
//! - [`Fifo`]: client-go's plain `FIFO`, which keeps only the newest object per key.
//! - [`IndexedStore`]: client-go's `threadSafeMap` with its indexes, an
//!   [`Indexer`](crate::Indexer).

mod indexer;
pub use indexer::IndexedStore;

mod delta_fifo;
mod fifo;

pub use delta_fifo::DeltaFifo;
pub use fifo::Fifo;

#[cfg(test)]
pub(crate) mod test_support;
