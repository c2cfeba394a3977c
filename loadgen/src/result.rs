//! One engine's measured result on one workload: the row every report shows and the JSON a
//! child process hands its parent (so the layers that run engines and those that report on
//! them share these types without importing each other).

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::measure::cpu::{cpu_figures, CpuProbe};
use crate::measure::latency::Percentiles;
use crate::measure::rss::{PeakSource, RssProbe};
use crate::measure::timeline::Interval;

/// Enqueue-to-pop latency percentiles in microseconds; all `null` where nothing was queued (W4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyUs {
    /// Median.
    pub p50: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// 99.9th percentile.
    pub p999: Option<f64>,
}

/// One row of a report; the JSON object of `results[]`.
///
/// `Default` leaves every per-path field empty (`controller`, `handlers`, `informer`,
/// `timeline`, the paced-run figures), so each path names only the fields it fills.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// `reference` or `sharded`.
    pub engine: String,
    /// `w1` .. `w5`, or `replay`.
    pub workload: String,
    /// Distinct keys of the workload.
    pub keys: usize,
    /// Objects handed to the engine: adds, updates, deletes and relisted objects.
    pub events: u64,
    /// Wall time of the run (enqueue of the first event to the end of the drain).
    pub wall_s: f64,
    /// `events / wall_s`; for W4 the writer's rate.
    pub events_per_s: f64,
    /// Keys popped.
    pub pops: u64,
    /// Deltas per pop; `null` for W4, which pops nothing.
    pub deltas_per_pop: Option<f64>,
    /// Enqueue-to-pop latency of the sampled events.
    pub latency_us: LatencyUs,
    /// Peak resident memory the engine added over the generated events; `null` if unknown.
    pub peak_rss_bytes: Option<u64>,
    /// How `peak_rss_bytes` was measured: `hwm` (VmHWM after reset) or `rss_end`.
    pub peak_rss_source: Option<String>,
    /// User + system CPU of the whole process over the run, in seconds ([`cpu`](crate::measure::cpu));
    /// `null` without `/proc`.
    #[serde(default)]
    pub cpu_s: Option<f64>,
    /// `cpu_s` per event, in microseconds: what one event cost the machine, whatever the
    /// number of threads that shared it.
    #[serde(default)]
    pub cpu_us_per_event: Option<f64>,
    /// W4: reads per second by all readers together (`get` and `by_index` each count one).
    pub reads_per_s: Option<f64>,
    /// Consumer threads (readers for W4).
    pub threads: usize,
    /// Shards of the sharded engine; `null` for the reference.
    pub shards: Option<usize>,
    /// Deltas delivered.
    pub deltas: u64,
    /// The offered load of a paced run (`--rate`), in ops per second; `null` when flat out.
    pub offered_rate: Option<u64>,
    /// A paced run: the producer's largest lag behind its schedule, in milliseconds.
    pub producer_lag_ms: Option<f64>,
    /// A paced run: whether that lag stayed within 1% of the scheduled length
    /// ([`kept_schedule`](crate::harness::pacing::kept_schedule)).
    pub kept_up: Option<bool>,
    /// W6 only: workers, reconciles, retries (`null` for the other workloads).
    #[serde(default)]
    pub controller: Option<ControllerFigures>,
    /// `ok`, or `FAIL: ...` with the first failed rule.
    pub verdict: String,
    /// Every failed rule (empty when `ok`).
    pub failures: Vec<String>,
    /// `--through informer`: one verdict per handler (absent otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handlers: Vec<HandlerResult>,
    /// `--through informer`: what the reflector did (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub informer: Option<InformerStats>,
    /// W8: the waits of each class of keys and each namespace's share of the workers
    /// (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<SchedulingFigures>,
    /// Latency per interval of the run (`run --timeline`); absent unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Vec<Interval>>,
}

/// One handler of a run through the informer (`loadgen run --through informer`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HandlerResult {
    /// Its number, in registration order.
    pub handler: usize,
    /// Whether it is the slow one.
    pub slow: bool,
    /// Handler calls.
    pub notifications: u64,
    /// Deletions it learnt from a relist (tombstones).
    pub tombstones: u64,
    /// When its view became the final state, from the informer's start; `null` if never.
    pub caught_up_s: Option<f64>,
    /// The most notifications waiting in its buffer at once.
    #[serde(default)]
    pub peak_pending: u64,
    /// How often a consumer waited for it (back-pressure).
    #[serde(default)]
    pub waits: u64,
    /// Notifications merged away while it lagged (a handler that coalesces when full).
    #[serde(default)]
    pub merged: u64,
    /// `ok`, or `FAIL: ...`.
    pub verdict: String,
    /// Every failed rule of this handler.
    pub failures: Vec<String>,
}

/// What the reflector of a run through the informer did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InformerStats {
    /// List calls served (pages count one each).
    pub lists: u64,
    /// Watch calls served.
    pub watches: u64,
    /// Errors the reflector reported (the scripted outages and 410s among them).
    pub reflector_errors: u64,
    /// Scripted 410s no watch had received yet when the run ended.
    #[serde(default)]
    pub expired_watches_pending: u64,
    /// Workload resyncs left out (the informer resyncs on its own timer).
    pub skipped_resyncs: u64,
    /// Milliseconds the producer waited for a reflector that fell half the server's window
    /// behind (waiting keeps its watch from expiring into a relist).
    #[serde(default)]
    pub producer_held_ms: u64,
}

/// W6's figures beyond a W1 row's, in the report's `controller` field.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ControllerFigures {
    /// Worker threads.
    pub workers: usize,
    /// CPU microseconds each reconcile burnt.
    pub reconcile_us: u64,
    /// Reconciles done (failed ones included).
    pub reconciles: u64,
    /// `reconciles / wall_s`.
    pub reconciles_per_s: f64,
    /// `reconciles / events`: below 1 when the workqueue merged a key's events.
    pub reconciles_per_event: f64,
    /// Reconciles that failed and were re-added with `add_rate_limited`.
    pub retries: u64,
}

/// W8's figures: how one workqueue order shared saturated workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulingFigures {
    /// `mixed` (a flood, a backlog and a trickle) or `tenants` (two namespaces at 10:1).
    pub scenario: String,
    /// The workqueue's order: `fifo`, `priority`, `aging`, `fair` or `aging-fair`.
    pub queue: String,
    /// Aging's bound, in milliseconds; `null` without aging.
    pub max_wait_ms: Option<u64>,
    /// Keys the workers could reconcile per second if they never waited: workers (at most
    /// the cores) over the reconcile cost. The offered rates are multiples of it.
    pub capacity_per_s: f64,
    /// Hand-outs aging reordered (the queue's `overdue_handouts`); 0 without aging.
    pub overdue_handouts: u64,
    /// The waits of each class of keys, in the scenario's order.
    pub classes: Vec<ClassWaits>,
    /// Each namespace's share of the workers' reconcile time, in the scenario's order.
    pub groups: Vec<GroupShare>,
}

/// The waits of one class of keys: from the moment a key was ready in the queue to the start
/// of its reconcile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassWaits {
    /// `churn` (the flooding namespace's live changes), `backlog` (the initial list's keys, at
    /// low priority), `trickle` (the other namespaces' live changes), or a tenant's namespace.
    pub class: String,
    /// Keys of the class handed to a worker.
    pub served: u64,
    /// Keys of the class still ready in the queue when the run ended.
    pub waiting_at_end: u64,
    /// Median wait of the served keys, in milliseconds; `null` if none was served.
    pub p50_ms: Option<f64>,
    /// 99th percentile wait of the served keys, in milliseconds.
    pub p99_ms: Option<f64>,
    /// Longest wait, in milliseconds, exact (the percentiles keep 3 significant digits),
    /// counting the keys still waiting at the end (their wait so far): what starvation shows
    /// as.
    pub max_ms: Option<f64>,
}

/// One namespace's share of the workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupShare {
    /// The namespace.
    pub group: String,
    /// Its reconciles.
    pub reconciles: u64,
    /// Its reconciles' time over all reconciles' time (the shares sum to 1).
    pub share: f64,
}

impl LatencyUs {
    /// The percentiles of `hist`; all `null` when it holds no sample.
    pub fn of(hist: &Histogram<u64>) -> Self {
        Percentiles::of(hist).map_or(LatencyUs::default(), |p| LatencyUs {
            p50: Some(p.p50),
            p99: Some(p.p99),
            p999: Some(p.p999),
        })
    }
}

/// `peak_rss_bytes` and `peak_rss_source` of a run from what its [`RssProbe`] found.
pub fn peak_rss(peak: Option<(u64, PeakSource)>) -> (Option<u64>, Option<String>) {
    let source = peak.map(|(_, source)| {
        match source {
            PeakSource::HighWaterMark => "hwm",
            PeakSource::EndResident => "rss_end",
        }
        .to_string()
    });
    (peak.map(|(bytes, _)| bytes), source)
}

/// What a run costs the machine: started right before the run, finished right after it.
pub struct Meter {
    rss: RssProbe,
    cpu: CpuProbe,
}

impl Meter {
    /// Starts measuring peak memory and CPU.
    pub fn start() -> Self {
        Self {
            rss: RssProbe::start(),
            cpu: CpuProbe::start(),
        }
    }

    /// Stops measuring: what the run spent.
    pub fn finish(self) -> Spent {
        Spent {
            peak: self.rss.finish(),
            cpu: self.cpu.finish(),
        }
    }
}

/// The peak memory and CPU a run spent ([`Meter`]).
#[derive(Debug, Clone, Copy)]
pub struct Spent {
    peak: Option<(u64, PeakSource)>,
    cpu: Option<std::time::Duration>,
}

impl Spent {
    /// The row every path starts from: who ran (`engine`), what (`workload`, its `keys` and
    /// `events`), for how long (`wall`) and at what cost; every other field empty.
    pub fn row(
        self,
        engine: &str,
        workload: &str,
        keys: usize,
        events: u64,
        wall: std::time::Duration,
    ) -> RunResult {
        let wall_s = wall.as_secs_f64().max(1e-9);
        let (peak_rss_bytes, peak_rss_source) = peak_rss(self.peak);
        let (cpu_s, cpu_us_per_event) = cpu_figures(self.cpu, events);
        RunResult {
            engine: engine.to_string(),
            workload: workload.to_string(),
            keys,
            events,
            wall_s,
            events_per_s: events as f64 / wall_s,
            peak_rss_bytes,
            peak_rss_source,
            cpu_s,
            cpu_us_per_event,
            ..RunResult::default()
        }
    }
}

impl RunResult {
    /// Whether the verdict is `ok`.
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }
}
