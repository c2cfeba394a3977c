//! Work queue metrics, client-go's (`util/workqueue/metrics.go`): names, meanings and the
//! provider interface.
//!
//! A queue built with a name and a [`MetricsProvider`] (see [`QueueConfig`]) asks the provider
//! for one metric of each kind, labelled with its name, and keeps them current:
//!
//! | metric | kind | meaning |
//! |---|---|---|
//! | `depth` | gauge | items added and not yet handed out by `get` |
//! | `adds_total` | counter | `add`s that marked an item dirty (not the ones deduplicated) |
//! | `queue_duration_seconds` | histogram | from an item's first `add` to the `get` that hands it out |
//! | `work_duration_seconds` | histogram | from `get` to `done` |
//! | `unfinished_work_seconds` | gauge | sum of the ages of the items being processed (set by [`update_unfinished_work`](super::WorkQueue::update_unfinished_work)) |
//! | `longest_running_processor_seconds` | gauge | age of the oldest item being processed (same) |
//! | `retries_total` | counter | `add_after` calls not refused by shutdown (the delaying layer) |
//!
//! Durations are read from the queue's [`Clock`], so they are deterministic on a
//! [`FakeClock`](super::FakeClock). Without a name, or with the [`NoopMetricsProvider`], a
//! queue keeps no metrics and reads no clock for them (client-go's behaviour too).
//!
//! With the `prometheus` feature, [`PrometheusMetrics`](super::PrometheusMetrics) is a provider
//! that registers the metrics in a `prometheus_client` registry as `workqueue_*` with a `name`
//! label, as Kubernetes components export them.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::clock::{Clock, RealClock, Time};

/// A gauge that goes up and down by one (client-go `GaugeMetric`).
pub trait GaugeMetric: Send + Sync {
    /// Adds one.
    fn inc(&self);
    /// Subtracts one.
    fn dec(&self);
}

/// A gauge set to a value (client-go `SettableGaugeMetric`).
pub trait SettableGaugeMetric: Send + Sync {
    /// Sets the value.
    fn set(&self, value: f64);
}

/// A gauge per priority level (controller-runtime's `DepthMetricWithPriority`): the depth of
/// a [priority queue](super::priority), told which level each entry enters or leaves.
///
/// Levels are plain `i32`s here (what [`Priority`](super::priority::Priority) names), so that
/// the metrics, which the priority queues build on, do not import them back.
pub trait DepthWithPriorityMetric: Send + Sync {
    /// Adds one at `priority`.
    fn inc(&self, priority: i32);
    /// Subtracts one at `priority`.
    fn dec(&self, priority: i32);
}

/// A plain depth gauge standing in for a per-priority one: the provider has no per-priority
/// gauge, so every level counts in the one depth (controller-runtime's fallback too).
struct AllPriorities(Arc<dyn GaugeMetric>);

impl DepthWithPriorityMetric for AllPriorities {
    fn inc(&self, _: i32) {
        self.0.inc();
    }
    fn dec(&self, _: i32) {
        self.0.dec();
    }
}

/// A monotonic counter (client-go `CounterMetric`).
pub trait CounterMetric: Send + Sync {
    /// Adds one.
    fn inc(&self);
}

/// A distribution of observations, in seconds (client-go `HistogramMetric`).
pub trait HistogramMetric: Send + Sync {
    /// Records one observation.
    fn observe(&self, value: f64);
}

/// Makes a queue's metrics; `name` is the queue's name (client-go `MetricsProvider`).
pub trait MetricsProvider: Send + Sync {
    /// `depth`.
    fn new_depth_metric(&self, name: &str) -> Arc<dyn GaugeMetric>;
    /// `adds_total`.
    fn new_adds_metric(&self, name: &str) -> Arc<dyn CounterMetric>;
    /// `queue_duration_seconds`.
    fn new_latency_metric(&self, name: &str) -> Arc<dyn HistogramMetric>;
    /// `work_duration_seconds`.
    fn new_work_duration_metric(&self, name: &str) -> Arc<dyn HistogramMetric>;
    /// `unfinished_work_seconds`.
    fn new_unfinished_work_seconds_metric(&self, name: &str) -> Arc<dyn SettableGaugeMetric>;
    /// `longest_running_processor_seconds`.
    fn new_longest_running_processor_seconds_metric(
        &self,
        name: &str,
    ) -> Arc<dyn SettableGaugeMetric>;
    /// `retries_total`.
    fn new_retries_metric(&self, name: &str) -> Arc<dyn CounterMetric>;

    /// `depth` split by priority, for the priority queues. By default the plain
    /// [`new_depth_metric`](MetricsProvider::new_depth_metric), every level counted together.
    fn new_depth_with_priority_metric(&self, name: &str) -> Arc<dyn DepthWithPriorityMetric> {
        Arc::new(AllPriorities(self.new_depth_metric(name)))
    }

    /// True for a provider whose metrics record nothing: the queue then skips metrics
    /// altogether, clock reads included.
    fn is_noop(&self) -> bool {
        false
    }
}

/// The default provider: metrics that record nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopMetricsProvider;

struct Noop;

impl GaugeMetric for Noop {
    fn inc(&self) {}
    fn dec(&self) {}
}
impl SettableGaugeMetric for Noop {
    fn set(&self, _: f64) {}
}
impl CounterMetric for Noop {
    fn inc(&self) {}
}
impl HistogramMetric for Noop {
    fn observe(&self, _: f64) {}
}

impl MetricsProvider for NoopMetricsProvider {
    fn new_depth_metric(&self, _: &str) -> Arc<dyn GaugeMetric> {
        Arc::new(Noop)
    }
    fn new_adds_metric(&self, _: &str) -> Arc<dyn CounterMetric> {
        Arc::new(Noop)
    }
    fn new_latency_metric(&self, _: &str) -> Arc<dyn HistogramMetric> {
        Arc::new(Noop)
    }
    fn new_work_duration_metric(&self, _: &str) -> Arc<dyn HistogramMetric> {
        Arc::new(Noop)
    }
    fn new_unfinished_work_seconds_metric(&self, _: &str) -> Arc<dyn SettableGaugeMetric> {
        Arc::new(Noop)
    }
    fn new_longest_running_processor_seconds_metric(
        &self,
        _: &str,
    ) -> Arc<dyn SettableGaugeMetric> {
        Arc::new(Noop)
    }
    fn new_retries_metric(&self, _: &str) -> Arc<dyn CounterMetric> {
        Arc::new(Noop)
    }
    fn is_noop(&self) -> bool {
        true
    }
}

/// How to build a queue (client-go `QueueConfig`): its name (the metrics' label), its metrics
/// provider, and the clock every time-dependent part reads.
///
/// Pass the same config to the queue and to the layers over it (delaying, rate limiting) so
/// they share the clock and label their metrics alike.
///
/// ```
/// use std::sync::Arc;
/// use kcache::workqueue::{FakeClock, QueueConfig};
/// let config = QueueConfig::new().name("pods").clock(Arc::new(FakeClock::new()));
/// assert_eq!(config.get_name(), "pods");
/// ```
#[derive(Clone)]
pub struct QueueConfig {
    name: String,
    provider: Arc<dyn MetricsProvider>,
    clock: Arc<dyn Clock>,
}

impl QueueConfig {
    /// Unnamed (no metrics), the no-op provider, and a [`RealClock`].
    pub fn new() -> Self {
        Self {
            name: String::new(),
            provider: Arc::new(NoopMetricsProvider),
            clock: Arc::new(RealClock::new()),
        }
    }

    /// Names the queue; a queue keeps metrics only if it is named.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets the metrics provider.
    pub fn metrics_provider(mut self, provider: Arc<dyn MetricsProvider>) -> Self {
        self.provider = provider;
        self
    }

    /// Sets the clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The queue's name.
    pub fn get_name(&self) -> &str {
        &self.name
    }

    /// The clock.
    pub fn get_clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    fn metrics_enabled(&self) -> bool {
        !self.name.is_empty() && !self.provider.is_noop()
    }

    /// The queue's own metrics, or `None` when metrics are off.
    pub(crate) fn queue_metrics(&self) -> Option<QueueMetrics> {
        self.metrics_enabled().then(|| QueueMetrics {
            depth: self.provider.new_depth_metric(&self.name),
            adds: self.provider.new_adds_metric(&self.name),
            timings: Timings::new(&*self.provider, &self.name, &self.clock),
        })
    }

    /// The queue's name and metrics provider, or `None` when metrics are off.
    pub(crate) fn enabled_provider(&self) -> Option<(&str, &Arc<dyn MetricsProvider>)> {
        self.metrics_enabled()
            .then_some((&self.name, &self.provider))
    }

    /// The delaying layer's `retries_total`, or `None` when metrics are off.
    pub(crate) fn retries_metric(&self) -> Option<Arc<dyn CounterMetric>> {
        self.metrics_enabled()
            .then(|| self.provider.new_retries_metric(&self.name))
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for QueueConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueConfig")
            .field("name", &self.name)
            .field("metrics", &self.metrics_enabled())
            .field("clock", &self.clock)
            .finish()
    }
}

/// A queue's metrics. The queue keeps, per item, when it was first added (until `get`) and
/// when it was handed out (until `done`), as client-go's `addTimes`/`processingStartTimes`.
pub(crate) struct QueueMetrics {
    depth: Arc<dyn GaugeMetric>,
    adds: Arc<dyn CounterMetric>,
    timings: Timings,
}

/// The time-based metrics every queue keeps the same way, the plain queues and the priority
/// queues (priority/metrics.rs) alike: how long items waited and were worked on, and the work
/// in progress.
pub(crate) struct Timings {
    pub(crate) clock: Arc<dyn Clock>,
    latency: Arc<dyn HistogramMetric>,
    work_duration: Arc<dyn HistogramMetric>,
    unfinished_work: Arc<dyn SettableGaugeMetric>,
    longest_running: Arc<dyn SettableGaugeMetric>,
}

impl Timings {
    pub(crate) fn new(provider: &dyn MetricsProvider, name: &str, clock: &Arc<dyn Clock>) -> Self {
        Self {
            clock: Arc::clone(clock),
            latency: provider.new_latency_metric(name),
            work_duration: provider.new_work_duration_metric(name),
            unfinished_work: provider.new_unfinished_work_seconds_metric(name),
            longest_running: provider.new_longest_running_processor_seconds_metric(name),
        }
    }

    /// An item waiting since `since` (if known) was handed out; returns its start time.
    pub(crate) fn handed_out(&self, since: Option<Time>) -> Time {
        let now = self.clock.now();
        if let Some(since) = since {
            self.latency
                .observe(seconds(now.saturating_duration_since(since)));
        }
        now
    }

    /// An item handed out at `started` (if known) is done.
    pub(crate) fn done(&self, started: Option<Time>) {
        if let Some(started) = started {
            let now = self.clock.now();
            self.work_duration
                .observe(seconds(now.saturating_duration_since(started)));
        }
    }

    /// Sets the unfinished-work gauges from the start times of the items being processed.
    pub(crate) fn update_unfinished(&self, started: impl IntoIterator<Item = Time>) {
        let (total, oldest) = unfinished_seconds(self.clock.now(), started);
        self.unfinished_work.set(total);
        self.longest_running.set(oldest);
    }
}

/// Seconds as client-go reports them: float64 nanoseconds over 1e9 (not
/// `Duration::as_secs_f64`, which can differ in the last bit).
fn seconds(elapsed: Duration) -> f64 {
    elapsed.as_nanos() as f64 / 1e9
}

impl QueueMetrics {
    /// An item was marked dirty; returns the time to keep as its add time (if it has none).
    pub(crate) fn added(&self) -> Time {
        self.adds.inc();
        self.depth.inc();
        self.timings.clock.now()
    }

    /// An item was handed out; `added_at` is its kept add time. Returns its start time.
    pub(crate) fn got(&self, added_at: Option<Time>) -> Time {
        self.depth.dec();
        self.timings.handed_out(added_at)
    }

    /// An item was done; `started_at` is its kept start time.
    pub(crate) fn done(&self, started_at: Option<Time>) {
        self.timings.done(started_at);
    }

    /// Sets the unfinished-work gauges from the start times of the items being processed.
    pub(crate) fn update_unfinished(&self, started: impl IntoIterator<Item = Time>) {
        self.timings.update_unfinished(started);
    }
}

/// The work in progress at `now`, from its start times: the seconds of all of it, and of the
/// oldest (client-go's `unfinished_work_seconds` and `longest_running_processor_seconds`).
fn unfinished_seconds(now: Time, started: impl IntoIterator<Item = Time>) -> (f64, f64) {
    let (mut total, mut oldest) = (0.0, 0.0);
    for started_at in started {
        let age = seconds(now.saturating_duration_since(started_at));
        total += age;
        if age > oldest {
            oldest = age;
        }
    }
    (total, oldest)
}

impl fmt::Debug for QueueMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueueMetrics").finish_non_exhaustive()
    }
}

#[cfg(all(test, not(kcache_loom)))]
mod tests {
    use super::*;
    use crate::sync::{lock, Mutex};
    use crate::workqueue::{
        DelayingQueue, FakeClock, ReferenceQueue, ShardedQueue, TryGet, WorkQueue,
    };
    use crate::Key;

    /// Records every metric event as a line.
    #[derive(Default)]
    struct Recorder(Arc<Mutex<Vec<String>>>);

    struct Metric(Arc<Mutex<Vec<String>>>, &'static str);
    impl GaugeMetric for Metric {
        fn inc(&self) {
            lock(&self.0).push(format!("{} +1", self.1));
        }
        fn dec(&self) {
            lock(&self.0).push(format!("{} -1", self.1));
        }
    }
    impl SettableGaugeMetric for Metric {
        fn set(&self, value: f64) {
            lock(&self.0).push(format!("{} ={value}", self.1));
        }
    }
    impl CounterMetric for Metric {
        fn inc(&self) {
            lock(&self.0).push(format!("{} +1", self.1));
        }
    }
    impl HistogramMetric for Metric {
        fn observe(&self, value: f64) {
            lock(&self.0).push(format!("{} {value}", self.1));
        }
    }

    impl MetricsProvider for Recorder {
        fn new_depth_metric(&self, _: &str) -> Arc<dyn GaugeMetric> {
            Arc::new(Metric(self.0.clone(), "depth"))
        }
        fn new_adds_metric(&self, _: &str) -> Arc<dyn CounterMetric> {
            Arc::new(Metric(self.0.clone(), "adds_total"))
        }
        fn new_latency_metric(&self, _: &str) -> Arc<dyn HistogramMetric> {
            Arc::new(Metric(self.0.clone(), "queue_duration_seconds"))
        }
        fn new_work_duration_metric(&self, _: &str) -> Arc<dyn HistogramMetric> {
            Arc::new(Metric(self.0.clone(), "work_duration_seconds"))
        }
        fn new_unfinished_work_seconds_metric(&self, _: &str) -> Arc<dyn SettableGaugeMetric> {
            Arc::new(Metric(self.0.clone(), "unfinished_work_seconds"))
        }
        fn new_longest_running_processor_seconds_metric(
            &self,
            _: &str,
        ) -> Arc<dyn SettableGaugeMetric> {
            Arc::new(Metric(self.0.clone(), "longest_running_processor_seconds"))
        }
        fn new_retries_metric(&self, _: &str) -> Arc<dyn CounterMetric> {
            Arc::new(Metric(self.0.clone(), "retries_total"))
        }
    }

    const MS: Duration = Duration::from_millis(1);

    /// The same client-go metric events, in the same order, from both queues.
    fn events<Q: WorkQueue + 'static>(make: impl FnOnce(&QueueConfig) -> Q) -> Vec<String> {
        let clock = Arc::new(FakeClock::new());
        let recorder = Recorder::default();
        let log = recorder.0.clone();
        let config = QueueConfig::new()
            .name("test")
            .metrics_provider(Arc::new(recorder))
            .clock(clock.clone());
        let q = DelayingQueue::with_config(make(&config), &config);
        let a = Key::new("a");
        q.add(a.clone());
        q.add(a.clone()); // dirty: not counted
        clock.step(5 * MS);
        assert_eq!(q.try_get(), TryGet::Item(a.clone()));
        q.add(a.clone()); // processing: counted, re-queued by done
        clock.step(7 * MS);
        q.update_unfinished_work();
        q.done(&a).unwrap();
        q.add_after(Key::new("b"), MS);
        let log = lock(&log).clone();
        log
    }

    #[test]
    fn both_queues_report_client_gos_metrics() {
        let expected = [
            "adds_total +1",
            "depth +1",
            "depth -1",
            "queue_duration_seconds 0.005",
            "adds_total +1",
            "depth +1",
            "unfinished_work_seconds =0.007",
            "longest_running_processor_seconds =0.007",
            "work_duration_seconds 0.007",
            "retries_total +1",
        ];
        assert_eq!(events(ReferenceQueue::with_config), expected);
        assert_eq!(events(|c| ShardedQueue::with_config(4, c)), expected);
    }

    #[test]
    fn unnamed_or_noop_queues_keep_no_metrics() {
        assert!(QueueConfig::new().queue_metrics().is_none());
        assert!(QueueConfig::new().name("x").queue_metrics().is_none());
        assert!(QueueConfig::new()
            .metrics_provider(Arc::new(Recorder::default()))
            .queue_metrics()
            .is_none());
        assert!(QueueConfig::new()
            .name("x")
            .metrics_provider(Arc::new(Recorder::default()))
            .queue_metrics()
            .is_some());
    }
}
