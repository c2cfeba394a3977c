//! The priority queue contract (docs/workqueue.md, "Priority queues"), checked on the reference
//! port, rule by rule, on a fake clock.

mod common;

use std::future::Future;
use std::sync::{mpsc, Arc};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::Duration;

use common::{priority_queues_on_fake_clocks, CountingWaker};
use kcache::workqueue::priority::{
    AddOpts, Priority, PriorityOptions, PriorityWorkQueue, ReferencePriorityQueue,
    ShardedPriorityQueue, TryGetWithPriority, LOW_PRIORITY,
};
use kcache::workqueue::{
    AsyncGet, ExponentialFailureRateLimiter, FakeClock, NotProcessing, QueueConfig, RateLimiter,
    ShutDown, TryGet, WorkQueue,
};
use kcache::Key;

const MS: Duration = Duration::from_millis(1);

fn k(name: &str) -> Key {
    Key::new(name)
}

/// A reference queue on a fake clock, with exponential(1 ms, 1 s) for readable delays.
fn reference() -> (Arc<FakeClock>, ReferencePriorityQueue) {
    let clock = Arc::new(FakeClock::new());
    let config = QueueConfig::new().clock(clock.clone());
    let q = ReferencePriorityQueue::with_rate_limiter(
        &config,
        Box::new(ExponentialFailureRateLimiter::new(MS, 1000 * MS)),
    );
    (clock, q)
}

/// Every priority queue on a fake clock: the reference and the sharded one (1 and 16 shards).
fn each_queue(check: impl Fn(&str, &FakeClock, Arc<dyn PriorityWorkQueue>)) {
    let limiter = || -> Box<dyn RateLimiter<Key>> {
        Box::new(ExponentialFailureRateLimiter::new(MS, 1000 * MS))
    };
    for q in priority_queues_on_fake_clocks(limiter, &PriorityOptions::new()) {
        check(&q.name, &q.clock, q.queue);
    }
}

fn at(priority: Priority) -> AddOpts {
    AddOpts::new().priority(priority)
}

/// Takes every available key, with its priority.
fn drain(q: &dyn PriorityWorkQueue) -> Vec<(String, Priority)> {
    let mut out = Vec::new();
    while let TryGetWithPriority::Item(key, priority) = q.try_get_with_priority() {
        out.push((key.as_str().to_owned(), priority));
    }
    out
}

fn pairs(list: &[(&str, Priority)]) -> Vec<(String, Priority)> {
    list.iter().map(|(k, p)| (k.to_string(), *p)).collect()
}

#[test]
fn higher_priority_first_fifo_within_a_level() {
    let (_, q) = reference();
    q.add_with_opts(at(LOW_PRIORITY), k("a"));
    q.add_with_opts(at(5), k("b"));
    q.add(k("c"));
    q.add_with_opts(at(5), k("d"));
    q.add_with_opts(at(LOW_PRIORITY), k("e"));
    assert_eq!(q.len(), 5);
    assert_eq!(
        drain(&q),
        pairs(&[("b", 5), ("d", 5), ("c", 0), ("a", -100), ("e", -100)])
    );
}

#[test]
fn a_readd_keeps_the_higher_priority_and_goes_to_the_back_only_when_raised() {
    let (_, q) = reference();
    q.add_with_opts(at(LOW_PRIORITY), k("a"));
    q.add_with_opts(at(LOW_PRIORITY), k("b"));
    q.add(k("c"));
    q.add_with_opts(at(LOW_PRIORITY), k("c")); // lower: c keeps 0 and its place
    q.add(k("a")); // raised to 0: behind c
    q.add_with_opts(at(LOW_PRIORITY), k("b")); // same: keeps its place
    assert_eq!(q.len(), 3, "one entry per key");
    assert_eq!(drain(&q), pairs(&[("c", 0), ("a", 0), ("b", -100)]));
}

#[test]
fn a_waiting_entry_made_ready_by_an_add_keeps_its_counter() {
    let (_, q) = reference();
    q.add_after(k("a"), 10 * MS); // counter 0, waiting
    q.add(k("b")); // counter 1
    q.add(k("a")); // ready now, same priority: keeps counter 0
    assert_eq!(q.waiting_len(), 0);
    assert_eq!(drain(&q), pairs(&[("a", 0), ("b", 0)]));
}

#[test]
fn entries_readied_by_the_clock_take_the_next_counter_in_waiting_order() {
    let (clock, q) = reference();
    q.add_after(k("late"), 3 * MS);
    q.add_with_opts(at(LOW_PRIORITY).after(2 * MS), k("low"));
    q.add_with_opts(at(LOW_PRIORITY).after(MS), k("first"));
    q.add_with_opts(at(LOW_PRIORITY), k("now"));
    assert_eq!((q.len(), q.waiting_len()), (1, 3));
    clock.step(3 * MS);
    assert_eq!(q.len(), 4);
    // `now` was ready first; `first` then `low` became ready in ready-time order.
    assert_eq!(
        drain(&q),
        pairs(&[("late", 0), ("now", -100), ("first", -100), ("low", -100)])
    );
}

#[test]
fn equal_ready_times_move_by_priority_then_counter() {
    let (clock, q) = reference();
    q.add_with_opts(at(LOW_PRIORITY).after(MS), k("a"));
    q.add_with_opts(at(LOW_PRIORITY).after(MS), k("b"));
    q.add_with_opts(at(LOW_PRIORITY), k("c"));
    clock.step(MS);
    assert_eq!(drain(&q), pairs(&[("c", -100), ("a", -100), ("b", -100)]));
}

#[test]
fn a_waiting_readd_keeps_the_earlier_time() {
    let (clock, q) = reference();
    q.add_after(k("a"), 10 * MS);
    q.add_after(k("a"), 5 * MS);
    q.add_after(k("a"), 20 * MS);
    assert_eq!(q.waiting_len(), 1);
    clock.step(4 * MS);
    assert_eq!(q.try_get(), TryGet::Empty);
    clock.step(MS);
    assert_eq!(q.try_get(), TryGet::Item(k("a")));
}

#[test]
fn a_ready_entry_stays_ready_when_added_with_a_delay() {
    let (_, q) = reference();
    q.add(k("a"));
    q.add_after(k("a"), 10 * MS);
    assert_eq!((q.len(), q.waiting_len()), (1, 0));
    assert_eq!(q.try_get(), TryGet::Item(k("a")));
}

#[test]
fn rate_limited_delay_replaces_after_when_shorter_or_after_is_zero() {
    let (clock, q) = reference();
    // exponential(1 ms): the first when is 1 ms, shorter than 10 ms.
    q.add_with_opts(AddOpts::new().after(10 * MS).rate_limited(), k("a"));
    // after 0: the limiter's delay (1 ms for b's first failure).
    q.add_rate_limited(k("b"));
    // a's second when would be 2 ms, longer than 1 ms: after wins.
    q.add_with_opts(AddOpts::new().after(MS).rate_limited(), k("c"));
    q.add_with_opts(AddOpts::new().after(MS).rate_limited(), k("c"));
    assert_eq!(q.num_requeues(&k("a")), 1);
    assert_eq!(q.num_requeues(&k("c")), 2);
    clock.step(MS);
    assert_eq!(drain(&q).len(), 3);
    q.forget(&k("c"));
    assert_eq!(q.num_requeues(&k("c")), 0);
}

#[test]
fn a_key_added_while_processing_gets_a_new_entry_skipped_until_done() {
    let (_, q) = reference();
    q.add(k("a"));
    q.add(k("b"));
    assert_eq!(q.try_get(), TryGet::Item(k("a")));
    q.add_with_opts(at(10), k("a")); // placed now, at 10: before b
    assert_eq!(q.len(), 2, "len counts a's new entry");
    assert_eq!(
        q.try_get(),
        TryGet::Item(k("b")),
        "a is skipped while processed"
    );
    assert_eq!(q.len(), 1);
    assert_eq!(q.try_get(), TryGet::Empty, "len 1 while get would block");
    q.done(&k("a")).unwrap();
    assert_eq!(
        q.try_get_with_priority(),
        TryGetWithPriority::Item(k("a"), 10)
    );
    assert_eq!(q.processing_len(), 2);
}

#[test]
fn done_of_a_key_not_processing_changes_nothing() {
    let (_, q) = reference();
    q.add(k("a"));
    assert_eq!(q.done(&k("a")), Err(NotProcessing(k("a"))));
    assert_eq!(q.len(), 1);
    assert_eq!(q.try_get(), TryGet::Item(k("a")));
    q.done(&k("a")).unwrap();
    assert_eq!(q.done(&k("a")), Err(NotProcessing(k("a"))));
}

#[test]
fn shut_down_answers_at_once_and_ignores_adds_and_the_clock() {
    let (clock, q) = reference();
    q.add(k("a"));
    q.add_after(k("w"), MS);
    q.shut_down();
    assert!(q.shutting_down());
    assert_eq!(q.try_get(), TryGet::ShutDown, "even with a ready entry");
    assert_eq!(q.get(), Err(ShutDown));
    q.add(k("b"));
    q.add_rate_limited(k("c"));
    assert_eq!(q.num_requeues(&k("c")), 0, "the limiter is not asked");
    clock.step(MS);
    assert_eq!(
        q.len(),
        1,
        "len keeps the ready entry left; w never became ready"
    );
    q.shut_down(); // a second shut-down does nothing
}

#[test]
fn a_blocked_get_is_woken_by_an_add_by_the_clock_and_by_done() {
    each_queue(|name, clock, q| {
        let (tx, rx) = mpsc::channel();
        let worker = {
            let q = q.clone();
            thread::spawn(move || {
                while let Ok((key, priority)) = q.get_with_priority() {
                    tx.send((key.as_str().to_owned(), priority)).unwrap();
                    if key.as_str() != "hold" {
                        q.done(&key).unwrap();
                    }
                }
            })
        };
        q.add(k("a"));
        assert_eq!(rx.recv().unwrap(), ("a".into(), 0), "{name}");
        q.add_with_opts(at(3).after(MS), k("b"));
        clock.step(MS);
        assert_eq!(rx.recv().unwrap(), ("b".into(), 3), "{name}");
        // Held by the worker: a re-add waits for its done.
        q.add(k("hold"));
        assert_eq!(rx.recv().unwrap(), ("hold".into(), 0), "{name}");
        q.add(k("hold"));
        q.add(k("c"));
        assert_eq!(rx.recv().unwrap(), ("c".into(), 0), "{name}");
        q.shut_down();
        worker.join().unwrap();
    });
}

#[test]
fn an_async_get_is_woken_and_a_dropped_one_passes_its_wake_up_on() {
    each_queue(|name, _, q| {
        let wakes = Arc::new(CountingWaker::default());
        let waker = Waker::from(wakes.clone());
        let mut cx = Context::from_waker(&waker);
        let mut first = Box::pin(q.get_async());
        let mut second = Box::pin(q.get_async());
        assert!(first.as_mut().poll(&mut cx).is_pending());
        assert!(second.as_mut().poll(&mut cx).is_pending());
        q.add(k("a"));
        assert_eq!(wakes.wakes(), 1, "{name}: one add wakes one waiter");
        // `first` was woken; dropping it passes the wake-up to `second`.
        drop(first);
        assert_eq!(wakes.wakes(), 2, "{name}");
        assert_eq!(
            second.as_mut().poll(&mut cx),
            Poll::Ready(Ok(k("a"))),
            "{name}"
        );
    });
}

#[test]
fn shut_down_with_drain_waits_for_processing_keys() {
    each_queue(|name, _, q| {
        q.add(k("a"));
        let a = q.get().unwrap();
        let drainer = {
            let q = q.clone();
            thread::spawn(move || q.shut_down_with_drain())
        };
        while !q.shutting_down() {
            thread::yield_now();
        }
        assert!(!drainer.is_finished(), "{name}: a is still processed");
        q.done(&a).unwrap();
        drainer.join().unwrap();
        assert_eq!(q.processing_len(), 0, "{name}");
    });
}

#[test]
fn the_real_clock_makes_waiting_entries_ready() {
    let queues: [Arc<dyn PriorityWorkQueue>; 2] = [
        Arc::new(ReferencePriorityQueue::new()),
        Arc::new(ShardedPriorityQueue::new(16)),
    ];
    for q in queues {
        q.add_after(k("a"), MS);
        assert_eq!(q.get().unwrap(), k("a"), "the timer thread readied it");
    }
}

/// Records every metric event as a line.
#[derive(Default, Clone)]
struct Recorder(Arc<std::sync::Mutex<Vec<String>>>);

struct Metric(Arc<std::sync::Mutex<Vec<String>>>, &'static str);

impl Metric {
    fn log(&self, line: String) {
        self.0.lock().unwrap().push(line);
    }
}
impl kcache::workqueue::GaugeMetric for Metric {
    fn inc(&self) {
        self.log(format!("{} +1", self.1));
    }
    fn dec(&self) {
        self.log(format!("{} -1", self.1));
    }
}
impl kcache::workqueue::DepthWithPriorityMetric for Metric {
    fn inc(&self, priority: Priority) {
        self.log(format!("{}[{priority}] +1", self.1));
    }
    fn dec(&self, priority: Priority) {
        self.log(format!("{}[{priority}] -1", self.1));
    }
}
impl kcache::workqueue::SettableGaugeMetric for Metric {
    fn set(&self, value: f64) {
        self.log(format!("{} ={value}", self.1));
    }
}
impl kcache::workqueue::CounterMetric for Metric {
    fn inc(&self) {
        self.log(format!("{} +1", self.1));
    }
}
impl kcache::workqueue::HistogramMetric for Metric {
    fn observe(&self, value: f64) {
        self.log(format!("{} {value}", self.1));
    }
}

impl Recorder {
    /// A metric that logs its updates here under `name`.
    fn metric(&self, name: &'static str) -> Arc<Metric> {
        Arc::new(Metric(self.0.clone(), name))
    }
}

impl kcache::workqueue::MetricsProvider for Recorder {
    fn new_depth_metric(&self, _: &str) -> Arc<dyn kcache::workqueue::GaugeMetric> {
        self.metric("depth")
    }
    fn new_depth_with_priority_metric(
        &self,
        _: &str,
    ) -> Arc<dyn kcache::workqueue::DepthWithPriorityMetric> {
        self.metric("depth")
    }
    fn new_adds_metric(&self, _: &str) -> Arc<dyn kcache::workqueue::CounterMetric> {
        self.metric("adds_total")
    }
    fn new_latency_metric(&self, _: &str) -> Arc<dyn kcache::workqueue::HistogramMetric> {
        self.metric("queue_duration_seconds")
    }
    fn new_work_duration_metric(&self, _: &str) -> Arc<dyn kcache::workqueue::HistogramMetric> {
        self.metric("work_duration_seconds")
    }
    fn new_unfinished_work_seconds_metric(
        &self,
        _: &str,
    ) -> Arc<dyn kcache::workqueue::SettableGaugeMetric> {
        self.metric("unfinished_work_seconds")
    }
    fn new_longest_running_processor_seconds_metric(
        &self,
        _: &str,
    ) -> Arc<dyn kcache::workqueue::SettableGaugeMetric> {
        self.metric("longest_running_processor_seconds")
    }
    fn new_retries_metric(&self, _: &str) -> Arc<dyn kcache::workqueue::CounterMetric> {
        self.metric("retries_total")
    }
}

#[test]
fn both_queues_report_client_gos_metrics_with_depth_per_priority() {
    let events = |sharded: bool| {
        let clock = Arc::new(FakeClock::new());
        let recorder = Recorder::default();
        let config = QueueConfig::new()
            .name("test")
            .metrics_provider(Arc::new(recorder.clone()))
            .clock(clock.clone());
        let q: Box<dyn PriorityWorkQueue> = if sharded {
            // One shard: with more, a and b (both at 0) may come out in either order.
            Box::new(ShardedPriorityQueue::with_config(1, &config))
        } else {
            Box::new(ReferencePriorityQueue::with_config(&config))
        };
        q.add_with_opts(at(LOW_PRIORITY), k("a")); // ready at -100
        q.add(k("a")); // raised: moves from -100 to 0
        q.add_after(k("b"), 2 * MS); // waits: a retry, not yet in depth
        clock.step(2 * MS); // b ready
        assert_eq!(q.try_get(), TryGet::Item(k("a")));
        clock.step(3 * MS);
        q.update_unfinished_work();
        q.done(&k("a")).unwrap();
        let log = recorder.0.lock().unwrap().clone();
        log
    };
    let expected = [
        "adds_total +1",
        "depth[-100] +1",
        "depth[-100] -1",
        "depth[0] +1",
        "retries_total +1",
        "adds_total +1",
        "depth[0] +1",
        "depth[0] -1",
        "queue_duration_seconds 0.002",
        "unfinished_work_seconds =0.003",
        "longest_running_processor_seconds =0.003",
        "work_duration_seconds 0.003",
    ];
    assert_eq!(events(false), expected, "reference");
    assert_eq!(events(true), expected, "sharded");
}
