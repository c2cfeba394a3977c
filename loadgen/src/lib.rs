//! The load generator's library, shared by the `loadgen` binary, its tests and the benchmarks.
//!
//! One module per job:
//!
//! | module | what it does |
//! |---|---|
//! | [`ops`] (+ `ops/`) | `loadgen ops`: replays an ops trace (docs/traces.md) through one engine |
//! | [`workload`] | generates the synthetic workloads W1–W6 (docs/workloads.md) and their model |
//! | [`driver`] | runs a generated workload through an engine: producer, consumers, timing |
//! | [`verdict`] | judges a finished run against the workload's model |
//! | [`latency`], [`rss`] | enqueue-to-pop latency sampling; peak resident memory |
//! | [`timeline`] | latency over time: per-interval p50/p99/max of a run, to locate stalls |
//! | [`thp`] | restarts the binary with mimalloc's transparent-huge-page advice off (its faults stall runs) |
//! | [`scale`] | `loadgen scale`: throughput, latency and bytes per key against the key count |
//! | [`report`] | one run's measured result; the table, the JSON report, the exit code |
//! | [`isolate`] | runs each engine in a child process of its own |
//! | [`run`] | `loadgen run`: one workload through one engine or both |
//! | [`capacity`] | `loadgen capacity`: the highest offered rate an engine keeps up with, and its latency curve |
//! | [`through_informer`] | `loadgen run --through informer`: the same events through the whole informer pipeline |
//! | [`informer_verdict`] | judges each handler of a run through the informer |
//! | [`controller_loop`] | W6: DeltaFIFO, indexer, workqueue and workers as one controller, and its verdict |
//! | [`compare`] | `loadgen compare`: every workload through both engines, side by side |
//! | [`chart`] | the SVG charts of `compare` and `capacity` |
//! | [`machine`] | what machine a comparison ran on |
//! | [`watch_stream`] | `loadgen replay`: reads a recorded kubectl watch stream and replays it |
//! | [`ui`] | progress bars and notes on stderr |
//! | `serve` (feature `wire`) | `loadgen serve`: a synthetic Kubernetes API server for pods (docs/wire.md) |

#![forbid(unsafe_code)]

pub mod capacity;
pub mod chart;
pub mod compare;
pub mod controller_loop;
pub mod driver;
#[cfg(feature = "wire")]
pub mod e2e;
pub mod informer_verdict;
pub mod isolate;
pub mod latency;
pub mod machine;
pub mod ops;
pub mod report;
pub mod rss;
pub mod run;
pub mod scale;
#[cfg(feature = "wire")]
pub mod serve;
pub mod thp;
pub mod through_informer;
pub mod timeline;
pub mod ui;
pub mod verdict;
pub mod watch_stream;
pub mod workload;
