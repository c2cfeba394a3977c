//! Value parsers of the command-line arguments several commands share.

use workloads::{UnknownWorkload, Workload};

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
