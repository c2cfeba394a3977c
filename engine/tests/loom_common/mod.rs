//! What the loom models (`loom.rs`, `loom_fanout.rs`, `loom_workqueue.rs`) share.

use std::sync::Arc;

use loom::thread;

/// Runs `f` in every interleaving loom explores within a preemption bound of 3.
pub fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// A loom thread running `f` on its own handle to `shared`.
pub fn spawn_with<T, R>(
    shared: &Arc<T>,
    f: impl FnOnce(Arc<T>) -> R + Send + 'static,
) -> thread::JoinHandle<R>
where
    T: ?Sized + Send + Sync + 'static,
    R: Send + 'static,
{
    let shared = Arc::clone(shared);
    thread::spawn(move || f(shared))
}
