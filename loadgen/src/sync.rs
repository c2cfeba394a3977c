//! Locking that survives a panicked holder.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data over from a holder that panicked: what it guards here (counters,
/// records of what a client saw) stays meaningful after a panic elsewhere, and the panic itself
/// is reported where it happened.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
