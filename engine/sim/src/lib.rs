//! A simulated Kubernetes API server for one resource, for kcache's tests and the load
//! generator; not part of kcache's library, which only defines the
//! [`ListerWatcher`](kcache::informer::ListerWatcher) a real or simulated server implements.
//!
//! - [`apiserver`]: the server's state machine: the current objects, a resource version every
//!   write increments, a bounded window of recent events and its `410 Expired`, paged lists
//!   over snapshots, the watch fan-out. `loadgen serve` puts it behind HTTP.
//! - [`MemoryListerWatcher`]: the same server as an in-process `ListerWatcher` of typed
//!   objects, with scripted failures (watches ended, 410s, refused lists and watches, an
//!   outage, latency), so that tests can drive an informer through what it must survive.
//!
//! | layer | modules | what they do |
//! |---|---|---|
//! | 0 | `crate` | the poison-ignoring lock helpers |
//! | 1 | [`apiserver`] | the state machine |
//! | 2 | `memory` | the in-process `ListerWatcher` over it |

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub mod apiserver;
mod memory;

pub use memory::{MemoryListerWatcher, Writes, DEFAULT_WINDOW};

/// Locks `mutex`, ignoring poisoning: the server's critical sections call no user code, so a
/// panic elsewhere never leaves its state half-written.
pub(crate) fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes `lock` shared, ignoring poisoning (see [`lock`]).
pub(crate) fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

/// Takes `lock` exclusive, ignoring poisoning (see [`lock`]).
pub(crate) fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}
