//! Giving back what a drained backlog left behind.
//!
//! A shard's `pending` map and `fifo` grow with its backlog, and neither a hash table nor a
//! deque ever shrinks on its own: after a burst of a million keys the queue would hold their
//! room (about 150 bytes per key) for good, though it holds nothing. So when a completed batch
//! leaves a shard's `pending` map mostly empty, the shard moves what it holds into smaller
//! tables.
//!
//! When is a trade: a table given back must be grown again by the next backlog, one doubling
//! at a time, which costs about one more write per key queued (measured with callgrind,
//! results/BENCHMARKS.md: bursts of 500,000 events at 4M keys, each drained before the next,
//! took 22.0 last-level cache misses per event when every drain gave the room back, 16.1 with
//! the rule below). So a shard gives its room back
//!
//! - at once, the first time its backlog drains completely (an informer's initial list, a
//!   burst that does not come back): its room is freed as soon as it is not needed;
//! - afterwards, only once it has stayed mostly empty (at most 1/16 full) for four times as
//!   many popped keys as it has room for: backlogs that come back sooner (relist after relist)
//!   keep their room, and the regrowth a release can cause is paid for by those pops.
//!
//! A move is bounded and amortised: the table is at most 1/16 full and goes to room for four
//! times what it holds (at least [`KEEP`] keys), so it touches at most 1/16 of the entries the
//! table was grown for (a fraction of a millisecond for a shard of a 4M-key backlog). The old
//! allocation is freed after the shard lock is released, so no producer waits for the
//! allocator to take it back.

use std::collections::VecDeque;

use super::{PendingMap, ShardState};
use crate::key::Key;
use crate::sharded::grow::Growing;

/// Room a shard always keeps (in keys), and a quarter of the smallest room it gives back:
/// small tables are not worth moving.
const KEEP: usize = 256;

/// Popped keys a mostly empty shard waits for, per key of room, before it gives room back
/// again (see the module docs).
const QUIET_POPS_PER_ROOM: usize = 4;

/// What a shard remembers to decide when to give room back.
#[derive(Debug, Default)]
pub(super) struct Hysteresis {
    /// Keys popped while `pending` was mostly empty, since it last was not.
    quiet_pops: usize,
    /// The shard has given room back before.
    released_before: bool,
}

/// The emptied tables a shard replaced, held only to be dropped once its lock is released.
pub(super) struct Released<T> {
    _pending: Option<Growing<PendingMap<T>>>,
    _fifo: Option<VecDeque<Key>>,
}

/// Whether a table of `capacity` holding `len` entries is mostly empty and worth shrinking.
fn mostly_empty(len: usize, capacity: usize) -> bool {
    capacity > 4 * KEEP && len.saturating_mul(16) <= capacity
}

/// The room to move `len` entries into.
fn smaller_room(len: usize) -> usize {
    (len * 4).max(KEEP)
}

impl<T> ShardState<T> {
    /// Called under the shard lock once a batch of `popped` keys is complete: moves `pending`
    /// and `fifo` into smaller tables when a drained backlog left them mostly empty, at the
    /// moments the module docs give. The caller drops what this returns after unlocking.
    pub(super) fn release_drained(&mut self, popped: usize) -> Released<T> {
        let none = Released {
            _pending: None,
            _fifo: None,
        };
        let (len, capacity) = (self.pending.len(), self.pending.capacity());
        if !mostly_empty(len, capacity) {
            self.release.quiet_pops = 0;
            return none;
        }
        self.release.quiet_pops += popped;
        let first_drain = !self.release.released_before && len == 0;
        if !first_drain && self.release.quiet_pops < QUIET_POPS_PER_ROOM * capacity {
            return none;
        }
        self.release = Hysteresis {
            quiet_pops: 0,
            released_before: true,
        };
        let fresh = PendingMap::with_capacity_and_hasher(smaller_room(len), Default::default());
        // A new table, wrapped anew: its room is its own, not the old one's.
        let mut pending = std::mem::replace(&mut self.pending, Growing::new(fresh));
        self.pending.extend(pending.drain());
        let fifo = mostly_empty(self.fifo.len(), self.fifo.capacity()).then(|| {
            let fresh = VecDeque::with_capacity(smaller_room(self.fifo.len()));
            let mut fifo = std::mem::replace(&mut self.fifo, fresh);
            self.fifo.extend(fifo.drain(..));
            fifo
        });
        Released {
            _pending: Some(pending),
            _fifo: fifo,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Lane;
    use super::*;
    use crate::{Delta, DeltaType};

    /// A shard holding `n` keys, as many producers' pushes leave it.
    fn shard_with(n: u32) -> ShardState<u32> {
        let mut state = ShardState::new(0);
        for k in 0..n {
            let delta = Delta::new(DeltaType::Added, k.into());
            state.push(Key::new(&k.to_string()), delta, false, Lane::Live);
        }
        state
    }

    /// Pops keys oldest first, as `take_batch` does, until `left` remain; returns how many.
    fn pop_until(state: &mut ShardState<u32>, left: usize) -> usize {
        let mut popped = 0;
        while state.fifo.len() > left {
            let key = state.fifo.pop_front().expect("queued");
            state.pending.remove(&key);
            popped += 1;
        }
        popped
    }

    #[test]
    fn only_large_mostly_empty_tables_count() {
        assert!(!mostly_empty(0, 4 * KEEP), "small tables stay");
        assert!(mostly_empty(0, 7168));
        assert!(mostly_empty(448, 7168));
        assert!(!mostly_empty(449, 7168), "more than 1/16 full");
        assert_eq!(smaller_room(0), KEEP);
        assert_eq!(smaller_room(448), 4 * 448);
    }

    #[test]
    fn the_first_drain_gives_room_back_at_once() {
        let mut state = shard_with(20_000);
        let popped = pop_until(&mut state, 100);
        let (pending_room, fifo_room) = (state.pending.capacity(), state.fifo.capacity());
        assert!(
            state.release_drained(popped)._pending.is_none(),
            "not drained yet"
        );
        let popped = pop_until(&mut state, 0);
        let released = state.release_drained(popped);
        assert!(released._pending.is_some() && released._fifo.is_some());
        assert!(state.pending.capacity() < pending_room / 8);
        assert!(state.fifo.capacity() < fifo_room / 8);
    }

    #[test]
    fn a_move_keeps_what_is_left_in_order() {
        let mut state = shard_with(20_000);
        let popped = pop_until(&mut state, 100);
        state.release = Hysteresis {
            quiet_pops: QUIET_POPS_PER_ROOM * state.pending.capacity(),
            released_before: true,
        };
        assert!(state.release_drained(popped)._pending.is_some());
        let left: Vec<_> = state.fifo.iter().map(|k| k.as_str().to_owned()).collect();
        let expected: Vec<_> = (19_900..20_000u32).map(|k| k.to_string()).collect();
        assert_eq!(left, expected);
        assert_eq!(state.pending.len(), 100);
        assert!(state.fifo.iter().all(|k| state.pending.contains_key(k)));
    }

    #[test]
    fn a_backlog_that_comes_back_keeps_its_room_until_the_shard_stays_quiet() {
        let mut state = shard_with(20_000);
        let popped = pop_until(&mut state, 0);
        assert!(
            state.release_drained(popped)._pending.is_some(),
            "first drain"
        );
        // The backlog comes back and drains again: the room it grew stays.
        for k in 0..20_000u32 {
            let delta = Delta::new(DeltaType::Updated, k.into());
            state.push(Key::new(&k.to_string()), delta, false, Lane::Live);
        }
        let room = state.pending.capacity();
        let popped = pop_until(&mut state, 0);
        assert!(state.release_drained(popped)._pending.is_none());
        // (Removals leave tombstones, which a table counts against its capacity.)
        assert!(state.pending.capacity() > room / 2);
        // Quiet for four times its room in pops (a trickle of one key at a time): given back.
        let mut released = false;
        for k in 0..QUIET_POPS_PER_ROOM * room {
            let delta = Delta::new(DeltaType::Updated, 0u32.into());
            state.push(Key::new(&format!("t{k}")), delta, false, Lane::Live);
            let popped = pop_until(&mut state, 0);
            if state.release_drained(popped)._pending.is_some() {
                released = true;
                break;
            }
        }
        assert!(released);
        assert!(state.pending.capacity() < room / 8);
    }
}
