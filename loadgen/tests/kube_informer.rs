//! kcache's `SharedInformer` over the wire: `KubeListerWatcher<Pod>` (the engine's `kube`
//! feature) against `loadgen serve` with W1 churning. The informer's store must end equal to
//! the server's final state, and a watch from a version that fell out of the server's window
//! must get `410 Expired` and make the reflector relist.
#![cfg(feature = "wire")]

mod serve_common;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kcache::informer::{
    kube_key_fn, Error, KubeListerWatcher, ListOptions, ListerWatcher, Page, SharedInformer,
    Versioned, WatchEvent, WatchOptions, WatchStream,
};
use kube::api::Api;
use kube::{Client, Config, ResourceExt};
use loadgen::serve::store::Store;
use serve_common::{churn_done, server_state, start, start_with, Counted};
use workloads::PodProfile;

fn client(url: &str) -> Client {
    Client::try_from(Config::new(url.parse().expect("a valid url"))).expect("a client")
}

/// The adapter, counting full lists (first pages), watches and the 410s its watches bring;
/// when `stall_first_watch` is set, its first watch waits until the server's window has moved
/// past the version it asks for, as a client held up by a slow network would find it.
struct Observed {
    inner: Counted<KubeListerWatcher<Pod>>,
    store: Arc<Store>,
    stall_first_watch: AtomicBool,
    expired: Arc<AtomicUsize>,
}

impl Observed {
    fn new(server: &loadgen::serve::Server, stall_first_watch: bool) -> Self {
        Observed {
            inner: Counted::new(KubeListerWatcher::new(Api::all(client(&server.url())))),
            store: Arc::clone(server.store()),
            stall_first_watch: AtomicBool::new(stall_first_watch),
            expired: Arc::new(AtomicUsize::new(0)),
        }
    }
}

impl ListerWatcher<Pod> for Observed {
    fn list(&self, options: ListOptions) -> impl Future<Output = Result<Page<Pod>, Error>> + Send {
        self.inner.list(options)
    }

    fn watch(
        &self,
        options: WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<Pod>, Error>> + Send {
        let stall = self.stall_first_watch.swap(false, Ordering::Relaxed);
        let store = Arc::clone(&self.store);
        let expired = Arc::clone(&self.expired);
        let watch = self.inner.watch(options.clone());
        async move {
            if stall {
                let from: u64 = options.resource_version.parse().unwrap_or(0);
                let deadline = Instant::now() + Duration::from_secs(20);
                while store.oldest() <= from {
                    assert!(
                        Instant::now() < deadline,
                        "the window never moved past {from}"
                    );
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            let stream = watch.await?;
            let counted: WatchStream<Pod> = stream
                .inspect(move |event| {
                    if let Ok(WatchEvent::Error(status)) = event {
                        if status.code == 410 {
                            expired.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
                .boxed();
            Ok(counted)
        }
    }
}

/// `namespace/name` → resource version of what the informer's store holds.
fn state_of(pods: Vec<Arc<Pod>>) -> BTreeMap<String, u64> {
    pods.iter()
        .map(|p| {
            let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
            (key, Versioned::resource_version(&**p).parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_informer_over_kube_rs_ends_equal_to_the_server_after_a_410_and_a_relist() {
    // 1,500 pods, 6,000 events at 3,000/s, a window of only 300 events: the stalled first
    // watch is certain to fall out of it.
    let server = start(1_500, 6_000, 3_000.0, 300).await;
    let observed = Arc::new(Observed::new(&server, true));
    let informer = SharedInformer::builder(Arc::clone(&observed), kube_key_fn::<Pod>())
        .page_size(250)
        .min_watch_timeout(Duration::from_secs(5))
        .build();
    informer.start().expect("the informer starts");

    let final_rv = churn_done(&server, Duration::from_secs(30))
        .await
        .resource_version;
    let expected = server_state(&server);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = state_of(informer.store().list());
    while got != expected {
        assert!(
            Instant::now() < deadline,
            "the informer did not converge: {} pods vs the server's {}, last sync {}, server at {final_rv}, failure {:?}",
            got.len(),
            expected.len(),
            informer.last_sync_resource_version(),
            informer.failure(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        got = state_of(informer.store().list());
    }
    assert!(informer.has_synced());
    assert!(
        observed.expired.load(Ordering::Relaxed) >= 1,
        "the stalled watch got a 410"
    );
    assert!(
        observed.inner.lists() >= 2,
        "the reflector relisted after the 410 ({} lists)",
        observed.inner.lists()
    );
    assert_eq!(informer.failure(), None);
    informer.shutdown().await;
    server.stop().await.unwrap();
}

/// `loadgen e2e` through the binary, tiny: every row (kcache through kube-rs, kcache's own
/// client over protobuf, over JSON and metadata only, its compact objects over protobuf and
/// JSON, kube-rs, and the discarding readers of the server alone) ends ok with every event.
#[test]
fn e2e_through_the_binary_gives_every_row_verdict_ok() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["e2e", "--workload", "w1", "--rate", "4000", "--keys", "300"])
        .args(["--events", "2000", "--window", "5000", "--client", "all"])
        .output()
        .expect("loadgen runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for client in [
        "kcache",
        "kcache-protobuf",
        "kcache-json",
        "kcache-metadata",
        "kcache-compact-protobuf",
        "kcache-compact-json",
        "kube-rs",
        "serve-alone",
        "serve-alone-protobuf",
    ] {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(client))
            .unwrap_or_else(|| panic!("no line for {client}:\n{stdout}"));
        assert!(line.ends_with(" ok"), "{line}");
        // The server holds its churn until the client has synced, so no event is published
        // while it lists, and the window holds every event (no 410 however slow the client):
        // it receives every one.
        let received: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(received, 2_000, "{client} received every event: {line}");
        // Every client that keeps a cache reports what it holds per pod, from its allocator.
        let bytes_per_pod = line.split_whitespace().nth(9).unwrap();
        if client.starts_with("serve-alone") {
            assert_eq!(bytes_per_pod, "n/a", "{line}");
        } else {
            let bytes: f64 = bytes_per_pod.parse().unwrap_or_else(|_| panic!("{line}"));
            assert!(bytes > 0.0, "{client} holds its cache somewhere: {line}");
        }
    }

    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(["e2e", "--rate", "0"])
        .output()
        .expect("loadgen runs");
    assert_eq!(bad.status.code(), Some(2), "a bad rate is a usage error");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a rate"));
}

/// The API server restarts twice mid-watch (every connection dropped, the port closed for a
/// moment, the same state served again while the churn goes on): kcache's informer and
/// kube-rs' own watcher + reflector both watch again and end equal to the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_clients_survive_a_server_restart_mid_watch() {
    use kube::runtime::{reflector, watcher, WatchStreamExt};

    // 1,000 pods, 8,000 events at 2,000/s: about four seconds of churn, which must outlast
    // both clients' initial lists and two restarts; minimal pods keep a debug build's lists
    // well inside that (the restarts, not the pods, are what this test is about).
    let mut server = start_with(PodProfile::Minimal, 1_000, 8_000, 2_000.0, 100_000).await;
    let counted = Arc::new(Observed::new(&server, false));
    let informer = SharedInformer::builder(Arc::clone(&counted), kube_key_fn::<Pod>())
        .min_watch_timeout(Duration::from_secs(30))
        .build();
    informer.start().expect("the informer starts");

    let (reader, writer) = reflector::store::<Pod>();
    let kube_rs_events = Arc::new(AtomicUsize::new(0));
    let kube_rs = {
        let api: Api<Pod> = Api::all(client(&server.url()));
        let events = Arc::clone(&kube_rs_events);
        tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .reflect(writer)
                .boxed();
            while let Some(event) = stream.next().await {
                if event.is_ok() {
                    events.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    for down in [Duration::from_millis(300), Duration::from_millis(800)] {
        // Restart only once both clients are in a watch: kcache's informer has opened one
        // more watch than before (the first, or one after the last restart) and kube-rs'
        // watcher has received an event since.
        let (watches, kube_rs_seen) = (
            counted.inner.watches(),
            kube_rs_events.load(Ordering::Relaxed),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while counted.inner.watches() <= watches
            || kube_rs_events.load(Ordering::Relaxed) <= kube_rs_seen
        {
            assert!(
                tokio::time::Instant::now() < deadline,
                "both clients should be watching within 20 s (kcache watches {}, kube-rs events {})",
                counted.inner.watches(),
                kube_rs_events.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let published = server.store().resource_version();
        server.restart(down).await.expect("the server restarts");
        assert!(
            server.store().resource_version() > published,
            "the churn went on while the server was down"
        );
    }

    churn_done(&server, Duration::from_secs(30)).await;
    let expected = server_state(&server);
    let kube_rs_state = || -> BTreeMap<String, u64> {
        state_of(
            reader
                .state()
                .iter()
                .map(|p| Arc::new((**p).clone()))
                .collect(),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let kcache_matches = state_of(informer.store().list()) == expected;
        let kube_rs_matches = kube_rs_state() == expected;
        if kcache_matches && kube_rs_matches {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not converged after the restarts: kcache {kcache_matches} ({} watches, {} lists, \
             failure {:?}), kube-rs {kube_rs_matches}",
            counted.inner.watches(),
            counted.inner.lists(),
            informer.failure(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        counted.inner.watches() >= 3,
        "kcache watched again after each restart ({} watches)",
        counted.inner.watches()
    );
    assert_eq!(informer.failure(), None);
    assert!(kube_rs_events.load(Ordering::Relaxed) > 1_000);
    kube_rs.abort();
    informer.shutdown().await;
    server.stop().await.unwrap();
}
