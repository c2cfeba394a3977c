//! Loom model of the informer's hand-off from the consumers to a handler registration
//! (`engine/src/informer/handoff.rs`): a bounded buffer of batches with a sender that waits for
//! room and a receiver that waits for data. Loom runs every interleaving (up to a preemption
//! bound) and reports a deadlock if a wake-up can be lost.
//!
//! Run with:
//! `RUSTFLAGS="--cfg kcache_loom" cargo test -p kcache --release --test loom_fanout`
#![cfg(kcache_loom)]

mod loom_common;

use std::sync::Arc;

use kcache::informer::{Handoff, HandoffClosed};
use loom_common::{model, spawn_with};

/// Receives until the hand-off ends, releasing each batch's room as it goes.
fn drain(handoff: &Handoff<u32>) -> Vec<u32> {
    let mut got = Vec::new();
    while let Some(batches) = handoff.recv() {
        for batch in batches {
            let n = batch.len();
            got.extend(batch);
            handoff.delivered(n);
        }
    }
    got
}

/// A receiver waiting for data is woken by a send.
#[test]
fn a_waiting_receiver_is_woken_by_a_send() {
    model(|| {
        let handoff = Arc::new(Handoff::for_thread(4));
        let receiver = spawn_with(&handoff, move |handoff| {
            handoff.recv().map(|b| b.into_iter().flatten().collect())
        });
        handoff.send(vec![1, 2], |_| {}).unwrap();
        let got: Option<Vec<u32>> = receiver.join().unwrap();
        assert_eq!(got, Some(vec![1, 2]));
    });
}

/// A sender waiting for room is woken when the receiver delivers; a batch larger than the
/// room goes in parts, in order, never over the bound; the full buffer is reported once.
#[test]
fn a_sender_waiting_for_room_is_woken_by_delivery() {
    model(|| {
        let handoff = Arc::new(Handoff::for_thread(1));
        let sender = spawn_with(&handoff, move |handoff| {
            let mut reports = 0;
            let sent = handoff.send(vec![1, 2, 3], |pending| {
                assert_eq!(pending, 1);
                reports += 1;
            });
            handoff.close();
            (sent, reports)
        });
        let got = drain(&handoff);
        let (sent, reports) = sender.join().unwrap();
        assert_eq!(sent, Ok(()));
        assert_eq!(got, [1, 2, 3]);
        assert!(reports <= 2, "at most once per episode: {reports}");
        assert!(handoff.counters().peak() <= 1);
        assert_eq!(handoff.counters().pending(), 0);
    });
}

/// Close wakes a sender waiting for room (its rest is refused) and lets the receiver drain
/// what was queued, then end.
#[test]
fn close_wakes_a_blocked_sender_and_the_receiver() {
    model(|| {
        let handoff = Arc::new(Handoff::for_thread(1));
        let sender = spawn_with(&handoff, move |handoff| handoff.send(vec![1, 2], |_| {}));
        let receiver = spawn_with(&handoff, move |handoff| drain(&handoff));
        handoff.close();
        let sent = sender.join().unwrap();
        let got = receiver.join().unwrap();
        // Whatever was queued before the close is delivered, in order.
        assert!(
            [&[][..], &[1], &[1, 2]].contains(&got.as_slice()),
            "{got:?}"
        );
        if sent.is_ok() {
            assert_eq!(got, [1, 2]);
        }
    });
}

/// Remove wakes a sender waiting for room and a receiver waiting for data; both end.
#[test]
fn remove_wakes_a_blocked_sender_and_a_waiting_receiver() {
    model(|| {
        let handoff = Arc::new(Handoff::for_thread(1));
        // Fill the buffer so the sender's next batch must wait.
        handoff.send(vec![1], |_| {}).unwrap();
        let sender = spawn_with(&handoff, move |handoff| handoff.send(vec![2], |_| {}));
        handoff.remove();
        assert_eq!(sender.join().unwrap(), Err(HandoffClosed));
        // A receiver after removal ends at once, with nothing.
        assert!(handoff.recv().is_none());
    });
}

/// Remove wakes a receiver waiting for data.
#[test]
fn remove_wakes_a_waiting_receiver() {
    model(|| {
        let handoff = Arc::new(Handoff::<u32>::for_thread(2));
        let receiver = spawn_with(&handoff, move |handoff| drain(&handoff));
        handoff.remove();
        assert!(receiver.join().unwrap().is_empty());
    });
}
