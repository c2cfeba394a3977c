//! The load generator's library, shared by the `loadgen` binary and its tests.
//!
//! # Layout
//!
//! The crate is a stack of layers: a module imports only from its own layer or below, and no two
//! modules import each other. `scripts/layers` reads this table and checks the imports against
//! it, so the table is the layout.
//!
//! | layer | modules | what they do |
//! |---|---|---|
//! | 0 | the workloads crate (outside loadgen) | generates the synthetic workloads W1–W8 (docs/workloads.md) and their model |
//! | 1 | [`measure`] ([`measure::latency`], [`measure::timeline`], [`measure::rss`], [`measure::allocator`], [`measure::cpu`], [`measure::machine`], [`measure::thp`]) | what a run measures: enqueue-to-pop latency sampling; latency over time (per-interval p50/p99/max, to locate stalls); peak resident memory; the bytes the allocator has committed; the CPU a run spent; what machine a run was on and the command line that made it; restarting with mimalloc's transparent-huge-page advice off (its faults stall runs) |
//! | 1 | [`engines`], [`args`], [`progress`], [`ui`], [`units`], [`sync`] | engine names and one run's knobs; value parsers and flag groups several commands share; progress reporting and bars and notes on stderr; numbers as tables show them; a lock that survives a panicked holder |
//! | 1 | [`result`] | one engine's measured result: the row every report shows and the JSON a child process hands back |
//! | 1 | [`watch_trace`] | a recorded watch stream (`kubectl get --watch -o json`) parsed and turned into a workload |
//! | 2 | [`harness`] ([`harness::driver`], [`harness::pacing`], [`harness::readers`], [`harness::server_feed`], [`harness::informer_handlers`], [`harness::isolate`]) | what drives a run: a generated workload through an engine (producer, consumers, counters, timing); a producer paced to an offered rate; W4's readers; the in-memory API server and the producer that writes a workload into it; the handlers a run registers on the informer, which record what they hear (one slow); a run in a child process of its own |
//! | 2 | [`judging`] ([`judging::verdict`], [`judging::informer_verdict`], [`judging::handler_ledger`]) | whether a run was right: a finished run against the workload's model; each handler of a run through the informer; the one per-key ledger of what a handler was told, by pod id or by name (faults over the wire, `soak`) |
//! | 2 | [`pipelines`] ([`pipelines::bare`], [`pipelines::controller_loop`], [`pipelines::controller_informer`], [`pipelines::controller_resync`], [`pipelines::through_informer`], [`pipelines::harness_floor`], [`pipelines::priority_scheduling`], [`pipelines::wq_round_trip`]) | what a run goes through: the engine bare (a workload generated, measured and judged); W6 on the bare queue; W6 through the shared informer on kcache's `Controller`; W7, that controller under a resync storm; the same events through the whole informer pipeline; the harness floor, a client that drains the same server; W8, a saturated workqueue under each order; the workqueue round trip |
//! | 2 | [`runner`] ([`runner::run_spec`], [`runner::capacity_search`], [`runner::scale_sweep`]) | how runs are made: one row of a run as data, the one dispatch that runs it and the JSON a child is handed; the highest offered rate an engine keeps up with (the one search); the sweep over key counts |
//! | 3 | [`reports`] ([`reports::report`], [`reports::chart`], [`reports::capacity_report`], [`reports::scale_report`], [`reports::soak_report`]) | what a person reads: the run table, the JSON report, files written, exit codes; SVG charts; the capacity tables and claim; the sweep's table, page and chart; a soak's samples, RSS slope and chart |
//! | 3 | `kube_churn` (feature wire) | a `loadgen churn` child against the API server a kubeconfig names: its command line, its record of writes (read whole or as it grows), the cleanup of its pods; what `e2e --kubeconfig` and `soak --kubeconfig` share |
//! | 3 | `serve` (feature wire) | the synthetic Kubernetes API server for pods (docs/wire.md) that `loadgen serve`, `e2e` and `soak` run (its command line lives in `serve/mod.rs`) |
//! | 4 | [`commands::run`], [`commands::child`], [`commands::compare`], [`commands::capacity`], [`commands::scale`], [`commands::replay`], [`commands::ops`], [`commands::workqueue`], `commands::e2e` (feature wire), [`commands::soak`] (feature wire), `commands::churn` (feature wire) | one module per command: `loadgen run`, `child` (one row of a run, hidden), `compare`, `capacity`, `scale`, `replay` (a recorded watch stream), `ops` (an ops trace, docs/traces.md), `workqueue` (the workqueue round trip), `churn` (a workload's writes into a real API server), `e2e` (real clients against `serve`, or many watchers of it), `soak` (the pipeline for hours, with faults against `serve`, or against a server a kubeconfig names) |
//!
//! A command never imports another command: what two commands share lives a layer down
//! (`compare` runs the same [`pipelines::bare`], [`runner::capacity_search`] and [`runner::scale_sweep`] as `run`,
//! `capacity` and `scale`). `main.rs` only parses the command line and dispatches.

// `deny`, not `forbid`: reading the allocator's figures (src/measure/allocator.rs) calls one C function,
// allowed there alone with a `SAFETY:` comment. Nothing else in the crate may use unsafe.
#![deny(unsafe_code)]

pub mod args;
pub mod commands;
pub mod engines;
pub mod harness;
pub mod judging;
#[cfg(feature = "wire")]
pub mod kube_churn;
pub mod measure;
pub mod pipelines;
pub mod progress;
pub mod reports;
pub mod result;
pub mod runner;
#[cfg(feature = "wire")]
pub mod serve;
pub mod sync;
pub mod ui;
pub mod units;
pub mod watch_trace;
