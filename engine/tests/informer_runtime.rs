//! The reflector never blocks the thread of the runtime it runs on: a large relist runs off
//! it, and a full (bounded) queue is awaited, not waited for. Checked on a current-thread
//! runtime, where one blocked call would stop every other task: a ticker task on the same
//! runtime must keep ticking throughout.
#![cfg(feature = "informer")]

mod informer_common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::Duration;

use informer_common::{key_fn, pod, server, Pod};
use kcache::informer::{Reflector, ReflectorOptions, StopSignal};
use kcache::sharded::DeltaFifo;
use kcache::{DeltaQueue, QueueOptions, TransformFn, TryPop};

/// Objects of the relist.
const LISTED: usize = 20_000;
/// Events written once the queue is full.
const LATER: usize = 500;
/// The queue's backlog bound: the relist alone takes it far past this.
const BOUND: usize = 64;

#[test]
fn a_reflector_never_blocks_a_current_thread_runtime() {
    let (done_tx, done_rx) = mpsc::channel();
    let scenario = thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(scenario());
        let _ = done_tx.send(());
    });
    // Not synchronisation: a failure detector. A blocked runtime thread never finishes, and
    // this says why instead of hanging the test run.
    match done_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = scenario.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!(
                "the runtime's only thread has been blocked for a minute: the reflector blocked it"
            )
        }
    }
}

/// Yields to the runtime's other tasks until `done` holds.
async fn until(mut done: impl FnMut() -> bool) {
    while !done() {
        tokio::task::yield_now().await;
    }
}

async fn scenario() {
    let srv = server(100_000);
    srv.write_batch(|w| {
        for i in 0..LISTED {
            w.upsert(pod(&format!("p{i}"), 1)).unwrap();
        }
    });

    // The relist's first object waits in the transformer until the ticker task (on this
    // runtime) has ticked: if `replace` ran on the runtime's thread, the ticker could not
    // tick, and the wait would time out.
    let (gate_tx, gate_rx) = mpsc::sync_channel::<()>(1);
    let gate_rx = Mutex::new(Some(gate_rx));
    let blocked = Arc::new(AtomicBool::new(false));
    let transformer: TransformFn<Pod> = {
        let blocked = Arc::clone(&blocked);
        Arc::new(move |p| {
            let gate = gate_rx.lock().unwrap().take();
            if let Some(gate) = gate {
                if gate.recv_timeout(Duration::from_secs(10)).is_err() {
                    blocked.store(true, Ordering::SeqCst);
                }
            }
            Ok(p)
        })
    };
    let queue = Arc::new(DeltaFifo::new(
        QueueOptions::new(key_fn())
            .max_queued_deltas(BOUND)
            .transformer(transformer),
        4,
    ));

    let ticks = Arc::new(AtomicUsize::new(0));
    let ticker = tokio::spawn({
        let ticks = Arc::clone(&ticks);
        async move {
            let mut gate = Some(gate_tx);
            let mut interval = tokio::time::interval(Duration::from_millis(1));
            loop {
                interval.tick().await;
                if ticks.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                    if let Some(gate) = gate.take() {
                        let _ = gate.send(());
                    }
                }
            }
        }
    });

    let reflector = Reflector::new(srv.clone(), Arc::clone(&queue), ReflectorOptions::default());
    let progress = reflector.handle();
    let stop = StopSignal::new();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move { reflector.run(stop).await }
    });

    // The relist lands (off this thread, while the ticker ticks).
    until(|| progress.last_sync_resource_version() == LISTED.to_string()).await;
    assert!(
        !blocked.load(Ordering::SeqCst),
        "the relist held the runtime's thread: the ticker could not tick"
    );
    assert!(
        !queue.has_room(),
        "the relist took the queue past its bound"
    );

    // Watch events arrive at a full queue: the reflector must await room, and the ticker
    // must go on ticking meanwhile.
    srv.write_batch(|w| {
        for i in 0..LATER {
            w.upsert(pod(&format!("p{i}"), 2)).unwrap();
        }
    });
    let before = ticks.load(Ordering::SeqCst);
    until(|| ticks.load(Ordering::SeqCst) >= before + 5).await;
    assert_eq!(
        progress.last_sync_resource_version(),
        LISTED.to_string(),
        "nothing of the watch was queued while the queue was full"
    );

    // Popping (on this runtime too) makes room; the reflector queues the watch's events.
    let final_version = (LISTED + LATER).to_string();
    let mut deltas = 0;
    loop {
        for _ in 0..BOUND {
            match queue.try_pop(|d, _| d.len()) {
                TryPop::Popped(n) => deltas += n,
                TryPop::Empty | TryPop::Closed => break,
            }
        }
        if progress.last_sync_resource_version() == final_version && queue.is_empty() {
            break;
        }
        tokio::task::yield_now().await;
    }
    assert_eq!(
        deltas,
        LISTED + LATER,
        "every listed object and every event, once"
    );

    stop.stop();
    task.await.unwrap();
    ticker.abort();
}
