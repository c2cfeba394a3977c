//! W7, a controller under a resync storm (docs/workloads.md): W6's controller through the
//! shared informer ([`controller_informer`](crate::controller_informer), on kcache's
//! `Controller`) while the informer resyncs every object every `--resync-ms`. The controller
//! adds resync keys at low priority; on a priority queue live changes pass them, on the
//! rate-limiting queue they wait behind them. The sharded engine's priority row also puts
//! resynced keys last in the informer and runs the controller's handler inline (see
//! `controller_informer::execute_with`). Each engine runs twice, `w7/fifo` (its
//! rate-limiting workqueue) and `w7/priority` (its priority queue), unless `--priority` picks
//! one. The rows' latency is the event-to-reconcile latency of live changes (from the write
//! into the server to the start of the first reconcile that read the written state); the
//! verdict is W6's, except that the queue need not be empty at the end (resyncs keep adding):
//! every key's last event reconciled after it arrived, no key held by two workers.

use std::time::Duration;

use clap::ValueEnum;

use crate::controller_informer::{child_args as w6_child_args, drops_none, measure_with, Storm};
use crate::controller_loop::{phase_summary, ControllerConfig};
use crate::engines::{EngineConfig, EngineKind};
use crate::result::RunResult;
use crate::runs::{generate_with_progress, RunError};
use crate::ui::Ui;
use workloads::WorkloadSpec;

/// W7's resync period unless told otherwise: every object every 5 s.
pub const DEFAULT_RESYNC_MS: u64 = 5_000;

/// Which workqueues W7 runs (`--priority`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PriorityChoice {
    /// Both: each engine's rate-limiting queue, then its priority queue.
    Both,
    /// The priority queue only.
    On,
    /// The rate-limiting queue only.
    Off,
}

impl PriorityChoice {
    /// The priority settings to run, in order.
    pub fn settings(self) -> &'static [bool] {
        match self {
            PriorityChoice::Both => &[false, true],
            PriorityChoice::On => &[true],
            PriorityChoice::Off => &[false],
        }
    }

    fn arg(priority: bool) -> &'static str {
        if priority {
            "on"
        } else {
            "off"
        }
    }
}

/// W7's own knobs, on top of W6's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncConfig {
    /// The informer's resync period (at least the informer's minimum, 1 s).
    pub resync: Duration,
    /// Which workqueues to run.
    pub priority: PriorityChoice,
}

/// The command line of a child that runs W7 on `engine` with one priority setting.
pub fn child_args(
    spec: &WorkloadSpec,
    (engine, priority): (EngineKind, bool),
    cfg: &EngineConfig,
    ctl: &ControllerConfig,
    resync: &ResyncConfig,
) -> Vec<String> {
    let mut args = w6_child_args(spec, engine, cfg, ctl);
    args.extend([
        "--resync-ms".to_string(),
        resync.resync.as_millis().to_string(),
        "--priority".to_string(),
        PriorityChoice::arg(priority).to_string(),
    ]);
    args
}

/// `loadgen run --workload w7`: every chosen engine with each chosen workqueue, each in a
/// child process unless `in_process`.
pub fn run_spec(
    spec: &WorkloadSpec,
    engines: &[EngineKind],
    cfg: &EngineConfig,
    ctl: &ControllerConfig,
    resync: &ResyncConfig,
    in_process: bool,
    ui: Ui,
) -> Result<Vec<RunResult>, RunError> {
    crate::runs::check_spec(spec)?;
    if resync.resync < kcache::informer::MINIMUM_RESYNC_PERIOD {
        return Err(RunError::Invalid(format!(
            "--resync-ms must be at least {} (the informer's minimum resync period)",
            kcache::informer::MINIMUM_RESYNC_PERIOD.as_millis()
        )));
    }
    let ctl = ControllerConfig {
        seed: spec.seed,
        ..*ctl
    };
    let subjects: Vec<(EngineKind, bool)> = engines
        .iter()
        .flat_map(|&e| resync.priority.settings().iter().map(move |&p| (e, p)))
        .collect();
    crate::isolate::run_each(
        &subjects,
        in_process,
        |subject| child_args(spec, subject, cfg, &ctl, resync),
        |subjects| {
            let gen = generate_with_progress(spec, ui)?;
            let mut results = Vec::with_capacity(subjects.len());
            for &(engine, priority) in subjects {
                let storm = Storm {
                    resync: resync.resync,
                    priority,
                };
                let phase = ui.phase(format!("{} {engine}", storm.label()), gen.ops.len() as u64);
                let result =
                    measure_with(engine, &gen, cfg, &ctl, drops_none(), Some(storm), &phase)?;
                phase.finish(&phase_summary(&result));
                results.push(result);
            }
            Ok(results)
        },
    )
}
