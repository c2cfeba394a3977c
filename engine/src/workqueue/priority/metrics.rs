//! The priority queues' metrics: client-go's workqueue metrics as controller-runtime's
//! priority queue keeps them, with the depth split by priority.
//!
//! The differences from [`QueueMetrics`](super::super::metrics) are controller-runtime's:
//! `adds_total` and `depth` count entries when they become *ready* (a waiting entry counts
//! when the clock or an add makes it ready), the depth gauge is told each entry's priority
//! ([`MetricsProvider::new_depth_with_priority_metric`]), a ready entry whose priority rises
//! moves from one level's depth to the other's, and `retries_total` counts the adds that
//! carried a delay.

use std::fmt;
use std::sync::Arc;

use super::super::clock::Time;
use super::super::metrics::{
    CounterMetric, DepthWithPriorityMetric, MetricsProvider, QueueConfig, Timings,
};
use super::Priority;

/// A priority queue's metrics. The per-key times live in the queue's entries.
pub(crate) struct PriorityMetrics {
    depth: Arc<dyn DepthWithPriorityMetric>,
    adds: Arc<dyn CounterMetric>,
    retries: Arc<dyn CounterMetric>,
    timings: Timings,
}

impl PriorityMetrics {
    /// The metrics `config` asks for, or `None` when they are off (no name, or the no-op
    /// provider).
    pub(crate) fn from_config(config: &QueueConfig) -> Option<Self> {
        let (name, provider): (&str, &Arc<dyn MetricsProvider>) = config.enabled_provider()?;
        Some(Self {
            depth: provider.new_depth_with_priority_metric(name),
            adds: provider.new_adds_metric(name),
            retries: provider.new_retries_metric(name),
            timings: Timings::new(&**provider, name, config.get_clock()),
        })
    }

    /// An entry became ready at `priority`; returns the time to keep as its ready time.
    pub(crate) fn add(&self, priority: Priority) -> Time {
        self.adds.inc();
        self.depth.inc(priority);
        self.timings.clock.now()
    }

    /// A ready entry's priority rose.
    pub(crate) fn move_depth(&self, from: Priority, to: Priority) {
        self.depth.dec(from);
        self.depth.inc(to);
    }

    /// An entry ready since `ready_since` was handed out; returns its start time.
    pub(crate) fn get(&self, priority: Priority, ready_since: Time) -> Time {
        self.depth.dec(priority);
        self.timings.handed_out(Some(ready_since))
    }

    /// A key handed out at `started` is done.
    pub(crate) fn done(&self, started: Time) {
        self.timings.done(Some(started));
    }

    /// An add carried a delay.
    pub(crate) fn retry(&self) {
        self.retries.inc();
    }

    /// Sets the unfinished-work gauges from the start times of the keys being processed.
    pub(crate) fn update_unfinished(&self, started: impl IntoIterator<Item = Time>) {
        self.timings.update_unfinished(started);
    }
}

impl fmt::Debug for PriorityMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PriorityMetrics").finish_non_exhaustive()
    }
}
