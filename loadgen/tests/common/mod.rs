//! Helpers shared by the integration tests that drive the `loadgen` binary.

#![allow(dead_code)] // each test file uses a different subset

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs the `loadgen` binary with `args`, feeding it `stdin`, and returns what it wrote.
pub fn run_loadgen(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the loadgen binary starts");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    let input = stdin.to_vec();
    // Written from another thread so a large output can never deadlock against the input.
    let writer = std::thread::spawn(move || pipe.write_all(&input));
    let output = child.wait_with_output().expect("loadgen runs");
    // The child may stop reading early (a malformed line); a broken pipe is then expected.
    let _ = writer.join();
    output
}

/// `loadgen run` of W6, small: the first arguments of the W6 runs through the binary.
pub const SMALL_W6: [&str; 9] = [
    "run",
    "--workload",
    "w6",
    "--keys",
    "500",
    "--events",
    "5000",
    "--shards",
    "4",
];

/// Runs the `loadgen` binary with `args` and `--json` into a fresh temporary directory named
/// after `name`, asserts that it exits 0, and returns its stdout and the JSON report.
pub fn run_with_json(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let dir = std::env::temp_dir().join(format!("loadgen-{name}-{}", std::process::id()));
    let json = dir.join("report.json");
    let path = json.to_str().expect("utf-8 temp path");
    let args: Vec<&str> = args.iter().copied().chain(["--json", path]).collect();
    let out = run_with_report(&args, &json);
    std::fs::remove_dir_all(&dir).ok();
    out
}

/// Runs the `loadgen` binary with `args` (which tell it to write a JSON report to `report`),
/// asserts that it exits 0, and returns its stdout and the report.
pub fn run_with_report(args: &[&str], report: &std::path::Path) -> (String, serde_json::Value) {
    let output = run_loadgen(args, b"");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stdout}\n{stderr}");
    let text = std::fs::read_to_string(report)
        .unwrap_or_else(|e| panic!("the JSON report {}: {e}", report.display()));
    (
        stdout,
        serde_json::from_str(&text).expect("the report is JSON"),
    )
}

/// The `engine` of every row, in order.
pub fn engines(rows: &[serde_json::Value]) -> Vec<&str> {
    rows.iter().filter_map(|r| r["engine"].as_str()).collect()
}

/// The engine knobs of a test run: `shards` and `consumers`, two readers, `w5_cost` of handler
/// work per delta for W5 (none for the other workloads), no pacing, no bound, no compaction.
pub fn engine_config(
    shards: usize,
    consumers: usize,
    workload: workloads::Workload,
    w5_cost: std::time::Duration,
) -> loadgen::engines::EngineConfig {
    loadgen::engines::EngineConfig {
        shards,
        consumers,
        readers: 2,
        handler_cost: if workload == workloads::Workload::W5 {
            w5_cost
        } else {
            std::time::Duration::ZERO
        },
        rate: None,
        max_queued_deltas: 0,
        compact_updates: false,
    }
}
