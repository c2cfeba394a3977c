//! The CPU a run spent (user + system, every thread of the process), from `/proc/self/stat`.
//!
//! The figure is the process's: the producer, the engine's consumers, the informer's threads,
//! W6's workers, and the harness's own bookkeeping. Threads that ended during the run are
//! included (the kernel adds a thread's time to its process when the thread exits), which
//! `getrusage(RUSAGE_SELF)` would also give but only through `libc` and `unsafe`; this crate
//! forbids `unsafe` and reads `/proc` already for memory ([`rss`](crate::measure::rss)).
//!
//! The counters tick in clock ticks of [`TICKS_PER_S`] (10 ms): a run of a few milliseconds
//! reads as 0 or one tick, so the per-event figure means something from runs of a second up.

use std::fs;
use std::time::Duration;

/// Clock ticks per second of `/proc/<pid>/stat`'s times: Linux's `USER_HZ`, 100 on every
/// architecture the kernel supports (it is part of the ABI, unlike the kernel's own `HZ`).
pub const TICKS_PER_S: u64 = 100;

/// User and system CPU of this process so far; `None` without `/proc/self/stat`.
pub fn process_cpu() -> Option<Duration> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    parse_stat_cpu(&stat)
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line, as a duration.
///
/// The command name (field 2) is in parentheses and may hold spaces and parentheses itself,
/// so the fields are counted from the last `)`.
///
/// ```
/// use std::time::Duration;
/// let stat = "42 (my (odd) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
/// assert_eq!(loadgen::measure::cpu::parse_stat_cpu(stat), Some(Duration::from_secs(3)));
/// assert_eq!(loadgen::measure::cpu::parse_stat_cpu("42 (x) S 1"), None);
/// ```
pub fn parse_stat_cpu(stat: &str) -> Option<Duration> {
    let (_, after_name) = stat.rsplit_once(')')?;
    // The fields after the name start at field 3 (the state): utime is field 14.
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    let ticks = utime.checked_add(stime)?;
    Some(Duration::from_millis(
        ticks.checked_mul(1000 / TICKS_PER_S)?,
    ))
}

/// One measurement, from before a run to its end (as [`RssProbe`](crate::measure::rss::RssProbe)).
#[derive(Debug, Clone, Copy)]
pub struct CpuProbe {
    start: Option<Duration>,
}

impl CpuProbe {
    /// Reads the process's CPU so far. Call after generating the events, so that generating
    /// them is not counted.
    pub fn start() -> Self {
        Self {
            start: process_cpu(),
        }
    }

    /// The CPU the process spent since [`start`](Self::start); `None` without `/proc`.
    pub fn finish(&self) -> Option<Duration> {
        Some(process_cpu()?.saturating_sub(self.start?))
    }
}

/// `cpu_s` and `cpu_us_per_event` of a run's row from what its [`CpuProbe`] found.
///
/// ```
/// use std::time::Duration;
/// let (s, per) = loadgen::measure::cpu::cpu_figures(Some(Duration::from_millis(500)), 1_000_000);
/// assert_eq!(s, Some(0.5));
/// assert_eq!(per, Some(0.5));
/// assert_eq!(loadgen::measure::cpu::cpu_figures(None, 10), (None, None));
/// ```
pub fn cpu_figures(spent: Option<Duration>, events: u64) -> (Option<f64>, Option<f64>) {
    let secs = spent.map(|d| d.as_secs_f64());
    let per_event = secs.filter(|_| events > 0).map(|s| s * 1e6 / events as f64);
    (secs, per_event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_spent_some_cpu_and_a_busy_loop_adds_to_it() {
        let probe = CpuProbe::start();
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(60) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        std::hint::black_box(x);
        let spent = probe.finish().expect("/proc/self/stat on Linux");
        assert!(spent >= Duration::from_millis(20), "{spent:?}");
    }
}
