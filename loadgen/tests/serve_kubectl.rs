//! kubectl against `loadgen serve` (the binary, as a child process): `get pods -A -o json` is
//! the server's state, and a recorded `get --watch --output-watch-events -o json` stream
//! replays through `loadgen replay` with verdict ok.
//!
//! kubectl must be on PATH: without it these tests fail and say what to install
//! (`apt-get install kubernetes-client`, which `.ci/run` does before the tests).
#![cfg(feature = "wire")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Fails the test, saying what to install, unless kubectl runs: a test that cannot run must
/// not pass as if it had.
fn require_kubectl() {
    let version = Command::new("kubectl")
        .args(["version", "--client"])
        .output();
    match version {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!(
            "`kubectl version --client` failed ({}): {}; these tests need a working kubectl \
             (apt-get install kubernetes-client)",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(e) => panic!(
            "kubectl is not on PATH ({e}): these tests run kubectl against `loadgen serve`; \
             install it with `apt-get install kubernetes-client`"
        ),
    }
}

/// A scratch directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loadgen-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `loadgen serve` as a child, on a free port, writing its kubeconfig to `kubeconfig`.
struct ServeChild {
    child: Child,
    /// Its stderr, shown if the test fails.
    log: PathBuf,
}

impl ServeChild {
    fn start(args: &[&str], kubeconfig: &Path) -> Self {
        let _ = std::fs::remove_file(kubeconfig);
        let log = kubeconfig.with_extension("log");
        let child = Command::new(env!("CARGO_BIN_EXE_loadgen"))
            .arg("serve")
            .args(["--addr", "127.0.0.1:0", "--kubeconfig"])
            .arg(kubeconfig)
            .args(args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("loadgen serve starts");
        let server = Self { child, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !kubeconfig.exists() {
            assert!(Instant::now() < deadline, "no kubeconfig after 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Ctrl-C (SIGINT), and the server must stop cleanly.
    fn interrupt(mut self) {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        assert!(log.contains("listening on"), "{log}");
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-INT", &pid]).status().unwrap();
        assert!(sent.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "loadgen serve exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "loadgen serve ignored Ctrl-C");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        // Only if a test failed before `interrupt`: never leave the server running.
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("loadgen serve said:\n{log}");
        }
    }
}

fn kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl runs");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `namespace/name` → resourceVersion of a list's items.
fn items(list: &Value) -> BTreeMap<String, String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|p| {
            let m = &p["metadata"];
            (
                format!(
                    "{}/{}",
                    m["namespace"].as_str().unwrap(),
                    m["name"].as_str().unwrap()
                ),
                m["resourceVersion"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The server's state, read in one request without paging.
fn server_state(kubeconfig: &Path) -> BTreeMap<String, String> {
    let raw = kubectl(kubeconfig, &["get", "--raw", "/api/v1/pods"]);
    items(&serde_json::from_slice(&raw.stdout).unwrap())
}

/// Waits until the server's resource version stops at `final_rv`.
fn wait_for_version(kubeconfig: &Path, final_rv: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let raw = kubectl(kubeconfig, &["get", "--raw", "/api/v1/pods?limit=1"]);
        let list: Value = serde_json::from_slice(&raw.stdout).unwrap();
        let rv: u64 = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        if rv == final_rv {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the churn did not finish: at {rv}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kubectl_get_pods_is_the_servers_state() {
    require_kubectl();
    let dir = scratch("kubectl-get");
    let kubeconfig = dir.join("kubeconfig");
    // 1,200 pods: kubectl's default chunk size (500) makes it page.
    let server = ServeChild::start(
        &[
            "--workload",
            "w2",
            "--keys",
            "1200",
            "--events",
            "1000",
            "--rate",
            "5000",
        ],
        &kubeconfig,
    );
    // W2 only updates, so the last version is K + E.
    wait_for_version(&kubeconfig, 2_200);
    let got = kubectl(&kubeconfig, &["get", "pods", "-A", "-o", "json"]);
    let list: Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(items(&list).len(), 1_200);
    assert_eq!(items(&list), server_state(&kubeconfig));
    assert_eq!(list["items"][0]["kind"], "Pod");

    // One namespace, one pod, and kubectl's table (which asks for a Table and accepts a list).
    let ns = kubectl(&kubeconfig, &["get", "pods", "-n", "ns-5", "-o", "json"]);
    let ns: Value = serde_json::from_slice(&ns.stdout).unwrap();
    assert_eq!(items(&ns).len(), 2, "pod-5 and pod-1005");
    let pod = kubectl(
        &kubeconfig,
        &["get", "pod", "pod-5", "-n", "ns-5", "-o", "json"],
    );
    let pod: Value = serde_json::from_slice(&pod.stdout).unwrap();
    assert_eq!(pod["spec"]["nodeName"], "node-5");
    let table = kubectl(&kubeconfig, &["get", "pods", "-n", "ns-5"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("pod-1005"));
    server.interrupt();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_recorded_kubectl_watch_replays_with_verdict_ok() {
    require_kubectl();
    let dir = scratch("kubectl-watch");
    let kubeconfig = dir.join("kubeconfig");
    let trace = dir.join("watch.json");
    // Churn for ~3 s while kubectl watches.
    let server = ServeChild::start(
        &[
            "--workload",
            "w1",
            "--keys",
            "400",
            "--events",
            "1500",
            "--rate",
            "500",
        ],
        &kubeconfig,
    );
    let mut watch = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args([
            "get",
            "pods",
            "-A",
            "--watch",
            "--output-watch-events",
            "-o",
            "json",
        ])
        .stdout(std::fs::File::create(&trace).unwrap())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("kubectl starts");
    wait_for_version(&kubeconfig, 1_900);
    let expected = server_state(&kubeconfig);
    // Wait until kubectl has written the last event, then stop it (our own child, by its
    // handle).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let bytes = std::fs::read(&trace).unwrap();
        let parsed = loadgen::watch_trace::parse_trace(&bytes);
        if parsed.events.iter().any(|e| e.resource_version == 1_900) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "kubectl's watch did not record the last event (resourceVersion 1900) in 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = watch.kill();
    let _ = watch.wait();

    let bytes = std::fs::read(&trace).unwrap();
    let parsed = loadgen::watch_trace::parse_trace(&bytes);
    assert!(parsed.bad.is_empty(), "{:?}", parsed.bad.first());
    assert!(parsed.errors.is_empty());
    // The trace's final state is the server's.
    let mut state = BTreeMap::new();
    for e in &parsed.events {
        match e.kind {
            loadgen::watch_trace::WatchType::Deleted => {
                state.remove(&e.key());
            }
            _ => {
                state.insert(e.key(), e.resource_version.to_string());
            }
        }
    }
    assert_eq!(state, expected, "the watch saw every change");

    let replay = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["replay", "--in-process", "--trace"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        replay.status.success(),
        "replay: {}\n{}",
        String::from_utf8_lossy(&replay.stdout),
        String::from_utf8_lossy(&replay.stderr)
    );
    server.interrupt();
    let _ = std::fs::remove_dir_all(dir);
}

/// kubectl without the success check, for the commands that must fail.
fn kubectl_output(kubeconfig: &Path, args: &[&str]) -> Output {
    Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A pod manifest named `name` running `image`, labelled `tier`.
fn manifest(dir: &Path, name: &str, image: &str, tier: &str) -> PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  \
             labels:\n    tier: {tier}\nspec:\n  containers:\n  - name: app\n    image: {image}\n"
        ),
    )
    .unwrap();
    path
}

/// `kubectl create`, `apply` (create, then change) and `delete` against `serve --writes` say
/// what they say against a real API server, and the server's pods follow.
#[test]
fn kubectl_create_apply_and_delete_write_pods() {
    require_kubectl();
    let dir = scratch("kubectl-writes");
    let kubeconfig = dir.join("kubeconfig");
    let server = ServeChild::start(
        &["--rate", "1", "--keys", "3", "--events", "0", "--writes"],
        &kubeconfig,
    );
    let get = |name: &str, path: &str| {
        stdout(&kubectl(
            &kubeconfig,
            &[
                "get",
                "pod",
                name,
                "-n",
                "default",
                "-o",
                &format!("jsonpath={path}"),
            ],
        ))
    };

    let created = manifest(&dir, "created", "nginx:1", "web");
    let file = created.to_str().unwrap();
    let out = kubectl(&kubeconfig, &["create", "-f", file]);
    assert_eq!(stdout(&out), "pod/created created");
    assert_eq!(get("created", "{.spec.containers[0].image}"), "nginx:1");
    let again = kubectl_output(&kubeconfig, &["create", "-f", file]);
    assert!(!again.status.success(), "a second create must fail");
    let error = String::from_utf8_lossy(&again.stderr);
    assert!(
        error.contains("AlreadyExists") && error.contains("pods \"created\" already exists"),
        "{error}"
    );

    let applied = manifest(&dir, "applied", "nginx:1", "web");
    let file = applied.to_str().unwrap();
    assert_eq!(
        stdout(&kubectl(&kubeconfig, &["apply", "-f", file])),
        "pod/applied created"
    );
    let first_version = get("applied", "{.metadata.resourceVersion}");
    manifest(&dir, "applied", "nginx:2", "api");
    assert_eq!(
        stdout(&kubectl(&kubeconfig, &["apply", "-f", file])),
        "pod/applied configured"
    );
    assert_eq!(
        get(
            "applied",
            "{.spec.containers[0].image} {.metadata.labels.tier}"
        ),
        "nginx:2 api"
    );
    assert_ne!(get("applied", "{.metadata.resourceVersion}"), first_version);
    assert_eq!(
        stdout(&kubectl(&kubeconfig, &["apply", "-f", file])),
        "pod/applied unchanged"
    );

    // The other writes kubectl makes: a merge patch, a JSON patch, a replace, a server dry run.
    let pod = ["-n", "default"];
    let label = kubectl(
        &kubeconfig,
        &[&["label", "pod", "applied", "team=a"][..], &pod].concat(),
    );
    assert_eq!(stdout(&label), "pod/applied labeled");
    let json_patch = [
        &["patch", "pod", "applied", "--type", "json", "-p"][..],
        &[r#"[{"op":"replace","path":"/spec/containers/0/image","value":"nginx:3"}]"#],
        &pod,
    ]
    .concat();
    assert_eq!(
        stdout(&kubectl(&kubeconfig, &json_patch)),
        "pod/applied patched"
    );
    assert_eq!(
        get(
            "applied",
            "{.spec.containers[0].image} {.metadata.labels.team}"
        ),
        "nginx:3 a"
    );
    manifest(&dir, "applied", "nginx:4", "db");
    assert_eq!(
        stdout(&kubectl(&kubeconfig, &["replace", "-f", file])),
        "pod/applied replaced"
    );
    assert_eq!(get("applied", "{.spec.containers[0].image}"), "nginx:4");
    let dry = manifest(&dir, "dry", "nginx:1", "web");
    let dry_run = kubectl(
        &kubeconfig,
        &["create", "--dry-run=server", "-f", dry.to_str().unwrap()],
    );
    assert_eq!(stdout(&dry_run), "pod/dry created (server dry run)");
    assert!(
        !kubectl_output(&kubeconfig, &[&["get", "pod", "dry"][..], &pod].concat())
            .status
            .success()
    );

    for name in ["created", "applied"] {
        let out = kubectl(&kubeconfig, &["delete", "pod", name, "-n", "default"]);
        assert_eq!(stdout(&out), format!("pod \"{name}\" deleted"));
    }
    let gone = kubectl_output(&kubeconfig, &["get", "pod", "created", "-n", "default"]);
    assert!(!gone.status.success());
    assert!(
        String::from_utf8_lossy(&gone.stderr).contains("NotFound"),
        "{}",
        String::from_utf8_lossy(&gone.stderr)
    );
    assert_eq!(
        server_state(&kubeconfig).len(),
        3,
        "only the churn's pods are left"
    );
    server.interrupt();
}

/// Without `--writes`, kubectl's writes are refused with the API server's 405.
#[test]
fn kubectl_create_against_a_read_only_serve_is_refused() {
    require_kubectl();
    let dir = scratch("kubectl-read-only");
    let kubeconfig = dir.join("kubeconfig");
    let server = ServeChild::start(
        &["--rate", "1", "--keys", "3", "--events", "0"],
        &kubeconfig,
    );
    let file = manifest(&dir, "refused", "nginx:1", "web");
    let out = kubectl_output(&kubeconfig, &["create", "-f", file.to_str().unwrap()]);
    assert!(!out.status.success());
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(error.contains("MethodNotAllowed"), "{error}");
    server.interrupt();
}
