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
            // A step of 1 pops each op before the next; 7 queues a relist behind churn that is
            // still queued; 5000 queues whole rounds of W3 before a drain.
            for step in ["1", "7", "5000"] {
                let mut args = vec![
                    "--engine",
                    engine,
                    "--workload",
                    workload,
                    "--keys",
                    "400",
                    "--events",
                    "3000",
                    "--step",
                    step,
                    "--pop-batch",
                    "8",
                ];
                // W3 takes no warmup (a cut by op count would split one of its rounds).
                if workload != "w3" {
                    args.extend(["--warmup", "300"]);
                }
                let out = eventcost(&args);
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
    // The shape scripts/ceiling reads: "... whole run N ns/event; ceiling on C cores: churn R
    // events/s, whole run R events/s".
    let (_, tail) = floor
        .trim_end()
        .split_once(", whole run ")
        .expect("a whole-run figure");
    let (ns, ceiling) = tail
        .split_once(" ns/event; ceiling on 3 cores: churn ")
        .expect("the ceiling after the whole-run time");
    assert!(ns.parse::<f64>().is_ok(), "{floor}");
    let (churn, whole) = ceiling
        .split_once(" events/s, whole run ")
        .expect("both ceilings");
    let whole = whole
        .strip_suffix(" events/s")
        .expect("events/s at the end");
    assert!(
        churn.parse::<f64>().is_ok() && whole.parse::<f64>().is_ok(),
        "{floor}"
    );
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

#[test]
fn w3_refuses_a_warmup_and_no_ceiling_is_for_zero_cores() {
    let out = eventcost(&["--engine", "floor", "--workload", "w3", "--warmup", "5"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("w3 takes no --warmup"), "{err}");
    let out = eventcost(&["--engine", "floor", "--cores", "0"]);
    assert!(!out.status.success());
}
