//! Asking the CPU for the objects of the keys a consumer will apply next.
//!
//! A consumer takes up to a batch of keys from one shard and applies them one after another.
//! In a large cache each key's new object was made (decoded, generated) a while before it is
//! popped and has left the CPU caches, so the consumer's first read of it stalls for a memory
//! access, and so does the next key's, one after the other. The batch is known in advance:
//! while key `i` is applied, [`objects`] asks for the objects of key `i + AHEAD`, so their
//! misses overlap the work instead of following it. A hint only: nothing waits for it and
//! nothing changes if it is dropped.

use std::mem::size_of;
use std::sync::Arc;

use crate::delta::{DeltaObject, Deltas};

/// How many keys ahead of the one being applied to prefetch: far enough that a memory access
/// (~100 ns) completes while the keys in between are applied (a few hundred ns each), near
/// enough that the lines are still cached when their turn comes.
pub(super) const AHEAD: usize = 2;

/// Prefetches the objects of `deltas`' newest two deltas (what a consumer reads first: the
/// object it stores and, coalescing, the one before): the cache lines of each one's first and
/// last byte (all of it for objects of up to 64 bytes, the head and tail of larger ones).
pub(super) fn objects<T>(deltas: &Deltas<T>) {
    for delta in deltas.iter().rev().take(2) {
        if let DeltaObject::Object(obj) = &delta.object {
            let start = Arc::as_ptr(obj).cast::<u8>();
            line(start);
            if size_of::<T>() > 1 {
                // wrapping_add: only an address is computed, never dereferenced here.
                line(start.wrapping_add(size_of::<T>() - 1));
            }
        }
    }
}

/// Asks for the cache line holding `addr`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[allow(unsafe_code, unused_unsafe)]
fn line(addr: *const u8) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    // Safety: PREFETCHT0 is a hint: it never faults, whatever the address, and changes neither
    // memory nor program state. It is an SSE instruction, part of the x86_64 baseline, so
    // every x86_64 CPU has it. (`unused_unsafe`: newer compilers call it safe.)
    unsafe { _mm_prefetch::<_MM_HINT_T0>(addr.cast::<i8>()) }
}

/// Other architectures: no prefetch (std has no stable portable one).
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn line(_addr: *const u8) {}
