//! `relistcost`: what one relist costs each engine, alone, on one thread.
//!
//! W3 (docs/workloads.md) mixes churn, relists and resyncs with a consumer running alongside;
//! this isolates the relist path. A store holding `--keys` pods (the workloads' objects, with
//! their two indexes) is the queue's known objects; then, `--rounds` times:
//!
//! 1. `replace` with every key at a new version except every 100th (a tombstone each), on an
//!    empty queue;
//! 2. `resync` right after, when every listed key is queued (what W3 does: it only keys the
//!    known objects and queues nothing);
//! 3. the queue drained into the store, then `resync` of the idle queue (it queues every known
//!    key: an informer's periodic resync), and drained again.
//!
//! It prints each operation's fastest round in milliseconds (the machine's noise only ever
//! adds). Under `valgrind --tool=callgrind`, the inclusive counts of the engines' `replace` and
//! `resync` divided by the rounds are the instructions per operation. It runs on the system
//! allocator (loadgen uses mimalloc), so its times are not W3's, only comparable with each other.
//!
//! ```sh
//! cargo run --release -p bench --bin relistcost -- --keys 150000 --rounds 5
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use kcache::{
    apply_deltas_coalesced, DeltaQueue, Indexer, KnownObjects, NoopHandler, QueueOptions, TryPop,
};
use workloads::{pod_indexers, pod_key_fn, Pod, Universe, NAMESPACES, NODES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Engine {
    Reference,
    Sharded,
    All,
}

#[derive(Debug, Parser)]
#[command(about = "What one replace and one resync cost each engine, alone, on one thread")]
struct Args {
    /// Which engine(s).
    #[arg(long, value_enum, default_value = "all")]
    engine: Engine,
    /// Keys in the store (W3's default).
    #[arg(long, default_value_t = 150_000)]
    keys: usize,
    /// Rounds; each operation's fastest is reported.
    #[arg(long, default_value_t = 5)]
    rounds: u64,
    /// The sharded queue's shards.
    #[arg(long, default_value_t = 16)]
    shards: usize,
}

/// Every key of `universe` at `version`, except every `skip_every`th key (0: none skipped).
fn pods(universe: &Universe, version: u64, skip_every: usize) -> Vec<Arc<Pod>> {
    (0..universe.keys.len())
        .filter(|i| skip_every == 0 || i % skip_every != 0)
        .map(|i| {
            Arc::new(Pod::new(
                i as u32,
                universe.keys[i].clone(),
                universe.namespaces[i % NAMESPACES].clone(),
                Some(universe.nodes[i % NODES].clone()),
                version,
            ))
        })
        .collect()
}

/// Pops everything into the store, as a consumer must.
fn drain<Q: DeltaQueue<Pod>, S: Indexer<Pod>>(queue: &Q, store: &S) {
    while let TryPop::Popped(()) = queue.try_pop(|deltas, initial| {
        apply_deltas_coalesced(store, &mut NoopHandler, &deltas, initial);
    }) {}
}

/// The fastest time of each operation over the rounds.
#[derive(Debug)]
struct Fastest {
    replace: Duration,
    resync_queued: Duration,
    resync_idle: Duration,
}

fn timed(best: &mut Duration, op: impl FnOnce()) {
    let start = Instant::now();
    op();
    *best = (*best).min(start.elapsed());
}

fn measure<Q, S>(store: Arc<S>, make: impl FnOnce(QueueOptions<Pod>) -> Q, args: &Args) -> Fastest
where
    Q: DeltaQueue<Pod>,
    S: Indexer<Pod> + 'static,
{
    let universe = Universe::synthetic(args.keys);
    for pod in pods(&universe, 1, 0) {
        store.add(pod).expect("pods have keys");
    }
    let known: Arc<dyn KnownObjects<Pod>> = store.clone();
    let queue = make(
        QueueOptions::new(pod_key_fn())
            .known_objects(known)
            .emit_replaced(true),
    );
    let mut best = Fastest {
        replace: Duration::MAX,
        resync_queued: Duration::MAX,
        resync_idle: Duration::MAX,
    };
    for round in 0..args.rounds {
        let list = pods(&universe, round + 2, 100);
        timed(&mut best.replace, || {
            queue.replace(list, "").expect("pods have keys");
        });
        timed(&mut best.resync_queued, || {
            queue.resync().expect("pods have keys");
        });
        drain(&queue, &*store);
        timed(&mut best.resync_idle, || {
            queue.resync().expect("pods have keys");
        });
        drain(&queue, &*store);
        // The relist's tombstones removed every 100th key: put them back for the next round.
        for pod in pods(&universe, 1, 0) {
            store.add(pod).expect("pods have keys");
        }
    }
    best
}

fn main() {
    let args = Args::parse();
    println!(
        "{} keys, fastest of {} rounds, ms: replace (1% tombstones) | resync, all queued | resync, idle",
        args.keys, args.rounds
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let report = |name: &str, best: Fastest| {
        println!(
            "{name:<10} {:>9.2} {:>9.2} {:>9.2}",
            ms(best.replace),
            ms(best.resync_queued),
            ms(best.resync_idle)
        );
    };
    if matches!(args.engine, Engine::Reference | Engine::All) {
        let store = Arc::new(kcache::reference::IndexedStore::new(
            pod_key_fn(),
            pod_indexers(),
        ));
        report(
            "reference",
            measure(store, kcache::reference::DeltaFifo::new, &args),
        );
    }
    if matches!(args.engine, Engine::Sharded | Engine::All) {
        let store = Arc::new(kcache::sharded::IndexedStore::new(
            pod_key_fn(),
            pod_indexers(),
        ));
        let shards = args.shards;
        report(
            "sharded",
            measure(
                store,
                |opts| kcache::sharded::DeltaFifo::new(opts, shards),
                &args,
            ),
        );
    }
}
