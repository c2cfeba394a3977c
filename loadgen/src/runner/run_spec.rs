//! One row of a run, as data: what it measures ([`Subject`]), on which events ([`Source`]),
//! with which engine knobs ([`EngineConfig`]) and through which pipeline ([`Pipeline`], with
//! its own knobs). Every command that runs engines builds its rows as [`RunSpec`]s, and
//! [`RunSpec::execute`] is the one place that turns a row into a measured, judged
//! [`RunResult`], here or in a child process.
//!
//! # In a child process
//!
//! [`run_all`] runs the rows here (one row, or `--in-process`) or each in a child process of
//! its own ([`isolate`](crate::harness::isolate)). The parent writes the row as JSON to the child's
//! stdin, and the child (`loadgen child`, a hidden command) reads it back, executes it and
//! writes its report to a temporary file as every child did. Stdin rather than a second
//! temporary file: nothing to name or clean up if either process dies, no size limit of a
//! command line, and the spec never outlives the child. Because the child deserialises the
//! very value the parent built, it cannot run anything but what the parent asked: there is no
//! command line to re-render, and a knob added to a config reaches children without a flag.
//! The child regenerates the workload from the same seed (or parses the same trace), so every
//! row sees the same events.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::engines::{EngineConfig, EngineKind, Mode};
use crate::harness::informer_handlers::InformerConfig;
use crate::pipelines::bare::{check_spec, generate_with_progress, RunError};
use crate::pipelines::controller_informer::{drops_none, measure, Storm, LABEL as W6_INFORMER};
use crate::pipelines::controller_loop::{phase_summary, ControllerConfig};
use crate::pipelines::harness_floor::Subject;
use crate::pipelines::priority_scheduling::{QueueKind, SchedulingConfig};
use crate::result::RunResult;
use crate::ui::Ui;
use crate::units::si;
use workloads::{Generated, Workload, WorkloadSpec};

/// The events a row runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// A synthetic workload, generated from its spec (the same events from the same seed).
    Workload(WorkloadSpec),
    /// A recorded watch stream (`loadgen replay`), parsed from this file.
    Trace(PathBuf),
}

/// How a row's events reach what it measures, with the pipeline's own knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pipeline {
    /// The engine bare: a producer calls the queue, consumers apply pops to the indexer (or,
    /// W4, one writer into the indexer while readers query it).
    Queue,
    /// Through the in-memory API server, the reflector and a shared informer with handlers
    /// ([`through_informer`](crate::pipelines::through_informer)).
    Informer(InformerConfig),
    /// W6 on the bare queue ([`controller_loop`](crate::pipelines::controller_loop)).
    ControllerLoop(ControllerConfig),
    /// W6 through the shared informer ([`controller_informer`](crate::pipelines::controller_informer)).
    ControllerInformer(ControllerConfig),
    /// W7: W6 through the informer under a resync storm, with its workqueue.
    Resync {
        /// W6's knobs.
        controller: ControllerConfig,
        /// The resync period and whether the workqueue is a priority queue.
        storm: Storm,
    },
    /// W8: one order of a saturated workqueue
    /// ([`priority_scheduling`](crate::pipelines::priority_scheduling)).
    Scheduling {
        /// The workers and their reconcile cost.
        controller: ControllerConfig,
        /// The scenario and its bounds.
        scheduling: SchedulingConfig,
        /// The order.
        queue: QueueKind,
    },
}

/// One row of a run: everything a child process needs to run it alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The events.
    pub source: Source,
    /// An engine, or the harness floor.
    pub subject: Subject,
    /// The engine's knobs (the floor uses its rate).
    pub engine: EngineConfig,
    /// How the events reach it.
    pub pipeline: Pipeline,
}

impl RunSpec {
    /// The rows of `subjects` × `pipelines` (subject-major) on `source` with `engine`.
    pub fn rows(
        source: &Source,
        subjects: impl IntoIterator<Item = Subject>,
        engine: &EngineConfig,
        pipelines: &[Pipeline],
    ) -> Vec<RunSpec> {
        subjects
            .into_iter()
            .flat_map(|subject| {
                pipelines.iter().map(move |&pipeline| RunSpec {
                    source: source.clone(),
                    subject,
                    engine: *engine,
                    pipeline,
                })
            })
            .collect()
    }

    /// The rows of `engines` bare on the workload `spec`.
    pub fn bare(spec: &WorkloadSpec, engines: &[EngineKind], engine: &EngineConfig) -> Vec<Self> {
        let subjects = engines.iter().map(|&e| Subject::Engine(e));
        Self::rows(
            &Source::Workload(*spec),
            subjects,
            engine,
            &[Pipeline::Queue],
        )
    }

    /// The workload spec of a synthetic source.
    fn workload(&self) -> Option<&WorkloadSpec> {
        match &self.source {
            Source::Workload(spec) => Some(spec),
            Source::Trace(_) => None,
        }
    }

    /// Refuses a row that makes no run, before anything is generated or started.
    pub fn check(&self) -> Result<(), RunError> {
        if let Some(spec) = self.workload() {
            check_spec(spec)?;
        }
        let workload = self.workload().map(|s| s.workload);
        match (self.subject, &self.pipeline) {
            (_, Pipeline::Informer(_)) => check_informer(workload)?,
            (Subject::HarnessFloor, Pipeline::ControllerInformer(_)) => {}
            (Subject::HarnessFloor, _) => {
                return Err(RunError::Invalid(
                    "--harness-floor only needs a run through the in-memory server: add \
                     --through informer"
                        .into(),
                ))
            }
            (_, Pipeline::Resync { storm, .. })
                if storm.resync < kcache::informer::MINIMUM_RESYNC_PERIOD =>
            {
                return Err(RunError::Invalid(format!(
                    "--resync-ms must be at least {} (the informer's minimum resync period)",
                    kcache::informer::MINIMUM_RESYNC_PERIOD.as_millis()
                )));
            }
            (
                _,
                Pipeline::Scheduling {
                    controller,
                    scheduling,
                    ..
                },
            ) => crate::pipelines::priority_scheduling::check(controller, scheduling)?,
            _ => {}
        }
        if matches!(self.source, Source::Trace(_)) && self.pipeline != Pipeline::Queue {
            return Err(RunError::Invalid(
                "a replayed trace runs through the engines bare".into(),
            ));
        }
        Ok(())
    }

    /// The events of this row: generated (with progress) or parsed from the trace.
    pub fn load(&self, ui: Ui) -> Result<Generated, RunError> {
        match &self.source {
            Source::Workload(spec) => generate_with_progress(spec, ui),
            Source::Trace(path) => {
                let bytes = std::fs::read(path).map_err(|e| {
                    RunError::Invalid(format!("cannot read {}: {e}", path.display()))
                })?;
                let trace = crate::watch_trace::parse_trace(&bytes);
                Ok(crate::watch_trace::to_workload(
                    &trace,
                    &path.display().to_string(),
                ))
            }
        }
    }

    /// Whether the row runs on generated events (W8 adds keys of its own).
    fn needs_events(&self) -> bool {
        !matches!(self.pipeline, Pipeline::Scheduling { .. })
    }

    /// The workload column of this row's report before the pipeline's suffix: `w1`, or
    /// `replay`.
    fn workload_name(&self) -> &'static str {
        self.workload().map_or("replay", |s| s.workload.name())
    }

    /// Runs this row on `gen` (its [`load`](Self::load)ed events; W8 ignores them), measures
    /// and judges it, with a progress phase of its own: the one dispatch from a row to the
    /// module that runs it.
    pub fn execute(&self, gen: &Generated, ui: Ui) -> Result<RunResult, RunError> {
        let name = self.workload_name();
        let total = gen.ops.len() as u64;
        let cfg = &self.engine;
        let engine = match self.subject {
            Subject::Engine(engine) => engine,
            Subject::HarnessFloor => {
                let (label, handlers) = match &self.pipeline {
                    Pipeline::Informer(icfg) => (format!("{name}/informer"), Some(icfg)),
                    _ => (W6_INFORMER.to_string(), None),
                };
                return crate::pipelines::harness_floor::row(gen, &label, cfg.rate, handlers, ui);
            }
        };
        let phase_of = |label: &str, total| ui.phase(format!("{label} {engine}"), total);
        let workload = self.workload().map(|s| s.workload);
        let (phase, result) = match self.pipeline {
            Pipeline::Queue => {
                let phase = phase_of(name, total);
                let mode = workload.map_or(Mode::Queue, Mode::of);
                let result = crate::pipelines::bare::measure(engine, name, gen, mode, cfg, &phase)?;
                (phase, result)
            }
            Pipeline::Informer(icfg) => {
                let phase = phase_of(&format!("{name}/informer"), total);
                let workload = workload.unwrap_or(Workload::W1);
                let result = crate::pipelines::through_informer::measure(
                    engine, gen, workload, cfg, &icfg, &phase,
                )?;
                (phase, result)
            }
            Pipeline::ControllerLoop(ctl) => {
                let phase = phase_of(name, total);
                let result = crate::pipelines::controller_loop::measure(
                    engine, name, gen, cfg, &ctl, &phase,
                )?;
                (phase, result)
            }
            Pipeline::ControllerInformer(ctl) => {
                let phase = phase_of(W6_INFORMER, total);
                let drops = drops_none();
                let result = measure(engine, gen, cfg, &ctl, drops, None, &phase)?;
                (phase, result)
            }
            Pipeline::Resync { controller, storm } => {
                let phase = phase_of(storm.label(), total);
                let (ctl, drops) = (controller, drops_none());
                let result = measure(engine, gen, cfg, &ctl, drops, Some(storm), &phase)?;
                (phase, result)
            }
            Pipeline::Scheduling {
                controller,
                scheduling,
                queue,
            } => {
                let label =
                    crate::pipelines::priority_scheduling::label(scheduling.scenario, queue);
                let phase = phase_of(&label, 0);
                let spec =
                    (self.workload().copied()).unwrap_or_else(|| WorkloadSpec::new(Workload::W8));
                let result = crate::pipelines::priority_scheduling::measure(
                    engine,
                    queue,
                    &spec,
                    cfg,
                    &controller,
                    &scheduling,
                    &phase,
                )?;
                (phase, result)
            }
        };
        phase.finish(&if result.controller.is_some() {
            phase_summary(&result)
        } else {
            format!(
                "{} events/s, verdict {}",
                si(result.events_per_s),
                result.verdict
            )
        });
        Ok(result)
    }

    /// Runs this row alone without progress: here with `in_process`, else in a child process
    /// whose stderr is captured (a capacity probe, a point of the scale sweep).
    pub fn probe(&self, in_process: bool) -> Result<RunResult, RunError> {
        self.check()?;
        let mut results = if in_process {
            execute_here(std::slice::from_ref(self), Ui::Quiet)?
        } else {
            crate::harness::isolate::run_child_quietly(self)?
        };
        match results.len() {
            1 => Ok(results.remove(0)),
            n => Err(RunError::Invalid(format!(
                "a child run reported {n} results instead of one"
            ))),
        }
    }
}

/// Refuses a workload that has no path through the informer.
fn check_informer(workload: Option<Workload>) -> Result<(), RunError> {
    match workload {
        Some(w) if !w.uses_queue() => Err(RunError::Invalid(format!(
            "{w} writes straight into the indexer: it has no informer path (use w1, w2, w3 or w5)"
        ))),
        Some(Workload::W6) => Err(RunError::Invalid(
            "w6 through the informer is its own pipeline (informer, workqueue, workers): \
             run it with `loadgen run --workload w6`"
                .into(),
        )),
        _ => Ok(()),
    }
}

/// Runs `specs` in order and returns their results: here, one after another on events loaded
/// once per source, when there is only one row or `in_process` is set; otherwise each row in
/// a child process of its own (see the module docs). Every row is checked before any runs.
pub fn run_all(specs: &[RunSpec], in_process: bool, ui: Ui) -> Result<Vec<RunResult>, RunError> {
    for spec in specs {
        spec.check()?;
    }
    crate::harness::isolate::run_each(specs, in_process, |specs| execute_here(specs, ui))
}

/// Runs `specs` in this process, loading each source's events once.
pub fn execute_here(specs: &[RunSpec], ui: Ui) -> Result<Vec<RunResult>, RunError> {
    let nothing = no_events();
    let mut loaded: Option<(Source, Generated)> = None;
    let mut results = Vec::with_capacity(specs.len());
    for spec in specs {
        let gen = if !spec.needs_events() {
            &nothing
        } else {
            match &mut loaded {
                Some((source, gen)) if *source == spec.source => &*gen,
                other => {
                    // Drop the previous events before loading the next.
                    *other = None;
                    &other.insert((spec.source.clone(), spec.load(ui)?)).1
                }
            }
        };
        results.push(spec.execute(gen, ui)?);
    }
    Ok(results)
}

/// No events: what a row that makes its own (W8) is handed.
fn no_events() -> Generated {
    Generated {
        label: String::new(),
        ops: Vec::new(),
        universe: workloads::Universe {
            keys: Vec::new(),
            namespaces: Vec::new(),
            nodes: Vec::new(),
        },
        model: workloads::Model::default(),
    }
}
