//! Staggered growth: many hash tables that fill at the same rate must not all double at once.
//!
//! A hash table doubles when it is 7/8 full, and a doubling moves every entry. The sharded
//! engine splits one logical table into many that fill in lockstep: the 64 items shards of the
//! indexer (keys spread evenly by hash), the sets of an index's values (an informer's initial
//! list walks namespaces round-robin), the queue's shards. Left alone they all cross 7/8 within
//! a few thousand inserts of each other, and the consumer that happens to insert then rehashes
//! the whole logical table, tens of milliseconds at a million keys, while events queue up
//! behind it. (One big table, the reference's, stops once for the same time.)
//!
//! [`Growing::ahead`] (and the indexer's items shards) let each table double a little early,
//! by an amount picked from a per-table `salt` (its shard index or its value's hash): between
//! 0 and 1/8 of its capacity before it is full. The doublings of a set of lockstep tables are
//! then spread over the last eighth of each doubling interval instead of a few thousand
//! inserts, so at any moment at most a few of them rehash. The total work is the same; the
//! tables are on average about 1/16 emptier.
//!
//! Small tables are staggered too: one set of 224 keys doubles in microseconds, but the 5,000
//! `node` sets of a million pods cross 224 together, and rehashing all of them at once (1.1M
//! entries, 64 MiB of fresh tables) stopped the consumer for 40–70 ms. Only tables too small
//! for an eighth to be an entry (capacities 3, 7 and 14) double when full.
//!
//! Removals leave tombstones, which lower what `capacity()` reports (entries plus the room left
//! before the next rehash). A table whose live entries would fit in half its buckets is then
//! rehashed in place by hashbrown, not doubled, so it is left alone: growing it early would
//! double a table that never needed it.
//!
//! Why an eighth and not more: a table that doubles early holds twice the room for the rest of
//! its interval, and lockstep tables all end a load at about the same fill. With a quarter, a
//! load that ends in the last quarter of an interval left up to all of them doubled (4M keys:
//! the 5,000 `node` sets of 800 keys each sat in 2,048 buckets instead of 1,024, 65 bytes per
//! key instead of 42); an eighth halves that exposure and still spreads the 64 items shards'
//! doublings at 4M keys some 7,000 inserts apart.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hash};

/// Up to `capacity >> EARLY_SHIFT` entries early (an eighth).
const EARLY_SHIFT: u32 = 3;

/// The fill at which a table of `capacity` salted with `salt` doubles, one insert before the
/// table itself would.
fn threshold(capacity: usize, salt: u64) -> usize {
    // The salt's top byte (spread well by a multiplication) picks the fraction, in 256ths of an
    // eighth of the capacity.
    let byte = (salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize;
    capacity - (((capacity >> EARLY_SHIFT) * byte) >> 8)
}

/// hashbrown's capacity for `buckets` buckets: all but one below eight, seven eighths above.
pub(crate) fn capacity_of_buckets(buckets: usize) -> usize {
    if buckets < 8 {
        buckets.saturating_sub(1)
    } else {
        buckets / 8 * 7
    }
}

/// Whether a table holding `len` entries, reporting `capacity` (entries plus the room left
/// before its next rehash) out of `full` (its room without tombstones), salted with `salt`,
/// should double before its next insert: it is at its staggered fill, and one more entry would
/// not fit in half its buckets (below that, hashbrown rehashes in place instead of doubling).
pub(crate) fn due(len: usize, capacity: usize, full: usize, salt: u64) -> bool {
    len < capacity && len >= threshold(capacity, salt) && 2 * (len + 1) > full
}

/// A hash table [`Growing`] can grow: std's maps and sets.
pub(crate) trait Table {
    fn len(&self) -> usize;
    fn capacity(&self) -> usize;
    fn reserve(&mut self, additional: usize);
}

/// `Table` for `$table`, by its own `len`, `capacity` and `reserve`.
macro_rules! table {
    (impl<$($param:ident),*> for $table:ty) => {
        impl<K: Eq + Hash, $($param,)* S: BuildHasher> Table for $table {
            fn len(&self) -> usize {
                <$table>::len(self)
            }
            fn capacity(&self) -> usize {
                <$table>::capacity(self)
            }
            fn reserve(&mut self, additional: usize) {
                <$table>::reserve(self, additional);
            }
        }
    };
}

table!(impl<V> for HashMap<K, V, S>);
table!(impl<V> for hashbrown::HashMap<K, V, S>);
table!(impl<> for HashSet<K, S>);

/// A std or hashbrown map or set that doubles at its staggered fill ([`ahead`](Self::ahead)).
/// It remembers its room without tombstones, which std does not report: `capacity()` is the
/// entries plus the room left before the next rehash, and removals lower it, so the most it
/// has reported is the room of the table's current buckets (a table only ever grows here; one
/// that is replaced is wrapped anew).
#[derive(Debug, Default)]
pub(crate) struct Growing<M> {
    table: M,
    full: usize,
}

impl<M: Table> Growing<M> {
    pub(crate) fn new(table: M) -> Self {
        let full = table.capacity();
        Self { table, full }
    }

    /// Doubles the table now if it is at its staggered fill (see the module docs); call it
    /// before an insert that may add an entry.
    pub(crate) fn ahead(&mut self, salt: u64) {
        let (len, capacity) = (self.table.len(), self.table.capacity());
        self.full = self.full.max(capacity);
        if due(len, capacity, self.full, salt) {
            // One more than the capacity: the table doubles, as it would have on a later insert.
            self.table.reserve(capacity - len + 1);
            self.full = self.table.capacity();
        }
    }
}

impl<M> std::ops::Deref for Growing<M> {
    type Target = M;
    fn deref(&self) -> &M {
        &self.table
    }
}

impl<M> std::ops::DerefMut for Growing<M> {
    fn deref_mut(&mut self) -> &mut M {
        &mut self.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::{Key, KeyMap};

    #[test]
    fn an_indexer_grown_past_the_staggered_sizes_keeps_items_and_indices_agreeing() {
        use std::sync::Arc;

        use crate::store::{IndexFunc, Indexer as _, KnownObjects as _, Store as _};
        use crate::KeyFn;

        // 40,000 keys: every items shard (64) and every value's set (50) grows past 256 entries
        // and doubles early at least once.
        let key_fn: KeyFn<u32> = Arc::new(|n: &u32| Ok(Key::new(&format!("k{n}"))));
        let by_mod: IndexFunc<u32> =
            Arc::new(|n: &u32| [Key::new(&format!("m{}", n % 50))].into_iter().collect());
        let store = super::super::IndexedStore::new(key_fn, vec![("mod".to_string(), by_mod)]);
        for n in 0..40_000u32 {
            store.add(Arc::new(n)).unwrap();
        }
        for n in (0..40_000u32).step_by(2) {
            store.delete(&n).unwrap();
        }
        assert_eq!(store.len(), 20_000);
        for m in [1u32, 7, 49] {
            let keys = store.index_keys("mod", &format!("m{m}")).unwrap();
            // n % 50 odd means n odd: none of those was deleted.
            assert_eq!(keys.len(), 800, "n % 50 == {m}");
            assert!(keys
                .iter()
                .all(|k| store.get_by_key(k).is_some_and(|n| *n % 50 == m)));
        }
        assert!(store.index_keys("mod", "m2").unwrap().is_empty());
    }

    #[test]
    fn tiny_tables_and_full_tables_are_left_to_the_table() {
        assert!((0..1000u64)
            .all(|salt| !due(2, 3, 3, salt) && !due(6, 7, 7, salt) && !due(13, 14, 14, salt)));
        assert!(
            !due(3584, 3584, 3584, 7),
            "a full table grows on its own insert"
        );
    }

    #[test]
    fn bucket_capacities_are_hashbrowns() {
        for (buckets, capacity) in [(0, 0), (1, 0), (4, 3), (8, 7), (16, 14), (256, 224)] {
            assert_eq!(capacity_of_buckets(buckets), capacity, "{buckets} buckets");
        }
        for n in [1usize, 10, 100, 1000, 5000] {
            let map: HashMap<u32, ()> = HashMap::with_capacity(n);
            let buckets = (map.capacity() + 1).next_power_of_two();
            assert_eq!(capacity_of_buckets(buckets), map.capacity(), "{n}");
        }
    }

    #[test]
    fn churn_with_tombstones_does_not_double_a_half_empty_table() {
        // A 256-bucket table (room for 224) holding 100–110 keys under remove + insert churn:
        // its tombstones lower `capacity()` toward `len`, and hashbrown would rehash it in
        // place. Growing early must not double it.
        for live in [100u32, 105, 110] {
            for salt in 0..32u64 {
                let mut table = Growing::new(HashMap::<u32, ()>::with_capacity(224));
                table.extend((0..live).map(|k| (k, ())));
                for round in 0..3_000u32 {
                    table.remove(&round);
                    table.ahead(salt.wrapping_mul(0x2545_f491_4f6c_dd1d));
                    table.insert(round + live, ());
                }
                assert_eq!(table.len(), live as usize);
                assert!(
                    table.capacity() <= 224,
                    "{live} keys, salt {salt}: {}",
                    table.capacity()
                );
            }
        }
    }

    #[test]
    fn many_small_lockstep_tables_double_over_many_rounds() {
        // 1,000 sets filled round-robin, as an index's value sets are by an initial list: the
        // rounds at which they double from 224 entries (256 buckets) to more.
        let mut tables: Vec<Growing<HashMap<u32, ()>>> =
            (0..1000).map(|_| Growing::default()).collect();
        let mut doublings_per_round = vec![0usize; 240];
        for (round, doublings) in doublings_per_round.iter_mut().enumerate() {
            for (salt, table) in tables.iter_mut().enumerate() {
                let before = table.capacity();
                table.ahead((salt as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
                table.insert(round as u32, ());
                if before == 224 && table.capacity() > before {
                    *doublings += 1;
                }
            }
        }
        assert_eq!(doublings_per_round.iter().sum::<usize>(), 1000);
        // Spread over most of the last eighth (28 rounds) instead of all in the last one.
        let busiest = *doublings_per_round.iter().max().unwrap();
        assert!(
            busiest < 150,
            "{busiest} of 1,000 sets doubled in one round"
        );
        let rounds = doublings_per_round.iter().filter(|&&d| d > 0).count();
        assert!(rounds >= 20, "doublings in {rounds} rounds");
    }

    #[test]
    fn thresholds_spread_over_the_last_eighth() {
        let capacity = 14_336;
        let fills: Vec<usize> = (0..1000u64).map(|s| threshold(capacity, s)).collect();
        let (lo, hi) = (*fills.iter().min().unwrap(), *fills.iter().max().unwrap());
        assert!(lo >= capacity - capacity / 8 && hi <= capacity);
        assert!(hi - lo > capacity / 10, "spread {lo}..{hi}");
    }

    #[test]
    fn lockstep_tables_double_at_different_inserts() {
        // 64 tables filled round-robin, as the items shards are: record at which round each
        // one doubles past 14,336 entries.
        let mut tables: Vec<Growing<KeyMap<()>>> = (0..64).map(|_| Growing::default()).collect();
        let mut doubled_at = vec![None; tables.len()];
        for round in 0..15_000usize {
            for (salt, table) in tables.iter_mut().enumerate() {
                let before = table.capacity();
                table.ahead(salt as u64);
                table.insert(Key::new(&format!("{salt}/{round}")), ());
                if before >= 14_336 && table.capacity() > before {
                    doubled_at[salt].get_or_insert(round);
                }
            }
        }
        let rounds: Vec<usize> = doubled_at
            .iter()
            .map(|r| r.expect("every table doubled"))
            .collect();
        let (first, last) = (rounds.iter().min().unwrap(), rounds.iter().max().unwrap());
        // Over most of the last eighth (1,792 rounds), not within a few rounds.
        assert!(
            last - first > 1_000,
            "doublings spread over {first}..{last}"
        );
        let mut distinct = rounds.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 48, "{} distinct rounds", distinct.len());
    }
}
