//! The load generator's library: trace replay, workloads and reports, shared by the `loadgen`
//! binary, the cross-crate tests and the benchmarks.

pub mod compare;
pub mod ops;
pub mod replay;
pub mod run;
