//! The hand-off from the consumers to the handler registrations: batches, bounded buffers with
//! back-pressure, the lag report, and the three kinds of registration (a delivery thread,
//! inline on the consumers, an async task). Consumers and handlers run on threads, so these
//! tests use the real clock and wait for conditions with a deadline; handlers that must hold
//! still wait on a [`Permits`] the test hands out, never on a sleep.
#![cfg(feature = "informer")]

mod informer_common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use informer_common::{key_fn, ms, pod, server, upsert_pods, Pod};
use kcache::informer::{
    AsyncEventHandler, Backoff, HandlerOptions, Lag, Registration, SharedInformer,
    SharedInformerBuilder,
};
use kcache::{DeltaObject, DeltaQueue, EventHandler, Indexer, Key};
use kcache_sim::MemoryListerWatcher;

/// Registers a handler that takes a [`Permits`] per call (none handed out yet) behind a buffer
/// of `buffer`, then starts `informer` and waits for its sync.
async fn start_with_held<Q: DeltaQueue<Pod> + 'static, I: Indexer<Pod> + 'static>(
    informer: &SharedInformer<Pod, MemoryListerWatcher<Pod>, Q, I>,
    buffer: usize,
) -> (Arc<Permits>, Log, Registration) {
    let permits = Arc::new(Permits::default());
    let held = Log::permitted(&permits);
    let reg = informer
        .add_event_handler_with(held.clone(), HandlerOptions::new().buffer(buffer))
        .unwrap();
    informer.start().unwrap();
    informer.wait_for_sync().await;
    (permits, held, reg)
}

/// Polls `cond` until it holds; fails the test after 20 s on tokio's clock.
async fn eventually(what: &str, cond: impl FnMut() -> bool) {
    informer_common::eventually_on_tokio_clock(what, Duration::from_secs(20), cond).await;
}

/// Calls a handler may make: it takes one per call and waits while there are none.
#[derive(Default)]
struct Permits {
    left: Mutex<u64>,
    cond: Condvar,
}

impl Permits {
    fn take(&self) {
        let mut left = self.left.lock().unwrap();
        while *left == 0 {
            left = self.cond.wait(left).unwrap();
        }
        *left -= 1;
    }
    fn grant(&self, n: u64) {
        *self.left.lock().unwrap() += n;
        self.cond.notify_all();
    }
}

/// Records, per key, every notification in the order it came, and how many calls in all.
#[derive(Clone, Default)]
struct Log {
    per_key: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    calls: Arc<AtomicUsize>,
    /// If set, each call first takes a permit.
    permits: Option<Arc<Permits>>,
    /// If set, each call first spins this long.
    cost: Duration,
}

impl Log {
    fn permitted(permits: &Arc<Permits>) -> Self {
        Self {
            permits: Some(Arc::clone(permits)),
            ..Self::default()
        }
    }
    fn costly(cost: Duration) -> Self {
        Self {
            cost,
            ..Self::default()
        }
    }
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
    fn per_key(&self) -> BTreeMap<String, Vec<String>> {
        self.per_key.lock().unwrap().clone()
    }
    fn record(&self, name: &str, what: String) {
        if let Some(permits) = &self.permits {
            permits.take();
        }
        let start = Instant::now();
        while start.elapsed() < self.cost {
            std::hint::spin_loop();
        }
        self.per_key
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .push(what);
        self.calls.fetch_add(1, Ordering::SeqCst);
    }
    /// Each key's notifications, checked in order: values only grow, adds and deletes
    /// alternate, and every update continues from the last value seen.
    fn check_order(&self) {
        for (key, calls) in self.per_key() {
            let mut last: Option<u64> = None;
            for call in &calls {
                let (kind, value) = call.split_once(' ').unwrap();
                let value: u64 = value.parse().unwrap();
                match (kind, last) {
                    ("add", None) => {}
                    ("update", Some(had)) if value > had => {}
                    ("delete", Some(had)) if value == had => {}
                    _ => panic!("{key}: {call} after {last:?}: {calls:?}"),
                }
                last = (kind != "delete").then_some(value);
            }
        }
    }
}

impl EventHandler<Pod> for Log {
    fn on_add(&mut self, obj: &Arc<Pod>, _initial: bool) {
        self.record(&obj.name, format!("add {}", obj.value));
    }
    fn on_update(&mut self, _old: &Arc<Pod>, new: &Arc<Pod>) {
        self.record(&new.name, format!("update {}", new.value));
    }
    fn on_delete(&mut self, obj: &DeltaObject<Pod>) {
        let last = obj.last_known().expect("deletes carry the last state");
        self.record(&last.name, format!("delete {}", last.value));
    }
}

/// The same log, as an async handler that yields to the runtime in every call.
#[derive(Clone, Default)]
struct AsyncLog(Log);

impl AsyncEventHandler<Pod> for AsyncLog {
    async fn on_add(&mut self, obj: Arc<Pod>, _initial: bool) {
        tokio::task::yield_now().await;
        self.0.record(&obj.name, format!("add {}", obj.value));
    }
    async fn on_update(&mut self, _old: Arc<Pod>, new: Arc<Pod>) {
        tokio::task::yield_now().await;
        self.0.record(&new.name, format!("update {}", new.value));
    }
    async fn on_delete(&mut self, obj: DeltaObject<Pod>) {
        tokio::task::yield_now().await;
        let last = obj.last_known().expect("deletes carry the last state");
        self.0.record(&last.name, format!("delete {}", last.value));
    }
}

fn builder(srv: &MemoryListerWatcher<Pod>) -> SharedInformerBuilder<Pod, MemoryListerWatcher<Pod>> {
    let quick = Backoff {
        initial: ms(5),
        max: ms(50),
        ..Backoff::default()
    };
    SharedInformer::builder(srv.clone(), key_fn()).backoff(quick)
}

/// A lag handler that counts its reports.
fn lag_counter() -> (Arc<Mutex<Vec<Lag>>>, kcache::informer::LagHandler) {
    let lags = Arc::new(Mutex::new(Vec::new()));
    let handler = {
        let lags = Arc::clone(&lags);
        Arc::new(move |lag: &Lag| lags.lock().unwrap().push(lag.clone()))
    };
    (lags, handler)
}

/// Writes `rounds` rounds over `keys` keys: each key is created, updated, and every third
/// one deleted and created again, so per-key order matters.
fn churn(srv: &MemoryListerWatcher<Pod>, keys: usize, rounds: u64) {
    for round in 0..rounds {
        for k in 0..keys {
            let name = format!("k{k:03}");
            let value = round * 10 + 1;
            srv.upsert(pod(&name, value)).unwrap();
            srv.upsert(pod(&name, value + 1)).unwrap();
            if k % 3 == 0 {
                srv.delete(&Key::new(&name)).unwrap();
                srv.upsert(pod(&name, value + 2)).unwrap();
            }
        }
    }
}

async fn every_kind_gets_every_notification_in_order<Q, I>(
    informer: SharedInformer<Pod, MemoryListerWatcher<Pod>, Q, I>,
    srv: MemoryListerWatcher<Pod>,
) where
    Q: DeltaQueue<Pod> + 'static,
    I: Indexer<Pod> + 'static,
{
    let (thread, inline, task) = (Log::default(), Log::default(), AsyncLog::default());
    let regs = [
        informer.add_event_handler(thread.clone()).unwrap(),
        informer.add_event_handler_inline(inline.clone()).unwrap(),
        informer.add_async_event_handler(task.clone()).unwrap(),
    ];
    informer.start().unwrap();
    churn(&srv, 50, 20);
    let expected: BTreeMap<String, u64> = srv
        .objects()
        .iter()
        .map(|p| (p.name.clone(), p.value))
        .collect();
    let last_values = |log: &Log| -> BTreeMap<String, u64> {
        log.per_key()
            .into_iter()
            .filter_map(|(k, calls)| {
                let last = calls.last()?;
                let (kind, v) = last.split_once(' ')?;
                (kind != "delete").then(|| (k, v.parse().unwrap()))
            })
            .collect()
    };
    for (name, log) in [("thread", &thread), ("inline", &inline), ("async", &task.0)] {
        eventually(&format!("the {name} handler to catch up"), || {
            last_values(log) == expected
        })
        .await;
    }
    informer.shutdown().await;
    // Exactly once and in order: every kind saw the same calls per key, in a valid order.
    thread.check_order();
    assert_eq!(thread.per_key(), inline.per_key(), "inline");
    assert_eq!(thread.per_key(), task.0.per_key(), "async");
    for reg in &regs {
        assert!(reg.has_synced(), "{reg:?}");
        assert!(reg.is_stopped(), "{reg:?}");
        assert_eq!(reg.delivered(), thread.calls() as u64, "{reg:?}");
        assert_eq!(reg.panics(), 0);
    }
    assert_eq!(regs[1].bound(), 0, "inline delivery has no buffer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_gets_every_notification_in_order_with_four_consumers() {
    let srv = server(100_000);
    let informer = builder(&srv).shards(4).consumers(4).batch(8).build();
    every_kind_gets_every_notification_in_order(informer, srv).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_gets_every_notification_in_order_on_the_reference() {
    let srv = server(100_000);
    let informer = builder(&srv).consumers(2).batch(8).build_reference();
    every_kind_gets_every_notification_in_order(informer, srv).await;
}

// Each registration's has_synced waits for its own initial notifications, delivered in
// batches: a held-up thread handler is not synced while the informer and the others are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn has_synced_per_registration_with_batches() {
    let srv = server(1000);
    upsert_pods(&srv, 300, 3, 1);
    let informer = builder(&srv).shards(4).consumers(3).batch(16).build();
    let permits = Arc::new(Permits::default());
    let held = Log::permitted(&permits);
    let (inline, task) = (Log::default(), AsyncLog::default());
    let held_reg = informer.add_event_handler(held.clone()).unwrap();
    let inline_reg = informer.add_event_handler_inline(inline.clone()).unwrap();
    let task_reg = informer.add_async_event_handler(task.clone()).unwrap();
    assert!(!inline_reg.has_synced() && !task_reg.has_synced() && !held_reg.has_synced());
    informer.start().unwrap();
    informer.wait_for_sync().await;
    inline_reg.wait_for_sync().await;
    assert_eq!(inline.calls(), 300, "inline: synced means delivered");
    task_reg.wait_for_sync().await;
    assert_eq!(task.0.calls(), 300, "async: synced means delivered");
    assert!(!held_reg.has_synced(), "{held_reg:?}");
    permits.grant(299);
    eventually("299 calls", || held.calls() == 299).await;
    assert!(!held_reg.has_synced(), "one initial add is still pending");
    permits.grant(1);
    held_reg.wait_for_sync().await;
    assert_eq!(held.calls(), 300);

    // Added late: the synthetic adds count, whatever the kind.
    let late_permits = Arc::new(Permits::default());
    let late = Log::permitted(&late_permits);
    let late_reg = informer.add_event_handler(late.clone()).unwrap();
    let late_inline = Log::default();
    let late_inline_reg = informer
        .add_event_handler_inline(late_inline.clone())
        .unwrap();
    assert!(late_inline_reg.has_synced());
    assert_eq!(late_inline.calls(), 300);
    let late_task = AsyncLog::default();
    let late_task_reg = informer.add_async_event_handler(late_task.clone()).unwrap();
    late_task_reg.wait_for_sync().await;
    assert_eq!(late_task.0.calls(), 300);
    assert!(!late_reg.has_synced());
    assert_eq!(late_reg.pending(), 300, "the snapshot, waiting for permits");
    late_permits.grant(u64::MAX / 2);
    late_reg.wait_for_sync().await;
    informer.shutdown().await;
}

// A registration far slower than the others (held until the churn has filled its buffer,
// then 100 µs a call), with a small bound: the consumers wait for it, nothing is lost or
// duplicated, its pending count never exceeds the bound, and the fast ones get everything too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_registration_with_a_small_bound_back_pressures_and_loses_nothing() {
    let srv = server(100_000);
    let permits = Arc::new(Permits::default());
    let (lags, lag_handler) = lag_counter();
    let informer = builder(&srv)
        .shards(4)
        .consumers(2)
        .batch(16)
        .lag_handler(lag_handler)
        .build();
    let fast = [
        Log::costly(Duration::from_nanos(100)),
        Log::costly(Duration::from_nanos(100)),
    ];
    let slow = Log {
        cost: Duration::from_micros(100),
        ..Log::permitted(&permits)
    };
    let fast_task = AsyncLog::default();
    let fast_regs = [
        informer.add_event_handler(fast[0].clone()).unwrap(),
        informer.add_event_handler_inline(fast[1].clone()).unwrap(),
        informer.add_async_event_handler(fast_task.clone()).unwrap(),
    ];
    let slow_reg = informer
        .add_event_handler_with(slow.clone(), HandlerOptions::new().name("slow").buffer(32))
        .unwrap();
    assert_eq!(slow_reg.bound(), 32);
    assert_eq!(slow_reg.name(), "slow");
    informer.start().unwrap();
    // The churn comes through the watch, after the (empty) initial list, while the slow
    // handler holds its first call: its buffer fills, and the consumers must wait for it.
    fast_regs[0].wait_for_sync().await;
    churn(&srv, 40, 10);
    eventually("the held handler's buffer to fill", || {
        slow_reg.pending() == slow_reg.bound()
    })
    .await;
    permits.grant(u64::MAX / 2);
    let final_rv = srv.resource_version();
    eventually("the informer to catch up", || {
        informer.last_sync_resource_version() == final_rv && informer.queued_keys() == 0
    })
    .await;
    informer.shutdown().await;

    slow.check_order();
    for log in [&fast[0], &fast[1], &fast_task.0] {
        assert_eq!(log.per_key(), slow.per_key());
    }
    assert!(slow_reg.peak_pending() <= 32, "{slow_reg:?}");
    assert!(slow_reg.peak_pending() > 0);
    assert!(
        slow_reg.waits() > 0,
        "the consumers waited for it: {slow_reg:?}"
    );
    assert!(slow_reg.waited() > Duration::ZERO);
    assert_eq!(slow_reg.pending(), 0);
    let lags = lags.lock().unwrap();
    assert!(!lags.is_empty(), "a full buffer is reported");
    assert!(lags
        .iter()
        .all(|l| l.name == "slow" && l.bound == 32 && l.pending == 32));
    for reg in &fast_regs {
        assert_eq!(reg.delivered(), slow_reg.delivered());
    }
}

/// Each key's last state in a log: its value, or `None` if its last call was a deletion.
fn final_view(log: &Log) -> BTreeMap<String, Option<u64>> {
    log.per_key()
        .into_iter()
        .map(|(key, calls)| {
            let (kind, value) = calls.last().unwrap().split_once(' ').unwrap();
            (key, (kind != "delete").then(|| value.parse().unwrap()))
        })
        .collect()
}

/// A coalescing handler's calls per key: a subsequence of what it would have heard, in order.
/// Adds and deletes alternate, values only grow (a deletion carries the deleted state, which
/// may be newer than the last one heard), and every update continues from the last value heard.
fn check_coalesced_order(log: &Log) {
    for (key, calls) in log.per_key() {
        let mut last: Option<u64> = None;
        let mut floor = 0;
        for call in &calls {
            let (kind, value) = call.split_once(' ').unwrap();
            let value: u64 = value.parse().unwrap();
            assert!(value >= floor, "{key}: {call} went back: {calls:?}");
            match (kind, last) {
                ("add", None) => {}
                ("update", Some(had)) if value > had => {}
                ("delete", Some(had)) if value >= had => {}
                _ => panic!("{key}: {call} after {last:?}: {calls:?}"),
            }
            floor = value;
            last = (kind != "delete").then_some(value);
        }
    }
}

// The same slow registration, coalescing: its delivery takes in what arrives between calls, so
// it ends with every key's final state, heard in order, having skipped only intermediate
// states, and its table never holds more than one entry per key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_registration_that_coalesces_skips_only_intermediate_states() {
    let srv = server(100_000);
    let informer = builder(&srv).shards(4).consumers(2).batch(16).build();
    let fast = Log::costly(Duration::from_nanos(100));
    // 100 µs a call against thousands of changes through the watch: it lags, and merges.
    let slow = Log::costly(Duration::from_micros(100));
    let fast_reg = informer.add_event_handler(fast.clone()).unwrap();
    let slow_reg = informer
        .add_event_handler_with(
            slow.clone(),
            HandlerOptions::new().name("slow").buffer(32).coalesce(),
        )
        .unwrap();
    // Keys that exist before the start: their initial-list adds may be merged too, and the
    // registration must still report itself synced.
    for k in 0..40 {
        srv.upsert(pod(&format!("k{k:03}"), 0)).unwrap();
    }
    informer.start().unwrap();
    fast_reg.wait_for_sync().await;
    // After the initial list, so the changes come through the watch (a churn racing the
    // list could be listed whole, leaving the handler nothing to lag behind).
    churn(&srv, 40, 20);
    let final_rv = srv.resource_version();
    eventually("the informer to catch up", || {
        informer.last_sync_resource_version() == final_rv && informer.queued_keys() == 0
    })
    .await;
    eventually("the slow handler to catch up", || {
        slow_reg.pending() == 0 && slow_reg.delivered() + slow_reg.merged() == fast_reg.delivered()
    })
    .await;
    assert!(slow_reg.has_synced(), "{slow_reg:?}");
    informer.shutdown().await;

    fast.check_order();
    check_coalesced_order(&slow);
    assert_eq!(final_view(&slow), final_view(&fast), "the same final state");
    assert!(slow_reg.merged() > 0, "it lagged and merged: {slow_reg:?}");
    assert!(slow.calls() < fast.calls());
    assert_eq!(slow.calls() as u64, slow_reg.delivered());
    assert!(slow_reg.peak_coalesced_keys() <= 40, "{slow_reg:?}");
    assert!(slow_reg.peak_pending() <= 32, "{slow_reg:?}");
}

// A coalescing async handler: the same rules on a task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_handler_that_coalesces_ends_with_the_final_state() {
    let srv = server(100_000);
    let informer = builder(&srv).shards(4).consumers(2).batch(16).build();
    let fast = Log::default();
    let slow = AsyncLog::default();
    let fast_reg = informer.add_event_handler(fast.clone()).unwrap();
    let slow_reg = informer
        .add_async_event_handler_with(slow.clone(), HandlerOptions::new().coalesce())
        .unwrap();
    informer.start().unwrap();
    churn(&srv, 40, 20);
    let final_rv = srv.resource_version();
    eventually("everyone to catch up", || {
        informer.last_sync_resource_version() == final_rv
            && informer.queued_keys() == 0
            && slow_reg.pending() == 0
            && slow_reg.delivered() + slow_reg.merged() == fast_reg.delivered()
    })
    .await;
    informer.shutdown().await;
    check_coalesced_order(&slow.0);
    assert_eq!(final_view(&slow.0), final_view(&fast));
}

// The lag report comes once per episode: when the buffer first fills, not again while it
// stays behind, and again only after it has drained completely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_hook_fires_once_per_episode() {
    let srv = server(1000);
    let (lags, lag_handler) = lag_counter();
    let informer = builder(&srv).batch(1).lag_handler(lag_handler).build();
    let (permits, held, reg) = start_with_held(&informer, 4).await;
    upsert_pods(&srv, 10, 0, 1);
    eventually("the first report", || lags.lock().unwrap().len() == 1).await;
    assert_eq!(reg.pending(), 4);
    // Calls made one at a time: the buffer fills again and again, still one episode. The
    // next call is allowed only once the consumer has filled the buffer again (or handed
    // everything over): otherwise a consumer held off the CPU could let the handler drain
    // it, which would rightly end the episode, and the count would depend on scheduling.
    for n in 1..=10 {
        permits.grant(1);
        eventually("one more call", || held.calls() == n).await;
        let refilled = 4.min(10 - n);
        eventually("the consumer to fill the buffer again", || {
            reg.pending() == refilled
        })
        .await;
    }
    eventually("the buffer to drain", || reg.pending() == 0).await;
    assert_eq!(lags.lock().unwrap().len(), 1, "one episode, one report");
    upsert_pods(&srv, 10, 0, 2);
    eventually("the second report", || lags.lock().unwrap().len() == 2).await;
    permits.grant(10);
    eventually("every call", || held.calls() == 20).await;
    assert!(reg.peak_pending() <= 4);
    informer.shutdown().await;
}

// A consumer blocked on a full buffer does not keep the registration from being removed:
// removal wakes it, and the other handlers go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removal_while_a_consumer_is_blocked_on_a_full_buffer_does_not_deadlock() {
    let srv = server(1000);
    let (lags, lag_handler) = lag_counter();
    let informer = Arc::new(
        builder(&srv)
            .consumers(2)
            .batch(4)
            .lag_handler(lag_handler)
            .build(),
    );
    let permits = Arc::new(Permits::default());
    let stuck = Log::permitted(&permits);
    let kept = Log::default();
    let reg = informer
        .add_event_handler_with(stuck.clone(), HandlerOptions::new().buffer(2))
        .unwrap();
    informer.add_event_handler(kept.clone()).unwrap();
    informer.start().unwrap();
    informer.wait_for_sync().await;
    upsert_pods(&srv, 20, 2, 1);
    eventually("the stuck buffer to fill", || {
        lags.lock().unwrap().len() == 1
    })
    .await;
    let removed = {
        let (informer, reg) = (Arc::clone(&informer), Arc::new(reg));
        let handle = tokio::task::spawn_blocking(move || informer.remove_event_handler(&reg));
        tokio::time::timeout(Duration::from_secs(20), handle)
            .await
            .expect("removal returns")
            .unwrap()
    };
    assert!(removed);
    eventually("the kept handler", || kept.calls() == 20).await;
    assert_eq!(informer.handler_count(), 1);
    permits.grant(u64::MAX / 2);
    informer.shutdown().await;
    assert!(stuck.calls() <= 1, "at most the call it was held in");
}

// Shutdown while a consumer waits on a full buffer completes once the handler moves, and
// every change the store took reached the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_full_buffer_delivers_everything_and_returns() {
    let srv = server(1000);
    let (lags, lag_handler) = lag_counter();
    let informer = Arc::new(builder(&srv).consumers(2).lag_handler(lag_handler).build());
    let (permits, held, reg) = start_with_held(&informer, 2).await;
    upsert_pods(&srv, 200, 3, 1);
    eventually("the buffer to fill", || !lags.lock().unwrap().is_empty()).await;
    assert_eq!(reg.pending(), 2);
    let shutdown = {
        let informer = Arc::clone(&informer);
        tokio::spawn(async move { informer.shutdown().await })
    };
    permits.grant(u64::MAX / 2);
    tokio::time::timeout(Duration::from_secs(30), shutdown)
        .await
        .expect("shutdown returns")
        .unwrap();
    assert!(held.calls() >= 3);
    assert_eq!(
        held.calls(),
        informer.store().len(),
        "the store's every key"
    );
    held.check_order();
    assert!(reg.is_stopped());
    assert!(reg.peak_pending() <= 2);
}

// Dropped without a shutdown while a consumer waits on a handler that never returns: the
// drop does not wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_informer_with_a_stuck_full_buffer_returns() {
    let srv = server(1000);
    let (lags, lag_handler) = lag_counter();
    let informer = builder(&srv).lag_handler(lag_handler).build();
    let permits = Arc::new(Permits::default());
    let reg = informer
        .add_event_handler_with(Log::permitted(&permits), HandlerOptions::new().buffer(1))
        .unwrap();
    informer.start().unwrap();
    informer.wait_for_sync().await;
    upsert_pods(&srv, 10, 0, 1);
    eventually("the buffer to fill", || !lags.lock().unwrap().is_empty()).await;
    let dropped = tokio::task::spawn_blocking(move || drop(informer));
    tokio::time::timeout(Duration::from_secs(20), dropped)
        .await
        .expect("the drop returns")
        .unwrap();
    // Let the delivery thread go; it ends once it has delivered what was buffered.
    permits.grant(u64::MAX / 2);
    reg.stopped().await;
}

// Async handlers: a panicking call is counted and delivery goes on; the task runs on the
// informer's runtime, spawned at the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_handler_that_panics_is_counted_and_goes_on() {
    struct Picky(Arc<Mutex<Vec<String>>>);
    impl AsyncEventHandler<Pod> for Picky {
        async fn on_add(&mut self, obj: Arc<Pod>, _initial: bool) {
            tokio::task::yield_now().await;
            assert_ne!(obj.name, "bad", "refuses bad");
            self.0.lock().unwrap().push(obj.name.clone());
        }
    }
    let srv = server(1000);
    for name in ["a", "bad", "c"] {
        srv.upsert(pod(name, 1)).unwrap();
    }
    let informer = builder(&srv).build();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let reg = informer
        .add_async_event_handler(Picky(Arc::clone(&seen)))
        .unwrap();
    assert!(!reg.is_stopped(), "waits for the start");
    informer.start().unwrap();
    reg.wait_for_sync().await;
    assert_eq!(reg.panics(), 1);
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(seen, ["a", "c"]);
    informer.shutdown().await;
    assert!(reg.is_stopped());
}
