//! `loadgen capacity`: the highest offered rate an engine keeps up with (docs/workloads.md,
//! "Capacity"), with the latency curve that leads to it.
//!
//! A probe is one paced run (`run --rate R`) in a child process of its own, so each probe's
//! peak memory is its own. A probe *passes* when the producer kept its schedule (its largest
//! lag within 1% of the scheduled length, [`kept_schedule`](crate::driver::kept_schedule)),
//! the p99 enqueue-to-pop latency is within the limit (`--p99-ms`, 10 ms by default) and the
//! verdict is ok. [`search`] chooses the rates: a coarse geometric sweep until the first
//! failure, then bisection between the last passing and the first failing rate. It is a pure
//! function of its probe, so the tests drive it with fake ones.
//!
//! On a shared machine a probe can fail from noise (another process takes the core), never
//! pass from it: a failed rate is tried again (`--tries`, 2 by default) and passes if any try
//! passes. Every try is reported.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use serde::Serialize;

use crate::driver::{EngineConfig, EngineKind, Mode, NoProgress};
use crate::machine::Machine;
use crate::report::{aligned, finish, measure, mib, refuse, si, write_json, LatencyUs, RunResult};
use crate::run::{child_args, EngineChoice, RunError};
use crate::ui::Ui;
use crate::workload::{generate, Workload, WorkloadSpec, DEFAULT_SEED};

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
/// use loadgen::capacity::{search, Bound, SearchPlan};
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

fn trim_number(v: f64) -> String {
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

/// The sentence a capacity tester wants: "kcache absorbs N events/s on W1 at p99 ≤ 10 ms
/// (reference: M)". kcache is its sharded engine; with the reference alone, it is named.
pub fn claim(curves: &[Curve]) -> Option<String> {
    let find = |e: EngineKind| curves.iter().find(|c| c.engine == e.name());
    let lead = find(EngineKind::Sharded).or_else(|| find(EngineKind::Reference))?;
    let who = if lead.engine == EngineKind::Sharded.name() {
        "kcache"
    } else {
        "kcache's reference engine"
    };
    let mut s = format!(
        "{who} absorbs {} events/s on {} at p99 ≤ {} ms",
        lead.capacity_text(),
        lead.workload.to_uppercase(),
        trim_number(lead.p99_limit_ms)
    );
    if lead.engine == EngineKind::Sharded.name() {
        if let Some(reference) = find(EngineKind::Reference) {
            let _ = write!(s, " (reference: {})", reference.capacity_text());
        }
    }
    Some(s)
}

/// The capacity table: one row per engine and workload.
pub fn summary_rows(curves: &[Curve]) -> Vec<Vec<String>> {
    let mut rows = vec![[
        "engine",
        "workload",
        "capacity/s",
        "p50 µs",
        "p99 µs",
        "p999 µs",
        "+RSS MiB",
        "probes",
        "search",
    ]
    .map(String::from)
    .to_vec()];
    let opt = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.1}"));
    for c in curves {
        let at = c.at_capacity.as_ref();
        let search = match (c.bound, c.failing_rate) {
            (Bound::Bracketed, Some(f)) => format!("failed at {}", si(f as f64)),
            (Bound::Cap, _) => "passed up to --max-rate".to_string(),
            (Bound::NothingPassed, _) => "nothing passed".to_string(),
            (Bound::ProbeLimit, _) => "probe limit reached".to_string(),
            (Bound::Bracketed, None) => String::new(),
        };
        rows.push(vec![
            c.engine.clone(),
            c.workload.clone(),
            c.capacity_text(),
            opt(at.and_then(|a| a.latency_us.p50)),
            opt(at.and_then(|a| a.latency_us.p99)),
            opt(at.and_then(|a| a.latency_us.p999)),
            at.and_then(|a| a.peak_rss_bytes)
                .map_or_else(|| "-".to_string(), mib),
            c.probes.len().to_string(),
            search,
        ]);
    }
    rows
}

/// Every probe: one row each, in the order made.
pub fn probe_rows(curves: &[Curve]) -> Vec<Vec<String>> {
    let mut rows = vec![[
        "engine", "workload", "rate/s", "kept up", "lag ms", "p50 µs", "p99 µs", "+RSS MiB",
        "result",
    ]
    .map(String::from)
    .to_vec()];
    let opt = |v: Option<f64>, digits: usize| {
        v.map_or_else(|| "-".to_string(), |v| format!("{v:.digits$}"))
    };
    for c in curves {
        for p in &c.probes {
            let r = &p.data.result;
            rows.push(vec![
                c.engine.clone(),
                c.workload.clone(),
                si(p.rate as f64),
                r.kept_up
                    .map_or("-", |k| if k { "yes" } else { "no" })
                    .to_string(),
                opt(r.producer_lag_ms, 2),
                opt(r.latency_us.p50, 1),
                opt(r.latency_us.p99, 1),
                r.peak_rss_bytes.map_or_else(|| "-".to_string(), mib),
                if p.passed {
                    "pass".to_string()
                } else {
                    format!("FAIL: {}", p.data.failed_rules.join("; "))
                },
            ]);
        }
    }
    rows
}

/// One paced run of `spec` on `engine` at `cfg.rate`: in a child process of its own (its
/// stderr captured, so the parent's progress bar stays whole), or here with `in_process`.
pub fn probe_run(
    spec: &WorkloadSpec,
    engine: EngineKind,
    cfg: &EngineConfig,
    in_process: bool,
) -> Result<RunResult, RunError> {
    if in_process {
        let gen = generate(spec);
        let mode = Mode::of(spec.workload);
        return Ok(measure(
            engine,
            spec.workload.name(),
            &gen,
            mode,
            cfg,
            &NoProgress,
        )?);
    }
    let mut results = crate::isolate::run_child_quietly(&child_args(spec, engine, cfg))?;
    match results.len() {
        1 => Ok(results.remove(0)),
        n => Err(RunError::Invalid(format!(
            "a probe's child reported {n} results instead of one"
        ))),
    }
}

/// A probe longer than this many seconds is worth a warning before the search starts.
const LONG_PROBE_SECS: f64 = 30.0;

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
}

impl Job {
    /// The scheduled length of the longest probe the search may make: one at the plan's
    /// lowest rate, with its initial adds.
    pub fn longest_probe_secs(&self) -> f64 {
        let min = self.plan.min.max(1);
        (self.spec.keys + self.size.events(min, self.spec.keys)) as f64 / min as f64
    }
}

/// Searches `job`'s capacity for `engine`, with a progress bar over its probes.
pub fn measure_engine(job: &Job, engine: EngineKind, ui: Ui) -> Result<Curve, RunError> {
    let workload = job.spec.workload;
    let label = format!("{workload} {engine} capacity");
    let phase = ui.phase(label.clone(), job.plan.max_probes as u64);
    let mut done = 0u64;
    let found = search(&job.plan, |rate| {
        let spec = job.spec.events(job.size.events(rate, job.spec.keys));
        let cfg = EngineConfig {
            rate: Some(rate),
            ..job.cfg
        };
        let result = probe_run(&spec, engine, &cfg, job.in_process)?;
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
    let curve = Curve::new(engine, workload.name(), job.p99_limit_ms, found);
    phase.finish(&format!(
        "{} events/s in {} probes",
        curve.capacity_text(),
        curve.probes.len()
    ));
    Ok(curve)
}

/// Arguments of `loadgen capacity`.
#[derive(Debug, Clone, clap::Args)]
pub struct CapacityArgs {
    /// Which workload: w1 (steady churn), w2 (hot keys) or w5 (slow handlers). W3's relists and
    /// W4's direct writes have no per-event schedule or queue latency.
    #[arg(long, value_parser = crate::run::parse_workload)]
    pub workload: Workload,
    /// Which engine(s).
    #[arg(long, value_enum, default_value = "all")]
    pub engine: EngineChoice,
    /// The p99 enqueue-to-pop latency a probe may reach and still pass, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_P99_LIMIT_MS)]
    pub p99_ms: f64,
    /// Keys. Default: the workload's own. Every probe also paces the initial population of
    /// one add per key, so a probe lasts at least keys / rate.
    #[arg(long)]
    pub keys: Option<usize>,
    /// Most churn events per probe. Default: the workload's own E (5,000,000).
    #[arg(long)]
    pub events: Option<usize>,
    /// Target length of each probe in seconds: events = rate × this − keys, at least 16,000
    /// and at most --events.
    #[arg(long, default_value_t = 2.0)]
    pub probe_secs: f64,
    /// The first rate tried, in events per second.
    #[arg(long, default_value_t = 50_000)]
    pub start_rate: u64,
    /// The lowest rate tried (when even --start-rate fails). A probe paces the keys' initial
    /// adds too, so its longest is (keys + 16,000) / this: 11.6 s for W1.
    #[arg(long, default_value_t = 10_000)]
    pub min_rate: u64,
    /// The highest rate tried: passing here ends the search ("at least").
    #[arg(long, default_value_t = 20_000_000)]
    pub max_rate: u64,
    /// Bisection stops when the first failing rate is within this many percent above the
    /// capacity.
    #[arg(long, default_value_t = 5.0)]
    pub precision: f64,
    /// Tries per rate: a rate fails only when every try fails (a shared machine's noise can
    /// fail a probe, never pass one).
    #[arg(long, default_value_t = 2)]
    pub tries: usize,
    /// Probes per engine at most, tries included.
    #[arg(long, default_value_t = 24)]
    pub max_probes: usize,
    /// Shards of the sharded engine: a power of two from 1 to 65536.
    #[arg(long, default_value_t = kcache::sharded::DEFAULT_SHARDS, value_parser = crate::driver::parse_shards)]
    pub shards: usize,
    /// Consumer threads of the sharded engine (default: 2 for w5, 1 otherwise; the reference
    /// always uses exactly one).
    #[arg(long, value_parser = crate::driver::parse_consumers)]
    pub consumers: Option<usize>,
    /// CPU microseconds the handler burns per delta (default 2 for w5, 0 otherwise).
    #[arg(long)]
    pub handler_us: Option<u64>,
    /// The splitmix64 seed.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    pub seed: u64,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw the latency curve (p50 and p99 against offered rate, with the p99 limit) as SVG here.
    #[arg(long)]
    pub chart: Option<PathBuf>,
    /// Run every probe in this process instead of a child process each (peak memory is then
    /// understated for all but the first probe).
    #[arg(long)]
    pub in_process: bool,
}

/// Refuses a p99 limit that is not a positive number of milliseconds.
pub fn check_p99_limit(ms: f64) -> Result<(), String> {
    if ms.is_finite() && ms > 0.0 {
        Ok(())
    } else {
        Err(format!(
            "--p99-ms must be a positive number of milliseconds (got {ms})"
        ))
    }
}

impl CapacityArgs {
    /// The measurement these arguments ask for, or why they make none.
    pub fn job(&self) -> Result<Job, String> {
        check_workload(self.workload)?;
        check_p99_limit(self.p99_ms)?;
        if !(self.probe_secs.is_finite() && self.probe_secs > 0.0 && self.probe_secs <= 600.0) {
            return Err(format!(
                "--probe-secs must be above 0 and at most 600 (got {})",
                self.probe_secs
            ));
        }
        let mut spec = WorkloadSpec::new(self.workload).seed(self.seed);
        if let Some(keys) = self.keys {
            spec = spec.keys(keys);
        }
        if spec.keys == 0 {
            return Err("--keys must be at least 1".to_string());
        }
        let max_events = self.events.unwrap_or(self.workload.default_events());
        if max_events == 0 {
            return Err("--events must be at least 1".to_string());
        }
        let plan = SearchPlan {
            start: self.start_rate,
            min: self.min_rate,
            max: self.max_rate,
            factor: 2.0,
            precision: self.precision / 100.0,
            tries: self.tries,
            max_probes: self.max_probes,
        };
        plan.check()?;
        let own = EngineConfig::for_workload(self.workload);
        Ok(Job {
            spec,
            cfg: EngineConfig {
                shards: self.shards,
                consumers: self.consumers.unwrap_or(own.consumers),
                handler_cost: self
                    .handler_us
                    .map_or(own.handler_cost, std::time::Duration::from_micros),
                ..own
            },
            plan,
            size: ProbeSize {
                secs: self.probe_secs,
                min_events: MIN_PROBE_EVENTS,
                max_events,
            },
            p99_limit_ms: self.p99_ms,
            in_process: self.in_process,
        })
    }
}

/// The JSON `capacity --json` writes.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityReport {
    /// Where it ran.
    pub machine: Machine,
    /// The command line that produced it.
    pub command: String,
    /// One curve per engine.
    pub capacity: Vec<Curve>,
}

/// What `capacity` prints on stdout: every probe, the capacities, and the sentence.
pub fn shown(curves: &[Curve]) -> String {
    let mut out = aligned(&probe_rows(curves));
    out.push('\n');
    out.push_str(&aligned(&summary_rows(curves)));
    if let Some(claim) = claim(curves) {
        let _ = writeln!(out, "\n{claim}");
    }
    out
}

/// Runs `loadgen capacity`.
pub fn main(args: CapacityArgs) -> ExitCode {
    let job = match args.job() {
        Ok(job) => job,
        Err(e) => return refuse("capacity", e),
    };
    let ui = Ui::detect();
    let longest = job.longest_probe_secs();
    if longest > LONG_PROBE_SECS {
        ui.note(&format!(
            "note: a probe at --min-rate {} lasts up to {longest:.0} s (the {} initial adds are \
             paced too); raise --min-rate or lower --keys for a shorter worst case",
            args.min_rate, job.spec.keys
        ));
    }
    let mut curves = Vec::new();
    for engine in args.engine.engines() {
        match measure_engine(&job, engine, ui) {
            Ok(curve) => curves.push(curve),
            Err(e) => return refuse("capacity", e),
        }
    }
    let results: Vec<RunResult> = curves.iter().flat_map(Curve::results).cloned().collect();
    finish("capacity", &shown(&curves), &results, || {
        if let Some(path) = &args.chart {
            crate::chart::capacity_svg(&curves, path).map_err(|e| e.to_string())?;
            ui.note(&format!("wrote {}", path.display()));
        }
        if let Some(path) = &args.json {
            let report = CapacityReport {
                machine: Machine::detect(),
                command: crate::compare::command_line(),
                capacity: curves.clone(),
            };
            write_json(path, &report).map_err(|e| e.to_string())?;
            ui.note(&format!("wrote {}", path.display()));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> SearchPlan {
        SearchPlan {
            start: 1_000,
            min: 100,
            max: 10_000_000,
            factor: 2.0,
            precision: 0.05,
            tries: 1,
            max_probes: 60,
        }
    }

    /// A probe whose data is the try's number, passing as `passes` says.
    fn run(plan: &SearchPlan, mut passes: impl FnMut(u64, usize) -> bool) -> Search<usize> {
        let mut n = 0;
        search::<_, ()>(plan, |rate| {
            n += 1;
            Ok((passes(rate, n), n))
        })
        .expect("fake probes never fail")
    }

    /// Whatever the probe did: the capacity passed, everything settled below passed, and the
    /// failing rate failed every try.
    fn assert_consistent(found: &Search<usize>, plan: &SearchPlan) {
        assert!(found.attempts.len() <= plan.max_probes);
        if let Some(c) = found.capacity {
            assert!(found.attempts.iter().any(|a| a.rate == c && a.passed));
        }
        if let Some(f) = found.failing {
            assert!(found
                .attempts
                .iter()
                .filter(|a| a.rate == f)
                .all(|a| !a.passed));
            assert!(found.capacity.is_none_or(|c| c < f));
        }
    }

    #[test]
    fn a_monotone_probe_is_bracketed_within_the_precision() {
        let p = plan();
        let found = run(&p, |rate, _| rate <= 123_456);
        assert_eq!(found.bound, Bound::Bracketed);
        let (c, f) = (found.capacity.unwrap(), found.failing.unwrap());
        assert!(c <= 123_456 && f > 123_456, "{c} {f}");
        assert!(f as f64 <= c as f64 * 1.05, "{c} {f}");
        assert_consistent(&found, &p);
        // Sweep 1k..128k (8 probes), then about log2(ln 2 / ln 1.05) ≈ 4 bisections.
        assert!(found.attempts.len() <= 14, "{}", found.attempts.len());
        assert_eq!(found.failed_at_or_below_capacity(), 0);
        assert_eq!(found.at_capacity().map(|a| a.rate), Some(c));
    }

    #[test]
    fn a_failing_start_sweeps_down() {
        let p = plan();
        let found = run(&p, |rate, _| rate <= 300);
        assert_eq!(found.bound, Bound::Bracketed);
        assert_eq!(found.attempts[0].rate, 1_000);
        assert!(found.capacity.unwrap() <= 300 && found.failing.unwrap() > 300);
        assert_consistent(&found, &p);
    }

    #[test]
    fn noisy_failures_are_absorbed_by_a_second_try() {
        // Every third try fails whatever the rate (another process took the core); below
        // 200,000 the other tries pass.
        let p = SearchPlan { tries: 2, ..plan() };
        let found = run(&p, |rate, n| rate <= 200_000 && n % 3 != 0);
        assert_eq!(found.bound, Bound::Bracketed);
        let c = found.capacity.unwrap();
        assert!(c <= 200_000 && c as f64 * 1.05 >= 200_000.0, "{c}");
        assert!(
            found.failed_at_or_below_capacity() > 0,
            "the noise is reported"
        );
        assert_consistent(&found, &p);
    }

    #[test]
    fn a_non_monotone_probe_still_ends_on_a_passing_rate_below_a_failing_one() {
        // Passes below 50k and again in a band 400k..600k: the sweep stops at the first
        // failure (64k) and never reports the band.
        let p = plan();
        let found = run(&p, |rate, _| {
            rate <= 50_000 || (400_000..600_000).contains(&rate)
        });
        assert_eq!(found.bound, Bound::Bracketed);
        let c = found.capacity.unwrap();
        assert!(c <= 50_000 && found.failing.unwrap() <= 64_000, "{c}");
        assert_consistent(&found, &p);

        // Pseudo-random pass/fail: the search ends, within budget, consistent.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let found = run(&p, |_, _| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % 3 != 0
        });
        assert_consistent(&found, &p);
    }

    #[test]
    fn nothing_passing_sweeps_down_to_the_minimum_and_says_so() {
        let p = plan();
        let found = run(&p, |_, _| false);
        assert_eq!(found.bound, Bound::NothingPassed);
        assert_eq!(found.capacity, None);
        assert_eq!(found.attempts.last().map(|a| a.rate), Some(100));
        assert_eq!(found.attempts.len(), 5, "1000, 500, 250, 125, 100");
    }

    #[test]
    fn everything_passing_stops_at_the_cap() {
        let p = SearchPlan {
            max: 100_000,
            ..plan()
        };
        let found = run(&p, |_, _| true);
        assert_eq!(found.bound, Bound::Cap);
        assert_eq!(found.capacity, Some(100_000));
        let rates: Vec<u64> = found.attempts.iter().map(|a| a.rate).collect();
        assert_eq!(
            rates,
            [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 100_000]
        );
    }

    #[test]
    fn the_probe_budget_ends_a_search_with_what_passed_so_far() {
        let p = SearchPlan {
            max_probes: 4,
            ..plan()
        };
        let found = run(&p, |rate, _| rate <= 123_456);
        assert_eq!(found.bound, Bound::ProbeLimit);
        assert_eq!(found.attempts.len(), 4);
        assert_eq!(found.capacity, Some(8_000));
    }

    #[test]
    fn a_probe_error_ends_the_search_with_it() {
        let err = search::<(), _>(&plan(), |rate| {
            if rate > 4_000 {
                Err("child failed")
            } else {
                Ok((true, ()))
            }
        });
        assert_eq!(err.unwrap_err(), "child failed");
    }

    #[test]
    fn plans_that_cannot_search_are_refused() {
        assert!(plan().check().is_ok());
        for bad in [
            SearchPlan { min: 0, ..plan() },
            SearchPlan {
                min: 10,
                max: 5,
                ..plan()
            },
            SearchPlan {
                precision: 0.0,
                ..plan()
            },
            SearchPlan {
                factor: 1.0,
                ..plan()
            },
            SearchPlan { tries: 0, ..plan() },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn probe_sizes_follow_the_rate_within_bounds() {
        let size = ProbeSize {
            secs: 2.0,
            min_events: 16_000,
            max_events: 5_000_000,
        };
        assert_eq!(size.events(1_000_000, 100_000), 1_900_000);
        assert_eq!(size.events(10_000, 100_000), 16_000);
        assert_eq!(size.events(100_000_000, 100_000), 5_000_000);
        let tiny = ProbeSize {
            max_events: 500,
            ..size
        };
        assert_eq!(tiny.events(10_000, 100), 500, "the cap wins over the floor");
    }

    fn paced(kept_up: bool, p99_us: f64, verdict_ok: bool) -> RunResult {
        RunResult {
            engine: "sharded".into(),
            workload: "w1".into(),
            keys: 1_000,
            events: 100_000,
            wall_s: 1.0,
            events_per_s: 100_000.0,
            pops: 1,
            deltas_per_pop: Some(1.0),
            latency_us: LatencyUs {
                p50: Some(10.0),
                p99: Some(p99_us),
                p999: Some(p99_us),
            },
            peak_rss_bytes: Some(1 << 20),
            peak_rss_source: Some("hwm".into()),
            threads: 1,
            shards: Some(16),
            deltas: 100_000,
            offered_rate: Some(100_000),
            producer_lag_ms: Some(if kept_up { 0.1 } else { 50.0 }),
            kept_up: Some(kept_up),
            verdict: if verdict_ok { "ok" } else { "FAIL: lost" }.into(),
            failures: if verdict_ok {
                vec![]
            } else {
                vec!["lost".into()]
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_probe_fails_each_rule_of_the_definition_on_its_own() {
        assert!(failed_rules(&paced(true, 9_999.0, true), 10.0).is_empty());
        let behind = failed_rules(&paced(false, 100.0, true), 10.0);
        assert_eq!(behind.len(), 1);
        assert!(
            behind[0].contains("producer fell behind") && behind[0].contains("1.000 s"),
            "{behind:?}"
        );
        let slow = failed_rules(&paced(true, 10_001.0, true), 10.0);
        assert_eq!(slow, ["p99 10.00 ms > 10 ms"]);
        assert_eq!(
            failed_rules(&paced(true, 10.0, false), 10.0),
            ["FAIL: lost"]
        );
        assert_eq!(failed_rules(&paced(false, 20_000.0, false), 10.0).len(), 3);
    }

    fn job(args: &[&str]) -> Result<Job, String> {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            capacity: CapacityArgs,
        }
        let cli = Cli::try_parse_from(std::iter::once("capacity").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        cli.capacity.job()
    }

    #[test]
    fn the_defaults_keep_every_w1_probe_short_and_w2_gets_a_warning() {
        let w1 = job(&["--workload", "w1"]).unwrap();
        assert_eq!(w1.p99_limit_ms, 10.0);
        assert_eq!(
            (w1.plan.start, w1.plan.min, w1.plan.tries),
            (50_000, 10_000, 2)
        );
        assert!((w1.longest_probe_secs() - 11.6).abs() < 1e-9);
        assert_eq!(w1.size.events(1_000_000, w1.spec.keys), 1_900_000);
        let w2 = job(&["--workload", "w2"]).unwrap();
        assert!(w2.longest_probe_secs() > LONG_PROBE_SECS);
        let w5 = job(&["--workload", "w5", "--consumers", "3"]).unwrap();
        assert_eq!(w5.cfg.consumers, 3);
        assert_eq!(w5.cfg.handler_cost, std::time::Duration::from_micros(2));
        assert!(job(&["--workload", "w3"])
            .unwrap_err()
            .contains("w3's relists"));
        assert!(job(&["--workload", "w1", "--precision", "0"]).is_err());
    }

    fn curve(engine: EngineKind, capacity: u64) -> Curve {
        let p = SearchPlan {
            start: 10_000,
            ..plan()
        };
        let found = search::<_, ()>(&p, |rate| {
            let passed = rate <= capacity;
            let result = paced(passed, 100.0, true);
            Ok((
                passed,
                Probe {
                    failed_rules: failed_rules(&result, 10.0),
                    result,
                },
            ))
        })
        .unwrap();
        Curve::new(engine, "w1", 10.0, found)
    }

    #[test]
    fn the_claim_names_kcache_and_the_reference() {
        let curves = [
            curve(EngineKind::Reference, 400_000),
            curve(EngineKind::Sharded, 1_500_000),
        ];
        let claim = claim(&curves).unwrap();
        assert!(
            claim.starts_with("kcache absorbs 1.4")
                && claim.contains("events/s on W1 at p99 ≤ 10 ms (reference: 3"),
            "{claim}"
        );
        let alone = super::claim(&curves[..1]).unwrap();
        assert!(
            alone.starts_with("kcache's reference engine absorbs"),
            "{alone}"
        );
        let text = shown(&curves);
        assert!(text.contains("FAIL: producer fell behind"), "{text}");
        assert!(text.contains("failed at"), "{text}");
        assert_eq!(
            curves[1].at_capacity.as_ref().unwrap().peak_rss_bytes,
            Some(1 << 20)
        );
    }
}
