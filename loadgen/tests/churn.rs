//! `loadgen churn` (the binary, as a child process) against `serve --writes` on loopback,
//! addressed only through a kubeconfig file the test writes: it leaves the server in the
//! workload model's final state, records every write, never touches a pod it did not create,
//! refuses a namespace it would share unless told, and `--cleanup` removes exactly its own.
#![cfg(feature = "wire")]

mod writes_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use loadgen::commands::churn::RUN_LABEL;
use loadgen::serve::objects::VERSION_LABEL;
use loadgen::serve::Server;
use serde_json::Value;
use workloads::{generate, Workload, WorkloadSpec};
use writes_common::{foreign, loadgen_with, start_writable as start, stderr};

const NAMESPACE: &str = "churn";

/// `loadgen churn --kubeconfig FILE --namespace churn ARGS`.
async fn churn(kubeconfig: &Path, args: &[&str]) -> Output {
    let with_namespace = [&["--namespace", NAMESPACE][..], args].concat();
    loadgen_with("churn", kubeconfig, &with_namespace).await
}

/// The churn namespace's pods through kube-rs.
fn api(server: &Server) -> Api<Pod> {
    writes_common::api(server, NAMESPACE)
}

/// The churn namespace's pods: name → (labels, resource version).
async fn pods(server: &Server) -> BTreeMap<String, (BTreeMap<String, String>, String)> {
    writes_common::pods(server, NAMESPACE).await
}

/// The workload's final state, `prefix` + `pod-{id}` → version, from its own model.
fn model(workload: Workload, keys: usize, events: usize, seed: u64) -> BTreeMap<String, u64> {
    generate(
        &WorkloadSpec::new(workload)
            .keys(keys)
            .events(events)
            .seed(seed),
    )
    .model
    .alive
    .iter()
    .flatten()
    .map(|p| (format!("lg-pod-{}", p.id), p.version))
    .collect()
}

/// (a) `churn` leaves serve in the state the workload's model ends in: the same names, each at
/// the model's version, every pod the run's; and the record's last resource version of each
/// pod is the one serve holds. One write in flight, and several (each key's still in order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_leaves_the_models_final_state() {
    for (workload, seed, concurrency) in [
        (Workload::W1, 7, 1),
        (Workload::W3, 11, 1),
        (Workload::W1, 5, 8),
        (Workload::W3, 3, 8),
    ] {
        let (server, kubeconfig) = start(&format!("model-{workload}")).await;
        let record = kubeconfig.with_file_name("record.jsonl");
        let (keys, events) = (40, 300);
        let output = churn(
            &kubeconfig,
            &[
                "--workload",
                workload.name(),
                "--keys",
                &keys.to_string(),
                "--events",
                &events.to_string(),
                "--seed",
                &seed.to_string(),
                "--rate",
                "20000",
                "--run",
                "model",
                "--record",
                record.to_str().unwrap(),
                "--concurrency",
                &concurrency.to_string(),
            ],
        )
        .await;
        assert!(output.status.success(), "{workload}: {}", stderr(&output));
        let expected = model(workload, keys, events, seed);
        let held = pods(&server).await;
        let versions: BTreeMap<String, u64> = held
            .iter()
            .map(|(name, (labels, _))| (name.clone(), labels[VERSION_LABEL].parse().unwrap()))
            .collect();
        assert_eq!(
            versions, expected,
            "{workload}: serve's pods against the model"
        );
        assert!(held
            .values()
            .all(|(labels, _)| labels[RUN_LABEL] == "model"));

        // The record: one line per write of the plan; by pod, its writes in order (times and
        // resource versions not going back); each pod's last write gave the resource version
        // serve holds.
        let text = std::fs::read_to_string(&record).unwrap();
        let mut lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert!(
            lines.len() >= keys + events / 2,
            "{workload}: {} writes",
            lines.len()
        );
        lines.sort_by_key(|l| l["write"].as_u64().unwrap());
        let mut last_rv = BTreeMap::new();
        let mut previous: BTreeMap<String, (u64, u64)> = BTreeMap::new();
        for (n, line) in lines.iter().enumerate() {
            assert_eq!(line["write"], n as u64, "{workload}: every write once");
            let at = line["returned_unix_ns"].as_u64().unwrap();
            let key = line["name"].as_str().unwrap().to_string();
            // A delete answered with the pod has a version too; one answered with a Status not.
            if let Some(rv) = line["resource_version"].as_str() {
                let rv: u64 = rv.parse().unwrap();
                if let Some(&(at_before, rv_before)) = previous.get(&key) {
                    assert!(
                        at >= at_before && rv > rv_before,
                        "{workload}: {key} in order"
                    );
                }
                previous.insert(key, (at, rv));
            }
            let name = line["name"].as_str().unwrap().to_string();
            match line["op"].as_str().unwrap() {
                "delete" => {
                    last_rv.remove(&name);
                }
                "create" | "update" => {
                    last_rv.insert(name, line["resource_version"].as_str().unwrap().to_string());
                }
                other => panic!("op {other}"),
            }
        }
        let held_rv: BTreeMap<String, String> =
            held.into_iter().map(|(n, (_, rv))| (n, rv)).collect();
        assert_eq!(
            last_rv, held_rv,
            "{workload}: the record's resource versions"
        );
        server.stop().await.unwrap();
    }
}

/// (b) Foreign pods: without `--allow-foreign` the churn refuses, with a clear message and a
/// non-zero exit, and writes nothing; with it, and through `--cleanup`, the foreign pods keep
/// their resource versions (even one named like the churn's pods but without its label), and
/// `--cleanup` leaves exactly them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_never_touches_pods_it_did_not_create() {
    let (server, kubeconfig) = start("foreign").await;
    let api = api(&server);
    for name in ["web-1", "web-2", "lg-other"] {
        api.create(&PostParams::default(), &foreign(name))
            .await
            .unwrap();
    }
    let before = pods(&server).await;
    let rv_before = server.store().resource_version();
    let args = [
        "--keys", "30", "--events", "200", "--rate", "20000", "--run", "mine",
    ];

    let refused = churn(&kubeconfig, &args).await;
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
    let message = stderr(&refused);
    assert!(
        message.contains("3 pods loadgen did not create") && message.contains("--allow-foreign"),
        "{message}"
    );
    assert_eq!(pods(&server).await, before, "a refused run writes nothing");
    assert_eq!(server.store().resource_version(), rv_before);

    let ran = churn(&kubeconfig, &[&args[..], &["--allow-foreign"]].concat()).await;
    assert!(ran.status.success(), "{}", stderr(&ran));
    let after = pods(&server).await;
    for (name, state) in &before {
        assert_eq!(after.get(name), Some(state), "{name} is untouched");
    }
    let mine = after.len() - before.len();
    assert_eq!(
        mine,
        model(Workload::W1, 30, 200, workloads::DEFAULT_SEED).len()
    );

    // Another run with the same prefix would create the same names: refused, naming the run.
    let again = churn(
        &kubeconfig,
        &[&args[..6], &["--allow-foreign", "--run", "second"]].concat(),
    )
    .await;
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("--cleanup --run mine"),
        "{}",
        stderr(&again)
    );

    // Cleanup of another run's id deletes nothing; of this run's, exactly its pods.
    let none = churn(&kubeconfig, &["--cleanup", "--run", "second"]).await;
    assert!(none.status.success(), "{}", stderr(&none));
    assert_eq!(pods(&server).await, after);
    let cleaned = churn(&kubeconfig, &["--cleanup", "--run", "mine"]).await;
    assert!(cleaned.status.success(), "{}", stderr(&cleaned));
    assert!(
        stderr(&cleaned).contains(&format!("deleted {mine} pods of run mine")),
        "{}",
        stderr(&cleaned)
    );
    assert_eq!(
        pods(&server).await,
        before,
        "only the foreign pods are left, untouched"
    );
    server.stop().await.unwrap();
}

/// Bad arguments get a clear error and exit 2, before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_are_refused_clearly() {
    let (server, kubeconfig) = start("args").await;
    for (args, says) in [
        (&["--cleanup"][..], "--run"),
        (&["--run", "bad/run"][..], "not a run id"),
        (&["--prefix", "LG_"][..], "not a name prefix"),
        (&["--rate", "0"][..], "rate"),
        (&["--keys", "0"][..], "--keys 0"),
        (&["--concurrency", "0"][..], "not a concurrency"),
    ] {
        let output = churn(&kubeconfig, args).await;
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(says),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    let missing = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["churn", "--kubeconfig", "/nonexistent/kubeconfig"])
        .output()
        .unwrap();
    assert!(!missing.status.success());
    assert!(
        stderr(&missing).contains("/nonexistent/kubeconfig"),
        "{}",
        stderr(&missing)
    );
    assert!(pods(&server).await.is_empty());
    server.stop().await.unwrap();
}

/// (c) A stale replace against serve: the churn's retry meets serve's real `409 Conflict`
/// (someone wrote the pod since the copy it holds), reads the pod again, applies its change
/// to it and keeps the other writer's change too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_replace_is_retried_on_the_pod_read_again() {
    use loadgen::commands::churn::replace_retrying;

    let (server, _kubeconfig) = start("conflict").await;
    let api = api(&server);
    let mut pod = foreign("lg-pod-0");
    pod.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(RUN_LABEL.into(), "race".into());
    let stale = api.create(&PostParams::default(), &pod).await.unwrap();
    // Another writer (on a cluster, the kubelet) changes the pod first.
    let mut other = stale.clone();
    other
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert("other".into(), "1".into());
    let other = api
        .replace("lg-pod-0", &PostParams::default(), &other)
        .await
        .unwrap();

    let set_version = |p: &mut Pod| {
        p.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(VERSION_LABEL.into(), "2".into());
    };
    let (stored, conflicts) = replace_retrying(&api, "lg-pod-0", "race", &stale, set_version)
        .await
        .unwrap();
    assert_eq!(conflicts, 1);
    let rv = |p: &Pod| {
        p.metadata
            .resource_version
            .clone()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(rv(&stored) > rv(&other));
    assert_eq!(stored.metadata.labels.as_ref().unwrap()[VERSION_LABEL], "2");
    assert_eq!(stored.metadata.annotations.as_ref().unwrap()["other"], "1");
    server.stop().await.unwrap();
}

/// `loadgen e2e --kubeconfig`: the client rows against a `serve --writes` the test started,
/// named only by a kubeconfig file, with `loadgen churn` writing: every row's verdict is ok
/// (its cache equals a fresh list), it heard every write of the churn with a lag measured,
/// and the churn's pods are gone afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_against_a_kubeconfig_runs_the_rows_with_churn_writing() {
    let (server, kubeconfig) = start("e2e").await;
    let json = kubeconfig.with_file_name("e2e.json");
    let mut command = Command::new(env!("CARGO_BIN_EXE_loadgen"));
    command
        .args(["e2e", "--kubeconfig"])
        .arg(&kubeconfig)
        .args([
            "--client",
            "kcache,kube-rs",
            "--keys",
            "30",
            "--events",
            "200",
        ])
        .args(["--rate", "2000", "--write-concurrency", "4"])
        .args(["--settle-seconds", "20", "--json"])
        .arg(&json);
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let figures: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = figures["clients"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert_eq!(row["ok"], true, "{row}");
        // 200 churn events after the population, each one write the client hears.
        assert_eq!(row["received"], 200, "{row}");
        // Lags measured (an event can reach the handler before its write's answer reaches
        // the churn: such a lag counts as 0, so the median may be 0; the largest is not).
        assert!(row["lag_us"][2].as_u64().unwrap() > 0, "{row}");
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("against http://"), "{stdout}");
    let left = api(&server);
    let left: Api<Pod> = Api::namespaced(left.into_client(), "loadgen-e2e");
    assert!(left
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());

    let refused = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "e2e",
            "--rate",
            "100",
            "--client",
            "serve-alone",
            "--kubeconfig",
        ])
        .arg(&kubeconfig)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("client rows only"),
        "{}",
        stderr(&refused)
    );
    server.stop().await.unwrap();
}

/// Ctrl-C stops a churn between two writes: exit 130, the record holds every write made, and
/// the pods it made stay until `--cleanup`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_stops_between_writes_and_says_how_to_clean_up() {
    let (server, kubeconfig) = start("interrupt").await;
    let record = kubeconfig.with_file_name("record.jsonl");
    let mut child = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .arg("churn")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--namespace", NAMESPACE, "--keys", "50", "--events", "1000"])
        .args(["--rate", "20", "--run", "stopped", "--record"])
        .arg(&record)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait (polling, bounded) until some writes were made and recorded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while pods(&server).await.len() < 5 {
        assert!(std::time::Instant::now() < deadline, "no writes after 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let sent = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let output = tokio::task::spawn_blocking(move || {
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        (status, err)
    })
    .await
    .unwrap();
    assert_eq!(output.0.code(), Some(130), "{}", output.1);
    assert!(output.1.contains("--cleanup --run ID"), "{}", output.1);
    let written = std::fs::read_to_string(&record).unwrap().lines().count();
    let held = pods(&server).await.len();
    assert!(written < 1050, "stopped early: {written} writes");
    assert_eq!(held, written, "only creates so far, each recorded");
    server.stop().await.unwrap();
}
