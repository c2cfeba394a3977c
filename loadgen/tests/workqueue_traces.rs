//! The hand-worked workqueue traces (`tests/traces/workqueue/`, docs/traces.md) through the
//! `loadgen ops` binary, by the suite rules of `queue_traces/mod.rs`.

use queue_traces::{configs, sort_get_runs};

mod common;
mod queue_traces;

const TRACES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/traces/workqueue");

/// The suite must not shrink unnoticed.
const MIN_TRACES: usize = 38;

#[test]
fn every_trace_matches_its_expected_output_on_every_queue_it_is_for() {
    queue_traces::every_trace_matches_its_expected_output(
        TRACES_DIR,
        MIN_TRACES,
        &configs("workqueue"),
        |_| None,
    );
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
    queue_traces::malformed_lines_are_reported(
        &[
            &["ops", "--engine", "workqueue-reference"],
            &["ops", "--engine", "workqueue", "--shards", "4"],
        ],
        cases,
    );
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
