//! The hand-worked priority workqueue traces (`tests/traces/workqueue_priority/`,
//! docs/traces.md) through the `loadgen ops` binary, by the suite rules of
//! `queue_traces/mod.rs`; besides, each run of consecutive `get` outputs must not increase in
//! priority.

use serde_json::Value;

use queue_traces::{configs, get_runs};

mod common;
mod queue_traces;

const TRACES_DIR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/traces/workqueue_priority"
);

/// The suite must not shrink unnoticed.
const MIN_TRACES: usize = 18;

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

#[test]
fn every_priority_trace_matches_its_expected_output_on_every_queue_it_is_for() {
    queue_traces::every_trace_matches_its_expected_output(
        TRACES_DIR,
        MIN_TRACES,
        &configs("workqueue-priority"),
        priority_rises,
    );
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
    queue_traces::malformed_lines_are_reported(
        &[
            &["ops", "--engine", "workqueue-priority-reference"],
            &["ops", "--engine", "workqueue-priority", "--shards", "4"],
        ],
        cases,
    );
}
