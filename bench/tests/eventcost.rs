//! `eventcost` end to end: every engine, the floor included, runs W1, W2 and W3 and ends with
//! the model's store (the binary checks that itself and fails otherwise), and the floor reports
//! the ceiling of the cores it is given.

use std::process::{Command, Output};

fn eventcost(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_eventcost"))
        .args(args)
        .output()
        .expect("eventcost runs")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_engine_ends_with_the_models_store_on_w1_w2_and_w3() {
    for workload in ["w1", "w2", "w3"] {
        for engine in ["reference", "sharded", "floor"] {
            // A small step makes the relists of W3 land between drains and across steps; a
            // step of 1 pops each op before the next.
            for step in ["1", "7", "5000"] {
                let out = eventcost(&[
                    "--engine",
                    engine,
                    "--workload",
                    workload,
                    "--keys",
                    "400",
                    "--warmup",
                    "300",
                    "--events",
                    "3000",
                    "--step",
                    step,
                    "--pop-batch",
                    "8",
                ]);
                assert!(
                    out.status.success(),
                    "{engine} {workload} step {step}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let line = stdout(&out);
                assert!(
                    line.starts_with(&format!("{engine} {workload} keys=400 step={step} ")),
                    "{line}"
                );
                assert!(line.contains("ns/event"), "{line}");
            }
        }
    }
}

#[test]
fn the_floor_reports_its_ceiling_and_the_engines_do_not() {
    let floor = stdout(&eventcost(&[
        "--engine", "floor", "--keys", "300", "--events", "2000", "--cores", "3",
    ]));
    assert!(floor.contains("ceiling on 3 cores: churn "), "{floor}");
    assert!(floor.contains("events/s, whole run "), "{floor}");
    let reference = stdout(&eventcost(&[
        "--engine",
        "reference",
        "--keys",
        "300",
        "--events",
        "2000",
    ]));
    assert!(!reference.contains("ceiling"), "{reference}");
}

#[test]
fn a_workload_without_queue_work_is_refused_by_name() {
    let out = eventcost(&["--engine", "floor", "--workload", "w4"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use w1, w2 or w3"), "{err}");
}
