//! What a controller counts about its reconciles, under controller-runtime's names:
//! `controller_runtime_reconcile_total{controller, result}`,
//! `controller_runtime_reconcile_errors_total{controller}` and
//! `controller_runtime_reconcile_time_seconds{controller}`. The workqueue's own metrics
//! (client-go's `workqueue_*`) come from the queue's [`QueueConfig`](crate::workqueue::QueueConfig).
//!
//! The counts are always kept ([`ReconcileStats`], a few relaxed atomic adds per reconcile);
//! a [`ReconcileMetricsProvider`] exports them as well (with the `prometheus` feature,
//! [`ControllerPrometheus`]).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::workqueue::{CounterMetric, HistogramMetric};

/// How a reconcile ended, as controller-runtime's `result` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReconcileResult {
    /// `Action::Done`: `success`.
    Success,
    /// `Action::RequeueAfter`: `requeue_after`.
    RequeueAfter,
    /// An error (or a panic): `error`.
    Error,
}

impl ReconcileResult {
    /// The `result` label's value.
    pub fn label(self) -> &'static str {
        match self {
            ReconcileResult::Success => "success",
            ReconcileResult::RequeueAfter => "requeue_after",
            ReconcileResult::Error => "error",
        }
    }

    const ALL: [ReconcileResult; 3] = [
        ReconcileResult::Success,
        ReconcileResult::RequeueAfter,
        ReconcileResult::Error,
    ];
}

/// Makes the exported reconcile metrics of a controller named `controller`.
pub trait ReconcileMetricsProvider: Send + Sync {
    /// `controller_runtime_reconcile_total{controller, result}`.
    fn new_reconcile_total_metric(
        &self,
        controller: &str,
        result: ReconcileResult,
    ) -> Arc<dyn CounterMetric>;
    /// `controller_runtime_reconcile_errors_total{controller}`.
    fn new_reconcile_errors_metric(&self, controller: &str) -> Arc<dyn CounterMetric>;
    /// `controller_runtime_reconcile_time_seconds{controller}`.
    fn new_reconcile_time_metric(&self, controller: &str) -> Arc<dyn HistogramMetric>;
    /// `kcache_controller_cache_wait_timeouts_total{controller}`: reconciles that started
    /// before the cache applied their key's last write, because the wait for it timed out
    /// (kcache's own; `None`, the default, exports nothing).
    fn new_cache_wait_timeouts_metric(&self, _controller: &str) -> Option<Arc<dyn CounterMetric>> {
        None
    }
}

/// A snapshot of a controller's reconcile counts ([`Controller::stats`](super::Controller::stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReconcileStats {
    /// Reconciles that returned `Action::Done`.
    pub success: u64,
    /// Reconciles that returned `Action::RequeueAfter`.
    pub requeue_after: u64,
    /// Reconciles that returned an error or panicked (each retried, rate limited).
    pub errors: u64,
    /// Of `errors`, the reconciles that panicked.
    pub panics: u64,
    /// Keys a worker took from the queue while the controller was stopping, and left
    /// unreconciled.
    pub skipped_at_shutdown: u64,
    /// Time spent in reconciles, all of them.
    pub total_time: Duration,
    /// Reconciles that first waited for the cache to apply the version their key's previous
    /// reconcile wrote ([`Request::wrote`](super::Request::wrote)).
    pub cache_waits: u64,
    /// Of `cache_waits`, the ones the timeout ended: the reconcile ran on a cache that may not
    /// hold its own write yet.
    pub cache_wait_timeouts: u64,
    /// Workers waiting for the cache right now.
    pub waiting_for_cache: u64,
}

impl ReconcileStats {
    /// Every reconcile that ran.
    pub fn reconciles(&self) -> u64 {
        self.success + self.requeue_after + self.errors
    }
}

/// The counters the workers update, and the exported metrics they feed.
pub(crate) struct ReconcileMetrics {
    counts: [AtomicU64; 3],
    panics: AtomicU64,
    skipped: AtomicU64,
    time_ns: AtomicU64,
    cache_waits: AtomicU64,
    cache_wait_timeouts: AtomicU64,
    waiting_for_cache: AtomicU64,
    exported: Option<Exported>,
}

struct Exported {
    totals: [Arc<dyn CounterMetric>; 3],
    errors: Arc<dyn CounterMetric>,
    time: Arc<dyn HistogramMetric>,
    cache_wait_timeouts: Option<Arc<dyn CounterMetric>>,
}

impl ReconcileMetrics {
    pub(crate) fn new(controller: &str, provider: Option<&dyn ReconcileMetricsProvider>) -> Self {
        let exported = provider.map(|p| Exported {
            totals: ReconcileResult::ALL.map(|r| p.new_reconcile_total_metric(controller, r)),
            errors: p.new_reconcile_errors_metric(controller),
            time: p.new_reconcile_time_metric(controller),
            cache_wait_timeouts: p.new_cache_wait_timeouts_metric(controller),
        });
        Self {
            counts: Default::default(),
            panics: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            time_ns: AtomicU64::new(0),
            cache_waits: AtomicU64::new(0),
            cache_wait_timeouts: AtomicU64::new(0),
            waiting_for_cache: AtomicU64::new(0),
            exported,
        }
    }

    /// One reconcile ended as `result` after `took`.
    pub(crate) fn observe(&self, result: ReconcileResult, took: Duration, panicked: bool) {
        let index = result as usize;
        // Relaxed, like every count here: they are statistics, read with no other memory
        // depending on them.
        self.counts[index].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.time_ns.fetch_add(nanos, Ordering::Relaxed);
        if panicked {
            self.panics.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(exported) = &self.exported {
            exported.totals[index].inc();
            if result == ReconcileResult::Error {
                exported.errors.inc();
            }
            exported.time.observe(took.as_secs_f64());
        }
    }

    pub(crate) fn skipped(&self) {
        self.skipped.fetch_add(1, Ordering::Relaxed);
    }

    /// A worker starts waiting for the cache.
    pub(crate) fn cache_wait_started(&self) {
        self.cache_waits.fetch_add(1, Ordering::Relaxed);
        self.waiting_for_cache.fetch_add(1, Ordering::Relaxed);
    }

    /// A worker's wait for the cache ended; `timed_out` if the timeout ended it.
    pub(crate) fn cache_wait_ended(&self, timed_out: bool) {
        self.waiting_for_cache.fetch_sub(1, Ordering::Relaxed);
        if timed_out {
            self.cache_wait_timeouts.fetch_add(1, Ordering::Relaxed);
            if let Some(counter) = self
                .exported
                .as_ref()
                .and_then(|e| e.cache_wait_timeouts.as_ref())
            {
                counter.inc();
            }
        }
    }

    pub(crate) fn snapshot(&self) -> ReconcileStats {
        let count = |r: ReconcileResult| self.counts[r as usize].load(Ordering::Relaxed);
        ReconcileStats {
            success: count(ReconcileResult::Success),
            requeue_after: count(ReconcileResult::RequeueAfter),
            errors: count(ReconcileResult::Error),
            panics: self.panics.load(Ordering::Relaxed),
            skipped_at_shutdown: self.skipped.load(Ordering::Relaxed),
            total_time: Duration::from_nanos(self.time_ns.load(Ordering::Relaxed)),
            cache_waits: self.cache_waits.load(Ordering::Relaxed),
            cache_wait_timeouts: self.cache_wait_timeouts.load(Ordering::Relaxed),
            waiting_for_cache: self.waiting_for_cache.load(Ordering::Relaxed),
        }
    }
}

impl fmt::Debug for ReconcileMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReconcileMetrics")
            .field("stats", &self.snapshot())
            .field("exported", &self.exported.is_some())
            .finish()
    }
}

#[cfg(feature = "prometheus")]
pub use self::prometheus::ControllerPrometheus;

#[cfg(feature = "prometheus")]
mod prometheus {
    use std::sync::Arc;

    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    use super::{ReconcileMetricsProvider, ReconcileResult};
    // The workqueue exporter's adapters from `prometheus_client` types to the metric traits.
    use crate::workqueue::prometheus::{counter, histogram, label, registered, Labels};
    use crate::workqueue::{CounterMetric, HistogramMetric};

    /// controller-runtime's buckets for `reconcile_time_seconds`, 5 ms to 60 s.
    const RECONCILE_TIME_BUCKETS: [f64; 40] = [
        0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8,
        0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0,
        15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0,
    ];

    fn reconcile_time_histogram() -> Histogram {
        Histogram::new(RECONCILE_TIME_BUCKETS.into_iter())
    }

    /// A [`ReconcileMetricsProvider`] that feeds a `prometheus_client` registry under
    /// controller-runtime's names (the `controller_runtime_` prefix).
    ///
    /// ```
    /// use kcache::controller::ControllerPrometheus;
    /// use prometheus_client::registry::Registry;
    ///
    /// let mut registry = Registry::default();
    /// let metrics = ControllerPrometheus::new(&mut registry);
    /// # let _ = metrics;
    /// ```
    #[derive(Debug, Clone)]
    pub struct ControllerPrometheus {
        totals: Family<Labels, Counter>,
        errors: Family<Labels, Counter>,
        time: Family<Labels, Histogram, fn() -> Histogram>,
        cache_wait_timeouts: Family<Labels, Counter>,
    }

    impl ControllerPrometheus {
        /// Registers the metrics in `registry` under the `controller_runtime` prefix.
        pub fn new(registry: &mut Registry) -> Self {
            // kcache's own, beside controller-runtime's names.
            let cache_wait_timeouts = registered(
                registry.sub_registry_with_prefix("kcache_controller"),
                "cache_wait_timeouts",
                "Reconciles that started before the cache applied their key's last write",
                Family::default(),
            );
            let r = registry.sub_registry_with_prefix("controller_runtime");
            // prometheus_client appends `_total` to counters.
            Self {
                totals: registered(
                    r,
                    "reconcile",
                    "Total number of reconciliations per controller",
                    Family::default(),
                ),
                errors: registered(
                    r,
                    "reconcile_errors",
                    "Total number of reconciliation errors per controller",
                    Family::default(),
                ),
                time: registered(
                    r,
                    "reconcile_time_seconds",
                    "Length of time per reconciliation per controller",
                    Family::new_with_constructor(reconcile_time_histogram),
                ),
                cache_wait_timeouts,
            }
        }
    }

    fn controller_label(controller: &str) -> Labels {
        label("controller", controller)
    }

    impl ReconcileMetricsProvider for ControllerPrometheus {
        fn new_reconcile_total_metric(
            &self,
            controller: &str,
            result: ReconcileResult,
        ) -> Arc<dyn CounterMetric> {
            let mut labels = controller_label(controller);
            labels.push(("result".to_string(), result.label().to_string()));
            counter(&self.totals, &labels)
        }
        fn new_reconcile_errors_metric(&self, controller: &str) -> Arc<dyn CounterMetric> {
            counter(&self.errors, &controller_label(controller))
        }
        fn new_reconcile_time_metric(&self, controller: &str) -> Arc<dyn HistogramMetric> {
            histogram(&self.time, &controller_label(controller))
        }
        fn new_cache_wait_timeouts_metric(
            &self,
            controller: &str,
        ) -> Option<Arc<dyn CounterMetric>> {
            Some(counter(
                &self.cache_wait_timeouts,
                &controller_label(controller),
            ))
        }
    }
}
