//! Peak resident memory an engine run added, from `/proc/self`.
//!
//! Before a run, writing `5` to `/proc/self/clear_refs` resets the kernel's high-water mark
//! (`VmHWM`) to the current resident size; `VmRSS` then is the baseline (the generated events
//! are already resident). After the run, before anything of it is dropped, `VmHWM − baseline`
//! is the peak the engine added. Where `clear_refs` cannot be written (not Linux, or a
//! restricted container) the fallback is `VmRSS` after the run minus the baseline, which misses
//! transient peaks; [`RssProbe::finish`] says which one was used.
//!
//! An allocator keeps memory that was freed (mimalloc for a second or more, and some for good),
//! so a second run in the same process would reuse the first one's pages and look cheaper than
//! it is. That is why `run --engine all`, `compare` and `replay` run every engine in a child
//! process of its own (see [`isolate`](crate::harness::isolate)).

use std::fs;

/// Reads a `kB` field (`VmRSS`, `VmHWM`) of `/proc/self/status`, in bytes.
pub fn status_field_bytes(field: &str) -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    parse_status_field(&status, field)
}

/// Finds `field:   1234 kB` in the text of a `/proc/<pid>/status` file; returns bytes.
///
/// ```
/// let status = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
/// assert_eq!(loadgen::measure::rss::parse_status_field(status, "VmRSS"), Some(1024 * 1024));
/// assert_eq!(loadgen::measure::rss::parse_status_field(status, "VmSwap"), None);
/// ```
pub fn parse_status_field(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        Some(kb * 1024)
    })
}

/// Resets the resident high-water mark; returns whether the kernel accepted it.
pub fn reset_peak() -> bool {
    fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// How a peak was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeakSource {
    /// `VmHWM` after resetting it: the true peak.
    HighWaterMark,
    /// `VmRSS` at the end: `clear_refs` was unavailable.
    EndResident,
}

/// One measurement, from before a run to its end.
#[derive(Debug, Clone, Copy)]
pub struct RssProbe {
    baseline: Option<u64>,
    hwm_reset: bool,
}

impl RssProbe {
    /// Resets the high-water mark and reads the baseline. Call after generating the events.
    pub fn start() -> Self {
        let hwm_reset = reset_peak();
        Self {
            baseline: status_field_bytes("VmRSS"),
            hwm_reset,
        }
    }

    /// The bytes the run added at its peak, and how that was measured; `None` without
    /// `/proc/self/status`. Call before dropping the engine.
    pub fn finish(&self) -> Option<(u64, PeakSource)> {
        let baseline = self.baseline?;
        if self.hwm_reset {
            if let Some(hwm) = status_field_bytes("VmHWM") {
                return Some((hwm.saturating_sub(baseline), PeakSource::HighWaterMark));
            }
        }
        let end = status_field_bytes("VmRSS")?;
        Some((end.saturating_sub(baseline), PeakSource::EndResident))
    }
}
