//! The hand-worked workqueue traces (`tests/traces/workqueue/`, docs/traces.md) through the
//! `loadgen ops` binary.
//!
//! Suites by name prefix (see that directory's README): `ref_` traces against the reference
//! port only; unprefixed ones also against the sharded queue with one shard, line for line;
//! `multi_` ones also against 2 and 16 shards, where each maximal run of consecutive `get`
//! outputs is compared as a multiset and every other line in order.

use std::fs;
use std::path::PathBuf;

use serde_json::Value;

mod common;

const TRACES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/traces/workqueue");

/// The suite must not shrink unnoticed.
const MIN_TRACES: usize = 38;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Suite {
    /// `ref_`: `done` of an item never handed out; the reference port only.
    ReferenceOnly,
    /// No prefix: the reference and one shard, line for line.
    Exact,
    /// `multi_`: any shard count, `get` runs as multisets.
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

/// To add a queue configuration, add a row.
const CONFIGS: &[Config] = &[
    Config {
        label: "workqueue-reference",
        args: &["ops", "--engine", "workqueue-reference"],
        suites: &[Suite::ReferenceOnly, Suite::Exact, Suite::MultiShard],
        multiset_gets: false,
    },
    Config {
        label: "workqueue, 1 shard",
        args: &["ops", "--engine", "workqueue", "--shards", "1"],
        suites: &[Suite::Exact, Suite::MultiShard],
        multiset_gets: false,
    },
    Config {
        label: "workqueue, 2 shards",
        args: &["ops", "--engine", "workqueue", "--shards", "2"],
        suites: &[Suite::MultiShard],
        multiset_gets: true,
    },
    Config {
        label: "workqueue, 16 shards",
        args: &["ops", "--engine", "workqueue", "--shards", "16"],
        suites: &[Suite::MultiShard],
        multiset_gets: true,
    },
];

fn traces() -> Vec<(String, PathBuf)> {
    let mut traces: Vec<_> = fs::read_dir(TRACES_DIR)
        .expect("the workqueue traces directory exists")
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

/// Sorts each maximal run of consecutive `get` outputs (by their JSON text).
fn sort_get_runs(lines: &mut [Value]) {
    let is_get = |v: &Value| v.get("get").is_some();
    let mut start = 0;
    while start < lines.len() {
        if !is_get(&lines[start]) {
            start += 1;
            continue;
        }
        let end = (start..lines.len())
            .find(|&i| !is_get(&lines[i]))
            .unwrap_or(lines.len());
        lines[start..end].sort_by_key(|v| v.to_string());
        start = end;
    }
}

#[test]
fn every_trace_matches_its_expected_output_on_every_queue_it_is_for() {
    let traces = traces();
    assert!(
        traces.len() >= MIN_TRACES,
        "only {} workqueue traces in {TRACES_DIR}",
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

/// The comparison rule itself: runs of `get` lines are sorted, every other line stays put.
#[test]
fn the_multiset_rule_only_reorders_get_runs() {
    let mut lines = vec![
        serde_json::json!({"len": 2}),
        serde_json::json!({"get": "b"}),
        serde_json::json!({"get": "a"}),
        serde_json::json!({"len": 0}),
        serde_json::json!({"get": null, "empty": true}),
    ];
    sort_get_runs(&mut lines);
    assert_eq!(lines[1], serde_json::json!({"get": "a"}));
    assert_eq!(lines[2], serde_json::json!({"get": "b"}));
    assert_eq!(lines[3], serde_json::json!({"len": 0}));
}

#[test]
fn malformed_lines_are_reported_with_their_line_number_and_exit_code_2() {
    let cases: &[(&str, usize, &str)] = &[
        (
            "{\"op\":\"add\",\"item\":\"a\"}\n\n{\"op\":\"gett\"}\n",
            3,
            "unknown op \"gett\"",
        ),
        ("{\"op\":\"add\"}\n", 1, "add: missing \"item\""),
        (
            "{\"op\":\"add\",\"item\":7}\n",
            1,
            "\"item\" must be a string",
        ),
        ("{\"op\":\"step\",\"ms\":-1}\n", 1, "must not be negative"),
        (
            "{\"op\":\"step\",\"ms\":\"1\"}\n",
            1,
            "must be a number of milliseconds",
        ),
        (
            "{\"op\":\"get\"}\n{\"op\":\"config\"}\n",
            2,
            "only allowed as the first line",
        ),
        (
            "{\"op\":\"config\",\"limiter\":{\"kind\":\"leaky\"}}\n",
            1,
            "unknown limiter kind \"leaky\"",
        ),
        (
            "{\"op\":\"config\",\"limiter\":{\"kind\":\"bucket\",\"qps\":1}}\n",
            1,
            "missing \"burst\"",
        ),
        (
            "{\"op\":\"add_after\",\"item\":\"a\",\"ms\":1e300}\n",
            1,
            "out of range",
        ),
        ("not json\n", 1, "not valid JSON"),
    ];
    for engine in [
        &["ops", "--engine", "workqueue-reference"][..],
        &["ops", "--engine", "workqueue", "--shards", "4"][..],
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

#[test]
fn output_before_a_malformed_line_is_kept() {
    let output = common::run_loadgen(
        &["ops", "--engine", "workqueue", "--shards", "2"],
        b"{\"op\":\"add\",\"item\":\"a\"}\n{\"op\":\"len\"}\n{\"op\":\"oops\"}\n{\"op\":\"len\"}\n",
    );
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "{\"len\":1}\n");
}

#[test]
fn the_sharded_queue_refuses_done_of_an_unhandled_item_and_goes_on() {
    let trace =
        b"{\"op\":\"add\",\"item\":\"a\"}\n{\"op\":\"done\",\"item\":\"a\"}\n{\"op\":\"len\"}\n";
    let sharded = common::run_loadgen(&["ops", "--engine", "workqueue"], trace);
    assert!(sharded.status.success());
    assert_eq!(String::from_utf8_lossy(&sharded.stdout), "{\"len\":1}\n");
    let stderr = String::from_utf8_lossy(&sharded.stderr);
    assert!(stderr.starts_with("line 2: done refused: "), "{stderr}");
    let reference = common::run_loadgen(&["ops", "--engine", "workqueue-reference"], trace);
    assert!(reference.status.success());
    assert_eq!(
        String::from_utf8_lossy(&reference.stdout),
        "{\"len\":2}\n",
        "client-go's quirk: queued twice"
    );
}
