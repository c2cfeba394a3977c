//! The hand-written trace suite (`tests/traces/`, docs/traces.md) through the `loadgen ops` binary.
//!
//! Each `<name>.jsonl` has its expected output `<name>.out`, worked out by hand from docs/semantics.md.
//! Traces named `drain_*` pop only through `drain` (the drain suite); the others are the exact
//! suite. Every engine configuration below runs the suites it is listed for; lines are compared
//! as parsed JSON values, either line by line or, where several shards may pop keys in another
//! order, after grouping each run of pop lines by key.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;

const TRACES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/traces");

/// The suite must not shrink unnoticed.
const MIN_TRACES: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suite {
    /// Pops anywhere: every engine configuration must match line for line.
    Exact,
    /// Pops only via `drain`: any shard count must match once pops are grouped by key.
    Drain,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compare {
    LineByLine,
    GroupedByKey,
}

/// One engine configuration and what it is held to.
struct EngineConfig {
    /// The sharded engine's `--shards`; `None` is the reference engine.
    shards: Option<&'static str>,
    suites: &'static [Suite],
    compare: Compare,
}

impl EngineConfig {
    const fn new(shards: Option<&'static str>, suites: &'static [Suite], compare: Compare) -> Self {
        EngineConfig {
            shards,
            suites,
            compare,
        }
    }

    /// The `loadgen` command line.
    fn args(&self) -> Vec<&'static str> {
        match self.shards {
            None => vec!["ops", "--engine", "reference"],
            Some(shards) => vec!["ops", "--engine", "sharded", "--shards", shards],
        }
    }

    /// As failures name it: `reference`, `sharded, 1 shard`, `sharded, 2 shards, grouped`.
    fn label(&self) -> String {
        let Some(shards) = self.shards else {
            return "reference".to_owned();
        };
        let plural = if shards == "1" { "" } else { "s" };
        let grouped = match self.compare {
            Compare::LineByLine => "",
            Compare::GroupedByKey => ", grouped",
        };
        format!("sharded, {shards} shard{plural}{grouped}")
    }
}

/// To add an engine configuration, add a row.
const CONFIGS: &[EngineConfig] = &[
    EngineConfig::new(None, &[Suite::Exact, Suite::Drain], Compare::LineByLine),
    EngineConfig::new(Some("1"), &[Suite::Exact], Compare::LineByLine),
    EngineConfig::new(Some("1"), &[Suite::Drain], Compare::GroupedByKey),
    EngineConfig::new(Some("2"), &[Suite::Drain], Compare::GroupedByKey),
    EngineConfig::new(Some("64"), &[Suite::Drain], Compare::GroupedByKey),
];

struct Trace {
    name: String,
    suite: Suite,
    input: String,
    expected: Vec<Value>,
}

#[test]
fn every_trace_matches_its_hand_worked_output_on_every_engine() {
    let traces = load_traces();
    assert!(
        traces.len() >= MIN_TRACES,
        "only {} traces in {TRACES_DIR}, expected at least {MIN_TRACES}",
        traces.len()
    );
    let mut failures = Vec::new();
    let mut runs = 0;
    for config in CONFIGS {
        for trace in traces.iter().filter(|t| config.suites.contains(&t.suite)) {
            runs += 1;
            if let Err(why) = check(config, trace) {
                failures.push(format!("{} [{}]: {why}", trace.name, config.label()));
            }
        }
    }
    assert!(
        runs >= 2 * traces.len(),
        "some engine configurations ran no traces"
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} trace runs failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_trace_is_listed_in_the_readme() {
    let readme = fs::read_to_string(Path::new(TRACES_DIR).join("README.md"))
        .expect("tests/traces/README.md exists");
    let missing: Vec<String> = load_traces()
        .into_iter()
        .map(|t| t.name)
        .filter(|name| !readme.contains(&format!("`{name}`")))
        .collect();
    assert!(missing.is_empty(), "README.md does not list: {missing:?}");
}

#[test]
fn drain_traces_pop_only_through_drain() {
    for trace in load_traces().iter().filter(|t| t.suite == Suite::Drain) {
        for (i, line) in trace.input.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let op: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{} line {}: {e}", trace.name, i + 1));
            assert_ne!(
                op["op"],
                "pop",
                "{} line {}: a drain_ trace may pop only with drain",
                trace.name,
                i + 1
            );
        }
    }
}

#[test]
fn grouping_forgets_order_across_keys_only_within_a_run_of_pops() {
    let pop = |key: &str, v: i64| serde_json::json!({"pop": key, "initial": false, "deltas": [{"type": "Added", "v": v}]});
    let keys = serde_json::json!({"keys": []});
    // Two keys popped in either order within one drain: the same.
    assert_eq!(
        group_pops_by_key(&[pop("a", 1), pop("b", 1)]),
        group_pops_by_key(&[pop("b", 1), pop("a", 1)])
    );
    // One key's pops in another order: different.
    assert_ne!(
        group_pops_by_key(&[pop("a", 1), pop("a", 2)]),
        group_pops_by_key(&[pop("a", 2), pop("a", 1)])
    );
    // A non-pop line is a barrier: pops do not move across it.
    assert_ne!(
        group_pops_by_key(&[pop("a", 1), keys.clone(), pop("b", 1)]),
        group_pops_by_key(&[pop("b", 1), keys.clone(), pop("a", 1)])
    );
    // A missing or extra pop line is a difference.
    assert_ne!(
        group_pops_by_key(&[pop("a", 1), pop("b", 1)]),
        group_pops_by_key(&[pop("a", 1)])
    );
    // `{"pop":null,...}` is not a pop of any key: it stays in place.
    let empty = serde_json::json!({"pop": null, "closed": false});
    assert_eq!(
        group_pops_by_key(&[pop("a", 1), empty.clone()]),
        vec![
            Segment::Pops(BTreeMap::from([("a".to_owned(), vec![pop("a", 1)])])),
            Segment::Line(empty),
        ]
    );
}

/// Output lines with every run of consecutive pop lines turned into a map key → that key's
/// pop lines in order. Equal groupings mean: same non-pop lines in the same places, and per
/// key the same pops in the same order between them.
#[derive(Debug, PartialEq)]
enum Segment {
    Line(Value),
    Pops(BTreeMap<String, Vec<Value>>),
}

fn group_pops_by_key(lines: &[Value]) -> Vec<Segment> {
    let mut segments = Vec::new();
    for line in lines {
        let Some(key) = line.get("pop").and_then(Value::as_str) else {
            segments.push(Segment::Line(line.clone()));
            continue;
        };
        if !matches!(segments.last(), Some(Segment::Pops(_))) {
            segments.push(Segment::Pops(BTreeMap::new()));
        }
        if let Some(Segment::Pops(by_key)) = segments.last_mut() {
            by_key.entry(key.to_owned()).or_default().push(line.clone());
        }
    }
    segments
}

/// Runs one trace through one configuration and compares; the error says where and how the
/// output differs.
fn check(config: &EngineConfig, trace: &Trace) -> Result<(), String> {
    let output = common::run_loadgen(&config.args(), trace.input.as_bytes());
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!("exited with {}; stderr:\n{stderr}", output.status));
    }
    let stdout = String::from_utf8(output.stdout).map_err(|e| format!("stdout: {e}"))?;
    let got = parse_lines(&stdout).map_err(|e| format!("stdout {e}"))?;
    match config.compare {
        Compare::LineByLine => compare_lines(&trace.expected, &got),
        Compare::GroupedByKey => compare_grouped(&trace.expected, &got),
    }
}

fn compare_lines(expected: &[Value], got: &[Value]) -> Result<(), String> {
    for i in 0..expected.len().max(got.len()) {
        match (expected.get(i), got.get(i)) {
            (Some(e), Some(g)) if e == g => {}
            (e, g) => {
                return Err(format!(
                    "output line {}:\n  expected {}\n  got      {}",
                    i + 1,
                    show(e),
                    show(g)
                ))
            }
        }
    }
    Ok(())
}

fn compare_grouped(expected: &[Value], got: &[Value]) -> Result<(), String> {
    let (expected, got) = (group_pops_by_key(expected), group_pops_by_key(got));
    for i in 0..expected.len().max(got.len()) {
        match (expected.get(i), got.get(i)) {
            (Some(e), Some(g)) if e == g => {}
            (Some(Segment::Pops(e)), Some(Segment::Pops(g))) => {
                let key = e
                    .keys()
                    .chain(g.keys())
                    .find(|k| e.get(*k) != g.get(*k))
                    .cloned()
                    .unwrap_or_default();
                return Err(format!(
                    "output segment {} (a run of pops), key {key:?}:\n  expected {:?}\n  got      {:?}",
                    i + 1,
                    e.get(&key).map(|v| v.iter().map(Value::to_string).collect::<Vec<_>>()),
                    g.get(&key).map(|v| v.iter().map(Value::to_string).collect::<Vec<_>>()),
                ));
            }
            (e, g) => {
                return Err(format!(
                    "output segment {}:\n  expected {e:?}\n  got      {g:?}",
                    i + 1
                ))
            }
        }
    }
    Ok(())
}

fn show(line: Option<&Value>) -> String {
    line.map_or_else(|| "(no line)".to_owned(), Value::to_string)
}

fn parse_lines(text: &str) -> Result<Vec<Value>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}: {line}", i + 1))
        })
        .collect()
}

fn load_traces() -> Vec<Trace> {
    let mut paths: Vec<PathBuf> = fs::read_dir(TRACES_DIR)
        .unwrap_or_else(|e| panic!("reading {TRACES_DIR}: {e}"))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    paths.sort();
    for path in &paths {
        if path.extension().is_some_and(|ext| ext == "out") {
            assert!(
                path.with_extension("jsonl").exists(),
                "{} has no trace beside it",
                path.display()
            );
        }
    }
    paths
        .iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "jsonl"))
        .map(|path| {
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("UTF-8 trace name")
                .to_owned();
            let out = path.with_extension("out");
            let expected = fs::read_to_string(&out)
                .unwrap_or_else(|e| panic!("{name}: reading {}: {e}", out.display()));
            let expected = parse_lines(&expected).unwrap_or_else(|e| panic!("{name}.out {e}"));
            let input = fs::read_to_string(path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let suite = if name.starts_with("drain_") {
                Suite::Drain
            } else {
                Suite::Exact
            };
            Trace {
                name,
                suite,
                input,
                expected,
            }
        })
        .collect()
}
