//! Results shown: the run table, the JSON report, files written, and how a command exits.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;

use crate::result::RunResult;
use crate::units::{mib, si};

/// The JSON document `run --json` writes (`replay --json` adds its parse summary around the
/// same `results`; a child process reports through either).
#[derive(Debug, Clone, Serialize)]
pub struct Report<'a> {
    /// Every row.
    pub results: &'a [RunResult],
}

/// A report file could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {source} (check that the directory exists and is writable)")]
pub struct WriteError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// Writes `contents` to `path`, creating its directory.
pub fn write_file(path: &Path, contents: &[u8]) -> Result<(), WriteError> {
    let wrap = |source| WriteError {
        path: path.to_path_buf(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(wrap)?;
    }
    fs::write(path, contents).map_err(wrap)
}

/// Writes `value` to `path` as pretty-printed JSON: `run --json`'s [`Report`],
/// `replay --json`'s report, `compare`'s `latest.json`.
pub fn write_json<T: Serialize + ?Sized>(path: &Path, value: &T) -> Result<(), WriteError> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| WriteError {
        path: path.to_path_buf(),
        source: io::Error::other(e),
    })?;
    text.push('\n');
    write_file(path, text.as_bytes())
}

/// How `run`, `replay` and `compare` end once their engines have run: prints `shown` (the
/// command's table) on stdout and every failed verdict on stderr, then writes the command's
/// files with `write`. The exit code is 0 when every verdict is ok, 1 when one failed, 2
/// when the files could not be written.
pub fn finish(
    command: &str,
    shown: &str,
    results: &[RunResult],
    write: impl FnOnce() -> Result<(), String>,
) -> ExitCode {
    print!("{shown}");
    for r in results.iter().filter(|r| !r.is_ok()) {
        eprintln!("{} {}: verdict failed:", r.engine, r.workload);
        for failure in &r.failures {
            eprintln!("  {failure}");
        }
    }
    if let Err(e) = write() {
        return refuse(command, e);
    }
    if results.iter().all(RunResult::is_ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// How a command ends when it cannot do its job (bad input, a child that failed, a file it
/// could not write): `loadgen COMMAND: why` on stderr, exit code 2.
pub fn refuse(command: &str, why: impl std::fmt::Display) -> ExitCode {
    eprintln!("loadgen {command}: {why}");
    ExitCode::from(2)
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// Right-aligns every column but the last, which is left as is.
pub fn aligned(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            if i + 1 == row.len() {
                line.push_str(cell);
            } else if i < 2 {
                let _ = write!(line, "{cell:<w$}", w = widths[i]);
            } else {
                let _ = write!(line, "{cell:>w$}", w = widths[i]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A paced run's largest producer lag, marked when the producer fell behind its schedule.
fn lag(r: &RunResult) -> String {
    match (r.producer_lag_ms, r.kept_up) {
        (Some(ms), Some(false)) => format!("{ms:.2} behind"),
        (Some(ms), _) => format!("{ms:.2}"),
        (None, _) => "-".to_string(),
    }
}

/// A table's first row: its column names.
pub fn header(names: &[&str]) -> Vec<Vec<String>> {
    vec![names.iter().map(|&name| name.to_owned()).collect()]
}

/// The results as an aligned text table, one row per run.
///
/// ```
/// let table = loadgen::reports::report::table(&[]);
/// assert!(table.starts_with("engine"));
/// ```
pub fn table(results: &[RunResult]) -> String {
    let mut rows = header(&[
        "engine",
        "workload",
        "events",
        "wall s",
        "events/s",
        "pops",
        "Δ/pop",
        "p50 µs",
        "p99 µs",
        "p999 µs",
        "+RSS MiB",
        "CPU µs/ev",
        "reads/s",
        "recon/s",
        "lag ms",
        "verdict",
    ]);
    for r in results {
        rows.push(vec![
            r.engine.clone(),
            r.workload.clone(),
            r.events.to_string(),
            format!("{:.3}", r.wall_s),
            si(r.events_per_s),
            r.pops.to_string(),
            opt(r.deltas_per_pop, |v| format!("{v:.2}")),
            opt(r.latency_us.p50, |v| format!("{v:.1}")),
            opt(r.latency_us.p99, |v| format!("{v:.1}")),
            opt(r.latency_us.p999, |v| format!("{v:.1}")),
            r.peak_rss_bytes.map_or_else(|| "-".to_string(), mib),
            opt(r.cpu_us_per_event, |v| format!("{v:.2}")),
            opt(r.reads_per_s, si),
            opt(r.controller.map(|c| c.reconciles_per_s), si),
            lag(r),
            r.verdict.clone(),
        ]);
    }
    aligned(&rows)
}

/// The distinct values of `field` over `results`, in the order they first appear (tables and
/// charts list workloads and engines in run order).
pub fn first_seen<'a>(
    results: &'a [RunResult],
    field: impl Fn(&'a RunResult) -> &'a String,
) -> Vec<&'a str> {
    let mut out: Vec<&str> = Vec::new();
    for r in results {
        let value = field(r).as_str();
        if !out.contains(&value) {
            out.push(value);
        }
    }
    out
}

/// W8's tables: per run and class of keys, the waits from ready to reconcile start; per run,
/// each namespace's share of the workers. Empty when no run is W8's.
///
/// ```
/// assert_eq!(loadgen::reports::report::scheduling_table(&[]), "");
/// ```
pub fn scheduling_table(results: &[RunResult]) -> String {
    let runs: Vec<_> = results
        .iter()
        .filter_map(|r| r.scheduling.as_ref().map(|s| (r, s)))
        .collect();
    if runs.is_empty() {
        return String::new();
    }
    let mut waits = header(&[
        "engine", "workload", "class", "served", "waiting", "p50 ms", "p99 ms", "max ms", "overdue",
    ]);
    let mut shares = header(&["engine", "workload", "share of worker time"]);
    for (r, s) in runs {
        for c in &s.classes {
            waits.push(vec![
                r.engine.clone(),
                r.workload.clone(),
                c.class.clone(),
                c.served.to_string(),
                c.waiting_at_end.to_string(),
                opt(c.p50_ms, |v| format!("{v:.1}")),
                opt(c.p99_ms, |v| format!("{v:.1}")),
                opt(c.max_ms, |v| format!("{v:.1}")),
                s.overdue_handouts.to_string(),
            ]);
        }
        let groups: Vec<String> = s
            .groups
            .iter()
            .map(|g| format!("{} {:.1}%", g.group, 100.0 * g.share))
            .collect();
        shares.push(vec![
            r.engine.clone(),
            r.workload.clone(),
            groups.join(", "),
        ]);
    }
    format!("\n{}\n{}", aligned(&waits), aligned(&shares))
}

/// One row per handler of every informer run; empty when no run went through the informer.
pub fn handler_table(results: &[RunResult]) -> String {
    let mut rows = header(&[
        "engine",
        "workload",
        "handler",
        "notifications",
        "tombstones",
        "final at s",
        "events/s to final",
        "peak buffered",
        "waits",
        "merged",
        "verdict",
    ]);
    for r in results {
        for h in &r.handlers {
            rows.push(vec![
                r.engine.clone(),
                r.workload.clone(),
                format!("{}{}", h.handler, if h.slow { " (slow)" } else { "" }),
                h.notifications.to_string(),
                h.tombstones.to_string(),
                h.caught_up_s
                    .map_or_else(|| "-".to_string(), |s| format!("{s:.3}")),
                h.caught_up_s
                    .filter(|&s| s > 0.0)
                    .map_or_else(|| "-".to_string(), |s| si(r.events as f64 / s)),
                h.peak_pending.to_string(),
                h.waits.to_string(),
                h.merged.to_string(),
                h.verdict.clone(),
            ]);
        }
    }
    if rows.len() == 1 {
        return String::new();
    }
    let mut out = String::from("\n");
    out.push_str(&aligned(&rows));
    for r in results {
        if let Some(s) = &r.informer {
            let _ = writeln!(
                out,
                "{} {}: {} lists, {} watches, {} reflector errors (scripted outages and 410s \
                 included), {} resyncs left out, producer held back {:.2} s",
                r.engine,
                r.workload,
                s.lists,
                s.watches,
                s.reflector_errors,
                s.skipped_resyncs,
                s.producer_held_ms as f64 / 1e3
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(failures: &[&str]) -> RunResult {
        RunResult {
            engine: "sharded".into(),
            workload: "w1".into(),
            keys: 1,
            events: 1,
            wall_s: 1.0,
            events_per_s: 1.0,
            pops: 1,
            deltas_per_pop: Some(1.0),
            threads: 1,
            shards: Some(1),
            deltas: 1,
            verdict: if failures.is_empty() {
                "ok".into()
            } else {
                format!("FAIL: {}", failures[0])
            },
            failures: failures.iter().map(|f| f.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn the_exit_code_is_0_when_all_ok_1_on_a_failed_verdict_2_when_files_fail() {
        let ok = [row(&[]), row(&[])];
        assert_eq!(finish("run", "", &ok, || Ok(())), ExitCode::SUCCESS);
        let failed = [row(&[]), row(&["missing key x"])];
        assert_eq!(finish("run", "", &failed, || Ok(())), ExitCode::FAILURE);
        let unwritable = || Err("cannot write /x".to_string());
        assert_eq!(finish("run", "", &ok, unwritable), ExitCode::from(2));
        assert_eq!(finish("run", "", &failed, unwritable), ExitCode::from(2));
    }

    #[test]
    fn the_json_report_is_written_with_its_directory() {
        let dir = std::env::temp_dir().join(format!("loadgen-report-{}", std::process::id()));
        let path = dir.join("nested").join("r.json");
        let results = [row(&["missing key x"])];
        write_json(&path, &Report { results: &results }).expect("written");
        let back: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&path).expect("read back")).expect("JSON");
        assert_eq!(back["results"][0]["failures"][0], "missing key x");
        fs::remove_dir_all(&dir).ok();
    }
}
