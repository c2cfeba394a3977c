//! kcache's cross-crate tests live in `tests/tests/`: they drive the `kcache` engines with
//! `loadgen`'s workloads and compare the engines with each other and with the generator's
//! model. The ops traces of docs/traces.md live in `tests/traces/` and are replayed by
//! `loadgen/tests/traces.rs` through the `loadgen` binary.
