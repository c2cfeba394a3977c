//! The reflector against the in-memory server, on tokio's paused clock: client-go's reflector
//! tests (`tools/cache/reflector_test.go`) re-expressed. Each test names the one it mirrors.
//!
//! The queue is the reference DeltaFifo with a known store; the test plays the consumer,
//! draining the queue into the store with `process_deltas`, so every delta can be read.

mod informer_common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

use informer_common::{error_log, key_fn, ms, pod, server, upsert_pods, Call, Pod, Recording};
use kcache::informer::{
    Backoff, Error, ListOptions, ListerWatcher, Page, Reflector, ReflectorOptions, StopSignal,
    WatchOptions, WatchStream,
};
use kcache::reference::{DeltaFifo, IndexedStore};
use kcache::{
    process_deltas, DeltaQueue, Key, KnownObjects, NoopHandler, QueueOptions, Store, TryPop,
};
use kcache_sim::MemoryListerWatcher;

type Queue = DeltaFifo<Pod>;

fn queue_and_store() -> (Arc<Queue>, Arc<IndexedStore<Pod>>) {
    let store = Arc::new(IndexedStore::new(key_fn(), Vec::new()));
    let queue = Arc::new(DeltaFifo::new(
        QueueOptions::new(key_fn())
            .known_objects(Arc::clone(&store) as Arc<dyn KnownObjects<Pod>>)
            .emit_replaced(true),
    ));
    (queue, store)
}

/// Pops everything queued into `store`; one line per key: `key: Type(value@rv) ...`.
fn drain(queue: &Queue, store: &IndexedStore<Pod>) -> Vec<String> {
    let mut lines = Vec::new();
    while let TryPop::Popped(line) = queue.try_pop(|deltas, _| {
        let mut line = format!("{}:", deltas.key());
        for d in &deltas {
            match d.object.last_known() {
                Some(p) if d.object.is_tombstone() => {
                    line += &format!(" Tombstone({}@{})", p.value, p.rv)
                }
                Some(p) => line += &format!(" {}({}@{})", d.kind, p.value, p.rv),
                None => line += " Tombstone(-)",
            }
        }
        process_deltas(store, &mut NoopHandler, &deltas, false);
        line
    }) {
        lines.push(line);
    }
    lines
}

/// Options with jitter off, so backoff waits are exact.
fn exact_backoff() -> ReflectorOptions {
    ReflectorOptions {
        backoff: Backoff {
            jitter: 0.0,
            ..Backoff::default()
        },
        ..ReflectorOptions::default()
    }
}

/// Lets the reflector task run until it waits for something (paused clock: instant).
async fn settle() {
    tokio::time::sleep(ms(10)).await;
}

/// Exact backoff options whose error handler records every error into the returned log.
fn logging_errors() -> (Arc<Mutex<Vec<Error>>>, ReflectorOptions) {
    let (errors, handler) = error_log();
    let options = ReflectorOptions {
        error_handler: Some(handler),
        ..exact_backoff()
    };
    (errors, options)
}

/// A reflector from `lister_watcher` into `queue`, already running on its own task.
fn start<L: ListerWatcher<Pod> + 'static>(
    lister_watcher: L,
    queue: &Arc<Queue>,
    options: ReflectorOptions,
) -> (Arc<Reflector<Pod, L, Queue>>, StopSignal, JoinHandle<()>) {
    let reflector = Arc::new(Reflector::new(lister_watcher, Arc::clone(queue), options));
    let (stop, task) = spawn_run(&reflector);
    (reflector, stop, task)
}

/// Runs `reflector` on a task until the returned signal stops it.
fn spawn_run<L: ListerWatcher<Pod> + 'static>(
    reflector: &Arc<Reflector<Pod, L, Queue>>,
) -> (StopSignal, JoinHandle<()>) {
    let stop = StopSignal::new();
    let task = tokio::spawn({
        let (r, s) = (Arc::clone(reflector), stop.clone());
        async move { r.run(s).await }
    });
    (stop, task)
}

/// Stops a run and waits for its task to end.
async fn finish(stop: StopSignal, task: JoinHandle<()>) {
    stop.stop();
    task.await.unwrap();
}

// Mirrors TestReflectorListAndWatch: the list's items are replaced into the queue with the
// list's version, then a watch starts from exactly that version and its events follow.
#[tokio::test(start_paused = true)]
async fn list_replaces_then_watch_starts_from_the_list_version() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    srv.upsert(pod("b", 1)).unwrap();
    let lw = Recording::new(srv.clone());
    let (queue, store) = queue_and_store();
    let (reflector, stop, task) = start(lw.clone(), &queue, exact_backoff());
    settle().await;
    assert_eq!(reflector.last_sync_resource_version(), "2");
    srv.upsert(pod("a", 2)).unwrap();
    srv.delete(&Key::new("b"));
    srv.upsert(pod("c", 1)).unwrap();
    settle().await;
    assert_eq!(
        drain(&queue, &store),
        [
            "a: Replaced(1@1) Updated(2@3)",
            "b: Replaced(1@2) Deleted(1@4)",
            "c: Added(1@5)",
        ]
    );
    assert_eq!(
        lw.calls(),
        [
            Call::List {
                rv: "0".into(),
                continued: false
            },
            Call::Watch {
                rv: "2".into(),
                bookmarks: true
            },
        ]
    );
    assert_eq!(reflector.last_sync_resource_version(), "5");
    finish(stop, task).await;
}

// Mirrors TestReflectorWatchHandler: each event goes to the queue as the matching call, and
// the newest version is remembered.
#[tokio::test(start_paused = true)]
async fn watch_events_become_queue_calls_and_move_the_version() {
    let srv = server(100);
    srv.upsert(pod("foo", 1)).unwrap();
    srv.upsert(pod("bar", 1)).unwrap();
    let (queue, store) = queue_and_store();
    let (reflector, stop, task) = start(srv.clone(), &queue, exact_backoff());
    settle().await;
    drain(&queue, &store);
    srv.upsert(pod("rejected", 1)).unwrap();
    srv.delete(&Key::new("foo"));
    srv.upsert(pod("bar", 2)).unwrap();
    srv.upsert(pod("baz", 1)).unwrap();
    settle().await;
    assert_eq!(
        drain(&queue, &store),
        [
            "rejected: Added(1@3)",
            "foo: Deleted(1@4)",
            "bar: Updated(2@5)",
            "baz: Added(1@6)",
        ]
    );
    assert_eq!(reflector.last_sync_resource_version(), "6");
    let mut names: Vec<String> = store.list().iter().map(|p| p.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["bar", "baz", "rejected"]);
    finish(stop, task).await;
}

// Mirrors TestReflectorListAndWatch's watcher restarts (and TestReflectorStopWatch's close):
// a watch that ends is re-opened from the last version, with no new list.
#[tokio::test(start_paused = true)]
async fn an_ended_watch_is_reopened_from_the_last_version_without_a_relist() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    let lw = Recording::new(srv.clone());
    let (queue, store) = queue_and_store();
    let (_, stop, task) = start(lw.clone(), &queue, exact_backoff());
    settle().await;
    srv.upsert(pod("a", 2)).unwrap();
    settle().await;
    srv.close_watches();
    srv.upsert(pod("a", 3)).unwrap(); // while no watch is open: replayed from the window
    settle().await;
    srv.upsert(pod("b", 1)).unwrap();
    settle().await;
    assert_eq!(lw.lists(), ["0"]);
    assert_eq!(lw.watches(), ["1", "2"]);
    assert_eq!(
        drain(&queue, &store),
        [
            "a: Replaced(1@1) Updated(2@2) Updated(3@3)",
            "b: Added(1@4)"
        ]
    );
    finish(stop, task).await;
}

// Mirrors TestReflectorExpiredExactResourceVersion / TestReflectorFullListIfExpired: a watch
// from a version the server no longer has gets 410, which forces a fresh list; keys deleted
// meanwhile come out as tombstones from the replace.
#[tokio::test(start_paused = true)]
async fn expired_version_forces_a_relist_and_missed_deletes_become_tombstones() {
    let srv = server(2);
    srv.upsert(pod("a", 1)).unwrap();
    srv.upsert(pod("b", 1)).unwrap();
    let lw = Recording::new(srv.clone());
    let (queue, store) = queue_and_store();
    let (errors, options) = logging_errors();
    let (reflector, stop, task) = start(lw.clone(), &queue, options);
    settle().await;
    srv.upsert(pod("a", 2)).unwrap();
    settle().await;
    assert_eq!(reflector.last_sync_resource_version(), "3");
    drain(&queue, &store);
    // Drop the watch, then write more than the window holds: the re-watch from 3 is too old.
    srv.close_watches();
    srv.delete(&Key::new("b"));
    srv.upsert(pod("c", 1)).unwrap();
    srv.upsert(pod("a", 3)).unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await; // past the 800 ms backoff
    assert_eq!(lw.watches(), ["2", "3", "6"]);
    assert_eq!(lw.lists(), ["0", "3"], "relisted from the last version");
    assert!(errors.lock().unwrap().iter().any(|e| e.is_expired()));
    assert_eq!(
        drain(&queue, &store),
        ["a: Replaced(3@6)", "c: Replaced(1@5)", "b: Tombstone(1@2)"]
    );
    assert_eq!(reflector.last_sync_resource_version(), "6");
    finish(stop, task).await;
}

// Mirrors TestReflectorResourceVersionUpdate (bookmarks): a bookmark moves the version with
// no queue change, and the next watch resumes from it.
#[tokio::test(start_paused = true)]
async fn a_watch_resumes_from_the_newest_bookmark() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    let lw = Recording::new(srv.clone());
    let (queue, store) = queue_and_store();
    let (reflector, stop, task) = start(lw.clone(), &queue, exact_backoff());
    settle().await;
    drain(&queue, &store);
    // Another client's writes to other objects, which this watch would filter out: the server
    // moves on and tells us so with a bookmark.
    srv.upsert(pod("z", 1)).unwrap();
    srv.delete(&Key::new("z"));
    settle().await;
    drain(&queue, &store);
    srv.bookmark();
    settle().await;
    assert_eq!(reflector.last_sync_resource_version(), "3");
    assert!(queue.is_empty(), "a bookmark queues nothing");
    srv.close_watches();
    settle().await;
    assert_eq!(lw.watches(), ["1", "3"]);
    finish(stop, task).await;
}

// Mirrors TestReflectorListAndWatchWithErrors and TestReflectorListAndWatchInitConnBackoff:
// failed lists are retried after waits of 0.8, 1.6, 3.2, 6.4 s (client-go's backoff), and
// each failure reaches the error handler.
#[tokio::test(start_paused = true)]
async fn failed_lists_back_off_exponentially_and_reach_the_error_handler() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    srv.fail_next_lists(4);
    let lw = Recording::new(srv.clone());
    let (queue, store) = queue_and_store();
    let (errors, options) = logging_errors();
    let (_, stop, task) = start(lw.clone(), &queue, options);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let times = lw.times();
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).take(4).collect();
    assert_eq!(gaps, [ms(800), ms(1600), ms(3200), ms(6400)]);
    assert_eq!(errors.lock().unwrap().len(), 4);
    assert_eq!(lw.lists().len(), 5);
    assert_eq!(drain(&queue, &store), ["a: Replaced(1@1)"]);
    finish(stop, task).await;
}

// Mirrors TestNoRelistOnTooManyRequests / TestBackoffOnTooManyRequests: a watch that cannot
// be opened (refused connection, 429) is retried after a backoff, without a relist.
#[tokio::test(start_paused = true)]
async fn a_watch_that_cannot_open_is_retried_after_a_backoff_without_a_relist() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    srv.fail_next_watches(2);
    let lw = Recording::new(srv.clone());
    let (queue, _store) = queue_and_store();
    let (_, stop, task) = start(lw.clone(), &queue, exact_backoff());
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(lw.lists(), ["0"]);
    assert_eq!(lw.watches(), ["1", "1", "1"]);
    let times = lw.times();
    assert_eq!(times[2] - times[1], ms(800));
    assert_eq!(times[3] - times[2], ms(1600));
    assert_eq!(srv.open_watches(), 1);
    finish(stop, task).await;
}

// Mirrors TestReflectorResync: the resync timer asks ShouldResync every period and resyncs
// the queue when it agrees.
#[tokio::test(start_paused = true)]
async fn resync_asks_should_resync_every_period_and_resyncs_the_queue() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    let (queue, store) = queue_and_store();
    let asked = Arc::new(AtomicUsize::new(0));
    let options = ReflectorOptions {
        resync_period: Duration::from_secs(10),
        should_resync: Some({
            let asked = Arc::clone(&asked);
            // Agree every other time.
            Arc::new(move || asked.fetch_add(1, Ordering::SeqCst) % 2 == 0)
        }),
        ..exact_backoff()
    };
    let (_, stop, task) = start(srv.clone(), &queue, options);
    settle().await;
    assert_eq!(drain(&queue, &store), ["a: Replaced(1@1)"]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(drain(&queue, &store), ["a: Sync(1@1)"]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(asked.load(Ordering::SeqCst), 2);
    assert!(drain(&queue, &store).is_empty(), "declined: no resync");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(drain(&queue, &store), ["a: Sync(1@1)"]);
    finish(stop, task).await;
}

// Mirrors TestReflectorWatchListPageSize: lists are paged (500 by default), following
// `continue`, and the whole list is replaced at once with the first page's version.
#[tokio::test(start_paused = true)]
async fn lists_are_paged_by_500_following_continue() {
    let srv = server(10);
    upsert_pods(&srv, 1200, 4, 1);
    let lw = Recording::new(srv.clone());
    let (queue, store) = queue_and_store();
    let (reflector, stop, task) = start(lw.clone(), &queue, exact_backoff());
    settle().await;
    let lists: Vec<Call> = lw
        .calls()
        .into_iter()
        .filter(|c| matches!(c, Call::List { .. }))
        .collect();
    assert_eq!(
        lists,
        [
            Call::List {
                rv: "0".into(),
                continued: false
            },
            Call::List {
                rv: String::new(),
                continued: true
            },
            Call::List {
                rv: String::new(),
                continued: true
            },
        ]
    );
    assert_eq!(drain(&queue, &store).len(), 1200);
    assert_eq!(reflector.last_sync_resource_version(), "1200");
    finish(stop, task).await;
}

// Mirrors TestReflectorStopWatch / TestRunUntil: stopping ends `run` promptly, with the
// watch closed, even in the middle of a backoff wait.
#[tokio::test(start_paused = true)]
async fn stop_ends_run_promptly_and_closes_the_watch() {
    let srv = server(10);
    srv.upsert(pod("a", 1)).unwrap();
    let (queue, _store) = queue_and_store();
    let (reflector, stop, task) = start(srv.clone(), &queue, exact_backoff());
    settle().await;
    assert_eq!(srv.open_watches(), 1);
    finish(stop, task).await;
    assert_eq!(srv.open_watches(), 0);

    // Stopped while backing off after a failed list.
    srv.fail_next_lists(100);
    let (stop, task) = spawn_run(&reflector);
    tokio::time::sleep(ms(100)).await;
    let before = tokio::time::Instant::now();
    finish(stop, task).await;
    assert_eq!(
        before.elapsed(),
        Duration::ZERO,
        "no waiting out the backoff"
    );
}

// Mirrors the VeryShortWatchError case of TestReflectorHandleWatch*: a watch that closes at
// once without an event is an error that ends the round, so a relist follows after a backoff.
#[tokio::test(start_paused = true)]
async fn a_very_short_empty_watch_ends_the_round_and_relists() {
    let srv = server(10);
    srv.upsert(pod("a", 1)).unwrap();
    let lw = Recording::new(srv.clone());
    let (queue, _store) = queue_and_store();
    let (errors, options) = logging_errors();
    let (_, stop, task) = start(lw.clone(), &queue, options);
    settle().await;
    srv.close_watches();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(lw.lists(), ["0", "1"]);
    assert!(errors.lock().unwrap().contains(&Error::VeryShortWatch));
    finish(stop, task).await;
}

/// A ListerWatcher whose server can be swapped, as when a client fails over to an API server
/// that is behind the one it talked to.
struct Switch(std::sync::Mutex<MemoryListerWatcher<Pod>>);

impl Switch {
    fn server(&self) -> MemoryListerWatcher<Pod> {
        self.0.lock().unwrap().clone()
    }
}

impl ListerWatcher<Pod> for Switch {
    async fn list(&self, options: ListOptions) -> Result<Page<Pod>, Error> {
        self.server().list(options).await
    }

    async fn watch(&self, options: WatchOptions) -> Result<WatchStream<Pod>, Error> {
        self.server().watch(options).await
    }
}

// Mirrors TestReflectorFullListIfTooLarge: a list from a version the server has not reached
// ("Too large resource version") is retried from "" (the server's newest state), and the
// queue is replaced with what that server has.
#[tokio::test(start_paused = true)]
async fn a_too_large_version_falls_back_to_a_full_list() {
    let ahead = server(100);
    for name in ["a", "b", "c", "d"] {
        ahead.upsert(pod(name, 1)).unwrap();
    }
    let behind = server(100);
    behind.upsert(pod("a", 7)).unwrap();
    let switch = Arc::new(Switch(std::sync::Mutex::new(ahead.clone())));
    let (queue, store) = queue_and_store();
    let (errors, options) = logging_errors();
    let (reflector, stop, task) = start(Arc::clone(&switch), &queue, options);
    settle().await;
    assert_eq!(reflector.last_sync_resource_version(), "4");
    drain(&queue, &store);
    // Fail over to a server at version 1 that refuses the next watch: the relist from 4 is
    // too new for it.
    *switch.0.lock().unwrap() = behind.clone();
    behind.expire_next_watches(1);
    ahead.upsert(pod("a", 2)).unwrap(); // one event, then the watch on `ahead` ends
    settle().await;
    ahead.close_watches();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(errors
        .lock()
        .unwrap()
        .iter()
        .any(|e| e.is_too_large_resource_version()));
    assert_eq!(reflector.last_sync_resource_version(), "1");
    assert_eq!(
        drain(&queue, &store),
        [
            "a: Updated(2@5) Replaced(7@1)",
            "b: Tombstone(1@2)",
            "c: Tombstone(1@3)",
            "d: Tombstone(1@4)",
        ]
    );
    finish(stop, task).await;
}

// Mirrors client-go's handling of `Retry-After` (rest client `checkWait`, reflector
// `TestBackoffOnTooManyRequests`): a 429 is retried no sooner than the server asked, however
// short the backoff's own wait; a longer backoff wait still counts.
#[tokio::test(start_paused = true)]
async fn a_429_waits_its_retry_after_before_the_next_attempt() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    srv.throttle_next_watches(2, Duration::from_secs(5));
    let lw = Recording::new(srv.clone());
    let (queue, _store) = queue_and_store();
    let (errors, options) = logging_errors();
    let (_, stop, task) = start(lw.clone(), &queue, options);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        lw.lists(),
        ["0"],
        "a throttled watch is retried without a relist"
    );
    assert_eq!(lw.watches(), ["1", "1", "1"]);
    let times = lw.times();
    assert_eq!(
        times[2] - times[1],
        Duration::from_secs(5),
        "not the backoff's 800 ms"
    );
    assert_eq!(
        times[3] - times[2],
        Duration::from_secs(5),
        "not the backoff's 1.6 s"
    );
    {
        let errors = errors.lock().unwrap();
        assert_eq!(errors.len(), 2);
        assert!(errors
            .iter()
            .all(|e| e.is_too_many_requests() && e.retry_after() == Some(Duration::from_secs(5))));
    }
    finish(stop, task).await;
}

// The same for lists: the round's backoff stretches to `Retry-After` while that is longer.
#[tokio::test(start_paused = true)]
async fn a_throttled_list_waits_the_longer_of_retry_after_and_the_backoff() {
    let srv = server(100);
    srv.upsert(pod("a", 1)).unwrap();
    srv.throttle_next_lists(3, Duration::from_secs(3));
    let lw = Recording::new(srv.clone());
    let (queue, store) = queue_and_store();
    let (_, stop, task) = start(lw.clone(), &queue, exact_backoff());
    tokio::time::sleep(Duration::from_secs(20)).await;
    let times = lw.times();
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).take(3).collect();
    assert_eq!(gaps, [ms(3000), ms(3000), ms(3200)]);
    assert_eq!(lw.lists().len(), 4);
    assert_eq!(drain(&queue, &store), ["a: Replaced(1@1)"]);
    finish(stop, task).await;
}
