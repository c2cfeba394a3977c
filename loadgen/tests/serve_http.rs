//! `loadgen serve` over raw HTTP/1.1: discovery, trailing slashes, `Status` errors on a
//! keep-alive connection that stays usable, bookmarks and timeouts, initial events, and many
//! concurrent watchers each receiving every event once, in order.
#![cfg(feature = "wire")]

mod serve_common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use serde_json::Value;
use serve_common::{churn_done, server_state, start, start_with};
use workloads::PodProfile;

async fn connect(addr: SocketAddr) -> SendRequest<Empty<Bytes>> {
    serve_common::connect(addr).await
}

fn get(path: &str) -> hyper::Request<Empty<Bytes>> {
    hyper::Request::get(path)
        .header("host", "loadgen")
        .body(Empty::new())
        .unwrap()
}

/// GETs `path` on `sender`, returning the status and the whole body as JSON.
async fn get_json(sender: &mut SendRequest<Empty<Bytes>>, path: &str) -> (u16, Value) {
    sender.ready().await.expect("the connection is usable");
    let response = sender.send_request(get(path)).await.expect("an answer");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {}", String::from_utf8_lossy(&body)));
    (status, json)
}

/// GETs a watch on `path` and reads its JSON lines until the stream ends or `stop` says so.
async fn watch_lines(
    sender: &mut SendRequest<Empty<Bytes>>,
    path: &str,
    mut stop: impl FnMut(&Value) -> bool,
) -> Vec<Value> {
    let mut events = Vec::new();
    watch_raw_lines(sender, path, |line| {
        let event: Value = serde_json::from_slice(line).expect("one JSON event per line");
        let done = stop(&event);
        events.push(event);
        done
    })
    .await;
    events
}

/// The resource version in a raw watch line, found without parsing the JSON (thousands of
/// watchers' worth of parsing would dominate a debug-build test).
fn raw_rv(line: &[u8]) -> u64 {
    const FIELD: &[u8] = br#""resourceVersion":""#;
    let at = line
        .windows(FIELD.len())
        .position(|w| w == FIELD)
        .expect("a resourceVersion")
        + FIELD.len();
    let digits = line[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&line[at..at + digits])
        .unwrap()
        .parse()
        .unwrap()
}

/// GETs a watch on `path` and hands each raw line to `line` until the stream ends or it
/// returns true.
async fn watch_raw_lines(
    sender: &mut SendRequest<Empty<Bytes>>,
    path: &str,
    mut line: impl FnMut(&[u8]) -> bool,
) {
    sender.ready().await.expect("the connection is usable");
    let response = sender.send_request(get(path)).await.expect("an answer");
    assert_eq!(response.status(), 200, "{path}");
    let mut body = response.into_body();
    let mut pending = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("the stream reads");
        let Some(data) = frame.data_ref() else {
            continue;
        };
        pending.extend_from_slice(data);
        let mut start = 0;
        while let Some(end) = pending[start..].iter().position(|&b| b == b'\n') {
            let done = line(&pending[start..start + end]);
            start += end + 1;
            if done {
                return;
            }
        }
        pending.drain(..start);
    }
    assert!(pending.is_empty(), "the stream ended inside a line");
}

fn event_rv(event: &Value) -> u64 {
    event["object"]["metadata"]["resourceVersion"]
        .as_str()
        .expect("a resourceVersion")
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_answers_with_and_without_a_trailing_slash() {
    let server = start(50, 0, 1.0, 1_000).await;
    let mut conn = connect(server.addr()).await;
    for path in ["/version", "/version/"] {
        let (code, body) = get_json(&mut conn, path).await;
        assert_eq!((code, body["major"].as_str()), (200, Some("1")), "{path}");
    }
    for path in ["/api", "/api/"] {
        let (code, body) = get_json(&mut conn, path).await;
        assert_eq!((code, body["kind"].as_str()), (200, Some("APIVersions")));
        assert_eq!(body["versions"][0], "v1");
    }
    for path in ["/apis", "/apis/"] {
        let (code, body) = get_json(&mut conn, path).await;
        assert_eq!((code, body["kind"].as_str()), (200, Some("APIGroupList")));
    }
    for path in ["/api/v1", "/api/v1/"] {
        let (code, body) = get_json(&mut conn, path).await;
        assert_eq!(
            (code, body["kind"].as_str()),
            (200, Some("APIResourceList"))
        );
        let pods = &body["resources"][0];
        assert_eq!(pods["name"], "pods");
        assert_eq!(pods["namespaced"], true);
        assert_eq!(pods["verbs"], serde_json::json!(["get", "list", "watch"]));
    }
    for path in [
        "/api/v1/pods",
        "/api/v1/pods/",
        "/api/v1/namespaces/ns-1/pods/",
    ] {
        let (code, body) = get_json(&mut conn, path).await;
        assert_eq!(
            (code, body["kind"].as_str()),
            (200, Some("PodList")),
            "{path}"
        );
        assert_eq!(body["apiVersion"], "v1");
        let item = &body["items"][0];
        assert!(
            item.get("kind").is_none(),
            "items carry no kind, as the real server's"
        );
        assert!(item["metadata"]["uid"].is_string());
        assert!(item["spec"]["nodeName"].is_string());
    }
    churn_done(&server, Duration::from_secs(5)).await;
    let (code, body) = get_json(&mut conn, "/loadgen/status").await;
    assert_eq!(code, 200);
    assert_eq!(body["churn"]["done"], true, "no events: done at once");
    assert_eq!(body["resourceVersion"], "50");
    assert_eq!(body["pods"], 50);
    let (code, body) = get_json(&mut conn, "/api/v1/namespaces/ns-1/pods/pod-1/").await;
    assert_eq!((code, body["kind"].as_str()), (200, Some("Pod")));
    assert_eq!(body["apiVersion"], "v1");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_a_status_and_the_connection_stays_usable() {
    let server = start(50, 0, 1.0, 1_000).await;
    let mut conn = connect(server.addr()).await;
    // The expected status and reason, and the paths that get it.
    let cases: [(u16, &str, &[&str]); 5] = [
        (
            404,
            "NotFound",
            &[
                "/api/v1/services",
                "/api/v1/namespaces/ns-1/configmaps",
                "/apis/apps/v1/deployments",
                "/nonsense",
                "/api/v1/namespaces/ns-1/pods/pod-999999",
            ],
        ),
        (
            400,
            "BadRequest",
            &[
                "/api/v1/pods?limit=10&continue=garbage",
                "/api/v1/pods?limit=10&continue=12-x",
                "/api/v1/pods?resourceVersion=abc",
                "/api/v1/pods?watch=1&resourceVersion=abc",
                "/api/v1/pods?watch=true&timeoutSeconds=soon",
                "/api/v1/pods?limit=-3",
                "/api/v1/pods?labelSelector=app%3Dx",
            ],
        ),
        (504, "Timeout", &["/api/v1/pods?resourceVersion=99999999"]),
        (410, "Expired", &["/api/v1/pods?limit=5&continue=1-5"]),
        (
            422,
            "Invalid",
            &["/api/v1/pods?watch=1&sendInitialEvents=true"],
        ),
    ];
    let cases = cases
        .into_iter()
        .flat_map(|(code, reason, paths)| paths.iter().map(move |path| (*path, code, reason)));
    for (path, code, reason) in cases {
        let (got, status) = get_json(&mut conn, path).await;
        assert_eq!(got, code, "{path}: {status}");
        assert_eq!(status["kind"], "Status", "{path}");
        assert_eq!(status["apiVersion"], "v1", "{path}");
        assert_eq!(status["status"], "Failure", "{path}");
        assert_eq!(status["code"], code, "{path}");
        assert_eq!(status["reason"], reason, "{path}");
        // The same connection answers the next request.
        let (ok, list) = get_json(&mut conn, "/api/v1/pods?limit=1").await;
        assert_eq!(
            (ok, list["kind"].as_str()),
            (200, Some("PodList")),
            "after {path}"
        );
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_events_then_the_end_bookmark_then_live_events_and_timeout_bookmarks() {
    let server = start(300, 200, 100.0, 1_000).await;
    let mut conn = connect(server.addr()).await;
    let path = "/api/v1/namespaces/ns-3/pods?watch=1&sendInitialEvents=true\
                &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=0\
                &timeoutSeconds=3";
    let started = std::time::Instant::now();
    let events = watch_lines(&mut conn, path, |_| false).await;
    let elapsed = started.elapsed();
    assert!(
        (Duration::from_millis(2_900)..Duration::from_secs(6)).contains(&elapsed),
        "timeoutSeconds=3 ended the watch after {elapsed:?}"
    );
    for e in &events {
        assert_eq!(e["object"]["apiVersion"], "v1", "{e}");
        assert_eq!(e["object"]["kind"], "Pod", "{e}");
    }
    let end = events
        .iter()
        .position(|e| {
            e["type"] == "BOOKMARK"
                && e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
        })
        .expect("the initial-events-end bookmark");
    assert!(end >= 1, "ns-3 has initial pods");
    assert!(events[..end].iter().all(|e| e["type"] == "ADDED"));
    let mut last = event_rv(&events[end]);
    for e in &events[end + 1..] {
        assert_eq!(
            e["object"]["metadata"]["namespace"]
                .as_str()
                .unwrap_or("ns-3"),
            "ns-3"
        );
        let rv = event_rv(e);
        assert!(rv >= last, "versions never go back: {rv} after {last}");
        last = rv;
    }
    let bookmarks = events[end + 1..]
        .iter()
        .filter(|e| e["type"] == "BOOKMARK")
        .count();
    assert!(
        bookmarks >= 3,
        "bookmarks every 200 ms over ~3 s: {bookmarks}"
    );
    // The connection is reusable after the watch ended.
    let (ok, _) = get_json(&mut conn, "/version").await;
    assert_eq!(ok, 200);
    server.stop().await.unwrap();
}

/// How many watchers the file-descriptor limit allows (each costs a socket on both ends).
fn watcher_count() -> usize {
    let wanted: usize = std::env::var("SERVE_WATCHERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    let soft_limit = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
            line.split_whitespace().nth(3)?.parse::<usize>().ok()
        })
        .unwrap_or(usize::MAX);
    let allowed = soft_limit.saturating_sub(256) / 2;
    if allowed < wanted {
        eprintln!("only {allowed} watchers: the open-files limit is {soft_limit}");
    }
    wanted.min(allowed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_watchers_each_get_every_event_once_in_order() {
    let watchers = watcher_count();
    let events = 200;
    // Minimal pods: the fan-out, not the pod, is what this test is about, and 2,000 watchers
    // of typical pods (9 KB each) would push 3.6 GB through a debug build's loopback.
    let server = start_with(PodProfile::Minimal, 500, events, 100.0, 100_000).await;
    let from = server.store().resource_version();
    assert_eq!(from, 500);
    let target = from + events as u64;
    let mut tasks = Vec::with_capacity(watchers);
    for i in 0..watchers {
        let addr = server.addr();
        tasks.push(tokio::spawn(async move {
            let mut conn = connect(addr).await;
            let path = format!("/api/v1/pods?watch=1&resourceVersion={from}&timeoutSeconds=60");
            let mut versions = Vec::with_capacity(events);
            watch_raw_lines(&mut conn, &path, |line| {
                if i == 0 {
                    // One watcher checks that every line is a whole event with a Pod.
                    let event: Value = serde_json::from_slice(line).expect("a JSON event");
                    assert_eq!(event["object"]["kind"], "Pod");
                    assert_eq!(event_rv(&event), raw_rv(line));
                }
                versions.push(raw_rv(line));
                versions.last() >= Some(&target)
            })
            .await;
            versions
        }));
    }
    let expected: Vec<u64> = (from + 1..=target).collect();
    let all = tokio::time::timeout(
        Duration::from_secs(25),
        futures_util::future::join_all(tasks),
    )
    .await
    .expect("every watcher finishes in time");
    for (i, got) in all.into_iter().enumerate() {
        assert_eq!(got.unwrap(), expected, "watcher {i}");
    }
    churn_done(&server, Duration::from_secs(5)).await;
    assert_eq!(server_state(&server).len(), server.store().len());
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_too_slow_for_the_window_gets_410_instead_of_a_growing_backlog() {
    // 40,000 events (~25 MB of lines) against a window of 500 events: a client that reads
    // nothing until the churn is over is far behind once its socket buffers are full.
    let server = start(100, 40_000, 40_000.0, 500).await;
    let mut conn = connect(server.addr()).await;
    let (_, list) = get_json(&mut conn, "/api/v1/pods?limit=1").await;
    let from = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    conn.ready().await.unwrap();
    let response = conn
        .send_request(get(&format!("/api/v1/pods?watch=1&resourceVersion={from}")))
        .await
        .expect("an answer");
    assert_eq!(response.status(), 200);
    churn_done(&server, Duration::from_secs(20)).await;
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let lines: Vec<&[u8]> = body
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    let last: Value = serde_json::from_slice(lines.last().unwrap()).unwrap();
    assert_eq!(last["type"], "ERROR", "{last}");
    assert_eq!(last["object"]["code"], 410);
    assert_eq!(last["object"]["reason"], "Expired");
    assert!(
        lines.len() < 60_000,
        "{} events reached the slow reader",
        lines.len()
    );
    // What it did receive is whole events, in order.
    let versions: Vec<u64> = lines[..lines.len() - 1].iter().map(|l| raw_rv(l)).collect();
    assert!(versions.windows(2).all(|w| w[1] == w[0] + 1));
    server.stop().await.unwrap();
}

/// A held churn publishes nothing until released, then all of it; its duration counts from the
/// release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_churn_starts_when_released() {
    let mut config = loadgen::serve::ServeConfig::new(
        workloads::WorkloadSpec::new(workloads::Workload::W1)
            .keys(200)
            .events(500),
        1e6,
    );
    config.hold_churn = true;
    config.record_publications = true;
    let mut server = loadgen::serve::Server::start(config).await.unwrap();
    // Once the churn thread is parked at its gate, anything it published would be in the
    // store: the check below cannot pass early by luck.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !server.churn_waiting_at_gate() {
        assert!(
            std::time::Instant::now() < deadline,
            "the churn never reached its gate"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(
        server.store().resource_version(),
        200,
        "nothing published yet"
    );
    assert!(server.store().publications().is_empty());
    let released = std::time::Instant::now();
    server.release_churn();
    let summary = churn_done(&server, Duration::from_secs(10)).await;
    assert_eq!(summary.events, 500);
    // Timed from the release, not from the server's start: no longer than we waited.
    assert!(
        summary.seconds <= released.elapsed().as_secs_f64(),
        "timed from the release: {summary:?}"
    );
    let publications = server.store().publications();
    assert_eq!(publications.first().map(|p| p.0), Some(201));
    server.stop().await.unwrap();
}
