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

/// Locks `mutex` like [`lock`], but tries for a while before it sleeps: a few microseconds of
/// spinning with exponential backoff, then a few yields (`crossbeam_utils::Backoff`), then up
/// to [`PATIENT_YIELDS`] more yields, each followed by a try, and only then the blocking lock.
///
/// For a lock held for microseconds by a thread running on another core: the sharded queue's
/// consumer holds a shard for the few microseconds of taking a part of a batch, longer than
/// std's mutex spins, and a producer that meets it would otherwise sleep in the kernel and be
/// woken by a system call of the consumer's, thousands of times a second, each costing the
/// producer far more than the wait itself. Yielding rather than spinning for the last part
/// also lets the holder run when the threads outnumber the cores.
#[cfg(not(kcache_loom))]
pub(crate) fn lock_patiently<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    let try_lock = || match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    };
    let backoff = crossbeam_utils::Backoff::new();
    while !backoff.is_completed() {
        if let Some(guard) = try_lock() {
            return guard;
        }
        backoff.snooze();
    }
    for _ in 0..PATIENT_YIELDS {
        std::thread::yield_now();
        if let Some(guard) = try_lock() {
            return guard;
        }
    }
    lock(mutex)
}

/// How many times [`lock_patiently`] yields and tries again after its backoff. Measured on W1
/// flat out (`perf record -e syscalls:sys_enter_futex`, three runs each): the producer slept
/// on a shard lock 9,200-11,100 times a run with std's lock alone, 7,500-8,900 after the
/// backoff alone, 4,400-5,200 with these yields too.
#[cfg(not(kcache_loom))]
const PATIENT_YIELDS: usize = 64;

/// Under loom, the plain lock: a spin would only multiply the interleavings to explore.
#[cfg(kcache_loom)]
pub(crate) fn lock_patiently<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    lock(mutex)
}

#[cfg(all(test, not(kcache_loom)))]
mod tests {
    use std::sync::{Arc, Barrier};
    use std::thread;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_patient_lock_waits_out_short_and_long_holds_alike() {
        let counter = Arc::new(Mutex::new(0u64));
        // A free lock is taken at once.
        *lock_patiently(&counter) += 1;
        // Holds of a few microseconds (met while spinning or yielding) and of milliseconds (met
        // only by the blocking lock): every increment lands, none is lost to a race.
        for hold in [Duration::from_micros(5), Duration::from_millis(3)] {
            let start = Arc::new(Barrier::new(2));
            let holder = {
                let (counter, start) = (Arc::clone(&counter), Arc::clone(&start));
                thread::spawn(move || {
                    let mut guard = lock(&counter);
                    start.wait();
                    thread::sleep(hold);
                    *guard += 1;
                })
            };
            start.wait();
            *lock_patiently(&counter) += 1;
            holder.join().unwrap();
        }
        assert_eq!(*lock(&counter), 5);
    }

    #[test]
    fn a_patient_lock_ignores_poisoning_like_lock() {
        let value = Arc::new(Mutex::new(7));
        let poisoner = Arc::clone(&value);
        let panicked = thread::spawn(move || {
            let _guard = lock(&poisoner);
            panic!("poison the lock");
        })
        .join();
        assert!(panicked.is_err());
        assert!(value.is_poisoned());
        assert_eq!(*lock_patiently(&value), 7);
    }
}
