//! `eventcost`: one engine's work per W1 event, on one thread, for instruction and cache-miss
//! counters (callgrind's cache simulation; `perf stat` where the machine has counters).
//!
//! The W1 events (docs/workloads.md) go through the queue and the indexer as loadgen drives
//! them, but on one thread and in small steps: `--step` ops into the queue, then the queue is
//! drained (`try_pop` until empty, or with `--pop-batch N` the sharded queue's `pop_batch(N)`
//! as loadgen's consumers use it, applying each key to the indexer as loadgen's consumer
//! does: `process_deltas` for the reference, `apply_deltas_coalesced` for the sharded engine).
//! With the default step of 16 a key rarely gathers two deltas, which is the paced regime of a
//! run that keeps up; a large step makes a backlog. Three phases, each its own function so that
//! a profiler can count one alone:
//!
//! 1. `population_phase`: the K initial adds;
//! 2. `warmup_phase`: `--warmup` churn events (caches and tables settle);
//! 3. `churn_phase`: `--events` churn events, the ones to count.
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

use std::hint::black_box;
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::Instant;

use bench::mem::{generate_workload, Engine};
use bench::Pod;
use clap::Parser;
use kcache::{
    apply_deltas_coalesced, process_deltas, DeltaQueue, KnownObjects, NoopHandler, Store,
};
use loadgen::workload::{Op, Workload, DEFAULT_SEED};

/// The same allocator as loadgen's (run it with `MIMALLOC_ALLOW_THP=0`, as loadgen runs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// One engine's cost per W1 event on one thread (see the module docs).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// `reference` or `sharded`.
    #[arg(long)]
    engine: Engine,
    /// Keys K.
    #[arg(long, default_value_t = 100_000)]
    keys: usize,
    /// Churn events counted (the `churn_phase`).
    #[arg(long, default_value_t = 100_000)]
    events: usize,
    /// Churn events run before them, not counted.
    #[arg(long, default_value_t = 20_000)]
    warmup: usize,
    /// Ops queued between two drains.
    #[arg(long, default_value_t = 16)]
    step: usize,
    /// The sharded engine's consumer drains with `pop_batch(N)`, as loadgen's do (each visit
    /// to a shard takes up to N of its keys and runs the prefetch pipeline over them), instead
    /// of one `try_pop` per key. 0: `try_pop`.
    #[arg(long, default_value_t = 0)]
    pop_batch: usize,
    /// Shards of the sharded engine: a power of two from 1 to 65536.
    #[arg(long, default_value_t = kcache::sharded::DEFAULT_SHARDS, value_parser = loadgen::driver::parse_shards)]
    shards: usize,
    /// The workload generator's seed.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// Run `callgrind_control -i on` for this process after the population (for valgrind's
    /// `--instr-atstart=no`).
    #[arg(long)]
    callgrind_control: bool,
}

/// One engine's queue and indexer, driven one step at a time.
trait Pipeline {
    /// Queues `ops`, then drains the queue into the indexer.
    fn step(&self, ops: &[Op]);
    /// Objects in the indexer.
    fn stored(&self) -> usize;
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

fn enqueue(queue: &impl DeltaQueue<Pod>, op: &Op) {
    // The generator only makes objects that have keys, and W1 has no relists.
    let done = match op {
        Op::Add(pod) => queue.add(Arc::clone(pod)),
        Op::Update(pod) => queue.update(Arc::clone(pod)),
        Op::Delete(pod) => queue.delete(Arc::clone(pod)),
        Op::Replace(_) | Op::Resync => Ok(()),
    };
    debug_assert!(done.is_ok(), "generated op refused: {done:?}");
}

impl Pipeline for Reference {
    fn step(&self, ops: &[Op]) {
        ops.iter().for_each(|op| enqueue(&self.queue, op));
        let store = &*self.store;
        while let kcache::TryPop::Popped(()) = self.queue.try_pop(|deltas, initial| {
            process_deltas(store, &mut NoopHandler, &deltas, initial);
        }) {}
    }

    fn stored(&self) -> usize {
        self.store.len()
    }
}

impl Pipeline for Sharded {
    fn step(&self, ops: &[Op]) {
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
        // without waiting.
        while !self.queue.is_empty() {
            if self.queue.pop_batch(self.pop_batch, apply).is_err() {
                return;
            }
        }
    }

    fn stored(&self) -> usize {
        self.store.len()
    }
}

fn known<S: KnownObjects<Pod> + 'static>(store: &Arc<S>) -> Arc<dyn KnownObjects<Pod>> {
    Arc::clone(store) as Arc<dyn KnownObjects<Pod>>
}

#[inline(never)]
fn population_phase(pipeline: &dyn Pipeline, ops: &[Op], step: usize) {
    ops.chunks(step).for_each(|chunk| pipeline.step(chunk));
}

#[inline(never)]
fn warmup_phase(pipeline: &dyn Pipeline, ops: &[Op], step: usize) {
    ops.chunks(step).for_each(|chunk| pipeline.step(chunk));
}

#[inline(never)]
fn churn_phase(pipeline: &dyn Pipeline, ops: &[Op], step: usize) {
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

fn per_event_ns(started: Instant, events: usize) -> f64 {
    started.elapsed().as_nanos() as f64 / events.max(1) as f64
}

fn main() -> ExitCode {
    let args = Args::parse();
    let step = args.step.max(1);
    let gen = generate_workload(
        Workload::W1,
        args.keys,
        args.warmup + args.events,
        args.seed,
    );
    let (population, churn) = gen.ops.split_at(args.keys.min(gen.ops.len()));
    let (warmup, counted) = churn.split_at(args.warmup.min(churn.len()));
    let pipeline: Box<dyn Pipeline> = match args.engine {
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
    };
    let started = Instant::now();
    population_phase(&*pipeline, population, step);
    let population_ns = per_event_ns(started, population.len());
    if args.callgrind_control {
        if let Err(e) = instrumentation_on() {
            eprintln!("eventcost: {e}");
            return ExitCode::FAILURE;
        }
    }
    let started = Instant::now();
    warmup_phase(&*pipeline, warmup, step);
    let warmup_ns = per_event_ns(started, warmup.len());
    let started = Instant::now();
    churn_phase(&*pipeline, counted, step);
    let churn_ns = per_event_ns(started, counted.len());
    println!(
        "{} keys={} step={} population {:.0} ns/event, warmup {:.0} ns/event, churn {} events {:.0} ns/event",
        args.engine,
        args.keys,
        step,
        population_ns,
        warmup_ns,
        counted.len(),
        churn_ns
    );
    // Every op was drained into the store: it must hold exactly the model's alive keys.
    if black_box(&pipeline).stored() != gen.model.alive_count() {
        eprintln!("eventcost: the store does not hold the model's keys");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
