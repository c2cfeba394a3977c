//! The workqueue round trip: one producer adds keys as fast as it can while `N` workers `get`
//! and `done` them with no work per key, through any of kcache's work queues — the hand-off
//! cost alone, which is what the sharded queues must win on (`loadgen workqueue`).
//!
//! Besides the wall time, each worker reads its own context-switch counts from
//! `/proc/thread-self/status` as it exits (Linux; elsewhere they are absent), so a run also
//! shows how often workers went to sleep: a count, not a timing, and meaningful on a busy
//! machine.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kcache::workqueue::priority::{ReferencePriorityQueue, ShardedPriorityQueue};
use kcache::workqueue::{ReferenceQueue, ShardedQueue, WorkQueue};
use kcache::Key;

/// The work queues a round trip can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QueueKind {
    /// client-go's queue, ported (`ReferenceQueue`).
    Reference,
    /// `ShardedQueue` (`--shards`).
    Sharded,
    /// controller-runtime's priority queue, ported (`ReferencePriorityQueue`).
    PriorityReference,
    /// `ShardedPriorityQueue` (`--shards`).
    PrioritySharded,
}

impl QueueKind {
    /// Every kind, in report order.
    pub const ALL: [QueueKind; 4] = [
        QueueKind::Reference,
        QueueKind::Sharded,
        QueueKind::PriorityReference,
        QueueKind::PrioritySharded,
    ];

    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            QueueKind::Reference => "reference",
            QueueKind::Sharded => "sharded",
            QueueKind::PriorityReference => "priority-reference",
            QueueKind::PrioritySharded => "priority-sharded",
        }
    }

    fn build(self, shards: usize) -> Arc<dyn WorkQueue> {
        match self {
            QueueKind::Reference => Arc::new(ReferenceQueue::new()),
            QueueKind::Sharded => Arc::new(ShardedQueue::new(shards)),
            QueueKind::PriorityReference => Arc::new(ReferencePriorityQueue::new()),
            QueueKind::PrioritySharded => Arc::new(ShardedPriorityQueue::new(shards)),
        }
    }
}

/// What one round trip measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundTrip {
    /// From the first `add` to the last `done`.
    pub elapsed: Duration,
    /// Keys per second over `elapsed`.
    pub keys_per_sec: f64,
    /// The workers' voluntary context switches (sleeps), summed; `None` off Linux.
    pub voluntary_switches: Option<u64>,
    /// The workers' involuntary context switches (preemptions), summed.
    pub involuntary_switches: Option<u64>,
}

/// This thread's (voluntary, involuntary) context switches so far, from procfs.
fn thread_switches() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/thread-self/status").ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some((
        field("voluntary_ctxt_switches:")?,
        field("nonvoluntary_ctxt_switches:")?,
    ))
}

/// Runs one round trip of `keys` through a fresh `kind` queue with `workers` workers.
pub fn round_trip(kind: QueueKind, shards: usize, workers: usize, keys: &[Key]) -> RoundTrip {
    let q = kind.build(shards);
    let done = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let (q, done) = (Arc::clone(&q), Arc::clone(&done));
            std::thread::spawn(move || {
                let before = thread_switches();
                while let Ok(key) = q.get() {
                    std::hint::black_box(&key);
                    // The key was handed out by this queue's `get`: `done` cannot refuse it.
                    let _ = q.done(&key);
                    done.fetch_add(1, Ordering::Relaxed);
                }
                let after = thread_switches();
                before.zip(after).map(|(b, a)| (a.0 - b.0, a.1 - b.1))
            })
        })
        .collect();
    let start = Instant::now();
    for key in keys {
        q.add(key.clone());
    }
    while done.load(Ordering::Relaxed) < keys.len() {
        std::thread::yield_now();
    }
    let elapsed = start.elapsed();
    q.shut_down();
    let mut switches = Some((0, 0));
    for t in threads {
        let counted = t.join().unwrap_or(None);
        switches = switches
            .zip(counted)
            .map(|(s, c): ((u64, u64), (u64, u64))| (s.0 + c.0, s.1 + c.1));
    }
    RoundTrip {
        elapsed,
        keys_per_sec: keys.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        voluntary_switches: switches.map(|s| s.0),
        involuntary_switches: switches.map(|s| s.1),
    }
}

/// `n` distinct keys shaped like pods' (`ns-K/pod-N`).
pub fn keys(n: usize) -> Vec<Key> {
    (0..n)
        .map(|i| Key::new(&format!("ns-{}/pod-{i}", i % 1000)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_queue_hands_every_key_to_the_workers() {
        let keys = keys(2_000);
        for kind in QueueKind::ALL {
            for workers in [1, 4] {
                let trip = round_trip(kind, 16, workers, &keys);
                assert!(trip.keys_per_sec > 0.0, "{}", kind.name());
                if cfg!(target_os = "linux") {
                    assert!(trip.voluntary_switches.is_some(), "{}", kind.name());
                }
            }
        }
    }
}
