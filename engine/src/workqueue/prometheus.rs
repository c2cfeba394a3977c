//! The Prometheus exporter for the work queue metrics (feature `prometheus`).
//!
//! [`PrometheusMetrics`] registers client-go's seven metrics in a `prometheus_client`
//! [`Registry`] under the `workqueue_` prefix, one time series per queue name (label `name`),
//! as Kubernetes components export them; `prometheus_client` writes the text exposition format.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};

use super::metrics::{
    CounterMetric, DepthWithPriorityMetric, GaugeMetric, HistogramMetric, MetricsProvider,
    SettableGaugeMetric,
};
use super::priority::Priority;

/// A series' labels: `name` here, `controller` (and `result`) in the controller's exporter
/// (controller/metrics.rs), which shares these adapters.
pub(crate) type Labels = Vec<(String, String)>;

/// A gauge holding an `f64` (the settable ones).
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// Kubernetes' buckets for both duration histograms: 10 ns to 10 s... 100 s, by tens.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

/// A [`MetricsProvider`] that feeds a `prometheus_client` registry.
///
/// ```
/// use std::sync::Arc;
/// use kcache::Key;
/// use kcache::workqueue::{PrometheusMetrics, QueueConfig, ShardedQueue, WorkQueue};
/// use prometheus_client::registry::{Metric, Registry};
///
/// let mut registry = Registry::default();
/// let metrics = Arc::new(PrometheusMetrics::new(&mut registry));
/// let q = ShardedQueue::with_config(4, &QueueConfig::new().name("pods").metrics_provider(metrics));
/// q.add(Key::new("ns/a"));
/// let mut text = String::new();
/// prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
/// assert!(text.contains("workqueue_adds_total{name=\"pods\"} 1"));
/// assert!(text.contains("workqueue_depth{name=\"pods\"} 1"));
/// ```
#[derive(Debug, Clone)]
pub struct PrometheusMetrics {
    depth: Family<Labels, Gauge>,
    adds: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
    work_duration: Family<Labels, Histogram, fn() -> Histogram>,
    unfinished_work: Family<Labels, FloatGauge>,
    longest_running: Family<Labels, FloatGauge>,
    retries: Family<Labels, Counter>,
}

impl PrometheusMetrics {
    /// Registers the metrics in `registry` under the `workqueue` prefix.
    pub fn new(registry: &mut Registry) -> Self {
        let r = registry.sub_registry_with_prefix("workqueue");
        // prometheus_client appends `_total` to counters.
        Self {
            depth: registered(r, "depth", "Current depth of workqueue", Family::default()),
            adds: registered(
                r,
                "adds",
                "Total number of adds handled by workqueue",
                Family::default(),
            ),
            latency: registered(
                r,
                "queue_duration_seconds",
                "How long in seconds an item stays in workqueue before being requested.",
                Family::new_with_constructor(duration_histogram),
            ),
            work_duration: registered(
                r,
                "work_duration_seconds",
                "How long in seconds processing an item from workqueue takes.",
                Family::new_with_constructor(duration_histogram),
            ),
            unfinished_work: registered(
                r,
                "unfinished_work_seconds",
                "How many seconds of work has done that is in progress and hasn't been observed by \
                 work_duration. Large values indicate stuck threads.",
                Family::default(),
            ),
            longest_running: registered(
                r,
                "longest_running_processor_seconds",
                "How many seconds has the longest running processor for workqueue been running.",
                Family::default(),
            ),
            retries: registered(
                r,
                "retries",
                "Total number of retries handled by workqueue",
                Family::default(),
            ),
        }
    }
}

/// `metric`, once registered in `registry` as `name` (the families are handles: the registry
/// and the exporter share the series).
pub(crate) fn registered<M: Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

/// The one label `key=value`.
pub(crate) fn label(key: &str, value: &str) -> Labels {
    vec![(key.to_string(), value.to_string())]
}

fn labels(name: &str) -> Labels {
    label("name", name)
}

struct IntGauge(Gauge);
impl GaugeMetric for IntGauge {
    fn inc(&self) {
        self.0.inc();
    }
    fn dec(&self) {
        self.0.dec();
    }
}

/// The depth of a priority queue: one `workqueue_depth` series per queue name and priority
/// (label `priority`), as controller-runtime exports it.
struct PriorityDepth {
    family: Family<Labels, Gauge>,
    name: String,
}

impl PriorityDepth {
    fn at(&self, priority: Priority) -> Gauge {
        let mut labels = labels(&self.name);
        labels.push(("priority".to_string(), priority.to_string()));
        self.family.get_or_create(&labels).clone()
    }
}

impl DepthWithPriorityMetric for PriorityDepth {
    fn inc(&self, priority: Priority) {
        self.at(priority).inc();
    }
    fn dec(&self, priority: Priority) {
        self.at(priority).dec();
    }
}

struct SetGauge(FloatGauge);
impl SettableGaugeMetric for SetGauge {
    fn set(&self, value: f64) {
        self.0.set(value);
    }
}

struct Count(Counter);
impl CounterMetric for Count {
    fn inc(&self) {
        self.0.inc();
    }
}

struct Hist(Histogram);
impl HistogramMetric for Hist {
    fn observe(&self, value: f64) {
        self.0.observe(value);
    }
}

/// The counter of `family` labelled `labels`, behind the queue's metric trait.
pub(crate) fn counter(family: &Family<Labels, Counter>, labels: &Labels) -> Arc<dyn CounterMetric> {
    Arc::new(Count(family.get_or_create(labels).clone()))
}

/// The histogram of `family` labelled `labels`, behind the queue's metric trait.
pub(crate) fn histogram(
    family: &Family<Labels, Histogram, fn() -> Histogram>,
    labels: &Labels,
) -> Arc<dyn HistogramMetric> {
    Arc::new(Hist(family.get_or_create(labels).clone()))
}

fn float_gauge(family: &Family<Labels, FloatGauge>, name: &str) -> Arc<dyn SettableGaugeMetric> {
    Arc::new(SetGauge(family.get_or_create(&labels(name)).clone()))
}

impl MetricsProvider for PrometheusMetrics {
    fn new_depth_metric(&self, name: &str) -> Arc<dyn GaugeMetric> {
        Arc::new(IntGauge(self.depth.get_or_create(&labels(name)).clone()))
    }
    fn new_adds_metric(&self, name: &str) -> Arc<dyn CounterMetric> {
        counter(&self.adds, &labels(name))
    }
    fn new_latency_metric(&self, name: &str) -> Arc<dyn HistogramMetric> {
        histogram(&self.latency, &labels(name))
    }
    fn new_work_duration_metric(&self, name: &str) -> Arc<dyn HistogramMetric> {
        histogram(&self.work_duration, &labels(name))
    }
    fn new_unfinished_work_seconds_metric(&self, name: &str) -> Arc<dyn SettableGaugeMetric> {
        float_gauge(&self.unfinished_work, name)
    }
    fn new_longest_running_processor_seconds_metric(
        &self,
        name: &str,
    ) -> Arc<dyn SettableGaugeMetric> {
        float_gauge(&self.longest_running, name)
    }
    fn new_retries_metric(&self, name: &str) -> Arc<dyn CounterMetric> {
        counter(&self.retries, &labels(name))
    }
    fn new_depth_with_priority_metric(&self, name: &str) -> Arc<dyn DepthWithPriorityMetric> {
        Arc::new(PriorityDepth {
            family: self.depth.clone(),
            name: name.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workqueue::{
        DelayingQueue, FakeClock, QueueConfig, ReferenceQueue, ShardedQueue, WorkQueue,
    };
    use crate::Key;
    use prometheus_client::encoding::text::encode;
    use std::time::Duration;

    /// Asserts that the text exposition of `registry` holds every one of `lines`.
    fn assert_exports(registry: &Registry, lines: &[&str]) {
        let mut text = String::new();
        encode(&mut text, registry).unwrap();
        for line in lines {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn exports_every_metric_in_the_text_format_per_queue_name() {
        let mut registry = Registry::default();
        let metrics = Arc::new(PrometheusMetrics::new(&mut registry));
        let clock = Arc::new(FakeClock::new());
        let config = |name: &str| {
            QueueConfig::new()
                .name(name)
                .metrics_provider(metrics.clone())
                .clock(clock.clone())
        };
        let sharded = DelayingQueue::with_config(
            ShardedQueue::with_config(4, &config("sharded")),
            &config("sharded"),
        );
        let reference = ReferenceQueue::with_config(&config("reference"));
        for q in [&sharded as &dyn WorkQueue, &reference] {
            q.add(Key::new("a"));
            q.add(Key::new("b"));
            clock.step(Duration::from_millis(2));
            let a = q.get().unwrap();
            clock.step(Duration::from_millis(3));
            q.update_unfinished_work();
            q.done(&a).unwrap();
        }
        sharded.add_after(Key::new("c"), Duration::from_millis(1));
        assert_exports(
            &registry,
            &[
                "# TYPE workqueue_depth gauge",
                "workqueue_depth{name=\"sharded\"} 1",
                "workqueue_depth{name=\"reference\"} 1",
                "workqueue_adds_total{name=\"sharded\"} 2",
                "workqueue_retries_total{name=\"sharded\"} 1",
                "# TYPE workqueue_queue_duration_seconds histogram",
                "workqueue_queue_duration_seconds_sum{name=\"reference\"} 0.002",
                "workqueue_queue_duration_seconds_count{name=\"reference\"} 1",
                "workqueue_work_duration_seconds_sum{name=\"sharded\"} 0.003",
                "workqueue_unfinished_work_seconds{name=\"sharded\"} 0.003",
                "workqueue_longest_running_processor_seconds{name=\"reference\"} 0.003",
                "workqueue_work_duration_seconds_bucket{le=\"0.01\",name=\"sharded\"} 1",
            ],
        );
    }

    #[test]
    fn a_priority_queue_exports_its_depth_per_priority() {
        use crate::workqueue::priority::{AddOpts, PriorityWorkQueue, ShardedPriorityQueue};
        let mut registry = Registry::default();
        let metrics = Arc::new(PrometheusMetrics::new(&mut registry));
        let config = QueueConfig::new().name("pods").metrics_provider(metrics);
        let q = ShardedPriorityQueue::with_config(4, &config);
        q.add_with_opts(AddOpts::new().priority(-100), Key::new("a"));
        q.add_with_opts(AddOpts::new().priority(-100), Key::new("b"));
        q.add(Key::new("c"));
        assert_exports(
            &registry,
            &[
                "workqueue_depth{name=\"pods\",priority=\"-100\"} 2",
                "workqueue_depth{name=\"pods\",priority=\"0\"} 1",
                "workqueue_adds_total{name=\"pods\"} 3",
            ],
        );
    }
}
