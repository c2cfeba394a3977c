//! SVG charts of a comparison and of a capacity search, drawn with plotters' SVG backend.
//!
//! No font files are needed: the SVG backend writes text as `<text>` elements and plotters'
//! built-in layout estimate (the `ttf` feature is off) places them.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::result::RunResult;
use crate::runner::capacity_search::Curve;
use crate::units::si;

/// A chart could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {message}")]
pub struct ChartError {
    /// The SVG file.
    pub path: PathBuf,
    /// What plotters said.
    pub message: String,
}

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 560;
const REFERENCE: RGBColor = RGBColor(0x4c, 0x72, 0xb0);
const SHARDED: RGBColor = RGBColor(0xdd, 0x84, 0x52);

fn engine_color(engine: &str) -> RGBColor {
    if engine == "sharded" {
        SHARDED
    } else {
        REFERENCE
    }
}

/// Workloads in the order they first appear.
fn workloads(results: &[RunResult]) -> Vec<&str> {
    crate::reports::report::first_seen(results, |r| &r.workload)
}

/// Engines in the order they first appear.
fn engines(results: &[RunResult]) -> Vec<&str> {
    crate::reports::report::first_seen(results, |r| &r.engine)
}

fn find<'a>(results: &'a [RunResult], workload: &str, engine: &str) -> Option<&'a RunResult> {
    results
        .iter()
        .find(|r| r.workload == workload && r.engine == engine)
}

/// The x-axis label at slot `x` of a chart with `slots` slots per workload: the workload's
/// name under the middle of its group of bars (bars fill slots `0..slots - 1`, the last slot
/// is the gap), nothing elsewhere.
fn group_label(loads: &[&str], slots: i32, x: i32) -> String {
    if x.rem_euclid(slots) == (slots - 1) / 2 {
        loads
            .get((x / slots) as usize)
            .map(|w| w.to_uppercase())
            .unwrap_or_default()
    } else {
        String::new()
    }
}

/// Draws the series' legend at `position`, on a light box with a border.
pub(crate) fn draw_legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
}

fn err(path: &Path, e: impl std::fmt::Display) -> ChartError {
    ChartError {
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

/// Grouped bars: events/s per workload, one bar per engine, values written above the bars.
pub fn throughput_svg(results: &[RunResult], path: &Path) -> Result<(), ChartError> {
    let loads = workloads(results);
    let engines = engines(results);
    let slots = engines.len() as i32 + 1;
    let top = results
        .iter()
        .map(|r| r.events_per_s / 1e6)
        .fold(0.0, f64::max)
        .max(1e-6)
        * 1.2;
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Throughput per workload (higher is better)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0..slots * loads.len() as i32, 0f64..top)
        .map_err(|e| err(path, e))?;
    let label = |x: &i32| group_label(&loads, slots, *x);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots as usize * loads.len() + 1)
        .x_label_formatter(&label)
        .y_desc("million events/s")
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()
        .map_err(|e| err(path, e))?;
    for (e, engine) in engines.iter().enumerate() {
        let color = engine_color(engine);
        let bars: Vec<(i32, f64)> = loads
            .iter()
            .enumerate()
            .filter_map(|(i, w)| {
                find(results, w, engine).map(|r| (i as i32 * slots + e as i32, r.events_per_s))
            })
            .collect();
        chart
            .draw_series(bars.iter().map(|&(x, v)| {
                let mut bar = Rectangle::new([(x, 0.0), (x + 1, v / 1e6)], color.filled());
                bar.set_margin(0, 0, 3, 3);
                bar
            }))
            .map_err(|e| err(path, e))?
            .label(*engine)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        chart
            .draw_series(bars.iter().map(|&(x, v)| {
                Text::new(
                    si(v),
                    (x, v / 1e6 + top * 0.02),
                    ("sans-serif", 13).into_font(),
                )
            }))
            .map_err(|e| err(path, e))?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))
}

/// Microseconds as a short human duration: `850 µs`, `12 ms`, `1.5 s`.
fn duration_label(us: f64) -> String {
    if us >= 1e6 {
        format!("{} s", trim(us / 1e6))
    } else if us >= 1e3 {
        format!("{} ms", trim(us / 1e3))
    } else {
        format!("{} µs", trim(us))
    }
}

/// At most 2 significant decimals, no trailing zeros.
fn trim(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

const PERCENTILES: [&str; 3] = ["p50", "p99", "p99.9"];

fn percentile(r: &RunResult, p: usize) -> Option<f64> {
    [r.latency_us.p50, r.latency_us.p99, r.latency_us.p999][p]
}

/// Grouped bars on a log scale: enqueue-to-pop p50, p99 and p99.9 per workload and engine
/// (workloads without a queue, W4, are left out).
pub fn latency_svg(results: &[RunResult], path: &Path) -> Result<(), ChartError> {
    let loads: Vec<&str> = workloads(results)
        .into_iter()
        .filter(|w| {
            results
                .iter()
                .any(|r| r.workload == *w && r.latency_us.p50.is_some())
        })
        .collect();
    let engines = engines(results);
    let per_group = engines.len() * PERCENTILES.len();
    let slots = per_group as i32 + 1;
    let values = results
        .iter()
        .flat_map(|r| (0..3).filter_map(|p| percentile(r, p)));
    let (lo, hi) = values.fold((f64::MAX, 0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if hi > 0.0 {
        ((lo.max(0.01) / 2.0), hi * 3.0)
    } else {
        (0.1, 10.0)
    };
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Enqueue-to-pop latency: p50, p99, p99.9 (lower is better)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0..slots * loads.len().max(1) as i32, (lo..hi).log_scale())
        .map_err(|e| err(path, e))?;
    let label = |x: &i32| group_label(&loads, slots, *x);
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots as usize * loads.len() + 1)
        .x_label_formatter(&label)
        .y_labels(12)
        .y_desc("enqueue to pop (log scale)")
        .y_label_formatter(&|v| duration_label(*v))
        .draw()
        .map_err(|e| err(path, e))?;
    for (e, engine) in engines.iter().enumerate() {
        let base = engine_color(engine);
        for (p, percentile_name) in PERCENTILES.iter().enumerate() {
            // Darker shades for higher percentiles.
            let color = base.mix(0.45 + 0.275 * p as f64);
            let bars: Vec<(i32, f64)> = loads
                .iter()
                .enumerate()
                .filter_map(|(i, w)| {
                    let v = find(results, w, engine).and_then(|r| percentile(r, p))?;
                    Some((i as i32 * slots + (e * PERCENTILES.len() + p) as i32, v))
                })
                .collect();
            chart
                .draw_series(bars.iter().map(|&(x, v)| {
                    let mut bar = Rectangle::new([(x, lo), (x + 1, v.max(lo))], color.filled());
                    bar.set_margin(0, 0, 1, 1);
                    bar
                }))
                .map_err(|e| err(path, e))?
                .label(format!("{engine} {percentile_name}"))
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled())
                });
        }
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))
}

const LIMIT: RGBColor = RGBColor(0xc4, 0x4e, 0x52);

/// The points of one percentile of a capacity curve, one per rate tried, in rate order: the
/// try that settled the rate (its passing try, else its last), so retries do not zigzag.
fn curve_points(curve: &Curve, p: usize) -> Vec<(f64, f64, bool)> {
    let mut rates: Vec<u64> = curve.probes.iter().map(|a| a.rate).collect();
    rates.sort_unstable();
    rates.dedup();
    rates
        .into_iter()
        .filter_map(|rate| {
            let tries = curve.probes.iter().filter(|a| a.rate == rate);
            let settled = tries
                .clone()
                .find(|a| a.passed)
                .or_else(|| tries.clone().next_back())?;
            let v = percentile(&settled.data.result, p)?;
            Some((rate as f64, v, settled.passed))
        })
        .collect()
}

/// The latency curve of a capacity search (`loadgen capacity --chart`, and `compare`'s
/// `capacity-wN.svg`): p50 (dashed) and p99 (solid) against offered rate, both axes on a log
/// scale, one colour per engine; filled marks passed, hollow failed; the p99 limit as a
/// horizontal line and each engine's capacity as a vertical one.
pub fn capacity_svg(curves: &[Curve], path: &Path) -> Result<(), ChartError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| err(path, e))?;
    }
    let limit_us = curves.first().map_or(10_000.0, |c| c.p99_limit_ms * 1e3);
    let points: Vec<(f64, f64)> = curves
        .iter()
        .flat_map(|c| [0, 1].into_iter().flat_map(move |p| curve_points(c, p)))
        .map(|(x, y, _)| (x, y))
        .collect();
    let (x_lo, x_hi) = points
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), &(x, _)| (lo.min(x), hi.max(x)));
    let (x_lo, x_hi) = if x_hi > 0.0 {
        (x_lo / 1.5, x_hi * 1.5)
    } else {
        (1e3, 1e7)
    };
    let (y_lo, y_hi) = points
        .iter()
        .fold((limit_us, limit_us), |(lo, hi), &(_, y)| {
            (lo.min(y), hi.max(y))
        });
    let (y_lo, y_hi) = (y_lo.max(0.01) / 2.0, y_hi * 3.0);
    let workload = curves
        .first()
        .map_or_else(String::new, |c| c.workload.to_uppercase());
    let root = SVGBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{workload} latency against offered rate: p50 (dashed), p99 (solid)"),
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())
        .map_err(|e| err(path, e))?;
    chart
        .configure_mesh()
        .x_desc("offered events/s (log scale)")
        .x_label_formatter(&|v| si(*v))
        .y_labels(12)
        .y_desc("enqueue to pop (log scale)")
        .y_label_formatter(&|v| duration_label(*v))
        .draw()
        .map_err(|e| err(path, e))?;
    chart
        .draw_series(DashedLineSeries::new(
            [(x_lo, limit_us), (x_hi, limit_us)],
            8,
            5,
            LIMIT.stroke_width(2),
        ))
        .map_err(|e| err(path, e))?
        .label(format!("p99 limit {}", duration_label(limit_us)))
        .legend(|(x, y)| PathElement::new([(x, y), (x + 14, y)], LIMIT.stroke_width(2)));
    for (i, curve) in curves.iter().enumerate() {
        let color = engine_color(&curve.engine);
        let p50 = curve_points(curve, 0);
        let p99 = curve_points(curve, 1);
        chart
            .draw_series(DashedLineSeries::new(
                p50.iter().map(|&(x, y, _)| (x, y)),
                6,
                4,
                color.mix(0.7).stroke_width(2),
            ))
            .map_err(|e| err(path, e))?
            .label(format!("{} p50", curve.engine))
            .legend(move |(x, y)| {
                PathElement::new([(x, y), (x + 14, y)], color.mix(0.7).stroke_width(2))
            });
        chart
            .draw_series(LineSeries::new(
                p99.iter().map(|&(x, y, _)| (x, y)),
                color.stroke_width(2),
            ))
            .map_err(|e| err(path, e))?
            .label(format!("{} p99", curve.engine))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2)));
        chart
            .draw_series(p50.iter().chain(&p99).map(|&(x, y, passed)| {
                let style = if passed {
                    color.filled()
                } else {
                    color.stroke_width(2)
                };
                Circle::new((x, y), 4, style)
            }))
            .map_err(|e| err(path, e))?;
        if let Some(capacity) = curve.capacity_events_per_s {
            let x = capacity as f64;
            chart
                .draw_series(DashedLineSeries::new(
                    [(x, y_lo), (x, y_hi)],
                    3,
                    4,
                    color.stroke_width(1),
                ))
                .map_err(|e| err(path, e))?;
            chart
                .draw_series([Text::new(
                    format!("{} {}", curve.engine, si(x)),
                    // One height per engine, so that close capacities do not overprint.
                    (x, y_hi / 2f64.powi(1 + 2 * i as i32)),
                    ("sans-serif", 13).into_font().color(&color),
                )])
                .map_err(|e| err(path, e))?;
        }
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(|e| err(path, e))?;
    root.present().map_err(|e| err(path, e))
}

/// One row of [`clients_svg`]: a client's name and two figures.
#[derive(Debug, Clone)]
pub struct ClientBar {
    /// The client.
    pub client: String,
    /// Its CPU per event received, microseconds.
    pub cpu_us_per_event: Option<f64>,
    /// What its cache holds per pod, bytes.
    pub bytes_per_pod: Option<f64>,
}

/// One panel of [`clients_svg`]: where, the axis' label, which figure, the bars' colour,
/// whether it names the clients (the left one does, for both).
type Panel<'a, 'b> = (
    &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    &'static str,
    fn(&ClientBar) -> Option<f64>,
    RGBColor,
    bool,
);

/// Two panels of horizontal bars, one bar per client: CPU microseconds per event (left) and
/// bytes per cached pod (right), each bar labelled with its value; `title` above both.
pub fn clients_svg(title: &str, bars: &[ClientBar], path: &Path) -> Result<(), ChartError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| err(path, e))?;
    }
    let height = 140 + 34 * bars.len().max(1) as u32;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let root = root
        .titled(title, ("sans-serif", 20))
        .map_err(|e| err(path, e))?;
    let (left, right) = root.split_horizontally(WIDTH / 2);
    let panels: [Panel<'_, '_>; 2] = [
        (
            &left,
            "client CPU µs per event",
            |b| b.cpu_us_per_event,
            SHARDED,
            true,
        ),
        (
            &right,
            "bytes per cached pod",
            |b| b.bytes_per_pod,
            REFERENCE,
            false,
        ),
    ];
    for (area, label, value, color, show_names) in panels {
        let max = bars.iter().filter_map(value).fold(0f64, f64::max).max(1e-9);
        let n = bars.len() as i32;
        let mut chart = ChartBuilder::on(area)
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(if show_names { 170 } else { 10 })
            .build_cartesian_2d(0.0..max * 1.3, (0..n).into_segmented())
            .map_err(|e| err(path, e))?;
        let names: Vec<&str> = bars.iter().map(|b| b.client.as_str()).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc(label)
            .x_labels(5)
            .x_label_formatter(&|v| si(*v))
            .y_labels(bars.len().max(1))
            // The first client at the top: row i is drawn at n - 1 - i.
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) if show_names && (0..n).contains(i) => {
                    names[(n - 1 - i) as usize].to_owned()
                }
                _ => String::new(),
            })
            .draw()
            .map_err(|e| err(path, e))?;
        for (i, bar) in bars.iter().enumerate() {
            let Some(v) = value(bar) else { continue };
            let i = n - 1 - i as i32;
            chart
                .draw_series([Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(i)),
                        (v, SegmentValue::Exact(i + 1)),
                    ],
                    color.filled(),
                )])
                .map_err(|e| err(path, e))?;
            chart
                .draw_series([Text::new(
                    si(v),
                    (v + max * 0.02, SegmentValue::CenterOf(i)),
                    ("sans-serif", 14),
                )])
                .map_err(|e| err(path, e))?;
        }
    }
    root.present().map_err(|e| err(path, e))
}
