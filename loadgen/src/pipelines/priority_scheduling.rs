//! W8, priority scheduling (docs/workloads.md): how each order of a controller's workqueue
//! shares workers that cannot keep up. A producer adds keys to the workqueue on a fixed
//! schedule, as a controller's handlers would; `--workers` workers `get` a key, spin
//! `--reconcile-us` of CPU (W6's reconcile, without the cache read or failures) and `done` it.
//! Offered rates are multiples of the workers' capacity: workers (at most the cores) over the
//! reconcile cost.
//!
//! Two scenarios (`--scenario`):
//!
//! - **mixed**: namespace `hot`'s `--keys` objects change at twice the capacity (the
//!   workqueue merges what is already queued, so every one of them stays queued: the workers
//!   are saturated); an initial list's `--backlog` keys, spread over every namespace, are
//!   added at [`LOW_PRIORITY`] one by one over the first half of the run (the informer
//!   delivering its list); [`QUIET_NAMESPACES`] other namespaces change at 2% of the capacity
//!   in all. Classes: `churn`, `backlog`, `trickle`.
//! - **tenants**: namespaces `a` and `b` change at 10:1 (`b` at 60% of the capacity, `a` ten
//!   times that, over ten times as many keys): both stay backlogged. Classes: `a`, `b`.
//!
//! Each engine runs each order of `--queues`: `fifo` (its rate-limiting workqueue, client-go's
//! one order), `priority` (its priority queue, controller-runtime's order), `aging`
//! (`PriorityOptions::max_wait(--max-wait-ms)`), `fair` (`fair()`, namespaces round robin),
//! `aging-fair` (both).
//!
//! # What is measured
//!
//! A key's **wait** runs from the moment it became ready in the queue (the add that queued it;
//! an add merged into a queued key keeps the first add's moment) to the start of its
//! reconcile. The producer stamps a key's slot before the add when the slot is empty; the
//! worker empties it after `get`. A key re-added in the instant between a worker's `get` and
//! its emptying of the slot is not measured (its new entry finds no stamp); the keys the
//! scenarios churn are many enough that this is rare. Keys still ready when the run ends count
//! in `waiting_at_end`, and their wait so far in the class's `max_ms`: a starved class's
//! longest wait is the run's length. A namespace's **share** is its reconciles' spin time over
//! all reconciles' spin time.
//!
//! The verdict: never two workers on one key, every `done` accepted, some key reconciled.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use ahash::AHashMap;
use clap::ValueEnum;
use hdrhistogram::Histogram;
use kcache::controller::{ControllerQueue, Priority, LOW_PRIORITY, NORMAL_PRIORITY};
use kcache::workqueue::priority::PriorityOptions;
use kcache::Key;

use crate::engines::{EngineConfig, EngineKind};
use crate::judging::verdict::Verdict;
use crate::measure::latency::new_histogram;
use crate::pipelines::bare::RunError;
use crate::pipelines::controller_informer::{counted_priority_queue, fifo_queue, OverdueHandouts};
use crate::pipelines::controller_loop::{burn, figures, overlapped, ControllerConfig};
use crate::progress::Progress;
use crate::result::{ClassWaits, GroupShare, LatencyUs, Meter, RunResult, SchedulingFigures};
use workloads::WorkloadSpec;

/// W8's run length unless told otherwise.
pub const DEFAULT_DURATION_MS: u64 = 20_000;
/// Aging's bound unless told otherwise: 5 s.
pub const DEFAULT_MAX_WAIT_MS: u64 = 5_000;
/// W8's reconcile cost unless told otherwise: long enough that a producer on the same cores
/// can offer several times what the workers take.
pub const DEFAULT_RECONCILE_US: u64 = 200;
/// The initial list's keys unless told otherwise.
pub const DEFAULT_BACKLOG: usize = 5_000;
/// The mixed scenario's quiet namespaces, which trickle.
pub const QUIET_NAMESPACES: usize = 8;
/// Objects per quiet namespace.
const QUIET_KEYS: usize = 100;
/// The flood's offered rate, in capacities.
const FLOOD: f64 = 2.0;
/// The trickle's offered rate (all quiet namespaces together), in capacities.
const TRICKLE: f64 = 0.02;
/// The tenants scenario: `b`'s offered rate in capacities (`a` offers ten times as much).
const TENANT_B: f64 = 0.6;
/// How often the producer catches up with its schedule.
const TICK: Duration = Duration::from_micros(500);

/// W8's scenarios (`--scenario`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// One namespace floods, an initial list waits at low priority, the others trickle.
    Mixed,
    /// Two namespaces at 10:1, both backlogged.
    Tenants,
}

impl Scenario {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Mixed => "mixed",
            Scenario::Tenants => "tenants",
        }
    }

    /// The orders it runs unless `--queues` says otherwise: every order that tells something
    /// about the scenario.
    pub fn default_queues(self) -> &'static [QueueKind] {
        match self {
            Scenario::Mixed => &[
                QueueKind::Fifo,
                QueueKind::Priority,
                QueueKind::Aging,
                QueueKind::AgingFair,
            ],
            Scenario::Tenants => &[QueueKind::Priority, QueueKind::Fair],
        }
    }
}

/// A workqueue order (`--queues`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueueKind {
    /// The engine's rate-limiting workqueue: first in, first out.
    Fifo,
    /// The engine's priority queue, controller-runtime's order.
    Priority,
    /// The priority queue with aging (`--max-wait-ms`).
    Aging,
    /// The priority queue with fairness by namespace.
    Fair,
    /// The priority queue with aging and fairness.
    AgingFair,
}

impl QueueKind {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            QueueKind::Fifo => "fifo",
            QueueKind::Priority => "priority",
            QueueKind::Aging => "aging",
            QueueKind::Fair => "fair",
            QueueKind::AgingFair => "aging-fair",
        }
    }

    fn ages(self) -> bool {
        matches!(self, QueueKind::Aging | QueueKind::AgingFair)
    }

    fn is_fair(self) -> bool {
        matches!(self, QueueKind::Fair | QueueKind::AgingFair)
    }
}

/// W8's own knobs, on top of W6's workers and reconcile cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SchedulingConfig {
    /// Which scenario.
    pub scenario: Scenario,
    /// How long the producer adds and the workers reconcile.
    pub duration: Duration,
    /// Aging's bound (orders with aging only).
    pub max_wait: Duration,
    /// The mixed scenario's initial list.
    pub backlog: usize,
}

impl Default for SchedulingConfig {
    fn default() -> Self {
        Self {
            scenario: Scenario::Mixed,
            duration: Duration::from_millis(DEFAULT_DURATION_MS),
            max_wait: Duration::from_millis(DEFAULT_MAX_WAIT_MS),
            backlog: DEFAULT_BACKLOG,
        }
    }
}

/// The `workload` of a W8 row: `w8/<order>`, or `w8-tenants/<order>`.
pub fn label(scenario: Scenario, queue: QueueKind) -> String {
    match scenario {
        Scenario::Mixed => format!("w8/{}", queue.name()),
        Scenario::Tenants => format!("w8-tenants/{}", queue.name()),
    }
}

/// Keys the workers can reconcile per second: workers, at most the cores, over the cost.
pub fn capacity(ctl: &ControllerConfig) -> f64 {
    let cores = thread::available_parallelism().map_or(1, usize::from);
    ctl.workers.min(cores) as f64 / ctl.reconcile_cost.as_secs_f64()
}

/// One schedule of adds.
struct Stream {
    /// Its keys, as indices into [`Plan::keys`].
    keys: Range<usize>,
    /// Adds per second.
    rate: f64,
    priority: Priority,
    /// Each key once, in order (an initial list), instead of keys drawn at random.
    once: bool,
}

/// What a scenario adds and how its keys are classed.
struct Plan {
    classes: Vec<String>,
    groups: Vec<String>,
    keys: Vec<Key>,
    /// Per key: its class and its group, as indices.
    of: Vec<(usize, usize)>,
    streams: Vec<Stream>,
}

impl Plan {
    fn new(classes: &[&str], groups: Vec<String>) -> Self {
        Self {
            classes: classes.iter().map(|c| (*c).to_string()).collect(),
            groups,
            keys: Vec::new(),
            of: Vec::new(),
            streams: Vec::new(),
        }
    }

    /// Adds the keys `name(i)` for `i` in `0..n`, of `class` and the group `group(i)`.
    fn keys(
        &mut self,
        n: usize,
        class: usize,
        name: impl Fn(usize) -> String,
        group: impl Fn(usize) -> usize,
    ) -> Range<usize> {
        let first = self.keys.len();
        for i in 0..n {
            self.keys.push(Key::new(&name(i)));
            self.of.push((class, group(i)));
        }
        first..self.keys.len()
    }

    fn of(spec: &WorkloadSpec, w8: &SchedulingConfig, capacity: f64) -> Self {
        match w8.scenario {
            Scenario::Mixed => {
                let groups = std::iter::once("hot".to_string())
                    .chain((0..QUIET_NAMESPACES).map(|g| format!("quiet-{g}")))
                    .collect::<Vec<_>>();
                let namespaces = groups.len();
                let mut plan = Plan::new(&["churn", "backlog", "trickle"], groups);
                let hot = plan.keys(spec.keys, 0, |i| format!("hot/obj-{i}"), |_| 0);
                let quiet = plan.keys(
                    QUIET_NAMESPACES * QUIET_KEYS,
                    2,
                    |i| format!("quiet-{}/obj-{}", i / QUIET_KEYS, i % QUIET_KEYS),
                    |i| 1 + i / QUIET_KEYS,
                );
                // The initial list covers every namespace, the flooding one included.
                let names = plan.groups.clone();
                let listed = plan.keys(
                    w8.backlog,
                    1,
                    |i| format!("{}/listed-{i}", names[i % namespaces]),
                    |i| i % namespaces,
                );
                let half = (w8.duration.as_secs_f64() / 2.0).max(1e-3);
                plan.streams = vec![
                    Stream {
                        keys: hot,
                        rate: FLOOD * capacity,
                        priority: NORMAL_PRIORITY,
                        once: false,
                    },
                    Stream {
                        rate: w8.backlog as f64 / half,
                        keys: listed,
                        priority: LOW_PRIORITY,
                        once: true,
                    },
                    Stream {
                        keys: quiet,
                        rate: TRICKLE * capacity,
                        priority: NORMAL_PRIORITY,
                        once: false,
                    },
                ];
                plan
            }
            Scenario::Tenants => {
                let mut plan = Plan::new(&["a", "b"], vec!["a".to_string(), "b".to_string()]);
                let a = plan.keys(spec.keys, 0, |i| format!("a/obj-{i}"), |_| 0);
                let b = plan.keys((spec.keys / 10).max(1), 1, |i| format!("b/obj-{i}"), |_| 1);
                plan.streams = vec![
                    Stream {
                        keys: a,
                        rate: 10.0 * TENANT_B * capacity,
                        priority: NORMAL_PRIORITY,
                        once: false,
                    },
                    Stream {
                        keys: b,
                        rate: TENANT_B * capacity,
                        priority: NORMAL_PRIORITY,
                        once: false,
                    },
                ];
                plan
            }
        }
    }
}

/// What one worker saw (each worker keeps its own; merged at the end).
struct Tally {
    waits: Vec<Histogram<u64>>,
    /// Per class, the longest wait exactly, in nanoseconds: the histogram keeps 3 significant
    /// digits, a few milliseconds at 5 s, too coarse to tell aging's bound plus one reconcile.
    longest: Vec<u64>,
    spin: Vec<Duration>,
    reconciles: Vec<u64>,
    overlaps: u64,
    done_errors: u64,
}

impl Tally {
    fn new(plan: &Plan) -> Self {
        Self {
            waits: plan.classes.iter().map(|_| new_histogram()).collect(),
            longest: vec![0; plan.classes.len()],
            spin: vec![Duration::ZERO; plan.groups.len()],
            reconciles: vec![0; plan.groups.len()],
            overlaps: 0,
            done_errors: 0,
        }
    }

    fn merge(&mut self, other: Tally) {
        for (a, b) in self.waits.iter_mut().zip(&other.waits) {
            a.add(b).unwrap_or_default();
        }
        for (a, b) in self.longest.iter_mut().zip(&other.longest) {
            *a = (*a).max(*b);
        }
        for (a, b) in self.spin.iter_mut().zip(&other.spin) {
            *a += *b;
        }
        for (a, b) in self.reconciles.iter_mut().zip(&other.reconciles) {
            *a += *b;
        }
        self.overlaps += other.overlaps;
        self.done_errors += other.done_errors;
    }
}

/// The state the producer, the workers and the end of the run share.
struct Shared {
    plan: Plan,
    index: AHashMap<Key, usize>,
    /// Per key: nanoseconds from the start to when it became ready, plus one; 0: not ready.
    ready: Vec<AtomicU64>,
    /// Per key: a worker is reconciling it.
    busy: Vec<AtomicBool>,
    start: Instant,
    stop: AtomicBool,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX - 1)
    }

    /// Adds key `i` at `priority`, stamping when it became ready unless it already is.
    fn add(&self, queue: &dyn ControllerQueue, i: usize, priority: Priority) {
        // AcqRel: the stamp is written before the add, so the worker that gets the key (after
        // the queue's own synchronisation) finds it; a failed exchange means the key is
        // queued already and its first add's moment stands.
        let _ = self.ready[i].compare_exchange(
            0,
            self.now_ns() + 1,
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
        queue.add_with_priority(self.plan.keys[i].clone(), priority);
    }
}

/// Adds on the plan's schedule until the run stops; returns the adds made.
fn produce(
    shared: &Shared,
    queue: &dyn ControllerQueue,
    seed: u64,
    progress: &dyn Progress,
) -> u64 {
    let mut rng = fastrand::Rng::with_seed(seed);
    let streams = &shared.plan.streams;
    let mut made = vec![0u64; streams.len()];
    let mut total = 0;
    // Acquire: pairs with the Release store that ends the run.
    while !shared.stop.load(Ordering::Acquire) {
        let t = shared.start.elapsed().as_secs_f64();
        for (stream, made) in streams.iter().zip(&mut made) {
            let mut due = (stream.rate * t) as u64;
            if stream.once {
                due = due.min(stream.keys.len() as u64);
            }
            while *made < due {
                let i = if stream.once {
                    stream.keys.start + *made as usize
                } else {
                    rng.usize(stream.keys.clone())
                };
                shared.add(queue, i, stream.priority);
                *made += 1;
                total += 1;
            }
        }
        progress.set(total);
        thread::sleep(TICK);
    }
    total
}

/// Takes keys until the run stops, spinning `cost` on each.
fn work(shared: &Shared, queue: &dyn ControllerQueue, cost: Duration) -> Tally {
    let mut tally = Tally::new(&shared.plan);
    while let Ok(key) = queue.get() {
        // Acquire: pairs with the Release store that ends the run. A key taken after the end
        // is left stamped: it counts as still waiting.
        if shared.stop.load(Ordering::Acquire) {
            let _ = queue.done(&key);
            break;
        }
        let started = shared.now_ns() + 1;
        let Some(&i) = shared.index.get(&key) else {
            // Only the plan's keys are ever added; a stranger is the queue's mistake.
            tally.done_errors += 1;
            let _ = queue.done(&key);
            continue;
        };
        let (class, group) = shared.plan.of[i];
        let ready = shared.ready[i].swap(0, Ordering::AcqRel);
        if ready != 0 {
            let wait = started.saturating_sub(ready).max(1);
            tally.waits[class].record(wait).unwrap_or_default();
            tally.longest[class] = tally.longest[class].max(wait);
        }
        // Relaxed: the flag only detects overlap; the queue orders the hand-offs.
        if shared.busy[i].swap(true, Ordering::Relaxed) {
            tally.overlaps += 1;
        }
        let spin = Instant::now();
        burn(cost);
        tally.spin[group] += spin.elapsed();
        tally.reconciles[group] += 1;
        shared.busy[i].store(false, Ordering::Relaxed);
        if queue.done(&key).is_err() {
            tally.done_errors += 1;
        }
    }
    tally
}

/// What one W8 run leaves behind.
struct Finished {
    plan: Plan,
    wall: Duration,
    adds: u64,
    tally: Tally,
    /// Per class: keys still ready at the end, and the longest of their waits (ns).
    waiting: Vec<(u64, u64)>,
    overdue_handouts: u64,
}

#[allow(clippy::too_many_arguments)]
fn execute(
    plan: Plan,
    engine: EngineKind,
    queue_kind: QueueKind,
    seed: u64,
    cfg: &EngineConfig,
    ctl: &ControllerConfig,
    w8: &SchedulingConfig,
    progress: &dyn Progress,
) -> Finished {
    let (queue, overdue): (Arc<dyn ControllerQueue>, Option<OverdueHandouts>) =
        if queue_kind == QueueKind::Fifo {
            (fifo_queue(engine, cfg.shards), None)
        } else {
            let mut options = PriorityOptions::new();
            if queue_kind.ages() {
                options = options.max_wait(w8.max_wait);
            }
            if queue_kind.is_fair() {
                options = options.fair();
            }
            let (queue, overdue) = counted_priority_queue(engine, cfg.shards, options);
            (queue, Some(overdue))
        };
    let keys = plan.keys.len();
    let shared = Shared {
        index: plan.keys.iter().cloned().zip(0..).collect(),
        plan,
        ready: (0..keys).map(|_| AtomicU64::new(0)).collect(),
        busy: (0..keys).map(|_| AtomicBool::new(false)).collect(),
        start: Instant::now(),
        stop: AtomicBool::new(false),
    };
    let (adds, tallies, wall) = thread::scope(|scope| {
        let workers: Vec<_> = (0..ctl.workers)
            .map(|_| scope.spawn(|| work(&shared, &*queue, ctl.reconcile_cost)))
            .collect();
        let producer = scope.spawn(|| produce(&shared, &*queue, seed, progress));
        let until = shared.start + w8.duration;
        while Instant::now() < until {
            thread::sleep(
                until
                    .saturating_duration_since(Instant::now())
                    .min(TICK * 20),
            );
        }
        // Release: pairs with the workers' and the producer's Acquire loads.
        shared.stop.store(true, Ordering::Release);
        let wall = shared.start.elapsed();
        // Wakes the workers blocked in `get`.
        queue.shut_down();
        let adds = producer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let tallies: Vec<Tally> = workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        (adds, tallies, wall)
    });
    let mut tally = Tally::new(&shared.plan);
    for t in tallies {
        tally.merge(t);
    }
    let end = u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX);
    let mut waiting = vec![(0, 0); shared.plan.classes.len()];
    for (i, ready) in shared.ready.iter().enumerate() {
        let ready = ready.load(Ordering::Acquire);
        if ready != 0 {
            let (count, longest) = &mut waiting[shared.plan.of[i].0];
            *count += 1;
            *longest = (*longest).max(end.saturating_sub(ready - 1));
        }
    }
    Finished {
        plan: shared.plan,
        wall,
        adds,
        tally,
        waiting,
        overdue_handouts: overdue.map_or(0, |read| read()),
    }
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Runs one W8 row, measures it and judges it.
pub fn measure(
    engine: EngineKind,
    queue: QueueKind,
    spec: &WorkloadSpec,
    cfg: &EngineConfig,
    ctl: &ControllerConfig,
    w8: &SchedulingConfig,
    progress: &dyn Progress,
) -> Result<RunResult, RunError> {
    crate::pipelines::bare::check_spec(spec)?;
    check(ctl, w8)?;
    let meter = Meter::start();
    let plan = Plan::of(spec, w8, capacity(ctl));
    let done = execute(plan, engine, queue, spec.seed, cfg, ctl, w8, progress);
    let spent = meter.finish();
    let plan = &done.plan;
    let tally = &done.tally;
    let classes = plan
        .classes
        .iter()
        .zip(&tally.waits)
        .zip(&tally.longest)
        .zip(&done.waiting)
        .map(
            |(((class, hist), &served_longest), &(waiting_at_end, longest))| {
                let served = !hist.is_empty();
                let max = served_longest.max(longest);
                ClassWaits {
                    class: class.clone(),
                    served: hist.len(),
                    waiting_at_end,
                    p50_ms: served.then(|| ms(hist.value_at_quantile(0.5))),
                    p99_ms: served.then(|| ms(hist.value_at_quantile(0.99))),
                    max_ms: (served || waiting_at_end > 0).then(|| ms(max)),
                }
            },
        )
        .collect();
    let total_spin: f64 = tally.spin.iter().map(Duration::as_secs_f64).sum();
    let groups = plan
        .groups
        .iter()
        .zip(&tally.spin)
        .zip(&tally.reconciles)
        .map(|((group, spin), &reconciles)| GroupShare {
            group: group.clone(),
            reconciles,
            share: if total_spin > 0.0 {
                spin.as_secs_f64() / total_spin
            } else {
                0.0
            },
        })
        .collect();
    let reconciles: u64 = tally.reconciles.iter().sum();
    let mut failures: Vec<String> = overlapped(tally.overlaps).into_iter().collect();
    if tally.done_errors > 0 {
        failures.push(format!(
            "{} keys handed out were not the plan's or were refused by done",
            tally.done_errors
        ));
    }
    if reconciles == 0 {
        failures.push("no key was reconciled".to_string());
    }
    let verdict = Verdict::from_failures(failures);
    let label = label(w8.scenario, queue);
    let row = spent.row(engine.name(), &label, plan.keys.len(), done.adds, done.wall);
    Ok(RunResult {
        // The first class's waits (the flood's live changes, or tenant `a`'s), in µs.
        latency_us: LatencyUs::of(&tally.waits[0]),
        threads: ctl.workers,
        shards: (engine == EngineKind::Sharded).then_some(cfg.shards),
        controller: Some(figures(ctl, reconciles, 0, &row)),
        scheduling: Some(SchedulingFigures {
            scenario: w8.scenario.name().to_string(),
            queue: queue.name().to_string(),
            max_wait_ms: queue
                .ages()
                .then(|| u64::try_from(w8.max_wait.as_millis()).unwrap_or(u64::MAX)),
            capacity_per_s: capacity(ctl),
            overdue_handouts: done.overdue_handouts,
            classes,
            groups,
        }),
        verdict: verdict.summary(),
        failures: verdict.failures().to_vec(),
        ..row
    })
}

/// Refuses knobs that make no W8 run.
pub fn check(ctl: &ControllerConfig, w8: &SchedulingConfig) -> Result<(), RunError> {
    if ctl.reconcile_cost.is_zero() {
        return Err(RunError::Invalid(
            "w8 needs --reconcile-us of at least 1: its offered rates are multiples of what the \
             workers can reconcile"
                .to_string(),
        ));
    }
    if w8.duration.is_zero() {
        return Err(RunError::Invalid(
            "--duration-ms must be at least 1".to_string(),
        ));
    }
    Ok(())
}
