//! kube-rs against `loadgen serve`: paged lists, watches from a list's resource version, the
//! 410 of a too-old one, and `watcher` + `reflector` converging to the server's final state.
#![cfg(feature = "wire")]

mod serve_common;

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Client, Config, ResourceExt};
use loadgen::serve::{ServeConfig, Server};
use serve_common::{churn_done, server_state, start};
use tokio::sync::mpsc;
use workloads::{Workload, WorkloadSpec};

fn client(url: &str) -> Client {
    Client::try_from(Config::new(url.parse().expect("a valid url"))).expect("a client")
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

fn rv(pod: &Pod) -> u64 {
    pod.resource_version()
        .expect("a resourceVersion")
        .parse()
        .expect("a numeric resourceVersion")
}

/// Lists everything in pages of `limit`; returns the pods and the list's resource version.
async fn paged_list(api: &Api<Pod>, limit: u32) -> (BTreeMap<String, u64>, u64, usize) {
    let mut pods = BTreeMap::new();
    let mut token: Option<String> = None;
    let mut list_rv = None;
    let mut pages = 0;
    loop {
        let mut params = ListParams::default().limit(limit);
        if let Some(token) = &token {
            params = params.continue_token(token);
        }
        let page = api.list(&params).await.expect("a page");
        pages += 1;
        let page_rv: u64 = page.metadata.resource_version.unwrap().parse().unwrap();
        assert_eq!(
            *list_rv.get_or_insert(page_rv),
            page_rv,
            "every page describes the same moment"
        );
        assert!(
            limit == 0 || page.items.len() <= limit as usize,
            "limit 0 is no limit"
        );
        for pod in &page.items {
            assert!(rv(pod) <= page_rv, "{} is newer than its list", key(pod));
            assert!(
                pods.insert(key(pod), rv(pod)).is_none(),
                "{} listed twice",
                key(pod)
            );
        }
        match page.metadata.continue_ {
            Some(next) if !next.is_empty() => token = Some(next),
            _ => break,
        }
    }
    (pods, list_rv.unwrap(), pages)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_lists_see_one_consistent_moment_even_during_churn() {
    let server = start(1_500, 3_000, 2_000.0, 100_000).await;
    let api: Api<Pod> = Api::all(client(&server.url()));
    // During churn: pages must still agree with each other.
    let (during, during_rv, pages) = paged_list(&api, 100).await;
    assert!(pages >= 10, "{pages} pages");
    assert!(during.len() > 1_000);
    assert!(during_rv >= 1_500);

    churn_done(&server, Duration::from_secs(20)).await;
    let (after, _, _) = paged_list(&api, 250).await;
    assert_eq!(
        after,
        server_state(&server),
        "a paged list is the final state"
    );
    let (whole, _, pages) = paged_list(&api, 0).await;
    assert_eq!(pages, 1, "no limit: one page");
    assert_eq!(whole, after);

    // A namespace's list has just its pods.
    let ns: Api<Pod> = Api::namespaced(client(&server.url()), "ns-7");
    let list = ns.list(&ListParams::default()).await.unwrap();
    let expected: Vec<&String> = after.keys().filter(|k| k.starts_with("ns-7/")).collect();
    assert_eq!(list.items.len(), expected.len());
    assert!(list
        .items
        .iter()
        .all(|p| p.namespace().as_deref() == Some("ns-7")));

    // A single pod, and a missing one.
    let first = list.items.first().expect("ns-7 has pods");
    let got = ns.get(&first.name_any()).await.unwrap();
    assert_eq!(got.metadata.uid, first.metadata.uid);
    let missing = ns.get("no-such-pod").await.unwrap_err();
    assert!(
        matches!(&missing, kube::Error::Api(s) if s.code == 404 && s.reason == "NotFound"),
        "{missing:?}"
    );
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_a_lists_version_gets_every_later_event_in_order() {
    let server = start(500, 3_000, 3_000.0, 100_000).await;
    let api: Api<Pod> = Api::all(client(&server.url()));
    let list = api.list(&ListParams::default()).await.unwrap();
    let mut state: BTreeMap<String, u64> = list.items.iter().map(|p| (key(p), rv(p))).collect();
    let mut last: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    let final_rv = churn_done(&server, Duration::from_secs(20))
        .await
        .resource_version;

    let mut bookmarks = 0;
    while last < final_rv {
        let params = WatchParams::default().timeout(5); // bookmarks are on by default
        let mut stream = api.watch(&params, &last.to_string()).await.unwrap().boxed();
        while let Some(event) = stream.try_next().await.unwrap() {
            match event {
                WatchEvent::Added(p) | WatchEvent::Modified(p) => {
                    assert_eq!(rv(&p), last + 1, "events arrive in order, none missing");
                    last = rv(&p);
                    state.insert(key(&p), last);
                }
                WatchEvent::Deleted(p) => {
                    assert_eq!(rv(&p), last + 1, "events arrive in order, none missing");
                    last = rv(&p);
                    assert!(state.remove(&key(&p)).is_some(), "deleted what existed");
                }
                WatchEvent::Bookmark(b) => {
                    bookmarks += 1;
                    let at: u64 = b.metadata.resource_version.parse().unwrap();
                    assert!(at >= last, "a bookmark never goes back");
                }
                WatchEvent::Error(e) => panic!("unexpected error event {e:?}"),
            }
            if last == final_rv {
                break;
            }
        }
    }
    assert_eq!(state, server_state(&server));
    assert!(bookmarks > 0 || last == final_rv, "bookmarks decode");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_before_the_window_gets_410_expired() {
    let server = start(200, 1_000, 1e6, 100).await;
    let summary = churn_done(&server, Duration::from_secs(20)).await;
    let api: Api<Pod> = Api::all(client(&server.url()));
    let mut stream = api
        .watch(&WatchParams::default().timeout(5), "200")
        .await
        .expect("HTTP 200")
        .boxed();
    match stream.try_next().await.unwrap() {
        Some(WatchEvent::Error(status)) => {
            assert_eq!(status.code, 410);
            assert_eq!(status.reason, "Expired");
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(
        stream.try_next().await.unwrap().is_none(),
        "then the stream ends"
    );

    // Inside the window: fine.
    let recent = (summary.resource_version - 50).to_string();
    let mut stream = api
        .watch(&WatchParams::default().timeout(1), &recent)
        .await
        .unwrap()
        .boxed();
    let mut n = 0;
    while let Some(event) = stream.try_next().await.unwrap() {
        assert!(!matches!(event, WatchEvent::Error(_)), "{event:?}");
        n += 1;
        if n == 50 {
            break;
        }
    }
    assert_eq!(n, 50, "the last 50 events");
    server.stop().await.unwrap();
}

/// What the watcher reported that the tests judge, in stream order. The driver task only
/// forwards these; every assertion runs in the test's own task.
#[derive(Debug)]
enum Seen {
    /// An error the watcher recovered from, as text.
    Error(String),
    /// A (re)list finished: the reflector's store was replaced by it.
    InitDone,
}

/// `watcher` + `reflector` over every pod, driven by a task of its own.
struct Watching {
    reader: reflector::Store<Pod>,
    seen: mpsc::UnboundedReceiver<Seen>,
    /// Everything received from `seen` so far.
    log: Vec<Seen>,
    driver: tokio::task::JoinHandle<()>,
}

impl Watching {
    fn start(url: &str, config: watcher::Config) -> Self {
        let api: Api<Pod> = Api::all(client(url));
        let (reader, writer) = reflector::store();
        let stream = reflector(writer, watcher(api, config).default_backoff());
        let (tx, seen) = mpsc::unbounded_channel();
        let driver = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(item) = stream.next().await {
                let seen = match item {
                    Err(e) => Seen::Error(e.to_string()),
                    Ok(watcher::Event::InitDone) => Seen::InitDone,
                    Ok(_) => continue,
                };
                // The receiver is gone only once the test has stopped looking.
                let _ = tx.send(seen);
            }
        });
        Self {
            reader,
            seen,
            log: Vec::new(),
            driver,
        }
    }

    fn drain(&mut self) {
        while let Ok(seen) = self.seen.try_recv() {
            self.log.push(seen);
        }
    }

    /// Waits (at most 20 s) for the next finished (re)list.
    async fn next_init_done(&mut self) {
        let deadline = Duration::from_secs(20);
        loop {
            let seen = tokio::time::timeout(deadline, self.seen.recv())
                .await
                .expect("the watcher finished no list in 20 s")
                .expect("the watcher's stream ended");
            let done = matches!(seen, Seen::InitDone);
            self.log.push(seen);
            if done {
                return;
            }
        }
    }

    /// Waits (at most 20 s) until the reflector's store is `expected`.
    async fn converge(&mut self, expected: &BTreeMap<String, u64>) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            self.drain();
            let seen: BTreeMap<String, u64> = self
                .reader
                .state()
                .iter()
                .map(|p| (key(p), rv(p)))
                .collect();
            if seen == *expected {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the reflector did not converge: {} pods seen, {} expected; the watcher \
                 reported {:?}",
                seen.len(),
                expected.len(),
                self.log
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the driver and returns everything it reported. A panic in the driver fails the
    /// test here.
    async fn stop(mut self) -> Vec<Seen> {
        self.driver.abort();
        match (&mut self.driver).await {
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            _ => {}
        }
        self.drain();
        self.log
    }
}

fn errors(log: &[Seen]) -> Vec<&str> {
    log.iter()
        .filter_map(|seen| match seen {
            Seen::Error(text) => Some(text.as_str()),
            Seen::InitDone => None,
        })
        .collect()
}

/// `watcher` + `reflector` (list then watch, or a streaming list) end with the server's state,
/// and in a window wide enough for the whole churn the watcher reports no error at all.
async fn reflector_converges_without_errors(config: watcher::Config) {
    let server = start(2_000, 4_000, 4_000.0, 100_000).await;
    let mut watching = Watching::start(&server.url(), config);
    churn_done(&server, Duration::from_secs(20)).await;
    watching.converge(&server_state(&server)).await;
    let log = watching.stop().await;
    server.stop().await.unwrap();
    assert_eq!(
        errors(&log),
        Vec::<&str>::new(),
        "no error (no 410) in a wide window"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_and_reflector_converge_with_paged_lists() {
    reflector_converges_without_errors(watcher::Config::default().page_size(300).timeout(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_and_reflector_converge_with_streaming_lists() {
    reflector_converges_without_errors(watcher::Config::default().streaming_lists().timeout(5))
        .await;
}

/// A 410 is made certain, not hoped for: the watcher lists and watches while the churn is
/// held, then the server restarts and stays down while the churn publishes far more events
/// than the window of 20 keeps, so the watcher's resume version is gone when it reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watcher_and_reflector_recover_from_410_by_relisting() {
    let mut config = ServeConfig::new(
        WorkloadSpec::new(Workload::W1).keys(2_000).events(4_000),
        4_000.0,
    );
    config.window = 20;
    config.bookmark_interval = Duration::from_millis(200);
    config.hold_churn = true;
    let mut server = Server::start(config).await.expect("the server starts");
    let mut watching = Watching::start(&server.url(), watcher::Config::default().timeout(5));
    watching.next_init_done().await;
    let first_list = watching.log.len();

    server.release_churn();
    // 500 ms down at 4,000 events/s: ~2,000 events pass while the watcher cannot follow.
    server
        .restart(Duration::from_millis(500))
        .await
        .expect("the server restarts");
    churn_done(&server, Duration::from_secs(20)).await;
    watching.converge(&server_state(&server)).await;
    let log = watching.stop().await;
    server.stop().await.unwrap();

    let after_restart = &log[first_list..];
    let expired = after_restart
        .iter()
        .position(|seen| matches!(seen, Seen::Error(text) if is_expired(text)))
        .unwrap_or_else(|| panic!("no 410 after the restart; the watcher reported {log:?}"));
    assert!(
        after_restart[expired..]
            .iter()
            .any(|seen| matches!(seen, Seen::InitDone)),
        "no relist finished after the 410; the watcher reported {log:?}"
    );
    assert_eq!(
        errors(&log[..first_list]),
        Vec::<&str>::new(),
        "no error before the restart"
    );
    for text in errors(after_restart) {
        // While the server restarts the watcher loses its connection; nothing else may go wrong.
        assert!(
            is_expired(text) || is_server_gone(text),
            "unexpected watcher error: {text}"
        );
    }
}

fn is_expired(text: &str) -> bool {
    text.contains("410") || text.contains("Expired")
}

/// The errors a restart of the server causes: no connection while it is down, and a request
/// sent on a pooled connection that the restart closed, which hyper reports as `SendRequest`,
/// or as `Canceled` when the connection closed while the request waited to be sent (more
/// likely with typical pods: a list takes longer, so a request is in flight more often).
fn is_server_gone(text: &str) -> bool {
    let text = text.to_lowercase();
    text.contains("connect") || text.contains("sendrequest") || text.contains("(canceled)")
}
