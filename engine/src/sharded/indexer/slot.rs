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
//!
//! # What keeps it sound
//!
//! - A borrowed object is tied to the guard it was read under (`load` returns `&'g T` for a
//!   `&'g Guard`), as crossbeam-epoch's `Shared<'g, T>` is.
//! - The slot's pointer leaves it only as an [`Unpublished`], the one strong count the slot
//!   held, which only the slot's own swap-out ([`replace`](Slot::replace)) and its drop can
//!   make (their constructors live in a module of their own, so nothing else in this file can
//!   wrap a pointer in one), and which [`retire`](Unpublished::retire) consumes: a count is
//!   released once, by the epoch, and only after the slot stopped publishing it.
//! - [`replace`](Slot::replace) is a load and a store, not a swap: it is an `unsafe fn`
//!   whose callers promise that writers of one slot never overlap (its only caller is the
//!   indexer's `Writable`, which holds the key's items-shard entry in a state no other
//!   writer can reach at the same time).
//! - Every guard is pinned to crossbeam-epoch's default collector (`crossbeam_epoch::pin`),
//!   the one the release is deferred to; debug builds check it.

use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

use crossbeam_epoch::Guard;

use crate::key::Key;
use unpublished::Unpublished;

/// A shared slot: the items map and every index set that names the key hold one. Counted
/// without a weak count (`triomphe`), which nothing here uses: 8 bytes of count and the
/// slot's 32 make a 40-byte allocation where `std::sync::Arc`'s two counts made 48, one per
/// stored key (checked by a test below).
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
    pub(super) fn load<'g>(&self, guard: &'g Guard) -> &'g T {
        debug_assert!(super::pinned_to_default_collector(guard));
        // Acquire pairs with the Release of `replace`'s store: the object's contents, written
        // before it was published, are visible here. (A new slot reaches readers through a
        // map's lock, which orders its initial pointer.)
        let ptr = self.obj.load(Ordering::Acquire);
        // Safety: `ptr` came from `Arc::into_raw` and the slot held a strong count of it when
        // it was loaded. That count leaves the slot only as an `Unpublished`, made *after* the
        // pointer stopped being published (`replace`) or once the slot is dropped, and is
        // released only by `Unpublished::retire`, through the epoch, which runs a deferred
        // function only once every guard that was pinned when it was deferred has unpinned.
        // `guard` (of the same, default, collector) was pinned before this load, hence before
        // any such deferral of `ptr`, and the returned borrow cannot outlive it.
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
    /// # Safety
    ///
    /// Calls of `replace` on one slot must not overlap: the slot's pointer is read and then
    /// written, not swapped, so two overlapping calls would both take the same object out of
    /// the slot and release its strong count twice (and leak one of the new ones).
    ///
    /// `guard` must be pinned (to the default collector, as every guard of the crate is).
    pub(super) unsafe fn replace(&self, obj: Arc<T>, guard: &Guard) -> Arc<T> {
        // Safety: `self.obj` is this slot's pointer, which holds a pointer from
        // `Arc::into_raw` (`new`, or an earlier `replace`) whose strong count the slot owns;
        // the caller guarantees that no other `replace` of this slot overlaps this one.
        let old = unsafe { Unpublished::swap_out(&self.obj, obj) };
        let previous = old.to_arc();
        old.retire(guard);
        previous
    }
}

impl<T: Send + Sync + 'static> Drop for Slot<T> {
    /// Hands the slot's strong count to the epoch: a reader pinned before the slot was
    /// unlinked may still be reading the object.
    fn drop(&mut self) {
        // Safety: the slot is being dropped, so nothing reads or takes its pointer again, and
        // the pointer is the one `new` or `replace` published, whose strong count the slot
        // still owns.
        let last = unsafe { Unpublished::take_from_dropped(&mut self.obj) };
        last.retire(&crossbeam_epoch::pin());
    }
}

/// An owned `Arc` of `obj`.
///
/// # Safety
///
/// `obj` must have been borrowed from a slot (`load`) under a guard that is still pinned.
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

/// The strong counts slots give up, in a module of its own so that only the two functions
/// that take a pointer out of a slot can make one.
mod unpublished {
    use std::sync::atomic::{AtomicPtr, Ordering};
    use std::sync::Arc;

    use crossbeam_epoch::Guard;

    /// The strong count a slot held of an object it no longer publishes. Made only by taking
    /// the pointer out of a slot ([`swap_out`](Self::swap_out), [`take_from_dropped`](
    /// Self::take_from_dropped)); released only by [`retire`](Self::retire), which consumes it,
    /// so each count is released exactly once. Dropping one without retiring it leaks the
    /// object, which is safe.
    pub(super) struct Unpublished<T: Send + Sync + 'static>(*const T);

    impl<T: Send + Sync + 'static> Unpublished<T> {
        /// Stores `next` in `slot` (a slot's pointer) and takes out the pointer it held.
        ///
        /// # Safety
        ///
        /// `slot` is a slot's pointer: it holds a pointer from `Arc::into_raw` whose strong
        /// count the slot owns. No other `swap_out` of `slot` overlaps this one (a load and a
        /// store, not a swap: overlapping calls would take the same pointer out twice).
        pub(super) unsafe fn swap_out(slot: &AtomicPtr<T>, next: Arc<T>) -> Self {
            // A load and a store, not a swap: writers of one slot never overlap (the caller's
            // promise), so nothing can change the pointer between the two, and a plain store
            // spares the read-modify-write's wait for this thread's earlier stores. Relaxed
            // load: the previous store to this slot was ordered before us by whatever made
            // the writers not overlap (the indexer: the key's items-shard entry lock, and the
            // writers' lock when `add_indexers` moved the slot into a new state), and it
            // ordered the old object's contents with it. Release store: pairs with
            // `Slot::load`'s Acquire, so a reader that sees the new pointer sees the new
            // object's contents.
            let old = slot.load(Ordering::Relaxed);
            slot.store(Arc::into_raw(next).cast_mut(), Ordering::Release);
            Self(old.cast_const())
        }

        /// Takes the pointer out of a slot that is being dropped.
        ///
        /// # Safety
        ///
        /// `slot` is the pointer of a slot that is being dropped (nothing reads it or takes
        /// it again), and it holds a pointer from `Arc::into_raw` whose strong count the slot
        /// owns.
        pub(super) unsafe fn take_from_dropped(slot: &mut AtomicPtr<T>) -> Self {
            Self(slot.get_mut().cast_const())
        }

        /// The object as an `Arc` of its own (one increment of its count).
        pub(super) fn to_arc(&self) -> Arc<T> {
            // Safety: `self` owns one strong count of the object (it came from
            // `Arc::into_raw` and is released only by `retire`, which consumes `self`), so the
            // count is at least one while `self` lives: incrementing it and owning the
            // increment is sound.
            unsafe {
                Arc::increment_strong_count(self.0);
                Arc::from_raw(self.0)
            }
        }

        /// Releases the count once no thread pinned now can still read the object.
        pub(super) fn retire(self, guard: &Guard) {
            debug_assert!(super::super::pinned_to_default_collector(guard));
            let Self(ptr) = self;
            // Safety: `ptr` owns one strong count (it came from `Arc::into_raw`, and a slot
            // gave it up: see the constructors), released exactly once, by this deferred
            // function, since `self` is consumed. The slot no longer publishes it, so a
            // reader can hold it only under a guard pinned before now, which the epoch waits
            // for. `T` is `Send + Sync + 'static`, so dropping the `Arc` on another thread, at
            // any later time, is sound.
            unsafe {
                guard.defer_unchecked(move || drop(Arc::from_raw(ptr)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// What the docs state a key's slot costs: the slot is 32 bytes (the object pointer and
    /// the key), and its `triomphe` allocation adds one count in front, 40 bytes in all.
    #[test]
    fn a_slot_is_a_40_byte_allocation() {
        assert_eq!(size_of::<Slot<u64>>(), 32);
        let slot = SlotRef::new(Slot::new(Key::new("ns/a"), Arc::new(1u64)));
        let header = SlotRef::as_ptr(&slot) as usize - SlotRef::heap_ptr(&slot) as usize;
        assert_eq!(header, size_of::<usize>(), "one count, no weak count");
        assert_eq!(header + size_of::<Slot<u64>>(), 40);
    }

    /// Counts its drops, so a test can tell when the epoch released a replaced object.
    struct Counted(&'static AtomicUsize);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Every object a slot published is released exactly once: the replaced ones after the
    /// guards that could read them, the last one after the slot is dropped.
    #[test]
    fn every_published_object_is_released_once() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        let slot = Slot::new(Key::new("ns/a"), Arc::new(Counted(&DROPS)));
        let reader = crossbeam_epoch::pin();
        let borrowed: *const Counted = slot.load(&reader);
        {
            let writer = crossbeam_epoch::pin();
            // Safety: this is the slot's only writer.
            let previous = unsafe { slot.replace(Arc::new(Counted(&DROPS)), &writer) };
            assert!(std::ptr::eq(Arc::as_ptr(&previous), borrowed));
            drop(previous);
        }
        for _ in 0..1_000 {
            crossbeam_epoch::pin().flush();
        }
        assert_eq!(
            DROPS.load(Ordering::SeqCst),
            0,
            "`reader` may still read it"
        );
        drop(reader);
        drop(slot);
        for _ in 0..10_000 {
            if DROPS.load(Ordering::SeqCst) == 2 {
                break;
            }
            crossbeam_epoch::pin().flush();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(DROPS.load(Ordering::SeqCst), 2);
    }
}
