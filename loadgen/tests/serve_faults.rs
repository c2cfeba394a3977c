//! kcache's informer over the wire against `loadgen serve` injecting one fault at a time
//! (docs/wire.md, "Faults"): `KubeListerWatcher<Pod>` on loopback, client-go's backoff, two
//! handlers. After each fault the informer's store and each handler's ledger equal the
//! server's final state, no handler was told a key twice or missed a change, the fault reached
//! the watch error handler as the error it is, nothing panicked, and no task is left once the
//! informer and the server are shut down. Where kube-rs' own watcher applies, it runs beside
//! kcache's as the anchor and must converge too.
#![cfg(feature = "wire")]

mod serve_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kcache::informer::{kube_key_fn, Error, KubeListerWatcher, SharedInformer, Versioned};
use kube::api::Api;
use kube::{Client, Config, ResourceExt};
use loadgen::judging::handler_ledger::{Ledger, LedgerHandler};
use loadgen::serve::faults::{FaultPlan, FaultReport, Stall};
use loadgen::serve::{ServeConfig, Server};
use serve_common::{server_state, Counted};
use workloads::{PodProfile, Workload, WorkloadSpec};

/// A kube client; `retries` keeps kube's own retry layer (it retries 429, 503 and 504 up to
/// 15 times inside one call, so the reflector would not see them). kcache's informer runs
/// without it: its reflector backs off and honours `Retry-After` itself, as client-go's does.
fn client(url: &str, retries: bool) -> Client {
    let mut config = Config::new(url.parse().expect("a valid url"));
    config.default_retry = retries;
    Client::try_from(config).expect("a client")
}

fn state_of(pods: &[Arc<Pod>]) -> BTreeMap<String, u64> {
    pods.iter()
        .map(|p| {
            let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
            (key, Versioned::resource_version(&**p).parse().unwrap())
        })
        .collect()
}

/// One run: the workload, the fault, and what else happens to the server mid-run.
struct Scenario {
    plan: FaultPlan,
    keys: usize,
    events: usize,
    rate: f64,
    page_size: usize,
    /// Also run kube-rs' watcher + reflector beside kcache's informer.
    anchor: bool,
    /// Restart the server without its state this far into the churn.
    lose_state_after: Option<usize>,
    /// Close watchers this many events behind (checked every 50 ms).
    slow_watcher_events: Option<u64>,
    /// Inject only until the first fault is counted (for faults that would otherwise hit
    /// every attempt: a certain 500 on every list page).
    until_first: bool,
    /// This long into the churn, stall every watch for that long (no bytes, no close).
    stall_during_churn: Option<(Duration, Duration)>,
}

impl Scenario {
    fn new(plan: &str) -> Self {
        Scenario {
            plan: plan.parse().expect("a valid plan"),
            keys: 1_000,
            events: 6_000,
            rate: 2_000.0,
            page_size: 100,
            anchor: true,
            lose_state_after: None,
            slow_watcher_events: None,
            until_first: false,
            stall_during_churn: None,
        }
    }
}

/// What a run saw.
struct Outcome {
    faults: FaultReport,
    errors: Vec<Error>,
    lists: usize,
    watches: usize,
}

async fn run(scenario: Scenario) -> Outcome {
    let mut config = ServeConfig::new(
        WorkloadSpec::new(Workload::W1)
            .keys(scenario.keys)
            .events(scenario.events),
        scenario.rate,
    );
    // Minimal pods: the faults strike per chunk with a seeded coin, and their counts assume the
    // chunks of a client that keeps up; heavier pods in a debug build coalesce a loaded
    // client's chunks until a rare fault may not strike at all. The faults, not the pods, are
    // what these tests are about (the serve_kube and wire tests run typical pods).
    config.pod_profile = PodProfile::Minimal;
    config.bookmark_interval = Duration::from_millis(500);
    config.faults = scenario.plan.clone();
    config.too_large_wait = Duration::from_millis(500);
    config.hold_churn = true;
    if let Some(bound) = scenario.slow_watcher_events {
        config.limits.slow_watcher_events = bound;
        config.limits.slow_watcher_check = Duration::from_millis(50);
    }
    let mut server = Server::start(config).await.expect("the server starts");

    // The adapter, counting full lists and watches.
    let counted = Arc::new(Counted::new(KubeListerWatcher::new(Api::all(client(
        &server.url(),
        false,
    )))));
    let errors = Arc::new(Mutex::new(Vec::<Error>::new()));
    let informer = SharedInformer::builder(Arc::clone(&counted), kube_key_fn::<Pod>())
        .page_size(scenario.page_size)
        .min_watch_timeout(Duration::from_secs(5))
        .watch_error_handler({
            let errors = Arc::clone(&errors);
            Arc::new(move |e: &Error| errors.lock().unwrap().push(e.clone()))
        })
        .build();
    let ledgers: Vec<Arc<Mutex<Ledger>>> = (0..2)
        .map(|_| {
            let handler = LedgerHandler::new(kube_key_fn::<Pod>());
            let ledger = handler.ledger();
            informer.add_event_handler(handler).expect("a handler");
            ledger
        })
        .collect();
    informer.start().expect("the informer starts");

    // A fault that strikes once strikes kcache's informer: the kube-rs anchor starts after it.
    if scenario.until_first {
        let deadline = Instant::now() + Duration::from_secs(60);
        while server.faults() == FaultReport::default() {
            assert!(Instant::now() < deadline, "the fault never happened");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        server.set_faults(FaultPlan::default());
    }
    let (reader, writer) = kube::runtime::reflector::store::<Pod>();
    let anchor = scenario.anchor.then(|| {
        use kube::runtime::{watcher, WatchStreamExt};
        let api: Api<Pod> = Api::all(client(&server.url(), true));
        tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default().page_size(100))
                .default_backoff()
                .reflect(writer)
                .boxed();
            while stream.next().await.is_some() {}
        })
    });

    // The churn starts once the informer has listed, so the faults hit watches and lists
    // alike.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !informer.has_synced() {
        assert!(
            Instant::now() < deadline,
            "the informer never synced: {:?}",
            errors.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.release_churn();
    if let Some((into, stall)) = scenario.stall_during_churn {
        tokio::time::sleep(into).await;
        server.stall_watches(stall);
    }
    if let Some(after) = scenario.lose_state_after {
        let deadline = Instant::now() + Duration::from_secs(60);
        let from = server.store().resource_version();
        while server.store().resource_version() < from + after as u64 {
            assert!(Instant::now() < deadline, "the churn stalled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let lists = counted.lists();
        server
            .restart_without_state(Duration::from_millis(300), 99, true)
            .await
            .expect("the server restarts");
        // The new state churns once kcache's informer has listed it: until then its version
        // is in the server's future (a churn running on could catch up with it first, and the
        // server would then resume the watch in a history that is not the one it came from;
        // the real API server would too).
        let deadline = Instant::now() + Duration::from_secs(60);
        while counted.lists() == lists || !informer.has_synced() {
            assert!(Instant::now() < deadline, "no relist after the restart");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        server.release_churn();
    }
    tokio::time::timeout(Duration::from_secs(120), server.churn_finished())
        .await
        .expect("the churn finishes");

    let expected = server_state(&server);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let store_ok = state_of(&informer.store().list()) == expected;
        let handlers_ok = ledgers
            .iter()
            .all(|l| l.lock().unwrap().held() == &expected);
        let anchor_ok = !scenario.anchor || state_of(&reader.state()) == expected;
        if store_ok && handlers_ok && anchor_ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no convergence: store {store_ok}, handlers {handlers_ok}, kube-rs {anchor_ok}; \
             {} lists, {} watches, faults {}, errors {:?}, failure {:?}",
            counted.lists(),
            counted.watches(),
            server.faults(),
            errors.lock().unwrap().iter().take(5).collect::<Vec<_>>(),
            informer.failure()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (n, ledger) in ledgers.iter().enumerate() {
        let ledger = ledger.lock().unwrap();
        let verdict = if scenario.lose_state_after.is_some() {
            ledger.judge_after_lost_state(&expected)
        } else {
            ledger.judge(&expected)
        };
        if let Err(verdict) = verdict {
            panic!("handler {n}: {verdict}");
        }
    }
    assert_eq!(informer.failure(), None, "nothing panicked");

    if let Some(anchor) = anchor {
        anchor.abort();
        let _ = anchor.await;
    }
    informer.shutdown().await;
    let (lists, watches) = (counted.lists(), counted.watches());
    // The kube clients (and their connection pools' tasks) go with them.
    drop(informer);
    drop(counted);
    let faults = server.faults();
    server.stop().await.expect("the server stops");
    // Nothing of the informer, the server or the HTTP clients keeps running.
    let metrics = tokio::runtime::Handle::current().metrics();
    let deadline = Instant::now() + Duration::from_secs(10);
    while metrics.num_alive_tasks() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} tasks still alive after shutdown",
            metrics.num_alive_tasks()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let errors = errors.lock().unwrap().clone();
    Outcome {
        faults,
        errors,
        lists,
        watches,
    }
}

// kube-rs reads a cut chunked body (`UnexpectedEof`) and a last line cut short (a JSON EOF
// error) as the end of the stream, not as an error: kcache's reflector sees the watch end and
// opens it again from its last version, without a relist (unless the cut watch had delivered
// nothing within its first second: then it is client-go's "very short watch", and a relist).

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_reset_mid_chunk_ends_the_watch_and_it_resumes() {
    let out = run(Scenario::new("reset-mid-chunk=0.05,seed=1")).await;
    assert!(out.faults.resets >= 1, "{}", out.faults);
    assert!(out.watches >= 2, "{} watches", out.watches);
    // A request sent on a pooled connection the reset had killed is a transport error, which
    // the reflector retries after a backoff.
    assert!(
        out.errors
            .iter()
            .all(|e| matches!(e, Error::VeryShortWatch | Error::Transport(_))),
        "{:?}",
        out.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_frame_ends_the_watch_and_it_resumes() {
    let out = run(Scenario::new("truncate-frame=0.05,seed=2")).await;
    assert!(out.faults.truncated_frames >= 1, "{}", out.faults);
    assert!(out.watches >= 2, "{} watches", out.watches);
    assert!(
        out.errors
            .iter()
            .all(|e| matches!(e, Error::VeryShortWatch)),
        "{:?}",
        out.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_is_decoded() {
    let mut scenario = Scenario::new("oversized-frame=0.01,seed=3");
    scenario.events = 3_000;
    let out = run(scenario).await;
    assert!(out.faults.oversized_frames >= 1, "{}", out.faults);
    assert!(
        !out.errors.iter().any(|e| matches!(e, Error::Decode(_))),
        "{:?}",
        out.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_and_a_half_mebibyte_object_is_decoded() {
    let out = run(Scenario::new("big-object=0.1,seed=4")).await;
    assert!(out.faults.big_objects >= 1, "{}", out.faults);
    assert!(
        !out.errors.iter().any(|e| matches!(e, Error::Decode(_))),
        "{:?}",
        out.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_without_bytes_or_close_is_waited_out() {
    let mut scenario = Scenario::new("");
    scenario.plan.stall = Some(Stall {
        after: Duration::ZERO,
        duration: Duration::from_secs(4),
    });
    let out = run(scenario).await;
    assert!(out.faults.stalled_chunks >= 1, "{}", out.faults);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_reaches_the_handler_with_its_retry_after() {
    // Until the first 429 only: at 20% of requests, a list of ten pages rarely got through,
    // and the informer could fail to sync within the test's minute on a loaded machine.
    let mut scenario = Scenario::new("too-many-requests=0.2,seed=5");
    scenario.until_first = true;
    let out = run(scenario).await;
    assert!(out.faults.too_many_requests >= 1, "{}", out.faults);
    assert!(
        out.errors
            .iter()
            .any(|e| e.is_too_many_requests() && e.retry_after() == Some(Duration::from_secs(1))),
        "{:?}",
        out.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_in_a_paged_list_ends_the_round_and_the_list_starts_over() {
    let mut scenario = Scenario::new("list-500=1");
    scenario.until_first = true;
    let out = run(scenario).await;
    assert!(out.faults.list_500s >= 1, "{}", out.faults);
    assert!(
        out.errors
            .iter()
            .any(|e| e.status().is_some_and(|s| s.code == 500)),
        "{:?}",
        out.errors
    );
    assert!(out.lists >= 2, "{} lists", out.lists);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_continue_token_makes_the_reflector_list_again() {
    let mut scenario = Scenario::new("expire-continue=1");
    scenario.until_first = true;
    let out = run(scenario).await;
    assert!(out.faults.expired_continues >= 1, "{}", out.faults);
    assert!(out.errors.iter().any(Error::is_expired), "{:?}", out.errors);
    assert!(out.lists >= 2, "{} lists", out.lists);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_loses_the_state_is_a_too_large_version_and_a_relist() {
    let mut scenario = Scenario::new("");
    scenario.lose_state_after = Some(3_000);
    // kube-rs' watcher relists only on 410: against a server whose versions went back it
    // keeps asking for its old version, so it is no anchor here.
    scenario.anchor = false;
    let out = run(scenario).await;
    assert!(out.faults.too_large_versions >= 1, "{}", out.faults);
    assert!(
        out.errors.iter().any(Error::is_too_large_resource_version),
        "{:?}",
        out.errors
    );
    assert!(out.lists >= 2, "{} lists", out.lists);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_watcher_closed_by_the_server_watches_again() {
    // A bound of a few events, checked every 50 ms. Every watch stalls for half a second 0.2 s
    // into the 2 s churn, so the watch open then falls thousands of events behind and is closed while
    // most of the churn is still to come: the informer must watch again to hear it (without
    // the stall, a close could come only at the end, once everything was heard).
    let mut scenario = Scenario::new("");
    scenario.rate = 5_000.0;
    scenario.events = 10_000;
    scenario.slow_watcher_events = Some(5);
    scenario.stall_during_churn = Some((Duration::from_millis(200), Duration::from_millis(500)));
    let out = run(scenario).await;
    assert!(out.faults.slow_watchers_closed >= 1, "{}", out.faults);
    assert!(out.watches >= 2, "{} watches", out.watches);
}
