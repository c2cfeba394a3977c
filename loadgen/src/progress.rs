//! How a long loop reports how far it got, without knowing who shows it (a progress bar, or
//! nothing).

/// Reports the producer's progress (ops done); called every few thousand ops.
pub trait Progress: Sync {
    /// `done` ops of the run have been performed.
    fn set(&self, done: u64);
}

/// Reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn set(&self, _done: u64) {}
}

impl Progress for indicatif::ProgressBar {
    fn set(&self, done: u64) {
        self.set_position(done);
    }
}
