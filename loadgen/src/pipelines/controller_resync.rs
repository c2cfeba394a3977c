//! W7, a controller under a resync storm (docs/workloads.md): W6's controller through the
//! shared informer ([`controller_informer`](crate::pipelines::controller_informer), on kcache's
//! `Controller`) while the informer resyncs every object every `--resync-ms`. The controller
//! adds resync keys at low priority; on a priority queue live changes pass them, on the
//! rate-limiting queue they wait behind them. The sharded engine's priority row also puts
//! resynced keys last in the informer and runs the controller's handler inline (see
//! `controller_informer::execute`). Each engine runs twice, `w7/fifo` (its
//! rate-limiting workqueue) and `w7/priority` (its priority queue), unless `--priority` picks
//! one. The rows' latency is the event-to-reconcile latency of live changes (from the write
//! into the server to the start of the first reconcile that read the written state); the
//! verdict is W6's, except that the queue need not be empty at the end (resyncs keep adding):
//! every key's last event reconciled after it arrived, no key held by two workers.

use std::time::Duration;

use clap::ValueEnum;

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
}

/// W7's own knobs, on top of W6's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncConfig {
    /// The informer's resync period (at least the informer's minimum, 1 s).
    pub resync: Duration,
    /// Which workqueues to run.
    pub priority: PriorityChoice,
}
