//! The server's contract: the window and its 410s, watches that start at a consistent cut,
//! the fan-out to many watchers (none lost or duplicated), a slow watcher past the window,
//! paging across writes.

use std::time::Duration;

use super::*;

type Server = ApiServer<u32, u32>;

/// `n` events on keys `0..keys` in turn: added the first time, modified after.
fn churn(server: &Server, n: u32, keys: u32) {
    server.write(|w| {
        for _ in 0..n {
            let key = (w.resource_version() as u32) % keys;
            let rv = w.resource_version() as u32 + 1;
            w.upsert(key, rv);
        }
    });
}

/// The cursor of a watch of every object from `start`.
fn watch_all(server: &Server, start: Start, bookmarks: bool) -> Cursor<u32> {
    server.watch(start, bookmarks, |_| true).unwrap().cursor
}

fn describe(item: Option<Item<u32>>) -> String {
    match item {
        None => "none".into(),
        Some(Item::Event(e)) => format!("{:?} {}", e.kind, e.resource_version),
        Some(Item::Bookmark(rv)) => format!("bookmark {rv}"),
        Some(Item::Closed) => "closed".into(),
        Some(Item::Expired(rv)) => format!("expired {rv}"),
    }
}

fn drain(cursor: &mut Cursor<u32>) -> Vec<String> {
    std::iter::from_fn(|| cursor.try_next().map(|i| describe(Some(i)))).collect()
}

#[test]
fn a_watch_from_the_window_replays_it_and_one_from_before_is_too_old() {
    let server = Server::new([(7, 0)], 10, 3);
    for _ in 0..5 {
        churn(&server, 1, 2);
    }
    assert_eq!(server.resource_version(), 15);
    assert_eq!(server.oldest(), 12, "events 13..=15 are kept");
    let mut from_13 = server.watch(Start::After(13), false, |_| true).unwrap();
    assert_eq!(from_13.resource_version, 13);
    assert_eq!(drain(&mut from_13.cursor), ["Modified 14", "Modified 15"]);
    let mut from_12 = server.watch(Start::After(12), false, |_| true).unwrap();
    assert_eq!(drain(&mut from_12.cursor).len(), 3);
    assert_eq!(
        server.watch(Start::After(11), false, |_| true).unwrap_err(),
        TooOld {
            requested: 11,
            oldest: 12
        }
    );
    let initial = server.watch(Start::Initial, false, |o| *o != 0).unwrap();
    assert_eq!(
        (initial.initial, initial.resource_version),
        (vec![15, 14], 15)
    );
    server.compact();
    assert_eq!(server.oldest(), 15);
    assert!(server.watch(Start::After(14), false, |_| true).is_err());
    churn(&server, 1, 2);
    assert_eq!(
        drain(&mut from_13.cursor),
        ["Modified 16"],
        "open watches read on after a compaction"
    );
}

#[test]
fn a_watch_from_a_future_version_gets_the_events_after_it() {
    let server = Server::new([], 0, 10);
    let mut ahead = watch_all(&server, Start::After(2), false);
    churn(&server, 4, 10);
    assert_eq!(drain(&mut ahead), ["Added 3", "Added 4"]);
}

#[test]
fn bookmarks_and_closes_reach_the_watches_open_at_the_time_only() {
    let server = Server::new([], 0, 10);
    let mut with = watch_all(&server, Start::Initial, true);
    let mut without = watch_all(&server, Start::Initial, false);
    churn(&server, 1, 10);
    server.bookmark();
    churn(&server, 1, 10);
    let mut later = watch_all(&server, Start::After(0), true);
    assert_eq!(server.open_watches(), 3);
    server.close_watches();
    assert_eq!(server.open_watches(), 0);
    let mut after_close = watch_all(&server, Start::After(0), true);
    assert_eq!(server.open_watches(), 1);
    churn(&server, 1, 10);
    assert_eq!(
        drain(&mut with),
        ["Added 1", "bookmark 1", "Added 2", "closed"]
    );
    assert_eq!(drain(&mut without), ["Added 1", "Added 2", "closed"]);
    assert_eq!(
        drain(&mut later),
        ["Added 1", "Added 2", "closed"],
        "the replay skips the bookmark sent before the watch"
    );
    assert_eq!(
        drain(&mut after_close),
        ["Added 1", "Added 2", "Added 3"],
        "a close before the watch is not for it"
    );
    assert!(with.is_done() && with.try_next().is_none());
    drop(after_close);
    assert_eq!(server.open_watches(), 0);
}

#[test]
fn a_watcher_that_falls_out_of_the_window_expires_and_lets_go() {
    let server = Server::new([], 0, 8);
    let mut slow = watch_all(&server, Start::After(0), false);
    let mut fast = watch_all(&server, Start::After(0), false);
    churn(&server, 2, 4);
    assert_eq!(drain(&mut slow).len(), 2);
    // One batch of 40: the window of 8 moves past everything the slow watcher has not read.
    churn(&server, 40, 4);
    assert_eq!(drain(&mut slow), ["expired 2"]);
    assert!(slow.is_done());
    assert_eq!(
        server.open_watches(),
        1,
        "the expired watch is no longer open"
    );
    // The fast one had read nothing either: it expires the same way, and the log keeps only
    // the window.
    assert_eq!(drain(&mut fast), ["expired 0"]);
    assert_eq!(server.log.kept_segments(), 1);
    // In batches smaller than the window, a watcher that keeps up never expires.
    let mut steady = watch_all(&server, Start::After(42), false);
    for _ in 0..20 {
        churn(&server, 5, 4);
        assert_eq!(drain(&mut steady).len(), 5);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watcher_gets_every_event_once_in_order() {
    const WATCHERS: usize = 64;
    const EVENTS: u64 = 20_000;
    let server = Arc::new(Server::new([], 0, 100_000));
    let mut tasks = Vec::new();
    for i in 0..WATCHERS {
        let start = if i % 2 == 0 {
            Start::Initial
        } else {
            Start::After(0)
        };
        let mut cursor = watch_all(&server, start, false);
        tasks.push(tokio::spawn(async move {
            let mut expected = 1;
            while expected <= EVENTS {
                match cursor.next().await {
                    Some(Item::Event(e)) => {
                        assert_eq!(e.resource_version, expected, "watcher {i}");
                        assert_eq!(u64::from(e.object), expected);
                        expected += 1;
                    }
                    other => panic!("watcher {i}: {:?}", other.map(|o| describe(Some(o)))),
                }
            }
            assert!(cursor.try_next().is_none(), "watcher {i}: nothing extra");
        }));
    }
    let writer = {
        let server = Arc::clone(&server);
        std::thread::spawn(move || {
            let mut sent = 0;
            while sent < EVENTS {
                let n = (sent % 97 + 1).min(EVENTS - sent);
                churn(&server, n as u32, 1000);
                sent += n;
            }
        })
    };
    writer.join().unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(server.resource_version(), EVENTS);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_watch_wakes_for_a_write_and_not_before() {
    let server = Arc::new(Server::new([], 0, 10));
    let mut cursor = watch_all(&server, Start::After(0), false);
    let waited = tokio::time::timeout(Duration::from_secs(5), cursor.ready()).await;
    assert!(waited.is_err(), "no write: no wake");
    let writer = Arc::clone(&server);
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        churn(&writer, 3, 10);
    });
    let start = tokio::time::Instant::now();
    assert_eq!(describe(cursor.next().await), "Added 1");
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    assert_eq!(drain(&mut cursor), ["Added 2", "Added 3"]);
}

#[test]
fn pages_read_the_first_pages_snapshot_while_writes_go_on() {
    let server = Server::new([], 0, 100);
    churn(&server, 5, 5);
    let pager: Pager<u32, ()> = Pager::new(16, None);
    let first = pager.first(server.snapshot((), |_| true), 2);
    assert_eq!(first.items(), [1, 2]);
    server.write(|w| {
        w.push(4, Kind::Deleted, 5);
        w.push(9, Kind::Added, 7);
    });
    let mut items = first.items().to_vec();
    let mut token = first.continue_token;
    while let Some(t) = token {
        let page = pager.next(&t, &(), 2).unwrap();
        assert_eq!(page.snapshot.resource_version, 5);
        items.extend_from_slice(page.items());
        token = page.continue_token;
    }
    assert_eq!(items, [1, 2, 3, 4, 5]);
    assert_eq!(server.objects(|_| true), [1, 2, 3, 4, 7]);
    assert_eq!(
        pager.next("nonsense", &(), 2).unwrap_err(),
        ContinueError::Malformed
    );
    assert_eq!(
        pager.next("6-2", &(), 2).unwrap_err(),
        ContinueError::Expired
    );
    // A watch from the list's version sees exactly what happened since.
    let mut watch = watch_all(&server, Start::After(5), false);
    assert_eq!(drain(&mut watch), ["Deleted 6", "Added 7"]);
}

#[test]
fn an_upsert_adds_a_new_key_and_modifies_a_present_one() {
    let server = Server::new([], 0, 10);
    let mut watch = server.watch(Start::After(0), false, |_| true).unwrap();
    server.write(|w| {
        assert_eq!(w.upsert(1, 10), (Kind::Added, 1));
        assert_eq!(w.upsert(1, 11), (Kind::Modified, 2));
        w.push(1, Kind::Deleted, 11);
        assert_eq!(w.upsert(1, 12), (Kind::Added, 4));
    });
    assert_eq!(
        drain(&mut watch.cursor),
        ["Added 1", "Modified 2", "Deleted 3", "Added 4"]
    );
    assert_eq!(server.get(&1), Some(12));
}
