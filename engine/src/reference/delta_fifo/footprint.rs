//! [`DeltaFifo::footprint`]: what the queue holds, structure by structure.

use super::DeltaFifo;
use crate::delta::{Delta, Deltas};
use crate::footprint::{array_bytes, table_bytes, Footprint};
use crate::key::Key;

impl<T> DeltaFifo<T> {
    /// The heap bytes the queue holds, per structure: `queue.pending` (client-go's `items`;
    /// its entries are keys), `queue.pending.spilled` (delta lists too long for their inline
    /// room; its entries are deltas) and `queue.fifo` (client-go's `queue`). See
    /// [`Footprint`](crate::Footprint).
    pub fn footprint(&self) -> Footprint {
        let state = self.lock();
        let spilled: Vec<&Deltas<T>> = state
            .items
            .values()
            .filter(|deltas| deltas.heap_capacity() > 0)
            .collect();
        let mut footprint = Footprint::default();
        footprint.add(
            "queue.pending",
            state.items.len(),
            table_bytes::<(Key, Deltas<T>)>(state.items.capacity()),
        );
        footprint.add(
            "queue.pending.spilled",
            spilled.iter().map(|deltas| deltas.len()).sum(),
            spilled
                .iter()
                .map(|deltas| array_bytes::<Delta<T>>(deltas.heap_capacity()))
                .sum(),
        );
        footprint.add(
            "queue.fifo",
            state.queue.len(),
            array_bytes::<Key>(state.queue.capacity()),
        );
        footprint
    }
}
