//! Value parsers of the command-line arguments several commands share.

use workloads::{UnknownWorkload, Workload, WorkloadSpec};

/// Parses a `--workload` argument (`w1` … `w6`), for every command that takes one.
pub fn parse_workload(s: &str) -> Result<Workload, String> {
    s.parse().map_err(|e: UnknownWorkload| e.to_string())
}

/// Parses a `--rate` of events per second (`serve`, `e2e`): a finite number above 0.
///
/// ```
/// assert_eq!(loadgen::args::parse_rate("2.5"), Ok(2.5));
/// assert!(loadgen::args::parse_rate("0").is_err());
/// assert!(loadgen::args::parse_rate("inf").is_err());
/// ```
pub fn parse_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!(
            "{s:?} is not a rate: expected events per second, a number above 0"
        )),
    }
}

/// Writes in flight at once: 1 to 1024 (`churn --concurrency`, `e2e --write-concurrency`).
///
/// ```
/// assert_eq!(loadgen::args::parse_concurrency("8"), Ok(8));
/// assert!(loadgen::args::parse_concurrency("0").is_err());
/// assert!(loadgen::args::parse_concurrency("1025").is_err());
/// ```
pub fn parse_concurrency(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(c) if (1..=1024).contains(&c) => Ok(c),
        _ => Err(format!(
            "{s:?} is not a concurrency: expected 1 to 1024 writes in flight"
        )),
    }
}

/// The workload whose pods a command over the wire serves or writes (`serve`, `e2e`, `churn`):
/// which one, its key and event counts, its seed. One definition, so the three agree on every
/// flag and on what a pod name can carry.
#[derive(Debug, Clone, clap::Args)]
pub struct PodWorkloadArgs {
    /// The workload whose events churn the pods (docs/workloads.md; W4 and W5 churn like W1).
    #[arg(long, default_value = "w1", value_parser = parse_workload)]
    pub workload: Workload,
    /// Keys (pods) of the workload [default: the workload's K].
    #[arg(long)]
    pub keys: Option<usize>,
    /// Churn events after the initial population [default: the workload's E].
    #[arg(long)]
    pub events: Option<usize>,
    /// The workload's seed.
    #[arg(long, default_value_t = workloads::DEFAULT_SEED)]
    pub seed: u64,
}

impl PodWorkloadArgs {
    /// The spec these arguments ask for, or why there is none: a pod's key must fit the
    /// `u32` its name is made from.
    ///
    /// ```
    /// use clap::Parser;
    /// #[derive(Parser)]
    /// struct Cli {
    ///     #[command(flatten)]
    ///     pods: loadgen::args::PodWorkloadArgs,
    /// }
    /// let cli = Cli::parse_from(["x", "--keys", "30", "--events", "200"]);
    /// let spec = cli.pods.spec().unwrap();
    /// assert_eq!((spec.keys, spec.events), (30, 200));
    /// assert!(Cli::parse_from(["x", "--keys", "0"]).pods.spec().is_err());
    /// ```
    pub fn spec(&self) -> Result<WorkloadSpec, String> {
        let mut spec = WorkloadSpec::new(self.workload).seed(self.seed);
        if let Some(keys) = self.keys {
            if keys == 0 || keys > u32::MAX as usize {
                return Err(format!(
                    "--keys {keys}: expected between 1 and {}",
                    u32::MAX
                ));
            }
            spec = spec.keys(keys);
        }
        if let Some(events) = self.events {
            spec = spec.events(events);
        }
        Ok(spec)
    }
}
