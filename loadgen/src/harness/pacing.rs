//! Pacing a producer to an offered rate (`--rate`), and judging whether it kept its schedule.

use std::thread;
use std::time::{Duration, Instant};

use crate::result::RunResult;

/// The producer checks its schedule every this many ops (bursts of this size are fine).
pub const PACE_EVERY: usize = 16;

/// A paced producer keeps its schedule when its largest lag is at most this share of the run's
/// scheduled length (docs/workloads.md, "Capacity").
pub const MAX_LAG_SHARE: f64 = 0.01;

/// When op `n` is due, after the start, at `rate` ops per second: `n / rate` seconds.
pub fn due_time(n: usize, rate: u64) -> Duration {
    let nanos = n as u128 * 1_000_000_000 / u128::from(rate.max(1));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Whether a producer that performed `ops` ops at `rate` ops per second kept its schedule: its
/// largest lag `lag` is at most [`MAX_LAG_SHARE`] of the scheduled length `ops / rate`.
///
/// ```
/// use std::time::Duration;
/// use loadgen::harness::pacing::kept_schedule;
/// // 100,000 ops at 50,000/s are scheduled over 2 s: up to 20 ms behind is keeping up.
/// assert!(kept_schedule(Duration::from_millis(20), 100_000, 50_000));
/// assert!(!kept_schedule(Duration::from_millis(21), 100_000, 50_000));
/// ```
pub fn kept_schedule(lag: Duration, ops: usize, rate: u64) -> bool {
    lag.as_secs_f64() <= MAX_LAG_SHARE * due_time(ops, rate).as_secs_f64()
}

/// Waits until op `n` is due at `rate` ops per second after `start`: sleeps while it is far
/// off; for the last stretch (a sleep overshoots by tens of microseconds) it polls the clock,
/// yielding the CPU between polls, and spins only for the last 3 µs. Returns how late op `n`
/// already was (zero when it was early).
///
/// The producer stands for an API server on another machine: it must not take CPU the
/// consumers could use. Spinning for the whole last 200 µs would, at any rate above a few
/// thousand ops per second, mean spinning all the time: a whole core of two gone, and W5's two
/// sharded consumers sharing the other one (capacity 367k events/s against 590-617k yielding;
/// the reference's one consumer has a core either way). Yielding leaves the core to any runnable
/// consumer and still issues each op on time when none is. (Sleeping until each op was due
/// freed the core too, but sent the ops due during a sleep's overshoot together, and the
/// consumers slept between those bursts: the p50 hand-off at 200k/s went from ~10 to ~21 µs.)
pub fn pace(start: Instant, n: usize, rate: u64) -> Duration {
    let due = due_time(n, rate);
    loop {
        let now = start.elapsed();
        if now >= due {
            return now - due;
        }
        let ahead = due - now;
        if ahead > Duration::from_micros(200) {
            thread::sleep(ahead - Duration::from_micros(100));
        } else if ahead > Duration::from_micros(3) {
            thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Writes a paced run's figures into its `row`: the offered `rate`, the producer's largest
/// `lag` behind its schedule and whether it kept the schedule of its `ops` ops. A run without
/// a lag (`None`) was not paced, and gets none of them.
pub fn record_pacing(row: &mut RunResult, rate: Option<u64>, lag: Option<Duration>, ops: usize) {
    row.offered_rate = rate.filter(|_| lag.is_some());
    row.producer_lag_ms = lag.map(|lag| lag.as_secs_f64() * 1e3);
    row.kept_up = rate
        .zip(lag)
        .map(|(rate, lag)| kept_schedule(lag, ops, rate));
}
