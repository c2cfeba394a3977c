//! The version a shared informer's store has applied (client-go 1.36's
//! `LastStoreSyncResourceVersion`, docs/informer.md "The applied version"): never ahead of the
//! store, so a list's version is not reported while any of the list's objects is missing from
//! it, unlike the reflector's last synced version.
//!
//! A handler that runs inline on the consumer holds the consumer at a chosen notification, so
//! each test looks at the informer *between* two keys of one list, whatever the scheduling.

mod informer_common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use informer_common::{eventually, key_fn, ms, pod, server, server_of, upsert_pods, Gate, Pod};
use kcache::informer::{Backoff, SharedInformer, VersionWait};
use kcache::{DeltaObject, EventHandler, Key};
use kcache_sim::MemoryListerWatcher;

/// An inline handler that, once armed, stops the consumer at its `stop_at`-th notification:
/// it tells the test (`stopped`) and waits at the gate.
struct Holder {
    armed: Arc<Mutex<Option<usize>>>,
    gate: Arc<Gate>,
    stopped: mpsc::Sender<()>,
}

impl Holder {
    fn notified(&mut self) {
        let mut armed = self.armed.lock().unwrap();
        let Some(left) = armed.as_mut() else { return };
        *left -= 1;
        if *left == 0 {
            *armed = None;
            drop(armed);
            let _ = self.stopped.send(());
            self.gate.wait();
        }
    }
}

impl EventHandler<Pod> for Holder {
    fn on_add(&mut self, _: &Arc<Pod>, _: bool) {
        self.notified();
    }
    fn on_update(&mut self, _: &Arc<Pod>, _: &Arc<Pod>) {
        self.notified();
    }
    fn on_delete(&mut self, _: &DeltaObject<Pod>) {
        self.notified();
    }
}

struct Held {
    armed: Arc<Mutex<Option<usize>>>,
    gate: Arc<Gate>,
    stopped: mpsc::Receiver<()>,
}

impl Drop for Held {
    /// Lets a held consumer go when a test ends, also by a failed assertion: the informer's
    /// shutdown waits for the consumer's batch, which waits at the gate.
    fn drop(&mut self) {
        self.gate.open();
    }
}

type Informer = SharedInformer<
    Pod,
    MemoryListerWatcher<Pod>,
    kcache::sharded::DeltaFifo<Pod>,
    kcache::sharded::IndexedStore<Pod>,
>;

/// An informer over `srv` that pops one key per batch, with a [`Holder`] armed to stop at the
/// `stop_at`-th notification.
fn held_informer(srv: &MemoryListerWatcher<Pod>, stop_at: usize) -> (Informer, Held) {
    let quick = Backoff {
        initial: ms(1),
        max: ms(5),
        ..Backoff::default()
    };
    let informer = SharedInformer::builder(srv.clone(), key_fn())
        .backoff(quick)
        .shards(4)
        .batch(1)
        .build();
    let (tx, rx) = mpsc::channel();
    let held = Held {
        armed: Arc::new(Mutex::new(Some(stop_at))),
        gate: Arc::new(Gate::default()),
        stopped: rx,
    };
    informer
        .add_event_handler_inline(Holder {
            armed: Arc::clone(&held.armed),
            gate: Arc::clone(&held.gate),
            stopped: tx,
        })
        .unwrap();
    (informer, held)
}

/// Waits (off the runtime's threads) until the holder has stopped the consumer.
async fn until_held(held: &mut Held) {
    let rx = std::mem::replace(&mut held.stopped, mpsc::channel().1);
    let rx = tokio::task::spawn_blocking(move || {
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the consumer reaches the armed notification");
        rx
    })
    .await
    .unwrap();
    held.stopped = rx;
}

/// Bounds a wait that must end: a failure guard, not a timing assertion.
async fn reached(wait: impl std::future::Future<Output = VersionWait>) -> VersionWait {
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .expect("the wait ends")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lists_version_is_applied_only_once_every_listed_object_is_in_the_store() {
    let srv = server(100);
    upsert_pods(&srv, 5, 0, 1);
    let list_version = srv.resource_version();
    let (informer, mut held) = held_informer(&srv, 2);
    informer.start().unwrap();
    until_held(&mut held).await;

    // The consumer stands between the list's second and third keys. The reflector records the
    // list's version once `replace` has returned, which the consumer does not wait for.
    eventually(
        "the reflector to record the list's version",
        Duration::from_secs(10),
        || informer.last_sync_resource_version() == list_version,
    )
    .await;
    assert_eq!(
        informer.store().len(),
        2,
        "two of five listed objects applied"
    );
    assert_eq!(informer.last_store_sync_resource_version(), "");
    assert!(!informer.applied_version().has_reached(&list_version));
    assert_eq!(informer.store().last_store_sync_resource_version(), "");

    held.gate.open();
    let applied = informer.applied_version();
    assert_eq!(
        reached(applied.wait_for(&list_version)).await,
        VersionWait::Reached
    );
    // Reached, so every listed object is in the store, as listed.
    assert_eq!(informer.store().len(), 5);
    for obj in srv.objects() {
        let key = Key::new(&obj.name);
        assert_eq!(informer.store().get_by_key(&key).as_deref(), Some(&*obj));
    }
    assert_eq!(
        informer.store().last_store_sync_resource_version(),
        list_version
    );
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relists_version_waits_for_every_key_of_the_relist() {
    let srv = server_of(3, (0..4).map(|i| pod(&format!("p{i}"), 1)));
    let (informer, mut held) = held_informer(&srv, 1);
    // Disarmed until the informer has synced: the holder lets the initial list through.
    *held.armed.lock().unwrap() = None;
    informer.start().unwrap();
    let first = srv.resource_version();
    assert_eq!(
        reached(informer.applied_version().wait_for(&first)).await,
        VersionWait::Reached
    );

    // Hold the consumer at the next notification; then, with the server down (no watch sees
    // the writes), change every object, add one and forget the window: back up, the
    // reflector's re-watch gets 410 and only a relist can bring `relist`.
    *held.armed.lock().unwrap() = Some(1);
    srv.upsert(pod("p0", 2)).unwrap();
    until_held(&mut held).await;
    srv.set_unavailable(true);
    upsert_pods(&srv, 4, 0, 3);
    srv.upsert(pod("p9", 3)).unwrap();
    srv.compact();
    let relist = srv.resource_version();
    srv.set_unavailable(false);
    // The reflector relists while the consumer is held: queued, not applied.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while informer.last_sync_resource_version() != relist {
        assert!(
            std::time::Instant::now() < deadline,
            "the reflector relists"
        );
        tokio::time::sleep(ms(1)).await;
    }
    let applied = informer.last_store_sync_resource_version();
    assert!(
        applied.parse::<u64>().unwrap() < relist.parse::<u64>().unwrap(),
        "applied {applied} while the relist at {relist} is queued"
    );

    held.gate.open();
    assert_eq!(
        reached(informer.applied_version().wait_for(&relist)).await,
        VersionWait::Reached
    );
    let store = informer.store();
    assert_eq!(store.len(), 5);
    for obj in srv.objects() {
        assert_eq!(
            store.get_by_key(&Key::new(&obj.name)).as_deref(),
            Some(&*obj)
        );
    }
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_a_version_that_never_comes_ends_when_the_informer_stops() {
    let srv = server(100);
    srv.upsert(pod("p0", 1)).unwrap();
    let (informer, _held) = held_informer(&srv, usize::MAX);
    informer.start().unwrap();
    let applied = informer.applied_version();
    assert_eq!(
        reached(applied.wait_for(&srv.resource_version())).await,
        VersionWait::Reached
    );
    let never = applied.clone();
    let waiting = tokio::spawn(async move { never.wait_for("1000000").await });
    informer.shutdown().await;
    assert_eq!(
        reached(async { waiting.await.unwrap() }).await,
        VersionWait::Stopped
    );
    assert_eq!(
        applied.wait_for_blocking("1000000", None),
        VersionWait::Stopped
    );
}
