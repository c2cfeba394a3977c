//! Loom models of the work queues' own synchronisation: the sharded queue's hand-off through
//! its lock-free ready-shard scheduler to blocked threads and async waiters, per-item
//! exclusivity, drain on shutdown, the pass-on of a wake-up received by a cancelled async
//! `get` (the reference queue's too), the one-searcher wake rule (bursts with sleepers, a woken
//! worker robbed of its item), and the same for the priority queues' wake-ups.
//!
//! Run with:
//! `RUSTFLAGS="--cfg kcache_loom" cargo test -p kcache --release --test loom_workqueue`
#![cfg(kcache_loom)]

mod loom_common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use kcache::workqueue::{AsyncGet, ReferenceQueue, ShardedQueue, ShutDown, TryGet, WorkQueue};
use kcache::Key;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;
use loom_common::{model, spawn_with};

fn k(name: &str) -> Key {
    Key::new(name)
}

/// A thread blocked in `get` on `q` (until the model's adds or shutdown wake it).
fn spawn_get<Q: WorkQueue + ?Sized + 'static>(
    q: &Arc<Q>,
) -> thread::JoinHandle<Result<Key, ShutDown>> {
    spawn_with(q, |q| q.get())
}

/// A fake clock's queue configuration: no timer thread (loom models only its own threads).
fn fake_clock_config() -> kcache::workqueue::QueueConfig {
    kcache::workqueue::QueueConfig::new().clock(Arc::new(kcache::workqueue::FakeClock::new()))
}

/// Wakes a parked loom thread: a minimal executor for one future (an async runtime's waker does
/// the same job for a task).
struct Unpark(thread::Thread);
impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
        thread::park();
    }
}

/// A waker for polling by hand; the models check the queue's wake-ups through the *other*
/// waiters, whose wakers unpark loom threads.
struct NoWake;
impl Wake for NoWake {
    fn wake(self: Arc<Self>) {}
}

/// Asserts that the items handed out, in any order, are "a" and "c".
fn assert_served_a_and_c(mut got: Vec<Key>) {
    got.sort();
    assert_eq!(got, [k("a"), k("c")]);
}

/// A blocked `get` is woken by an add (loom reports a deadlock if a wake-up can be lost).
fn blocked_get_is_woken_by_an_add<Q: WorkQueue + ?Sized + 'static>(q: Arc<Q>) {
    let worker = spawn_get(&q);
    q.add(k("a"));
    assert_eq!(worker.join().unwrap(), Ok(k("a")));
}

/// Two sleeping threads and a burst of two adds: both items are served.
fn a_burst_of_adds_with_two_sleepers<Q: WorkQueue + ?Sized + 'static>(q: Arc<Q>) {
    let workers = [spawn_get(&q), spawn_get(&q)];
    q.add(k("a"));
    q.add(k("c"));
    assert_served_a_and_c(workers.map(|w| w.join().unwrap().unwrap()).into());
}

/// A woken worker whose item a `get` that never slept (the thief) takes sleeps again, and the
/// next add still wakes it.
fn a_woken_worker_robbed_of_its_item<Q: WorkQueue + ?Sized + 'static>(q: Arc<Q>) {
    let worker = spawn_get(&q);
    let thief = spawn_with(&q, move |q| q.try_get());
    q.add(k("a"));
    q.add(k("c"));
    let mut got = vec![worker.join().unwrap().unwrap()];
    if let TryGet::Item(key) = thief.join().unwrap() {
        got.push(key);
    }
    while let TryGet::Item(key) = q.try_get() {
        got.push(key);
    }
    assert_served_a_and_c(got);
}

/// A thread blocked in `get` is woken by an add: no lost wake-up in any interleaving of the
/// scheduler's permit word and its waiter list (loom reports a deadlock if one exists).
#[test]
fn blocked_get_is_woken_by_add() {
    model(|| blocked_get_is_woken_by_an_add(Arc::new(ShardedQueue::new(2))));
}

/// The same for an async `get` on a loom executor.
#[test]
fn async_get_is_woken_by_add() {
    model(|| {
        let q = Arc::new(ShardedQueue::new(2));
        let worker = spawn_with(&q, move |q| block_on(q.get_async()));
        q.add(k("a"));
        assert_eq!(worker.join().unwrap(), Ok(k("a")));
    });
}

/// An item re-added while it is processed is not handed to a second worker until `done`, and
/// is handed out again afterwards: two workers and a producer on one item.
#[test]
fn a_processing_item_is_never_handed_out_twice_at_once() {
    model(|| {
        let q = Arc::new(ShardedQueue::new(1));
        let busy = Arc::new(AtomicBool::new(false));
        let gets = Arc::new(AtomicUsize::new(0));
        q.add(k("a"));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (q, busy, gets) = (Arc::clone(&q), Arc::clone(&busy), Arc::clone(&gets));
                thread::spawn(move || {
                    while let TryGet::Item(key) = q.try_get() {
                        assert!(!busy.swap(true, Ordering::SeqCst), "handed out twice");
                        gets.fetch_add(1, Ordering::SeqCst);
                        busy.store(false, Ordering::SeqCst);
                        q.done(&key).unwrap();
                    }
                })
            })
            .collect();
        q.add(k("a"));
        for w in workers {
            w.join().unwrap();
        }
        // Whatever the workers left is still queued: the second add is never lost.
        while let TryGet::Item(key) = q.try_get() {
            gets.fetch_add(1, Ordering::SeqCst);
            q.done(&key).unwrap();
        }
        let n = gets.load(Ordering::SeqCst);
        assert!((1..=2).contains(&n), "{n} gets");
        assert_eq!(q.try_get(), TryGet::Empty);
    });
}

/// `shut_down_with_drain` returns once the processing item is done, and wakes a blocked `get`
/// with `ShutDown`.
#[test]
fn drain_waits_for_done_and_shutdown_wakes_getters() {
    model(|| {
        let q = Arc::new(ShardedQueue::new(2));
        q.add(k("a"));
        let a = q.try_get();
        let getter = spawn_get(&q);
        let drainer = spawn_with(&q, move |q| q.shut_down_with_drain());
        let TryGet::Item(a) = a else {
            panic!("a was queued")
        };
        q.done(&a).unwrap();
        drainer.join().unwrap();
        assert_eq!(getter.join().unwrap(), Err(ShutDown));
    });
}

/// An async `get` on an empty `q`, polled once by hand: now one of its waiters.
fn a_waiting_async_get<Q: WorkQueue + ?Sized>(
    q: &Q,
) -> std::pin::Pin<Box<impl Future<Output = Result<Key, ShutDown>> + '_>> {
    let waker = Waker::from(Arc::new(NoWake));
    let mut get = Box::pin(q.get_async());
    assert!(get
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    get
}

/// An async `get` that is woken and then dropped passes the wake-up on to the next waiter.
fn cancelled_get_passes_the_wake_up_on(q: Arc<dyn WorkQueue>) {
    let first = a_waiting_async_get(&*q);
    let second = spawn_get(&q);
    q.add(k("a"));
    // `first` is the oldest waiter and may have received the wake-up; dropping it must not
    // strand the item with `second` asleep.
    drop(first);
    assert_eq!(second.join().unwrap(), Ok(k("a")));
}

#[test]
fn cancelled_async_get_passes_the_wake_up_on_sharded() {
    model(|| cancelled_get_passes_the_wake_up_on(Arc::new(ShardedQueue::new(2))));
}

#[test]
fn cancelled_async_get_passes_the_wake_up_on_reference() {
    model(|| cancelled_get_passes_the_wake_up_on(Arc::new(ReferenceQueue::new())));
}

/// Two items, two blocked workers of different kinds (a thread and an async task): both are
/// served; wake-ups are neither lost nor spent on the wrong waiter.
#[test]
fn a_thread_and_a_task_waiting_are_both_served() {
    model(|| {
        let q = Arc::new(ShardedQueue::new(2));
        let thread_worker = spawn_get(&q);
        let task_worker = spawn_with(&q, move |q| block_on(q.get_async()));
        q.add(k("a"));
        q.add(k("c"));
        assert_served_a_and_c(vec![
            thread_worker.join().unwrap().unwrap(),
            task_worker.join().unwrap().unwrap(),
        ]);
    });
}

/// A burst of adds while two threads sleep: both items are served. With the spinning rule the
/// second add wakes nobody (the first woke a worker that is still looking for work); that
/// worker must hand the search on once it finds the first item and sees more.
#[test]
fn a_burst_of_adds_with_two_sleepers_serves_both() {
    model(|| a_burst_of_adds_with_two_sleepers(Arc::new(ShardedQueue::new(2))));
}

/// A woken worker whose item is taken by another `get` (a thief that never slept) looks, finds
/// nothing, and sleeps again: it must give up the searcher's role as it does, or the next add
/// would wake nobody.
#[test]
fn a_woken_worker_robbed_of_its_item_is_woken_by_the_next_add() {
    model(|| a_woken_worker_robbed_of_its_item(Arc::new(ShardedQueue::new(2))));
}

/// A thread and a cancelled async `get`: the wake-up (and the searcher's role) the task
/// received is handed on by its cancellation when a second item is queued.
#[test]
fn a_cancelled_woken_task_hands_the_search_on_in_a_burst() {
    model(|| {
        let q: Arc<ShardedQueue> = Arc::new(ShardedQueue::new(2));
        let first = a_waiting_async_get(&*q);
        let second = spawn_get(&q);
        q.add(k("a"));
        q.add(k("c"));
        drop(first);
        let got = second.join().unwrap().unwrap();
        let rest = q.try_get();
        assert!(
            matches!(rest, TryGet::Item(_)),
            "the other item is still queued"
        );
        assert!(got == k("a") || got == k("c"));
    });
}

/// The sharded priority queue on a fake clock (no timer thread; loom models only its own
/// threads).
fn priority_queue(shards: usize) -> Arc<kcache::workqueue::priority::ShardedPriorityQueue> {
    Arc::new(
        kcache::workqueue::priority::ShardedPriorityQueue::with_config(
            shards,
            &fake_clock_config(),
        ),
    )
}

/// The sharded priority queue: a blocked `get` is woken by an add (the head it publishes and
/// the waiter count it reads against the `get`'s count and re-read of the heads).
#[test]
fn priority_blocked_get_is_woken_by_add() {
    model(|| blocked_get_is_woken_by_an_add(priority_queue(2)));
}

/// The sharded priority queue with aging and fairness on: the age words are hints beside the
/// heads and wake nobody, so a blocked `get` is still woken by an add (of a key overdue at
/// once: `max_wait` is zero), through the same head and waiter words as without them.
#[test]
fn priority_with_aging_and_fairness_sleepers_are_served() {
    model(|| {
        let config = fake_clock_config();
        let q = Arc::new(
            kcache::workqueue::priority::ShardedPriorityQueue::with_options(
                2,
                &config,
                kcache::workqueue::priority::default_priority_rate_limiter(),
                kcache::workqueue::priority::PriorityOptions::new()
                    .max_wait(std::time::Duration::ZERO)
                    .fair(),
            ),
        );
        let worker = spawn_get(&q);
        q.add(k("ns/a"));
        let got = worker.join().unwrap();
        assert_eq!(got, Ok(k("ns/a")));
    });
}

/// The sharded priority queue: a burst of two adds with two sleeping threads serves both.
#[test]
fn priority_a_burst_of_adds_with_two_sleepers_serves_both() {
    model(|| a_burst_of_adds_with_two_sleepers(priority_queue(2)));
}

/// The sharded priority queue: a key re-added while processed is handed out after `done` to
/// a blocked worker, never to two at once.
#[test]
fn priority_a_readded_key_wakes_a_worker_at_done() {
    model(|| {
        let q = priority_queue(1);
        q.add(k("a"));
        let TryGet::Item(a) = q.try_get() else {
            panic!("a was queued")
        };
        let worker = spawn_get(&q);
        q.add(k("a"));
        q.done(&a).unwrap();
        assert_eq!(worker.join().unwrap(), Ok(k("a")));
    });
}

#[test]
fn cancelled_async_get_passes_the_wake_up_on_priority_sharded() {
    model(|| cancelled_get_passes_the_wake_up_on(priority_queue(2)));
}

#[test]
fn cancelled_async_get_passes_the_wake_up_on_priority_reference() {
    model(|| {
        cancelled_get_passes_the_wake_up_on(Arc::new(
            kcache::workqueue::priority::ReferencePriorityQueue::with_config(&fake_clock_config()),
        ))
    });
}

/// The sharded priority queue: a woken worker robbed of its entry by a `get` that never slept
/// gives the searcher's role up as it sleeps again, so the next add wakes it.
#[test]
fn priority_a_woken_worker_robbed_of_its_entry_is_woken_by_the_next_add() {
    model(|| a_woken_worker_robbed_of_its_item(priority_queue(2)));
}

/// A `get` that is about to sleep when `shut_down` runs still answers `ShutDown` (each sharded
/// queue reads the flag again under its waiting list's lock, which `close` takes after setting
/// it). Found by the round-trip bench hanging at its `join`.
fn shut_down_wakes_a_get_about_to_sleep(queue: fn() -> Arc<dyn WorkQueue>) {
    model(move || {
        let q = queue();
        let worker = spawn_get(&q);
        q.shut_down();
        assert_eq!(worker.join().unwrap(), Err(ShutDown));
    });
}

#[test]
fn priority_shut_down_wakes_a_get_about_to_sleep() {
    shut_down_wakes_a_get_about_to_sleep(|| priority_queue(2));
}

#[test]
fn sharded_shut_down_wakes_a_get_about_to_sleep() {
    shut_down_wakes_a_get_about_to_sleep(|| Arc::new(ShardedQueue::new(2)));
}
