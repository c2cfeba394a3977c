//! [`Pinned`]: the only epoch guard the sharded indexer accepts.
//!
//! Every release of a slot's object or of a replaced state is deferred to crossbeam-epoch's
//! default collector, so only a guard of that collector holds those releases back. A
//! `crossbeam_epoch::Guard` can come from any collector (or be `unprotected()`); a `Pinned`
//! can only come from [`Pinned::pin`], and releases are deferred only through it
//! ([`Pinned::defer`]), so the type carries the rule in every build, where a check would have
//! to run on every read.
//!
//! Built for loom (`--cfg kcache_loom`), a `Pinned` is of [`model`]'s collector instead: loom
//! cannot run crossbeam-epoch, whose atomics are not loom's, so the slot's model
//! (`slot::loom_model`) runs the slot's own atomics against a collector with the same
//! contract made of the shim's lock.

#[cfg(not(kcache_loom))]
use crossbeam_epoch::Guard;
#[cfg(kcache_loom)]
use model::Guard;

/// This thread pinned to crossbeam-epoch's default collector (`crossbeam_epoch::pin`). Like
/// the guard it wraps, it is neither `Send` nor `Sync`.
pub(super) struct Pinned(Guard);

impl Pinned {
    /// Pins this thread to the default collector.
    pub(super) fn pin() -> Self {
        #[cfg(not(kcache_loom))]
        return Self(crossbeam_epoch::pin());
        #[cfg(kcache_loom)]
        return Self(model::pin());
    }

    /// Unpins and pins again, so that releases deferred meanwhile can run (`&mut self`:
    /// nothing borrowed under the old pin is still in use).
    pub(super) fn repin(&mut self) {
        self.0.repin();
    }

    /// Runs the deferred functions that are due, this thread's included.
    #[cfg(test)]
    pub(super) fn flush(&self) {
        self.0.flush();
    }

    /// Flushes until `releases` reaches `want`, for at most ten seconds (a release may run
    /// on a thread of its own): for tests that count the releases the epoch runs.
    #[cfg(test)]
    pub(super) fn wait_for_releases(releases: &std::sync::atomic::AtomicUsize, want: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        for _ in 0..10_000 {
            if releases.load(SeqCst) == want {
                break;
            }
            Self::pin().flush();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(releases.load(SeqCst), want);
    }

    /// Runs `release` once every thread pinned now (this one included) has unpinned: the
    /// collector's promise, on which every borrow handed out under a `Pinned` relies.
    pub(super) fn defer(&self, release: impl FnOnce() + Send + 'static) {
        self.0.defer(release);
    }
}

/// The collector a loom build pins to: crossbeam-epoch's contract, none of its speed. A
/// deferred function runs once, after every guard pinned when it was deferred has unpinned
/// (on the thread whose unpin makes it due). Its state is one mutex of the sync shim, so loom
/// explores the orders in which pins, deferrals and unpins reach it.
#[cfg(kcache_loom)]
mod model {
    use std::collections::BTreeSet;
    use std::marker::PhantomData;

    use crate::sync::{lock, Mutex};

    type Release = Box<dyn FnOnce() + Send>;

    #[derive(Default)]
    struct Collector {
        /// The stamp the next pin or deferral gets: stamps order them.
        next: u64,
        /// The stamps of the guards pinned now.
        pinned: BTreeSet<u64>,
        /// Each release with the stamp it was deferred at: due once no guard pinned before
        /// that stamp remains.
        deferred: Vec<(u64, Release)>,
    }

    impl Collector {
        fn stamp(&mut self) -> u64 {
            self.next += 1;
            self.next
        }

        /// Takes out the releases that are due.
        fn due(&mut self) -> Vec<Release> {
            let oldest = self.pinned.first().copied().unwrap_or(u64::MAX);
            let (due, kept) = std::mem::take(&mut self.deferred)
                .into_iter()
                .partition(|(stamp, _)| *stamp < oldest);
            self.deferred = kept;
            due.into_iter().map(|(_, release)| release).collect()
        }
    }

    loom::lazy_static! {
        static ref COLLECTOR: Mutex<Collector> = Mutex::new(Collector::default());
    }

    /// One pin of this thread; unpins on drop. Neither `Send` nor `Sync`, as crossbeam's.
    pub(super) struct Guard {
        stamp: u64,
        _not_send: PhantomData<*const ()>,
    }

    pub(super) fn pin() -> Guard {
        let mut collector = lock(&*COLLECTOR);
        let stamp = collector.stamp();
        collector.pinned.insert(stamp);
        Guard {
            stamp,
            _not_send: PhantomData,
        }
    }

    /// Runs `releases` with no lock held: they drop user objects.
    fn run(releases: Vec<Release>) {
        releases.into_iter().for_each(|release| release());
    }

    impl Guard {
        pub(super) fn repin(&mut self) {
            *self = pin();
        }

        #[cfg(test)]
        pub(super) fn flush(&self) {
            let due = lock(&*COLLECTOR).due();
            run(due);
        }

        pub(super) fn defer(&self, release: impl FnOnce() + Send + 'static) {
            let mut collector = lock(&*COLLECTOR);
            let stamp = collector.stamp();
            collector.deferred.push((stamp, Box::new(release)));
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let due = {
                let mut collector = lock(&*COLLECTOR);
                collector.pinned.remove(&self.stamp);
                collector.due()
            };
            run(due);
        }
    }
}
