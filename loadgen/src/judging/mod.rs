//! Whether a run was right: the verdict of a bare run against the workload's model, and the one
//! per-key ledger of what a handler was told (layer 2).

pub mod handler_ledger;
pub mod informer_verdict;
pub mod verdict;
