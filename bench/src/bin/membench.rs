//! `membench`: how much memory each engine adds while it carries W1 and W3 (docs/workloads.md).
//!
//! For each engine (reference, sharded), runs W1 at 100,000 keys and W3 at 150,000 keys through
//! queue + indexer with one producer and one consumer, and reports the peak bytes above the
//! pre-run baseline and the allocations made during the run (see `bench::mem` for exactly what
//! is counted). Prints a table; `--json PATH` also writes the reports as JSON.
//!
//! ```text
//! cargo run --release -p bench --bin membench -- --events 1000000 --json /tmp/mem.json
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use bench::alloc::CountingAlloc;
use bench::mem::{breakdown, generate_workload, measure, table, Engine, MemReport};
use clap::Parser;
use workloads::{Workload, DEFAULT_SEED};

/// Every allocation of this binary goes through the counter.
#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

/// Peak memory and allocation count of each engine on W1 and W3.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Churn events per workload (W3: over its 10 rounds).
    #[arg(long, default_value_t = 1_000_000)]
    events: usize,
    /// Keys of W1.
    #[arg(long, default_value_t = 100_000)]
    w1_keys: usize,
    /// Keys of W3.
    #[arg(long, default_value_t = 150_000)]
    w3_keys: usize,
    /// Shards of the sharded engine: a power of two from 1 to 65536.
    #[arg(long, default_value_t = kcache::sharded::DEFAULT_SHARDS, value_parser = workloads::parse_shards)]
    shards: usize,
    /// The workload generator's seed.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Also write the reports to this file, as a JSON array.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut reports: Vec<MemReport> = Vec::new();
    for (workload, keys) in [(Workload::W1, args.w1_keys), (Workload::W3, args.w3_keys)] {
        eprintln!("generating {workload}: {keys} keys, {} events", args.events);
        let gen = generate_workload(workload, keys, args.events, args.seed);
        for engine in Engine::ALL {
            eprintln!("running {engine} on {workload}");
            reports.push(measure(engine, args.shards, &gen, &ALLOC));
        }
    }
    print!("{}", table(&reports));
    print!("{}", breakdown(&reports));

    if let Some(path) = &args.json {
        let json = match serde_json::to_string_pretty(&reports) {
            Ok(json) => json,
            Err(err) => {
                eprintln!("membench: cannot encode the reports as JSON: {err}");
                return ExitCode::FAILURE;
            }
        };
        if let Err(err) = std::fs::write(path, json + "\n") {
            eprintln!("membench: cannot write {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
        eprintln!("wrote {}", path.display());
    }
    if reports.iter().all(|r| r.store_matches_model) {
        ExitCode::SUCCESS
    } else {
        eprintln!("membench: an engine's store did not end in the model's state");
        ExitCode::FAILURE
    }
}
