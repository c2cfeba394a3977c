//! A key-count sweep's results: the table, the Markdown page, the chart, and the files written.

use std::path::Path;

use plotters::prelude::*;

use crate::reports::chart::draw_legend;
use crate::reports::report::{write_file, write_json};
use crate::runner::scale_sweep::{Point, ScaleError, ScaleReport};
use crate::units::si;

/// The sweep as a table: one row per key count and engine.
pub fn table(report: &ScaleReport) -> String {
    let mut out = format!(
        "{:>9}  {:<9}  {:>10}  {:>10}  {:>12}  {:>13}  verdict\n",
        "keys",
        "engine",
        "events/s",
        "B/key",
        format!("p99 @{}", si(report.rate as f64)),
        format!("p999 @{}", si(report.rate as f64)),
    );
    let ms =
        |us: Option<f64>| us.map_or_else(|| "-".to_string(), |us| format!("{:.2} ms", us / 1e3));
    for p in &report.points {
        out += &format!(
            "{:>9}  {:<9}  {:>10}  {:>10}  {:>12}  {:>13}  {}\n",
            p.keys,
            p.engine,
            si(p.events_per_s),
            p.bytes_per_key
                .map_or_else(|| "-".to_string(), |b| format!("{b:.0}")),
            ms(p.paced_p99_us),
            ms(p.paced_p999_us),
            if p.ok { "ok" } else { "FAIL" },
        );
    }
    out
}

/// The key count each engine's events/s are compared with in [`markdown`]: 100,000 (the
/// workloads' usual size) when the sweep has it, else its first.
const BASE_KEYS: usize = 100_000;

/// The sweep as a Markdown page: how it was made, the table, and per key count the same-run
/// ratios sharded ÷ reference and each engine's events/s against its own at 100,000 keys (or
/// at the sweep's first key count when it has no 100,000).
pub fn markdown(report: &ScaleReport) -> String {
    let m = &report.machine;
    let unknown = || "unknown".to_string();
    let load = |l: &Option<String>| l.clone().unwrap_or_else(unknown);
    let mut out = format!(
        "# {} against key count\n\n\
         `loadgen scale --workload {} --events {} --rate {}` (every run a child process of its \
         own; flat out for events/s and peak memory, paced at {}/s for p99/p999).\n\n\
         Machine: {}, {} cores, {}, commit `{}`, {} build, {}. Load average (1, 5, 15 min) \
         {} at the start, {} at the end.\n\n```text\n{}```\n\n",
        report.workload.to_uppercase(),
        report.workload,
        report.events,
        report.rate,
        si(report.rate as f64),
        m.cpu.clone().unwrap_or_else(unknown),
        m.cores,
        m.rustc.clone().unwrap_or_else(unknown),
        m.commit.clone().unwrap_or_else(unknown),
        m.profile,
        m.allocator,
        load(&report.load_average[0]),
        load(&report.load_average[1]),
        table(report),
    );
    let find = |engine: &str, keys: usize| {
        report
            .points
            .iter()
            .find(|p| p.engine == engine && p.keys == keys)
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "-".to_string(),
    };
    let base = if report.points.iter().any(|p| p.keys == BASE_KEYS) {
        Some(BASE_KEYS)
    } else {
        report.points.first().map(|p| p.keys)
    };
    let at_base = base.map_or_else(|| "-".to_string(), |k| k.to_string());
    out += &format!(
        "| keys | events/s sharded ÷ reference | B/key sharded ÷ reference | paced p99 sharded ÷ reference | sharded events/s ÷ at {at_base} keys | reference events/s ÷ at {at_base} keys |\n"
    );
    out += "|---:|---:|---:|---:|---:|---:|\n";
    let mut keys: Vec<usize> = report.points.iter().map(|p| p.keys).collect();
    keys.dedup();
    for k in keys {
        let (r, s) = (find("reference", k), find("sharded", k));
        let own = |engine: &str| {
            let at = find(engine, k).map(|p| p.events_per_s);
            ratio(
                at,
                base.and_then(|b| find(engine, b)).map(|p| p.events_per_s),
            )
        };
        out += &format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            k,
            ratio(s.map(|p| p.events_per_s), r.map(|p| p.events_per_s)),
            ratio(
                s.and_then(|p| p.bytes_per_key),
                r.and_then(|p| p.bytes_per_key)
            ),
            ratio(
                s.and_then(|p| p.paced_p99_us),
                r.and_then(|p| p.paced_p99_us)
            ),
            own("sharded"),
            own("reference"),
        );
    }
    out
}

/// Draws events/s (flat out), p99 (paced) and bytes per key (flat out) against the key count,
/// three panels side by side, one line per engine; every axis on a log scale.
pub fn chart_svg(
    report: &ScaleReport,
    path: &Path,
) -> Result<(), crate::reports::chart::ChartError> {
    let fail = |message: String| crate::reports::chart::ChartError {
        path: path.to_path_buf(),
        message,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| fail(e.to_string()))?;
    }
    let root = SVGBackend::new(path, (1500, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let root = root
        .titled(
            &format!(
                "{} against key count ({} churn events; p99 paced at {}/s)",
                report.workload.to_uppercase(),
                si(report.events as f64),
                si(report.rate as f64)
            ),
            ("sans-serif", 22),
        )
        .map_err(|e| fail(e.to_string()))?;
    let panels = root.split_evenly((1, 3));
    type Metric = fn(&Point) -> Option<f64>;
    let metrics: [(&str, &str, Metric); 3] = [
        ("events/s, flat out", "events/s", |p| Some(p.events_per_s)),
        ("p99 latency, paced", "p99 (ms)", |p| {
            p.paced_p99_us.map(|us| us / 1e3)
        }),
        ("peak memory per key, flat out", "bytes per key", |p| {
            p.bytes_per_key
        }),
    ];
    let mut engines: Vec<&str> = Vec::new();
    for p in &report.points {
        if !engines.contains(&p.engine.as_str()) {
            engines.push(&p.engine);
        }
    }
    let (x_lo, x_hi) = report.points.iter().fold((f64::MAX, 0f64), |(lo, hi), p| {
        (lo.min(p.keys as f64), hi.max(p.keys as f64))
    });
    let (x_lo, x_hi) = if x_hi > 0.0 {
        (x_lo / 1.5, x_hi * 1.5)
    } else {
        (1.0, 10.0)
    };
    for (panel, (caption, y_desc, metric)) in panels.iter().zip(metrics) {
        let ys: Vec<f64> = report
            .points
            .iter()
            .filter_map(metric)
            .filter(|y| *y > 0.0)
            .collect();
        let (y_lo, y_hi) = ys
            .iter()
            .fold((f64::MAX, 0f64), |(lo, hi), &y| (lo.min(y), hi.max(y)));
        let (y_lo, y_hi) = if y_hi > 0.0 {
            (y_lo / 2.0, y_hi * 2.0)
        } else {
            (0.1, 10.0)
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(caption, ("sans-serif", 17))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70)
            .build_cartesian_2d((x_lo..x_hi).log_scale(), (y_lo..y_hi).log_scale())
            .map_err(|e| fail(e.to_string()))?;
        chart
            .configure_mesh()
            .x_desc("keys (log scale)")
            .x_label_formatter(&|v| si(*v))
            .y_desc(y_desc)
            .y_label_formatter(&|v| si(*v))
            .draw()
            .map_err(|e| fail(e.to_string()))?;
        for engine in &engines {
            let color = if *engine == "sharded" {
                RGBColor(0xdd, 0x84, 0x52)
            } else {
                RGBColor(0x4c, 0x72, 0xb0)
            };
            let line: Vec<(f64, f64)> = report
                .points
                .iter()
                .filter(|p| p.engine == *engine)
                .filter_map(|p| metric(p).filter(|y| *y > 0.0).map(|y| (p.keys as f64, y)))
                .collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(|e| fail(e.to_string()))?
                .label(engine.to_string())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2))
                });
            chart
                .draw_series(line.iter().map(|&xy| Circle::new(xy, 4, color.filled())))
                .map_err(|e| fail(e.to_string()))?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(|e| fail(e.to_string()))?;
    }
    root.present().map_err(|e| fail(e.to_string()))
}

/// Writes a sweep's JSON report, chart and Markdown summary (for `scale` and `compare --scale`).
pub fn write(report: &ScaleReport, json: &Path, chart: &Path, md: &Path) -> Result<(), ScaleError> {
    write_json(json, report).map_err(|e| ScaleError::Write(e.to_string()))?;
    chart_svg(report, chart).map_err(|e| ScaleError::Write(e.to_string()))?;
    write_file(md, markdown(report).as_bytes()).map_err(|e| ScaleError::Write(e.to_string()))?;
    Ok(())
}
