//! `loadgen run`: one workload (docs/workloads.md) through one engine or both, on the same events.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::args::parse_workload;
use crate::engines::{EngineArgs, EngineChoice, EngineConfig, DEFAULT_READERS};
use crate::harness::informer_handlers::{InformerArgs, InformerConfig};
use crate::pipelines::bare::RunError;
use crate::pipelines::controller_informer::Storm;
use crate::pipelines::controller_loop::ControllerConfig;
use crate::pipelines::harness_floor::FloorChoice;
use crate::pipelines::harness_floor::{subjects, Subject};
use crate::pipelines::through_informer::Through;
use crate::reports::report::{
    finish, handler_table, refuse, scheduling_table, table, write_file, write_json, Report,
};
use crate::result::RunResult;
use crate::runner::run_spec::{run_all, Pipeline, RunSpec, Source};
use crate::ui::Ui;
use workloads::{Workload, WorkloadSpec};

/// Arguments of `loadgen run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// Which workload: w1 (steady churn), w2 (hot keys), w3 (relist storm), w4 (read heavy),
    /// w5 (slow handlers), w6 (controller loop), w7 (resync storm), w8 (priority scheduling).
    #[arg(long, value_parser = parse_workload)]
    pub workload: Workload,
    /// Which engine(s).
    #[arg(long, value_enum, default_value = "all")]
    pub engine: EngineChoice,
    /// Churn events after the initial population (W3: over all 10 rounds). Default: the workload's own (docs/workloads.md).
    #[arg(long)]
    pub events: Option<usize>,
    /// Keys. Default: the workload's own (W2 1,000,000, W3 150,000, others 100,000).
    #[arg(long)]
    pub keys: Option<usize>,
    /// The seed and the engine's shards, consumers and handler cost.
    #[command(flatten)]
    pub engine_args: EngineArgs,
    /// W4's reader threads.
    #[arg(long, default_value_t = DEFAULT_READERS)]
    pub readers: usize,
    /// W6's worker threads, each taking keys from the workqueue and reconciling them.
    #[arg(long, default_value_t = crate::pipelines::controller_loop::DEFAULT_WORKERS, value_parser = crate::pipelines::controller_loop::parse_workers)]
    pub workers: usize,
    /// W6/W7/W8: CPU microseconds each reconcile burns (default 200 for w8, 5 otherwise).
    #[arg(long)]
    pub reconcile_us: Option<u64>,
    /// W6/W7 through the informer: run the controller's workers at this `nice` value (1-19,
    /// Linux), below the informer's threads, so CPU-bound reconciles do not starve event
    /// intake (`ControllerBuilder::worker_nice`); 0 (the default) leaves them as they are.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i32).range(0..=19))]
    pub worker_nice: i32,
    /// W7: the informer's resync period, in milliseconds (at least 1000).
    #[arg(long, default_value_t = crate::pipelines::controller_resync::DEFAULT_RESYNC_MS)]
    pub resync_ms: u64,
    /// W7: which workqueues to run: each engine's rate-limiting queue (`off`), its priority
    /// queue (`on`), or both.
    #[arg(long, value_enum, default_value = "both")]
    pub priority: crate::pipelines::controller_resync::PriorityChoice,
    /// W8: `mixed` (one namespace floods, an initial list waits at low priority, the others
    /// trickle) or `tenants` (two namespaces at 10:1, both backlogged).
    #[arg(long, value_enum, default_value = "mixed")]
    pub scenario: crate::pipelines::priority_scheduling::Scenario,
    /// W8: the workqueue orders to run, comma-separated: fifo, priority, aging, fair,
    /// aging-fair. Default: fifo,priority,aging,aging-fair for `mixed`; priority,fair for
    /// `tenants`.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub queues: Option<Vec<crate::pipelines::priority_scheduling::QueueKind>>,
    /// W8: aging's bound, in milliseconds (the `aging` orders).
    #[arg(long, default_value_t = crate::pipelines::priority_scheduling::DEFAULT_MAX_WAIT_MS)]
    pub max_wait_ms: u64,
    /// W8: how long each row runs, in milliseconds.
    #[arg(long, default_value_t = crate::pipelines::priority_scheduling::DEFAULT_DURATION_MS)]
    pub duration_ms: u64,
    /// W8 `mixed`: the initial list's keys, added at low priority over the first half of the
    /// run.
    #[arg(long, default_value_t = crate::pipelines::priority_scheduling::DEFAULT_BACKLOG)]
    pub backlog: usize,
    /// Offered load in ops per second: the producer paces itself instead of running flat out.
    /// Without it a run measures capacity, and its latency is mostly time queued behind the
    /// backlog; with a rate both engines can absorb, latency is the engine's own hand-off.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Bound both engines' backlog: the producer waits while this many deltas are queued
    /// (0: unbounded, as client-go; the default).
    #[arg(long, default_value_t = 0)]
    pub max_queued_deltas: usize,
    /// Both engines compact consecutive updates of a key into the newest (level-triggered
    /// mode; off by default).
    #[arg(long)]
    pub compact_updates: bool,
    /// Also write the results as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// How the events reach the engine: `queue` (a producer calls the queue, consumers apply
    /// pops to the indexer: the engine bare) or `informer` (through an in-memory API server,
    /// the reflector and a shared informer with `--handlers` handlers; W4 has no such path).
    /// Default: `informer` for w6 (a whole controller on the shared informer; `queue` runs its
    /// engine-only form), `queue` otherwise.
    #[arg(long, value_enum)]
    pub through: Option<Through>,
    /// Through the informer (w6 included): `row` adds the harness floor's row, a client that
    /// lists and watches the same server and drains every event into nothing (the limit of
    /// the server and the harness themselves); `none` leaves it out; `only` runs it alone.
    #[arg(long, value_enum, default_value = "row")]
    pub harness_floor: FloorChoice,
    /// The informer path's handlers (`--through informer`).
    #[command(flatten)]
    pub informer: InformerArgs,
    /// Run every engine in this process, one after another, instead of one child process per
    /// engine. Faster to debug and profile, but the peak memory of every run after the first
    /// is understated: the allocator hands the next run what the previous one freed.
    #[arg(long)]
    pub in_process: bool,
    /// Also write each engine's latency over time here, as CSV: per 100 ms of pop time, the
    /// sampled events and their p50, p99 and max (`engine,t_ms,samples,p50_us,p99_us,max_us`).
    /// Shows whether a high p99 is a backlog or a few stalls, and when they happened.
    #[arg(long)]
    pub timeline: Option<PathBuf>,
}

impl RunArgs {
    /// The workload spec these arguments ask for.
    pub fn spec(&self) -> WorkloadSpec {
        let mut spec = WorkloadSpec::new(self.workload).seed(self.engine_args.seed);
        if let Some(keys) = self.keys {
            spec = spec.keys(keys);
        }
        if let Some(events) = self.events {
            spec = spec.events(events);
        }
        spec
    }

    /// How the events reach the engine: `--through`, or the workload's own default (W6:
    /// through the informer; the others: the queue).
    pub fn through(&self) -> Through {
        self.through.unwrap_or(if self.workload == Workload::W6 {
            Through::Informer
        } else {
            Through::Queue
        })
    }

    /// W6's knobs these arguments ask for.
    pub fn controller(&self) -> ControllerConfig {
        ControllerConfig {
            workers: self.workers,
            reconcile_cost: Duration::from_micros(self.reconcile_us.unwrap_or(
                if self.workload == Workload::W8 {
                    crate::pipelines::priority_scheduling::DEFAULT_RECONCILE_US
                } else {
                    crate::pipelines::controller_loop::DEFAULT_RECONCILE_US
                },
            )),
            worker_nice: self.worker_nice,
            seed: self.engine_args.seed,
        }
    }

    /// W8's knobs these arguments ask for.
    pub fn scheduling(&self) -> crate::pipelines::priority_scheduling::SchedulingConfig {
        crate::pipelines::priority_scheduling::SchedulingConfig {
            scenario: self.scenario,
            duration: Duration::from_millis(self.duration_ms),
            max_wait: Duration::from_millis(self.max_wait_ms),
            backlog: self.backlog,
        }
    }

    /// W8's orders: `--queues`, or the scenario's own.
    pub fn queues(&self) -> Vec<crate::pipelines::priority_scheduling::QueueKind> {
        self.queues
            .clone()
            .unwrap_or_else(|| self.scenario.default_queues().to_vec())
    }

    /// The informer path's knobs these arguments ask for (`--through informer`).
    pub fn informer(&self) -> InformerConfig {
        self.informer.config()
    }

    /// The engine knobs these arguments ask for: the workload's own
    /// ([`EngineConfig::for_workload`]) where an argument is not given.
    pub fn config(&self) -> EngineConfig {
        EngineConfig {
            readers: self.readers,
            rate: self.rate,
            max_queued_deltas: self.max_queued_deltas,
            compact_updates: self.compact_updates,
            ..self.engine_args.config(self.workload)
        }
    }
}

/// The rows `args` ask for, in order: every chosen engine (and the harness floor, through the
/// in-memory server) through the workload's pipeline, once per W7 workqueue or W8 order.
pub fn specs(args: &RunArgs) -> Result<Vec<RunSpec>, RunError> {
    let source = Source::Workload(args.spec());
    let engines = args.engine.engines();
    let cfg = args.config();
    let ctl = args.controller();
    let through = args.through();
    let pipelines: Vec<Pipeline> = match args.workload {
        Workload::W8 => {
            let scheduling = args.scheduling();
            let queues = args.queues();
            let pipelines = queues.iter().map(|&queue| Pipeline::Scheduling {
                controller: ctl,
                scheduling,
                queue,
            });
            let subjects = engines.iter().map(|&e| Subject::Engine(e));
            return Ok(RunSpec::rows(
                &source,
                subjects,
                &cfg,
                &pipelines.collect::<Vec<_>>(),
            ));
        }
        Workload::W7 => {
            let resync = Duration::from_millis(args.resync_ms);
            let pipelines: Vec<Pipeline> = (args.priority.settings().iter())
                .map(|&priority| Pipeline::Resync {
                    controller: ctl,
                    storm: Storm { resync, priority },
                })
                .collect();
            let subjects = engines.iter().map(|&e| Subject::Engine(e));
            return Ok(RunSpec::rows(&source, subjects, &cfg, &pipelines));
        }
        Workload::W6 if through == Through::Informer => vec![Pipeline::ControllerInformer(ctl)],
        _ if through == Through::Informer => vec![Pipeline::Informer(args.informer())],
        Workload::W6 => vec![Pipeline::ControllerLoop(ctl)],
        _ => vec![Pipeline::Queue],
    };
    let subjects = match through {
        Through::Informer => subjects(&engines, args.harness_floor),
        Through::Queue if args.harness_floor == FloorChoice::Only => vec![Subject::HarnessFloor],
        Through::Queue => engines.iter().map(|&e| Subject::Engine(e)).collect(),
    };
    Ok(RunSpec::rows(&source, subjects, &cfg, &pipelines))
}

/// Generates the workload of `args` and runs the rows it asks for ([`specs`]), each in a
/// child process unless `--in-process` (see [`run_all`]).
pub fn run(args: &RunArgs, ui: Ui) -> Result<Vec<RunResult>, RunError> {
    run_all(&specs(args)?, args.in_process, ui)
}

/// Runs `loadgen run`.
pub fn main(args: RunArgs) -> ExitCode {
    if args.timeline.is_some() {
        // Before any thread starts; the child processes inherit it.
        crate::measure::timeline::enable();
    }
    match run(&args, Ui::detect()) {
        Ok(results) => {
            let shown = table(&results) + &handler_table(&results) + &scheduling_table(&results);
            finish("run", &shown, &results, || {
                if let Some(path) = &args.timeline {
                    let rows = results
                        .iter()
                        .map(|r| (r.engine.as_str(), r.timeline.as_deref().unwrap_or_default()));
                    write_file(path, crate::measure::timeline::csv(rows).as_bytes())
                        .map_err(|e| e.to_string())?;
                    for r in &results {
                        let t = r.timeline.as_deref().unwrap_or_default();
                        eprintln!(
                            "{} {}: {} of {} intervals of {} ms had an event slower than 10 ms",
                            r.engine,
                            r.workload,
                            crate::measure::timeline::stalls(t, 10_000.0),
                            t.len(),
                            crate::measure::timeline::INTERVAL_MS
                        );
                    }
                }
                match &args.json {
                    Some(path) => {
                        write_json(path, &Report { results: &results }).map_err(|e| e.to_string())
                    }
                    None => Ok(()),
                }
            })
        }
        Err(e) => refuse("run", e),
    }
}

/// `loadgen run`'s arguments parsed from `args` (without the command name) as the command line
/// parses them; for the tests of every path `run` dispatches to.
#[cfg(test)]
pub(crate) fn parse_args(args: &str) -> RunArgs {
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    Cli::parse_from(std::iter::once("run").chain(args.split_whitespace())).run
}

#[cfg(test)]
mod tests {
    use super::parse_args as parse;
    use super::*;
    use crate::engines::EngineKind;

    /// What the child reads back from the JSON the parent writes on its stdin.
    fn round_trip(spec: &RunSpec) -> RunSpec {
        let json = serde_json::to_string(spec).expect("a spec serialises");
        let child: RunSpec = serde_json::from_str(&json).expect("a spec deserialises");
        assert_eq!(
            &child, spec,
            "the child runs exactly the parent's row: {json}"
        );
        child
    }

    #[test]
    fn a_child_spec_asks_for_exactly_the_parents_run() {
        let parent = parse(concat!(
            "--workload w5 --keys 123 --events 4567 --seed 9 ",
            "--shards 8 --consumers 3 --readers 4"
        ));
        let rows = specs(&parent).expect("rows");
        assert_eq!(rows.len(), 2, "both engines");
        let child = round_trip(&rows[1]);
        assert_eq!(child.source, Source::Workload(parent.spec()));
        assert_eq!(child.engine, parent.config());
        assert_eq!(child.subject, Subject::Engine(EngineKind::Sharded));
        assert_eq!(child.pipeline, Pipeline::Queue);
    }

    #[test]
    fn a_child_gets_the_queue_modes_of_its_parent() {
        let parent = parse("--workload w2");
        assert_eq!(parent.config().max_queued_deltas, 0, "unbounded by default");
        assert!(!parent.config().compact_updates, "no compaction by default");
        let parent = parse("--workload w2 --max-queued-deltas 100000 --compact-updates");
        let cfg = parent.config();
        assert_eq!(
            (cfg.max_queued_deltas, cfg.compact_updates),
            (100_000, true)
        );
        let child = round_trip(&specs(&parent).expect("rows")[0]);
        assert_eq!(child.engine, cfg);
    }

    #[test]
    fn w5_burns_two_microseconds_per_delta_unless_told_otherwise() {
        let w5 = parse("--workload w5");
        assert_eq!(w5.config().handler_cost, Duration::from_micros(2));
        let w1 = parse("--workload w1");
        assert_eq!(w1.config().handler_cost, Duration::ZERO);
        let slow_w1 = parse("--workload w1 --handler-us 7");
        assert_eq!(slow_w1.config().handler_cost, Duration::from_micros(7));
    }

    #[test]
    fn consumers_default_to_one_and_two_for_w5_unless_told_otherwise() {
        assert_eq!(parse("--workload w1").config().consumers, 1);
        assert_eq!(parse("--workload w5").config().consumers, 2);
        let w1 = parse("--workload w1 --consumers 3");
        assert_eq!(w1.config().consumers, 3);
    }

    #[test]
    fn one_engine_runs_in_this_process_and_reports_one_row() {
        let args = parse("--workload w1 --engine reference --keys 50 --events 300");
        let results = run(&args, Ui::Quiet).expect("tiny run");
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].engine, "reference");
        assert!(results[0].is_ok(), "{:?}", results[0].failures);
    }

    #[test]
    fn invalid_arguments_are_refused_before_any_engine_runs() {
        // Zero keys; the floor alone, which needs the informer path.
        for line in [
            "--workload w1 --keys 0",
            "--workload w1 --harness-floor only",
        ] {
            let result = run(&parse(line), Ui::Quiet);
            assert!(matches!(result, Err(RunError::Invalid(_))), "{line}");
        }
    }

    #[test]
    fn a_child_spec_asks_for_exactly_the_parents_informer_run() {
        let parent = parse(concat!(
            "--workload w3 --through informer --handlers 5 --slow-handler-us 7 ",
            "--slow-handler-waits --slow-handler-coalesces --slow-handler-buffer 64 ",
            "--delivery async --keys 300 --rate 1000"
        ));
        let icfg = parent.informer();
        assert_eq!(icfg.handlers, 5);
        let rows = specs(&parent).expect("rows");
        let subjects: Vec<Subject> = rows.iter().map(|r| round_trip(r).subject).collect();
        assert_eq!(
            subjects,
            [
                Subject::Engine(EngineKind::Reference),
                Subject::Engine(EngineKind::Sharded),
                Subject::HarnessFloor
            ]
        );
        for row in &rows {
            assert_eq!(
                (&row.source, row.engine, row.pipeline),
                (
                    &Source::Workload(parent.spec()),
                    parent.config(),
                    Pipeline::Informer(icfg)
                )
            );
        }
    }

    #[test]
    fn defaults_are_three_handlers_one_slow_by_a_microsecond_through_the_queue() {
        let args = parse("--workload w1");
        assert_eq!(args.through(), Through::Queue);
        assert_eq!(parse("--workload w6").through(), Through::Informer);
        assert_eq!(args.harness_floor, FloorChoice::Row);
        assert_eq!(args.informer(), InformerConfig::default());
        assert!(crate::harness::informer_handlers::parse_handlers("65").is_err());
    }

    #[test]
    fn a_w6_child_is_told_which_form_of_w6_it_runs() {
        let parent = parse("--workload w6 --keys 300 --workers 3 --through queue");
        let ctl = parent.controller();
        let bare = round_trip(&specs(&parent).expect("rows")[1]);
        assert_eq!(bare.pipeline, Pipeline::ControllerLoop(ctl));
        assert_eq!(bare.source, Source::Workload(parent.spec()));
        let parent = parse("--workload w6 --keys 300 --workers 3");
        let rows = specs(&parent).expect("rows");
        assert_eq!(rows.len(), 3, "both engines and the harness floor");
        let informer = round_trip(&rows[1]);
        assert_eq!(informer.pipeline, Pipeline::ControllerInformer(ctl));
        assert_eq!(ctl.seed, parent.spec().seed);
    }

    #[test]
    fn a_w8_child_is_told_its_scenario_order_and_bounds() {
        use crate::pipelines::priority_scheduling::{QueueKind, Scenario};
        let parent = parse(concat!(
            "--workload w8 --scenario tenants --max-wait-ms 700 ",
            "--duration-ms 1234 --backlog 55 --keys 300"
        ));
        assert_eq!(
            parent.controller().reconcile_cost,
            Duration::from_micros(crate::pipelines::priority_scheduling::DEFAULT_RECONCILE_US)
        );
        assert_eq!(parent.queues(), [QueueKind::Priority, QueueKind::Fair]);
        let (ctl, w8) = (parent.controller(), parent.scheduling());
        assert_eq!(w8.scenario, Scenario::Tenants);
        let rows = specs(&parent).expect("rows");
        assert_eq!(rows.len(), 4, "two engines by two orders");
        let child = round_trip(&rows[3]);
        assert_eq!(child.subject, Subject::Engine(EngineKind::Sharded));
        assert_eq!(
            child.pipeline,
            Pipeline::Scheduling {
                controller: ctl,
                scheduling: w8,
                queue: QueueKind::Fair
            }
        );
        let mixed = parse("--workload w8 --queues fifo,aging-fair");
        assert_eq!(mixed.queues(), [QueueKind::Fifo, QueueKind::AgingFair]);
    }

    #[test]
    fn a_w7_child_is_told_its_resync_and_workqueue() {
        let parent = parse("--workload w7 --resync-ms 2000 --engine sharded");
        let rows = specs(&parent).expect("rows");
        let storms: Vec<Pipeline> = rows.iter().map(|r| round_trip(r).pipeline).collect();
        let storm = |priority| Pipeline::Resync {
            controller: parent.controller(),
            storm: crate::pipelines::controller_informer::Storm {
                resync: Duration::from_secs(2),
                priority,
            },
        };
        assert_eq!(storms, [storm(false), storm(true)]);
    }

    #[test]
    fn one_engine_in_process_passes_with_every_handler_ok() {
        let args = parse(concat!(
            "--workload w5 --through informer --engine reference ",
            "--keys 100 --events 1000 --in-process"
        ));
        let results = run(&args, Ui::Quiet).expect("tiny run");
        assert_eq!(results.len(), 2, "the engine's row and the harness floor's");
        assert!(results.iter().all(RunResult::is_ok), "{results:#?}");
        assert_eq!(
            results[1].engine,
            crate::pipelines::harness_floor::FLOOR_NAME
        );
        assert_eq!(
            results[1].deltas, results[1].events,
            "the floor hears every event"
        );
        assert_eq!(results[0].handlers.len(), 3);
        assert!(results[0].handlers[2].slow);
        assert!(handler_table(&results).contains("2 (slow)"));
    }
}
