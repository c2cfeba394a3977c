//! `loadgen ops` on bad input: a malformed line stops the replay with exit code 2 and names
//! the line on stderr, after flushing what came before; a refused operation is reported and
//! the replay goes on with exit code 0.

#![forbid(unsafe_code)]

mod common;

use std::process::Output;

use loadgen::commands::ops::{replay, EngineChoice, OpsError};

const ADD_A: &str = r#"{"op":"add","obj":{"key":"ns/a","v":1}}"#;
const POP_A: &str = r#"{"pop":"ns/a","initial":false,"deltas":[{"type":"Added","v":1}]}"#;

fn ops(stdin: &[u8]) -> Output {
    common::run_loadgen(&["ops", "--engine", "reference"], stdin)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts exit code 2, a stderr that starts by naming `line`, and mentions each of `words`.
fn assert_malformed(output: &Output, line: usize, words: &[&str]) {
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stderr.starts_with(&format!("line {line}: ")),
        "stderr should name line {line}: {stderr}"
    );
    for word in words {
        assert!(stderr.contains(word), "stderr lacks {word:?}: {stderr}");
    }
}

#[test]
fn bad_json_on_line_3_exits_2_after_writing_the_earlier_output() {
    let input = format!("{ADD_A}\n{{\"op\":\"pop\"}}\n{{\"op\":\"add\",\n{{\"op\":\"pop\"}}\n");
    let output = ops(input.as_bytes());
    assert_malformed(&output, 3, &["JSON"]);
    assert_eq!(text(&output.stdout), format!("{POP_A}\n"));
}

#[test]
fn unknown_op_exits_2_and_lists_the_valid_ops() {
    let input = format!("{ADD_A}\n{{\"op\":\"frobnicate\"}}\n");
    let output = ops(input.as_bytes());
    assert_malformed(&output, 2, &["\"frobnicate\"", "drain", "delete_tombstone"]);
    assert!(output.stdout.is_empty());
}

#[test]
fn missing_field_exits_2_naming_the_field() {
    let output = ops(b"{\"op\":\"pop\"}\n{\"op\":\"replace\"}\n");
    assert_malformed(&output, 2, &["\"replace\"", "\"objs\""]);
    assert_eq!(text(&output.stdout), "{\"pop\":null,\"closed\":false}\n");
}

#[test]
fn mistyped_field_exits_2_naming_the_field() {
    let output = ops(b"{\"op\":\"add\",\"obj\":{\"key\":\"ns/a\",\"v\":\"one\"}}\n");
    assert_malformed(&output, 1, &["\"obj\"", "\"v\""]);
}

#[test]
fn config_not_first_exits_2() {
    let output = ops(b"{\"op\":\"has_synced\"}\n{\"op\":\"config\",\"known_objects\":false}\n");
    assert_malformed(&output, 2, &["first"]);
    assert_eq!(text(&output.stdout), "{\"has_synced\":false}\n");
}

#[test]
fn config_after_blank_lines_is_still_the_first_line() {
    let output = ops(b"\n  \n{\"op\":\"config\",\"known_objects\":false}\n{\"op\":\"known\"}\n");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "{\"known\":[]}\n");
}

#[test]
fn blank_lines_count_in_line_numbers() {
    let output = ops(b"\n\n{\"op\":\"pop\"\n");
    assert_malformed(&output, 3, &["JSON"]);
}

#[test]
fn invalid_utf8_exits_2_naming_the_line() {
    let output = ops(b"{\"op\":\"pop\"}\n{\"op\":\"p\xffp\"}\n");
    assert_malformed(&output, 2, &["UTF-8"]);
}

#[test]
fn key_error_is_reported_and_the_replay_continues_with_exit_0() {
    let input = format!(
        "{{\"op\":\"add\",\"obj\":{{\"key\":\"\",\"v\":1}}}}\n\
         {{\"op\":\"delete_tombstone\",\"key\":\"\",\"obj\":null}}\n\
         {ADD_A}\n{{\"op\":\"pop\"}}\n"
    );
    let output = ops(input.as_bytes());
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "stderr: {stderr}");
    let complaints: Vec<&str> = stderr.lines().collect();
    assert_eq!(complaints.len(), 2, "{stderr}");
    assert!(
        complaints[0].starts_with("line 1: add refused: "),
        "{stderr}"
    );
    assert!(
        complaints[1].starts_with("line 2: delete_tombstone refused: "),
        "{stderr}"
    );
    assert_eq!(text(&output.stdout), format!("{POP_A}\n"));
}

#[test]
fn empty_input_writes_nothing_and_succeeds() {
    let output = ops(b"");
    assert_eq!(output.status.code(), Some(0));
    assert!(output.stdout.is_empty() && output.stderr.is_empty());
}

#[test]
fn in_process_replay_reports_the_line_and_keeps_earlier_output() {
    let input = format!("{ADD_A}\n{{\"op\":\"pop\"}}\n{{\"op\":\"add\",\"obj\":1}}\n");
    let mut out = Vec::new();
    let err = replay(input.as_bytes(), &mut out, EngineChoice::Reference).unwrap_err();
    assert!(
        matches!(&err, OpsError::Malformed { line: 3, message } if message.contains("\"obj\"")),
        "{err:?}"
    );
    assert_eq!(err.exit_code(), 2);
    assert_eq!(text(&out), format!("{POP_A}\n"));
}

#[test]
fn in_process_replay_collects_refusals_in_the_summary() {
    let input = format!("{{\"op\":\"replace\",\"objs\":[{{\"key\":\"\",\"v\":1}}]}}\n{ADD_A}\n");
    let summary = replay(input.as_bytes(), Vec::new(), EngineChoice::Reference).unwrap();
    assert_eq!(summary.lines, 2);
    assert_eq!(summary.ops, 2);
    assert_eq!(summary.refusals.len(), 1);
    assert_eq!(summary.refusals[0].line, 1);
    assert_eq!(summary.refusals[0].op, "replace");
}
