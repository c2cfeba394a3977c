//! The whole pipeline under churn and injected failures: a writer changes objects on the
//! in-memory server while watches are closed, answered with 410, refused, and lists fail, all
//! at random; three handlers (one added mid-run, one 1000× slower than the others) check every
//! notification against what they saw before. It runs on both engines: the sharded one with
//! two consumers, the reference design with one.
//!
//! Each handler must end with exactly the server's final state (every key at the server's
//! version), and no notification may contradict the previous one of its key: an update's old
//! object is the last one the handler saw, an add comes only for an absent key, a delete only
//! for a present one. A lost, duplicated or reordered notification breaks one of these.
//!
//! Sizes scale with `KCACHE_STRESS_SCALE` (default 1: 20,000 events, a few seconds in a debug
//! build); `KCACHE_STRESS_SCALE=25` is the full 500,000 events:
//! `KCACHE_STRESS_SCALE=25 cargo test --release -p kcache --test informer_stress`.

mod common;
mod informer_common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::stress_scale;
use informer_common::{key_fn, ms, pod, server, Pod};
use kcache::informer::{Backoff, SharedInformer, SharedInformerBuilder};
use kcache::{DeltaObject, DeltaQueue, EventHandler, Indexer, Key};
use kcache_sim::MemoryListerWatcher;

const KEYS: u64 = 2_000;
const EVENTS_PER_SCALE: u64 = 20_000;
/// Events written between two pauses of the writer (so watches, not only relists, carry them).
const BURST: u64 = 20;

/// What one handler saw: its model of the server, and every contradiction it met.
#[derive(Default)]
struct Model {
    versions: HashMap<String, u64>,
    violations: Vec<String>,
    calls: u64,
}

impl Model {
    fn violation(&mut self, what: String) {
        if self.violations.len() < 20 {
            self.violations.push(what);
        }
    }
}

/// Checks each notification against the previous one of its key, then spins `cost`.
#[derive(Clone)]
struct Checker {
    model: Arc<Mutex<Model>>,
    cost: Duration,
}

impl Checker {
    fn new(cost: Duration) -> Self {
        Self {
            model: Arc::default(),
            cost,
        }
    }

    fn work(&self) {
        let start = Instant::now();
        while start.elapsed() < self.cost {
            std::hint::spin_loop();
        }
    }

    fn state(&self) -> Vec<(String, u64)> {
        let model = self.model.lock().unwrap();
        let mut state: Vec<_> = model
            .versions
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        state.sort();
        state
    }
}

impl EventHandler<Pod> for Checker {
    fn on_add(&mut self, obj: &Arc<Pod>, _initial: bool) {
        self.work();
        let mut model = self.model.lock().unwrap();
        model.calls += 1;
        if let Some(had) = model.versions.insert(obj.name.clone(), obj.rv_number()) {
            model.violation(format!(
                "add of {} at {} while it was at {had}",
                obj.name, obj.rv
            ));
        }
    }

    fn on_update(&mut self, old: &Arc<Pod>, new: &Arc<Pod>) {
        self.work();
        let mut model = self.model.lock().unwrap();
        model.calls += 1;
        match model.versions.insert(new.name.clone(), new.rv_number()) {
            None => model.violation(format!("update of absent {}", new.name)),
            Some(had) if had != old.rv_number() => model.violation(format!(
                "update of {}: old is at {}, last seen {had}",
                new.name, old.rv
            )),
            Some(_) if new.rv_number() < old.rv_number() => {
                model.violation(format!("update of {} back in time", new.name))
            }
            Some(_) => {}
        }
    }

    fn on_delete(&mut self, obj: &DeltaObject<Pod>) {
        self.work();
        let mut model = self.model.lock().unwrap();
        model.calls += 1;
        let (name, last) = match obj {
            DeltaObject::Object(p) => (p.name.clone(), Some(p.rv_number())),
            DeltaObject::Tombstone(t) => (
                t.key.to_string(),
                t.last_known.as_ref().map(|p| p.rv_number()),
            ),
        };
        match (model.versions.remove(&name), last) {
            (None, _) => model.violation(format!("delete of absent {name}")),
            (Some(had), Some(last)) if obj.is_tombstone() && last != had => {
                model.violation(format!("tombstone of {name} knows {last}, last seen {had}"))
            }
            (Some(had), Some(last)) if last < had => {
                model.violation(format!("delete of {name} at {last}, older than {had}"))
            }
            _ => {}
        }
    }
}

/// Writes `events` changes in bursts, injecting failures at random.
fn write(srv: &MemoryListerWatcher<Pod>, events: u64, seed: u64) -> [u64; 5] {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut alive = vec![false; KEYS as usize];
    let mut faults = [0u64; 5];
    for n in 0..events {
        let i = rng.u64(..KEYS);
        let name = format!("p{i:05}");
        if alive[i as usize] && rng.u64(..10) == 0 {
            srv.delete(&Key::new(&name));
            alive[i as usize] = false;
        } else {
            srv.upsert(pod(&name, n)).expect("named pods have keys");
            alive[i as usize] = true;
        }
        // Rarely, a fault: its index in `faults` (closes, 410s, compactions, refused
        // watches, failed lists).
        let fault = match rng.u64(..4_000) {
            0..=1 => Some(0),
            draw @ 2..=5 => Some(draw as usize - 1),
            _ => None,
        };
        if let Some(fault) = fault {
            inject(srv, fault);
            faults[fault] += 1;
        }
        if n % BURST == BURST - 1 {
            std::thread::sleep(ms(1));
        }
    }
    faults
}

/// Injects fault number `fault` (see `faults`), then closes the watches so that the informer
/// meets it.
fn inject(srv: &MemoryListerWatcher<Pod>, fault: usize) {
    match fault {
        0 => {}
        1 => srv.expire_next_watches(1),
        2 => srv.compact(),
        3 => srv.fail_next_watches(1),
        4 => {
            srv.fail_next_lists(1);
            srv.expire_next_watches(1);
        }
        _ => unreachable!("five kinds of fault"),
    }
    srv.close_watches();
}

fn builder(srv: &MemoryListerWatcher<Pod>) -> SharedInformerBuilder<Pod, MemoryListerWatcher<Pod>> {
    SharedInformer::builder(srv.clone(), key_fn())
        .page_size(100)
        .backoff(Backoff {
            initial: ms(1),
            max: ms(20),
            ..Backoff::default()
        })
}

/// A server with half the keys alive, as the informer first lists it.
fn seeded_server() -> MemoryListerWatcher<Pod> {
    let srv = server(2_000);
    for i in 0..KEYS / 2 {
        srv.upsert(pod(&format!("p{i:05}"), 0)).unwrap();
    }
    srv
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_informer_handlers_end_with_the_servers_state_through_restarts_and_410s() {
    let srv = seeded_server();
    let informer = builder(&srv).shards(8).consumers(2).build();
    churn_and_check("sharded", informer, srv).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_informer_handlers_end_with_the_servers_state_through_restarts_and_410s() {
    let srv = seeded_server();
    // The reference queue processes under its one lock: one consumer is all it can use.
    let informer = builder(&srv).consumers(1).build_reference();
    churn_and_check("reference", informer, srv).await;
}

async fn churn_and_check<Q, I>(
    engine: &str,
    informer: SharedInformer<Pod, MemoryListerWatcher<Pod>, Q, I>,
    srv: MemoryListerWatcher<Pod>,
) where
    Q: DeltaQueue<Pod> + 'static,
    I: Indexer<Pod> + 'static,
{
    let events = EVENTS_PER_SCALE * stress_scale() as u64;
    let seed = 0x5EED_1234_u64 ^ events;
    let fast = Checker::new(Duration::from_nanos(100));
    let slow = Checker::new(Duration::from_micros(100)); // 1000× the fast one
    let late = Checker::new(Duration::from_nanos(100));
    informer.add_event_handler(fast.clone()).unwrap();
    let slow_reg = informer.add_event_handler(slow.clone()).unwrap();
    informer.start().unwrap();
    informer.wait_for_sync().await;

    let started = Instant::now();
    let writer = {
        let srv = srv.clone();
        std::thread::spawn(move || {
            let first = write(&srv, events / 3, seed);
            let rest = write(&srv, events - events / 3, seed.rotate_left(17));
            (first, rest)
        })
    };
    // Join the late handler while the writer is at it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while srv.resource_version().parse::<u64>().unwrap() < KEYS / 2 + events / 3 {
        assert!(
            Instant::now() < deadline,
            "the writer did not write its first third in 60 s"
        );
        tokio::time::sleep(ms(1)).await;
    }
    let late_reg = informer.add_event_handler(late.clone()).unwrap();
    let (first, rest) = tokio::task::spawn_blocking(move || writer.join())
        .await
        .unwrap()
        .unwrap();
    let faults: Vec<u64> = first.iter().zip(rest).map(|(a, b)| a + b).collect();

    // The informer catches up with the server...
    let final_rv = srv.resource_version();
    let expected: Vec<(String, u64)> = srv
        .objects()
        .iter()
        .map(|p| (p.name.clone(), p.rv_number()))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut store: Vec<(String, u64)> = informer
            .store()
            .list()
            .iter()
            .map(|p| (p.name.clone(), p.rv_number()))
            .collect();
        store.sort();
        if informer.last_sync_resource_version() == final_rv && store == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the store did not catch up: at {} of {final_rv}",
            informer.last_sync_resource_version()
        );
        tokio::time::sleep(ms(5)).await;
    }
    let caught_up = started.elapsed();
    // ... and shutdown delivers everything still buffered for the handlers.
    informer.shutdown().await;
    assert!(slow_reg.has_synced() && late_reg.has_synced());

    for (name, checker) in [("fast", &fast), ("slow", &slow), ("late", &late)] {
        let model = checker.model.lock().unwrap();
        assert!(
            model.violations.is_empty(),
            "{engine}, {name} handler: {:?}",
            model.violations
        );
        drop(model);
        assert!(
            checker.state() == expected,
            "{engine}, {name} handler's final state differs from the server's"
        );
    }
    let calls = |c: &Checker| c.model.lock().unwrap().calls;
    eprintln!(
        "{engine}: {events} events, faults [closes, 410s, compactions, refused watches, failed lists] = \
         {faults:?}, caught up in {caught_up:.2?}, handler calls fast/slow/late = {}/{}/{}",
        calls(&fast),
        calls(&slow),
        calls(&late)
    );
    assert!(faults.iter().sum::<u64>() > 0, "failures were injected");
}
