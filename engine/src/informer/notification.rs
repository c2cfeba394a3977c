//! One notification for one handler: what the processor hands over and a coalescing table
//! merges. Its own module so that both import it and neither imports the other.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::consumer::EventHandler;
use crate::delta::DeltaObject;

/// One notification for one handler.
pub(crate) enum Notification<T> {
    Add { obj: Arc<T>, initial: bool },
    Update { old: Arc<T>, new: Arc<T> },
    Delete(DeltaObject<T>),
}

impl<T> Notification<T> {
    pub(super) fn is_initial(&self) -> bool {
        matches!(self, Notification::Add { initial: true, .. })
    }

    /// Calls `handler`, catching a panic; true if it panicked.
    pub(super) fn call(&self, handler: &mut (impl EventHandler<T> + ?Sized)) -> bool {
        catch_unwind(AssertUnwindSafe(|| match self {
            Notification::Add { obj, initial } => handler.on_add(obj, *initial),
            Notification::Update { old, new } => handler.on_update(old, new),
            Notification::Delete(obj) => handler.on_delete(obj),
        }))
        .is_err()
    }
}
