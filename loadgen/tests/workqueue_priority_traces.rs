//! The hand-worked priority workqueue traces (`tests/traces/workqueue_priority/`,
//! docs/traces.md) through the `loadgen ops` binary.
//!
//! Suites by name prefix (see that directory's README): `ref_` traces against the reference
//! port only; unprefixed ones also against the sharded priority queue with one shard, line for
//! line; `multi_` ones also against 2 and 16 shards, where each run of consecutive `get`
//! outputs is compared as a multiset and its priorities must not increase.

use std::fs;
use std::path::PathBuf;

use serde_json::Value;

mod common;

const TRACES_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/traces/workqueue_priority"
);

/// The suite must not shrink unnoticed.
const MIN_TRACES: usize = 18;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suite {
    ReferenceOnly,
    Exact,
    MultiShard,
}

fn suite_of(name: &str) -> Suite {
    if name.starts_with("ref_") {
        Suite::ReferenceOnly
    } else if name.starts_with("multi_") {
        Suite::MultiShard
    } else {
        Suite::Exact
    }
}

struct Config {
    label: &'static str,
    args: &'static [&'static str],
    suites: &'static [Suite],
    multiset_gets: bool,
}

const CONFIGS: &[Config] = &[
    Config {
        label: "workqueue-priority-reference",
        args: &["ops", "--engine", "workqueue-priority-reference"],
        suites: &[Suite::ReferenceOnly, Suite::Exact, Suite::MultiShard],
        multiset_gets: false,
    },
    Config {
        label: "workqueue-priority, 1 shard",
        args: &["ops", "--engine", "workqueue-priority", "--shards", "1"],
        suites: &[Suite::Exact, Suite::MultiShard],
        multiset_gets: false,
    },
    Config {
        label: "workqueue-priority, 2 shards",
        args: &["ops", "--engine", "workqueue-priority", "--shards", "2"],
        suites: &[Suite::MultiShard],
        multiset_gets: true,
    },
    Config {
        label: "workqueue-priority, 16 shards",
        args: &["ops", "--engine", "workqueue-priority", "--shards", "16"],
        suites: &[Suite::MultiShard],
        multiset_gets: true,
    },
];

fn traces() -> Vec<(String, PathBuf)> {
    let mut traces: Vec<_> = fs::read_dir(TRACES_DIR)
        .expect("the priority workqueue traces directory exists")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "jsonl"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, path)
        })
        .collect();
    traces.sort();
    traces
}

fn parse_lines(text: &str, what: &str) -> Vec<Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: bad JSON {l:?}: {e}")))
        .collect()
}

/// The maximal runs of consecutive `get` outputs, as index ranges.
fn get_runs(lines: &[Value]) -> Vec<std::ops::Range<usize>> {
    let is_get = |v: &Value| v.get("get").is_some();
    let mut runs = Vec::new();
    let mut start = 0;
    while start < lines.len() {
        if !is_get(&lines[start]) {
            start += 1;
            continue;
        }
        let end = (start..lines.len())
            .find(|&i| !is_get(&lines[i]))
            .unwrap_or(lines.len());
        runs.push(start..end);
        start = end;
    }
    runs
}

/// The priority a `get` line was handed out at: an overdue entry (aging) goes before every
/// priority.
fn effective_priority(line: &Value) -> Option<i64> {
    let priority = line.get("priority").and_then(Value::as_i64)?;
    Some(if line.get("overdue") == Some(&Value::Bool(true)) {
        i64::MAX
    } else {
        priority
    })
}

/// Where a run's effective priorities rise (a lower one went first), if anywhere.
fn priority_rises(lines: &[Value]) -> Option<String> {
    for run in get_runs(lines) {
        let priorities: Vec<i64> = lines[run.clone()]
            .iter()
            .filter_map(effective_priority)
            .collect();
        if priorities.windows(2).any(|w| w[1] > w[0]) {
            return Some(format!("run at lines {run:?}: priorities {priorities:?}"));
        }
    }
    None
}

fn sort_get_runs(lines: &mut [Value]) {
    for run in get_runs(lines) {
        lines[run].sort_by_key(|v| v.to_string());
    }
}

#[test]
fn every_priority_trace_matches_its_expected_output_on_every_queue_it_is_for() {
    let traces = traces();
    assert!(
        traces.len() >= MIN_TRACES,
        "only {} priority traces in {TRACES_DIR}",
        traces.len()
    );
    let mut failures = Vec::new();
    let mut replays = 0;
    for (name, path) in &traces {
        let suite = suite_of(name);
        let input = fs::read(path).unwrap();
        let expected_text = fs::read_to_string(path.with_extension("out"))
            .unwrap_or_else(|e| panic!("{name}.out: {e}"));
        for config in CONFIGS.iter().filter(|c| c.suites.contains(&suite)) {
            let output = common::run_loadgen(config.args, &input);
            replays += 1;
            let stderr = String::from_utf8_lossy(&output.stderr);
            if !output.status.success() || !stderr.is_empty() {
                failures.push(format!(
                    "{name} on {}: exit {:?}, stderr {stderr}",
                    config.label, output.status
                ));
                continue;
            }
            let mut expected = parse_lines(&expected_text, name);
            let mut actual = parse_lines(&String::from_utf8_lossy(&output.stdout), name);
            if let Some(rise) = priority_rises(&actual) {
                failures.push(format!("{name} on {}: {rise}", config.label));
            }
            if config.multiset_gets {
                sort_get_runs(&mut expected);
                sort_get_runs(&mut actual);
            }
            if actual != expected {
                let show = |v: &[Value]| {
                    v.iter()
                        .map(Value::to_string)
                        .collect::<Vec<_>>()
                        .join("\n  ")
                };
                failures.push(format!(
                    "{name} on {}:\n expected\n  {}\n got\n  {}",
                    config.label,
                    show(&expected),
                    show(&actual)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(replays >= traces.len() * 2, "{replays} replays");
}

#[test]
fn the_priority_rule_catches_a_lower_priority_going_first() {
    let lines = vec![
        serde_json::json!({"len": 2}),
        serde_json::json!({"get": "b", "priority": -100}),
        serde_json::json!({"get": "a", "priority": 0}),
    ];
    assert!(priority_rises(&lines).is_some());
    let fine = vec![
        serde_json::json!({"get": "a", "priority": 0}),
        serde_json::json!({"len": 0}),
        serde_json::json!({"get": "b", "priority": 5}),
    ];
    assert!(priority_rises(&fine).is_none(), "runs are separate");
    let aged = vec![
        serde_json::json!({"get": "old", "priority": -100, "overdue": true}),
        serde_json::json!({"get": "a", "priority": 0}),
    ];
    assert!(
        priority_rises(&aged).is_none(),
        "an overdue entry goes first"
    );
    let late = vec![
        serde_json::json!({"get": "a", "priority": 0}),
        serde_json::json!({"get": "old", "priority": -100, "overdue": true}),
    ];
    assert!(
        priority_rises(&late).is_some(),
        "an overdue entry was overtaken"
    );
}

#[test]
fn malformed_priority_lines_are_reported_with_their_line_number() {
    let cases: &[(&str, usize, &str)] = &[
        (
            "{\"op\":\"add_with_opts\",\"item\":\"a\",\"priority\":\"high\"}\n",
            1,
            "\"priority\" must be an integer",
        ),
        (
            "{\"op\":\"add_with_opts\",\"item\":\"a\",\"priority\":1.5}\n",
            1,
            "whole number",
        ),
        (
            "{\"op\":\"add\",\"item\":\"a\"}\n{\"op\":\"add_with_opts\",\"item\":\"a\",\"after_ms\":-1}\n",
            2,
            "must not be negative",
        ),
        (
            "{\"op\":\"add_with_opts\",\"item\":\"a\",\"rate_limited\":1}\n",
            1,
            "true or false",
        ),
        ("{\"op\":\"add_with_opts\"}\n", 1, "missing \"item\""),
        (
            "{\"op\":\"add_with_opts\",\"item\":\"a\",\"prio\":1}\n",
            1,
            "unexpected field \"prio\"",
        ),
        ("{\"op\":\"pop\"}\n", 1, "unknown op"),
    ];
    for engine in [
        &["ops", "--engine", "workqueue-priority-reference"][..],
        &["ops", "--engine", "workqueue-priority", "--shards", "4"][..],
    ] {
        for (trace, line, message) in cases {
            let output = common::run_loadgen(engine, trace.as_bytes());
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{trace:?}: {stderr}");
            assert!(
                stderr.starts_with(&format!("line {line}: ")) && stderr.contains(message),
                "{trace:?}: stderr {stderr:?} should name line {line} and say {message:?}"
            );
        }
    }
}
