//! `loadgen serve` under bad input and bad clients: every row of docs/wire.md's table of
//! malformed requests gets its status and a `Status` body; random paths, query strings,
//! methods and bodies never get a 5xx or a panic; oversized heads get 431/414; idle, slow-loris
//! and non-reading clients are closed, and 10,000 idle connections cost little memory.
#![cfg(feature = "wire")]

mod serve_common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::service::TowerToHyperService;
use loadgen::serve::encode::PodFields;
use loadgen::serve::faults::{FaultPlan, Faults};
use loadgen::serve::objects::EventType;
use loadgen::serve::routes::{self, App};
use loadgen::serve::store::{Change, Store};
use loadgen::serve::{ServeConfig, Server};
use proptest::prelude::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use workloads::{Workload, WorkloadSpec};

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    serve_common::connect(addr).await
}

async fn send(
    sender: &mut SendRequest<Full<Bytes>>,
    method: &str,
    path: &str,
    body: &'static [u8],
) -> (u16, Value) {
    sender.ready().await.expect("the connection is usable");
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "loadgen")
        .body(Full::new(Bytes::from_static(body)))
        .unwrap();
    let response = sender.send_request(request).await.expect("an answer");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!(
            "{method} {path}: not JSON ({e}): {}",
            String::from_utf8_lossy(&body)
        )
    });
    (status, json)
}

/// docs/wire.md's table of malformed requests, row by row: method, path, HTTP status, reason.
const MALFORMED: &[(&str, &str, u16, &str)] = &[
    ("GET", "/api/v1/services", 404, "NotFound"),
    ("GET", "/apis/apps/v1/deployments", 404, "NotFound"),
    (
        "GET",
        "/api/v1/namespaces/ns-1/pods/pod-999999",
        404,
        "NotFound",
    ),
    (
        "POST",
        "/api/v1/namespaces/ns-1/pods",
        405,
        "MethodNotAllowed",
    ),
    (
        "PUT",
        "/api/v1/namespaces/ns-1/pods/pod-1",
        405,
        "MethodNotAllowed",
    ),
    (
        "PATCH",
        "/api/v1/namespaces/ns-1/pods/pod-1",
        405,
        "MethodNotAllowed",
    ),
    ("DELETE", "/api/v1/pods", 405, "MethodNotAllowed"),
    ("GET", "/api/v1/pods?limit=abc", 400, "BadRequest"),
    ("GET", "/api/v1/pods?limit=-3", 400, "BadRequest"),
    ("GET", "/api/v1/pods?resourceVersion=abc", 400, "BadRequest"),
    (
        "GET",
        "/api/v1/pods?watch=1&resourceVersion=abc",
        400,
        "BadRequest",
    ),
    (
        "GET",
        "/api/v1/pods?watch=1&timeoutSeconds=soon",
        400,
        "BadRequest",
    ),
    ("GET", "/api/v1/pods?watch=maybe", 400, "BadRequest"),
    (
        "GET",
        "/api/v1/pods?watch=1&allowWatchBookmarks=perhaps",
        400,
        "BadRequest",
    ),
    (
        "GET",
        "/api/v1/pods?limit=10&continue=garbage",
        400,
        "BadRequest",
    ),
    (
        "GET",
        "/api/v1/pods?labelSelector=app%3D%3D%3Dx",
        400,
        "BadRequest",
    ),
    (
        "GET",
        "/api/v1/pods?labelSelector=app%3Dweb",
        400,
        "BadRequest",
    ),
    (
        "GET",
        "/api/v1/pods?fieldSelector=spec.unknown%3Dx",
        400,
        "BadRequest",
    ),
    (
        "GET",
        "/api/v1/pods?resourceVersion=1&resourceVersionMatch=Sometimes",
        422,
        "Invalid",
    ),
    (
        "GET",
        "/api/v1/pods?resourceVersionMatch=NotOlderThan",
        422,
        "Invalid",
    ),
    ("GET", "/api/v1/pods?sendInitialEvents=true", 422, "Invalid"),
    (
        "GET",
        "/api/v1/pods?watch=1&sendInitialEvents=true",
        422,
        "Invalid",
    ),
    ("GET", "/api/v1/pods?limit=5&continue=1-5", 410, "Expired"),
    (
        "GET",
        "/api/v1/pods?resourceVersion=99999999",
        504,
        "Timeout",
    ),
    (
        "GET",
        "/api/v1/pods?watch=1&resourceVersion=99999999",
        504,
        "Timeout",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_request_in_the_table_gets_its_status() {
    let mut config = ServeConfig::new(WorkloadSpec::new(Workload::W1).keys(50).events(0), 1.0);
    // The API server waits ~3 s for a too-new version; the wait itself is tested below.
    config.too_large_wait = Duration::from_millis(100);
    let server = Server::start(config).await.expect("the server starts");
    let mut conn = connect(server.addr()).await;
    for &(method, path, code, reason) in MALFORMED {
        let (got, status) = send(&mut conn, method, path, b"{\"kind\":\"Pod\"}").await;
        assert_eq!(got, code, "{method} {path}: {status}");
        assert_eq!(status["kind"], "Status", "{path}");
        assert_eq!(status["status"], "Failure", "{path}");
        assert_eq!(
            (status["code"].as_u64(), status["reason"].as_str()),
            (Some(code.into()), Some(reason)),
            "{method} {path}"
        );
        if code == 504 {
            assert_eq!(
                status["details"]["causes"][0]["reason"], "ResourceVersionTooLarge",
                "{path}"
            );
        }
        // The connection answers the next request.
        let (ok, list) = send(&mut conn, "GET", "/api/v1/pods?limit=1", b"").await;
        assert_eq!(
            (ok, list["kind"].as_str()),
            (200, Some("PodList")),
            "after {path}"
        );
    }
    assert_eq!(
        server.faults().too_large_versions,
        2,
        "both 504s waited first"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_new_version_is_waited_for_and_served_once_the_server_reaches_it() {
    let mut config = ServeConfig::new(WorkloadSpec::new(Workload::W1).keys(50).events(400), 200.0);
    config.too_large_wait = Duration::from_secs(30);
    let server = Server::start(config).await.expect("the server starts");
    let ahead = server.store().resource_version() + 20;
    let mut conn = connect(server.addr()).await;
    let (code, list) = send(
        &mut conn,
        "GET",
        &format!("/api/v1/pods?resourceVersion={ahead}"),
        b"",
    )
    .await;
    assert_eq!(code, 200, "{list}");
    let served: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(served >= ahead, "served {served}, asked {ahead}");
    assert_eq!(server.faults().too_large_versions, 0);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_get_431_and_oversized_uris_414() {
    let server = serve_common::start(10, 0, 1.0, 100).await;
    let addr = server.addr();
    let mut big_header = b"GET /version HTTP/1.1\r\nHost: x\r\nX-Big: ".to_vec();
    big_header.extend(std::iter::repeat_n(b'a', 2 << 20));
    big_header.extend_from_slice(b"\r\n\r\n");
    assert_eq!(
        status_line(addr, big_header).await,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    let mut many_headers = b"GET /version HTTP/1.1\r\nHost: x\r\n".to_vec();
    for n in 0..150 {
        many_headers.extend_from_slice(format!("X-H{n}: v\r\n").as_bytes());
    }
    many_headers.extend_from_slice(b"\r\n");
    assert_eq!(
        status_line(addr, many_headers).await,
        "HTTP/1.1 431 Request Header Fields Too Large"
    );
    let mut long_uri = b"GET /api/v1/pods?x=".to_vec();
    long_uri.extend(std::iter::repeat_n(b'a', 70_000));
    long_uri.extend_from_slice(b" HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(
        status_line(addr, long_uri).await,
        "HTTP/1.1 414 URI Too Long"
    );
    // Still serving.
    let mut conn = connect(addr).await;
    assert_eq!(send(&mut conn, "GET", "/version", b"").await.0, 200);
    server.stop().await.unwrap();
}

/// The status line the server answers `request` with, written raw.
async fn status_line(addr: SocketAddr, request: Vec<u8>) -> String {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before the whole request is written.
    let _ = tcp.write_all(&request).await;
    let mut answer = Vec::new();
    let _ = tcp.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// An `App` over a small store, for driving the router without a socket, accepting writes when
/// `writes`.
fn app_with(writes: bool) -> App {
    let store = Arc::new(Store::new(Vec::new(), 0, 50));
    let changes = (1..=20u32)
        .map(|i| {
            let (namespace, name) = (format!("ns-{}", i % 3), format!("pod-{i}"));
            Change::new(
                EventType::Added,
                PodFields {
                    namespace: namespace.into(),
                    name: name.into(),
                    node: None,
                    id: i,
                    incarnation: 0,
                    version: 1,
                    resource_version: u64::from(i),
                    created: 0,
                    profile: workloads::PodProfile::Minimal,
                    revision: Default::default(),
                },
            )
        })
        .collect();
    store.publish(changes);
    App {
        store,
        addr: SocketAddr::from(([127, 0, 0, 1], 1)),
        bookmark_interval: Duration::from_secs(60),
        shutdown: tokio::sync::watch::channel(false).1,
        churn: tokio::sync::watch::channel(None).1,
        label: "proptest".into(),
        faults: Faults::new(FaultPlan::default()),
        too_large_wait: Duration::ZERO,
        writes,
    }
}

fn query_pair() -> impl Strategy<Value = (String, String)> {
    let key = prop_oneof![
        Just("limit".to_string()),
        Just("continue".to_string()),
        Just("resourceVersion".to_string()),
        Just("resourceVersionMatch".to_string()),
        Just("watch".to_string()),
        Just("allowWatchBookmarks".to_string()),
        Just("timeoutSeconds".to_string()),
        Just("sendInitialEvents".to_string()),
        Just("labelSelector".to_string()),
        Just("fieldSelector".to_string()),
        "\\PC{0,12}",
    ];
    let value = prop_oneof![
        Just("0".to_string()),
        Just("1".to_string()),
        Just("true".to_string()),
        Just("NotOlderThan".to_string()),
        Just("Exact".to_string()),
        Just("18446744073709551616".to_string()),
        "[0-9]{1,6}",
        "[0-9]{1,6}-[0-9]{1,6}",
        "\\PC{0,24}",
    ];
    (key, value)
}

fn path() -> impl Strategy<Value = String> {
    let segment = prop_oneof![
        Just("api".to_string()),
        Just("apis".to_string()),
        Just("v1".to_string()),
        Just("pods".to_string()),
        Just("namespaces".to_string()),
        Just("ns-1".to_string()),
        Just("pod-3".to_string()),
        Just("version".to_string()),
        Just("loadgen".to_string()),
        Just("status".to_string()),
        Just("".to_string()),
        "\\PC{0,10}",
    ];
    prop::collection::vec(segment, 0..7).prop_map(|segments| {
        let encoded: Vec<String> = segments
            .iter()
            .map(|s| form_urlencoded::byte_serialize(s.as_bytes()).collect())
            .collect();
        format!("/{}", encoded.join("/"))
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Whatever a client sends, the router answers it: never a 5xx (but the 504 that a
    /// too-new resource version earns), and every error is a `Status` with its code.
    #[test]
    fn random_requests_never_get_a_5xx_or_a_panic(
        method in prop_oneof![
            Just("GET"), Just("HEAD"), Just("POST"), Just("PUT"), Just("PATCH"),
            Just("DELETE"), Just("OPTIONS"), Just("BREW"),
        ],
        path in prop_oneof![
            path(),
            // The paths writes go to, often, so random writes reach the store.
            Just("/api/v1/namespaces/ns-1/pods".to_string()),
            Just("/api/v1/namespaces/ns-1/pods/pod-3".to_string()),
            Just("/api/v1/namespaces/ns-1/pods/new".to_string()),
        ],
        pairs in prop::collection::vec(query_pair(), 0..6),
        raw_tail in prop_oneof![Just(String::new()), "[%&=a-z0-9]{0,16}"],
        body in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..256),
            // Pods and patches that decode, some valid, so writes get past their first checks.
            (
                prop_oneof![Just(""), Just("pod-3"), Just("new"), Just("Bad_Name")],
                prop_oneof![Just(""), Just("ns-1"), Just("other")],
                prop_oneof![Just(0usize), Just(1), Just(2)],
                prop_oneof![Just("\"x\""), Just("null"), Just("3"), Just("{}")],
            )
                .prop_map(|(name, namespace, containers, extra)| {
                    let containers: Vec<String> = (0..containers)
                        .map(|i| format!(r#"{{"name":"c{i}","image":"i"}}"#))
                        .collect();
                    format!(
                        r#"{{"metadata":{{"name":"{name}","namespace":"{namespace}","uid":{extra},"resourceVersion":"3"}},"spec":{{"containers":[{}],"nodeName":{extra}}},"preconditions":{{"uid":{extra}}}}}"#,
                        containers.join(",")
                    )
                    .into_bytes()
                }),
        ],
        content_type in prop_oneof![
            Just("application/json"), Just("application/merge-patch+json"),
            Just("application/strategic-merge-patch+json"), Just("text/plain"),
        ],
        writes: bool,
    ) {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (k, v) in &pairs {
            query.append_pair(k, v);
        }
        let mut query = query.finish();
        query.push_str(&raw_tail);
        let uri = if query.is_empty() { path.clone() } else { format!("{path}?{query}") };
        let Ok(uri) = uri.parse::<hyper::Uri>() else {
            // hyper would have refused it with 400 before any route saw it.
            return Ok(());
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let (code, head) = runtime.block_on(async {
            let router = axum::Router::new().fallback(routes::handle).with_state(app_with(writes));
            let request = hyper::Request::builder()
                .method(method)
                .uri(uri.clone())
                .header("content-type", content_type)
                .body(Body::from(body.clone()))
                .unwrap();
            let response = hyper::service::Service::call(&TowerToHyperService::new(router), request)
                .await
                .expect("the router is infallible");
            let code = response.status().as_u16();
            // A watch's stream never ends by itself: only its first chunk is read.
            let head = match tokio::time::timeout(
                Duration::from_millis(200),
                response.into_body().collect(),
            )
            .await
            {
                Ok(body) => Some(body.unwrap().to_bytes()),
                Err(_) => None,
            };
            (code, head)
        });
        prop_assert!(code < 500 || code == 504, "{method} {uri}: {code}");
        // Every error is a Status; a success (200, or 201 for a create that went through)
        // is the object. A HEAD answer has no body, by HTTP's rules.
        if code >= 400 && method != "HEAD" {
            let body = head.expect("an error answer is complete");
            let status: Value = serde_json::from_slice(&body).map_err(|e| {
                TestCaseError::fail(format!("{method} {uri}: {code} without a Status ({e})"))
            })?;
            prop_assert_eq!(&status["kind"], "Status");
            prop_assert_eq!(status["code"].as_u64(), Some(u64::from(code)));
            if code == 504 {
                prop_assert_eq!(&status["details"]["causes"][0]["reason"], "ResourceVersionTooLarge");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_never_reads_is_closed() {
    let mut config = ServeConfig::new(
        WorkloadSpec::new(Workload::W1).keys(200).events(40_000),
        10_000.0,
    );
    config.hold_churn = true;
    config.limits.slow_watcher_events = 500;
    config.limits.slow_watcher_check = Duration::from_millis(50);
    let mut server = Server::start(config).await.expect("the server starts");
    let from = server.store().resource_version();
    // A small receive buffer, so the kernel's buffers fill after a few events.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut tcp = socket.connect(server.addr()).await.unwrap();
    tcp.write_all(
        format!("GET /api/v1/pods?watch=1&resourceVersion={from} HTTP/1.1\r\nHost: x\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    server.release_churn();
    // It reads nothing until the server has closed it...
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.faults().slow_watchers_closed == 0 {
        assert!(Instant::now() < deadline, "the watcher was never closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...then finds the end of the stream after what the kernel held.
    let mut sink = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), tcp.read_to_end(&mut sink)).await;
    assert!(
        matches!(read, Ok(Ok(_)) | Ok(Err(_))),
        "the connection was closed"
    );
    // Every other client is still served.
    let mut conn = connect(server.addr()).await;
    assert_eq!(
        send(&mut conn, "GET", "/api/v1/pods?limit=1", b"").await.0,
        200
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_connection_whose_watch_ended_is_not_closed_as_a_slow_watcher() {
    let mut config = ServeConfig::new(
        WorkloadSpec::new(Workload::W1).keys(100).events(2_000),
        4_000.0,
    );
    config.hold_churn = true;
    config.limits.slow_watcher_events = 50;
    config.limits.slow_watcher_check = Duration::from_millis(20);
    let mut server = Server::start(config).await.expect("the server starts");
    let mut conn = connect(server.addr()).await;
    // A watch that ends by its timeout, read to its end on this connection.
    let from = server.store().resource_version();
    let (code, _) = {
        conn.ready().await.unwrap();
        let request = hyper::Request::get(format!(
            "/api/v1/pods?watch=1&resourceVersion={from}&timeoutSeconds=1"
        ))
        .header("host", "loadgen")
        .body(Full::new(Bytes::new()))
        .unwrap();
        let response = conn.send_request(request).await.unwrap();
        let code = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (code, body)
    };
    assert_eq!(code, 200);
    // The store moves far past the bound while the connection only lists now and then.
    server.release_churn();
    tokio::time::timeout(Duration::from_secs(30), server.churn_finished())
        .await
        .expect("the churn finishes");
    // Let the connection's check run a few times after the churn, far behind as it is: it
    // counts its checks, so this waits for them rather than for a time.
    let checks = server.slow_watcher_checks();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.slow_watcher_checks() < checks + 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the connection is never checked"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (ok, _) = send(&mut conn, "GET", "/api/v1/pods?limit=1", b"").await;
    assert_eq!(ok, 200);
    assert_eq!(server.faults().slow_watchers_closed, 0);
    server.stop().await.unwrap();
}

/// `loadgen serve` as a child process (its memory is then its own), killed on drop.
struct ServeProcess {
    child: Child,
    addr: SocketAddr,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_serve(extra: &[&str]) -> ServeProcess {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "serve",
            "--workload",
            "w1",
            "--rate",
            "100",
            "--keys",
            "1000",
            "--events",
            "1000",
            "--addr",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("loadgen serve starts");
    let stdout = child.stdout.take().unwrap();
    let server_line = BufReader::new(stdout)
        .lines()
        .map(|l| l.expect("reads the kubeconfig"))
        .find(|l| l.trim_start().starts_with("server: http://"))
        .expect("the kubeconfig names the server");
    let addr = server_line
        .trim()
        .trim_start_matches("server: http://")
        .parse()
        .unwrap();
    ServeProcess { child, addr }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc is mounted");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Sends a request head one header line a second, forever (until the server closes).
async fn slow_loris(addr: SocketAddr) -> tokio::net::TcpStream {
    let mut tcp = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    tcp.write_all(b"GET /version HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    tcp
}

async fn drip(tcp: &mut tokio::net::TcpStream, n: usize) -> std::io::Result<()> {
    tcp.write_all(format!("X-Drip-{n}: a\r\n").as_bytes()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_and_a_hundred_slow_loris_clients_leave_serve_responsive() {
    const IDLE: usize = 10_000;
    // This process holds the client ends (the server's are in the child).
    let (soft, _) = rlimit_nofile();
    assert!(
        soft >= IDLE as u64 + 500,
        "this test needs {} open files; raise the limit (ulimit -n {})",
        IDLE + 500,
        IDLE + 1000
    );
    let serve = spawn_serve(&["--header-read-timeout", "120"]);
    let mut conn = connect(serve.addr).await;
    assert_eq!(
        send(&mut conn, "GET", "/api/v1/pods?limit=10", b"").await.0,
        200
    );
    let before = rss_kib(serve.child.id());
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        idle.push(
            tokio::net::TcpStream::connect(serve.addr)
                .await
                .expect("an idle connection"),
        );
    }
    let mut loris = Vec::new();
    for _ in 0..100 {
        loris.push(slow_loris(serve.addr).await);
    }
    for n in 0..3 {
        for tcp in &mut loris {
            drip(tcp, n).await.expect("a slow-loris line is accepted");
        }
        // Served meanwhile, on a new connection and on the old one.
        let mut fresh = connect(serve.addr).await;
        assert_eq!(send(&mut fresh, "GET", "/version", b"").await.0, 200);
        assert_eq!(send(&mut conn, "GET", "/api/v1/pods", b"").await.0, 200);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let growth_mib = rss_kib(serve.child.id()).saturating_sub(before) / 1024;
    assert!(
        growth_mib <= 100,
        "RSS grew {growth_mib} MiB with {IDLE} idle connections"
    );
    eprintln!("RSS growth with {IDLE} idle and 100 slow-loris connections: {growth_mib} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_slow_loris_connections_are_closed_after_the_header_read_timeout() {
    let serve = spawn_serve(&["--header-read-timeout", "1"]);
    let mut idle = tokio::net::TcpStream::connect(serve.addr).await.unwrap();
    let mut loris = slow_loris(serve.addr).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut byte = [0u8; 1];
    // The idle one: closed without a word.
    let read = tokio::time::timeout(Duration::from_secs(30), idle.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "idle connection not closed: {read:?}"
    );
    // The slow one: its drips stop being accepted once the server has closed it.
    let mut n = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "the slow-loris client was never cut off"
        );
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_millis(300), loris.read(&mut buf)).await {
            Ok(Ok(_)) | Ok(Err(_)) => break, // an answer (408) or the close
            Err(_) => {}
        }
        if drip(&mut loris, n).await.is_err() {
            break;
        }
        n += 1;
    }
}

fn rlimit_nofile() -> (u64, u64) {
    let limits = std::fs::read_to_string("/proc/self/limits").expect("/proc is mounted");
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("a Max open files line");
    let mut numbers = line
        .split_whitespace()
        .filter_map(|w| w.parse::<u64>().ok());
    (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0))
}
