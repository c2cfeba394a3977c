//! Paged lists: a list's first page takes a [`Snapshot`] of the objects, and its `continue`
//! tokens read the rest of that snapshot, so every page of one list describes the same
//! resource version however many writes happen between them (the API server reads etcd at the
//! first page's revision).
//!
//! A token is `{resourceVersion}-{offset}` (opaque to clients). Snapshots are kept per
//! resource version and *view* (what the list selects: a namespace, or everything), shared by
//! every list that starts at the same point; the pager keeps a bounded number of them, each
//! for a bounded time, and a token whose snapshot is gone is expired (`410`), as the API
//! server's is once etcd compacted its revision.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::lock;
use tokio::time::Instant;

/// The objects a list describes, at one resource version, in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot<O, V> {
    /// The resource version it describes.
    pub resource_version: u64,
    /// What it selects (a namespace, or `()` for everything).
    pub view: V,
    /// The objects.
    pub items: Vec<O>,
}

/// One page: a range of a snapshot, and the token for the rest.
#[derive(Debug)]
pub struct Paged<O, V> {
    /// The snapshot the list reads.
    pub snapshot: Arc<Snapshot<O, V>>,
    /// This page's items in it.
    pub range: Range<usize>,
    /// The token of the next page; `None` on the last.
    pub continue_token: Option<String>,
}

impl<O, V> Paged<O, V> {
    /// This page's items.
    pub fn items(&self) -> &[O] {
        &self.snapshot.items[self.range.clone()]
    }

    /// How many items follow this page.
    pub fn remaining(&self) -> usize {
        self.snapshot.items.len() - self.range.end
    }
}

/// Why a `continue` token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ContinueError {
    /// Not a token this server made (`400 BadRequest`).
    Malformed,
    /// Its snapshot is no longer kept (`410 Expired`).
    Expired,
    /// Its offset is past the end of its snapshot (`400 BadRequest`).
    PastEnd,
}

impl fmt::Display for ContinueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ContinueError::Malformed => "continue key is not valid",
            ContinueError::Expired => {
                "The provided continue parameter is too old to display a consistent list \
                 result. You can start a new list without the continue parameter."
            }
            ContinueError::PastEnd => "offset past the end of the list",
        })
    }
}

/// The kept snapshots, oldest first, each with when it was kept.
type Kept<O, V> = VecDeque<(Instant, Arc<Snapshot<O, V>>)>;

/// The snapshots of paged lists in progress (see the module documentation).
pub struct Pager<O, V> {
    kept: Mutex<Kept<O, V>>,
    max_kept: usize,
    ttl: Option<Duration>,
}

impl<O, V> fmt::Debug for Pager<O, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pager")
            .field("kept", &self.kept.lock().map_or(0, |k| k.len()))
            .field("max_kept", &self.max_kept)
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl<O, V: PartialEq> Pager<O, V> {
    /// A pager keeping at most `max_kept` snapshots (at least 1), each for `ttl` after it was
    /// kept (`None`: until it is the oldest of too many).
    pub fn new(max_kept: usize, ttl: Option<Duration>) -> Self {
        Self {
            kept: Mutex::new(VecDeque::new()),
            max_kept: max_kept.max(1),
            ttl,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Kept<O, V>> {
        // Every change under the lock completes before anything that can panic runs.
        lock(&self.kept)
    }

    fn alive(&self, at: Instant, now: Instant) -> bool {
        self.ttl.is_none_or(|ttl| now.duration_since(at) < ttl)
    }

    /// The first page of a list of `snapshot`, at most `limit` items (0: all).
    pub fn first(&self, snapshot: Snapshot<O, V>, limit: usize) -> Paged<O, V> {
        self.page(Arc::new(snapshot), 0, limit)
    }

    /// The page that `token` continues, in `view`, at most `limit` items (0: all).
    pub fn next(&self, token: &str, view: &V, limit: usize) -> Result<Paged<O, V>, ContinueError> {
        let (resource_version, offset) = parse_token(token).ok_or(ContinueError::Malformed)?;
        let now = Instant::now();
        let snapshot = self
            .lock()
            .iter()
            .find(|(at, s)| {
                s.resource_version == resource_version && s.view == *view && self.alive(*at, now)
            })
            .map(|(_, s)| Arc::clone(s))
            .ok_or(ContinueError::Expired)?;
        if offset > snapshot.items.len() {
            return Err(ContinueError::PastEnd);
        }
        Ok(self.page(snapshot, offset, limit))
    }

    fn page(&self, snapshot: Arc<Snapshot<O, V>>, offset: usize, limit: usize) -> Paged<O, V> {
        let len = snapshot.items.len();
        let end = match limit {
            0 => len,
            limit => offset.saturating_add(limit).min(len),
        };
        let continue_token = (end < len).then(|| {
            self.keep(&snapshot);
            format!("{}-{end}", snapshot.resource_version)
        });
        Paged {
            snapshot,
            range: offset..end,
            continue_token,
        }
    }

    /// Keeps `snapshot` for the tokens of its list, unless one of the same version and view is
    /// kept already (they are equal: the state at a version does not change).
    fn keep(&self, snapshot: &Arc<Snapshot<O, V>>) {
        let mut kept = self.lock();
        let now = Instant::now();
        kept.retain(|(at, _)| self.alive(*at, now));
        if kept.iter().any(|(_, s)| {
            Arc::ptr_eq(s, snapshot)
                || (s.resource_version == snapshot.resource_version && s.view == snapshot.view)
        }) {
            return;
        }
        if kept.len() == self.max_kept {
            kept.pop_front();
        }
        kept.push_back((now, Arc::clone(snapshot)));
    }
}

/// `{resourceVersion}-{offset}`.
fn parse_token(token: &str) -> Option<(u64, usize)> {
    let (rv, offset) = token.split_once('-')?;
    Some((rv.parse().ok()?, offset.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(rv: u64, view: &'static str, n: u32) -> Snapshot<u32, &'static str> {
        Snapshot {
            resource_version: rv,
            view,
            items: (0..n).collect(),
        }
    }

    #[test]
    fn tokens_read_the_first_pages_snapshot_and_garbage_is_malformed() {
        let pager = Pager::new(4, None);
        let first = pager.first(snapshot(7, "a", 5), 2);
        assert_eq!(first.items(), [0, 1]);
        assert_eq!(first.continue_token.as_deref(), Some("7-2"));
        let second = pager.next("7-2", &"a", 2).unwrap();
        assert_eq!((second.items(), second.remaining()), (&[2, 3][..], 1));
        let last = pager.next("7-4", &"a", 0).unwrap();
        assert_eq!((last.items(), &last.continue_token), (&[4][..], &None));
        assert_eq!(
            pager.next("7-2", &"b", 2).unwrap_err(),
            ContinueError::Expired
        );
        assert_eq!(
            pager.next("8-2", &"a", 2).unwrap_err(),
            ContinueError::Expired
        );
        assert_eq!(
            pager.next("7-9", &"a", 2).unwrap_err(),
            ContinueError::PastEnd
        );
        for bad in ["garbage", "1-", "-3", "x-1", "1-y", "1-2-3", "1:2"] {
            assert_eq!(
                pager.next(bad, &"a", 2).unwrap_err(),
                ContinueError::Malformed
            );
        }
        assert_eq!(pager.first(snapshot(9, "a", 2), 0).continue_token, None);
        assert_eq!(
            pager.lock().len(),
            1,
            "a list that fits one page keeps nothing"
        );
    }

    #[test]
    fn the_oldest_snapshot_goes_when_too_many_are_kept() {
        let pager = Pager::new(2, None);
        for rv in 1..=3 {
            pager.first(snapshot(rv, "a", 3), 1);
        }
        pager.first(snapshot(3, "a", 3), 1);
        assert_eq!(
            pager.next("1-1", &"a", 1).unwrap_err(),
            ContinueError::Expired
        );
        assert!(pager.next("2-1", &"a", 1).is_ok());
        assert!(
            pager.next("3-1", &"a", 1).is_ok(),
            "the same view is kept once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_snapshot_expires_after_its_time_to_live() {
        let pager = Pager::new(8, Some(Duration::from_secs(300)));
        pager.first(snapshot(1, "a", 3), 1);
        tokio::time::sleep(Duration::from_secs(299)).await;
        assert!(pager.next("1-1", &"a", 1).is_ok());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            pager.next("1-1", &"a", 1).unwrap_err(),
            ContinueError::Expired
        );
    }
}
