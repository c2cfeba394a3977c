//! `loadgen soak --kubeconfig` (the binary, as a child process) against `serve --writes` on
//! loopback, addressed only through a kubeconfig file the test writes: a short soak passes its
//! checkpoints and verdict with lag measured from the churn's record, leaves the namespace
//! without the churn's pods and the foreign pods as they were; and fault flags are refused.
#![cfg(feature = "wire")]

mod writes_common;

use std::path::Path;
use std::process::Output;

use kube::api::PostParams;
use loadgen::commands::churn::RUN_LABEL;
use writes_common::{api, foreign, loadgen_with, pods, start_writable as start, stderr};

const NAMESPACE: &str = "soak";

/// `loadgen soak --kubeconfig FILE ARGS`.
async fn soak(kubeconfig: &Path, args: &[&str]) -> Output {
    loadgen_with("soak", kubeconfig, args).await
}

/// The value of `figure`'s row in soak.md.
fn row<'a>(md: &'a str, figure: &str) -> &'a str {
    let prefix = format!("| {figure} | ");
    md.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no `{figure}` row in:\n{md}"))
        .trim_end_matches(" |")
}

/// A short soak against `serve --writes`: exit 0, the verdict ok, lag matched from the churn's
/// record, every checkpoint passed, the server noted; afterwards the namespace holds no pod of
/// the churn's and the foreign pods (one in the churn's namespace, shared with
/// `--allow-foreign`, one in another) at the versions they had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_soak_against_a_kubeconfig_passes_and_cleans_up() {
    let (server, kubeconfig) = start("ok").await;
    api(&server, NAMESPACE)
        .create(&PostParams::default(), &foreign("web-1"))
        .await
        .unwrap();
    api(&server, "other")
        .create(&PostParams::default(), &foreign("web-2"))
        .await
        .unwrap();
    let before = (pods(&server, NAMESPACE).await, pods(&server, "other").await);
    let out = kubeconfig.with_file_name("out");
    let output = soak(
        &kubeconfig,
        &[
            "--namespace",
            NAMESPACE,
            "--allow-foreign",
            "--duration",
            "8s",
            "--rate",
            "200",
            "--keys",
            "50",
            "--segment-events",
            "600",
            "--sample-every",
            "500ms",
            "--warmup",
            "1s",
            // A debug build's RSS moves more over seconds than over an hour's release run.
            "--max-rss-growth",
            "1.0",
            "--settle",
            "60s",
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .await;
    let log = stderr(&output);
    assert!(output.status.success(), "{log}");

    let md = std::fs::read_to_string(out.join("soak.md")).expect("soak.md written");
    assert!(out.join("soak.svg").exists(), "soak.svg written");
    assert_eq!(row(&md, "verdict"), "ok", "{md}");
    assert!(
        md.contains(&format!(
            "Server: kubeconfig: {}",
            server.url().trim_end_matches('/')
        )),
        "{md}"
    );
    let lag = row(&md, "lag, write return → handler");
    let matched: u64 = lag
        .split_once(" writes matched")
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("lag row {lag:?}"));
    assert!(matched > 0, "no lag samples: {md}");
    let checkpoints = row(&md, "checkpoints (s, ok)");
    // 8 s at 200/s in segments of at most 600 events (3 s) and the 50 creates: several.
    assert!(
        checkpoints.matches("true").count() >= 2 && !checkpoints.contains("false"),
        "{md}"
    );
    assert!(row(&md, "faults injected").starts_with("none"), "{md}");

    let after = (pods(&server, NAMESPACE).await, pods(&server, "other").await);
    assert!(
        after
            .0
            .values()
            .all(|(labels, _)| !labels.contains_key(RUN_LABEL)),
        "the churn's pods are gone: {:?}",
        after.0.keys().collect::<Vec<_>>()
    );
    assert_eq!(after, before, "the foreign pods are untouched");
    server.stop().await.unwrap();
}

/// Faults cannot be injected into a server loadgen does not run: an explicit fault flag with
/// `--kubeconfig` is refused, exit 2, saying why, before anything is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_flags_with_a_kubeconfig_are_refused() {
    let (server, kubeconfig) = start("faults").await;
    let rv = server.store().resource_version();
    for flags in [
        &["--fault-every", "10s"][..],
        &["--fault-for", "1s"],
        &["--fault-every", "10s", "--fault-for", "1s"],
    ] {
        let args = [&["--duration", "5s", "--rate", "10"][..], flags].concat();
        let output = soak(&kubeconfig, &args).await;
        let message = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{flags:?}: {message}");
        assert!(
            message.contains(flags[0])
                && message.contains("cannot be used with --kubeconfig")
                && message.contains("faults cannot be injected"),
            "{message}"
        );
    }
    assert_eq!(server.store().resource_version(), rv, "nothing was written");
    server.stop().await.unwrap();
}
