//! The shared informer end to end against the in-memory server: client-go's shared informer
//! tests (`tools/cache/shared_informer_test.go`) re-expressed. Each test names the one it
//! mirrors. Consumers and handlers run on threads, so these tests use the real clock and wait
//! for conditions with a deadline.

mod informer_common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use informer_common::{error_log, key_fn, ms, pod, server, server_of, upsert_pods, Gate, Pod};
use kcache::informer::{
    Backoff, HandlerOptions, InformerError, ListerWatcher, Registration, SharedInformer,
    SharedInformerBuilder,
};
use kcache::{DeltaObject, DeltaQueue, EventHandler, IndexFunc, Indexer, Key, TransformError};
use kcache_sim::MemoryListerWatcher;

/// Polls `cond` until it holds; fails the test after 10 s on tokio's clock.
async fn eventually(what: &str, cond: impl FnMut() -> bool) {
    informer_common::eventually_on_tokio_clock(what, Duration::from_secs(10), cond).await;
}

/// Polls `cond` until it holds; fails the test after 10 s of real time, never moving tokio's paused clock.
async fn frozen_until(what: &str, cond: impl FnMut() -> bool) {
    informer_common::frozen_until(what, Duration::from_secs(10), cond).await;
}

/// What a handler saw: every call as text, and the state the calls build.
#[derive(Default)]
struct Seen {
    calls: Vec<String>,
    state: BTreeMap<String, (u64, String)>,
    resyncs: usize,
}

#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Seen>>,
    gate: Option<Arc<Gate>>,
    panic_on: Option<String>,
}

impl Recorder {
    fn gated(gate: &Arc<Gate>) -> Self {
        Self {
            gate: Some(Arc::clone(gate)),
            ..Self::default()
        }
    }
    fn calls(&self) -> Vec<String> {
        self.seen.lock().unwrap().calls.clone()
    }
    fn state(&self) -> Vec<(String, u64)> {
        let seen = self.seen.lock().unwrap();
        seen.state
            .iter()
            .map(|(k, (v, _))| (k.clone(), *v))
            .collect()
    }
    fn resyncs(&self) -> usize {
        self.seen.lock().unwrap().resyncs
    }
    fn pass_gate(&self) {
        if let Some(gate) = &self.gate {
            gate.wait();
        }
    }
}

impl EventHandler<Pod> for Recorder {
    fn on_add(&mut self, obj: &Arc<Pod>, initial: bool) {
        self.pass_gate();
        if self.panic_on.as_deref() == Some(obj.name.as_str()) {
            panic!("handler refuses {}", obj.name);
        }
        let mut seen = self.seen.lock().unwrap();
        seen.calls
            .push(format!("add {}={} initial={initial}", obj.name, obj.value));
        seen.state
            .insert(obj.name.clone(), (obj.value, obj.rv.clone()));
    }
    fn on_update(&mut self, old: &Arc<Pod>, new: &Arc<Pod>) {
        self.pass_gate();
        let mut seen = self.seen.lock().unwrap();
        if old.rv == new.rv {
            seen.resyncs += 1;
            return;
        }
        seen.calls
            .push(format!("update {}={}->{}", new.name, old.value, new.value));
        seen.state
            .insert(new.name.clone(), (new.value, new.rv.clone()));
    }
    fn on_delete(&mut self, obj: &DeltaObject<Pod>) {
        self.pass_gate();
        let mut seen = self.seen.lock().unwrap();
        let last = obj.last_known().expect("deletes carry the last state");
        let kind = if obj.is_tombstone() {
            "tombstone"
        } else {
            "delete"
        };
        seen.calls.push(format!("{kind} {}", last.name));
        seen.state.remove(&last.name);
    }
}

fn server_state(srv: &MemoryListerWatcher<Pod>) -> Vec<(String, u64)> {
    srv.objects()
        .iter()
        .map(|p| (p.name.clone(), p.value))
        .collect()
}

fn builder(srv: &MemoryListerWatcher<Pod>) -> SharedInformerBuilder<Pod, MemoryListerWatcher<Pod>> {
    let quick = Backoff {
        initial: ms(5),
        max: ms(50),
        ..Backoff::default()
    };
    SharedInformer::builder(srv.clone(), key_fn())
        .backoff(quick)
        .shards(4)
        .consumers(2)
}

/// A [`Recorder`] held at a closed gate, registered on `informer`.
fn gated_handler<Q: DeltaQueue<Pod> + 'static, I: Indexer<Pod> + 'static>(
    informer: &SharedInformer<Pod, MemoryListerWatcher<Pod>, Q, I>,
) -> (Arc<Gate>, Recorder, Registration) {
    let gate = Arc::new(Gate::default());
    let recorder = Recorder::gated(&gate);
    let registration = informer.add_event_handler(recorder.clone()).unwrap();
    (gate, recorder, registration)
}

/// The basic life of an informer, run on both engines: initial list, changes, store, sync.
async fn initial_list_then_changes<L, Q, I>(
    informer: SharedInformer<Pod, L, Q, I>,
    srv: MemoryListerWatcher<Pod>,
) where
    L: ListerWatcher<Pod> + 'static,
    Q: DeltaQueue<Pod> + 'static,
    I: Indexer<Pod> + 'static,
{
    let handler = Recorder::default();
    let registration = informer.add_event_handler(handler.clone()).unwrap();
    assert!(!informer.has_synced() && !registration.has_synced());
    informer.start().unwrap();
    assert!(matches!(
        informer.start(),
        Err(InformerError::AlreadyStarted)
    ));
    registration.wait_for_sync().await;
    assert!(informer.has_synced());
    let mut initial = handler.calls();
    initial.sort(); // two keys, possibly on two shards and two consumers: any order
    assert_eq!(initial, ["add a=1 initial=true", "add b=1 initial=true"]);
    srv.upsert(pod("a", 2)).unwrap();
    srv.delete(&Key::new("b"));
    srv.upsert(pod("c", 1)).unwrap();
    eventually("the changes", || handler.calls().len() == 5).await;
    // Three keys: only each key's own order is promised across shards and consumers.
    let mut changes = handler.calls()[2..].to_vec();
    changes.sort();
    assert_eq!(
        changes,
        ["add c=1 initial=false", "delete b", "update a=1->2"]
    );
    let store = informer.store();
    assert_eq!(store.get_by_key(&Key::new("a")).unwrap().value, 2);
    assert!(store.get_by_key(&Key::new("b")).is_none());
    assert_eq!(store.by_index("by-value", "1").unwrap().len(), 1);
    assert_eq!(
        informer.last_sync_resource_version(),
        srv.resource_version()
    );
    informer.shutdown().await;
    assert!(registration.is_stopped());
}

fn by_value() -> Vec<(String, IndexFunc<Pod>)> {
    let f: IndexFunc<Pod> =
        Arc::new(|p: &Pod| [Key::new(&p.value.to_string())].into_iter().collect());
    vec![("by-value".to_string(), f)]
}

// Mirrors TestIndexer / TestStateSharedInformer on the sharded engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_informer_delivers_the_initial_list_then_changes() {
    let srv = server_of(100, [pod("a", 1), pod("b", 1)]);
    let informer = builder(&srv).indexers(by_value()).build();
    initial_list_then_changes(informer, srv).await;
}

// The same on the reference design: the pipeline is generic over the queue and the indexer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_informer_delivers_the_initial_list_then_changes() {
    let srv = server_of(100, [pod("a", 1), pod("b", 1)]);
    let informer = builder(&srv).indexers(by_value()).build_reference();
    initial_list_then_changes(informer, srv).await;
}

// Mirrors TestAddWhileActive and TestSharedInformerInitializationRace: a handler added after
// the start first gets the store's content as initial adds; its has_synced waits for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_added_late_gets_synthetic_adds_and_its_own_has_synced() {
    let srv = server(100);
    for name in ["a", "b", "c"] {
        srv.upsert(pod(name, 1)).unwrap();
    }
    let informer = builder(&srv).build();
    let early = Recorder::default();
    let early_reg = informer.add_event_handler(early.clone()).unwrap();
    informer.start().unwrap();
    early_reg.wait_for_sync().await;

    let (gate, late, late_reg) = gated_handler(&informer);
    assert!(informer.has_synced());
    assert!(
        !late_reg.has_synced(),
        "its initial adds are not delivered yet"
    );
    assert_eq!(late_reg.pending(), 3);
    srv.upsert(pod("b", 2)).unwrap();
    eventually("the early handler's update", || early.calls().len() == 4).await;
    assert!(!late_reg.has_synced());
    gate.open();
    late_reg.wait_for_sync().await;
    eventually("the late handler's update", || late.calls().len() == 4).await;
    let mut calls = late.calls();
    // The snapshot comes in the store's order, which no one promises.
    calls[..3].sort();
    assert_eq!(
        calls,
        [
            "add a=1 initial=true",
            "add b=1 initial=true",
            "add c=1 initial=true",
            "update b=1->2",
        ]
    );
    informer.shutdown().await;
}

// Mirrors the slow-listener cases of TestSharedInformerMultipleRegistration: a handler that
// does not return delays nobody: the others and the store keep up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_handler_delays_neither_the_others_nor_the_store() {
    let srv = server(1000);
    let informer = builder(&srv).build();
    let (gate, stuck, stuck_reg) = gated_handler(&informer);
    let fast = Recorder::default();
    informer.add_event_handler(fast.clone()).unwrap();
    informer.start().unwrap();
    informer.wait_for_sync().await;
    upsert_pods(&srv, 200, 3, 1);
    eventually("the fast handler", || fast.calls().len() == 200).await;
    eventually("the store", || informer.store().len() == 200).await;
    assert!(stuck.calls().is_empty());
    assert_eq!(stuck_reg.pending(), 200, "buffered for the stuck handler");
    gate.open();
    eventually("the stuck handler", || stuck.calls().len() == 200).await;
    assert_eq!(stuck.state(), fast.state());
    informer.shutdown().await;
}

// Mirrors TestSharedInformerRemoveHandler, TestRemoveWhileActive and
// TestRemovingRemovedSharedInformer: a removed handler gets nothing more (not even what was
// buffered for it), its delivery stops, and removing it again says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_handler_gets_nothing_more() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    let informer = builder(&srv).build();
    let (gate, removed, reg) = gated_handler(&informer);
    let kept = Recorder::default();
    informer.add_event_handler(kept.clone()).unwrap();
    informer.start().unwrap();
    informer.wait_for_sync().await;
    srv.upsert(pod("a", 2)).unwrap();
    eventually("the kept handler", || kept.calls().len() == 2).await;
    assert_eq!(informer.handler_count(), 2);
    assert!(informer.remove_event_handler(&reg));
    assert_eq!(informer.handler_count(), 1);
    gate.open();
    reg.stopped().await;
    srv.upsert(pod("a", 3)).unwrap();
    eventually("the kept handler", || kept.calls().len() == 3).await;
    assert!(
        removed.calls().len() <= 1,
        "at most the call it was blocked in: {:?}",
        removed.calls()
    );
    assert!(!informer.remove_event_handler(&reg), "already removed");
    informer.shutdown().await;
}

// Mirrors TestSharedInformerRemoveForeignHandler: another informer's registration removes
// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_registration_removes_nothing() {
    let srv = server(100);
    let (one, two) = (builder(&srv).build(), builder(&srv).build());
    let ours = Recorder::default();
    one.add_event_handler(ours.clone()).unwrap();
    let foreign = two.add_event_handler(Recorder::default()).unwrap();
    assert!(!one.remove_event_handler(&foreign));
    assert_eq!((one.handler_count(), two.handler_count()), (1, 1));
    one.start().unwrap();
    one.wait_for_sync().await;
    srv.upsert(pod("a", 1)).unwrap();
    eventually("our handler", || ours.calls().len() == 1).await;
    one.shutdown().await;
    two.shutdown().await;
}

// Mirrors TestListenerResyncPeriods and TestResyncCheckPeriod: each handler resyncs on its
// own period (at least the informer's check period); zero never. On tokio's paused clock the
// resync checks happen exactly when the test advances it, so the counts are exact.
#[tokio::test(start_paused = true)]
async fn each_registration_resyncs_on_its_own_period() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    let informer = builder(&srv).resync_period(Duration::from_secs(10)).build();
    let (every_1s, every_2s, never) = (
        Recorder::default(),
        Recorder::default(),
        Recorder::default(),
    );
    informer
        .add_event_handler_with_resync(every_2s.clone(), Duration::from_secs(2))
        .unwrap();
    assert_eq!(informer.resync_check_period(), Duration::from_secs(2));
    informer
        .add_event_handler_with_resync(every_1s.clone(), ms(300)) // raised to the 1 s minimum
        .unwrap();
    assert_eq!(informer.resync_check_period(), Duration::from_secs(1));
    informer
        .add_event_handler_with_resync(never.clone(), Duration::ZERO)
        .unwrap();
    informer.start().unwrap();
    frozen_until("the first list", || informer.has_synced()).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    frozen_until("the resync at 1 s", || every_1s.resyncs() == 1).await;
    assert_eq!(every_2s.resyncs(), 0, "not due at 1 s");
    tokio::time::advance(Duration::from_secs(1)).await;
    frozen_until("the resyncs at 2 s", || {
        every_1s.resyncs() == 2 && every_2s.resyncs() == 1
    })
    .await;
    tokio::time::advance(ms(500)).await;
    assert_eq!(every_1s.resyncs(), 2, "resynced at 1 s and 2 s");
    assert_eq!(every_2s.resyncs(), 1, "resynced at 2 s");
    assert_eq!(never.resyncs(), 0);
    // After the start, a shorter period than the check period is raised to it.
    let late = Recorder::default();
    informer
        .add_event_handler_with_resync(late.clone(), Duration::from_secs(1))
        .unwrap();
    assert_eq!(informer.resync_check_period(), Duration::from_secs(1));
    informer.shutdown().await;
}

// Mirrors TestSharedInformerTransformer: the transform applies before the store and the
// handlers; a refused object reaches the error handler, not the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transform_applies_before_store_and_handlers() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    let (errors, on_error) = error_log();
    let informer = builder(&srv)
        .transform(Arc::new(|p: Arc<Pod>| {
            if p.value == 666 {
                return Err(TransformError("refused".into()));
            }
            let mut p = (*p).clone();
            p.value *= 10;
            Ok(Arc::new(p))
        }))
        .watch_error_handler(on_error)
        .build();
    let handler = Recorder::default();
    informer.add_event_handler(handler.clone()).unwrap();
    informer.start().unwrap();
    informer.wait_for_sync().await;
    srv.upsert(pod("b", 666)).unwrap();
    srv.upsert(pod("c", 2)).unwrap();
    eventually("c", || handler.calls().len() == 2).await;
    assert_eq!(
        handler.calls(),
        ["add a=10 initial=true", "add c=20 initial=false"]
    );
    assert_eq!(
        informer.store().get_by_key(&Key::new("a")).unwrap().value,
        10
    );
    assert!(informer.store().get_by_key(&Key::new("b")).is_none());
    assert_eq!(errors.lock().unwrap().len(), 1);
    informer.shutdown().await;
}

// Mirrors TestSharedInformerWatchDisruption: closed watches and 410s in the middle of changes
// lose nothing: the handlers end with the server's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_disruptions_lose_nothing() {
    let srv = server_of(5, (0..20).map(|i| pod(&format!("p{i:02}"), 0)));
    let informer = builder(&srv).build();
    let handler = Recorder::default();
    informer.add_event_handler(handler.clone()).unwrap();
    informer.start().unwrap();
    informer.wait_for_sync().await;
    for round in 1..=6u64 {
        for i in 0..20 {
            let name = format!("p{i:02}");
            if (i + round) % 7 == 0 {
                srv.delete(&Key::new(&name));
            } else {
                srv.upsert(pod(&name, round)).unwrap();
            }
        }
        match round % 3 {
            0 => srv.close_watches(),
            1 => {
                // Too many writes for the window while no watch is open: 410 on the re-watch.
                srv.close_watches();
                srv.compact();
            }
            _ => srv.expire_next_watches(1),
        }
        tokio::time::sleep(ms(20)).await;
    }
    let expected = server_state(&srv);
    eventually("the server's state", || handler.state() == expected).await;
    informer.shutdown().await;
    assert_eq!(handler.state(), expected);
}

// Mirrors TestSharedInformerErrorHandling: list failures reach the watch error handler and
// the informer recovers once the server does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_errors_reach_the_error_handler_and_the_informer_recovers() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    srv.fail_next_lists(3);
    let (errors, on_error) = error_log();
    let informer = builder(&srv).watch_error_handler(on_error).build();
    let handler = Recorder::default();
    let registration = informer.add_event_handler(handler.clone()).unwrap();
    informer.start().unwrap();
    registration.wait_for_sync().await;
    assert_eq!(errors.lock().unwrap().len(), 3);
    assert_eq!(handler.calls(), ["add a=1 initial=true"]);
    informer.shutdown().await;
}

// Mirrors TestEventPanics: a handler that panics on one object still gets the next ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_call_is_skipped_and_delivery_goes_on() {
    let srv = server(100);
    let informer = builder(&srv).build();
    let handler = Recorder {
        panic_on: Some("bad".into()),
        ..Recorder::default()
    };
    let registration = informer.add_event_handler(handler.clone()).unwrap();
    informer.start().unwrap();
    informer.wait_for_sync().await;
    srv.upsert(pod("bad", 1)).unwrap();
    srv.upsert(pod("good", 1)).unwrap();
    // Two keys, maybe on two consumers: either may come first.
    eventually("good and bad", || {
        handler.calls().len() == 1 && registration.panics() == 1
    })
    .await;
    assert_eq!(handler.calls(), ["add good=1 initial=false"]);
    informer.shutdown().await;
}

// No client-go counterpart (a panic there ends the process): an index function that panics
// stops the informer, which says why, instead of leaving it half-working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_index_function_stops_the_informer_and_says_why() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    let picky: IndexFunc<Pod> = Arc::new(|p: &Pod| {
        assert!(p.value != 13, "unlucky pod");
        [Key::new("all")].into_iter().collect()
    });
    let informer = builder(&srv)
        .consumers(1)
        .indexers(vec![("picky".to_string(), picky)])
        .build();
    informer.start().unwrap();
    informer.wait_for_sync().await;
    assert!(informer.failure().is_none());
    srv.upsert(pod("b", 13)).unwrap();
    eventually("the failure", || informer.failure().is_some()).await;
    assert!(informer.failure().unwrap().contains("unlucky pod"));
    eventually("the watch to close", || srv.open_watches() == 0).await;
    informer.shutdown().await;
}

// Mirrors TestShutdown, TestAddOnStoppedSharedInformer and TestShutDownEventHandler_Lifecycles:
// shutdown stops the reflector, delivers what was buffered, ends every thread, and then the
// informer takes no handler and cannot start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_delivers_what_was_buffered_then_refuses_handlers() {
    let srv = server(100);
    let informer = builder(&srv).build();
    let (gate, slow, registration) = gated_handler(&informer);
    informer.start().unwrap();
    informer.wait_for_sync().await;
    upsert_pods(&srv, 10, 0, 1);
    eventually("the store", || informer.store().len() == 10).await;
    // The handler is held at the gate until shutdown has begun, so shutdown has buffered
    // notifications to deliver.
    tokio::join!(informer.shutdown(), async {
        eventually("shutdown to begin", || informer.is_stopped()).await;
        gate.open();
    });
    assert_eq!(
        slow.calls().len(),
        10,
        "buffered notifications were delivered"
    );
    assert!(registration.is_stopped());
    assert_eq!(srv.open_watches(), 0);
    assert!(matches!(
        informer.add_event_handler(Recorder::default()),
        Err(InformerError::Stopped)
    ));
    assert!(matches!(informer.start(), Err(InformerError::Stopped)));
}

// Handlers see each key's notifications in order even with several consumers and shards:
// versions of one key only grow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_keys_notifications_arrive_in_order_with_several_consumers() {
    #[derive(Clone, Default)]
    struct Order(Arc<Mutex<BTreeMap<String, u64>>>, Arc<AtomicUsize>);
    impl EventHandler<Pod> for Order {
        fn on_add(&mut self, obj: &Arc<Pod>, _: bool) {
            self.on_update(obj, obj);
        }
        fn on_update(&mut self, _: &Arc<Pod>, new: &Arc<Pod>) {
            let mut last = self.0.lock().unwrap();
            let prev = last.insert(new.name.clone(), new.rv_number()).unwrap_or(0);
            if prev > new.rv_number() {
                self.1.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let srv = server(100_000);
    let informer = builder(&srv).consumers(4).shards(8).build();
    let order = Order::default();
    informer.add_event_handler(order.clone()).unwrap();
    informer.start().unwrap();
    informer.wait_for_sync().await;
    for i in 0..20_000u64 {
        srv.upsert(pod(&format!("k{}", i % 50), i)).unwrap();
    }
    let last = srv.resource_version();
    eventually("the last write", || {
        order
            .0
            .lock()
            .unwrap()
            .values()
            .max()
            .map(|v| v.to_string())
            == Some(last.clone())
    })
    .await;
    informer.shutdown().await;
    assert_eq!(
        order.1.load(Ordering::Relaxed),
        0,
        "a key went back in time"
    );
}

/// Records the order of notifications as `name` (resyncs as `sync name`); holds the consumer
/// at the door while it delivers `hold`.
#[derive(Clone)]
struct OrderRecorder {
    order: Arc<Mutex<Vec<String>>>,
    hold: Arc<Gate>,
    /// Set when the consumer reaches the door.
    at_door: Arc<std::sync::atomic::AtomicBool>,
}

impl EventHandler<Pod> for OrderRecorder {
    fn on_add(&mut self, obj: &Arc<Pod>, _initial: bool) {
        self.order.lock().unwrap().push(obj.name.clone());
    }
    fn on_update(&mut self, old: &Arc<Pod>, new: &Arc<Pod>) {
        if old.rv == new.rv {
            self.order
                .lock()
                .unwrap()
                .push(format!("sync {}", new.name));
            return;
        }
        if new.name == "hold" {
            self.at_door.store(true, Ordering::SeqCst);
            self.hold.wait();
        }
        self.order.lock().unwrap().push(new.name.clone());
    }
    fn on_delete(&mut self, _obj: &DeltaObject<Pod>) {}
}

/// What an inline handler hears after a resync of 50 pods queued while the consumer was busy,
/// then a live change: with `resync_last`, the change first.
async fn order_after_a_resync(resync_last: bool) -> Vec<String> {
    let srv = server(100);
    for n in 0..50 {
        srv.upsert(pod(&format!("p{n:02}"), 1)).unwrap();
    }
    srv.upsert(pod("hold", 1)).unwrap();
    let informer = builder(&srv)
        .shards(1)
        .consumers(1)
        .batch(1)
        .resync_period(Duration::from_secs(1))
        .resync_last(resync_last)
        .build();
    let recorder = OrderRecorder {
        order: Arc::default(),
        hold: Arc::default(),
        at_door: Arc::default(),
    };
    informer
        .add_event_handler_with(recorder.clone(), HandlerOptions::new().inline())
        .unwrap();
    informer.start().unwrap();
    frozen_until("the first list", || informer.has_synced()).await;
    frozen_until("the initial adds", || {
        recorder.order.lock().unwrap().len() == 51
    })
    .await;
    recorder.order.lock().unwrap().clear();
    // The consumer stops in the handler, delivering `hold`'s update...
    srv.upsert(pod("hold", 2)).unwrap();
    frozen_until("the consumer at the door", || {
        recorder.at_door.load(Ordering::SeqCst)
    })
    .await;
    // ...while a resync queues every key and a live change arrives.
    tokio::time::advance(Duration::from_secs(1)).await;
    frozen_until("the resync", || informer.queued_keys() == 51).await;
    srv.upsert(pod("live", 1)).unwrap();
    frozen_until("the live change", || informer.queued_keys() == 52).await;
    recorder.hold.open();
    frozen_until("every notification", || {
        recorder.order.lock().unwrap().len() >= 53 && informer.queued_keys() == 0
    })
    .await;
    informer.shutdown().await;
    let order = recorder.order.lock().unwrap().clone();
    assert_eq!(order.len(), 53, "hold, 51 resyncs and live: {order:?}");
    order
}

// No client-go counterpart: client-go has one FIFO, and `resync_last` is kcache's.
#[tokio::test(start_paused = true)]
async fn with_resync_last_a_live_change_passes_a_resync() {
    let order = order_after_a_resync(true).await;
    assert_eq!(order[..2], ["hold", "live"], "{order:?}");
    assert!(
        order[2..].iter().all(|n| n.starts_with("sync ")),
        "{order:?}"
    );
    // Without it, client-go's order: the change waits behind all 51 resynced keys.
    let order = order_after_a_resync(false).await;
    assert_eq!(order[0], "hold", "{order:?}");
    assert_eq!(order[52], "live", "{order:?}");
}
