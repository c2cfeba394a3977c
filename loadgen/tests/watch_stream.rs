//! The watch-stream parser and the replay of a trace through the engines.

#![forbid(unsafe_code)]

mod common;

use std::path::PathBuf;

use loadgen::engines::{EngineConfig, EngineKind, Mode};
use loadgen::harness::driver::execute;
use loadgen::judging::verdict::check;
use loadgen::progress::NoProgress;
use loadgen::watch_trace::{parse_trace, to_workload, ParsedTrace, WatchType};

fn testdata_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata")
        .join(name)
}

fn testdata(name: &str) -> Vec<u8> {
    let path = testdata_path(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs `loadgen replay --trace PATH` with `extra` arguments.
fn replay_command(path: &std::path::Path, extra: &[&str]) -> std::process::Output {
    let trace = path.to_str().expect("a UTF-8 test path");
    let args: Vec<&str> = ["replay", "--trace", trace]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    common::run_loadgen(&args, b"")
}

/// Events without positions: what two formats of one stream must agree on.
fn events(t: &ParsedTrace) -> Vec<(WatchType, String, u64, Option<String>)> {
    t.events
        .iter()
        .map(|e| (e.kind, e.key(), e.resource_version, e.node.clone()))
        .collect()
}

#[test]
fn the_sample_trace_parses_into_its_events() {
    let t = parse_trace(&testdata("watch-pods.json"));
    assert!(t.bad.is_empty(), "{:?}", t.bad);
    assert_eq!(t.documents, 10);
    assert_eq!(t.bookmarks, 1);
    assert_eq!(t.errors.len(), 1);
    assert_eq!(t.errors[0].line, 267, "the ERROR document is the last one");
    let node = |n: &str| Some(n.to_string());
    assert_eq!(
        events(&t),
        vec![
            (
                WatchType::Added,
                "default/web-0".into(),
                1001,
                node("node-a")
            ),
            (WatchType::Added, "default/web-1".into(), 1002, None),
            (
                WatchType::Added,
                "kube-system/coredns-5d78c9869d-abcde".into(),
                1003,
                node("node-b")
            ),
            (
                WatchType::Modified,
                "default/web-1".into(),
                1010,
                node("node-a")
            ),
            (
                WatchType::Modified,
                "default/web-1".into(),
                1011,
                node("node-a")
            ),
            (
                WatchType::Deleted,
                "default/web-0".into(),
                1020,
                node("node-a")
            ),
            (
                WatchType::Added,
                "default/web-2".into(),
                1021,
                node("node-b")
            ),
            (
                WatchType::Modified,
                "kube-system/coredns-5d78c9869d-abcde".into(),
                1022,
                node("node-b")
            ),
        ]
    );
    // Pretty-printed documents start at column 1 of their first line.
    assert_eq!(
        (t.events[0].position.line, t.events[0].position.column),
        (1, 1)
    );
    assert_eq!(t.events[1].position.line, 33);
}

#[test]
fn one_document_per_line_parses_like_pretty_printed() {
    let pretty = parse_trace(&testdata("watch-pods.json"));
    let mut compact = String::new();
    let text = String::from_utf8(testdata("watch-pods.json")).unwrap();
    for doc in serde_json::Deserializer::from_str(&text).into_iter::<serde_json::Value>() {
        compact.push_str(&doc.unwrap().to_string());
        compact.push('\n');
    }
    let lines = parse_trace(compact.as_bytes());
    assert_eq!(events(&lines), events(&pretty));
    assert_eq!(lines.events[6].position.line, 8, "one line per document");
    // kubectl may also write documents back to back with no separator.
    let glued = parse_trace(compact.replace('\n', "").as_bytes());
    assert_eq!(events(&glued), events(&pretty));
    assert!(glued.bad.is_empty());
}

#[test]
fn broken_documents_are_counted_with_positions_and_skipped() {
    let t = parse_trace(&testdata("watch-broken.json"));
    assert_eq!(t.documents, 14);
    assert_eq!(t.bookmarks, 1);
    let bad: Vec<(usize, &str)> = t
        .bad
        .iter()
        .map(|b| (b.start.line, b.reason.as_str()))
        .collect();
    let lines: Vec<usize> = bad.iter().map(|b| b.0).collect();
    assert_eq!(lines, [2, 4, 6, 7, 8, 9, 10, 27], "{bad:#?}");
    assert!(bad[0].1.starts_with("invalid JSON"));
    // The truncated line 2 is noticed where line 3 begins.
    assert_eq!((t.bad[0].at.line, t.bad[0].at.column), (3, 1));
    assert_eq!(t.bad[0].start.offset, 130);
    assert!(bad[1].1.starts_with("invalid JSON"));
    assert!(bad[2].1.contains("unknown event type \"WHATEVER\""));
    assert!(bad[3].1.contains("metadata.name"));
    assert!(bad[4].1.contains("not a number"));
    assert!(bad[5].1.starts_with("not a watch event"));
    assert!(bad[6].1.contains("older than 11"));
    assert!(
        bad[7].1.starts_with("invalid JSON"),
        "the file ends mid-document"
    );
    // Every good document around the bad ones survives.
    let good: Vec<(WatchType, String, u64)> = t
        .events
        .iter()
        .map(|e| (e.kind, e.key(), e.resource_version))
        .collect();
    assert_eq!(
        good,
        vec![
            (WatchType::Added, "ns/a".into(), 10),
            (WatchType::Modified, "ns/a".into(), 11),
            (WatchType::Added, "ns/c".into(), 12),
            (WatchType::Deleted, "ns/c".into(), 13),
            (WatchType::Added, "ns/d".into(), 15),
        ]
    );
    assert_eq!(t.events[4].position.line, 13);
}

#[test]
fn garbage_and_empty_input_never_panic() {
    for input in [
        &b""[..],
        b"   \n",
        b"}}}{{{",
        b"{\"type\":",
        b"\xff\xfe{",
        b"null\n[]\n\"x\"",
    ] {
        let t = parse_trace(input);
        assert!(t.events.is_empty());
        assert_eq!(t.bad.len(), t.documents);
    }
}

#[test]
fn cluster_scoped_objects_are_keyed_by_name() {
    let t = parse_trace(
        br#"{"type":"ADDED","object":{"kind":"Node","metadata":{"name":"node-a","resourceVersion":"7"}}}"#,
    );
    assert_eq!(t.events[0].key(), "node-a");
}

#[test]
fn the_replay_model_is_the_trace_applied_in_order() {
    let gen = to_workload(&parse_trace(&testdata("watch-pods.json")), "sample");
    let mut alive: Vec<(String, u64, Option<String>)> = gen
        .model
        .alive
        .iter()
        .flatten()
        .map(|p| {
            (
                p.key.to_string(),
                p.version,
                p.node.as_ref().map(ToString::to_string),
            )
        })
        .collect();
    alive.sort();
    assert_eq!(
        alive,
        vec![
            ("default/web-1".into(), 1011, Some("node-a".into())),
            ("default/web-2".into(), 1021, Some("node-b".into())),
            (
                "kube-system/coredns-5d78c9869d-abcde".into(),
                1022,
                Some("node-b".into())
            ),
        ]
    );
    let e = gen.model.expected;
    assert_eq!((e.added, e.updated, e.deleted, e.tombstones), (4, 3, 1, 0));
}

#[test]
fn replaying_the_sample_traces_through_both_engines_passes_the_verdict() {
    // The second trace deletes a key twice: the queue must drop the repeat.
    let twice = br#"{"type":"ADDED","object":{"metadata":{"namespace":"n","name":"x","resourceVersion":"1"}}}
{"type":"DELETED","object":{"metadata":{"namespace":"n","name":"x","resourceVersion":"2"}}}
{"type":"DELETED","object":{"metadata":{"namespace":"n","name":"x","resourceVersion":"2"}}}
{"type":"DELETED","object":{"metadata":{"namespace":"n","name":"never-seen","resourceVersion":"3"}}}
"#;
    for bytes in [
        testdata("watch-pods.json"),
        testdata("watch-broken.json"),
        twice.to_vec(),
    ] {
        let gen = to_workload(&parse_trace(&bytes), "test");
        for engine in EngineKind::ALL {
            // Two consumers: the sharded engine's concurrent path, not only its one-consumer one.
            let cfg = EngineConfig {
                consumers: 2,
                ..EngineConfig::default()
            };
            let done = execute(engine, &gen, Mode::Queue, &cfg, &NoProgress).expect("tiny trace");
            let verdict = check(&gen.model, &*done.store, &done.counters);
            assert!(verdict.is_ok(), "{engine}: {:?}", verdict.failures());
        }
    }
}

#[test]
fn a_trace_with_no_valid_event_fails_with_exit_code_2() {
    let all_bad = testdata_path("watch-all-bad.json");
    // "not json at all" is skipped with the truncated document before it (no `{` starts it).
    assert_eq!(parse_trace(&testdata("watch-all-bad.json")).bad.len(), 4);
    let empty = std::env::temp_dir().join(format!("loadgen-empty-{}.json", std::process::id()));
    std::fs::write(&empty, b"").expect("temp file");
    for (path, bad) in [(&all_bad, 4), (&empty, 0)] {
        let output = replay_command(path, &[]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{}: {stderr}",
            path.display()
        );
        assert!(
            stderr.contains("nothing to replay")
                && stderr.contains(&path.display().to_string())
                && stderr.contains(&format!("{bad} bad")),
            "stderr names the file, says why and counts the bad documents: {stderr}"
        );
        assert!(
            !String::from_utf8_lossy(&output.stdout).contains("verdict"),
            "no engine ran, so no results table"
        );
    }
    std::fs::remove_file(&empty).ok();
}

#[test]
fn replaying_the_sample_trace_exits_0_with_one_row_per_engine() {
    let json = std::env::temp_dir().join(format!("loadgen-replay-{}.json", std::process::id()));
    let output = replay_command(
        &testdata_path("watch-pods.json"),
        &["--json", json.to_str().expect("a UTF-8 temp path")],
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report written"))
            .expect("report is JSON");
    std::fs::remove_file(&json).ok();
    assert_eq!(report["events"], 8);
    let engines: Vec<&str> = report["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["engine"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(engines, ["reference", "sharded"]);
}
