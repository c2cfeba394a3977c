//! The work queue contract (docs/workqueue.md), checked on the reference port and the sharded
//! queue (1 and 16 shards) alike, plus what only one of them does: the reference's
//! `add; done` quirk and the sharded queue's refusal of it.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Wake, Waker};
use std::thread;
use std::time::{Duration, Instant};

use kcache::workqueue::{
    AsyncGet, DelayingQueue, ExponentialFailureRateLimiter, FakeClock, NotProcessing, QueueConfig,
    RateLimiter, RateLimitingQueue, ReferenceQueue, ShardedQueue, ShutDown, TryGet, WorkQueue,
};
use kcache::Key;

const MS: Duration = Duration::from_millis(1);
const NS: Duration = Duration::from_nanos(1);

fn k(name: &str) -> Key {
    Key::new(name)
}

/// Runs `check` on every queue under test.
fn each_queue(check: impl Fn(&str, Arc<dyn WorkQueue>)) {
    check("reference", Arc::new(ReferenceQueue::new()));
    check("sharded/1", Arc::new(ShardedQueue::new(1)));
    check("sharded/16", Arc::new(ShardedQueue::new(16)));
}

/// Every queue under the delaying and rate-limiting layers, on a fake clock.
fn each_layered(check: impl Fn(&str, &FakeClock, &dyn Layered)) {
    let clock = Arc::new(FakeClock::new());
    let config = QueueConfig::new().clock(clock.clone());
    check(
        "reference",
        &clock,
        &RateLimitingQueue::new(
            DelayingQueue::with_config(ReferenceQueue::with_config(&config), &config),
            ExponentialFailureRateLimiter::new(MS, 1000 * MS),
        ),
    );
    for shards in [1, 16] {
        let clock = Arc::new(FakeClock::new());
        let config = QueueConfig::new().clock(clock.clone());
        check(
            &format!("sharded/{shards}"),
            &clock,
            &RateLimitingQueue::new(
                DelayingQueue::with_config(ShardedQueue::with_config(shards, &config), &config),
                ExponentialFailureRateLimiter::new(MS, 1000 * MS),
            ),
        );
    }
}

/// The layered operations, object-safe, so one test body serves every queue.
trait Layered {
    fn queue(&self) -> &dyn WorkQueue;
    fn add_after(&self, item: Key, delay: Duration);
    fn add_rate_limited(&self, item: Key);
    fn num_requeues(&self, item: &Key) -> u64;
    fn waiting(&self) -> usize;
}

impl<Q: WorkQueue + 'static, L: RateLimiter<Key>> Layered for RateLimitingQueue<Q, L> {
    fn queue(&self) -> &dyn WorkQueue {
        self
    }
    fn add_after(&self, item: Key, delay: Duration) {
        RateLimitingQueue::add_after(self, item, delay)
    }
    fn add_rate_limited(&self, item: Key) {
        RateLimitingQueue::add_rate_limited(self, item)
    }
    fn num_requeues(&self, item: &Key) -> u64 {
        RateLimitingQueue::num_requeues(self, item)
    }
    fn waiting(&self) -> usize {
        self.delaying().waiting_len()
    }
}

/// Polls `cond` until it holds; fails the test, naming `what`, after 10 s.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::yield_now();
    }
}

/// A waker that counts its wake-ups, to poll a `get_async` by hand.
#[derive(Default)]
struct WakeCount(AtomicUsize);

impl Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl WakeCount {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn item(got: TryGet) -> String {
    match got {
        TryGet::Item(key) => key.to_string(),
        other => panic!("expected an item, got {other:?}"),
    }
}

#[test]
fn dirty_items_are_not_queued_twice_and_processing_items_wait_for_done() {
    each_queue(|name, q| {
        q.add(k("a"));
        q.add(k("b"));
        q.add(k("a"));
        assert_eq!(q.len(), 2, "{name}");
        assert_eq!(q.processing_len(), 0, "{name}");
        let first = q.get().unwrap();
        assert_eq!(q.processing_len(), 1, "{name}");
        q.add(first.clone());
        q.add(first.clone());
        assert_eq!(q.len(), 1, "{name}: a processing item is not queued by add");
        let second = q.get().unwrap();
        assert_ne!(first, second, "{name}");
        assert_eq!(q.processing_len(), 2, "{name}");
        assert_eq!(q.try_get(), TryGet::Empty, "{name}: never handed out twice");
        q.done(&first).unwrap();
        assert_eq!(q.len(), 1, "{name}: done queues the dirty item again");
        assert_eq!(
            q.processing_len(),
            1,
            "{name}: a re-queued item is no longer processing"
        );
        assert_eq!(q.try_get(), TryGet::Item(first.clone()), "{name}");
        q.done(&first).unwrap();
        q.done(&second).unwrap();
        assert_eq!(q.processing_len(), 0, "{name}");
        assert_eq!(q.try_get(), TryGet::Empty, "{name}");
    });
}

#[test]
fn one_shard_hands_out_in_fifo_order_with_requeued_items_at_the_back() {
    for q in [
        Arc::new(ReferenceQueue::new()) as Arc<dyn WorkQueue>,
        Arc::new(ShardedQueue::new(1)),
    ] {
        for name in ["a", "b", "c"] {
            q.add(k(name));
        }
        let a = q.get().unwrap();
        q.add(a.clone());
        q.done(&a).unwrap();
        let order: Vec<_> = (0..3).map(|_| item(q.try_get())).collect();
        assert_eq!(order, ["b", "c", "a"]);
    }
}

#[test]
fn shut_down_refuses_adds_hands_out_queued_items_then_reports_shutdown() {
    each_queue(|name, q| {
        q.add(k("a"));
        let a = q.get().unwrap();
        q.add(k("b"));
        q.add(a.clone());
        q.shut_down();
        assert!(q.shutting_down(), "{name}");
        q.add(k("c"));
        assert_eq!(q.len(), 1, "{name}: adds after shut_down do nothing");
        assert_eq!(item(q.try_get()), "b", "{name}");
        assert_eq!(q.try_get(), TryGet::ShutDown, "{name}");
        assert_eq!(q.get(), Err(ShutDown), "{name}");
        q.done(&a).unwrap();
        assert_eq!(
            item(q.try_get()),
            "a",
            "{name}: done after shut_down re-queues a dirty item"
        );
        assert_eq!(q.get(), Err(ShutDown), "{name}");
    });
}

#[test]
fn shut_down_with_drain_waits_for_processing_items() {
    each_queue(|name, q| {
        q.add(k("a"));
        let a = q.get().unwrap();
        let finished = Arc::new(AtomicBool::new(false));
        let drainer = {
            let (q, finished) = (q.clone(), finished.clone());
            thread::spawn(move || {
                q.shut_down_with_drain();
                finished.store(true, Ordering::SeqCst);
            })
        };
        // The drainer has begun (it shuts the queue down first); `a` is still processing, so
        // it cannot have returned, however long it has been running.
        wait_until("the drain to begin", || q.shutting_down());
        assert!(
            !finished.load(Ordering::SeqCst),
            "{name}: drain returned early"
        );
        q.done(&a).unwrap();
        drainer.join().unwrap();
        assert!(finished.load(Ordering::SeqCst), "{name}");
    });
}

#[test]
fn plain_shut_down_cancels_a_waiting_drain() {
    each_queue(|name, q| {
        q.add(k("a"));
        let _a = q.get().unwrap();
        let drainer = {
            let q = q.clone();
            thread::spawn(move || q.shut_down_with_drain())
        };
        wait_until("the drain to begin", || q.shutting_down());
        q.shut_down();
        drainer.join().unwrap();
        assert!(q.shutting_down(), "{name}");
    });
}

/// Blocking `get`s on threads return what another thread adds, re-queues or shuts down.
/// Whether a getter is already asleep when the other thread acts is up to the scheduler (a
/// blocked thread cannot be observed); the wake-ups themselves are pinned, deterministically,
/// by `pending_gets_are_woken_by_add_done_and_shutdown`.
#[test]
fn blocking_gets_return_what_other_threads_add_requeue_or_shut_down() {
    each_queue(|name, q| {
        // Each getter says it is about to call `get`, so the action below at least races it.
        let getter = |q: &Arc<dyn WorkQueue>| {
            let (q, (started, ready)) = (q.clone(), mpsc::channel());
            let handle = thread::spawn(move || {
                started.send(()).unwrap();
                q.get()
            });
            ready.recv().unwrap();
            handle
        };
        let waiting = getter(&q);
        q.add(k("a"));
        let a = waiting.join().unwrap().unwrap();
        q.add(a.clone());
        let waiting = getter(&q);
        q.done(&a).unwrap();
        assert_eq!(
            waiting.join().unwrap(),
            Ok(a.clone()),
            "{name}: done re-queued it"
        );
        let waiters: Vec<_> = (0..3).map(|_| getter(&q)).collect();
        q.shut_down();
        for w in waiters {
            assert_eq!(w.join().unwrap(), Err(ShutDown), "{name}");
        }
    });
}

/// A pending `get_async`, polled by hand, is woken by `add`, by a `done` that re-queues, and
/// by shutdown, and not before.
#[test]
fn pending_gets_are_woken_by_add_done_and_shutdown() {
    each_queue(|name, q| {
        let wakes = Arc::new(WakeCount::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);

        let mut get = pin!(q.get_async());
        assert!(get.as_mut().poll(&mut cx).is_pending(), "{name}");
        assert_eq!(wakes.count(), 0, "{name}: nothing happened yet");
        q.add(k("a"));
        assert!(wakes.count() > 0, "{name}: add wakes the pending get");
        let Poll::Ready(Ok(a)) = get.as_mut().poll(&mut cx) else {
            panic!("{name}: the woken get takes the item")
        };

        q.add(a.clone()); // dirty while processing: queued again by its done
        let mut get = pin!(q.get_async());
        assert!(get.as_mut().poll(&mut cx).is_pending(), "{name}");
        let before = wakes.count();
        q.done(&a).unwrap();
        assert!(wakes.count() > before, "{name}: done re-queues and wakes");
        assert_eq!(
            get.as_mut().poll(&mut cx),
            Poll::Ready(Ok(a.clone())),
            "{name}"
        );

        let mut get = pin!(q.get_async());
        assert!(get.as_mut().poll(&mut cx).is_pending(), "{name}");
        let before = wakes.count();
        q.shut_down();
        assert!(wakes.count() > before, "{name}: shutdown wakes");
        assert_eq!(
            get.as_mut().poll(&mut cx),
            Poll::Ready(Err(ShutDown)),
            "{name}"
        );
    });
}

#[test]
fn the_reference_keeps_client_gos_add_done_quirk() {
    let q = ReferenceQueue::new();
    q.add(k("a"));
    q.done(&k("a")).unwrap();
    assert_eq!(q.len(), 2, "add; done leaves the item queued twice");
    assert_eq!(item(q.try_get()), "a");
    assert_eq!(item(q.try_get()), "a");
}

#[test]
fn the_sharded_queue_refuses_done_of_an_item_not_processing() {
    let q = ShardedQueue::new(4);
    q.add(k("a"));
    assert_eq!(q.done(&k("a")), Err(NotProcessing(k("a"))));
    assert_eq!(q.done(&k("zz")), Err(NotProcessing(k("zz"))));
    let a = q.get().unwrap();
    q.done(&a).unwrap();
    assert_eq!(q.done(&a), Err(NotProcessing(a)), "done twice");
    assert_eq!(q.len(), 0);
}

#[test]
fn add_after_keeps_the_earliest_ready_time_and_adds_earliest_first() {
    each_layered(|name, clock, q| {
        q.add_after(k("late"), 30 * MS);
        q.add_after(k("early"), 10 * MS);
        q.add_after(k("late"), 20 * MS);
        q.add_after(k("early"), 25 * MS);
        assert_eq!(q.waiting(), 2, "{name}");
        clock.step(15 * MS);
        assert_eq!(q.queue().len(), 1, "{name}");
        clock.step(5 * MS);
        let order: Vec<_> = (0..2).map(|_| item(q.queue().try_get())).collect();
        assert_eq!(order, ["early", "late"], "{name}");
        assert_eq!(q.waiting(), 0, "{name}");
        q.add_after(k("now"), Duration::ZERO);
        assert_eq!(q.queue().len(), 1, "{name}: a delay of zero adds at once");
    });
}

#[test]
fn a_ready_item_that_is_dirty_already_is_deduplicated() {
    each_layered(|name, clock, q| {
        q.queue().add(k("a"));
        q.add_after(k("a"), MS);
        clock.step(MS);
        assert_eq!(q.queue().len(), 1, "{name}");
    });
}

#[test]
fn shut_down_drops_waiting_items_and_rate_limited_adds_still_count() {
    each_layered(|name, clock, q| {
        q.add_after(k("a"), MS);
        q.add_rate_limited(k("b"));
        assert_eq!(q.num_requeues(&k("b")), 1, "{name}");
        q.queue().shut_down();
        assert_eq!(q.waiting(), 0, "{name}: waiting items are dropped");
        q.add_rate_limited(k("b"));
        assert_eq!(
            q.num_requeues(&k("b")),
            2,
            "{name}: the limiter is asked even after shut_down"
        );
        clock.step(1000 * MS);
        assert_eq!(q.queue().try_get(), TryGet::ShutDown, "{name}");
    });
}

#[test]
fn the_delaying_layer_adds_an_item_at_its_ready_time_not_before() {
    each_layered(|name, clock, q| {
        q.add_after(k("b"), 40 * MS);
        q.add_after(k("a"), 10 * MS);
        clock.step(10 * MS - NS);
        assert_eq!(q.queue().try_get(), TryGet::Empty, "{name}: 1 ns early");
        clock.step(NS);
        assert_eq!(item(q.queue().try_get()), "a", "{name}");
        clock.step(30 * MS - NS);
        assert_eq!(q.queue().try_get(), TryGet::Empty, "{name}: 1 ns early");
        clock.step(NS);
        assert_eq!(item(q.queue().try_get()), "b", "{name}");
        assert_eq!(q.waiting(), 0, "{name}");
    });
}

/// The timer thread of a real clock. The delays are lower bounds measured from before the
/// `add_after`s, so they hold however slow the machine is.
#[test]
fn a_real_clock_timer_thread_adds_items_when_ready() {
    let start = Instant::now();
    let q = DelayingQueue::new(ShardedQueue::new(4));
    q.add_after(k("b"), 40 * MS);
    q.add_after(k("a"), 10 * MS);
    assert_eq!(q.get().unwrap(), k("a"));
    assert!(start.elapsed() >= Duration::from_millis(10));
    assert_eq!(q.get().unwrap(), k("b"));
    assert!(start.elapsed() >= Duration::from_millis(40));
    assert_eq!(q.waiting_len(), 0);
}

/// Dropping a pending `get_async` (a timeout, a `select!`) loses neither items nor wake-ups:
/// every item still reaches a task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_async_gets_lose_no_wake_up() {
    for (name, q) in [
        (
            "reference",
            Arc::new(ReferenceQueue::new()) as Arc<dyn WorkQueue>,
        ),
        ("sharded", Arc::new(ShardedQueue::new(4))),
    ] {
        const ITEMS: usize = 300;
        let got = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..6)
            .map(|t| {
                let (q, got) = (q.clone(), got.clone());
                tokio::spawn(async move {
                    loop {
                        // Short timeouts cancel many gets, some right after being woken.
                        let timeout = Duration::from_micros(50 + 37 * t);
                        match tokio::time::timeout(timeout, q.get_async()).await {
                            Err(_) => continue,
                            Ok(Err(ShutDown)) => return,
                            Ok(Ok(key)) => {
                                got.fetch_add(1, Ordering::SeqCst);
                                q.done(&key).unwrap();
                            }
                        }
                    }
                })
            })
            .collect();
        for i in 0..ITEMS {
            q.add(Key::new(&format!("k{i}")));
            if i % 16 == 0 {
                tokio::time::sleep(Duration::from_micros(100)).await;
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while got.load(Ordering::SeqCst) < ITEMS {
            assert!(std::time::Instant::now() < deadline, "{name}: items lost");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        q.shut_down();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(got.load(Ordering::SeqCst), ITEMS, "{name}");
    }
}
