//! The engines a run can use, and the knobs of one run: engine names as the command line spells
//! them, the shard/consumer/reader counts, handler cost, pacing, and how a workload reaches the
//! engine.

use std::time::Duration;

use workloads::Workload;

/// Which engine.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// `kcache::reference`: the faithful client-go port.
    Reference,
    /// `kcache::sharded`: the fast engine.
    Sharded,
}

impl EngineKind {
    /// Both engines, reference first.
    pub const ALL: [EngineKind; 2] = [EngineKind::Reference, EngineKind::Sharded];

    /// `reference` or `sharded`.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Reference => "reference",
            EngineKind::Sharded => "sharded",
        }
    }
}

/// An engine name that is neither `reference` nor `sharded`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine {0:?}: expected reference, sharded or all")]
pub struct UnknownEngine(pub String);

workloads::display_and_parse_by_name!(EngineKind, UnknownEngine);

/// Parses a `--consumers` argument: at least one (zero consumers would never drain the queue,
/// and quietly running one instead would report a run that was not the one asked for).
///
/// ```
/// use loadgen::engines::parse_consumers;
/// assert_eq!(parse_consumers("3"), Ok(3));
/// assert!(parse_consumers("0").is_err());
/// ```
pub fn parse_consumers(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "--consumers must be a whole number of at least 1 (got {s:?})"
        )),
    }
}

/// The engine flags `run` and `capacity` share: `--seed`, `--shards`, `--consumers` and
/// `--handler-us`.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// The generator's (splitmix64) seed.
    #[arg(long, default_value_t = workloads::DEFAULT_SEED)]
    pub seed: u64,
    /// Shards of the sharded engine: a power of two from 1 to 65536.
    #[arg(long, default_value_t = kcache::sharded::DEFAULT_SHARDS, value_parser = workloads::parse_shards)]
    pub shards: usize,
    /// Consumer threads of the sharded engine (the reference always uses exactly one).
    /// Default: 2 for w5 (its slow handler is what extra consumers are for), 1 otherwise (one
    /// producer and one consumer on two cores; a second consumer only competes for a core).
    #[arg(long, value_parser = parse_consumers)]
    pub consumers: Option<usize>,
    /// CPU microseconds the handler burns per delta (default 2 for w5, 0 otherwise).
    #[arg(long)]
    pub handler_us: Option<u64>,
}

impl EngineArgs {
    /// `workload`'s own engine knobs ([`EngineConfig::for_workload`]) with the shards,
    /// consumers and handler cost these flags ask for.
    pub fn config(&self, workload: Workload) -> EngineConfig {
        let own = EngineConfig::for_workload(workload);
        EngineConfig {
            shards: self.shards,
            consumers: self.consumers.unwrap_or(own.consumers),
            handler_cost: self
                .handler_us
                .map_or(own.handler_cost, Duration::from_micros),
            ..own
        }
    }
}

/// The knobs of one engine run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EngineConfig {
    /// Shards of the sharded engine: a power of two up to
    /// [`MAX_SHARDS`](workloads::MAX_SHARDS) (see [`parse_shards`](workloads::parse_shards)).
    pub shards: usize,
    /// Consumer threads of the sharded engine (the reference always has exactly one).
    pub consumers: usize,
    /// W4's reader threads.
    pub readers: usize,
    /// CPU the handler burns per delta (W5); zero for none.
    pub handler_cost: Duration,
    /// Offered load: the producer paces itself to this many ops per second (`None`: as fast
    /// as it can, which measures capacity; latency then includes the backlog).
    pub rate: Option<u64>,
    /// Both engines' backlog bound, `QueueOptions::max_queued_deltas` (0: unbounded, the
    /// default): the producer waits while this many deltas are queued.
    pub max_queued_deltas: usize,
    /// Both engines' level-triggered mode, `QueueOptions::compact_updates` (off by default).
    pub compact_updates: bool,
}

/// Consumer threads of the sharded engine unless told otherwise (every command and
/// [`EngineConfig::default`]): one. On the project's two cores the producer and one consumer
/// each have a core, and a second consumer only competes with them; W5 is the exception
/// ([`W5_CONSUMERS`]). The reference engine always runs exactly one, as client-go does.
pub const DEFAULT_CONSUMERS: usize = 1;

/// W5's consumer threads unless told otherwise: its slow handler is what extra consumers are
/// for (docs/workloads.md).
pub const W5_CONSUMERS: usize = 2;

/// W5's handler cost unless told otherwise: CPU microseconds burnt per delta.
pub const W5_HANDLER_US: u64 = 2;

/// W4's reader threads unless told otherwise.
pub const DEFAULT_READERS: usize = 2;

impl EngineConfig {
    /// The knobs `workload` runs with unless told otherwise: [`DEFAULT_SHARDS`] shards,
    /// [`DEFAULT_CONSUMERS`] consumers ([`W5_CONSUMERS`] for W5), [`DEFAULT_READERS`] readers,
    /// no handler cost ([`W5_HANDLER_US`] for W5), and no pacing.
    ///
    /// [`DEFAULT_SHARDS`]: kcache::sharded::DEFAULT_SHARDS
    pub fn for_workload(workload: Workload) -> Self {
        let w5 = workload == Workload::W5;
        Self {
            consumers: if w5 { W5_CONSUMERS } else { DEFAULT_CONSUMERS },
            handler_cost: Duration::from_micros(if w5 { W5_HANDLER_US } else { 0 }),
            ..Self::default()
        }
    }
}

impl Default for EngineConfig {
    /// The knobs of a run without a slow handler (a replay, W1–W4): see
    /// [`EngineConfig::for_workload`].
    fn default() -> Self {
        Self {
            shards: kcache::sharded::DEFAULT_SHARDS,
            consumers: DEFAULT_CONSUMERS,
            readers: DEFAULT_READERS,
            handler_cost: Duration::ZERO,
            rate: None,
            max_queued_deltas: 0,
            compact_updates: false,
        }
    }
}

/// How the workload reaches the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Through the queue to consumers that apply pops to the indexer (W1–W3, W5, replay).
    Queue,
    /// One writer straight into the indexer while readers query it (W4).
    Direct,
}

impl Mode {
    /// How `workload` reaches the engine: W4 writes straight into the indexer, the others go
    /// through the queue.
    pub fn of(workload: Workload) -> Self {
        if workload.uses_queue() {
            Mode::Queue
        } else {
            Mode::Direct
        }
    }
}

/// `reference`, `sharded` or `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineChoice {
    /// The faithful client-go port only.
    Reference,
    /// The sharded engine only.
    Sharded,
    /// Both, reference first, on the same events.
    All,
}

impl EngineChoice {
    /// The engines to run, in order.
    pub fn engines(self) -> Vec<EngineKind> {
        match self {
            EngineChoice::Reference => vec![EngineKind::Reference],
            EngineChoice::Sharded => vec![EngineKind::Sharded],
            EngineChoice::All => EngineKind::ALL.to_vec(),
        }
    }
}
