//! The load generator's library: trace replay, workloads and reports, shared by the `loadgen`
//! binary, the cross-crate tests and the benchmarks.

pub mod chart;
pub mod compare;
pub mod engines;
pub mod isolate;
pub mod latency;
pub mod machine;
pub mod ops;
pub mod replay;
pub mod report;
pub mod rss;
pub mod run;
pub mod ui;
pub mod verdict;
pub mod workload;
