//! `eventcost`: one engine's work per event, on one thread, for instruction and cache-miss
//! counters (callgrind's cache simulation; `perf stat` where the machine has counters), and for
//! the ceiling of this machine (`--engine floor`, below).
//!
//! The events of W1, W2 or W3 (docs/workloads.md) go through the queue and the indexer as
//! loadgen drives them, but on one thread and in steps: `--step` ops into the queue, then the
//! queue is drained (`try_pop` until empty, or with `--pop-batch N` the sharded queue's `pop_batch(N)`
//! as loadgen's consumers use it, applying each key to the indexer as loadgen's consumer
//! does: `process_deltas` for the reference, `apply_deltas_coalesced` for the sharded engine).
//! With the default step of 16 a key rarely gathers two deltas, which is the paced regime of a
//! run that keeps up; a large step makes a backlog. Three phases, each its own function so that
//! a profiler can count one alone:
//!
//! 1. `population_phase`: the K initial adds (W3: its first relist of every key);
//! 2. `warmup_phase`: `--warmup` churn events (caches and tables settle; W1 and W2 only);
//! 3. `churn_phase`: `--events` churn events, the ones to count (W3: its ten rounds of churn
//!    with the relist and resync after each).
//!
//! ```text
//! MIMALLOC_ALLOW_THP=0 valgrind --tool=callgrind --cache-sim=yes --LL=8388608,16,64 \
//!     --collect-atstart=no --toggle-collect='*churn_phase*' \
//!     target/release/eventcost --engine sharded --keys 100000 --events 100000
//! ```
//!
//! (`--instr-at-start=no` plus `--callgrind-control` spares the simulation of the population:
//! the binary asks `callgrind_control -i on` to switch instrumentation on after it.) It prints
//! each phase's wall time per event; the instruction and miss counts come from the profiler.
//! An event is what loadgen counts: an add, update or delete, or one object of a relist.
//!
//! `--engine floor` runs the same events through `bench::floor`: the bookkeeping the contract
//! requires (client-go's maps, dedup, tombstones, the indexes) in plain single-threaded maps,
//! applied coalesced as the sharded consumer applies a pop, with no lock, atomic or scheduler.
//! Both engines keep at least this bookkeeping; splitting it between threads adds the cost of
//! sharing. The ceiling this prints, `N / (the floor's time per event)` for `N` cores
//! (`--cores`, default the machine's), is what an engine would absorb if it did the floor's
//! work at the floor's speed on every core at once, with nothing paid for the split. It is an
//! ideal, not a proof: the floor asks for no memory ahead (the sharded engine prefetches), two
//! cores have twice the private cache, and another layout of the bookkeeping could cost less.
//! A target well above it is out of reach for this design on that machine; one near it is at
//! the edge of what the machine could give.

use std::hint::black_box;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use bench::floor::{self, FloorIndexer, FloorQueue};
use bench::mem::generate_workload;
use bench::Pod;
use clap::{Parser, ValueEnum};
use kcache::{
    apply_deltas_coalesced, process_deltas, DeltaQueue, Key, KnownObjects, NoopHandler, Store,
};
use workloads::{Op, Workload, DEFAULT_SEED};

/// The same allocator as loadgen's (run it with `MIMALLOC_ALLOW_THP=0`, as loadgen runs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What runs the events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Engine {
    /// The faithful client-go port.
    Reference,
    /// The sharded engine.
    Sharded,
    /// The contract's bookkeeping with no synchronisation (`bench::floor`): the least work.
    Floor,
}

/// One engine's cost per event on one thread (see the module docs).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// What runs the events.
    #[arg(long, value_enum)]
    engine: Engine,
    /// The workload: w1, w2 or w3 (W4 writes the indexer directly, W5 adds a handler's CPU,
    /// W6 a workqueue: none is the queue-and-indexer work this counts).
    #[arg(long, default_value = "w1", value_parser = parse_workload)]
    workload: Workload,
    /// Keys K. Default: the workload's own (docs/workloads.md).
    #[arg(long)]
    keys: Option<usize>,
    /// Churn events counted (the `churn_phase`; for W3, its churn events over all ten rounds,
    /// and the objects of the relists between them count as events too).
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Churn events run before them, not counted. Default: 20,000 for W1 and W2; W3 takes none
    /// (its rounds are spread over `--events`, and a cut by op count would split one).
    #[arg(long)]
    warmup: Option<usize>,
    /// Ops queued between two drains.
    #[arg(long, default_value_t = 16)]
    step: usize,
    /// The sharded engine's consumer drains with `pop_batch(N)`, as loadgen's do (each visit
    /// to a shard takes up to N of its keys and runs the prefetch pipeline over them), instead
    /// of one `try_pop` per key. 0: `try_pop`.
    #[arg(long, default_value_t = 0)]
    pop_batch: usize,
    /// Shards of the sharded engine: a power of two from 1 to 65536.
    #[arg(long, default_value_t = kcache::sharded::DEFAULT_SHARDS, value_parser = workloads::parse_shards)]
    shards: usize,
    /// The workload generator's seed.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Run `callgrind_control -i on` for this process after the population (for valgrind's
    /// `--instr-atstart=no`).
    #[arg(long)]
    callgrind_control: bool,
    /// Cores for the floor's ceiling. Default: this machine's.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    cores: Option<u16>,
}

fn parse_workload(s: &str) -> Result<Workload, String> {
    match s.parse::<Workload>().map_err(|e| e.to_string())? {
        w @ (Workload::W1 | Workload::W2 | Workload::W3) => Ok(w),
        other => Err(format!(
            "{other} is not queue-and-indexer work alone (see --help): use w1, w2 or w3"
        )),
    }
}

/// One engine's queue and indexer, driven one step at a time.
trait Pipeline {
    /// Queues `ops`, then drains the queue into the indexer.
    fn step(&mut self, ops: &[Op]);
    /// Objects in the indexer.
    fn stored(&self) -> usize;
    /// The version the indexer holds for `key`.
    fn version_of(&self, key: &Key) -> Option<u64>;
}

struct Reference {
    queue: kcache::reference::DeltaFifo<Pod>,
    store: Arc<kcache::reference::IndexedStore<Pod>>,
}

struct Sharded {
    queue: kcache::sharded::DeltaFifo<Pod>,
    store: Arc<kcache::sharded::IndexedStore<Pod>>,
    /// `pop_batch`'s `max`, or 0 for `try_pop`.
    pop_batch: usize,
}

/// The floor's queue and indexer (`bench::floor`), on this one thread.
struct Floor {
    queue: FloorQueue<Pod>,
    store: FloorIndexer<Pod>,
}

/// Performs `op` on `queue` as loadgen's producer does.
fn enqueue(queue: &impl DeltaQueue<Pod>, op: &Op) {
    // The generator only makes objects that have keys.
    let done = op.perform_on(queue);
    debug_assert!(done.is_ok(), "generated op refused: {done:?}");
}

/// The events loadgen counts for `ops` ([`Op::events`]).
fn events_in(ops: &[Op]) -> usize {
    ops.iter().map(Op::events).sum()
}

impl Pipeline for Reference {
    fn step(&mut self, ops: &[Op]) {
        ops.iter().for_each(|op| enqueue(&self.queue, op));
        let store = &*self.store;
        while let kcache::TryPop::Popped(()) = self.queue.try_pop(|deltas, initial| {
            process_deltas(store, &mut NoopHandler, &deltas, initial);
        }) {}
    }

    fn stored(&self) -> usize {
        self.store.len()
    }

    fn version_of(&self, key: &Key) -> Option<u64> {
        self.store.get_by_key(key).map(|pod| pod.version)
    }
}

impl Pipeline for Sharded {
    fn step(&mut self, ops: &[Op]) {
        ops.iter().for_each(|op| enqueue(&self.queue, op));
        let store = &*self.store;
        let apply = |deltas: kcache::Deltas<Pod>, initial| {
            apply_deltas_coalesced(store, &mut NoopHandler, &deltas, initial);
        };
        if self.pop_batch == 0 {
            while let kcache::TryPop::Popped(()) = self.queue.try_pop(apply) {}
            return;
        }
        // One thread: while keys are queued, some shard holds them and `pop_batch` returns
        // without waiting. Count them once per step: `len` locks every shard and `is_empty`
        // at least one, which loadgen's consumers never do. Asking before each visit cost 9%
        // of the instructions counted (when `is_empty` still locked all 16); once per step (a
        // harness cost that remains) it is a lock per shard per `--step` ops.
        let mut queued = self.queue.len();
        while queued > 0 {
            match self.queue.pop_batch(self.pop_batch, apply) {
                Ok(popped) => queued = queued.saturating_sub(popped),
                Err(_) => return,
            }
        }
    }

    fn stored(&self) -> usize {
        self.store.len()
    }

    fn version_of(&self, key: &Key) -> Option<u64> {
        self.store.get_by_key(key).map(|pod| pod.version)
    }
}

impl Pipeline for Floor {
    fn step(&mut self, ops: &[Op]) {
        let (queue, store) = (&mut self.queue, &mut self.store);
        for op in ops {
            let done = match op {
                Op::Add(pod) => queue.add(Arc::clone(pod)),
                Op::Update(pod) => queue.update(Arc::clone(pod)),
                Op::Delete(pod) => queue.delete(Arc::clone(pod), Some(store)),
                Op::Replace(relist) => queue.replace(relist.objects.clone(), Some(store)),
                Op::Resync => queue.resync(store),
            };
            debug_assert!(done.is_ok(), "generated op refused: {done:?}");
        }
        while let Some(()) = queue.pop(|deltas, _| floor::apply_deltas_coalesced(store, &deltas)) {}
    }

    fn stored(&self) -> usize {
        self.store.len()
    }

    fn version_of(&self, key: &Key) -> Option<u64> {
        self.store.get_by_key(key).map(|pod| pod.version)
    }
}

fn known<S: KnownObjects<Pod> + 'static>(store: &Arc<S>) -> Arc<dyn KnownObjects<Pod>> {
    Arc::clone(store) as Arc<dyn KnownObjects<Pod>>
}

#[inline(never)]
fn population_phase(pipeline: &mut dyn Pipeline, ops: &[Op], step: usize) {
    ops.chunks(step).for_each(|chunk| pipeline.step(chunk));
}

#[inline(never)]
fn warmup_phase(pipeline: &mut dyn Pipeline, ops: &[Op], step: usize) {
    ops.chunks(step).for_each(|chunk| pipeline.step(chunk));
}

#[inline(never)]
fn churn_phase(pipeline: &mut dyn Pipeline, ops: &[Op], step: usize) {
    ops.chunks(step).for_each(|chunk| pipeline.step(chunk));
}

/// Asks callgrind to switch instrumentation on, and keeps this thread running (valgrind only
/// reads the request while the program runs) until `callgrind_control` has its answer.
fn instrumentation_on() -> Result<(), String> {
    let mut child = Command::new("callgrind_control")
        .args(["-i", "on", &std::process::id().to_string()])
        .spawn()
        .map_err(|e| format!("cannot run callgrind_control: {e}"))?;
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("callgrind_control failed: {status}")),
            Ok(None) => std::thread::yield_now(),
            Err(e) => return Err(format!("cannot wait for callgrind_control: {e}")),
        }
    }
}

/// One phase's wall time and the events it carried.
struct Phase {
    ns: f64,
    events: usize,
}

impl Phase {
    fn new(started: Instant, events: usize) -> Self {
        Self {
            ns: started.elapsed().as_nanos() as f64,
            events,
        }
    }

    fn ns_per_event(&self) -> f64 {
        self.ns / self.events.max(1) as f64
    }

    /// `N ns/event`, or `-` for a phase with no events.
    fn per_event(&self) -> String {
        if self.events == 0 {
            "-".to_owned()
        } else {
            format!("{:.0} ns/event", self.ns_per_event())
        }
    }
}

/// Churn events before the counted ones, unless `--warmup` says otherwise (W1 and W2).
const DEFAULT_WARMUP: usize = 20_000;

/// The ops before the first churn event: W1's and W2's K adds, W3's first relist.
fn population_len(workload: Workload, keys: usize, ops: &[Op]) -> usize {
    match workload {
        Workload::W3 => 1.min(ops.len()),
        _ => keys.min(ops.len()),
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let step = args.step.max(1);
    let keys = args.keys.unwrap_or(args.workload.default_keys());
    let warmup_events = match (args.workload, args.warmup) {
        (Workload::W3, Some(n)) if n > 0 => {
            eprintln!("eventcost: w3 takes no --warmup (a cut by op count would split a round)");
            return ExitCode::from(2);
        }
        (Workload::W3, _) => 0,
        (_, warmup) => warmup.unwrap_or(DEFAULT_WARMUP),
    };
    let gen = generate_workload(args.workload, keys, warmup_events + args.events, args.seed);
    let (population, churn) = gen
        .ops
        .split_at(population_len(args.workload, keys, &gen.ops));
    let (warmup, counted) = churn.split_at(warmup_events.min(churn.len()));
    let mut pipeline: Box<dyn Pipeline> = match args.engine {
        Engine::Reference => {
            let store = Arc::new(bench::reference_indexer());
            let queue = bench::reference_queue(Some(known(&store)));
            Box::new(Reference { queue, store })
        }
        Engine::Sharded => {
            let store = Arc::new(bench::sharded_indexer());
            let queue = bench::sharded_queue(Some(known(&store)), args.shards);
            Box::new(Sharded {
                queue,
                store,
                pop_batch: args.pop_batch,
            })
        }
        Engine::Floor => Box::new(Floor {
            queue: FloorQueue::new(bench::pod_key_fn()),
            store: bench::floor_indexer(),
        }),
    };
    let started = Instant::now();
    population_phase(&mut *pipeline, population, step);
    let population = Phase::new(started, events_in(population));
    if args.callgrind_control {
        if let Err(e) = instrumentation_on() {
            eprintln!("eventcost: {e}");
            return ExitCode::FAILURE;
        }
    }
    let started = Instant::now();
    warmup_phase(&mut *pipeline, warmup, step);
    let warmup = Phase::new(started, events_in(warmup));
    let started = Instant::now();
    churn_phase(&mut *pipeline, counted, step);
    let churn = Phase::new(started, events_in(counted));
    // The whole run, population included, is what loadgen's events/s divide.
    let whole = Phase {
        ns: population.ns + warmup.ns + churn.ns,
        events: population.events + warmup.events + churn.events,
    };
    let engine = args
        .engine
        .to_possible_value()
        .map(|v| v.get_name().to_owned());
    print!(
        "{} {} keys={keys} step={step} population {}, warmup {}, churn {} events {}, whole run {}",
        engine.unwrap_or_default(),
        args.workload,
        population.per_event(),
        warmup.per_event(),
        churn.events,
        churn.per_event(),
        whole.per_event(),
    );
    if args.engine == Engine::Floor {
        let cores = args
            .cores
            .map(usize::from)
            .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
            .unwrap_or(1);
        print!(
            "; ceiling on {cores} cores: churn {:.0} events/s, whole run {:.0} events/s",
            ceiling(churn.ns_per_event(), cores),
            ceiling(whole.ns_per_event(), cores)
        );
    }
    println!();
    // Every op was drained into the store: it must hold exactly the model's alive keys, each
    // at the model's version.
    let pipeline = black_box(pipeline);
    let wrong = gen
        .universe
        .keys
        .iter()
        .zip(&gen.model.alive)
        .find(|(key, want)| pipeline.version_of(key) != want.as_ref().map(|pod| pod.version));
    if let Some((key, want)) = wrong {
        eprintln!(
            "eventcost: the store holds {key} at {:?}, the model at {:?}",
            pipeline.version_of(key),
            want.as_ref().map(|pod| pod.version)
        );
        return ExitCode::FAILURE;
    }
    if pipeline.stored() != gen.model.alive_count() {
        eprintln!("eventcost: the store does not hold the model's keys");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The most events per second `cores` cores can absorb when one event's least work takes
/// `floor_ns` nanoseconds of one core (see the module docs).
fn ceiling(floor_ns: f64, cores: usize) -> f64 {
    if floor_ns <= 0.0 {
        return f64::INFINITY;
    }
    cores as f64 * 1e9 / floor_ns
}
