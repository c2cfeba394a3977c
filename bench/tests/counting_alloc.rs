//! The counting allocator, installed as this test binary's global allocator: what `membench`
//! reports rests on these counts.

use std::hint::black_box;

use bench::alloc::CountingAlloc;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// One test function on purpose: the counters are process-wide, and parallel tests would
/// allocate into each other's measurements.
#[test]
fn counts_current_peak_and_allocations_and_resets_the_peak() {
    const MIB: usize = 1 << 20;

    // A block shows up in `current` and `peak` while it lives, and leaves `current` when freed.
    let baseline = ALLOC.reset_peak();
    assert_eq!(baseline.peak, baseline.current);
    let block = black_box(vec![1u8; 4 * MIB]);
    let live = ALLOC.stats();
    assert!(live.current >= baseline.current + 4 * MIB);
    assert!(live.allocations > baseline.allocations);
    assert!(live.allocated_bytes >= baseline.allocated_bytes + 4 * MIB as u64);
    drop(block);
    let freed = ALLOC.stats();
    assert!(
        freed.current < baseline.current + MIB,
        "{freed:?} vs {baseline:?}"
    );
    assert!(
        freed.peak >= baseline.current + 4 * MIB,
        "the peak remembers the block"
    );

    // After a reset the peak is what is allocated now, not the old high-water mark.
    let reset = ALLOC.reset_peak();
    assert!(reset.peak < baseline.current + MIB);

    // `realloc` moves `current` by the size difference and counts as one allocation.
    let mut grown: Vec<u8> = Vec::with_capacity(MIB);
    black_box(&mut grown);
    let before_grow = ALLOC.stats();
    grown.reserve_exact(3 * MIB);
    black_box(&mut grown);
    let after_grow = ALLOC.stats();
    assert!(after_grow.current >= before_grow.current + 2 * MIB);
    assert!(after_grow.allocations > before_grow.allocations);
    drop(grown);

    // `alloc_zeroed` (what `vec![0; n]` uses) is counted too.
    let before_zeroed = ALLOC.stats();
    let zeroed = black_box(vec![0u64; MIB]);
    assert!(ALLOC.stats().current >= before_zeroed.current + 8 * MIB);
    drop(zeroed);
}
