//! Enqueue-to-pop latency: a sample of events is stamped, and the consumer records each stamped
//! delta it pops into an hdrhistogram.
//!
//! Reading the clock costs tens of nanoseconds, about what an engine spends per event, so only
//! every [`SAMPLE_EVERY`]th event is stamped: timing then costs the producer and the consumers
//! a few percent at most.

use hdrhistogram::Histogram;

/// The producer stamps events whose index is a multiple of this.
pub const SAMPLE_EVERY: usize = 16;

/// The highest latency recorded exactly (one hour, in nanoseconds); longer ones are clamped.
const MAX_NS: u64 = 3_600_000_000_000;

/// A histogram of nanoseconds, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    // The bounds are constants that hdrhistogram accepts (low >= 1, high >= 2 * low, sigfig <= 5).
    Histogram::new_with_bounds(1, MAX_NS, 3).expect("constant histogram bounds are valid")
}

/// p50, p99 and p99.9 in microseconds; `None` when nothing was recorded.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

impl Percentiles {
    /// The percentiles of `hist` (recorded in nanoseconds), in microseconds.
    ///
    /// ```
    /// let mut h = loadgen::measure::latency::new_histogram();
    /// for ns in 1..=1000u64 { h.record(ns * 1000).unwrap(); }
    /// let p = loadgen::measure::latency::Percentiles::of(&h).unwrap();
    /// assert!((p.p50 - 500.0).abs() < 1.0);
    /// ```
    pub fn of(hist: &Histogram<u64>) -> Option<Self> {
        if hist.is_empty() {
            return None;
        }
        let us = |q: f64| hist.value_at_quantile(q) as f64 / 1000.0;
        Some(Self {
            p50: us(0.50),
            p99: us(0.99),
            p999: us(0.999),
        })
    }
}
