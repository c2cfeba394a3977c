//! The capacity search: the highest offered rate an engine keeps up with (docs/workloads.md,
//! "Capacity"), with the latency curve that leads to it.
//!
//! A probe is one paced run (`run --rate R`) in a child process of its own, so each probe's
//! peak memory is its own. A probe *passes* when the producer kept its schedule (its largest
//! lag within 1% of the scheduled length, [`kept_schedule`](crate::harness::pacing::kept_schedule)),
//! the p99 enqueue-to-pop latency is within the limit (`--p99-ms`, 10 ms by default) and the
//! verdict is ok. [`search`] chooses the rates: a coarse geometric sweep until the first
//! failure, then bisection between the last passing and the first failing rate. It is a pure
//! function of its probe, so the tests drive it with fake ones.
//!
//! On a shared machine a probe can fail from noise (another process takes the core), never
//! pass from it: a failed rate is tried again (`--tries`, 2 by default) and passes if any try
//! passes. Every try is reported.

use serde::Serialize;

use crate::engines::{EngineConfig, EngineKind};
use crate::harness::informer_handlers::InformerConfig;
use crate::pipelines::bare::RunError;
use crate::pipelines::harness_floor::Subject;
use crate::result::{LatencyUs, RunResult};
use crate::runner::run_spec::{Pipeline, RunSpec, Source};
use crate::ui::Ui;
use crate::units::si;
use workloads::{Workload, WorkloadSpec};

/// How the rates of a search are chosen, and when it stops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SearchPlan {
    /// The first rate tried.
    pub start: u64,
    /// The lowest rate tried when even `start` fails.
    pub min: u64,
    /// The highest rate tried: everything passing up to here ends the search.
    pub max: u64,
    /// The coarse sweep multiplies (or, below a failing start, divides) by this.
    pub factor: f64,
    /// Bisection stops when the lowest failing rate is within this fraction above the
    /// highest passing one (0.05: 5%).
    pub precision: f64,
    /// Tries per rate: a rate fails only when every try fails.
    pub tries: usize,
    /// Probes at most, tries included.
    pub max_probes: usize,
}

impl SearchPlan {
    /// Refuses a plan that cannot search: rates out of order, a factor that does not grow, a
    /// precision that is not positive, no tries or no probes.
    pub fn check(&self) -> Result<(), String> {
        if self.min == 0 || self.min > self.max {
            return Err(format!(
                "the rates must satisfy 1 <= --min-rate <= --max-rate (got {} and {})",
                self.min, self.max
            ));
        }
        if !(self.factor.is_finite() && self.factor > 1.0) {
            return Err(format!(
                "the sweep factor must be above 1 (got {})",
                self.factor
            ));
        }
        if !(self.precision.is_finite() && self.precision > 0.0) {
            return Err(format!(
                "--precision must be a positive percentage (got {})",
                self.precision * 100.0
            ));
        }
        if self.tries == 0 || self.max_probes == 0 {
            return Err("--tries and --max-probes must be at least 1".to_string());
        }
        Ok(())
    }
}

/// Why a search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// The capacity passed, and a rate within the precision above it failed.
    Bracketed,
    /// Every rate up to the plan's maximum passed: the capacity is at least that.
    Cap,
    /// Even the plan's minimum failed: the capacity is below it.
    NothingPassed,
    /// The probe budget ran out first; the capacity is the highest rate that passed so far.
    ProbeLimit,
}

/// One probe of a search: the rate, whether it passed, and what the probe returned.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Attempt<T> {
    /// The offered rate.
    pub rate: u64,
    /// Whether it passed.
    pub passed: bool,
    /// What the probe measured.
    #[serde(flatten)]
    pub data: T,
}

/// What a search found.
#[derive(Debug, Clone, PartialEq)]
pub struct Search<T> {
    /// The highest rate that passed (every rate settled below it passed too; see [`search`]);
    /// `None` when nothing passed.
    pub capacity: Option<u64>,
    /// The lowest rate that failed every try above the capacity, if one was tried.
    pub failing: Option<u64>,
    /// Why the search ended.
    pub bound: Bound,
    /// Every probe, in the order made.
    pub attempts: Vec<Attempt<T>>,
}

impl<T> Search<T> {
    /// Tries that failed at a rate the search settled as passing (at or below the capacity):
    /// the noise that `tries` absorbed.
    pub fn failed_at_or_below_capacity(&self) -> usize {
        self.capacity.map_or(0, |c| {
            self.attempts
                .iter()
                .filter(|a| !a.passed && a.rate <= c)
                .count()
        })
    }

    /// The last passing try at the capacity rate.
    pub fn at_capacity(&self) -> Option<&Attempt<T>> {
        let c = self.capacity?;
        self.attempts.iter().rev().find(|a| a.passed && a.rate == c)
    }
}

/// Probes rates with up to `tries` tries each, within the probe budget.
struct Prober<T, P> {
    plan: SearchPlan,
    probe: P,
    attempts: Vec<Attempt<T>>,
}

impl<T, E, P: FnMut(u64) -> Result<(bool, T), E>> Prober<T, P> {
    /// Whether `rate` passes (some try passed); `None` when the budget ran out first.
    fn passes(&mut self, rate: u64) -> Result<Option<bool>, E> {
        for _ in 0..self.plan.tries {
            if self.attempts.len() >= self.plan.max_probes {
                return Ok(None);
            }
            let (passed, data) = (self.probe)(rate)?;
            self.attempts.push(Attempt { rate, passed, data });
            if passed {
                return Ok(Some(true));
            }
        }
        Ok(Some(false))
    }
}

/// Finds the highest rate `probe` passes at, as `plan` says (the plan must pass
/// [`SearchPlan::check`]).
///
/// 1. **Coarse sweep** from `start`: while rates pass, multiply by `factor` (up to `max`:
///    all passing ends the search, [`Bound::Cap`]); if `start` fails, divide by `factor`
///    until a rate passes (down to `min`: all failing ends it, [`Bound::NothingPassed`]).
/// 2. **Bisection** between the highest passing rate and the lowest failing one, at their
///    geometric mean, until the failing one is within `precision` above the passing one
///    ([`Bound::Bracketed`]).
///
/// Every rate is settled by up to `tries` probes (it passes if one does), and the search never
/// makes more than `max_probes` probes ([`Bound::ProbeLimit`]). The capacity is always a rate
/// that passed, every settled rate below it passed and every settled rate above it failed,
/// however noisy the probe: the sweep stops at the first settled failure, and bisection only
/// probes between the two. An error from `probe` ends the search with that error.
///
/// ```
/// use loadgen::runner::capacity_search::{search, Bound, SearchPlan};
/// let plan = SearchPlan { start: 1_000, min: 100, max: 1_000_000, factor: 2.0, precision: 0.05, tries: 1, max_probes: 40 };
/// let found = search::<(), ()>(&plan, |rate| Ok((rate <= 50_000, ()))).unwrap();
/// assert_eq!(found.bound, Bound::Bracketed);
/// let capacity = found.capacity.unwrap();
/// assert!(capacity <= 50_000 && capacity as f64 * 1.05 >= 50_000.0);
/// ```
pub fn search<T, E>(
    plan: &SearchPlan,
    probe: impl FnMut(u64) -> Result<(bool, T), E>,
) -> Result<Search<T>, E> {
    let mut prober = Prober {
        plan: *plan,
        probe,
        attempts: Vec::new(),
    };
    let (mut pass, mut fail) = (None::<u64>, None::<u64>);
    let end = |prober: Prober<T, _>, pass, fail, bound| Search {
        capacity: pass,
        failing: fail,
        bound,
        attempts: prober.attempts,
    };
    let mut rate = plan.start.clamp(plan.min, plan.max);
    // The sweep ends with the highest passing and the lowest failing rate it settled.
    let (mut lo, mut hi) = loop {
        match prober.passes(rate)? {
            None => return Ok(end(prober, pass, fail, Bound::ProbeLimit)),
            Some(true) => {
                if let Some(failing) = fail {
                    break (rate, failing);
                }
                pass = Some(rate);
                if rate >= plan.max {
                    return Ok(end(prober, pass, fail, Bound::Cap));
                }
                rate = ((rate as f64 * plan.factor).ceil() as u64)
                    .max(rate + 1)
                    .min(plan.max);
            }
            Some(false) => {
                if let Some(passing) = pass {
                    break (passing, rate);
                }
                fail = Some(rate);
                if rate <= plan.min {
                    return Ok(end(prober, pass, fail, Bound::NothingPassed));
                }
                rate = ((rate as f64 / plan.factor).floor() as u64)
                    .min(rate - 1)
                    .max(plan.min);
            }
        }
    };
    while hi as f64 > lo as f64 * (1.0 + plan.precision) {
        let mid = ((lo as f64) * (hi as f64)).sqrt().round() as u64;
        if mid <= lo || mid >= hi {
            break; // adjacent integers: nothing left between them
        }
        match prober.passes(mid)? {
            None => return Ok(end(prober, Some(lo), Some(hi), Bound::ProbeLimit)),
            Some(true) => lo = mid,
            Some(false) => hi = mid,
        }
    }
    Ok(end(prober, Some(lo), Some(hi), Bound::Bracketed))
}

/// How long each probe runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeSize {
    /// Target scheduled length of a probe, in seconds: ops = rate × this.
    pub secs: f64,
    /// Fewest churn events per probe (enough latency samples for a p99).
    pub min_events: usize,
    /// Most churn events per probe (bounds fast probes' generation time and memory).
    pub max_events: usize,
}

impl ProbeSize {
    /// Churn events of a probe at `rate` on a workload of `keys` keys: the initial population
    /// is `keys` ops of the schedule too, so events = rate × secs − keys, within the bounds.
    pub fn events(&self, rate: u64, keys: usize) -> usize {
        let wanted = (rate as f64 * self.secs - keys as f64).max(0.0) as usize;
        wanted
            .max(self.min_events)
            .min(self.max_events.max(1))
            .max(1)
    }
}

/// The p99 limit of the definition (docs/workloads.md), in milliseconds.
pub const DEFAULT_P99_LIMIT_MS: f64 = 10.0;

/// Churn events per probe at least (1,000 latency samples at one in 16).
pub const MIN_PROBE_EVENTS: usize = 16_000;

/// The workloads capacity is defined for: every producer op is one event into the queue.
pub fn check_workload(workload: Workload) -> Result<(), String> {
    match workload {
        Workload::W1 | Workload::W2 | Workload::W5 => Ok(()),
        Workload::W3 => Err(
            "capacity is measured on w1, w2 and w5: w3's relists are single operations of \
             every key's object, so its producer cannot keep a per-event schedule"
                .to_string(),
        ),
        Workload::W4 => Err(
            "capacity is measured on w1, w2 and w5: w4 writes straight into the indexer, so it \
             has no queue and no enqueue-to-pop latency"
                .to_string(),
        ),
        Workload::W6 => Err(
            "capacity is measured on w1, w2 and w5: w6's throughput is its workers' reconciles, \
             which a paced producer does not measure; run it flat out with `loadgen run`"
                .to_string(),
        ),
        Workload::W7 => Err(
            "capacity is measured on w1, w2 and w5: w7 measures a controller's latency under              resyncs at a rate you choose; run it with `loadgen run --workload w7 --rate N`"
                .to_string(),
        ),
        Workload::W8 => Err(
            "capacity is measured on w1, w2 and w5: w8 measures a workqueue's order under a \
             saturating load of its own; run it with `loadgen run --workload w8`"
                .to_string(),
        ),
    }
}

/// One probe as reported: the rate, whether it passed, every rule it failed, and the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Probe {
    /// Every rule the run failed (empty when it passed).
    pub failed_rules: Vec<String>,
    /// The paced run itself (`offered_rate`, `producer_lag_ms`, `kept_up`, `latency_us`,
    /// `peak_rss_bytes`, `verdict`, ...).
    pub result: RunResult,
}

/// The rules of docs/workloads.md a paced run failed; empty when it keeps up.
pub fn failed_rules(r: &RunResult, p99_limit_ms: f64) -> Vec<String> {
    let mut failed = Vec::new();
    match (r.kept_up, r.producer_lag_ms, r.offered_rate) {
        (Some(true), _, _) => {}
        (Some(false), Some(lag), Some(rate)) => failed.push(format!(
            "producer fell behind: lag {lag:.2} ms > 1% of the scheduled {:.3} s",
            // On the workloads capacity is defined for, every op is one event (the initial
            // adds included), so the run's events are its N ops.
            r.events as f64 / rate as f64
        )),
        _ => failed.push("the run was not paced, so its schedule is unknown".to_string()),
    }
    match r.latency_us.p99 {
        Some(p99) if p99 <= p99_limit_ms * 1e3 => {}
        Some(p99) => failed.push(format!(
            "p99 {} > {} ms",
            duration_ms(p99),
            trim_number(p99_limit_ms)
        )),
        None => failed.push("no latency samples".to_string()),
    }
    if !r.is_ok() {
        failed.push(r.verdict.clone());
    }
    failed
}

/// Microseconds as milliseconds for a rule: `12.34 ms`.
fn duration_ms(us: f64) -> String {
    format!("{:.2} ms", us / 1e3)
}

pub(crate) fn trim_number(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Figures of the probe at the capacity rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AtCapacity {
    /// Enqueue-to-pop latency.
    pub latency_us: LatencyUs,
    /// Peak resident memory the engine added.
    pub peak_rss_bytes: Option<u64>,
    /// The producer's largest lag.
    pub producer_lag_ms: Option<f64>,
}

/// One engine's capacity on one workload, with every probe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Curve {
    /// `reference` or `sharded`.
    pub engine: String,
    /// `w1`, `w2` or `w5`.
    pub workload: String,
    /// The p99 limit a probe had to meet.
    pub p99_limit_ms: f64,
    /// The capacity in events (producer ops) per second; `null` when nothing passed.
    pub capacity_events_per_s: Option<u64>,
    /// Why the search ended: `bracketed`, `cap` (at least the capacity), `nothing_passed`
    /// (below `lowest_rate_tried`), `probe_limit`.
    pub bound: Bound,
    /// The lowest rate that failed above the capacity.
    pub failing_rate: Option<u64>,
    /// The lowest rate tried.
    pub lowest_rate_tried: Option<u64>,
    /// The probe at the capacity.
    pub at_capacity: Option<AtCapacity>,
    /// Tries that failed at or below the capacity (noise absorbed by `--tries`).
    pub failed_at_or_below_capacity: usize,
    /// Every probe, in the order made.
    pub probes: Vec<Attempt<Probe>>,
}

impl Curve {
    /// The curve of `engine` on `workload` from its search.
    pub fn new(
        engine: EngineKind,
        workload: &str,
        p99_limit_ms: f64,
        found: Search<Probe>,
    ) -> Self {
        let at_capacity = found.at_capacity().map(|a| AtCapacity {
            latency_us: a.data.result.latency_us,
            peak_rss_bytes: a.data.result.peak_rss_bytes,
            producer_lag_ms: a.data.result.producer_lag_ms,
        });
        Self {
            engine: engine.name().to_string(),
            workload: workload.to_string(),
            p99_limit_ms,
            capacity_events_per_s: found.capacity,
            bound: found.bound,
            failing_rate: found.failing,
            lowest_rate_tried: found.attempts.iter().map(|a| a.rate).min(),
            at_capacity,
            failed_at_or_below_capacity: found.failed_at_or_below_capacity(),
            probes: found.attempts,
        }
    }

    /// The capacity as words: `1.23M`, `at least 20.00M`, `less than 1000`, `unknown`.
    pub fn capacity_text(&self) -> String {
        match (self.bound, self.capacity_events_per_s) {
            (Bound::Cap, Some(c)) => format!("at least {}", si(c as f64)),
            (_, Some(c)) => si(c as f64),
            (_, None) => match self.lowest_rate_tried {
                Some(low) => format!("less than {}", si(low as f64)),
                None => "unknown".to_string(),
            },
        }
    }

    /// Every probe's run result (for the exit code: a failed verdict is a bug).
    pub fn results(&self) -> impl Iterator<Item = &RunResult> {
        self.probes.iter().map(|p| &p.data.result)
    }
}

/// One paced run of `spec` on `engine` at `cfg.rate`, bare or (with `informer`) through the
/// informer with those handlers: in a child process of its own (its stderr captured, so the
/// parent's progress bar stays whole), or here with `in_process`.
pub fn probe_run(
    spec: &WorkloadSpec,
    engine: EngineKind,
    cfg: &EngineConfig,
    informer: Option<&InformerConfig>,
    in_process: bool,
) -> Result<RunResult, RunError> {
    let row = RunSpec {
        source: Source::Workload(*spec),
        subject: Subject::Engine(engine),
        engine: *cfg,
        pipeline: informer.map_or(Pipeline::Queue, |icfg| Pipeline::Informer(*icfg)),
    };
    row.probe(in_process)
}

/// A probe longer than this many seconds is worth a warning before the search starts.
pub const LONG_PROBE_SECS: f64 = 30.0;

/// What one capacity measurement needs besides the engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    /// The workload at its key count; `events` is set per probe.
    pub spec: WorkloadSpec,
    /// The engine knobs; `rate` is set per probe.
    pub cfg: EngineConfig,
    /// The rates tried.
    pub plan: SearchPlan,
    /// Each probe's length.
    pub size: ProbeSize,
    /// The p99 limit, in milliseconds.
    pub p99_limit_ms: f64,
    /// Run probes here instead of in child processes.
    pub in_process: bool,
    /// Through the informer with these handlers; `None`: the engine bare.
    pub informer: Option<InformerConfig>,
}

impl Job {
    /// The workload as the results name it: `w1`, or `w1/informer` through the informer.
    pub fn workload_label(&self) -> String {
        match self.informer {
            Some(_) => format!("{}/informer", self.spec.workload),
            None => self.spec.workload.name().to_string(),
        }
    }

    /// The scheduled length of the longest probe the search may make: one at the plan's
    /// lowest rate, with its initial adds.
    pub fn longest_probe_secs(&self) -> f64 {
        let min = self.plan.min.max(1);
        (self.spec.keys + self.size.events(min, self.spec.keys)) as f64 / min as f64
    }
}

/// Searches `job`'s capacity for `engine`, with a progress bar over its probes.
pub fn measure_engine(job: &Job, engine: EngineKind, ui: Ui) -> Result<Curve, RunError> {
    let workload = job.workload_label();
    let label = format!("{workload} {engine} capacity");
    let phase = ui.phase(label.clone(), job.plan.max_probes as u64);
    let mut done = 0u64;
    let found = search(&job.plan, |rate| {
        let spec = job.spec.events(job.size.events(rate, job.spec.keys));
        let cfg = EngineConfig {
            rate: Some(rate),
            ..job.cfg
        };
        let result = probe_run(&spec, engine, &cfg, job.informer.as_ref(), job.in_process)?;
        let failed = failed_rules(&result, job.p99_limit_ms);
        done += 1;
        let p99 = result
            .latency_us
            .p99
            .map_or_else(|| "-".to_string(), duration_ms);
        let outcome = if failed.is_empty() {
            "pass".to_string()
        } else {
            format!("fail ({})", failed.join("; "))
        };
        phase.step(
            done,
            &format!(
                "{label}: probe {done} at {}/s: p99 {p99}, {outcome}",
                si(rate as f64)
            ),
        );
        Ok::<_, RunError>((
            failed.is_empty(),
            Probe {
                failed_rules: failed,
                result,
            },
        ))
    })?;
    let curve = Curve::new(engine, &workload, job.p99_limit_ms, found);
    phase.finish(&format!(
        "{} events/s in {} probes",
        curve.capacity_text(),
        curve.probes.len()
    ));
    Ok(curve)
}
