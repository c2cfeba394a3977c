//! W6 on the bare queue (`--through queue`, the engine-only form; `controller_informer.rs` tests
//! the default form through the shared informer): a tiny run through the binary passes its
//! verdict with both pipelines, and the verdict fails when a key's last event was never reconciled, when two
//! workers held one key at once, or when the workqueue was not empty at the end (corrupted
//! records, as `verdict.rs` corrupts stores and counters).

#![forbid(unsafe_code)]

mod common;

use loadgen::commands::run::{run, RunArgs};
use loadgen::engines::EngineChoice;
use loadgen::pipelines::controller_loop::{
    check_controller, fails, last_events, state_code, ControllerRecord,
};
use loadgen::ui::Ui;
use workloads::{generate, Generated, Op, Workload, WorkloadSpec};

const KEYS: usize = 300;
const EVENTS: usize = 3_000;

/// W6 on the bare queue, small: the first arguments of the runs through the binary.
fn bare_w6() -> impl Iterator<Item = &'static str> {
    common::SMALL_W6.into_iter().chain(["--through", "queue"])
}
#[test]
fn w6_through_the_binary_passes_with_both_pipelines() {
    let args: Vec<&str> = bare_w6().chain(["--engine", "all"]).collect();
    let (_, report) = common::run_with_json("w6", &args);
    let rows = report["results"].as_array().expect("results");
    assert_eq!(common::engines(rows), ["reference", "sharded"]);
    for row in rows {
        assert_eq!(row["workload"], "w6");
        assert_eq!(row["verdict"], "ok", "{row}");
        let c = &row["controller"];
        assert_eq!(c["workers"], 4);
        assert_eq!(c["reconcile_us"], 5);
        let reconciles = c["reconciles"].as_u64().expect("reconciles");
        assert!(reconciles > 0 && reconciles <= 5_500 + c["retries"].as_u64().unwrap());
    }
}

fn args(engine: EngineChoice) -> RunArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }
    let mut a = Cli::parse_from([
        "run",
        "--workload",
        "w6",
        "--keys",
        &KEYS.to_string(),
        "--events",
        &EVENTS.to_string(),
        "--shards",
        "4",
        "--consumers",
        "2",
        "--through",
        "queue",
        "--in-process",
    ])
    .run;
    a.engine = engine;
    a
}

#[test]
fn every_key_reconciled_at_least_once_and_its_failed_first_attempts_retried() {
    let results = run(&args(EngineChoice::All), Ui::Quiet).expect("tiny run");
    assert_eq!(results.len(), 2);
    // Every key is reconciled at least once (its initial add), and whether an attempt fails
    // depends on the seed, the key and the attempt alone: the keys whose first attempt fails
    // are known up front, and each of them was retried at least once.
    let first_attempt_fails = (0..KEYS as u32).filter(|&id| fails(42, id, 0)).count() as u64;
    for r in &results {
        assert!(r.is_ok(), "{}: {:?}", r.engine, r.failures);
        let c = r.controller.expect("W6 reports its controller figures");
        assert!(
            c.retries >= first_attempt_fails,
            "{}: {} retries, {first_attempt_fails} keys fail their first attempt",
            r.engine,
            c.retries
        );
        assert!(c.reconciles >= KEYS as u64);
    }
}

/// The generated workload and the record a perfect controller would leave: every key
/// reconciled at its last state, no overlap, nothing left in the queue.
fn perfect() -> (Generated, ControllerRecord) {
    let gen = generate(&WorkloadSpec::new(Workload::W6).keys(KEYS).events(EVENTS));
    let last = last_events(&gen.ops, KEYS);
    let record = ControllerRecord {
        reconciled: last.clone(),
        last_event: last,
        ..ControllerRecord::default()
    };
    assert!(check_controller(&record).is_empty());
    (gen, record)
}

#[test]
fn a_key_whose_last_event_was_not_reconciled_fails_the_verdict() {
    let (gen, mut record) = perfect();
    // A key updated at least once: its controller saw an older version only.
    let updated = gen
        .ops
        .iter()
        .rev()
        .find_map(|op| match op {
            Op::Update(pod) => Some(pod.id as usize),
            _ => None,
        })
        .expect("W1's churn updates");
    record.reconciled[updated] -= 2;
    let failures = check_controller(&record);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].starts_with(&format!("key {updated}: last event")),
        "{failures:?}"
    );
}

#[test]
fn a_deleted_key_reconciled_only_while_alive_fails_the_verdict() {
    let (gen, mut record) = perfect();
    let deleted = gen
        .model
        .alive
        .iter()
        .position(Option::is_none)
        .expect("some key ends deleted");
    let last = record.last_event[deleted];
    assert_eq!(last & 1, 1, "a deleted key's last event is a deletion");
    // The controller read the object at its last version, but never saw it gone.
    record.reconciled[deleted] = state_code(last >> 1, false);
    let failures = check_controller(&record);
    assert!(
        failures
            .iter()
            .any(|f| f.contains(", deleted) never reconciled")),
        "{failures:?}"
    );
}

#[test]
fn two_workers_on_one_key_fail_the_verdict() {
    let (_, mut record) = perfect();
    record.overlaps = 1;
    let failures = check_controller(&record);
    assert_eq!(
        failures,
        ["1 reconciles found their key held by another worker"]
    );
}

#[test]
fn a_workqueue_not_empty_at_the_end_fails_the_verdict() {
    for (queued, processing, waiting) in [(1, 0, 0), (0, 1, 0), (0, 0, 1)] {
        let (_, mut record) = perfect();
        record.queued_at_end = queued;
        record.processing_at_end = processing;
        record.waiting_at_end = waiting;
        let failures = check_controller(&record);
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert!(
            failures[0].starts_with("workqueue not empty at the end"),
            "{failures:?}"
        );
    }
}

#[test]
fn a_w6_child_runs_the_parents_workers_and_reconcile_cost() {
    use clap::Parser;
    use loadgen::runner::run_spec::{Pipeline, RunSpec};
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }
    let own = [
        "--engine",
        "sharded",
        "--workers",
        "7",
        "--reconcile-us",
        "11",
        "--seed",
        "3",
    ];
    let parent = Cli::parse_from(bare_w6().chain(own)).run;
    let rows = loadgen::commands::run::specs(&parent).expect("rows");
    assert_eq!(rows.len(), 1);
    let json = serde_json::to_string(&rows[0]).expect("a spec serialises");
    let child: RunSpec = serde_json::from_str(&json).expect("a spec deserialises");
    assert_eq!(child, rows[0]);
    assert_eq!(
        child.pipeline,
        Pipeline::ControllerLoop(parent.controller())
    );
    // The child process runs what it was handed, as the parent's own children do.
    let dir = std::env::temp_dir().join(format!("loadgen-w6-child-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let report = dir.join("report.json");
    let output = common::run_loadgen(
        &["child", "--report", report.to_str().expect("a UTF-8 path")],
        json.as_bytes(),
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&report).expect("the child's report");
    let _ = std::fs::remove_dir_all(&dir);
    let report: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let row = &report["results"][0];
    assert_eq!(row["engine"], "sharded");
    assert_eq!(row["workload"], "w6");
    assert_eq!(row["keys"], 500);
    assert_eq!(row["controller"]["workers"], 7);
    assert_eq!(row["controller"]["reconcile_us"], 11);
    let zero = Cli::try_parse_from(["run", "--workload", "w6", "--workers", "0"]);
    assert!(zero.is_err(), "no worker would never drain the workqueue");
}
