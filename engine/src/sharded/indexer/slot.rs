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
//!   `&'g Pinned`), as crossbeam-epoch's `Shared<'g, T>` is.
//! - The slot's pointer lives in an `ObjectCell`, which owns its strong count by type: made
//!   from an `Arc`, it gives the count up only as an `Unpublished`, by its swap-out
//!   ([`replace`](Slot::replace)) or its drop (both in a module of their own, so nothing else
//!   in this file can wrap a pointer in one), and `retire` consumes that: a count is released
//!   once, by the epoch, and only after the slot stopped publishing it.
//! - [`replace`](Slot::replace) is a load and a store, not a swap: it takes `&mut Held`, the
//!   key's items-shard entry held in a state no other writer can reach at the same time, which
//!   only the indexer's `Writable` can make: misuse does not compile.
//! - Every guard is a `Pinned`, which only `crossbeam_epoch::pin` makes: pinned to the
//!   default collector, the one the release is deferred to.

use std::mem::ManuallyDrop;
use std::sync::Arc;

use super::epoch::Pinned;
use super::writable::Held;
use crate::key::Key;
use crate::sync::Ordering;
use cell::ObjectCell;

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
    obj: ObjectCell<T>,
    key: Key,
}

impl<T: Send + Sync + 'static> Slot<T> {
    /// A slot of `key` publishing `obj` (it takes over `obj`'s strong count).
    pub(super) fn new(key: Key, obj: Arc<T>) -> Self {
        Self {
            obj: ObjectCell::new(obj),
            key,
        }
    }

    /// The key whose object this slot holds; it never changes.
    pub(super) fn key(&self) -> &Key {
        &self.key
    }

    /// The current object, borrowed for as long as `guard` stays pinned.
    pub(super) fn load<'g>(&self, _guard: &'g Pinned) -> &'g T {
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
    pub(super) fn load_arc(&self, guard: &Pinned) -> Arc<T> {
        // Safety: the object is borrowed from this slot under `guard`, pinned for the call.
        unsafe { share(self.load(guard)) }
    }

    /// Calls `f` with the current object as an `Arc` borrowed for the call, without touching
    /// its reference count (`f` may clone it, which counts as usual).
    pub(super) fn with_arc<R>(&self, guard: &Pinned, f: impl FnOnce(&Arc<T>) -> R) -> R {
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
        crate::sharded::prefetch::value(self.obj.load(Ordering::Relaxed));
    }

    /// Publishes `obj` in `held`'s slot and returns the object it replaces.
    ///
    /// A load and a store, not a swap: sound only while writers of one slot never overlap,
    /// which `held` proves (the key's items entry held in a [`Writable`] state: no other
    /// thread writes this slot while it lives) and `&mut` keeps true through `held` itself.
    ///
    /// [`Writable`]: super::writable::Writable
    pub(super) fn replace(held: &mut Held<'_, T>, obj: Arc<T>, guard: &Pinned) -> Arc<T> {
        let slot: &Self = held.slot();
        // Safety: `held` is the only writer of this slot while it lives (see `Held`), and it
        // is borrowed mutably for the call, so no other `swap_out` of the slot's cell overlaps
        // this one.
        let old = unsafe { slot.obj.swap_out(obj) };
        let previous = old.to_arc();
        old.retire(guard);
        previous
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

/// A slot's pointer and the strong counts slots give up, in a module of its own so that only
/// the cell's swap-out and its drop can make an [`Unpublished`].
mod cell {
    use std::sync::Arc;

    use super::super::epoch::Pinned;
    use crate::sync::{AtomicPtr, Ordering};

    /// A slot's pointer: always one from `Arc::into_raw` (never null) whose strong count the
    /// cell owns. Made from an `Arc` ([`new`](Self::new)); changed only by
    /// [`swap_out`](Self::swap_out), which gives the old count up as an [`Unpublished`]; on
    /// drop, the count it still owns is retired through the epoch.
    pub(super) struct ObjectCell<T: Send + Sync + 'static>(AtomicPtr<T>);

    impl<T: Send + Sync + 'static> ObjectCell<T> {
        /// A cell publishing `obj` (it takes over `obj`'s strong count).
        pub(super) fn new(obj: Arc<T>) -> Self {
            Self(AtomicPtr::new(Arc::into_raw(obj).cast_mut()))
        }

        /// The pointer the cell publishes. Only a reader pinned before it loaded the pointer
        /// may dereference it, and only while pinned (see `Slot::load`).
        pub(super) fn load(&self, order: Ordering) -> *const T {
            self.0.load(order).cast_const()
        }

        /// Publishes `next` and takes out the pointer the cell held.
        ///
        /// # Safety
        ///
        /// No other `swap_out` of this cell overlaps this one (a load and a store, not a swap:
        /// overlapping calls would take the same pointer out twice).
        pub(super) unsafe fn swap_out(&self, next: Arc<T>) -> Unpublished<T> {
            // A load and a store, not a swap: writers of one slot never overlap (the caller's
            // promise), so nothing can change the pointer between the two, and a plain store
            // spares the read-modify-write's wait for this thread's earlier stores. Relaxed
            // load: the previous store to this cell was ordered before us by whatever made
            // the writers not overlap (the indexer: the key's items-shard entry lock, and the
            // writers' lock when `add_indexers` moved the slot into a new state), and it
            // ordered the old object's contents with it. Release store: pairs with
            // `Slot::load`'s Acquire, so a reader that sees the new pointer sees the new
            // object's contents.
            let old = self.0.load(Ordering::Relaxed);
            self.0
                .store(Arc::into_raw(next).cast_mut(), Ordering::Release);
            Unpublished(old.cast_const())
        }
    }

    impl<T: Send + Sync + 'static> Drop for ObjectCell<T> {
        /// Hands the cell's strong count to the epoch: a reader pinned before the slot was
        /// unlinked may still be reading the object.
        fn drop(&mut self) {
            // The cell owns the count of the pointer it holds (its invariant), and a drop runs
            // once, after which nothing reads the pointer: giving it up here is the count's
            // one release. Relaxed (a `get_mut`, which loom's atomics do not have): the slot is
            // being dropped, so the drop of its last count (a release decrement and an acquire
            // fence) ordered every store to the cell before this load.
            let last = self.0.load(Ordering::Relaxed);
            Unpublished(last.cast_const()).retire(&Pinned::pin());
        }
    }

    /// The strong count a slot held of an object it no longer publishes. Made only by an
    /// [`ObjectCell`] giving its pointer up ([`swap_out`](ObjectCell::swap_out), its drop);
    /// released only by [`retire`](Self::retire), which consumes it, so each count is
    /// released exactly once. Dropping one without retiring it leaks the object, which is
    /// safe.
    pub(super) struct Unpublished<T: Send + Sync + 'static>(*const T);

    impl<T: Send + Sync + 'static> Unpublished<T> {
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
        pub(super) fn retire(self, guard: &Pinned) {
            let Self(ptr) = self;
            // Safety: `ptr` owns one strong count (it came from `Arc::into_raw`, and a cell
            // gave it up: see the constructors), and `self` is consumed, so this `Arc` is the
            // count's one owner and its drop the count's one release.
            let count = unsafe { Arc::from_raw(ptr) };
            // The cell no longer publishes the object, so a reader can hold it only under a
            // guard pinned before now, which the collector (the default one: `Pinned` can be
            // of no other) waits for before it drops the count. `T` is `Send + Sync +
            // 'static`, so dropping it on another thread, at any later time, is sound.
            guard.defer(move || drop(count));
        }
    }
}

#[cfg(all(test, not(kcache_loom)))]
mod tests {
    use std::mem::size_of;
    use std::sync::atomic::AtomicUsize;

    use super::super::writable::Fresh;
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
        let key = Key::new("ns/a");
        let mut fresh = Fresh::new(Vec::new(), 1);
        fresh
            .writable()
            .insert(key.clone(), Arc::new(Counted(&DROPS)), &Pinned::pin());
        let reader = Pinned::pin();
        let Ok(mut held) = fresh.writable().entry(key) else {
            panic!("the key was just stored");
        };
        let borrowed: *const Counted = held.slot().load(&reader);
        {
            let writer = Pinned::pin();
            let previous = Slot::replace(&mut held, Arc::new(Counted(&DROPS)), &writer);
            assert!(std::ptr::eq(Arc::as_ptr(&previous), borrowed));
            drop(previous);
        }
        drop(held);
        for _ in 0..1_000 {
            Pinned::pin().flush();
        }
        assert_eq!(
            DROPS.load(Ordering::SeqCst),
            0,
            "`reader` may still read it"
        );
        drop(reader);
        drop(fresh.into_state());
        Pinned::wait_for_releases(&DROPS, 2);
    }
}

/// A loom model of the slot's synchronisation: its pointer's publication (`replace`'s store,
/// `load`) and the retiring of what it stops publishing, against the collector a loom build
/// pins to (`epoch::model`, which keeps crossbeam-epoch's contract: loom cannot run
/// crossbeam-epoch itself).
///
/// Run with:
/// `RUSTFLAGS="--cfg kcache_loom" cargo test -p kcache --release --lib loom_model`
#[cfg(all(test, kcache_loom))]
mod loom_model {
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::AtomicUsize;

    use super::super::writable::Fresh;
    use super::*;

    /// What a released object holds in its cell.
    const RELEASED: u64 = u64::MAX;

    /// An object whose contents are a loom cell: written by its writer before it is published
    /// and by its release, read by readers, so loom reports a read that is not ordered after
    /// the object's publication or not ordered before its release.
    struct Obj {
        value: UnsafeCell<u64>,
        releases: loom::sync::Arc<AtomicUsize>,
    }

    // Safety: the cell is written only by the thread that made the object, before it is
    // published, and by its drop, after the last reader (what the model checks); loom reports
    // any other access as a race.
    unsafe impl Sync for Obj {}

    impl Obj {
        fn new(value: u64, releases: &loom::sync::Arc<AtomicUsize>) -> Arc<Self> {
            let obj = Self {
                value: UnsafeCell::new(0),
                releases: loom::sync::Arc::clone(releases),
            };
            // Safety: the object is this thread's alone until it is published.
            obj.value.with_mut(|v| unsafe { *v = value });
            Arc::new(obj)
        }

        fn read(&self) -> u64 {
            // Safety: a data race here is what loom is asked to find.
            self.value.with(|v| unsafe { *v })
        }
    }

    impl Drop for Obj {
        fn drop(&mut self) {
            // Safety: the last owner of the object (a race with a reader is loom's to report).
            self.value.with_mut(|v| unsafe { *v = RELEASED });
            self.releases.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// One writer replaces a key's object and then drops the state that holds its slot (as a
    /// remove or a replaced state does), while a reader pins, loads the object, lets the slot
    /// go and only then reads the object: the reader sees the old object or the new one,
    /// whole, never a released one, and each object is released exactly once.
    ///
    /// The slot's last count is dropped through a loom `Arc`: the slot's own count
    /// (`triomphe`'s, a release decrement and an acquire fence, as std's) orders every store to
    /// the slot before its drop, but it is not loom's, so loom would not see that order.
    #[test]
    fn a_pinned_reader_sees_a_whole_object_and_each_is_released_once() {
        loom::model(|| {
            let releases = loom::sync::Arc::new(AtomicUsize::new(0));
            let key = Key::new("ns/a");
            let mut fresh = Fresh::new(Vec::new(), 1);
            let first = Obj::new(1, &releases);
            fresh.writable().insert(key.clone(), first, &Pinned::pin());
            let slot = fresh
                .writable()
                .entry(key.clone())
                .map(|held| loom::sync::Arc::new(SlotRef::clone(held.slot())))
                .unwrap_or_else(|_| panic!("the key was just stored"));

            let reader = loom::thread::spawn({
                let slot = loom::sync::Arc::clone(&slot);
                move || {
                    let guard = Pinned::pin();
                    let obj = slot.load(&guard);
                    // The slot may be dropped from here on; the object must stay until `guard`
                    // goes.
                    drop(slot);
                    let value = obj.read();
                    assert!(value == 1 || value == 2, "read {value}");
                }
            });

            {
                let guard = Pinned::pin();
                // Made after the pin: the model's pins take a lock, which would order anything
                // written before them for a reader that pins later; only the slot's own store
                // and load order what is written after.
                let second = Obj::new(2, &releases);
                let Ok(mut held) = fresh.writable().entry(key) else {
                    panic!("the key was just stored");
                };
                let previous = Slot::replace(&mut held, second, &guard);
                assert_eq!(previous.read(), 1);
            }
            drop(fresh.into_state());
            drop(slot);

            reader.join().unwrap();
            assert_eq!(releases.load(Ordering::SeqCst), 2);
        });
    }
}
