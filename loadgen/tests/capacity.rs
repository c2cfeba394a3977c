//! `loadgen capacity` through the binary: a tiny search per engine, each probe a child
//! process, its JSON report and its chart; and the arguments it refuses.

#![forbid(unsafe_code)]

mod common;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

/// Held by each search for its whole length. A probe passes only if the producer keeps within
/// 1% of a schedule of a fraction of a second, so two searches running at once on a 2-core
/// machine (the test harness runs a file's tests in parallel) fail each other's probes.
static ONE_SEARCH_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The search both tests make: at most 3 probes per engine, each of 8,000 churn events at
/// 2,000 to 8,000/s, so scheduled over 1 to 4 seconds (see the first test), with a loose
/// 500 ms p99 limit.
const SEARCH: &[&str] = &[
    "--events",
    "8000",
    "--probe-secs",
    "2",
    "--start-rate",
    "4000",
    "--min-rate",
    "2000",
    "--max-rate",
    "8000",
    "--precision",
    "50",
    "--tries",
    "1",
    "--max-probes",
    "3",
    "--p99-ms",
    "500",
];

fn alone() -> MutexGuard<'static, ()> {
    // A panicked search leaves the lock poisoned; the next one is still alone.
    ONE_SEARCH_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("loadgen-capacity-{}-{name}", std::process::id()))
}

#[test]
fn a_tiny_w1_search_reports_a_capacity_per_engine_and_draws_its_curve() {
    let _alone = alone();
    let dir = scratch("w1");
    let (json, chart) = (dir.join("c.json"), dir.join("curve.svg"));
    let (json_arg, chart_arg) = (json.to_string_lossy(), chart.to_string_lossy());
    // At most 3 probes per engine, each scheduled over 1 to 4 seconds (8,500 ops at 2,000 to
    // 8,000/s): the producer must keep within 1% of that, 10 ms or more, which a debug build
    // does on a busy machine (probes of a tenth of a second failed there on one stall). The
    // p99 limit is a loose 500 ms, so that the search finds a capacity on however busy a
    // machine: the test is of the search, not of the speed.
    let (stdout, report) = common::run_with_report(
        &[
            &["capacity", "--workload", "w1", "--keys", "500"][..],
            SEARCH,
            &["--json", &json_arg, "--chart", &chart_arg],
        ]
        .concat(),
        &json,
    );
    assert!(
        stdout.contains("kcache absorbs") && stdout.contains("(reference: "),
        "{stdout}"
    );
    let curves = report["capacity"].as_array().expect("a capacity array");
    assert_eq!(common::engines(curves), ["reference", "sharded"]);
    for c in curves {
        let probes = c["probes"].as_array().expect("every probe is reported");
        assert!((1..=3).contains(&probes.len()), "{c}");
        for p in probes {
            let rate = p["rate"].as_u64().expect("a probe's rate");
            assert_eq!(p["result"]["offered_rate"].as_u64(), Some(rate), "{p}");
            assert!(p["result"]["producer_lag_ms"].as_f64().is_some(), "{p}");
            assert_eq!(p["result"]["verdict"], "ok", "{p}");
            assert_eq!(
                p["passed"].as_bool(),
                Some(p["failed_rules"].as_array().is_some_and(Vec::is_empty)),
                "{p}"
            );
        }
        let capacity = c["capacity_events_per_s"]
            .as_u64()
            .unwrap_or_else(|| panic!("a capacity within a 500 ms p99 limit: {c}"));
        assert!((2_000..=8_000).contains(&capacity), "{c}");
        assert!(c["at_capacity"]["latency_us"]["p99"].as_f64().unwrap() <= 500_000.0);
        assert!(probes
            .iter()
            .any(|p| p["rate"].as_u64() == Some(capacity) && p["passed"] == true));
    }
    let svg = std::fs::read_to_string(&chart).expect("the chart exists");
    assert!(
        svg.starts_with("<svg") && svg.contains("p99 limit 500 ms"),
        "{svg}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

// `--through informer`: the same search, each probe written into the in-memory API server and
// heard by the informer's handlers (here two, registered inline); a probe's latency is from
// the write to the first handler, its schedule judged as the bare path's. Probes are sized as
// the bare search's (8,000 churn events, 1 to 4 seconds each).
#[test]
fn a_tiny_search_through_the_informer_reports_a_capacity_per_engine() {
    let _alone = alone();
    let dir = scratch("informer");
    let json = dir.join("c.json");
    let json_arg = json.to_string_lossy();
    let (stdout, report) = common::run_with_report(
        &[
            &[
                "capacity",
                "--workload",
                "w1",
                "--through",
                "informer",
                "--handlers",
                "2",
                "--delivery",
                "inline",
                "--keys",
                "300",
            ][..],
            SEARCH,
            &["--json", &json_arg],
        ]
        .concat(),
        &json,
    );
    assert!(stdout.contains("w1/informer"), "{stdout}");
    let curves = report["capacity"].as_array().expect("a capacity array");
    assert_eq!(common::engines(curves), ["reference", "sharded"]);
    for c in curves {
        assert_eq!(c["workload"], "w1/informer", "{c}");
        let probes = c["probes"].as_array().expect("every probe is reported");
        assert!((1..=3).contains(&probes.len()), "{c}");
        for p in probes {
            let result = &p["result"];
            assert_eq!(result["workload"], "w1/informer", "{p}");
            assert_eq!(result["offered_rate"], p["rate"], "{p}");
            assert!(result["producer_lag_ms"].as_f64().is_some(), "{p}");
            assert_eq!(result["verdict"], "ok", "{p}");
            assert_eq!(result["handlers"].as_array().map(Vec::len), Some(2), "{p}");
        }
        let capacity = c["capacity_events_per_s"]
            .as_u64()
            .unwrap_or_else(|| panic!("a capacity within a 500 ms p99 limit: {c}"));
        assert!((2_000..=8_000).contains(&capacity), "{c}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn workloads_and_limits_it_cannot_measure_are_refused_before_any_probe() {
    for (args, why) in [
        (
            &["--workload", "w4"][..],
            "w4 writes straight into the indexer",
        ),
        (&["--workload", "w3"][..], "w3's relists"),
        (
            &["--workload", "w1", "--p99-ms", "0"][..],
            "--p99-ms must be a positive",
        ),
        (
            &["--workload", "w1", "--keys", "0"][..],
            "--keys must be at least 1",
        ),
        (
            &["--workload", "w1", "--min-rate", "10", "--max-rate", "5"][..],
            "--min-rate <= --max-rate",
        ),
        (&["--workload", "w1", "--tries", "0"][..], "--tries"),
        (&["--workload", "w1", "--probe-secs=-1"][..], "--probe-secs"),
    ] {
        let all: Vec<&str> = ["capacity"]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        let output = common::run_loadgen(&all, b"");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{all:?}: {stderr}");
        assert!(stderr.contains(why), "{all:?}: {stderr}");
        assert!(output.stdout.is_empty(), "{all:?}: nothing ran");
    }
}
