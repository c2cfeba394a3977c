//! Helpers shared by the tests that write into `serve --writes` through a kubeconfig
//! (loadgen/tests/churn.rs, soak_kubeconfig.rs): the server and its kubeconfig file, the
//! `loadgen` binary run against it, and what a namespace holds.

#![allow(dead_code)] // each test file uses a different subset

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use loadgen::serve::{ServeConfig, Server};
use workloads::{Workload, WorkloadSpec};

/// `serve --writes` with one pod of its own (in `ns-0`) and no churn of its own, and a
/// kubeconfig file naming it, in a fresh directory of the test's own (`name` tells them apart).
pub async fn start_writable(name: &str) -> (Server, PathBuf) {
    let mut config = ServeConfig::new(WorkloadSpec::new(Workload::W1).keys(1).events(0), 1000.0);
    config.writes = true;
    let server = Server::start(config).await.expect("the server starts");
    let dir = std::env::temp_dir().join(format!("loadgen-writes-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    (server, kubeconfig)
}

/// `loadgen COMMAND --kubeconfig FILE ARGS`, waited for off the runtime.
pub async fn loadgen_with(command: &str, kubeconfig: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loadgen"));
    child
        .arg(command)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args);
    tokio::task::spawn_blocking(move || child.output().expect("loadgen runs"))
        .await
        .unwrap()
}

/// The pods of `namespace` on `server`, through kube-rs.
pub fn api(server: &Server, namespace: &str) -> Api<Pod> {
    let config = kube::Config::new(server.url().parse().unwrap());
    Api::namespaced(kube::Client::try_from(config).unwrap(), namespace)
}

/// A namespace's pods: name → (labels, resource version).
pub async fn pods(
    server: &Server,
    namespace: &str,
) -> BTreeMap<String, (BTreeMap<String, String>, String)> {
    api(server, namespace)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.unwrap(),
                (
                    p.metadata.labels.unwrap_or_default(),
                    p.metadata.resource_version.unwrap(),
                ),
            )
        })
        .collect()
}

/// A process's stderr, as text.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A pod that is not the churn's: no run label, another `app`.
pub fn foreign(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": "not-loadgen" } },
        "spec": { "containers": [{ "name": "c", "image": "nginx:1" }] },
    }))
    .unwrap()
}
