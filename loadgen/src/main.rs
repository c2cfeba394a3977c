//! `loadgen`: replays ops traces and synthetic watch events through kcache's engines.
//!
//! - `loadgen ops --engine reference|sharded|workqueue-reference|workqueue [--shards N]`: docs/traces.md trace replay, stdin → stdout.
//! - `loadgen run --workload w1..w6 --engine reference|sharded|all ...`: one workload.
//! - `loadgen compare`: W1–W6 side by side, table + JSON + charts in `results/`.
//! - `loadgen capacity --workload w1|w2|w5`: the highest offered rate each engine keeps up with.
//! - `loadgen replay --trace FILE`: a recorded `kubectl get --watch -o json` stream.
//! - `loadgen serve --workload wN --rate R` (feature `wire`): a synthetic Kubernetes API server.
//! - `loadgen churn --kubeconfig FILE --workload wN --rate R` (feature `wire`): the workload's
//!   writes into an API server (`serve --writes` or a real cluster); `--cleanup --run ID`.
//! - `loadgen scale --workload w1 --engine all [--keys 10k,100k,1M,4M]`: a sweep over key counts.
//! - `loadgen e2e --workload wN --rate R --client ROW|all` (feature `wire`; rows `kcache`,
//!   `kcache-protobuf`, `kcache-json`, `kcache-metadata`, `kube-rs`, `serve-alone`): real clients (kcache's
//!   informer through kube-rs or its own client, kube-rs' own reflector) and a discarding
//!   reader (the server alone) against `serve`; `--watchers N`: one server's fan-out to N
//!   watchers.

#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "loadgen",
    version,
    about = "Drives kcache's engines with traces and synthetic watch events"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay an ops trace (docs/traces.md) from stdin; one JSON line per output on stdout.
    Ops(loadgen::commands::ops::OpsArgs),
    /// Run one workload (docs/workloads.md) through one engine or all, and report.
    Run(loadgen::commands::run::RunArgs),
    /// Run W1–W6 through both engines side by side; write results/latest.{json,md} and charts.
    Compare(loadgen::commands::compare::CompareArgs),
    /// Find the highest offered rate each engine keeps up with (p99 within a limit), with its
    /// latency curve (docs/workloads.md, "Capacity").
    Capacity(loadgen::commands::capacity::CapacityArgs),
    /// Replay a recorded Kubernetes watch stream through both engines.
    Replay(loadgen::commands::replay::ReplayArgs),
    /// Serve pods as a Kubernetes API server (docs/wire.md), churning them at a chosen rate.
    #[cfg(feature = "wire")]
    Serve(loadgen::serve::ServeArgs),
    /// Sweep the key count: events/s, paced p99 and bytes per key of each engine, with a
    /// chart.
    Scale(loadgen::commands::scale::ScaleArgs),
    /// The workqueue round trip: one producer, N workers, no work per key, for each queue
    /// (client-go's, sharded, and the priority queues); keys/s and context switches.
    Workqueue(loadgen::commands::workqueue::WorkqueueArgs),
    /// Run kcache's informer (through its kube-rs adapter) and kube-rs' own reflector against
    /// `serve`, and report events/s, lag, memory and a verdict per client.
    #[cfg(feature = "wire")]
    E2e(loadgen::commands::e2e::E2eArgs),
    /// The whole pipeline for a long time with faults: serve → informer → workqueue →
    /// workers, sampling memory, threads, fds, queues and lag, with a verdict and a chart.
    #[cfg(feature = "wire")]
    Soak(loadgen::commands::soak::SoakArgs),
    /// Write a workload's pods (creates, updates, deletes at its mix and a rate) into the API
    /// server a kubeconfig names, touching only its own pods; `--cleanup` removes them
    /// (docs/real-clusters.md).
    #[cfg(feature = "wire")]
    Churn(loadgen::commands::churn::ChurnArgs),
    /// One row of a run, in a process of its own: its spec as JSON on stdin (started by the
    /// commands that run engines, see `isolate.rs`).
    #[command(hide = true)]
    Child(loadgen::commands::child::ChildArgs),
    /// One client of `e2e`, in a process of its own (started by `e2e`).
    #[cfg(feature = "wire")]
    #[command(hide = true)]
    E2eClient(loadgen::commands::e2e::client::E2eClientArgs),
    /// A process of watchers of `e2e --watchers` (started by `e2e`).
    #[cfg(feature = "wire")]
    #[command(hide = true)]
    E2eWatchers(loadgen::commands::e2e::watchers::E2eWatchersArgs),
}

fn main() -> ExitCode {
    // Before anything else: mimalloc's huge-page faults stall the engines (see the module).
    #[cfg(feature = "mimalloc")]
    loadgen::measure::thp::reexec_without_thp();
    let cli = Cli::parse();
    match cli.command {
        Command::Ops(args) => loadgen::commands::ops::main(args),
        Command::Run(args) => loadgen::commands::run::main(args),
        Command::Compare(args) => loadgen::commands::compare::main(args),
        Command::Capacity(args) => loadgen::commands::capacity::main(args),
        Command::Replay(args) => loadgen::commands::replay::main(args),
        #[cfg(feature = "wire")]
        Command::Serve(args) => loadgen::serve::main(args),
        Command::Scale(args) => loadgen::commands::scale::main(args),
        Command::Workqueue(args) => loadgen::commands::workqueue::main(args),
        Command::Child(args) => loadgen::commands::child::main(args),
        #[cfg(feature = "wire")]
        Command::E2e(args) => loadgen::commands::e2e::main(args),
        #[cfg(feature = "wire")]
        Command::Soak(args) => loadgen::commands::soak::main(args),
        #[cfg(feature = "wire")]
        Command::Churn(args) => loadgen::commands::churn::main(args),
        #[cfg(feature = "wire")]
        Command::E2eClient(args) => loadgen::commands::e2e::client::main(args),
        #[cfg(feature = "wire")]
        Command::E2eWatchers(args) => loadgen::commands::e2e::watchers::child_main(args),
    }
}
