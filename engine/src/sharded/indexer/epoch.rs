//! [`Pinned`]: the only epoch guard the sharded indexer accepts.
//!
//! Every release of a slot's object or of a replaced state is deferred to crossbeam-epoch's
//! default collector, so only a guard of that collector holds those releases back. A
//! `crossbeam_epoch::Guard` can come from any collector (or be `unprotected()`); a `Pinned`
//! can only come from [`Pinned::pin`], so the type carries the rule in every build, where a
//! check would have to run on every read.

use crossbeam_epoch::Guard;

/// This thread pinned to crossbeam-epoch's default collector (`crossbeam_epoch::pin`). Like
/// the guard it wraps, it is neither `Send` nor `Sync`.
pub(super) struct Pinned(Guard);

impl Pinned {
    /// Pins this thread to the default collector.
    pub(super) fn pin() -> Self {
        Self(crossbeam_epoch::pin())
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

    /// The guard itself, to defer a release to its collector.
    pub(super) fn guard(&self) -> &Guard {
        &self.0
    }
}
