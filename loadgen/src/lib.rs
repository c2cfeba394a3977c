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
//! | 1 | [`latency`], [`timeline`], [`rss`], [`allocator`], [`cpu`], [`machine`], [`thp`] | enqueue-to-pop latency sampling; latency over time (per-interval p50/p99/max, to locate stalls); peak resident memory; the bytes the allocator has committed; the CPU a run spent; what machine a run was on and the command line that made it; restarting with mimalloc's transparent-huge-page advice off (its faults stall runs) |
//! | 1 | [`engines`], [`args`], [`progress`], [`ui`], [`units`], [`sync`] | engine names and one run's knobs; value parsers several commands share; progress reporting and bars and notes on stderr; numbers as tables show them; a lock that survives a panicked holder |
//! | 1 | [`result`] | one engine's measured result: the row every report shows and the JSON a child process hands back |
//! | 1 | [`watch_trace`] | a recorded watch stream (`kubectl get --watch -o json`) parsed and turned into a workload |
//! | 2 | [`driver`], [`pacing`], [`readers`], [`server_feed`] | runs a generated workload through an engine (producer, consumers, counters, timing); paces a producer to an offered rate; W4's readers; the in-memory API server and the producer that writes a workload into it |
//! | 2 | [`verdict`], [`informer_verdict`], [`handler_ledger`], [`informer_handlers`] | judges a finished run against the workload's model; judges each handler of a run through the informer; checks one handler's notifications against a server's state, where no model is at hand (faults over the wire, `soak`); the handlers a run registers on the informer, which record what they hear (one slow) |
//! | 2 | [`controller_loop`], [`controller_informer`], [`controller_resync`], [`through_informer`], [`harness_floor`] | W6 on the bare queue: DeltaFIFO, indexer, workqueue and workers as one controller; W6 through the shared informer (the default W6) on kcache's `Controller`; W7, that controller under a resync storm, with and without priority; the same events through the whole informer pipeline; the harness floor, a client that drains the same server into nothing |
//! | 2 | [`priority_scheduling`] | W8: a workqueue saturated by one namespace's churn, an initial list's backlog at low priority and other namespaces' trickle (or two namespaces at 10:1), under each order (first in first out, priority, aging, fairness); waits per class, each namespace's share of the workers |
//! | 2 | [`isolate`], [`runs`], [`run_spec`] | each row of a run in a child process of its own; a workload generated and one engine bare on it, measured and judged; one row of a run as data (events, subject, engine knobs, pipeline), the one dispatch that runs it and the JSON a child is handed |
//! | 2 | [`capacity_search`], [`scale_sweep`] | the highest offered rate an engine keeps up with (the search and its probes); the sweep over key counts |
//! | 2 | [`wq_round_trip`] | the workqueue round trip: a producer and N workers through any work queue, timed, with the workers' context switches |
//! | 3 | [`report`], [`chart`], [`capacity_report`], [`scale_report`], [`soak_report`] | the run table, the JSON report, files written, exit codes; SVG charts; the capacity tables and claim; the sweep's table, page and chart; a soak's samples, RSS slope and chart |
//! | 3 | `kube_churn` (feature wire) | a `loadgen churn` child against the API server a kubeconfig names: its command line, its record of writes (read whole or as it grows), the cleanup of its pods; what `e2e --kubeconfig` and `soak --kubeconfig` share |
//! | 3 | `serve` (feature wire) | the synthetic Kubernetes API server for pods (docs/wire.md) that `loadgen serve` and `loadgen e2e` run (its command line still lives in `serve/mod.rs`) |
//! | 4 | [`commands::run`], [`commands::child`], [`commands::compare`], [`commands::capacity`], [`commands::scale`], [`commands::replay`], [`commands::ops`], [`commands::workqueue`], `e2e` (feature wire), [`commands::soak`] (feature wire), `commands::churn` (feature wire) | one module per command: `loadgen run`, `child` (one row of a run, hidden), `compare`, `capacity`, `scale`, `replay` (a recorded watch stream), `ops` (an ops trace, docs/traces.md), `workqueue` (the workqueue round trip), `churn` (a workload's writes into a real API server), `e2e` (real clients against `serve`), `soak` (the pipeline for hours, with faults against `serve`, or against a server a kubeconfig names) |
//!
//! A command never imports another command: what two commands share lives a layer down
//! (`compare` runs the same [`runs`], [`capacity_search`] and [`scale_sweep`] as `run`,
//! `capacity` and `scale`). `main.rs` only parses the command line and dispatches.

// `deny`, not `forbid`: reading the allocator's figures (src/allocator.rs) calls one C function,
// allowed there alone with a `SAFETY:` comment. Nothing else in the crate may use unsafe.
#![deny(unsafe_code)]

pub mod allocator;
pub mod args;
pub mod capacity_report;
pub mod capacity_search;
pub mod chart;
pub mod commands;
pub mod controller_informer;
pub mod controller_loop;
pub mod controller_resync;
pub mod cpu;
pub mod driver;
#[cfg(feature = "wire")]
pub mod e2e;
pub mod engines;
pub mod handler_ledger;
pub mod harness_floor;
pub mod informer_handlers;
pub mod informer_verdict;
pub mod isolate;
#[cfg(feature = "wire")]
pub mod kube_churn;
pub mod latency;
pub mod machine;
pub mod pacing;
pub mod priority_scheduling;
pub mod progress;
pub mod readers;
pub mod report;
pub mod result;
pub mod rss;
pub mod run_spec;
pub mod runs;
pub mod scale_report;
pub mod scale_sweep;
#[cfg(feature = "wire")]
pub mod serve;
pub mod server_feed;
pub mod soak_report;
pub mod sync;
pub mod thp;
pub mod through_informer;
pub mod timeline;
pub mod ui;
pub mod units;
pub mod verdict;
pub mod watch_trace;
pub mod wq_round_trip;
