//! Loom models of kcache's own synchronisation: the shard-token hand-off and consumer wake-ups,
//! per-key exclusivity with parking, and close. Loom runs every interleaving (up to a
//! preemption bound) of the std primitives that `engine/src/sync.rs` swaps for loom's.
//!
//! Run with:
//! `RUSTFLAGS="--cfg kcache_loom" cargo test -p kcache --release --test loom`
#![cfg(kcache_loom)]

use std::sync::Arc;

use kcache::sharded::DeltaFifo;
use kcache::{DeltaQueue, Key, KeyError, QueueOptions, TryPop};
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

#[derive(Debug)]
struct Obj {
    key: &'static str,
    v: u64,
}

fn fifo(shards: usize) -> Arc<DeltaFifo<Obj>> {
    let key_fn = Arc::new(|o: &Obj| -> Result<Key, KeyError> { Ok(Key::new(o.key)) });
    Arc::new(DeltaFifo::new(QueueOptions::new(key_fn), shards))
}

fn obj(key: &'static str, v: u64) -> Arc<Obj> {
    Arc::new(Obj { key, v })
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    builder.check(f);
}

/// A consumer blocked in `pop` is woken by a producer's add: no lost wake-up in any
/// interleaving (loom reports a deadlock if one exists).
#[test]
fn blocked_pop_is_woken_by_add() {
    model(|| {
        let q = fifo(2);
        let consumer = {
            let q = Arc::clone(&q);
            thread::spawn(move || {
                q.pop(|d, _| d.newest().and_then(|d| d.object.object().map(|o| o.v)))
            })
        };
        q.add(obj("a", 1)).unwrap();
        assert_eq!(consumer.join().unwrap(), Ok(Some(1)));
    });
}

/// Close wakes a consumer blocked on an empty queue.
#[test]
fn close_wakes_blocked_pop() {
    model(|| {
        let q = fifo(1);
        let consumer = {
            let q = Arc::clone(&q);
            thread::spawn(move || q.pop(|_, _| ()))
        };
        q.close();
        assert_eq!(consumer.join().unwrap(), Err(kcache::Closed));
    });
}

/// Two consumers and a producer on one key: the key is never processed by both at once, and
/// every delta comes out exactly once, in order.
#[test]
fn one_key_is_never_processed_twice_at_once() {
    model(|| {
        let q = fifo(1);
        let busy = Arc::new(AtomicBool::new(false));
        let delivered = Arc::new(AtomicUsize::new(0));
        let last_version = Arc::new(AtomicUsize::new(0));
        q.add(obj("k", 1)).unwrap();
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                let (q, busy, delivered, last) = (
                    Arc::clone(&q),
                    Arc::clone(&busy),
                    Arc::clone(&delivered),
                    Arc::clone(&last_version),
                );
                thread::spawn(move || {
                    while let TryPop::Popped(()) = q.try_pop(|d, _| {
                        assert!(
                            !busy.swap(true, Ordering::SeqCst),
                            "key handed to two consumers"
                        );
                        for delta in &d {
                            let v = delta.object.object().unwrap().v as usize;
                            assert!(last.swap(v, Ordering::SeqCst) < v, "order broken");
                            delivered.fetch_add(1, Ordering::SeqCst);
                        }
                        busy.store(false, Ordering::SeqCst);
                    }) {}
                })
            })
            .collect();
        q.update(obj("k", 2)).unwrap();
        for c in consumers {
            c.join().unwrap();
        }
        // Whatever the consumers left (they may have found the queue empty) is still queued.
        while let TryPop::Popped(n) = q.try_pop(|d, _| d.len()) {
            delivered.fetch_add(n, Ordering::SeqCst);
        }
        assert_eq!(delivered.load(Ordering::SeqCst), 2);
    });
}

/// Keys of two shards queued by two producers reach a blocking consumer: shard tokens are
/// handed over without loss whatever the interleaving.
#[test]
fn tokens_of_two_shards_are_never_lost() {
    model(|| {
        let q = fifo(2);
        // "a" and "c" land in different shards of 2 (checked below), so both shards get a token.
        assert_ne!(
            Key::new("a").hash_value() >> 32 & 1,
            Key::new("c").hash_value() >> 32 & 1
        );
        let producers: Vec<_> = ["a", "c"]
            .into_iter()
            .map(|k| {
                let q = Arc::clone(&q);
                thread::spawn(move || q.add(obj(k, 1)).unwrap())
            })
            .collect();
        let mut seen = Vec::new();
        for _ in 0..2 {
            seen.push(q.pop(|d, _| d.key().to_string()).unwrap());
        }
        for p in producers {
            p.join().unwrap();
        }
        seen.sort();
        assert_eq!(seen, ["a", "c"]);
    });
}
