//! What an engine's structures hold on the heap, structure by structure: [`Footprint`].

use std::fmt;
use std::mem::{align_of, size_of};

/// One structure's share of a [`Footprint`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FootprintPart {
    /// What it is, e.g. `queue.pending` or `index.node.sets`.
    pub name: String,
    /// Entries it holds now (keys, deltas, set members: see the engine's documentation).
    pub entries: usize,
    /// Heap bytes it holds, capacity included.
    pub bytes: usize,
}

/// The heap bytes a queue or a store holds, per structure.
///
/// Memory measurements (`membench`) want more than one total: which of the queue's maps, the
/// indexer's tables or its index sets a byte per key goes to. Each engine's queue and store
/// report one (`footprint()`), computed from the capacities of their tables, deques and spilled
/// delta lists. The figures are the sizes the engine *requests* from the allocator (what a
/// counting allocator sees), not what the allocator rounds them up to; hash tables are sized
/// from the capacity they report, so a table whose capacity removals have eaten into is
/// counted at the power of two that capacity needs. The keys' strings and the objects are not
/// counted: every structure shares one string per key and the objects belong to the caller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Footprint {
    /// One line per structure, in the order the engine lists them.
    pub parts: Vec<FootprintPart>,
}

impl Footprint {
    /// Adds a structure's line.
    pub(crate) fn add(&mut self, name: impl Into<String>, entries: usize, bytes: usize) {
        self.parts.push(FootprintPart {
            name: name.into(),
            entries,
            bytes,
        });
    }

    /// The total of every part.
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(|part| part.bytes).sum()
    }

    /// Both footprints' parts, `self`'s first.
    pub fn merged(mut self, other: Footprint) -> Footprint {
        self.parts.extend(other.parts);
        self
    }
}

impl fmt::Display for Footprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            writeln!(
                f,
                "{:<28} {:>12} entries {:>14} B",
                part.name, part.entries, part.bytes
            )?;
        }
        Ok(())
    }
}

/// The SSE2 group width of the hashbrown tables behind std's `HashMap`: the control bytes of a
/// table are its buckets plus one group.
const GROUP_WIDTH: usize = 16;

/// Heap bytes of a hashbrown table (std's `HashMap`/`HashSet`) of entries of type `E` that
/// reports `capacity`: its buckets (the power of two that capacity needs at a 7/8 load) of
/// entries, then one control byte per bucket and one group more.
pub(crate) fn table_bytes<E>(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity * 8).div_ceil(7).next_power_of_two()
    };
    let ctrl_align = align_of::<E>().max(GROUP_WIDTH);
    (size_of::<E>() * buckets).next_multiple_of(ctrl_align) + buckets + GROUP_WIDTH
}

/// Heap bytes of a `Vec` or `VecDeque` of `capacity` elements of type `E`.
pub(crate) fn array_bytes<E>(capacity: usize) -> usize {
    size_of::<E>() * capacity
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_counted_at_its_power_of_two_of_buckets() {
        assert_eq!(table_bytes::<u64>(0), 0);
        // 3 entries fit 4 buckets: 32 bytes of entries, 4 + 16 control bytes.
        assert_eq!(table_bytes::<u64>(3), 32 + 20);
        // 14 entries fit 16 buckets at 7/8.
        assert_eq!(table_bytes::<[u8; 32]>(14), 16 * 32 + 16 + 16);
        // A capacity cut by removals still needs the same buckets.
        assert_eq!(table_bytes::<[u8; 32]>(11), table_bytes::<[u8; 32]>(14));
    }

    #[test]
    fn a_real_map_reports_a_capacity_that_maps_back_to_its_buckets() {
        let mut map = std::collections::HashMap::<u64, u64>::new();
        for n in 0..1000 {
            map.insert(n, n);
        }
        // 1000 entries need 2048 buckets at a 7/8 load (1792 fit); 16 bytes each.
        assert_eq!(map.capacity(), 1792);
        assert_eq!(
            table_bytes::<(u64, u64)>(map.capacity()),
            2048 * 16 + 2048 + 16
        );
    }

    #[test]
    fn parts_add_up_and_merge_in_order() {
        let mut a = Footprint::default();
        a.add("x", 1, 10);
        let mut b = Footprint::default();
        b.add("y", 2, 20);
        let all = a.merged(b);
        assert_eq!(all.bytes(), 30);
        let names: Vec<_> = all.parts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["x", "y"]);
        assert!(all.to_string().contains("y"));
    }
}
