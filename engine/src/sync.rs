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
    atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering},
    Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// Thread parking, for the workqueue's blocking `get` (see `workqueue/waiters.rs`).
#[cfg(kcache_loom)]
pub(crate) use loom::thread::{current as current_thread, park, Thread};

#[cfg(not(kcache_loom))]
pub(crate) use std::thread::{current as current_thread, park, Thread};

#[cfg(not(kcache_loom))]
pub(crate) use std::sync::{
    atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering},
    Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard,
};

/// Locks `mutex`, ignoring poisoning: kcache's critical sections leave the protected state
/// consistent at every point where user code (which may panic) can run, so a poisoned lock
/// still guards valid state.
///
/// Generic over [`Lockable`] so that the one helper serves both the shim's mutex (loom's under
/// `kcache_loom`) and std's, which the modules loom does not model use directly.
pub(crate) fn lock<L: Lockable + ?Sized>(mutex: &L) -> L::Guard<'_> {
    mutex.lock_ignoring_poison()
}

/// Takes `lock` shared, ignoring poisoning (see [`lock`] for why that is sound here).
pub(crate) fn read<L: ReadWriteLockable + ?Sized>(lock: &L) -> L::Read<'_> {
    lock.read_ignoring_poison()
}

/// Takes `lock` exclusive, ignoring poisoning (see [`lock`] for why that is sound here).
pub(crate) fn write<L: ReadWriteLockable + ?Sized>(lock: &L) -> L::Write<'_> {
    lock.write_ignoring_poison()
}

/// Waits on `condvar`, giving back `guard` relocked, ignoring poisoning (see [`lock`]).
pub(crate) fn wait<'a, C: Waitable, T>(condvar: &C, guard: C::Guard<'a, T>) -> C::Guard<'a, T> {
    condvar.wait_ignoring_poison(guard)
}

/// Waits on `condvar` for at most `timeout`, ignoring poisoning (see [`lock`]); whether the
/// wait timed out is for the caller to judge from its own deadline.
pub(crate) fn wait_timeout<'a, C: Waitable, T>(
    condvar: &C,
    guard: C::Guard<'a, T>,
    timeout: std::time::Duration,
) -> C::Guard<'a, T> {
    condvar.wait_timeout_ignoring_poison(guard, timeout)
}

/// A mutex [`lock`] can take: std's, and loom's when the crate is built for loom.
pub(crate) trait Lockable {
    type Guard<'a>
    where
        Self: 'a;
    fn lock_ignoring_poison(&self) -> Self::Guard<'_>;
}

/// A read-write lock [`read`] and [`write`] can take: std's, and loom's under loom.
pub(crate) trait ReadWriteLockable {
    type Read<'a>
    where
        Self: 'a;
    type Write<'a>
    where
        Self: 'a;
    fn read_ignoring_poison(&self) -> Self::Read<'_>;
    fn write_ignoring_poison(&self) -> Self::Write<'_>;
}

/// A condition variable [`wait`] and [`wait_timeout`] can wait on: std's, and loom's under loom.
pub(crate) trait Waitable {
    type Guard<'a, T: 'a>;
    fn wait_ignoring_poison<'a, T>(&self, guard: Self::Guard<'a, T>) -> Self::Guard<'a, T>;
    fn wait_timeout_ignoring_poison<'a, T>(
        &self,
        guard: Self::Guard<'a, T>,
        timeout: std::time::Duration,
    ) -> Self::Guard<'a, T>;
}

/// Implements the two traits for one family of lock types (std's, loom's): their `lock`,
/// `read` and `write` all return a `LockResult` whose error still holds the guard.
macro_rules! ignore_poison_for {
    ($module:path) => {
        const _: () = {
            use $module as family;

            impl<T: ?Sized> Lockable for family::Mutex<T> {
                type Guard<'a>
                    = family::MutexGuard<'a, T>
                where
                    Self: 'a;
                fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
                    self.lock().unwrap_or_else(|e| e.into_inner())
                }
            }

            impl<T: ?Sized> ReadWriteLockable for family::RwLock<T> {
                type Read<'a>
                    = family::RwLockReadGuard<'a, T>
                where
                    Self: 'a;
                type Write<'a>
                    = family::RwLockWriteGuard<'a, T>
                where
                    Self: 'a;
                fn read_ignoring_poison(&self) -> Self::Read<'_> {
                    self.read().unwrap_or_else(|e| e.into_inner())
                }
                fn write_ignoring_poison(&self) -> Self::Write<'_> {
                    self.write().unwrap_or_else(|e| e.into_inner())
                }
            }

            impl Waitable for family::Condvar {
                type Guard<'a, T: 'a> = family::MutexGuard<'a, T>;
                fn wait_ignoring_poison<'a, T>(
                    &self,
                    guard: Self::Guard<'a, T>,
                ) -> Self::Guard<'a, T> {
                    self.wait(guard).unwrap_or_else(|e| e.into_inner())
                }
                fn wait_timeout_ignoring_poison<'a, T>(
                    &self,
                    guard: Self::Guard<'a, T>,
                    timeout: std::time::Duration,
                ) -> Self::Guard<'a, T> {
                    match self.wait_timeout(guard, timeout) {
                        Ok((guard, _)) => guard,
                        Err(poisoned) => poisoned.into_inner().0,
                    }
                }
            }
        };
    };
}

ignore_poison_for!(std::sync);

/// A lock behind an `Arc` is taken through it, as method calls would auto-deref.
impl<L: Lockable + ?Sized> Lockable for std::sync::Arc<L> {
    type Guard<'a>
        = L::Guard<'a>
    where
        Self: 'a;
    fn lock_ignoring_poison(&self) -> Self::Guard<'_> {
        (**self).lock_ignoring_poison()
    }
}

impl<L: ReadWriteLockable + ?Sized> ReadWriteLockable for std::sync::Arc<L> {
    type Read<'a>
        = L::Read<'a>
    where
        Self: 'a;
    type Write<'a>
        = L::Write<'a>
    where
        Self: 'a;
    fn read_ignoring_poison(&self) -> Self::Read<'_> {
        (**self).read_ignoring_poison()
    }
    fn write_ignoring_poison(&self) -> Self::Write<'_> {
        (**self).write_ignoring_poison()
    }
}
#[cfg(kcache_loom)]
ignore_poison_for!(loom::sync);

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
