//! Turns: the consumers hand their batches to the registrations in the order they took them.
//!
//! A consumer distributes a batch's notifications after it has applied the whole batch, and
//! the queue may already have released the batch's keys by then (it does so as the batch
//! ends): another consumer can pop one of those keys again and distribute its next
//! notifications. To keep each key's notifications in order, a consumer takes a *ticket*
//! when its batch starts (after the queue handed it the keys, so after whoever held those
//! keys before took theirs) and hands its batch over only when its ticket is served; tickets
//! are served in order. With one consumer the turn is always its own at once.

use crate::sync::{lock, wait, AtomicU64, Condvar, Mutex, Ordering};

/// Tickets and the one being served.
#[derive(Debug, Default)]
pub(crate) struct Turns {
    next: AtomicU64,
    serving: Mutex<TurnState>,
    advanced: Condvar,
}

#[derive(Debug, Default)]
struct TurnState {
    ticket: u64,
    /// Consumers waiting for their turn: `advance` wakes only if there are any.
    waiting: usize,
}

impl Turns {
    /// A ticket. Relaxed: the tickets of two batches that share a key are ordered anyway, by
    /// the queue's synchronisation between them (a read-modify-write follows the
    /// happens-before order).
    pub(crate) fn take(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    /// Blocks until `ticket` is served. Every ticket taken must be waited for and then
    /// [`advance`](Self::advance)d, or the later ones wait forever.
    pub(crate) fn wait(&self, ticket: u64) {
        let mut serving = lock(&self.serving);
        while serving.ticket != ticket {
            serving.waiting += 1;
            serving = wait(&self.advanced, serving);
            serving.waiting -= 1;
        }
    }

    /// Serves the next ticket.
    pub(crate) fn advance(&self) {
        let mut serving = lock(&self.serving);
        serving.ticket += 1;
        if serving.waiting > 0 {
            self.advanced.notify_all();
        }
    }
}
