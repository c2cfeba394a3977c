//! The global allocator's own figures: how many bytes it has committed, for the memory a
//! client's cache holds per object (`loadgen e2e`'s "B/pod").
//!
//! Peak resident memory counts everything the process ever touched (the initial list's
//! buffers, freed pages the allocator still holds); the bytes the allocator has committed just
//! after a client synced, less those before it started, are what its cache holds, with the
//! allocator's own overhead. mimalloc reports them (`mi_process_info`); with the system
//! allocator (`--no-default-features`) there is no such figure and the reports say `n/a`.
//!
//! # Why there is `unsafe` here
//!
//! `mi_process_info` is a C function: calling it is `unsafe`. It is the one call in loadgen
//! that needs it, allowed locally below (the crate denies `unsafe_code` everywhere else).

/// Bytes the allocator has committed now; `None` without mimalloc.
pub fn committed_bytes() -> Option<u64> {
    committed()
}

#[cfg(feature = "mimalloc")]
#[allow(unsafe_code)]
fn committed() -> Option<u64> {
    let mut figures = [0usize; 8];
    let [elapsed, user, system, rss, peak_rss, commit, peak_commit, faults] = &mut figures;
    // SAFETY: `mi_process_info` writes one `usize` through each pointer and keeps none of
    // them; each points to a distinct, live, writable `usize` of `figures`.
    unsafe {
        libmimalloc_sys::mi_process_info(
            elapsed,
            user,
            system,
            rss,
            peak_rss,
            commit,
            peak_commit,
            faults,
        );
    }
    u64::try_from(figures[5]).ok()
}

#[cfg(not(feature = "mimalloc"))]
fn committed() -> Option<u64> {
    None
}
