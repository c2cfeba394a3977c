//! Latency over time: when a run's slow events happened, not only how slow they were.
//!
//! A run's histogram says *that* p99 is 70 ms, not whether every event waited a little or the
//! pipeline stopped for 70 ms a few times. With the timeline on, each consumer also keeps every
//! sampled event as (pop time, latency), and the run is cut into fixed intervals of pop time,
//! each with its sample count, p50, p99 and max. A stall shows up as a few intervals whose max
//! is far above their neighbours'; a backlog as a rising p50.
//!
//! The samples cost 16 bytes per sampled event (one in [`SAMPLE_EVERY`]), which would show in
//! the run's peak memory, so they are kept only when asked for: `loadgen run --timeline FILE`
//! sets [`ENV`] for itself and for the child processes it starts.
//!
//! [`SAMPLE_EVERY`]: crate::measure::latency::SAMPLE_EVERY

use std::fmt::Write as _;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use crate::measure::latency::new_histogram;

/// The environment variable that turns sample keeping on (any non-empty value).
pub const ENV: &str = "LOADGEN_TIMELINE";

/// The width of one interval of the timeline, in milliseconds.
pub const INTERVAL_MS: u64 = 100;

/// Turns sample keeping on for this process and the children it starts. Call it before any
/// thread is spawned (it sets an environment variable).
pub fn enable() {
    std::env::set_var(ENV, "1");
}

/// Whether this process keeps samples (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(ENV).is_some_and(|v| !v.is_empty()))
}

/// One sampled event: when it was popped and how long it had waited, in nanoseconds since the
/// run started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Pop time.
    pub at_ns: u64,
    /// Enqueue-to-pop latency.
    pub latency_ns: u64,
}

/// One interval of a timeline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// Start of the interval, in milliseconds since the run started.
    pub t_ms: u64,
    /// Sampled events popped in it.
    pub samples: u64,
    /// Median latency, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Slowest sampled event, microseconds.
    pub max_us: f64,
}

/// Cuts `samples` (any order) into intervals of `width_ms` of pop time; intervals with no
/// sample are left out (the consumer popped nothing sampled then, which is itself visible as
/// a gap in `t_ms`).
///
/// ```
/// use loadgen::measure::timeline::{intervals, Sample};
/// let s = |at_ms: u64, lat_us: u64| Sample { at_ns: at_ms * 1_000_000, latency_ns: lat_us * 1000 };
/// let t = intervals(&[s(5, 10), s(50, 30), s(250, 70_000)], 100);
/// assert_eq!(t.len(), 2);
/// assert_eq!((t[0].t_ms, t[0].samples), (0, 2));
/// assert_eq!(t[1].t_ms, 200);
/// assert!((t[1].max_us - 70_000.0).abs() < 100.0);
/// ```
pub fn intervals(samples: &[Sample], width_ms: u64) -> Vec<Interval> {
    let width_ns = width_ms.max(1) * 1_000_000;
    let mut sorted: Vec<Sample> = samples.to_vec();
    sorted.sort_unstable_by_key(|s| s.at_ns);
    let mut out = Vec::new();
    let mut rest = &sorted[..];
    while let Some(first) = rest.first() {
        let slot = first.at_ns / width_ns;
        let end = rest.partition_point(|s| s.at_ns / width_ns == slot);
        let mut hist = new_histogram();
        for s in &rest[..end] {
            hist.saturating_record(s.latency_ns.max(1));
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        out.push(Interval {
            t_ms: slot * width_ms.max(1),
            samples: hist.len(),
            p50_us: us(hist.value_at_quantile(0.5)),
            p99_us: us(hist.value_at_quantile(0.99)),
            max_us: us(hist.max()),
        });
        rest = &rest[end..];
    }
    out
}

/// How many intervals had a sampled event slower than `limit_us`: the run's stalls, counted
/// once per interval.
pub fn stalls(timeline: &[Interval], limit_us: f64) -> usize {
    timeline.iter().filter(|i| i.max_us > limit_us).count()
}

/// The timelines of a run's engines as CSV: `engine,t_ms,samples,p50_us,p99_us,max_us`.
pub fn csv<'a>(rows: impl IntoIterator<Item = (&'a str, &'a [Interval])>) -> String {
    let mut out = String::from("engine,t_ms,samples,p50_us,p99_us,max_us\n");
    for (engine, timeline) in rows {
        for i in timeline {
            // Writing to a String cannot fail.
            let _ = writeln!(
                out,
                "{engine},{},{},{:.1},{:.1},{:.1}",
                i.t_ms, i.samples, i.p50_us, i.p99_us, i.max_us
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at_ms: u64, lat_us: u64) -> Sample {
        Sample {
            at_ns: at_ms * 1_000_000,
            latency_ns: lat_us * 1000,
        }
    }

    #[test]
    fn a_stall_shows_in_its_own_interval_only() {
        let mut samples: Vec<Sample> = (0..1000).map(|i| s(i, 20)).collect();
        samples.push(s(450, 80_000));
        let t = intervals(&samples, 100);
        assert_eq!(t.len(), 10);
        assert_eq!(t.iter().map(|i| i.samples).sum::<u64>(), 1001);
        assert_eq!(stalls(&t, 10_000.0), 1);
        assert_eq!(t[4].t_ms, 400);
        assert!(t[4].max_us >= 79_000.0);
        assert!(t[3].max_us < 21.0);
    }

    #[test]
    fn the_csv_has_one_row_per_interval_and_engine() {
        let t = intervals(&[s(1, 5), s(150, 7)], 100);
        let text = csv([("reference", &t[..]), ("sharded", &t[..])]);
        assert_eq!(text.lines().count(), 5);
        assert!(text.starts_with("engine,t_ms,"));
        assert!(text.contains("\nsharded,100,1,"));
    }

    #[test]
    fn no_samples_make_an_empty_timeline() {
        assert!(intervals(&[], 100).is_empty());
    }
}
