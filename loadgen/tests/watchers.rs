//! `loadgen e2e --watchers N` through the binary: one server's churn fanned out to watchers
//! in child processes, each of which must receive every event; a watcher that stops reading
//! is closed by the server and counted as dropped; bad plans are usage errors.
#![cfg(feature = "wire")]

use std::process::{Command, Output};

use serde_json::Value;

fn loadgen(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .output()
        .expect("loadgen runs")
}

/// Runs `e2e` with `args` and `--json`, returning its exit code, stdout and the document.
fn e2e_json(name: &str, args: &[&str]) -> (Option<i32>, String, Value) {
    let json = std::env::temp_dir().join(format!(
        "loadgen-watchers-{}-{name}.json",
        std::process::id()
    ));
    let mut all = vec!["e2e", "--json", json.to_str().unwrap()];
    all.extend_from_slice(args);
    let out = loadgen(&all);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let text = std::fs::read_to_string(&json).unwrap_or_else(|e| {
        panic!(
            "no report ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let _ = std::fs::remove_file(&json);
    (
        out.status.code(),
        stdout,
        serde_json::from_str(&text).unwrap(),
    )
}

#[test]
fn twenty_watchers_over_two_processes_each_get_every_event() {
    // Minimal pods at a low rate: what is tested is the fan-out and its accounting.
    let (code, stdout, doc) = e2e_json(
        "twenty",
        &[
            "--watchers",
            "20",
            "--watcher-procs",
            "2",
            "--rate",
            "500",
            "--events",
            "1500",
            "--keys",
            "200",
            "--pod-profile",
            "minimal",
        ],
    );
    assert_eq!(code, Some(0), "{stdout}");
    let fan_out = &doc["fan_out"];
    assert_eq!(fan_out["watchers"], 20);
    assert_eq!(fan_out["procs"], 2);
    assert_eq!(fan_out["events"], 1500);
    assert_eq!(fan_out["watchers_ok"], 20, "{fan_out}");
    assert_eq!(fan_out["dropped"], 0);
    assert_eq!(fan_out["closed_as_too_slow"], 0);
    assert_eq!(
        fan_out["delivered"],
        20 * 1500,
        "every watcher got every event"
    );
    assert_eq!(fan_out["ok"], true);
    let watchers = fan_out["per_watcher"].as_array().unwrap();
    assert_eq!(watchers.len(), 20);
    for w in watchers {
        assert_eq!(
            (&w["events"], &w["expected"]),
            (&1500.into(), &1500.into()),
            "{w}"
        );
        assert!(w["ended_early"].is_null(), "{w}");
        let p99 = w["lag_p99_us"].as_u64().unwrap();
        assert!(p99 > 0 && p99 <= w["lag_max_us"].as_u64().unwrap(), "{w}");
    }
    let cpu = fan_out["server_cpu_us_per_event"].as_f64().unwrap();
    assert!(
        cpu > 0.0,
        "the server's CPU per delivered event is measured: {fan_out}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("serve-alone"))
        .unwrap_or_else(|| panic!("no row:\n{stdout}"));
    assert!(line.ends_with(" ok"), "{line}");
}

#[test]
fn a_watcher_that_stops_reading_is_closed_by_the_server_and_dropped() {
    // Typical pods (about 8 KB of JSON each): 6,000 events are far more than the loopback
    // socket buffers hold, so the stalled watcher falls more than the window (500 events)
    // behind and the server's check, once a second, closes it.
    let (code, stdout, doc) = e2e_json(
        "stalled",
        &[
            "--watchers",
            "3",
            "--watcher-procs",
            "1",
            "--stalled-watchers",
            "1",
            "--rate",
            "2000",
            "--events",
            "6000",
            "--keys",
            "200",
            "--window",
            "500",
            "--settle-seconds",
            "2",
        ],
    );
    assert_eq!(
        code,
        Some(1),
        "a dropped watcher fails the verdict:\n{stdout}"
    );
    let fan_out = &doc["fan_out"];
    assert_eq!(fan_out["closed_as_too_slow"], 1, "{fan_out}");
    assert_eq!(
        (&fan_out["watchers_ok"], &fan_out["dropped"]),
        (&2.into(), &1.into())
    );
    assert_eq!(fan_out["ok"], false);
    let watchers = fan_out["per_watcher"].as_array().unwrap();
    let stalled = &watchers[0];
    assert!(stalled["events"].as_u64().unwrap() < 6000, "{stalled}");
    for w in &watchers[1..] {
        assert_eq!(w["events"], 6000, "the others keep up: {w}");
    }
    assert!(stdout.contains("FAILED (1 of 3 dropped)"), "{stdout}");
}

#[test]
fn bad_plans_are_usage_errors_that_say_why() {
    for (args, says) in [
        (&["--watchers", "0"][..], "--watchers must be at least 1"),
        (
            &["--watchers", "3", "--watcher-procs", "4"],
            "between 1 and --watchers (3)",
        ),
        (
            &["--watchers", "3", "--churn-seconds=0"],
            "--churn-seconds must be above 0",
        ),
        (
            &["--watchers", "3", "--client", "kcache"],
            "cannot be used with",
        ),
        (&["--watcher-procs", "2"], "--watchers"),
        (
            &[
                "--watchers",
                "2",
                "--stalled-watchers",
                "1",
                "--watcher-client",
                "kcache",
            ],
            "--stalled-watchers needs a discarding",
        ),
    ] {
        let mut all = vec!["e2e", "--rate", "100", "--keys", "10"];
        all.extend_from_slice(args);
        let out = loadgen(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
