//! Stress: 8 workers and several producers on random keys, on threads and on tokio tasks.
//!
//! Checks, for the reference port and the sharded queue with 1, 2 and 16 shards:
//! - **exclusivity**: no key is handed to two workers at once;
//! - **nothing lost**: every key added after its last `get` is handed out again (each `get`
//!   records how many adds of its key had started; after the queue is drained, the last `get`
//!   of every key must have seen all of them);
//! - **shutdown with drain** completes, with every worker done.
//!
//! Sizes scale with `KCACHE_STRESS_SCALE` (default 1, CI-sized). The harness is shared with
//! `workqueue_priority_stress` (`common/workqueue_stress.rs`).

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::workqueue_stress::{
    spawn_producers, spawn_thread_workers, threads_never_share_a_key,
    tokio_tasks_never_share_a_key, Book, Stressed,
};
use common::{join_all, stress_scale as scale};
use kcache::workqueue::{ReferenceQueue, ShardedQueue, WorkQueue};
use kcache::Key;

impl Stressed for dyn WorkQueue {
    fn add_drawn(&self, _: &mut fastrand::Rng, key: Key) {
        self.add(key);
    }

    fn idle(&self) -> bool {
        self.is_empty() && self.processing_len() == 0
    }

    fn backlog(&self) -> String {
        format!(
            "{} queued, {} processing",
            self.len(),
            self.processing_len()
        )
    }
}

fn queues() -> Vec<(&'static str, Arc<dyn WorkQueue>)> {
    common::workqueue_stress::queues(Arc::new(ReferenceQueue::new()), |shards| {
        Arc::new(ShardedQueue::new(shards))
    })
}

#[test]
fn threads_never_share_a_key_lose_nothing_and_drain_on_shutdown() {
    threads_never_share_a_key(queues(), 60_000 * scale());
}

/// Shutdown while producers still add: the drain completes, workers exit, and every key whose
/// adds were accepted before the shutdown (the queue refuses the rest) was handed out.
#[test]
fn shutdown_with_drain_completes_under_load() {
    for (name, q) in queues() {
        let book = Arc::new(Book::default());
        let workers = spawn_thread_workers(&q, &book);
        let producers = spawn_producers(&q, &book, 11, 5_000 * scale());
        // Shut down once the workers are at it, while the producers still add.
        let deadline = Instant::now() + Duration::from_secs(30);
        while book.gets.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "{name}: no worker got an item");
            thread::yield_now();
        }
        q.shut_down_with_drain();
        join_all(workers);
        join_all(producers);
        assert!(
            q.is_empty(),
            "{name}: workers exit only once nothing is queued"
        );
    }
}

#[test]
fn tokio_tasks_never_share_a_key_and_lose_nothing() {
    tokio_tasks_never_share_a_key(queues(), 60_000 * scale());
}
