//! A controller that writes waits for the cache to hold its write before it reconciles the key
//! again (docs/controller.md, "Waiting for your own writes"): handed a stale cached object, it
//! does not act on it with the wait, and does without.
//!
//! The informer's consumer is held (an inline handler at a gate) on another key's change, so
//! the reconcile's own write stays queued behind it and the cache stays stale for exactly as
//! long as the test says, whatever the scheduling.

mod informer_common;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use informer_common::{key_fn, pod, server, Gate, Pod};
use kcache::controller::{Action, Controller, Request};
use kcache::informer::SharedInformer;
use kcache::{EventHandler, Key};
use kcache_sim::MemoryListerWatcher;

/// Polls `cond` until it holds; fails the test after 20 s of real time.
async fn eventually(what: &str, cond: impl FnMut() -> bool) {
    informer_common::eventually(what, Duration::from_secs(20), cond).await;
}

/// Inline on the consumer: holds it at the update of `ns/other` to value 2.
struct Holder {
    gate: Arc<Gate>,
    held: mpsc::Sender<()>,
}

impl EventHandler<Pod> for Holder {
    fn on_update(&mut self, _: &Arc<Pod>, new: &Arc<Pod>) {
        if new.name == "ns/other" && new.value == 2 {
            let _ = self.held.send(());
            self.gate.wait();
        }
    }
}

/// The reconcile's world: the server it writes to, and what each reconcile of `ns/web` saw.
struct World {
    server: MemoryListerWatcher<Pod>,
    /// Set by the test: the next reconcile of `ns/web` writes value 2.
    write_next: Mutex<bool>,
    /// The version of that write, once made.
    written: Mutex<Option<u64>>,
    /// Per reconcile of `ns/web`: the cached value and resource version it saw.
    seen: Mutex<Vec<(u64, u64)>>,
}

fn reconcile(request: &Request<Pod>, world: &World) -> Result<Action, String> {
    if request.key().as_str() != "ns/web" {
        return Ok(Action::Done);
    }
    let cached = request.object().expect("ns/web exists");
    world
        .seen
        .lock()
        .unwrap()
        .push((cached.value, cached.rv_number()));
    if std::mem::take(&mut *world.write_next.lock().unwrap()) {
        // The write a real controller would make through the API server: its answer carries
        // the new resource version, which the controller is told about.
        let stored = world.server.upsert(pod("ns/web", 2)).unwrap();
        request.wrote(&stored.rv);
        *world.written.lock().unwrap() = Some(stored.rv_number());
    }
    Ok(Action::Done)
}

/// Writes through a reconcile while the cache is held stale, then hands the key to the
/// controller again: returns what that next reconcile saw, with the version written. The gate
/// opens once the worker waits for the cache (or, without the wait or after a timeout, once
/// the reconcile ran).
async fn stale_cache_then_reconcile(cache_wait_timeout: Option<Duration>) -> Outcome {
    let srv = server(1 << 10);
    srv.upsert(pod("ns/web", 1)).unwrap();
    srv.upsert(pod("ns/other", 1)).unwrap();
    let informer = SharedInformer::builder(srv.clone(), key_fn())
        .batch(1)
        .build();
    let gate = Arc::new(Gate::default());
    let (held_tx, held_rx) = mpsc::channel();
    informer
        .add_event_handler_inline(Holder {
            gate: Arc::clone(&gate),
            held: held_tx,
        })
        .unwrap();
    let world = Arc::new(World {
        server: srv.clone(),
        write_next: Mutex::new(false),
        written: Mutex::new(None),
        seen: Mutex::new(Vec::new()),
    });
    let mut builder = Controller::builder(&informer).name("writer").workers(2);
    if let Some(timeout) = cache_wait_timeout {
        builder = builder.cache_wait_timeout(timeout);
    }
    let controller = builder.run(reconcile, world.clone()).unwrap();
    informer.start().unwrap();
    controller.wait_for_sync().await;
    eventually("the initial reconcile", || {
        world.seen.lock().unwrap().len() == 1
    })
    .await;

    // Hold the consumer on another key's change: what comes after it stays queued.
    srv.upsert(pod("ns/other", 2)).unwrap();
    tokio::task::spawn_blocking(move || {
        held_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the consumer reaches ns/other's change")
    })
    .await
    .unwrap();

    // A reconcile writes ns/web; its change is queued behind the held consumer.
    *world.write_next.lock().unwrap() = true;
    controller.queue().add(Key::new("ns/web"));
    // Its `done` may come after the add below: the key is then reconciled after it, and the
    // write is recorded before `done` either way.
    eventually("the writing reconcile", || {
        world.written.lock().unwrap().is_some()
    })
    .await;
    let written = world.written.lock().unwrap().unwrap();
    assert_eq!(
        informer
            .store()
            .get_by_key(&Key::new("ns/web"))
            .unwrap()
            .value,
        1,
        "the cache is stale"
    );

    // Something else hands the key to the controller again, while the cache is stale.
    controller.queue().add(Key::new("ns/web"));
    let waited = if cache_wait_timeout == Some(Duration::ZERO) {
        // No wait: the reconcile runs on the stale cache.
        eventually("the next reconcile", || {
            world.seen.lock().unwrap().len() == 3
        })
        .await;
        false
    } else if cache_wait_timeout < Some(Duration::from_secs(1)) {
        // A short timeout: the gate opens only once it has ended the wait and the reconcile
        // ran.
        eventually("the timeout, then the reconcile", || {
            controller.stats().cache_wait_timeouts == 1 && world.seen.lock().unwrap().len() == 3
        })
        .await;
        true
    } else {
        // The worker waits for the cache: the reconcile has not run, and cannot until the
        // gate opens (or the timeout, counted, ends the wait).
        eventually("a worker waiting for the cache", || {
            controller.stats().waiting_for_cache == 1
        })
        .await;
        true
    };
    let seen_before_open = world.seen.lock().unwrap().len();
    gate.open();
    // The write's own notification brings a fourth reconcile after this one.
    eventually("the next reconcile", || {
        world.seen.lock().unwrap().len() >= 3
    })
    .await;
    let next = world.seen.lock().unwrap()[2];
    let stats = controller.stats();
    controller.shutdown().await;
    informer.shutdown().await;
    Outcome {
        written,
        next,
        waited,
        seen_before_open,
        cache_waits: stats.cache_waits,
        timeouts: stats.cache_wait_timeouts,
    }
}

#[derive(Debug)]
struct Outcome {
    written: u64,
    /// (value, resource version) the reconcile after the write saw.
    next: (u64, u64),
    waited: bool,
    seen_before_open: usize,
    cache_waits: u64,
    timeouts: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_wait_the_next_reconcile_sees_its_own_write() {
    // A timeout far beyond the test: only the cache can end the wait.
    let outcome = stale_cache_then_reconcile(Some(Duration::from_secs(3600))).await;
    assert!(outcome.waited);
    assert_eq!(
        outcome.seen_before_open, 2,
        "nothing ran on the stale cache: {outcome:?}"
    );
    assert_eq!(outcome.next.0, 2, "{outcome:?}");
    assert!(outcome.next.1 >= outcome.written, "{outcome:?}");
    assert_eq!(
        (outcome.cache_waits, outcome.timeouts),
        (1, 0),
        "{outcome:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_wait_the_next_reconcile_acts_on_the_stale_cache() {
    let outcome = stale_cache_then_reconcile(Some(Duration::ZERO)).await;
    assert_eq!(
        outcome.seen_before_open, 3,
        "it ran before the cache caught up"
    );
    assert_eq!(outcome.next.0, 1, "the stale object: {outcome:?}");
    assert!(outcome.next.1 < outcome.written, "{outcome:?}");
    assert_eq!(outcome.cache_waits, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_times_out_reconciles_anyway_and_is_counted() {
    // The gate stays shut until the reconcile ran: only the timeout can end the wait.
    let outcome = stale_cache_then_reconcile(Some(Duration::from_millis(1))).await;
    assert!(outcome.waited);
    assert_eq!(
        outcome.next.0, 1,
        "ran on the stale cache after the timeout: {outcome:?}"
    );
    assert_eq!(
        (outcome.cache_waits, outcome.timeouts),
        (1, 1),
        "{outcome:?}"
    );
}
