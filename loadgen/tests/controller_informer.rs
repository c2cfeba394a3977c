//! W6 through the shared informer (the default W6) and the harness floor: a tiny run through
//! the binary passes its verdict on both engines with the floor's row beside them, CPU per
//! event is in the JSON of every row; a handler that drops a key fails the verdict; the floor
//! counts every event, and follows W3's relists.

#![forbid(unsafe_code)]

mod common;

use std::sync::Arc;

use loadgen::engines::{EngineConfig, EngineKind};
use loadgen::pipelines::controller_informer::{drops_none, measure, LABEL};
use loadgen::pipelines::controller_loop::ControllerConfig;
use loadgen::pipelines::harness_floor::FLOOR_NAME;
use loadgen::progress::NoProgress;
use workloads::{generate, Workload, WorkloadSpec};

#[test]
fn w6_through_the_informer_passes_on_both_engines_beside_the_harness_floor() {
    let (stdout, report) = common::run_with_json("w6-informer", &common::SMALL_W6);
    assert!(stdout.contains("CPU µs/ev"), "{stdout}");
    let rows = report["results"].as_array().expect("results");
    assert_eq!(common::engines(rows), ["reference", "sharded", FLOOR_NAME]);
    for row in rows {
        assert_eq!(row["workload"], LABEL);
        assert_eq!(row["verdict"], "ok", "{row}");
        let cpu = row["cpu_us_per_event"]
            .as_f64()
            .expect("CPU per event in the JSON");
        assert!(cpu >= 0.0, "{row}");
    }
    for row in &rows[..2] {
        let c = &row["controller"];
        assert_eq!(c["workers"], 4);
        assert_eq!(c["reconcile_us"], 5);
        let reconciles = c["reconciles"].as_u64().expect("reconciles");
        assert!(
            reconciles >= 500,
            "every key is reconciled at least once: {row}"
        );
        assert_eq!(row["handlers"][0]["verdict"], "ok", "{row}");
        // At least 5 µs of reconcile per key and a run of thousands of events: more than the
        // 10 ms tick of the process's CPU counters.
        let cpu = row["cpu_us_per_event"].as_f64().expect("CPU per event");
        assert!(cpu > 0.0, "{row}");
    }
    let floor = &rows[2];
    assert_eq!(
        floor["deltas"], floor["events"],
        "the floor receives every event: {floor}"
    );
    assert!(floor["controller"].is_null());
}

fn small_w6() -> workloads::Generated {
    generate(&WorkloadSpec::new(Workload::W6).keys(300).events(3_000))
}

fn config() -> EngineConfig {
    EngineConfig {
        shards: 4,
        consumers: 2,
        ..EngineConfig::for_workload(Workload::W6)
    }
}

#[test]
fn every_engine_reconciles_every_keys_last_event_in_process() {
    let gen = small_w6();
    for engine in EngineKind::ALL {
        let ctl = ControllerConfig::default();
        let row = measure(
            engine,
            &gen,
            &config(),
            &ctl,
            drops_none(),
            None,
            &NoProgress,
        )
        .expect("the run completes");
        assert!(row.is_ok(), "{engine}: {:?}", row.failures);
        let c = row.controller.expect("W6 reports its controller figures");
        assert!(c.reconciles >= 300, "{engine}: {c:?}");
        assert_eq!(row.handlers.len(), 1);
        assert!(row.cpu_us_per_event.is_some());
    }
}

#[test]
fn a_handler_that_drops_a_key_fails_the_verdict() {
    let gen = small_w6();
    let dropped = 7;
    assert!(
        gen.ops
            .iter()
            .any(|op| matches!(op, workloads::Op::Add(p) if p.id == dropped)),
        "the dropped key has events"
    );
    for engine in EngineKind::ALL {
        let drops = Arc::new(move |p: &workloads::Pod| p.id == dropped);
        let row = measure(
            engine,
            &gen,
            &config(),
            &ControllerConfig::default(),
            drops,
            None,
            &NoProgress,
        )
        .expect("the run completes");
        assert!(
            !row.is_ok(),
            "{engine}: a dropped key must fail the verdict"
        );
        assert!(
            row.failures
                .iter()
                .any(|f| f.starts_with(&format!("key {dropped}: last event"))),
            "{engine}: {:?}",
            row.failures
        );
        // The informer delivered every notification: only the controller lost the key.
        assert_eq!(row.handlers[0].verdict, "ok", "{engine}");
    }
}

#[test]
fn the_harness_floor_calls_the_informer_rows_handlers_on_every_event() {
    let w1 = generate(&WorkloadSpec::new(Workload::W1).keys(300).events(3_000));
    let icfg = loadgen::harness::informer_handlers::InformerConfig::default();
    let done = loadgen::pipelines::harness_floor::execute(&w1, None, Some(&icfg), &NoProgress)
        .expect("the floor runs");
    assert!(done.failures.is_empty(), "{:?}", done.failures);
    assert_eq!(done.received, w1.event_count());
    // W1 has no relist and no resync: one notification per event, for each handler.
    assert_eq!(done.notified, icfg.handlers as u64 * w1.event_count());
}

#[test]
fn the_harness_floor_counts_every_event_and_follows_relists() {
    let w1 = generate(&WorkloadSpec::new(Workload::W1).keys(300).events(3_000));
    let row =
        loadgen::pipelines::harness_floor::measure(&w1, "w1/informer", None, None, &NoProgress)
            .expect("the floor runs");
    assert!(row.is_ok(), "{:?}", row.failures);
    assert_eq!(row.engine, FLOOR_NAME);
    assert_eq!(
        row.deltas, row.events,
        "every listed object and watch event"
    );
    assert!(row.events_per_s > 0.0 && row.cpu_us_per_event.is_some());
    let w3 = generate(&WorkloadSpec::new(Workload::W3).keys(300).events(3_000));
    let row =
        loadgen::pipelines::harness_floor::measure(&w3, "w3/informer", None, None, &NoProgress)
            .expect("the floor runs");
    assert!(row.is_ok(), "{:?}", row.failures);
    let stats = row
        .informer
        .expect("the floor reports its lists and watches");
    assert!(stats.lists > 1, "W3's relists are lists again: {stats:?}");
}
