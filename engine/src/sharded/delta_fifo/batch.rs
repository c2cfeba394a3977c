//! [`DeltaQueue::apply_events`](crate::DeltaQueue::apply_events) on the sharded engine: a
//! batch of watch events with one lock per shard it touches and one token per shard.
//!
//! # Algorithm
//!
//! 1. **Outside every lock**, in batch order: each event's key (a key error refuses the event
//!    at once), its shard, and its transformed object (a delete's transform error counts only
//!    if the delete is not ignored, as on the single path). The shard's table is asked for
//!    the key's bucket meanwhile.
//! 2. **Room**: with a backlog bound, wait while the queue is full, once for the whole batch.
//! 3. **Group by shard**: a stable sort by shard index, so the events of one shard (and so of
//!    one key) keep their batch order.
//! 4. **One hold per shard**: each event is applied as `add`/`update`/`delete` would apply it
//!    under that shard's lock (populated flag, delete-ignore rule, dedup, compaction); the
//!    deltas are counted against the bound without waiting.
//! 5. **Wake**: every shard that went from idle to scheduled gets its token after its lock is
//!    released, through the [`PendingWakes`] guard, so a panic in user code (the known objects a
//!    delete consults) cannot leave a shard marked scheduled without a token.
//!
//! # Why it equals applying the events one by one
//!
//! Everything one event changes or reads lives in its key's shard (its pending list, its
//! in-flight record, the FIFO it joins), except the populated flag (set-only) and the backlog
//! count (a sum). Events of one key share a shard and keep their order there, so every key
//! sees the same sequence of operations as on the single path; events of different shards
//! commute. Within one shard the order is the batch's, so with one shard even the FIFO order
//! of new keys is the same. The differential test (`engine/tests/fifo_batch.rs`) checks this
//! against the reference applying the events one by one.

use std::sync::Arc;

use super::{DeltaFifo, Lane, Pending, PendingWakes};
use crate::delta::{Delta, DeltaObject, DeltaType};
use crate::key::Key;
use crate::queue::{BatchError, QueueError, QueueEvent};

/// One event of a batch, ready to apply under its shard's lock.
struct Prepared<T> {
    /// Its position in the batch (what a refusal reports).
    at: usize,
    shard: usize,
    key: Key,
    kind: DeltaType,
    /// The transformed object; for a delete, the transform's error if it failed (reported only
    /// if the delete is not ignored).
    object: Result<Arc<T>, QueueError>,
}

impl<T: Send + Sync + 'static> DeltaFifo<T> {
    /// See the module docs.
    pub(super) fn apply_batch(&self, events: Vec<QueueEvent<T>>) -> Result<(), BatchError> {
        let mut refused = Vec::new();
        let mut prepared = Vec::with_capacity(events.len());
        for (at, event) in events.into_iter().enumerate() {
            let (kind, obj) = match event {
                QueueEvent::Added(obj) => (DeltaType::Added, obj),
                QueueEvent::Updated(obj) => (DeltaType::Updated, obj),
                QueueEvent::Deleted(obj) => (DeltaType::Deleted, obj),
            };
            let key = match (self.key_fn)(&obj) {
                Ok(key) => key,
                Err(err) => {
                    refused.push((at, err.into()));
                    continue;
                }
            };
            let object = match self.transform(obj) {
                Err(err) if kind != DeltaType::Deleted => {
                    refused.push((at, err));
                    continue;
                }
                object => object,
            };
            let shard = self.shard_of(&key);
            self.pending_tables[shard].bucket::<(Key, Pending<T>)>(key.hash_value());
            prepared.push(Prepared {
                at,
                shard,
                key,
                kind,
                object,
            });
        }
        if prepared.is_empty() {
            return BatchError::check(refused);
        }
        if !self.room.has_room() {
            self.room.wait();
        }
        if self.shards.len() > 1 {
            // Stable: one shard's events, and so one key's, keep their batch order.
            prepared.sort_by_key(|p| p.shard);
        }
        // Declared before the shard guards it outlives, so consumers it wakes find them unlocked.
        let mut wake = PendingWakes::new(&self.scheduler);
        let mut events = prepared.into_iter().peekable();
        while let Some(first) = events.peek() {
            let shard = first.shard;
            let mut state = self.lock_shard(shard);
            let mut grew = 0;
            while let Some(event) = events.next_if(|e| e.shard == shard) {
                let Prepared {
                    at,
                    key,
                    kind,
                    object,
                    ..
                } = event;
                if kind == DeltaType::Deleted
                    && !state.has_pending(&key)
                    && !self.is_known(&state, &key)
                {
                    self.mark_populated();
                    continue;
                }
                let object = match object {
                    Ok(object) => object,
                    Err(err) => {
                        refused.push((at, err));
                        continue;
                    }
                };
                self.mark_populated();
                let delta = Delta {
                    kind,
                    object: DeltaObject::Object(object),
                };
                let pushed = state.push(key, delta, self.compact, Lane::Live);
                grew += usize::from(pushed.grew);
                if pushed.schedule {
                    wake.shards.push(shard);
                }
            }
            // Under the lock, so the count never runs behind the shard; never waits (the batch
            // waited for room once, above).
            self.room.add(grew);
            self.pending_tables[shard].publish(state.pending.raw_table());
        }
        drop(wake);
        // Key and transform refusals were found before the delete refusals: back in batch order.
        refused.sort_unstable_by_key(|(at, _)| *at);
        BatchError::check(refused)
    }
}
