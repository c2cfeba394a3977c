//! The synchronisation shim: kcache's own concurrency code imports its atomics, locks and
//! condition variables from here, so that loom can model it.
//!
//! Built normally, these are std's types. Built with `RUSTFLAGS="--cfg kcache_loom"`, they are
//! loom's, and the loom tests in `engine/tests/loom.rs` explore every interleaving of the shard
//! queue hand-off, the consumer wake-ups, per-key exclusivity and close. A project-specific cfg
//! (rather than plain `cfg(loom)`) keeps other crates in the graph that also know `cfg(loom)` —
//! crossbeam, for one — from switching to loom types that this model never drives.
//!
//! Objects are still shared with `std::sync::Arc`: they are user data, not synchronisation.

#[cfg(kcache_loom)]
pub(crate) use loom::sync::{
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// Thread parking, for the workqueue's blocking `get` (see `workqueue/waiters.rs`).
#[cfg(kcache_loom)]
pub(crate) use loom::thread::{current as current_thread, park, Thread};

#[cfg(not(kcache_loom))]
pub(crate) use std::thread::{current as current_thread, park, Thread};

#[cfg(not(kcache_loom))]
pub(crate) use std::sync::{
    atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// Locks `mutex`, ignoring poisoning: kcache's critical sections leave the protected state
/// consistent at every point where user code (which may panic) can run, so a poisoned lock
/// still guards valid state.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Takes `lock` shared, ignoring poisoning (see [`lock`] for why that is sound here).
pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    match lock.read() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Takes `lock` exclusive, ignoring poisoning (see [`lock`] for why that is sound here).
pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    match lock.write() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}
