//! The memory benchmark's driver: one generated workload through one engine's queue and
//! indexer, with one producer and one consumer, measured by a [`CountingAlloc`].
//!
//! # What is measured
//!
//! The workload is generated first (the workloads crate's [`generate`]: every object, key and op), then the
//! allocator's peak is reset: the **baseline** is everything the generator holds. The run then
//! builds the engine (queue with the indexer as its known objects), starts the consumer, and
//! the producer performs every op, handing the queue clones of the generated `Arc`s (a
//! reference-count bump, no allocation), then closes the queue and waits for the drain.
//!
//! - **peak above baseline**: the highest number of bytes allocated at once during the run,
//!   minus the baseline. The objects themselves are in the baseline (the generator keeps them),
//!   so this is what the engine adds: queue entries, delta lists, the indexer's maps and index
//!   sets, and the backlog the consumer has not caught up with. A relist's list is a fresh
//!   `Vec` of `Arc`s (8 bytes per object), as a real informer's would be.
//! - **retained**: bytes still allocated after the drain, above the baseline, while the engine
//!   is alive: the steady-state footprint of the indexer.
//! - **allocations**: how many allocations the run made.
//! - **footprints**: what the queue and the store hold structure by structure (their
//!   [`Footprint`]s, computed from capacities), when the producer has issued its last op (the
//!   backlog) and after the drain (at rest). Their totals should come close to the counted
//!   bytes; what they do not cover is the allocator's view of everything else (threads, the
//!   store's retired objects waiting for their epoch).
//!
//! # How each engine is driven
//!
//! As loadgen drives them, with one consumer each: the reference consumer loops `pop` and
//! [`process_deltas`] (client-go's controller); the sharded consumer loops
//! `pop_batch(`[`BATCH`]`)` and [`apply_deltas_coalesced`].

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use kcache::{
    apply_deltas_coalesced, process_deltas, DeltaQueue, Footprint, Indexer, KnownObjects,
    NoopHandler, Store,
};
use workloads::{generate, Generated, Op, Workload, WorkloadSpec};

use crate::alloc::CountingAlloc;
use crate::{Pod, BATCH};

/// Which engine a memory run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// `kcache::reference`.
    Reference,
    /// `kcache::sharded`, with the shard count passed to [`measure`].
    Sharded,
}

impl Engine {
    /// Both engines, reference first.
    pub const ALL: [Engine; 2] = [Engine::Reference, Engine::Sharded];

    /// `reference` or `sharded`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Reference => "reference",
            Engine::Sharded => "sharded",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An engine name that is neither `reference` nor `sharded`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown engine {0:?}: expected reference or sharded")]
pub struct UnknownEngine(pub String);

impl FromStr for Engine {
    type Err = UnknownEngine;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Engine::ALL
            .into_iter()
            .find(|e| e.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownEngine(s.to_string()))
    }
}

/// The outcome of one memory run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemReport {
    /// Which engine.
    pub engine: Engine,
    /// Shards of the sharded engine (1 for the reference).
    pub shards: usize,
    /// `w1` or `w3`.
    pub workload: String,
    /// Key count.
    pub keys: usize,
    /// Churn events after the initial population.
    pub events: usize,
    /// Objects handed to the queue (adds, updates, deletes and every relisted object).
    pub objects: u64,
    /// Bytes allocated after generation: what the run is measured against.
    pub baseline_bytes: usize,
    /// Highest bytes allocated at once during the run, minus the baseline.
    pub peak_bytes_above_baseline: usize,
    /// Bytes allocated after the drain with the engine still alive, minus the baseline.
    pub retained_bytes_above_baseline: isize,
    /// Allocations made during the run.
    pub allocations: u64,
    /// Bytes requested during the run, over all allocations.
    pub allocated_bytes: u64,
    /// Wall time of the run (it runs under the counting allocator: a rough figure only).
    pub wall_ms: u64,
    /// Objects stored after the drain.
    pub stored: usize,
    /// Whether the store ended exactly as the generator's model (every key, every version).
    pub store_matches_model: bool,
    /// Queue and store, structure by structure, when the producer had issued its last op.
    pub backlog: Vec<PartReport>,
    /// Queue and store, structure by structure, after the drain.
    pub at_rest: Vec<PartReport>,
}

/// One structure of a [`Footprint`], with its bytes per key of the workload.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PartReport {
    /// The structure (see the engines' `footprint` methods).
    pub name: String,
    /// Entries it held.
    pub entries: usize,
    /// Heap bytes it held.
    pub bytes: usize,
    /// `bytes` divided by the workload's key count.
    pub bytes_per_key: f64,
}

fn parts(footprint: &Footprint, keys: usize) -> Vec<PartReport> {
    footprint
        .parts
        .iter()
        .map(|part| PartReport {
            name: part.name.clone(),
            entries: part.entries,
            bytes: part.bytes,
            bytes_per_key: part.bytes as f64 / keys.max(1) as f64,
        })
        .collect()
}

/// Generates `workload` at `keys` keys and `events` churn events from `seed` (before any
/// measurement).
///
/// ```
/// use workloads::Workload;
/// let gen = bench::mem::generate_workload(Workload::W1, 10, 100, 42);
/// assert_eq!(gen.ops.len(), 110);
/// ```
pub fn generate_workload(workload: Workload, keys: usize, events: usize, seed: u64) -> Generated {
    generate(
        &WorkloadSpec::new(workload)
            .keys(keys)
            .events(events)
            .seed(seed),
    )
}

/// Runs `gen` through `engine` (`shards` shards for the sharded engine) with one producer and
/// one consumer, measured by `alloc`, and checks the final store against the model.
///
/// `alloc` must be the process's global allocator for the figures to mean anything; any other
/// `CountingAlloc` reports zeros.
///
/// ```
/// use bench::{alloc::CountingAlloc, mem::{measure, generate_workload, Engine}};
/// use workloads::Workload;
/// let gen = generate_workload(Workload::W3, 50, 200, 42);
/// let report = measure(Engine::Sharded, 4, &gen, &CountingAlloc::new());
/// assert!(report.store_matches_model);
/// ```
pub fn measure(engine: Engine, shards: usize, gen: &Generated, alloc: &CountingAlloc) -> MemReport {
    let before = alloc.reset_peak();
    let started = Instant::now();
    let keys = gen.universe.keys.len();
    let (store, stats, backlog, at_rest): (Arc<dyn Indexer<Pod>>, _, _, _) = match engine {
        Engine::Reference => {
            let store = Arc::new(crate::reference_indexer());
            let queue = crate::reference_queue(Some(known(&store)));
            let footprint = || queue.footprint().merged(store.footprint());
            let backlog = run(&queue, &store, gen, footprint, |q, s| {
                while q
                    .pop(|deltas, initial| process_deltas(&**s, &mut NoopHandler, &deltas, initial))
                    .is_ok()
                {}
            });
            let stats = alloc.stats();
            let at_rest = footprint();
            (store, stats, backlog, at_rest)
        }
        Engine::Sharded => {
            let store = Arc::new(crate::sharded_indexer());
            let queue = crate::sharded_queue(Some(known(&store)), shards);
            let footprint = || queue.footprint().merged(store.footprint());
            let backlog = run(&queue, &store, gen, footprint, |q, s| {
                while q
                    .pop_batch(BATCH, |deltas, initial| {
                        apply_deltas_coalesced(&**s, &mut NoopHandler, &deltas, initial);
                    })
                    .is_ok()
                {}
            });
            let stats = alloc.stats();
            let at_rest = footprint();
            (store, stats, backlog, at_rest)
        }
    };
    let wall = started.elapsed();
    let store_matches_model = matches_model(&*store, gen);
    MemReport {
        engine,
        shards: match engine {
            Engine::Reference => 1,
            Engine::Sharded => shards,
        },
        workload: gen.label.split(' ').next().unwrap_or_default().to_string(),
        keys,
        events: churn_events(gen),
        objects: gen.event_count(),
        baseline_bytes: before.current,
        peak_bytes_above_baseline: stats.peak.saturating_sub(before.current),
        retained_bytes_above_baseline: signed_diff(stats.current, before.current),
        allocations: stats.allocations - before.allocations,
        allocated_bytes: stats.allocated_bytes - before.allocated_bytes,
        wall_ms: u64::try_from(wall.as_millis()).unwrap_or(u64::MAX),
        stored: store.len(),
        store_matches_model,
        backlog: parts(&backlog, keys),
        at_rest: parts(&at_rest, keys),
    }
}

fn known<S: KnownObjects<Pod> + 'static>(store: &Arc<S>) -> Arc<dyn KnownObjects<Pod>> {
    Arc::clone(store) as Arc<dyn KnownObjects<Pod>>
}

fn signed_diff(a: usize, b: usize) -> isize {
    if a >= b {
        isize::try_from(a - b).unwrap_or(isize::MAX)
    } else {
        isize::try_from(b - a).map_or(isize::MIN, |d| -d)
    }
}

/// The churn events of a generated workload: every add/update/delete op that is not part of
/// the initial population (W1: the first `keys` adds; W3: none, it starts with a relist).
fn churn_events(gen: &Generated) -> usize {
    let single = gen
        .ops
        .iter()
        .filter(|op| matches!(op, Op::Add(_) | Op::Update(_) | Op::Delete(_)))
        .count();
    let starts_with_relist = matches!(gen.ops.first(), Some(Op::Replace(_)));
    if starts_with_relist {
        single
    } else {
        single.saturating_sub(gen.universe.keys.len())
    }
}

/// One producer (this thread) and one consumer (`consume`, on its own thread); returns the
/// `footprint` taken once the producer has issued its last op, before the drain.
fn run<Q, S>(
    queue: &Q,
    store: &Arc<S>,
    gen: &Generated,
    footprint: impl FnOnce() -> Footprint,
    consume: impl FnOnce(&Q, &Arc<S>) + Send,
) -> Footprint
where
    Q: DeltaQueue<Pod>,
    S: Store<Pod> + Send + Sync,
{
    thread::scope(|scope| {
        scope.spawn(|| consume(queue, store));
        for op in &gen.ops {
            // The generator only makes objects that have keys: these cannot fail.
            let done = op.perform_on(queue);
            debug_assert!(done.is_ok(), "generated op refused: {done:?}");
        }
        let backlog = footprint();
        queue.close();
        backlog
    })
}

/// Whether `store` holds exactly the model's alive keys, each at the model's version.
fn matches_model(store: &dyn Indexer<Pod>, gen: &Generated) -> bool {
    store.len() == gen.model.alive_count()
        && gen.model.alive.iter().enumerate().all(|(id, want)| {
            let got = store.get_by_key(&gen.universe.keys[id]);
            match (want, got) {
                (None, None) => true,
                (Some(want), Some(got)) => want.version == got.version,
                _ => false,
            }
        })
}

/// Formats `bytes` as mebibytes with one decimal.
///
/// ```
/// assert_eq!(bench::mem::mib(3 * 1024 * 1024 / 2), "1.5 MiB");
/// ```
pub fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

fn signed_mib(bytes: isize) -> String {
    let sign = if bytes < 0 { "-" } else { "" };
    format!("{sign}{}", mib(bytes.unsigned_abs()))
}

/// The reports as a plain-text table, one row per run.
pub fn table(reports: &[MemReport]) -> String {
    let mut out = format!(
        "{:<10} {:>6} {:<4} {:>8} {:>9} {:>12} {:>14} {:>14} {:>12} {:>8} {:>6}\n",
        "engine",
        "shards",
        "wl",
        "keys",
        "events",
        "baseline",
        "peak above",
        "retained",
        "allocations",
        "wall ms",
        "model"
    );
    for r in reports {
        out.push_str(&format!(
            "{:<10} {:>6} {:<4} {:>8} {:>9} {:>12} {:>14} {:>14} {:>12} {:>8} {:>6}\n",
            r.engine.name(),
            r.shards,
            r.workload,
            r.keys,
            r.events,
            mib(r.baseline_bytes),
            mib(r.peak_bytes_above_baseline),
            signed_mib(r.retained_bytes_above_baseline),
            r.allocations,
            r.wall_ms,
            if r.store_matches_model { "ok" } else { "WRONG" },
        ));
    }
    out
}

/// Each run's footprints as a plain-text table: one row per structure, bytes per key in the
/// backlog (the producer done, before the drain) and at rest (after it), with the totals and,
/// beside them, what the allocator counted (peak and retained above the baseline, per key).
pub fn breakdown(reports: &[MemReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let per_key = |bytes: f64| bytes / r.keys.max(1) as f64;
        out += &format!(
            "{} {} ({} keys): B/key in the backlog and at rest\n",
            r.engine, r.workload, r.keys
        );
        for (backlog, rest) in r.backlog.iter().zip(&r.at_rest) {
            out += &format!(
                "  {:<24} {:>12} entries {:>9.1} {:>12} entries {:>9.1}\n",
                rest.name, backlog.entries, backlog.bytes_per_key, rest.entries, rest.bytes_per_key
            );
        }
        let total = |parts: &[PartReport]| parts.iter().map(|p| p.bytes_per_key).sum::<f64>();
        out += &format!(
            "  {:<24} {:>12}         {:>9.1} {:>12}         {:>9.1}\n",
            "total",
            "",
            total(&r.backlog),
            "",
            total(&r.at_rest)
        );
        out += &format!(
            "  {:<24} {:>12}         {:>9.1} {:>12}         {:>9.1}\n",
            "allocator (peak, retained)",
            "",
            per_key(r.peak_bytes_above_baseline as f64),
            "",
            per_key(r.retained_bytes_above_baseline as f64)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_engines_drain_w1_and_w3_into_the_model_state() {
        let alloc = CountingAlloc::new();
        for (workload, keys) in [(Workload::W1, 300), (Workload::W3, 300)] {
            let gen = generate_workload(workload, keys, 3000, 42);
            for engine in Engine::ALL {
                let report = measure(engine, 16, &gen, &alloc);
                assert!(report.store_matches_model, "{engine} {workload}");
                assert_eq!(report.stored, gen.model.alive_count());
                assert_eq!(report.events, 3000, "{engine} {workload}");
                assert_eq!(report.workload, workload.name());
                // At rest the queue holds no key and the store holds every alive one.
                let entries = |name: &str| {
                    report
                        .at_rest
                        .iter()
                        .find(|p| p.name == name)
                        .map(|p| p.entries)
                };
                assert_eq!(entries("queue.pending"), Some(0), "{engine} {workload}");
                assert_eq!(entries("store.items"), Some(report.stored));
                assert!(breakdown(&[report]).contains("store.items"));
            }
        }
    }

    #[test]
    fn engine_names_round_trip_and_unknown_names_are_errors() {
        for engine in Engine::ALL {
            assert_eq!(engine.name().parse::<Engine>(), Ok(engine));
        }
        assert_eq!(
            "fast".parse::<Engine>(),
            Err(UnknownEngine("fast".to_string()))
        );
    }

    #[test]
    fn a_negative_retained_difference_stays_negative() {
        assert_eq!(signed_diff(10, 4), 6);
        assert_eq!(signed_diff(4, 10), -6);
    }
}
