//! What the generator expects a run to end with: the final state and the delta accounting.

use std::sync::Arc;

use crate::pod::Pod;

/// What the generator expects the consumer to receive, counted while generating.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Expected {
    /// `Added` deltas enqueued.
    pub added: u64,
    /// `Updated` deltas enqueued.
    pub updated: u64,
    /// `Deleted` deltas (not tombstones) enqueued.
    pub deleted: u64,
    /// `Replaced` deltas: the total length of every relist.
    pub replaced: u64,
    /// Deletions the relists must discover: alive keys left out of a relist (W3).
    pub tombstones: u64,
}

/// The generator's own model of the final state, which the verdict holds the store to.
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// The final state of every key by id; `None` when the key ends deleted.
    pub alive: Vec<Option<Arc<Pod>>>,
    /// What the consumer must receive.
    pub expected: Expected,
}

impl Model {
    /// A model of `keys` keys, all absent.
    pub fn with_keys(keys: usize) -> Self {
        Self {
            alive: vec![None; keys],
            expected: Expected::default(),
        }
    }

    /// How many keys end alive.
    pub fn alive_count(&self) -> usize {
        self.alive.iter().filter(|p| p.is_some()).count()
    }
}
