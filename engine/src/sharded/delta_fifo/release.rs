//! Giving back what a drained backlog left behind.
//!
//! A shard's `pending` map and `fifo` grow with its backlog, and neither a hash table nor a
//! deque ever shrinks on its own: after a burst of a million keys the queue would hold their
//! room (about 150 bytes per key) for good, though it holds nothing. So when a completed batch
//! leaves a shard holding far less than its room, the shard moves what it holds into smaller
//! ones.
//!
//! The rule is amortised and bounded: a table is replaced only once it is at most 1/16 full,
//! by one with room for four times what it holds (at least [`KEEP`] keys). A move therefore
//! touches at most 1/16 of the entries the table was grown for (a fraction of a millisecond
//! for a shard of a 4M-key backlog), and after a move the table must lose at least half of
//! its keys before it moves again and grow fourfold before it doubles again: a backlog that
//! comes and goes does not make it thrash. The old allocation is freed after the shard lock is
//! released, so no producer waits for the allocator to take it back.

use std::collections::VecDeque;

use super::{Pending, ShardState};
use crate::key::{Key, KeyMap};

/// Room a shard always keeps (in keys), and a quarter of the smallest room it gives back:
/// small tables are not worth moving.
const KEEP: usize = 256;

/// The emptied tables a shard replaced, held only to be dropped once its lock is released.
pub(super) struct Released<T> {
    _pending: Option<KeyMap<Pending<T>>>,
    _fifo: Option<VecDeque<Key>>,
}

/// The room to move `len` entries into, when a table of `capacity` holding them is worth
/// shrinking.
fn smaller_room(len: usize, capacity: usize) -> Option<usize> {
    (capacity > 4 * KEEP && len.saturating_mul(16) <= capacity).then(|| (len * 4).max(KEEP))
}

impl<T> ShardState<T> {
    /// Moves `pending` and `fifo` into smaller tables when a drained backlog left them mostly
    /// empty (see the module docs); the caller drops what this returns after unlocking.
    pub(super) fn release_drained(&mut self) -> Released<T> {
        let pending = smaller_room(self.pending.len(), self.pending.capacity()).map(|room| {
            let fresh = KeyMap::with_capacity_and_hasher(room, Default::default());
            let mut old = std::mem::replace(&mut self.pending, fresh);
            self.pending.extend(old.drain());
            old
        });
        let fifo = smaller_room(self.fifo.len(), self.fifo.capacity()).map(|room| {
            let mut old = std::mem::replace(&mut self.fifo, VecDeque::with_capacity(room));
            self.fifo.extend(old.drain(..));
            old
        });
        Released {
            _pending: pending,
            _fifo: fifo,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_large_mostly_empty_tables_are_moved() {
        assert_eq!(smaller_room(0, 4 * KEEP), None, "small tables stay");
        assert_eq!(smaller_room(0, 7168), Some(KEEP));
        assert_eq!(smaller_room(448, 7168), Some(4 * 448));
        assert_eq!(smaller_room(449, 7168), None, "more than 1/16 full");
    }

    #[test]
    fn a_drained_shard_gives_its_room_back_and_keeps_its_keys_in_order() {
        let mut state = ShardState::<u32>::new(0);
        for n in 0..20_000u32 {
            let key = Key::new(&n.to_string());
            state.push(
                key,
                crate::Delta::new(crate::DeltaType::Added, n.into()),
                false,
            );
        }
        // Pop all but 100, oldest first, as `take_batch` does.
        while state.fifo.len() > 100 {
            let key = state.fifo.pop_front().expect("queued");
            state.pending.remove(&key);
        }
        let (pending_room, fifo_room) = (state.pending.capacity(), state.fifo.capacity());
        let released = state.release_drained();
        assert!(released._pending.is_some() && released._fifo.is_some());
        assert!(state.pending.capacity() < pending_room / 8);
        assert!(state.fifo.capacity() < fifo_room / 8);
        let left: Vec<_> = state.fifo.iter().map(|k| k.as_str().to_owned()).collect();
        let expected: Vec<_> = (19_900..20_000u32).map(|n| n.to_string()).collect();
        assert_eq!(left, expected);
        assert!(state.fifo.iter().all(|k| state.pending.contains_key(k)));
        // Nothing more to give back until the shard grows and drains again.
        let again = state.release_drained();
        assert!(again._pending.is_none() && again._fifo.is_none());
    }
}
