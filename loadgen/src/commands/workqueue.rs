//! `loadgen workqueue`: the workqueue round trip ([`wq_round_trip`](crate::pipelines::wq_round_trip)) for
//! each queue and worker count, repeated, with the median and the workers' context switches,
//! and the sharded ÷ reference ratios of the same run.

use std::process::ExitCode;

use crate::pipelines::wq_round_trip::{keys, round_trip, QueueKind, RoundTrip};

/// Arguments of `loadgen workqueue`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkqueueArgs {
    /// Which queues (comma-separated); default all four.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub queue: Vec<QueueKind>,
    /// Worker counts (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 4, 16])]
    pub workers: Vec<usize>,
    /// Keys added per round trip.
    #[arg(long, default_value_t = 100_000)]
    pub keys: usize,
    /// Shards of the sharded queues (rounded up to a power of two).
    #[arg(long, default_value_t = 16)]
    pub shards: usize,
    /// Round trips per queue and worker count; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
}

fn median(mut trips: Vec<RoundTrip>) -> RoundTrip {
    trips.sort_by(|a, b| a.keys_per_sec.total_cmp(&b.keys_per_sec));
    trips[trips.len() / 2]
}

fn count(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// Runs `loadgen workqueue`.
pub fn main(args: WorkqueueArgs) -> ExitCode {
    if args.keys == 0 || args.repeat == 0 || args.workers.contains(&0) {
        eprintln!("loadgen workqueue: --keys, --repeat and every --workers must be at least 1");
        return ExitCode::from(2);
    }
    let queues = if args.queue.is_empty() {
        QueueKind::ALL.to_vec()
    } else {
        args.queue.clone()
    };
    let keys = keys(args.keys);
    println!(
        "workqueue round trip: {} keys, {} shards, median of {}, no work per key",
        args.keys, args.shards, args.repeat
    );
    println!(
        "{:<20} {:>7} {:>14} {:>12} {:>12}",
        "queue", "workers", "keys/s", "vol. cs", "invol. cs"
    );
    for &workers in &args.workers {
        let mut results = Vec::new();
        for &kind in &queues {
            let trips = (0..args.repeat)
                .map(|_| round_trip(kind, args.shards, workers, &keys))
                .collect();
            let trip = median(trips);
            println!(
                "{:<20} {:>7} {:>14.0} {:>12} {:>12}",
                kind.name(),
                workers,
                trip.keys_per_sec,
                count(trip.voluntary_switches),
                count(trip.involuntary_switches)
            );
            results.push((kind, trip));
        }
        let rate = |kind| {
            results
                .iter()
                .find(|(k, _)| *k == kind)
                .map(|(_, t)| t.keys_per_sec)
        };
        for (sharded, reference) in [
            (QueueKind::Sharded, QueueKind::Reference),
            (QueueKind::PrioritySharded, QueueKind::PriorityReference),
        ] {
            if let (Some(s), Some(r)) = (rate(sharded), rate(reference)) {
                println!(
                    "  {} / {} at {workers} workers: {:.2}x",
                    sharded.name(),
                    reference.name(),
                    s / r
                );
            }
        }
    }
    ExitCode::SUCCESS
}
