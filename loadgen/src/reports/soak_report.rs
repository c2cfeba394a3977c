//! What `loadgen soak` measures over time, and how it is judged and shown: the samples (RSS,
//! threads, open files, queue depths, lag), the RSS slope after the warm-up, the chart (RSS and
//! lag over time) and the markdown summary.

use std::path::Path;
use std::time::Duration;

use plotters::prelude::*;

use crate::reports::chart::ChartError;

/// One sample of the soak, taken every few seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Sample {
    /// Seconds since the start.
    pub seconds: f64,
    /// Resident memory of the process, bytes.
    pub rss: u64,
    /// Threads of the process.
    pub threads: u64,
    /// Open file descriptors of the process.
    pub fds: u64,
    /// Keys waiting in the informer's queue.
    pub informer_queue: usize,
    /// Keys waiting in the workqueue (not counting those being processed).
    pub workqueue: usize,
    /// Events the informer is behind the server (newest version minus its last synced one).
    pub lag_events: u64,
    /// Faults injected so far (all kinds).
    pub faults: u64,
}

/// Reads `field` (a plain count, like `Threads`) from `/proc/self/status`.
pub fn status_count(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|line| {
        line.strip_prefix(field)?
            .strip_prefix(':')?
            .trim()
            .parse()
            .ok()
    })
}

/// Open file descriptors of this process.
pub fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

/// The samples taken after `warmup`.
pub fn after_warmup(samples: &[Sample], warmup: Duration) -> &[Sample] {
    let from = samples
        .iter()
        .position(|s| s.seconds >= warmup.as_secs_f64())
        .unwrap_or(samples.len());
    &samples[from..]
}

/// The RSS growth over the samples, as a share of the first one: the least-squares slope
/// times the span, over the RSS at the start of the span. `None` with fewer than 3 samples.
pub fn rss_growth(samples: &[Sample]) -> Option<f64> {
    if samples.len() < 3 {
        return None;
    }
    let n = samples.len() as f64;
    let mean_x = samples.iter().map(|s| s.seconds).sum::<f64>() / n;
    let mean_y = samples.iter().map(|s| s.rss as f64).sum::<f64>() / n;
    let (mut sxy, mut sxx) = (0.0, 0.0);
    for s in samples {
        sxy += (s.seconds - mean_x) * (s.rss as f64 - mean_y);
        sxx += (s.seconds - mean_x).powi(2);
    }
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    let span = samples[samples.len() - 1].seconds - samples[0].seconds;
    let start = samples[0].rss.max(1) as f64;
    Some(slope * span / start)
}

/// The spread (max − min) of a count over the samples.
pub fn spread(samples: &[Sample], count: impl Fn(&Sample) -> u64) -> u64 {
    let max = samples.iter().map(&count).max().unwrap_or(0);
    let min = samples.iter().map(&count).min().unwrap_or(0);
    max - min
}

/// RSS (MiB) and lag (events) over time, one above the other, to `path`.
pub fn soak_svg(samples: &[Sample], warmup: Duration, path: &Path) -> Result<(), ChartError> {
    let fail = |e: &dyn std::fmt::Display| ChartError {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| fail(&e))?;
    }
    let root = SVGBackend::new(path, (1000, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let (top, bottom) = root.split_vertically(320);
    let x_max = samples.last().map_or(1.0, |s| s.seconds).max(1.0);
    let mib = |s: &Sample| s.rss as f64 / (1024.0 * 1024.0);
    let rss_max = samples.iter().map(mib).fold(1.0, f64::max) * 1.1;
    let lag_max = samples
        .iter()
        .map(|s| s.lag_events as f64)
        .fold(1.0, f64::max)
        * 1.1;
    let warm = warmup.as_secs_f64();
    for (area, title, y_max, unit, value) in [
        (
            &top,
            "resident memory",
            rss_max,
            "MiB",
            &mib as &dyn Fn(&Sample) -> f64,
        ),
        (&bottom, "informer lag", lag_max, "events", &|s: &Sample| {
            s.lag_events as f64
        }),
    ] {
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc(unit)
            .draw()
            .map_err(|e| fail(&e))?;
        chart
            .draw_series(LineSeries::new(
                samples.iter().map(|s| (s.seconds, value(s))),
                RGBColor(0x4c, 0x72, 0xb0).stroke_width(2),
            ))
            .map_err(|e| fail(&e))?;
        if warm > 0.0 && warm < x_max {
            chart
                .draw_series(LineSeries::new(
                    [(warm, 0.0), (warm, y_max)],
                    RGBColor(0xaa, 0xaa, 0xaa),
                ))
                .map_err(|e| fail(&e))?;
        }
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: f64, rss: u64) -> Sample {
        Sample {
            seconds,
            rss,
            ..Sample::default()
        }
    }

    #[test]
    fn growth_is_the_fitted_slope_over_the_span() {
        let flat: Vec<Sample> = (0..10).map(|i| at(i as f64, 100)).collect();
        assert_eq!(rss_growth(&flat), Some(0.0));
        let rising: Vec<Sample> = (0..11).map(|i| at(i as f64, 100 + i)).collect();
        let growth = rss_growth(&rising).unwrap();
        assert!((growth - 0.10).abs() < 1e-9, "{growth}");
        assert_eq!(rss_growth(&rising[..2]), None);
        assert_eq!(after_warmup(&rising, Duration::from_secs(8)).len(), 3);
        assert_eq!(spread(&rising, |s| s.rss), 10);
    }
}
