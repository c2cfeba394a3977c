//! The controller runtime end to end against the in-memory server: nothing lost, one worker
//! per key, retries with backoff and requeues on a fake clock, graceful shutdown, secondary
//! objects mapped to their owners, priorities, panics, the async form. Informers and workers
//! run on threads, so these tests wait for conditions with a deadline; the workqueue's delays
//! run on a fake clock that only the test moves.

mod informer_common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use informer_common::{key_fn, pod, server, Pod};
use kcache::controller::{
    Action, Controller, ControllerQueue, Owned, Priority, Request, LOW_PRIORITY, NORMAL_PRIORITY,
};
use kcache::informer::SharedInformer;
use kcache::workqueue::{
    DelayingQueue, ExponentialFailureRateLimiter, FakeClock, NotProcessing, QueueConfig,
    RateLimitingQueue, ReferenceQueue, ShardedQueue, ShutDown, TryGet, WaitSlot, WorkQueue,
};
use kcache::{Key, KeyFn};
use kcache_sim::MemoryListerWatcher;

/// Polls `cond` until it holds; fails the test after 20 s of real time.
async fn eventually(what: &str, cond: impl FnMut() -> bool) {
    informer_common::eventually(what, Duration::from_secs(20), cond).await;
}

/// A rate-limiting queue on `clock` with an exponential limiter from `base`.
fn queue_on(clock: &Arc<FakeClock>, base: Duration, shards: usize) -> Arc<dyn ControllerQueue> {
    let config = QueueConfig::new().clock(clock.clone());
    Arc::new(RateLimitingQueue::new(
        DelayingQueue::with_config(ShardedQueue::with_config(shards, &config), &config),
        ExponentialFailureRateLimiter::new(base, Duration::from_secs(1000)),
    ))
}

/// What each key's reconciles saw, for the lost-nothing and exclusivity checks.
#[derive(Default)]
struct Ledger {
    /// Per key: the value the latest reconcile read (`None`: not found), in start order.
    last_seen: Mutex<HashMap<Key, Option<u64>>>,
    in_progress: Mutex<HashMap<Key, bool>>,
    overlaps: AtomicUsize,
    reconciles: AtomicU64,
}

fn record(request: &Request<Pod>, ledger: &Ledger) -> Result<Action, String> {
    let key = request.key().clone();
    if std::mem::replace(
        ledger
            .in_progress
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default(),
        true,
    ) {
        ledger.overlaps.fetch_add(1, Ordering::SeqCst);
    }
    let value = request.object().map(|pod| pod.value);
    ledger.last_seen.lock().unwrap().insert(key.clone(), value);
    std::thread::yield_now();
    ledger.reconciles.fetch_add(1, Ordering::SeqCst);
    ledger.in_progress.lock().unwrap().insert(key, false);
    Ok(Action::Done)
}

/// Churn on `keys` keys from several writers, then: every key's last reconcile read the
/// server's final state (a reconcile started after each key's last event), and no key was
/// ever reconciled by two workers at once.
async fn nothing_lost_no_overlap(queue: Option<Arc<dyn ControllerQueue>>) {
    let srv = server(1 << 20);
    let keys = 200u64;
    for k in 0..keys / 2 {
        srv.upsert(pod(&format!("ns/p{k}"), 0)).unwrap();
    }
    let informer = SharedInformer::builder(srv.clone(), key_fn())
        .consumers(2)
        .build();
    let ledger = Arc::new(Ledger::default());
    let mut builder = Controller::builder(&informer).name("churn").workers(8);
    if let Some(queue) = queue {
        builder = builder.queue(queue);
    }
    let controller = builder.run(record, ledger.clone()).unwrap();
    informer.start().unwrap();
    let writers: Vec<_> = (0..4u64)
        .map(|w| {
            let srv = srv.clone();
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(w);
                for n in 1..=3_000u64 {
                    let k = rng.u64(0..keys);
                    let name = format!("ns/p{k}");
                    if rng.u8(0..10) == 0 {
                        srv.delete(&Key::new(&name));
                    } else {
                        srv.upsert(pod(&name, n * 4 + w)).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let expected: HashMap<Key, Option<u64>> = (0..keys)
        .map(|k| {
            let key = Key::new(&format!("ns/p{k}"));
            let value = srv.get(&key).map(|p| p.value);
            (key, value)
        })
        .collect();
    let converged = || {
        let seen = ledger.last_seen.lock().unwrap();
        controller.is_idle()
            && expected.iter().all(|(key, want)| match seen.get(key) {
                Some(got) => got == want,
                // Never reconciled: only right for a key that never existed.
                None => want.is_none(),
            })
    };
    eventually("every key's final state reconciled", converged).await;
    assert_eq!(
        ledger.overlaps.load(Ordering::SeqCst),
        0,
        "two workers held one key"
    );
    let stats = controller.stats();
    assert_eq!(stats.errors, 0);
    assert_eq!(stats.success, ledger.reconciles.load(Ordering::SeqCst));
    controller.shutdown().await;
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_keys_last_change_is_reconciled_and_never_by_two_workers() {
    nothing_lost_no_overlap(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_on_the_reference_workqueue() {
    let queue: Arc<dyn ControllerQueue> = Arc::new(RateLimitingQueue::new(
        DelayingQueue::new(ReferenceQueue::new()),
        ExponentialFailureRateLimiter::new(Duration::from_millis(1), Duration::from_secs(1)),
    ));
    nothing_lost_no_overlap(Some(queue)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_retried_after_the_limiters_backoff() {
    let srv = server(100);
    srv.upsert(pod("ns/flaky", 1)).unwrap();
    let informer = SharedInformer::builder(srv.clone(), key_fn()).build();
    let clock = Arc::new(FakeClock::new());
    let queue = queue_on(&clock, Duration::from_secs(1), 4);
    let (attempts, rx) = mpsc::channel::<u64>();
    let controller = Controller::builder(&informer)
        .queue(queue.clone())
        .run(
            move |request: &Request<Pod>, attempts: &Mutex<mpsc::Sender<u64>>| {
                attempts.lock().unwrap().send(request.retries()).unwrap();
                if request.retries() < 2 {
                    Err("not yet")
                } else {
                    Ok(Action::Done)
                }
            },
            Arc::new(Mutex::new(attempts)),
        )
        .unwrap();
    informer.start().unwrap();
    let next = || {
        rx.recv_timeout(Duration::from_secs(20))
            .expect("a reconcile")
    };
    assert_eq!(next(), 0, "the first attempt");
    eventually("the first retry to wait", || queue.waiting_len() == 1).await;
    clock.step(Duration::from_millis(999));
    assert_eq!(queue.waiting_len(), 1, "not before the 1 s backoff");
    assert!(rx.try_recv().is_err());
    clock.step(Duration::from_millis(1));
    assert_eq!(next(), 1, "retried after 1 s");
    eventually("the second retry to wait", || queue.waiting_len() == 1).await;
    clock.step(Duration::from_millis(1999));
    assert_eq!(queue.waiting_len(), 1, "the backoff doubled to 2 s");
    clock.step(Duration::from_millis(1));
    assert_eq!(next(), 2, "retried after 2 s, and succeeds");
    eventually("the success to forget the failures", || {
        controller.stats().success == 1
    })
    .await;
    assert_eq!(queue.num_requeues(&Key::new("ns/flaky")), 0, "forgotten");
    let stats = controller.stats();
    assert_eq!((stats.errors, stats.success), (2, 1));
    controller.shutdown().await;
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requeue_after_reconciles_again_after_the_delay() {
    let srv = server(100);
    srv.upsert(pod("ns/periodic", 1)).unwrap();
    let informer = SharedInformer::builder(srv.clone(), key_fn()).build();
    let clock = Arc::new(FakeClock::new());
    let queue = queue_on(&clock, Duration::from_secs(1), 1);
    let runs = Arc::new(AtomicUsize::new(0));
    let controller = Controller::builder(&informer)
        .queue(queue.clone())
        .run(
            |_: &Request<Pod>, runs: &AtomicUsize| {
                if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                    Ok::<_, String>(Action::RequeueAfter(Duration::from_secs(30)))
                } else {
                    Ok(Action::Done)
                }
            },
            runs.clone(),
        )
        .unwrap();
    informer.start().unwrap();
    eventually("the requeue to wait", || queue.waiting_len() == 1).await;
    clock.step(Duration::from_secs(29));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not before 30 s");
    clock.step(Duration::from_secs(1));
    eventually("the second reconcile", || controller.stats().success == 1).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(controller.stats().requeue_after, 1);
    assert!(controller.is_idle());
    controller.shutdown().await;
    informer.shutdown().await;
}

/// A door a reconcile waits at until the test opens it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cond: Condvar,
    entered: AtomicUsize,
}

impl Gate {
    fn pass(&self) {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cond.wait(open).unwrap();
        }
    }
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cond.notify_all();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_waits_for_reconciles_in_flight_and_starts_no_new_one() {
    let srv = server(100);
    srv.upsert(pod("ns/slow", 1)).unwrap();
    let informer = SharedInformer::builder(srv.clone(), key_fn()).build();
    let gate = Arc::new(Gate::default());
    let finished = Arc::new(AtomicBool::new(false));
    let ctx = (gate.clone(), finished.clone());
    let controller = Controller::builder(&informer)
        .workers(1)
        .run(
            |_: &Request<Pod>, (gate, finished): &(Arc<Gate>, Arc<AtomicBool>)| {
                gate.pass();
                finished.store(true, Ordering::SeqCst);
                Ok::<_, String>(Action::Done)
            },
            Arc::new(ctx),
        )
        .unwrap();
    informer.start().unwrap();
    eventually("the reconcile to start", || {
        gate.entered.load(Ordering::SeqCst) == 1
    })
    .await;
    // Queued behind the reconcile in flight: never reconciled once shutdown has begun.
    srv.upsert(pod("ns/queued", 1)).unwrap();
    eventually("the second key queued", || controller.queue().len() == 1).await;
    let controller = Arc::new(controller);
    let stopping = {
        let controller = controller.clone();
        std::thread::spawn(move || controller.shutdown_blocking())
    };
    eventually("shutdown to begin", || controller.is_stopping()).await;
    assert!(
        !stopping.is_finished(),
        "shutdown waits for the reconcile in flight"
    );
    assert!(!finished.load(Ordering::SeqCst));
    gate.open();
    stopping.join().unwrap();
    assert!(
        finished.load(Ordering::SeqCst),
        "the reconcile in flight finished first"
    );
    let stats = controller.stats();
    assert_eq!(stats.success, 1, "only the reconcile in flight ran");
    assert_eq!(stats.skipped_at_shutdown, 1, "the queued key was left");
    assert_eq!(gate.entered.load(Ordering::SeqCst), 1);
    informer.shutdown().await;
}

/// A secondary object owned by a primary one (a pod of a replica set, say).
#[derive(Debug, Clone)]
struct Child {
    name: String,
    namespace: String,
    owner: Option<String>,
    rv: String,
}

versioned_by_rv_field!(Child);

impl Owned for Child {
    fn owner_namespace(&self) -> &str {
        &self.namespace
    }
    fn for_each_owner(&self, f: &mut dyn FnMut(&str, &str, bool)) {
        if let Some(owner) = &self.owner {
            f("Parent", owner, true);
        }
    }
}

fn child(name: &str, owner: Option<&str>) -> Child {
    Child {
        name: name.to_string(),
        namespace: "ns".to_string(),
        owner: owner.map(str::to_string),
        rv: String::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secondary_change_reconciles_its_owner() {
    let parents = server(100);
    parents.upsert(pod("ns/a", 1)).unwrap();
    parents.upsert(pod("ns/b", 1)).unwrap();
    let child_key: KeyFn<Child> =
        Arc::new(|c: &Child| Ok(Key::new(&format!("{}/{}", c.namespace, c.name))));
    let children = MemoryListerWatcher::new(child_key.clone());
    let primary = SharedInformer::builder(parents.clone(), key_fn()).build();
    let secondary = SharedInformer::builder(children.clone(), child_key).build();
    let counts: Arc<Mutex<HashMap<Key, usize>>> = Arc::default();
    let controller = Controller::builder(&primary)
        .owns(&secondary, "Parent")
        .run(
            |request: &Request<Pod>, counts: &Mutex<HashMap<Key, usize>>| {
                *counts
                    .lock()
                    .unwrap()
                    .entry(request.key().clone())
                    .or_default() += 1;
                Ok::<_, String>(Action::Done)
            },
            counts.clone(),
        )
        .unwrap();
    primary.start().unwrap();
    secondary.start().unwrap();
    controller.wait_for_sync().await;
    let count = |key: &str| {
        counts
            .lock()
            .unwrap()
            .get(&Key::new(key))
            .copied()
            .unwrap_or(0)
    };
    eventually("the initial list reconciled", || {
        count("ns/a") == 1 && count("ns/b") == 1 && controller.is_idle()
    })
    .await;
    children.upsert(child("c1", Some("a"))).unwrap();
    eventually("a's child reconciles a", || count("ns/a") == 2).await;
    // An orphan and another kind's child concern no parent.
    children.upsert(child("c2", None)).unwrap();
    // The child moves to b: both the old and the new owner are reconciled.
    children.upsert(child("c1", Some("b"))).unwrap();
    eventually("the move reconciles both", || {
        count("ns/a") == 3 && count("ns/b") == 2
    })
    .await;
    children.delete(&Key::new("ns/c1"));
    eventually("the deletion reconciles b", || count("ns/b") == 3).await;
    eventually("idle", || controller.is_idle()).await;
    assert_eq!((count("ns/a"), count("ns/b")), (3, 3));
    assert_eq!(controller.registrations().len(), 2);
    controller.shutdown().await;
    primary.shutdown().await;
    secondary.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_object_reconciles_as_not_found() {
    let srv = server(100);
    srv.upsert(pod("ns/gone", 7)).unwrap();
    let informer = SharedInformer::builder(srv.clone(), key_fn()).build();
    let seen: Arc<Mutex<Vec<Option<u64>>>> = Arc::default();
    let controller = Controller::builder(&informer)
        .run(
            |request: &Request<Pod>, seen: &Mutex<Vec<Option<u64>>>| {
                seen.lock().unwrap().push(request.object().map(|p| p.value));
                Ok::<_, String>(Action::Done)
            },
            seen.clone(),
        )
        .unwrap();
    informer.start().unwrap();
    eventually("the first reconcile", || seen.lock().unwrap().len() == 1).await;
    srv.delete(&Key::new("ns/gone"));
    eventually("the deletion reconciled", || {
        seen.lock().unwrap().last() == Some(&None)
    })
    .await;
    assert_eq!(seen.lock().unwrap()[0], Some(7));
    controller.shutdown().await;
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_reconcile_is_an_error_and_is_retried() {
    let srv = server(100);
    srv.upsert(pod("ns/boom", 1)).unwrap();
    let informer = SharedInformer::builder(srv.clone(), key_fn()).build();
    let reported: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = reported.clone();
    let controller = Controller::builder(&informer)
        .rate_limiter(ExponentialFailureRateLimiter::new(
            Duration::from_millis(1),
            Duration::from_millis(1),
        ))
        .on_error(move |key, message| sink.lock().unwrap().push(format!("{key}: {message}")))
        .run(
            |request: &Request<Pod>, _: &()| {
                if request.retries() == 0 {
                    panic!("first try");
                }
                Ok::<_, String>(Action::Done)
            },
            Arc::new(()),
        )
        .unwrap();
    informer.start().unwrap();
    eventually("the retry to succeed", || controller.stats().success == 1).await;
    let stats = controller.stats();
    assert_eq!((stats.errors, stats.panics), (1, 1));
    assert_eq!(
        *reported.lock().unwrap(),
        ["ns/boom: the reconcile panicked: first try"]
    );
    controller.shutdown().await;
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_form_reconciles_and_shuts_down() {
    let srv = server(100);
    for k in 0..20 {
        srv.upsert(pod(&format!("ns/p{k}"), k)).unwrap();
    }
    let informer = SharedInformer::builder(srv.clone(), key_fn()).build();
    let sum = Arc::new(AtomicU64::new(0));
    let controller = Controller::builder(&informer)
        .workers(3)
        .run_async(
            |request: Request<Pod>, sum: Arc<AtomicU64>| async move {
                tokio::task::yield_now().await;
                let value = request.object().map_or(0, |p| p.value);
                sum.fetch_add(value, Ordering::SeqCst);
                Ok::<_, String>(Action::Done)
            },
            sum.clone(),
        )
        .unwrap();
    informer.start().unwrap();
    eventually("every pod reconciled", || controller.stats().success == 20).await;
    assert_eq!(sum.load(Ordering::SeqCst), (0..20).sum::<u64>());
    controller.shutdown().await;
    informer.shutdown().await;
}

#[test]
fn run_async_outside_a_runtime_says_so() {
    let informer = SharedInformer::builder(server(10), key_fn()).build();
    let err = Controller::builder(&informer)
        .run_async(
            |_: Request<Pod>, _: Arc<()>| async { Ok::<_, String>(Action::Done) },
            Arc::new(()),
        )
        .unwrap_err();
    assert!(err.to_string().contains("tokio runtime"), "{err}");
    let err = Controller::builder(&informer)
        .workers(0)
        .run(
            |_: &Request<Pod>, _: &()| Ok::<_, String>(Action::Done),
            Arc::new(()),
        )
        .unwrap_err();
    assert!(err.to_string().contains("at least one worker"), "{err}");
}

/// A queue with priorities in name only: records every add's priority, then adds.
struct Recording {
    inner: Arc<dyn ControllerQueue>,
    adds: Mutex<Vec<(Key, Priority)>>,
}

impl WorkQueue for Recording {
    fn add(&self, item: Key) {
        self.add_with_priority(item, NORMAL_PRIORITY);
    }
    fn get(&self) -> Result<Key, ShutDown> {
        self.inner.get()
    }
    fn try_get(&self) -> TryGet {
        self.inner.try_get()
    }
    fn poll_get(
        &self,
        slot: &mut WaitSlot,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<Key, ShutDown>> {
        self.inner.poll_get(slot, cx)
    }
    fn cancel_get(&self, slot: &mut WaitSlot) {
        self.inner.cancel_get(slot)
    }
    fn done(&self, item: &Key) -> Result<(), NotProcessing> {
        self.inner.done(item)
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn processing_len(&self) -> usize {
        self.inner.processing_len()
    }
    fn shut_down(&self) {
        self.inner.shut_down()
    }
    fn shut_down_with_drain(&self) {
        self.inner.shut_down_with_drain()
    }
    fn shutting_down(&self) -> bool {
        self.inner.shutting_down()
    }
    fn update_unfinished_work(&self) {
        self.inner.update_unfinished_work()
    }
}

impl ControllerQueue for Recording {
    fn add_with_priority(&self, key: Key, priority: Priority) {
        self.adds.lock().unwrap().push((key.clone(), priority));
        self.inner.add_with_priority(key, priority);
    }
    fn add_after(&self, key: Key, delay: Duration) {
        self.inner.add_after(key, delay)
    }
    fn add_rate_limited(&self, key: Key) {
        self.inner.add_rate_limited(key)
    }
    fn forget(&self, key: &Key) {
        self.inner.forget(key)
    }
    fn num_requeues(&self, key: &Key) -> u64 {
        self.inner.num_requeues(key)
    }
    fn waiting_len(&self) -> usize {
        self.inner.waiting_len()
    }
    fn has_priorities(&self) -> bool {
        true
    }
}

/// Polls `cond` until it holds; fails the test after 20 s of real time, never moving tokio's paused clock.
async fn frozen_until(what: &str, cond: impl FnMut() -> bool) {
    informer_common::frozen_until(what, Duration::from_secs(20), cond).await;
}

async fn priorities_of_adds(low_when_unchanged: bool) -> Vec<(Key, Priority)> {
    let srv = server(100);
    srv.upsert(pod("ns/listed", 1)).unwrap();
    let informer = SharedInformer::builder(srv.clone(), key_fn())
        .resync_period(Duration::from_secs(1))
        .build();
    let clock = Arc::new(FakeClock::new());
    let recording = Arc::new(Recording {
        inner: queue_on(&clock, Duration::from_secs(1), 1),
        adds: Mutex::new(Vec::new()),
    });
    let controller = Controller::builder(&informer)
        .queue(recording.clone())
        .low_priority_when_unchanged(low_when_unchanged)
        .run(
            |_: &Request<Pod>, _: &()| Ok::<_, String>(Action::Done),
            Arc::new(()),
        )
        .unwrap();
    informer.start().unwrap();
    let adds = || recording.adds.lock().unwrap().len();
    frozen_until("the initial list's add", || adds() == 1).await;
    srv.upsert(pod("ns/live", 1)).unwrap();
    frozen_until("the live add", || adds() == 2).await;
    srv.delete(&Key::new("ns/live"));
    frozen_until("the deletion's add", || adds() == 3).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    frozen_until("the resync's add", || adds() == 4).await;
    controller.shutdown().await;
    informer.shutdown().await;
    let adds = recording.adds.lock().unwrap().clone();
    adds
}

#[tokio::test(start_paused = true)]
async fn initial_list_and_resync_keys_go_in_at_low_priority() {
    let (listed, live) = (Key::new("ns/listed"), Key::new("ns/live"));
    let adds = priorities_of_adds(true).await;
    assert_eq!(
        adds[..4],
        [
            (listed.clone(), LOW_PRIORITY),
            (live.clone(), NORMAL_PRIORITY),
            (live.clone(), NORMAL_PRIORITY),
            (listed.clone(), LOW_PRIORITY),
        ]
    );
    // While the shutdown waits on the informer's threads the runtime is idle, and the paused
    // clock may jump to the next resync: any later add is one more resync of the listed pod,
    // at the low priority too.
    assert!(
        adds[4..]
            .iter()
            .all(|add| *add == (listed.clone(), LOW_PRIORITY)),
        "{adds:?}"
    );
    assert!(priorities_of_adds(false)
        .await
        .iter()
        .all(|(_, p)| *p == NORMAL_PRIORITY));
}

/// On a queue with priorities, a live change overtakes the initial list's backlog.
async fn a_live_change_passes_the_initial_lists_backlog(queue: Arc<dyn ControllerQueue>) {
    let srv = server(1000);
    for k in 0..50 {
        srv.upsert(pod(&format!("ns/listed-{k:02}"), k)).unwrap();
    }
    let informer = SharedInformer::builder(srv.clone(), key_fn()).build();
    let gate = Arc::new(Gate::default());
    let order: Arc<Mutex<Vec<Key>>> = Arc::default();
    let ctx = Arc::new((gate.clone(), order.clone()));
    let controller = Controller::builder(&informer)
        .queue(queue)
        .workers(1)
        .run(
            |request: &Request<Pod>, (gate, order): &(Arc<Gate>, Arc<Mutex<Vec<Key>>>)| {
                order.lock().unwrap().push(request.key().clone());
                gate.pass();
                Ok::<_, String>(Action::Done)
            },
            ctx,
        )
        .unwrap();
    informer.start().unwrap();
    controller.wait_for_sync().await;
    eventually("one listed key in flight, 49 queued", || {
        gate.entered.load(Ordering::SeqCst) == 1 && controller.queue().len() == 49
    })
    .await;
    srv.upsert(pod("ns/live", 1)).unwrap();
    eventually("the live key queued", || controller.queue().len() == 50).await;
    gate.open();
    eventually("everything reconciled", || controller.stats().success == 51).await;
    let order = order.lock().unwrap().clone();
    assert_eq!(order[1], Key::new("ns/live"), "{order:?}");
    controller.shutdown().await;
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_sharded_priority_queue_a_live_change_goes_first() {
    let queue = Arc::new(kcache::workqueue::priority::ShardedPriorityQueue::new(4));
    a_live_change_passes_the_initial_lists_backlog(queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_reference_priority_queue_a_live_change_goes_first() {
    let queue = Arc::new(kcache::workqueue::priority::ReferencePriorityQueue::new());
    a_live_change_passes_the_initial_lists_backlog(queue).await;
}

/// The nice value and name of every thread of this process (procfs).
#[cfg(target_os = "linux")]
fn threads_nice() -> Vec<(String, i32)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue; // the thread ended meanwhile
        };
        let (open, close) = (stat.find('(').unwrap(), stat.rfind(')').unwrap());
        let name = stat[open + 1..close].to_string();
        // Fields after the name: state is field 3, nice is field 19.
        let nice = stat[close + 2..]
            .split(' ')
            .nth(16)
            .unwrap()
            .parse()
            .unwrap();
        out.push((name, nice));
    }
    out
}

// `worker_nice`: every worker thread runs at the asked nice value, and only they do.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_nice_lowers_the_workers_and_nothing_else() {
    let srv = server(100);
    srv.upsert(pod("ns/a", 1)).unwrap();
    let informer = SharedInformer::builder(srv.clone(), key_fn()).build();
    let base = threads_nice()
        .iter()
        .map(|(_, nice)| *nice)
        .max()
        .unwrap_or(0);
    // Raised by up to 7 (nice values end at 19). Run at 19 already, the workers can only stay
    // there, and the check below is then only that `run` accepted the request.
    let wanted = (base + 7).min(19);
    let reconciled = Arc::new(AtomicUsize::new(0));
    let controller = Controller::builder(&informer)
        .workers(3)
        .worker_nice(wanted)
        .run(
            |_: &Request<Pod>, n: &AtomicUsize| {
                n.fetch_add(1, Ordering::SeqCst);
                Ok::<_, String>(Action::Done)
            },
            reconciled.clone(),
        )
        .unwrap();
    informer.start().unwrap();
    eventually("the reconcile", || reconciled.load(Ordering::SeqCst) == 1).await;
    // Other tests run in this process at the same time, their workers at the base value:
    // exactly this controller's three threads run at the lowered one.
    let threads = threads_nice();
    let lowered: Vec<_> = threads.iter().filter(|(_, nice)| *nice == wanted).collect();
    if wanted == base {
        assert!(lowered.len() >= 3, "{threads:?}");
        controller.shutdown().await;
        informer.shutdown().await;
        return;
    }
    assert_eq!(lowered.len(), 3, "{threads:?}");
    assert!(
        lowered
            .iter()
            .all(|(name, _)| name.starts_with("kcache-reconcil")),
        "{threads:?}"
    );
    controller.shutdown().await;
    informer.shutdown().await;
}
