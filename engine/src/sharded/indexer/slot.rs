//! [`Slot`]: the cell holding one key's current object, which readers borrow under an epoch
//! guard instead of taking a reference count.
//!
//! A slot owns one strong count of the object it publishes. A writer that replaces the object
//! (or drops the slot) does not release that count itself: it hands the release to
//! `crossbeam-epoch` (`Guard::defer_unchecked`), which runs it only once every thread that was
//! pinned at that moment has unpinned. A reader pinned before the swap may therefore keep
//! using the old object, by plain reference, until its guard goes.
//!
//! Reading writes no shared memory: `load` is one `Acquire` load of the slot's pointer. (The
//! pin that protects it writes the pinning thread's own epoch record; see the indexer's
//! module docs for everything a read writes.)

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

use crossbeam_epoch::Guard;

use crate::key::Key;

/// A shared slot: the items map and every index set that names the key hold one. Counted
/// without a weak count (`triomphe`), which nothing here uses: 8 bytes of count and the
/// slot's 32 make a 40-byte allocation where `std::sync::Arc`'s two counts made 48, one per
/// stored key.
pub(super) type SlotRef<T> = triomphe::Arc<Slot<T>>;

/// One key's current object, published as the pointer of an `Arc` the slot holds a strong
/// count of (never null), and the key itself: the index sets hold slots alone and find a
/// member's key here.
///
/// `T: Send + Sync + 'static` because the count is released later, on whichever thread runs
/// the epoch's deferred functions.
pub(super) struct Slot<T: Send + Sync + 'static> {
    obj: AtomicPtr<T>,
    key: Key,
}

impl<T: Send + Sync + 'static> Slot<T> {
    /// A slot of `key` publishing `obj` (it takes over `obj`'s strong count).
    pub(super) fn new(key: Key, obj: Arc<T>) -> Self {
        Self {
            obj: AtomicPtr::new(Arc::into_raw(obj).cast_mut()),
            key,
        }
    }

    /// The key whose object this slot holds; it never changes.
    pub(super) fn key(&self) -> &Key {
        &self.key
    }

    /// The current object, borrowed for as long as `guard` stays pinned.
    pub(super) fn load<'g>(&self, _guard: &'g Guard) -> &'g T {
        // Acquire pairs with the Release of `replace`'s swap: the object's contents, written
        // before it was published, are visible here. (A new slot reaches readers through a
        // map's lock, which orders its initial pointer.)
        let ptr = self.obj.load(Ordering::Acquire);
        // Safety: `ptr` came from `Arc::into_raw` and the slot held a strong count of it when
        // it was loaded. That count is released only by a function deferred through the
        // epoch *after* the pointer was swapped out of the slot (`replace`) or the slot was
        // dropped (`drop`), and the epoch runs a deferred function only once every guard that
        // was pinned when it was deferred has unpinned. `guard` was pinned before this load,
        // hence before any such deferral of `ptr`, and the returned borrow cannot outlive it.
        unsafe { &*ptr }
    }

    /// The current object as an owned `Arc` (one reference-count increment).
    pub(super) fn load_arc(&self, guard: &Guard) -> Arc<T> {
        // Safety: the object is borrowed from this slot under `guard`, pinned for the call.
        unsafe { share(self.load(guard)) }
    }

    /// Calls `f` with the current object as an `Arc` borrowed for the call, without touching
    /// its reference count (`f` may clone it, which counts as usual).
    pub(super) fn with_arc<R>(&self, guard: &Guard, f: impl FnOnce(&Arc<T>) -> R) -> R {
        let ptr: *const T = self.load(guard);
        // Safety: `ptr` came from `Arc::into_raw` and its allocation stays alive while `guard`
        // is pinned (see `load`), with a strong count of at least one that the slot owns. The
        // `Arc` rebuilt here is never dropped (`ManuallyDrop`), so it releases nothing: it only
        // lends that count to `f` for the call, which the borrow cannot outlive.
        let obj = ManuallyDrop::new(unsafe { Arc::from_raw(ptr) });
        f(&obj)
    }

    /// Asks the CPU for the current object's memory (a hint: the pointer is read, the object
    /// is not).
    pub(super) fn prefetch_object(&self) {
        // Relaxed: the pointer is never dereferenced here, so nothing it points to needs to be
        // visible; a stale pointer only makes the hint useless.
        crate::sharded::prefetch::value(self.obj.load(Ordering::Relaxed).cast_const());
    }

    /// Publishes `obj` and returns the object it replaces.
    ///
    /// Callers of one slot must not overlap: the indexer replaces a key's object only while
    /// holding that key's items-shard entry, and its writers' gate keeps two states that share
    /// slots (`add_indexers` builds one from the other) from being written at once.
    pub(super) fn replace(&self, obj: Arc<T>, guard: &Guard) -> Arc<T> {
        // A load and a store, not a swap: writers of one slot never overlap (above), so
        // nothing can change the pointer between the two, and a plain store spares the
        // read-modify-write's wait for this thread's earlier stores. Relaxed load: the
        // previous replace of this slot happened under the same entry lock, which orders it
        // (and the old object's contents) before us. Release store: pairs with `load`'s
        // Acquire, so a reader that sees the new pointer sees the new object's contents.
        let old = self.obj.load(Ordering::Relaxed);
        self.obj
            .store(Arc::into_raw(obj).cast_mut(), Ordering::Release);
        // Safety: `old` is alive and was published by this slot: the slot's strong count of it
        // is released just below, and only through the epoch, which waits at least for
        // `guard` (pinned now) to unpin.
        let previous = unsafe { share(&*old) };
        retire(old, guard);
        previous
    }
}

impl<T: Send + Sync + 'static> Drop for Slot<T> {
    /// Hands the slot's strong count to the epoch: a reader pinned before the slot was
    /// unlinked may still be reading the object.
    fn drop(&mut self) {
        retire(*self.obj.get_mut(), &crossbeam_epoch::pin());
    }
}

/// An owned `Arc` of `obj`.
///
/// # Safety
///
/// `obj` must have been borrowed from a slot (`load`, or the pointer `replace` swaps out)
/// under a guard that is still pinned.
unsafe fn share<T>(obj: &T) -> Arc<T> {
    let ptr: *const T = obj;
    // Safety: such an `obj` points into an `Arc` allocation (made by `Arc::into_raw` in `new`
    // or `replace`) whose strong count the slot still holds, or whose release is deferred
    // until the guard unpins (see `load`): the count is at least one, so incrementing it and
    // taking ownership of the increment is sound.
    unsafe {
        Arc::increment_strong_count(ptr);
        Arc::from_raw(ptr)
    }
}

/// Releases the slot's strong count of `ptr` once no thread pinned now can still read it.
fn retire<T: Send + Sync + 'static>(ptr: *mut T, guard: &Guard) {
    let ptr = ptr.cast_const();
    // Safety: `ptr` owns one strong count (it came from `Arc::into_raw` and is no longer
    // published by any slot), released exactly once, by this deferred function. `T` is `Send
    // + Sync + 'static`, so dropping the `Arc` on another thread, at any later time, is sound.
    unsafe {
        guard.defer_unchecked(move || drop(Arc::from_raw(ptr)));
    }
}
