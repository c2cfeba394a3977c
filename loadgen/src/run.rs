//! `loadgen run`: one workload (docs/workloads.md) through one engine or both, on the same events.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::driver::{EngineConfig, EngineKind, Mode};
use crate::report::{measure, table, write_json, RunResult};
use crate::ui::Ui;
use crate::workload::{generate, Generated, Workload, WorkloadSpec, DEFAULT_SEED};

/// W5's handler cost when `--handler-us` is not given.
pub const DEFAULT_W5_HANDLER_US: u64 = 2;

/// `reference`, `sharded` or `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineChoice {
    /// The faithful client-go port only.
    Reference,
    /// The sharded engine only.
    Sharded,
    /// Both, reference first, on the same events.
    All,
}

impl EngineChoice {
    /// The engines to run, in order.
    pub fn engines(self) -> Vec<EngineKind> {
        match self {
            EngineChoice::Reference => vec![EngineKind::Reference],
            EngineChoice::Sharded => vec![EngineKind::Sharded],
            EngineChoice::All => EngineKind::ALL.to_vec(),
        }
    }
}

/// Arguments of `loadgen run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Which workload: w1 (steady churn), w2 (hot keys), w3 (relist storm), w4 (read heavy),
    /// w5 (slow handlers).
    #[arg(long, value_parser = parse_workload)]
    pub workload: Workload,
    /// Which engine(s).
    #[arg(long, value_enum, default_value = "all")]
    pub engine: EngineChoice,
    /// Churn events after the initial population (W3: over all 10 rounds). Default: the workload's own (docs/workloads.md).
    #[arg(long)]
    pub events: Option<usize>,
    /// Keys. Default: the workload's own (W2 1,000,000, W3 150,000, others 100,000).
    #[arg(long)]
    pub keys: Option<usize>,
    /// Shards of the sharded engine: a power of two from 1 to 65536.
    #[arg(long, default_value_t = kcache::sharded::DEFAULT_SHARDS, value_parser = crate::driver::parse_shards)]
    pub shards: usize,
    /// Consumer threads of the sharded engine (the reference always uses exactly one).
    /// Default: 2 for w5 (its slow handler is what extra consumers are for), 1 otherwise (one
    /// producer and one consumer on two cores; a second consumer only competes for a core).
    #[arg(long)]
    pub consumers: Option<usize>,
    /// W4's reader threads.
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// CPU microseconds the handler burns per delta (default 2 for w5, 0 otherwise).
    #[arg(long)]
    pub handler_us: Option<u64>,
    /// The splitmix64 seed.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Offered load in ops per second: the producer paces itself instead of running flat out.
    /// Without it a run measures capacity, and its latency is mostly time queued behind the
    /// backlog; with a rate both engines can absorb, latency is the engine's own hand-off.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Run every engine in this process, one after another, instead of one child process per
    /// engine. Faster to debug and profile, but the peak memory of every run after the first
    /// is understated: the allocator hands the next run what the previous one freed.
    #[arg(long)]
    pub in_process: bool,
}

fn parse_workload(s: &str) -> Result<Workload, String> {
    s.parse()
        .map_err(|e: crate::workload::UnknownWorkload| e.to_string())
}

impl RunArgs {
    /// The workload spec these arguments ask for.
    pub fn spec(&self) -> WorkloadSpec {
        let mut spec = WorkloadSpec::new(self.workload).seed(self.seed);
        if let Some(keys) = self.keys {
            spec = spec.keys(keys);
        }
        if let Some(events) = self.events {
            spec = spec.events(events);
        }
        spec
    }

    /// The engine knobs these arguments ask for.
    pub fn config(&self) -> EngineConfig {
        let handler_us = self.handler_us.unwrap_or(if self.workload == Workload::W5 {
            DEFAULT_W5_HANDLER_US
        } else {
            0
        });
        EngineConfig {
            shards: self.shards,
            consumers: self
                .consumers
                .unwrap_or(default_consumers(self.workload))
                .max(1),
            readers: self.readers,
            handler_cost: Duration::from_micros(handler_us),
            rate: self.rate,
        }
    }
}

/// Why a workload could not be run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The arguments make no workload.
    #[error("invalid arguments: {0}")]
    Invalid(String),
    /// An engine refused the workload.
    #[error(transparent)]
    Engine(#[from] crate::driver::EngineError),
    /// A child process for one engine failed.
    #[error(transparent)]
    Isolate(#[from] crate::isolate::IsolateError),
}

/// The `run` command line that makes a child process run `engine` alone on `spec`.
pub fn child_args(spec: &WorkloadSpec, engine: EngineKind, cfg: &EngineConfig) -> Vec<String> {
    let mut args = [
        "run",
        "--workload",
        spec.workload.name(),
        "--engine",
        engine.name(),
        "--keys",
        &spec.keys.to_string(),
        "--events",
        &spec.events.to_string(),
        "--seed",
        &spec.seed.to_string(),
        "--shards",
        &cfg.shards.to_string(),
        "--consumers",
        &cfg.consumers.to_string(),
        "--readers",
        &cfg.readers.to_string(),
        "--handler-us",
        &cfg.handler_cost.as_micros().to_string(),
        "--in-process",
    ]
    .map(String::from)
    .to_vec();
    if let Some(rate) = cfg.rate {
        args.extend(["--rate".to_string(), rate.to_string()]);
    }
    args
}

/// Generates `spec` (before any clock starts), with progress.
pub fn generate_with_progress(spec: &WorkloadSpec, ui: Ui) -> Result<Generated, RunError> {
    if spec.keys == 0 {
        return Err(RunError::Invalid("--keys must be at least 1".to_string()));
    }
    let phase = ui.phase(format!("{} generate", spec.workload), 0);
    let gen = generate(spec);
    phase.finish(&format!(
        "{} ops, {} keys",
        gen.ops.len(),
        gen.universe.keys.len()
    ));
    Ok(gen)
}

/// Runs `engines` one after another on `gen`, each measured and judged.
pub fn run_engines(
    gen: &Generated,
    workload: &str,
    mode: Mode,
    engines: &[EngineKind],
    cfg: &EngineConfig,
    ui: Ui,
) -> Result<Vec<RunResult>, RunError> {
    let mut results = Vec::with_capacity(engines.len());
    for &engine in engines {
        let phase = ui.phase(format!("{workload} {engine}"), gen.ops.len() as u64);
        let result = measure(engine, workload, gen, mode, cfg, &phase)?;
        phase.finish(&format!(
            "{} events/s, verdict {}",
            crate::report::si(result.events_per_s),
            result.verdict
        ));
        results.push(result);
    }
    Ok(results)
}

/// Generates the workload of `args` and runs the chosen engines on it: in this process for
/// one engine or with `--in-process`, else each engine in a child process of its own
/// (see [`isolate`](crate::isolate)).
pub fn run(args: &RunArgs, ui: Ui) -> Result<Vec<RunResult>, RunError> {
    let engines = args.engine.engines();
    if engines.len() > 1 && !args.in_process {
        let (spec, cfg) = (args.spec(), args.config());
        if spec.keys == 0 {
            return Err(RunError::Invalid("--keys must be at least 1".to_string()));
        }
        let mut results = Vec::new();
        for engine in engines {
            results.extend(crate::isolate::run_child(&child_args(&spec, engine, &cfg))?);
        }
        return Ok(results);
    }
    let gen = generate_with_progress(&args.spec(), ui)?;
    let mode = if args.workload.uses_queue() {
        Mode::Queue
    } else {
        Mode::Direct
    };
    run_engines(
        &gen,
        args.workload.name(),
        mode,
        &engines,
        &args.config(),
        ui,
    )
}

/// Prints the table, writes the JSON if asked, and turns the verdicts into an exit code:
/// 0 when every verdict is ok, 1 otherwise, 2 when the report could not be written.
pub fn finish(results: &[RunResult], json: Option<&std::path::Path>) -> ExitCode {
    print!("{}", table(results));
    for r in results.iter().filter(|r| !r.is_ok()) {
        eprintln!("{} {}: verdict failed:", r.engine, r.workload);
        for failure in &r.failures {
            eprintln!("  {failure}");
        }
    }
    if let Some(path) = json {
        if let Err(e) = write_json(path, results) {
            eprintln!("loadgen: {e}");
            return ExitCode::from(2);
        }
    }
    if results.iter().all(RunResult::is_ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Runs `loadgen run`.
pub fn main(args: RunArgs) -> ExitCode {
    match run(&args, Ui::detect()) {
        Ok(results) => finish(&results, args.json.as_deref()),
        Err(e) => {
            eprintln!("loadgen run: {e}");
            ExitCode::from(2)
        }
    }
}

/// The sharded engine's consumer threads when none are asked for: two for W5's slow handler,
/// one otherwise.
pub fn default_consumers(workload: Workload) -> usize {
    if workload == Workload::W5 {
        2
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    fn parse(args: &[&str]) -> RunArgs {
        Cli::parse_from(std::iter::once("run").chain(args.iter().copied())).run
    }

    #[test]
    fn a_child_command_line_asks_for_exactly_the_parents_run() {
        let parent = parse(&[
            "--workload",
            "w5",
            "--keys",
            "123",
            "--events",
            "4567",
            "--seed",
            "9",
            "--shards",
            "8",
            "--consumers",
            "3",
            "--readers",
            "4",
        ]);
        let (spec, cfg) = (parent.spec(), parent.config());
        let args = child_args(&spec, EngineKind::Sharded, &cfg);
        let child = parse(&args.iter().skip(1).map(String::as_str).collect::<Vec<_>>());
        assert_eq!(child.spec(), spec);
        assert_eq!(child.config(), cfg);
        assert_eq!(child.engine, EngineChoice::Sharded);
        assert!(
            child.in_process,
            "a child must not spawn children of its own"
        );
    }

    #[test]
    fn w5_burns_two_microseconds_per_delta_unless_told_otherwise() {
        let w5 = parse(&["--workload", "w5"]);
        assert_eq!(w5.config().handler_cost, Duration::from_micros(2));
        let w1 = parse(&["--workload", "w1"]);
        assert_eq!(w1.config().handler_cost, Duration::ZERO);
        let slow_w1 = parse(&["--workload", "w1", "--handler-us", "7"]);
        assert_eq!(slow_w1.config().handler_cost, Duration::from_micros(7));
    }

    #[test]
    fn a_failed_verdict_makes_the_command_exit_non_zero() {
        let args = parse(&["--workload", "w1", "--keys", "50", "--events", "300"]);
        let mut results = run(
            &RunArgs {
                engine: EngineChoice::Reference,
                ..args
            },
            Ui::Quiet,
        )
        .expect("tiny run");
        assert_eq!(finish(&results, None), ExitCode::SUCCESS);
        results[0].failures.push("missing key x".into());
        assert_eq!(finish(&results, None), ExitCode::FAILURE);
    }
}
