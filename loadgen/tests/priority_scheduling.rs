//! W8, priority scheduling: short runs of each workqueue order on both engines. The runs are
//! real time on whatever machine runs the tests, so the assertions compare rows with each
//! other or with the run's own length, with wide margins, never with absolute latencies.

#![forbid(unsafe_code)]

use std::time::Duration;

use loadgen::engines::{EngineConfig, EngineKind};
use loadgen::pipelines::controller_loop::ControllerConfig;
use loadgen::pipelines::priority_scheduling::{measure, QueueKind, Scenario, SchedulingConfig};
use loadgen::progress::NoProgress;
use loadgen::result::{RunResult, SchedulingFigures};
use workloads::{Workload, WorkloadSpec};

fn run(engine: EngineKind, queue: QueueKind, w8: &SchedulingConfig) -> RunResult {
    let ctl = ControllerConfig {
        workers: 2,
        reconcile_cost: Duration::from_micros(200),
        ..ControllerConfig::default()
    };
    let cfg = EngineConfig {
        shards: 4,
        ..EngineConfig::for_workload(Workload::W8)
    };
    let spec = WorkloadSpec::new(Workload::W8).keys(100);
    let row = measure(engine, queue, &spec, &cfg, &ctl, w8, &NoProgress).expect("the run starts");
    assert!(row.is_ok(), "{engine} {}: {:?}", row.workload, row.failures);
    row
}

fn figures(row: &RunResult) -> &SchedulingFigures {
    row.scheduling
        .as_ref()
        .expect("a W8 row has scheduling figures")
}

fn class<'a>(row: &'a RunResult, name: &str) -> &'a loadgen::result::ClassWaits {
    figures(row)
        .classes
        .iter()
        .find(|c| c.class == name)
        .unwrap_or_else(|| panic!("{}: no class {name}", row.workload))
}

fn share(row: &RunResult, group: &str) -> f64 {
    figures(row)
        .groups
        .iter()
        .find(|g| g.group == group)
        .unwrap_or_else(|| panic!("{}: no group {group}", row.workload))
        .share
}

/// The `mixed` scenario, run for `duration_ms`, aging bounded at `max_wait_ms`, with a backlog
/// of `backlog` keys.
fn mixed(duration_ms: u64, max_wait_ms: u64, backlog: usize) -> SchedulingConfig {
    SchedulingConfig {
        duration: Duration::from_millis(duration_ms),
        max_wait: Duration::from_millis(max_wait_ms),
        backlog,
        ..SchedulingConfig::default()
    }
}

#[test]
fn every_order_reports_each_class_and_shares_that_sum_to_one() {
    let w8 = mixed(800, 200, 200);
    for engine in EngineKind::ALL {
        for queue in [
            QueueKind::Fifo,
            QueueKind::Priority,
            QueueKind::Aging,
            QueueKind::Fair,
            QueueKind::AgingFair,
        ] {
            let row = run(engine, queue, &w8);
            let f = figures(&row);
            assert_eq!(row.workload, format!("w8/{}", queue.name()));
            assert_eq!(f.queue, queue.name());
            let classes: Vec<&str> = f.classes.iter().map(|c| c.class.as_str()).collect();
            assert_eq!(classes, ["churn", "backlog", "trickle"]);
            assert_eq!(
                f.groups.len(),
                9,
                "the flooding namespace and eight quiet ones"
            );
            let sum: f64 = f.groups.iter().map(|g| g.share).sum();
            assert!(
                (sum - 1.0).abs() < 1e-9,
                "{engine} {queue:?}: shares sum to {sum}"
            );
            let reconciles: u64 = f.groups.iter().map(|g| g.reconciles).sum();
            assert_eq!(Some(reconciles), row.controller.map(|c| c.reconciles));
            assert!(class(&row, "churn").served > 0, "{engine} {queue:?}");
            assert_eq!(f.max_wait_ms.is_some(), queue.name().starts_with("aging"));
            if f.max_wait_ms.is_none() {
                assert_eq!(f.overdue_handouts, 0, "no aging, no reordering");
            }
        }
    }
}

#[test]
fn aging_bounds_the_backlogs_wait_and_priority_alone_starves_it() {
    // The backlog arrives over the first 1.5 s; with aging every key of it is due by 1.8 s,
    // 1.2 s before the end, so a wait near the run's length can only be starvation.
    let w8 = mixed(3_000, 300, 300);
    let run_ms = w8.duration.as_secs_f64() * 1e3;
    for engine in EngineKind::ALL {
        let aging = run(engine, QueueKind::Aging, &w8);
        let backlog = class(&aging, "backlog");
        assert_eq!(
            (backlog.served, backlog.waiting_at_end),
            (300, 0),
            "{engine}: aging serves the whole backlog"
        );
        let max = backlog.max_ms.expect("served keys have a max wait");
        assert!(
            max >= 300.0 && max < run_ms / 2.0,
            "{engine}: the backlog's longest wait under aging is {max} ms (bound 300 ms)"
        );
        assert!(
            figures(&aging).overdue_handouts > 0,
            "{engine}: aging reordered"
        );

        let priority = run(engine, QueueKind::Priority, &w8);
        let backlog = class(&priority, "backlog");
        assert!(
            backlog.waiting_at_end > 0,
            "{engine}: without aging the flood keeps the backlog queued: {backlog:?}"
        );
        let max = backlog.max_ms.expect("waiting keys count in the max");
        assert!(
            max > run_ms / 2.0,
            "{engine}: the backlog's longest wait without aging is {max} ms of a {run_ms} ms run"
        );
    }
}

#[test]
fn fairness_shares_the_workers_between_two_tenants_at_ten_to_one() {
    let w8 = SchedulingConfig {
        scenario: Scenario::Tenants,
        duration: Duration::from_millis(1500),
        ..SchedulingConfig::default()
    };
    for engine in EngineKind::ALL {
        let plain = run(engine, QueueKind::Priority, &w8);
        let fair = run(engine, QueueKind::Fair, &w8);
        for row in [&plain, &fair] {
            let classes: Vec<&str> = figures(row)
                .classes
                .iter()
                .map(|c| c.class.as_str())
                .collect();
            assert_eq!(classes, ["a", "b"]);
            assert!((share(row, "a") + share(row, "b") - 1.0).abs() < 1e-9);
        }
        assert_eq!(fair.workload, "w8-tenants/fair");
        // Without fairness `b` gets about its traffic's tenth; with it, about half.
        assert!(
            share(&fair, "b") > 2.0 * share(&plain, "b"),
            "{engine}: b's share {} with fairness, {} without",
            share(&fair, "b"),
            share(&plain, "b")
        );
        assert!(share(&plain, "a") > share(&plain, "b"));
    }
}
