//! Stress: 8 workers and several producers on random keys, random priorities and short real
//! delays, on threads and on tokio tasks.
//!
//! Checks, for the reference priority queue and the sharded one with 1, 2 and 16 shards:
//! - **exclusivity**: no key is handed to two workers at once;
//! - **nothing lost**: every key added after its last `get` is handed out again (each `get`
//!   records how many adds of its key had started; once the queue is idle, the last `get` of
//!   every key must have seen all of them);
//! - **nothing duplicated**: a key is handed out at most once per add (gets ≤ adds);
//! - **shutdown with drain** completes, with every worker done.
//!
//! Sizes scale with `KCACHE_STRESS_SCALE` (default 1, CI-sized). The harness is shared with
//! `workqueue_stress` (`common/workqueue_stress.rs`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::stress_scale as scale;
use common::workqueue_stress::{
    threads_never_share_a_key, tokio_tasks_never_share_a_key, Stressed,
};
use kcache::workqueue::priority::{
    AddOpts, PriorityWorkQueue, ReferencePriorityQueue, ShardedPriorityQueue,
};
use kcache::Key;

impl Stressed for dyn PriorityWorkQueue {
    fn add_drawn(&self, rng: &mut fastrand::Rng, key: Key) {
        let mut opts = AddOpts::new().priority([-100, 0, 5][rng.usize(..3)]);
        if rng.u8(..32) == 0 {
            opts = opts.after(Duration::from_micros(rng.u64(1..500)));
        }
        self.add_with_opts(opts, key);
    }

    /// Nothing waiting, ready or processing. The three counts are read one after another, in
    /// the order an entry moves (waiting, then ready, then processing), so an entry that moves
    /// between two reads is still seen by the later one. Read the other way round, an entry
    /// the clock made ready after the ready count and before the waiting count was missed by
    /// both, and the queue was shut down with it still queued.
    fn idle(&self) -> bool {
        self.waiting_len() == 0 && self.is_empty() && self.processing_len() == 0
    }

    fn backlog(&self) -> String {
        format!(
            "{} ready, {} waiting, {} processing",
            self.len(),
            self.waiting_len(),
            self.processing_len()
        )
    }
}

fn queues() -> Vec<(&'static str, Arc<dyn PriorityWorkQueue>)> {
    common::workqueue_stress::queues(Arc::new(ReferencePriorityQueue::new()), |shards| {
        Arc::new(ShardedPriorityQueue::new(shards))
    })
}

#[test]
fn threads_never_share_a_key_lose_nothing_and_drain_on_shutdown() {
    threads_never_share_a_key(queues(), 40_000 * scale());
}

#[test]
fn tokio_tasks_never_share_a_key_and_lose_nothing() {
    tokio_tasks_never_share_a_key(queues(), 40_000 * scale());
}
