//! `loadgen scale`: how each engine's throughput, latency and memory per key change with the
//! key count (the sweep: [`scale_sweep`](crate::runner::scale_sweep); its report:
//! [`scale_report`](crate::reports::scale_report)).

use std::path::PathBuf;
use std::process::ExitCode;

use crate::args::parse_workload;
use crate::engines::EngineChoice;
use crate::reports::report::refuse;
use crate::reports::scale_report::{table, write};
use crate::runner::scale_sweep::{
    parse_key_counts, sweep, KeyCounts, SweepPlan, DEFAULT_KEYS, DEFAULT_RATE,
};
use crate::ui::Ui;
use workloads::{Workload, DEFAULT_SEED};

/// Arguments of `loadgen scale`.
#[derive(Debug, Clone, clap::Args)]
pub struct ScaleArgs {
    /// Which workload (w1, w2, w3 or w5; w4 has no queue to pace).
    #[arg(long, value_parser = parse_workload, default_value = "w1")]
    pub workload: Workload,
    /// Which engine(s).
    #[arg(long, value_enum, default_value = "all")]
    pub engine: EngineChoice,
    /// Key counts, comma-separated; `k` and `M` suffixes allowed.
    #[arg(long, default_value = DEFAULT_KEYS, value_parser = parse_key_counts)]
    pub keys: KeyCounts,
    /// Churn events after the initial population, the same at every key count. Default: the
    /// workload's own (docs/workloads.md).
    #[arg(long)]
    pub events: Option<usize>,
    /// The offered rate of the paced runs, in ops per second.
    #[arg(long, default_value_t = DEFAULT_RATE)]
    pub rate: u64,
    /// Shards of the sharded engine: a power of two from 1 to 65536.
    #[arg(long, default_value_t = kcache::sharded::DEFAULT_SHARDS, value_parser = workloads::parse_shards)]
    pub shards: usize,
    /// The generator's seed.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Where the JSON report goes.
    #[arg(long, default_value = "results/scale.json")]
    pub json: PathBuf,
    /// Where the chart goes.
    #[arg(long, default_value = "results/scale.svg")]
    pub chart: PathBuf,
    /// Where the Markdown summary goes.
    #[arg(long, default_value = "results/scale.md")]
    pub md: PathBuf,
}

impl ScaleArgs {
    /// The sweep these arguments ask for.
    pub fn plan(&self) -> SweepPlan {
        SweepPlan {
            workload: self.workload,
            engines: self.engine.engines(),
            keys: self.keys.clone(),
            events: self.events,
            rate: self.rate,
            shards: self.shards,
            seed: self.seed,
        }
    }
}

/// Runs `loadgen scale`.
pub fn main(args: ScaleArgs) -> ExitCode {
    let written = sweep(&args.plan(), Ui::detect()).and_then(|report| {
        write(&report, &args.json, &args.chart, &args.md)?;
        Ok(report)
    });
    match written {
        Ok(report) => {
            print!("{}", table(&report));
            eprintln!(
                "wrote {}, {} and {}",
                args.json.display(),
                args.chart.display(),
                args.md.display()
            );
            if report.points.iter().all(|p| p.ok) {
                ExitCode::SUCCESS
            } else {
                eprintln!("scale: a run's verdict failed (see `runs` in the JSON report)");
                ExitCode::from(1)
            }
        }
        Err(e) => refuse("scale", e),
    }
}
