//! `loadgen scale` and `loadgen run --timeline` through the binary, at tiny sizes.

use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loadgen-scale-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Runs loadgen with `args` and then each `(flag, path)`, its output thrown away.
fn run_quietly<const N: usize>(args: &[&str], paths: [(&str, &PathBuf); N]) -> ExitStatus {
    let mut command = Command::new(env!("CARGO_BIN_EXE_loadgen"));
    command.args(args);
    for (flag, path) in paths {
        command.arg(flag).arg(path);
    }
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("loadgen runs")
}

#[test]
fn a_tiny_sweep_writes_one_point_per_engine_and_key_count_and_a_chart() {
    let dir = scratch("sweep");
    let (json, chart, md) = (
        dir.join("scale.json"),
        dir.join("scale.svg"),
        dir.join("scale.md"),
    );
    let status = run_quietly(
        &[
            "scale",
            "--workload",
            "w1",
            "--engine",
            "all",
            "--keys",
            "200,1k",
            "--events",
            "2000",
            "--rate",
            "200000",
        ],
        [("--json", &json), ("--chart", &chart), ("--md", &md)],
    );
    assert!(status.success(), "ok verdicts exit 0: {status}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let points = doc["points"].as_array().expect("points array");
    let seen: Vec<(u64, &str)> = points
        .iter()
        .map(|p| (p["keys"].as_u64().unwrap(), p["engine"].as_str().unwrap()))
        .collect();
    assert_eq!(
        seen,
        [
            (200, "reference"),
            (200, "sharded"),
            (1000, "reference"),
            (1000, "sharded")
        ]
    );
    for p in points {
        assert!(p["events_per_s"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["paced_p99_us"].as_f64().is_some(), "{p}");
        assert_eq!(p["ok"], true, "{p}");
    }
    // Flat out and paced for each point.
    let runs = doc["runs"].as_array().expect("runs array");
    assert_eq!(runs.len(), 8);
    assert_eq!(
        runs.iter().filter(|r| r["offered_rate"].is_null()).count(),
        4
    );
    let svg = std::fs::read_to_string(&chart).expect("chart written");
    assert!(svg.starts_with("<svg") && svg.contains("bytes per key"));
    assert!(doc["load_average"].as_array().is_some_and(|l| l.len() == 2));
    let page = std::fs::read_to_string(&md).expect("summary written");
    assert!(page.contains("sharded ÷ reference") && page.contains("Load average"));
    // One ratio row per key count.
    assert_eq!(
        page.lines()
            .filter(|l| l.starts_with("| 200 ") || l.starts_with("| 1000 "))
            .count(),
        2
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_key_counts_are_refused_with_a_message() {
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["scale", "--keys", "10k,zero"])
        .output()
        .expect("loadgen runs");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a key count"));
}

#[test]
fn run_timeline_writes_intervals_for_each_engine() {
    let dir = scratch("timeline");
    let csv = dir.join("timeline.csv");
    let status = run_quietly(
        &[
            "run",
            "--workload",
            "w1",
            "--keys",
            "500",
            "--events",
            "20000",
        ],
        [("--timeline", &csv)],
    );
    assert!(status.success(), "{status}");
    let text = std::fs::read_to_string(&csv).expect("timeline written");
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("engine,t_ms,samples,p50_us,p99_us,max_us")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    for engine in ["reference", "sharded"] {
        let samples: u64 = rows
            .iter()
            .filter(|r| r[0] == engine)
            .map(|r| r[2].parse::<u64>().unwrap())
            .sum();
        assert!(samples > 0, "{engine} has sampled intervals");
    }
    std::fs::remove_dir_all(&dir).ok();
}
