//! [`Published`]: the indexer's current content, which threads pinned to the epoch read with
//! one plain load, and the writers' lock that decides who may change it.
//!
//! The content is an `Arc` in an `ArcSwap`, whose `load` costs two read-modify-writes (it
//! records a debt in a per-thread slot, then pays it back), each of which also waits for the
//! thread's earlier stores to drain. Every write, every borrowed read and every prefetch of
//! the sharded indexer is pinned to the epoch anyway (for its slots); those paths read a
//! mirror of the same pointer instead, kept alive by the epoch: the consumer's turn on a key
//! loaded the content four to six times, and its atomics were a large share of that turn.
//!
//! # Writers
//!
//! [`publish`](Exclusive::publish) stores the mirror and then swaps the owner: two overlapping
//! calls could leave the mirror naming a value the owner no longer holds, which the epoch
//! would then free under later readers. So `publish` is a method of [`Exclusive`], the
//! writers' lock held exclusively (and borrowed mutably, so one `Exclusive` cannot publish
//! twice at once either). Writes *to* the current value hold the same lock shared
//! ([`SharedWriteLock`]): while one lives, the value it names stays the current one.

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard as ArcGuard};

use super::epoch::Pinned;
use crate::sync::{read, write, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A published value: owned by an `ArcSwap` (for paths that do not pin), mirrored as a plain
/// pointer for paths that do, and replaced only by the holder of its writers' lock.
pub(super) struct Published<S: Send + Sync + 'static> {
    owner: ArcSwap<S>,
    /// `owner`'s pointer: [`publish`](Exclusive::publish) changes both, this one first.
    current: AtomicPtr<S>,
    /// Writers of the current value hold it shared ([`SharedWriteLock`]) for the whole write;
    /// [`publish`](Exclusive::publish) needs it exclusive ([`Exclusive`]), so no write lands
    /// in a value that is being replaced. Readers never touch it.
    writers: RwLock<()>,
}

/// The writers' lock held shared: the value current when it was taken stays current until
/// it is dropped.
pub(super) struct SharedWriteLock<'p, S: Send + Sync + 'static> {
    published: &'p Published<S>,
    _lock: RwLockReadGuard<'p, ()>,
}

/// The writers' lock held exclusively: the only way to [`publish`](Self::publish).
pub(super) struct Exclusive<'p, S: Send + Sync + 'static> {
    published: &'p Published<S>,
    _lock: RwLockWriteGuard<'p, ()>,
}

impl<S: Send + Sync + 'static> Published<S> {
    pub(super) fn new(value: S) -> Self {
        let value = Arc::new(value);
        Self {
            current: AtomicPtr::new(Arc::as_ptr(&value).cast_mut()),
            owner: ArcSwap::new(value),
            writers: RwLock::new(()),
        }
    }

    /// The current value, for a path that is not pinned.
    pub(super) fn load(&self) -> ArcGuard<Arc<S>> {
        self.owner.load()
    }

    /// The current value as an `Arc` of its own.
    pub(super) fn load_full(&self) -> Arc<S> {
        self.owner.load_full()
    }

    /// The current value, for as long as `guard` stays pinned.
    ///
    /// A caller holding [`SharedWriteLock`] or [`Exclusive`] gets the newest value: the lock orders
    /// `publish`'s store before this load. A caller holding only a pin may get the value that
    /// was current just before a concurrent `publish`: whole, alive, and no longer written to.
    pub(super) fn pinned<'g>(&self, _guard: &'g Pinned) -> &'g S {
        // Acquire pairs with `publish`'s Release store: the value, built before it was
        // published, is visible here.
        let value = self.current.load(Ordering::Acquire);
        // Safety: `current` always points at a value inside an `Arc` allocation. While it is
        // current, `owner` holds a strong count of it. `publish` is the only place that stops
        // it being current, and it hands one strong count of it to the epoch (`Guard::defer`)
        // after storing the next pointer, so the allocation outlives every thread pinned
        // before that store, which includes every thread that can have loaded it. `publish`
        // calls never overlap (it needs `&mut Exclusive`), so `current` and `owner` name the
        // same value whenever no `publish` is running. `guard` (of the default collector, the
        // one `publish` defers to) was pinned before this load, and the borrow cannot outlive
        // it.
        unsafe { &*value }
    }

    /// Takes the writers' lock shared, for a write to the current value.
    pub(super) fn shared(&self) -> SharedWriteLock<'_, S> {
        SharedWriteLock {
            published: self,
            _lock: read(&self.writers),
        }
    }

    /// Takes the writers' lock exclusively, for [`publish`](Exclusive::publish).
    pub(super) fn exclusive(&self) -> Exclusive<'_, S> {
        Exclusive {
            published: self,
            _lock: write(&self.writers),
        }
    }
}

impl<S: Send + Sync + 'static> SharedWriteLock<'_, S> {
    /// The current value, which stays current while `self` lives, for as long as `guard`
    /// stays pinned.
    pub(super) fn pinned<'g>(&self, guard: &'g Pinned) -> &'g S {
        self.published.pinned(guard)
    }
}

impl<S: Send + Sync + 'static> Exclusive<'_, S> {
    /// The current value as an `Arc` of its own (no `publish` can change it meanwhile).
    pub(super) fn load_full(&self) -> Arc<S> {
        self.published.load_full()
    }

    /// Makes `next` the current value and returns the one it replaces; `guard` pins the
    /// caller. `&mut`: calls never overlap.
    pub(super) fn publish(&mut self, next: Arc<S>, guard: &Pinned) -> Arc<S> {
        let published = self.published;
        // Release pairs with `pinned`'s Acquire.
        published
            .current
            .store(Arc::as_ptr(&next).cast_mut(), Ordering::Release);
        let old = published.owner.swap(next);
        // A pinned thread may have loaded the old pointer just before the store above: keep
        // the old value alive until every thread pinned now has unpinned. Whoever drops the
        // last count frees it: the caller, an arc-swap guard or, last of all, the epoch.
        let retired = Arc::clone(&old);
        guard.defer(move || release(retired));
        old
    }
}

/// The epoch's release of a retired value. It runs inside whichever thread's pin collects it
/// (a consumer's write, a reader's guard): when this is the value's last count, the value
/// (for the indexer, a whole store's content) is freed on a thread of its own instead, so that
/// no such thread stops for the time a large free takes. If no thread can be started, it is
/// freed here.
fn release<S: Send + Sync + 'static>(retired: Arc<S>) {
    if let Some(value) = Arc::into_inner(retired) {
        // On an error the closure, and the value with it, is dropped here.
        let _ = std::thread::Builder::new()
            .name("kcache-release".into())
            .spawn(move || drop(value));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Counts its drops, so a test can tell when the epoch released a retired value.
    struct Counted<'a>(u32, &'a AtomicUsize);

    impl Drop for Counted<'_> {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn every_path_reads_the_newest_value() {
        let published = Published::new(1u32);
        let guard = Pinned::pin();
        assert_eq!(*published.pinned(&guard), 1);
        let old = published.exclusive().publish(Arc::new(2), &guard);
        assert_eq!(*old, 1);
        assert_eq!(*published.pinned(&guard), 2);
        assert_eq!(**published.load(), 2);
        assert_eq!(*published.load_full(), 2);
    }

    #[test]
    fn a_replaced_value_outlives_the_pins_that_could_have_read_it() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        let published = Published::new(Counted(1, &DROPS));
        let reader = Pinned::pin();
        let borrowed = published.pinned(&reader);
        {
            let writer = Pinned::pin();
            drop(
                published
                    .exclusive()
                    .publish(Arc::new(Counted(2, &DROPS)), &writer),
            );
        }
        // The owner and the caller have dropped their counts; the epoch still holds one, and
        // cannot release it while `reader` is pinned.
        for _ in 0..1_000 {
            Pinned::pin().flush();
        }
        assert_eq!(borrowed.0, 1);
        assert_eq!(DROPS.load(Ordering::SeqCst), 0);
        drop(reader);
        // Once nothing pinned remains from before, the epoch releases it, on a thread of its
        // own (its last count): wait for it, for at most ten seconds.
        Pinned::wait_for_releases(&DROPS, 1);
        drop(published);
        assert_eq!(DROPS.load(Ordering::SeqCst), 2);
    }
}
