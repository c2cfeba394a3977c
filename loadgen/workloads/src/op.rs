//! One call a producer makes on a queue (or, in W4, a writer on the indexer).

use std::sync::Arc;

use kcache::{DeltaQueue, QueueError};

use crate::pod::Pod;

/// A relist: what `replace` is called with.
#[derive(Debug)]
pub struct Relist {
    /// The listed objects (fresh allocations, never enqueued elsewhere).
    pub objects: Vec<Arc<Pod>>,
    /// The resource version passed along (the engines ignore it; client-go logs it).
    pub resource_version: String,
}

/// One call the producer makes on the queue (or, in W4, the writer on the indexer).
#[derive(Debug)]
pub enum Op {
    /// `add(obj)`.
    Add(Arc<Pod>),
    /// `update(obj)`.
    Update(Arc<Pod>),
    /// `delete(obj)`.
    Delete(Arc<Pod>),
    /// `replace(list)`; boxed so an op stays two words wide.
    Replace(Box<Relist>),
    /// `resync()`.
    Resync,
}

impl Op {
    /// Performs this op on `queue`, as a producer does (a relist hands over a copy of its list).
    pub fn perform_on(&self, queue: &impl DeltaQueue<Pod>) -> Result<(), QueueError> {
        match self {
            Op::Add(pod) => queue.add(Arc::clone(pod)),
            Op::Update(pod) => queue.update(Arc::clone(pod)),
            Op::Delete(pod) => queue.delete(Arc::clone(pod)),
            Op::Replace(relist) => queue.replace(relist.objects.clone(), &relist.resource_version),
            Op::Resync => queue.resync(),
        }
    }

    /// The events this op carries, as runs count them: one per add, update or delete, one per
    /// listed object of a relist, none for a resync.
    pub fn events(&self) -> usize {
        match self {
            Op::Add(_) | Op::Update(_) | Op::Delete(_) => 1,
            Op::Replace(relist) => relist.objects.len(),
            Op::Resync => 0,
        }
    }

    /// A comparable summary `(kind, id, version)`: `kind` is `A`, `U`, `D`, `R` (id = list
    /// length, version = sum of listed versions) or `S`.
    pub fn summary(&self) -> (char, u64, u64) {
        match self {
            Op::Add(p) => ('A', u64::from(p.id), p.version),
            Op::Update(p) => ('U', u64::from(p.id), p.version),
            Op::Delete(p) => ('D', u64::from(p.id), p.version),
            Op::Replace(r) => (
                'R',
                r.objects.len() as u64,
                r.objects.iter().map(|p| p.version).sum(),
            ),
            Op::Resync => ('S', 0, 0),
        }
    }
}
