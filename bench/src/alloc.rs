//! A counting global allocator: [`std::alloc::System`] with three counters beside it.
//!
//! Installed only by the binaries that measure memory (`membench`, and the test that checks
//! it), never by the library or the criterion benches, whose timings it would perturb:
//!
//! ```
//! #[global_allocator]
//! static ALLOC: bench::alloc::CountingAlloc = bench::alloc::CountingAlloc::new();
//!
//! fn main() {
//!     let baseline = ALLOC.reset_peak();
//!     let buffer = vec![0u8; 1 << 20];
//!     drop(buffer);
//!     let after = ALLOC.stats();
//!     assert!(after.peak >= baseline.current + (1 << 20));
//!     assert!(after.allocations > baseline.allocations);
//! }
//! ```
//!
//! It tracks the bytes currently allocated, the highest value that ever reached (resettable, so
//! a run can measure its own peak above a baseline), and how many allocations were made. Every
//! counter is a `Relaxed` atomic: each is an independent tally, nothing else is published
//! through them, and a reader only needs a value that was true at some moment.
//!
//! # Why there is `unsafe` here
//!
//! The bench crate denies `unsafe_code`. `GlobalAlloc` is an `unsafe trait`: implementing it
//! is the one thing in the crate that cannot be written without `unsafe`. The impl below is
//! allowed locally and only forwards every call unchanged to `System`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// What a [`CountingAlloc`] has counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct AllocStats {
    /// Bytes allocated and not yet freed.
    pub current: usize,
    /// The highest `current` since the start or the last [`CountingAlloc::reset_peak`].
    pub peak: usize,
    /// Allocations made so far (`alloc`, `alloc_zeroed` and `realloc` each count one).
    pub allocations: u64,
    /// Bytes requested so far, over all allocations (a `realloc` counts its new size).
    pub allocated_bytes: u64,
}

/// [`System`], counting as it goes: see the [module docs](self).
///
/// ```
/// use bench::alloc::CountingAlloc;
/// // Not installed as the global allocator here, so it counts nothing.
/// let counter = CountingAlloc::new();
/// assert_eq!(counter.stats().allocations, 0);
/// ```
#[derive(Debug)]
pub struct CountingAlloc {
    current: AtomicUsize,
    peak: AtomicUsize,
    allocations: AtomicU64,
    allocated_bytes: AtomicU64,
}

impl CountingAlloc {
    /// A counter at zero, usable in a `static`.
    pub const fn new() -> Self {
        Self {
            current: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            allocations: AtomicU64::new(0),
            allocated_bytes: AtomicU64::new(0),
        }
    }

    /// The counters now.
    pub fn stats(&self) -> AllocStats {
        AllocStats {
            current: self.current.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
            allocations: self.allocations.load(Ordering::Relaxed),
            allocated_bytes: self.allocated_bytes.load(Ordering::Relaxed),
        }
    }

    /// Lowers the peak to what is allocated now, and returns the counters after the reset:
    /// the baseline a measurement subtracts.
    pub fn reset_peak(&self) -> AllocStats {
        self.peak
            .store(self.current.load(Ordering::Relaxed), Ordering::Relaxed);
        self.stats()
    }

    fn grew(&self, size: usize) {
        self.allocations.fetch_add(1, Ordering::Relaxed);
        self.allocated_bytes
            .fetch_add(size as u64, Ordering::Relaxed);
        let now = self.current.fetch_add(size, Ordering::Relaxed) + size;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn shrank(&self, size: usize) {
        self.current.fetch_sub(size, Ordering::Relaxed);
    }
}

impl Default for CountingAlloc {
    fn default() -> Self {
        Self::new()
    }
}

// Safety: every method forwards its arguments unchanged to `System`, which upholds
// `GlobalAlloc`'s contract, and returns `System`'s result unchanged; the counting around it
// allocates nothing (atomics only), so it cannot recurse into the allocator.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // Safety: our caller upholds `alloc`'s contract for `layout`; we pass it on as is.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            self.grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // Safety: as in `alloc`.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            self.grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Safety: `ptr` was allocated by this allocator, i.e. by `System`, with `layout`
        // (our caller's contract); we pass both on as is.
        unsafe { System.dealloc(ptr, layout) };
        self.shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // Safety: `ptr` was allocated by `System` with `layout`, and `new_size` is valid for
        // it (our caller's contract); we pass all three on as is.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Counted as a fresh allocation of `new_size` and a free of the old block. The
            // momentary overlap while `System` copies is not counted: it depends on the
            // allocator, not on the program being measured.
            self.shrank(layout.size());
            self.grew(new_size);
        }
        new
    }
}
