//! A simulated Kubernetes API server's state machine, for one resource: the one implementation
//! behind [`MemoryListerWatcher`](crate::MemoryListerWatcher) (in-process, typed objects) and
//! `loadgen serve` (HTTP, pre-serialised pods).
//!
//! It keeps what an API server's watch cache keeps: the current objects, a resource version
//! that every event increments (an integer, formatted only by the transport), and a bounded
//! window of recent events. A watch from a version still in the window replays what came after
//! it and then follows live writes; a watch from an older version is refused with `410
//! Expired`; a watcher that falls more than the window behind is ended with `410`. Paged lists
//! read a snapshot taken by their first page ([`Pager`]).
//!
//! | module | concept |
//! |---|---|
//! | `log` | the append-only event log and its window |
//! | `cursor` | the fan-out: each watch reads the log through its own [`Cursor`] |
//! | `pager` | snapshots, pages and `continue` tokens |
//!
//! # Consistency
//!
//! Writes are applied in batches ([`ApiServer::write`]): the objects and the resource version
//! change and the batch is appended to the log under one lock, so a watch that starts sees a
//! consistent cut: the objects at some resource version (or the window's events after its
//! version) and then exactly the events after it, each once, in order. A list's snapshot is
//! the objects at one resource version; a watch from that version misses nothing.
//!
//! # Performance
//!
//! A batch costs the writer one lock of the objects and one of the log, whatever its size and
//! however many watches are open; each watch then takes the log's lock once per batch it reads
//! (to clone the new segments' `Arc`s) and reads the events with no lock. Events are shared by
//! every watch, never copied.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use kcache_sim::apiserver::{ApiServer, Item, Kind, Start};
//!
//! let server: ApiServer<&str, u32> = ApiServer::new([], 0, 100);
//! server.write(|w| {
//!     w.push("a", Kind::Added, 1);
//!     w.push("b", Kind::Added, 2);
//! });
//! let mut watch = server.watch(Start::After(1), false, |_| true).unwrap().cursor;
//! server.write(|w| { w.push("a", Kind::Deleted, 1); });
//! let Some(Item::Event(e)) = watch.next().await else { panic!() };
//! assert_eq!((e.kind, e.resource_version, e.object), (Kind::Added, 2, 2));
//! let Some(Item::Event(e)) = watch.next().await else { panic!() };
//! assert_eq!((e.kind, e.resource_version), (Kind::Deleted, 3));
//! assert_eq!(server.objects(|_| true), [2]);
//! # });
//! ```

mod cursor;
mod log;
mod pager;

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub use cursor::{Cursor, Item};
pub use log::{Event, Kind};
pub use pager::{ContinueError, Paged, Pager, Snapshot};

use crate::{lock, read, write};
use cursor::OpenGuard;
use log::{Entry, Log};

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// With the current objects (as `ADDED` events, sent by the transport), then every event
    /// after them.
    Initial,
    /// With every event after this resource version. A version newer than the server's is
    /// waited for: the watch gets the events after it as they come.
    After(u64),
}

/// A watch from a version older than the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooOld {
    /// The version asked for.
    pub requested: u64,
    /// The oldest version a watch can start from.
    pub oldest: u64,
}

impl fmt::Display for TooOld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "too old resource version: {} ({})",
            self.requested, self.oldest
        )
    }
}

/// A watch that started: what to send first, and the cursor for the rest.
#[derive(Debug)]
pub struct WatchStart<O> {
    /// For [`Start::Initial`], the current objects the watch selected, in key order; empty
    /// otherwise.
    pub initial: Vec<O>,
    /// The resource version the watcher starts at: the initial objects', or the one it asked
    /// for.
    pub resource_version: u64,
    /// Every event after that.
    pub cursor: Cursor<O>,
}

struct State<K, O> {
    resource_version: u64,
    /// The current objects. A hash map, not a tree: every write looks a key up and stores it
    /// (two string comparisons per tree level were a tenth of a `run --through informer`
    /// profile), while key order is needed only by lists and initial watches, which sort
    /// what they take ([`sorted`]).
    objects: HashMap<K, O, ahash::RandomState>,
    /// A watch can start from this version or a newer one: every event after it is kept.
    oldest: u64,
}

/// The server (see the module documentation). `K` is an object's key (its list order), `O`
/// the object as the server stores and sends it; clone is expected to be cheap (an `Arc`).
pub struct ApiServer<K, O> {
    state: RwLock<State<K, O>>,
    log: Arc<Log<O>>,
    window: usize,
    /// The open watches of the current epoch; [`close_watches`](Self::close_watches) starts a
    /// new one.
    open: Mutex<Arc<AtomicUsize>>,
}

impl<K, O> fmt::Debug for ApiServer<K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = read(&self.state);
        f.debug_struct("ApiServer")
            .field("resource_version", &state.resource_version)
            .field("objects", &state.objects.len())
            .field("oldest", &state.oldest)
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

/// The handle a batch of writes goes through ([`ApiServer::write`]).
pub struct Writer<'a, K, O> {
    state: &'a mut State<K, O>,
    entries: Vec<Entry<O>>,
}

impl<K, O> fmt::Debug for Writer<'_, K, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Writer")
            .field("resource_version", &self.state.resource_version)
            .field("events", &self.entries.len())
            .finish()
    }
}

impl<K: Ord + Hash, O: Clone> Writer<'_, K, O> {
    /// The resource version of the last write (the next one gets one more).
    pub fn resource_version(&self) -> u64 {
        self.state.resource_version
    }

    /// The current object of `key`, this batch's writes included.
    pub fn get<Q>(&self, key: &Q) -> Option<&O>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.state.objects.get(key)
    }

    /// Applies one event: `object` becomes `key`'s state (or, for [`Kind::Deleted`], `key` is
    /// removed and `object` is its last state). Returns the event's resource version.
    pub fn push(&mut self, key: K, kind: Kind, object: O) -> u64 {
        match kind {
            Kind::Deleted => {
                self.state.objects.remove(&key);
            }
            Kind::Added | Kind::Modified => {
                self.state.objects.insert(key, object.clone());
            }
        }
        self.append(kind, object)
    }

    /// Stores `object` as `key`'s state: `Added` if the key had none, else `Modified`, found
    /// by the one map insertion (a `get` before [`push`](Self::push) would hash and probe the
    /// key twice per event). Returns the event's kind and resource version.
    pub fn upsert(&mut self, key: K, object: O) -> (Kind, u64) {
        let kind = match self.state.objects.insert(key, object.clone()) {
            None => Kind::Added,
            Some(_) => Kind::Modified,
        };
        (kind, self.append(kind, object))
    }

    /// Logs the event of a change already applied to the objects.
    fn append(&mut self, kind: Kind, object: O) -> u64 {
        self.state.resource_version += 1;
        let resource_version = self.state.resource_version;
        self.entries.push(Entry::Event(Event {
            kind,
            resource_version,
            object,
        }));
        resource_version
    }
}

impl<K: Ord + Hash, O: Clone + Send + Sync + 'static> ApiServer<K, O> {
    /// A server holding `initial` (objects that need no events) at `resource_version`, keeping
    /// the newest `window` events (at least 1).
    pub fn new(
        initial: impl IntoIterator<Item = (K, O)>,
        resource_version: u64,
        window: usize,
    ) -> Self {
        let window = window.max(1);
        Self {
            state: RwLock::new(State {
                resource_version,
                objects: initial.into_iter().collect(),
                oldest: resource_version,
            }),
            log: Arc::new(Log::new(resource_version, window)),
            window,
            open: Mutex::new(Arc::new(AtomicUsize::new(0))),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, State<K, O>> {
        // A panic under the lock cannot leave the state half-written in a way that matters:
        // a batch's writes are applied one by one, each complete.
        read(&self.state)
    }

    fn write_lock(&self) -> RwLockWriteGuard<'_, State<K, O>> {
        // See `read`.
        write(&self.state)
    }

    fn open_count(&self) -> Arc<AtomicUsize> {
        Arc::clone(&lock(&self.open))
    }

    /// How many recent events it keeps.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The newest resource version.
    pub fn resource_version(&self) -> u64 {
        self.read().resource_version
    }

    /// The oldest resource version a watch can start from.
    pub fn oldest(&self) -> u64 {
        self.read().oldest
    }

    /// How many objects exist.
    pub fn len(&self) -> usize {
        self.read().objects.len()
    }

    /// Whether no object exists.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current object of `key`.
    pub fn get<Q>(&self, key: &Q) -> Option<O>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.read().objects.get(key).cloned()
    }

    /// The current objects that `select` keeps, in key order.
    pub fn objects(&self, select: impl FnMut(&O) -> bool) -> Vec<O> {
        sorted(&self.read().objects, select)
    }

    /// The current objects that `select` keeps, as a list's snapshot of `view`.
    pub fn snapshot<V>(&self, view: V, select: impl FnMut(&O) -> bool) -> Snapshot<O, V> {
        let state = self.read();
        Snapshot {
            resource_version: state.resource_version,
            view,
            items: sorted(&state.objects, select),
        }
    }

    /// Applies a batch of writes through `f` and hands them to every watch at once.
    pub fn write<R>(&self, f: impl FnOnce(&mut Writer<'_, K, O>) -> R) -> R {
        let mut state = self.write_lock();
        let mut writer = Writer {
            state: &mut *state,
            entries: Vec::new(),
        };
        let result = f(&mut writer);
        let entries = writer.entries;
        if !entries.is_empty() {
            let rv = state.resource_version;
            state.oldest = state.oldest.max(rv.saturating_sub(self.window as u64));
            // Under the objects' lock: a watch starting now sees the objects and the log at
            // the same version.
            self.log.append(entries, Some(rv));
        }
        result
    }

    /// Sends a bookmark at the current resource version to every open watch that allows them.
    pub fn bookmark(&self) {
        // The read lock keeps writes out, so the bookmark follows the event it names.
        let state = self.read();
        self.log
            .append(vec![Entry::Bookmark(state.resource_version)], None);
    }

    /// Ends every open watch (each after the events it was sent before).
    pub fn close_watches(&self) {
        // The write lock keeps watches from starting: each is either closed or not counted.
        let _state = self.write_lock();
        *lock(&self.open) = Arc::new(AtomicUsize::new(0));
        self.log.append(vec![Entry::Close], None);
    }

    /// Forgets the window for new watches: one from any version older than the current one is
    /// refused (as after the API server's watch cache moved on). Open watches read on.
    pub fn compact(&self) {
        let mut state = self.write_lock();
        state.oldest = state.resource_version;
    }

    /// How many watches are open (started since the last
    /// [`close_watches`](Self::close_watches), and neither ended nor dropped).
    pub fn open_watches(&self) -> usize {
        // Relaxed: a statistic; see `OpenGuard`.
        self.open_count().load(Ordering::Relaxed)
    }

    /// Starts a watch; `bookmarks` lets it receive [`bookmark`](Self::bookmark)s, `select`
    /// chooses the initial objects of [`Start::Initial`].
    pub fn watch(
        &self,
        start: Start,
        bookmarks: bool,
        select: impl FnMut(&O) -> bool,
    ) -> Result<WatchStart<O>, TooOld> {
        let state = self.read();
        let end = self.log.end();
        let (initial, resource_version, next) = match start {
            Start::Initial => (sorted(&state.objects, select), state.resource_version, end),
            Start::After(from) if from < state.oldest => {
                return Err(TooOld {
                    requested: from,
                    oldest: state.oldest,
                })
            }
            Start::After(from) => (Vec::new(), from, self.log.position_after(from)),
        };
        let open = OpenGuard::new(&self.open_count());
        let cursor = Cursor::new(
            Arc::clone(&self.log),
            next,
            end,
            resource_version,
            bookmarks,
            open,
        );
        Ok(WatchStart {
            initial,
            resource_version,
            cursor,
        })
    }
}

/// The objects `select` keeps, in key order (the order of a list).
fn sorted<K: Ord, O: Clone>(
    objects: &HashMap<K, O, ahash::RandomState>,
    mut select: impl FnMut(&O) -> bool,
) -> Vec<O> {
    let mut kept: Vec<(&K, &O)> = objects.iter().filter(|(_, o)| select(o)).collect();
    kept.sort_unstable_by(|a, b| a.0.cmp(b.0));
    kept.into_iter().map(|(_, o)| o.clone()).collect()
}

#[cfg(test)]
mod tests;
