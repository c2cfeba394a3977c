//! The load generator's library: trace replay, workloads and reports, shared by the `loadgen`
//! binary, the cross-crate tests and the benchmarks.
