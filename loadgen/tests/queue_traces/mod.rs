//! The harness of `workqueue_traces` and `workqueue_priority_traces`: both replay hand-worked
//! traces through `loadgen ops` on a reference queue and on 1, 2 and 16 shards, under the same
//! suite rules; the priority queue adds one check of its own (see
//! [`every_trace_matches_its_expected_output`]).
//!
//! Suites by name prefix (see the trace directories' READMEs): `ref_` traces against the
//! reference port only; unprefixed ones also against the sharded queue with one shard, line for
//! line; `multi_` ones also against 2 and 16 shards, where each maximal run of consecutive `get`
//! outputs is compared as a multiset and every other line in order.

use std::fs;
use std::ops::Range;
use std::path::PathBuf;

use serde_json::Value;

use crate::common;

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

/// One queue configuration and the suites it runs.
pub struct Config {
    label: String,
    args: Vec<String>,
    suites: &'static [Suite],
    multiset_gets: bool,
}

/// The configurations of one queue engine of `loadgen ops`: its reference port
/// (`<engine>-reference`) runs every suite; the sharded engine with one shard the exact ones
/// too, with 2 and 16 shards only the multi-shard ones.
pub fn configs(engine: &str) -> Vec<Config> {
    let reference = format!("{engine}-reference");
    let mut configs = vec![Config {
        label: reference.clone(),
        args: vec!["ops".into(), "--engine".into(), reference],
        suites: &[Suite::ReferenceOnly, Suite::Exact, Suite::MultiShard],
        multiset_gets: false,
    }];
    let sharded: [(&str, &'static [Suite]); 3] = [
        ("1 shard", &[Suite::Exact, Suite::MultiShard]),
        ("2 shards", &[Suite::MultiShard]),
        ("16 shards", &[Suite::MultiShard]),
    ];
    for (shards, suites) in sharded {
        let count = shards.split(' ').next().unwrap();
        configs.push(Config {
            label: format!("{engine}, {shards}"),
            args: ["ops", "--engine", engine, "--shards", count]
                .map(String::from)
                .to_vec(),
            suites,
            multiset_gets: count != "1",
        });
    }
    configs
}

fn traces(dir: &str) -> Vec<(String, PathBuf)> {
    let mut traces: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
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
pub fn get_runs(lines: &[Value]) -> Vec<Range<usize>> {
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

/// Sorts each maximal run of consecutive `get` outputs (by their JSON text).
pub fn sort_get_runs(lines: &mut [Value]) {
    for run in get_runs(lines) {
        lines[run].sort_by_key(|v| v.to_string());
    }
}

/// Replays every trace of `dir` (at least `min_traces` of them) on every configuration it is
/// for and compares the output with the trace's `.out`; `also_check` judges each replay's own
/// output first (a rule the expected output cannot state, e.g. priority order within a run).
pub fn every_trace_matches_its_expected_output(
    dir: &str,
    min_traces: usize,
    configs: &[Config],
    also_check: impl Fn(&[Value]) -> Option<String>,
) {
    let traces = traces(dir);
    assert!(
        traces.len() >= min_traces,
        "only {} traces in {dir}",
        traces.len()
    );
    let mut failures = Vec::new();
    let mut replays = 0;
    for (name, path) in &traces {
        let suite = suite_of(name);
        let input = fs::read(path).unwrap();
        let expected_text = fs::read_to_string(path.with_extension("out"))
            .unwrap_or_else(|e| panic!("{name}.out: {e}"));
        for config in configs.iter().filter(|c| c.suites.contains(&suite)) {
            let args: Vec<&str> = config.args.iter().map(String::as_str).collect();
            let output = common::run_loadgen(&args, &input);
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
            if let Some(broken) = also_check(&actual) {
                failures.push(format!("{name} on {}: {broken}", config.label));
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

/// Each malformed trace, on each engine, exits 2 with a message that names its line.
pub fn malformed_lines_are_reported(engines: &[&[&str]], cases: &[(&str, usize, &str)]) {
    for engine in engines {
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
