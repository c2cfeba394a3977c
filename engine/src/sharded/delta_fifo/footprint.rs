//! [`DeltaFifo::footprint`]: what the queue's shards hold, structure by structure.

use std::mem::size_of;

use crossbeam_utils::CachePadded;

use super::{DeltaFifo, Flight, Pending, ShardState};
use crate::delta::Delta;
use crate::footprint::{array_bytes, table_bytes, Footprint};
use crate::key::Key;
use crate::sync::Mutex;

impl<T: Send + Sync + 'static> DeltaFifo<T> {
    /// The heap bytes the queue holds, per structure, summed over its shards (locked one after
    /// the other): `queue.pending` (keys with deltas to pop; its entries are keys),
    /// `queue.pending.spilled` (delta lists too long for their inline room; its entries are
    /// deltas), `queue.fifo` (the shards' pop order), `queue.in_flight` (keys held by
    /// consumers) and `queue.shards` (the shards themselves). See [`Footprint`].
    pub fn footprint(&self) -> Footprint {
        let (mut pending, mut pending_bytes) = (0, 0);
        let (mut spilled, mut spilled_bytes) = (0, 0);
        let (mut fifo, mut fifo_bytes) = (0, 0);
        let (mut in_flight, mut in_flight_bytes) = (0, 0);
        for index in 0..self.shards.len() {
            let state = self.lock_shard(index);
            pending += state.pending.len();
            pending_bytes += table_bytes::<(Key, Pending<T>)>(state.pending.capacity());
            for entry in state.pending.values().filter(|e| e.deltas.spilled()) {
                spilled += entry.deltas.len();
                spilled_bytes += array_bytes::<Delta<T>>(entry.deltas.capacity());
            }
            fifo += state.fifo.len();
            fifo_bytes += array_bytes::<Key>(state.fifo.capacity());
            in_flight += state.in_flight.len();
            in_flight_bytes += table_bytes::<(Key, Flight<T>)>(state.in_flight.capacity());
        }
        let mut footprint = Footprint::default();
        footprint.add("queue.pending", pending, pending_bytes);
        footprint.add("queue.pending.spilled", spilled, spilled_bytes);
        footprint.add("queue.fifo", fifo, fifo_bytes);
        footprint.add("queue.in_flight", in_flight, in_flight_bytes);
        footprint.add(
            "queue.shards",
            self.shards.len(),
            self.shards.len() * size_of::<CachePadded<Mutex<ShardState<T>>>>(),
        );
        footprint
    }
}
