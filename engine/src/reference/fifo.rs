//! The port of client-go's plain `FIFO` (`tools/cache/fifo.go`), the queue informers used
//! before the DeltaFIFO.
//!
//! What it is for: a reference for the older semantics, for code being ported from
//! `cache.FIFO` (a work queue of "the latest object per key", where a consumer only needs the
//! current state), and to show by contrast what [`DeltaFifo`](super::DeltaFifo) adds. Nothing
//! else in kcache uses it: the informer, the sharded engine and the trace replayers are built
//! on the DeltaFIFO. Its unit tests below pin the rules of docs/semantics.md §3.
//!
//! How it differs from the DeltaFIFO: it queues *objects*, not deltas. A key holds only its
//! newest object (no Added/Updated/Sync history, no compaction to do), and a `delete` drops
//! the object instead of queueing a Deleted delta, so a consumer never learns that an object
//! went away; `replace` does not make tombstones for keys missing from the list, and there is
//! no known-objects store. The rest of its rules are documented on [`Fifo`].

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use crate::key::{Key, KeyError, KeyFn, KeyMap, KeySet};
use crate::queue::{Closed, TryPop};
use crate::sync::{lock, wait, Condvar, Mutex, MutexGuard};

/// client-go's plain `FIFO`: a queue of objects, not of deltas. It keeps only
/// the newest object per key, queues a key once, and forgets deletions: `delete` drops the
/// object, and `pop` skips a queued key whose object is gone.
///
/// One mutex and one condition variable, like client-go. State: `items` (key → newest object)
/// and `queue` (keys in pop order). Every key of `items` is in `queue`; unlike
/// [`DeltaFifo`](super::DeltaFifo), `queue` may also hold keys whose object was deleted, and
/// (after a delete and a re-add) a key twice: the first occurrence pops the object, later ones
/// find nothing and are skipped.
///
/// Deviations from client-go: `replace` queues the keys in the list's first-occurrence order
/// and `resync` in sorted order (client-go walks Go maps), so pop order is reproducible;
/// `list`/`list_keys` are in pop order (client-go: map order).
///
/// ```
/// use std::sync::Arc;
/// use kcache::reference::Fifo;
/// use kcache::Key;
///
/// let fifo = Fifo::new(Arc::new(|s: &String| Ok(Key::new(s.split('=').next().unwrap_or("")))));
/// fifo.add(Arc::new("a=1".to_string())).unwrap();
/// fifo.update(Arc::new("a=2".to_string())).unwrap(); // replaces a=1, a stays queued once
/// assert_eq!(fifo.len(), 1);
/// let popped = fifo.pop(|obj, _initial| obj.to_string()).unwrap();
/// assert_eq!(popped, "a=2");
/// ```
pub struct Fifo<T> {
    key_fn: KeyFn<T>,
    /// Everything mutable, behind the one lock.
    state: Mutex<FifoState<T>>,
    /// Signalled when keys are queued and on close.
    cond: Condvar,
}

/// The state guarded by [`Fifo::state`].
struct FifoState<T> {
    /// The newest object per key. Every key here is also in `queue`.
    items: KeyMap<Arc<T>>,
    /// Keys in pop order; may hold keys whose object was deleted, and such a key twice.
    queue: VecDeque<Key>,
    /// Set by the first add/update/delete/replace/add_if_not_present.
    populated: bool,
    /// Queue entries of the first `replace` not yet popped (skipped ones count too).
    initial_population_count: usize,
    /// Set by `close`.
    closed: bool,
    /// Pops waiting on `cond` for an item: what a test checks to know a pop is blocked.
    waiting_pops: usize,
}

impl<T> FifoState<T> {
    fn has_synced(&self) -> bool {
        self.populated && self.initial_population_count == 0
    }

    /// client-go's `addIfNotPresent`/`Add` core: a key not holding an object joins the queue.
    fn queue_if_absent(&mut self, key: Key, obj: Arc<T>, replace: bool) -> bool {
        match self.items.get_mut(&key) {
            Some(old) => {
                if replace {
                    *old = obj;
                }
                false
            }
            None => {
                self.queue.push_back(key.clone());
                self.items.insert(key, obj);
                true
            }
        }
    }

    /// Takes the front queue entry: `Some` with the object and `is_in_initial_list`, or `None`
    /// when the object was deleted meanwhile (the entry is consumed all the same).
    fn take_front(&mut self) -> Option<(Arc<T>, bool)> {
        let is_in_initial_list = !self.has_synced();
        let key = self.queue.pop_front()?;
        // Decremented even for a skipped key, as client-go does: the count is of queue entries.
        if self.initial_population_count > 0 {
            self.initial_population_count -= 1;
        }
        let obj = self.items.remove(&key)?;
        Some((obj, is_in_initial_list))
    }
}

impl<T> Fifo<T> {
    /// An empty queue keyed by `key_fn` (client-go's `NewFIFO`).
    pub fn new(key_fn: KeyFn<T>) -> Self {
        Self {
            key_fn,
            state: Mutex::new(FifoState {
                items: KeyMap::default(),
                queue: VecDeque::new(),
                populated: false,
                initial_population_count: 0,
                closed: false,
                waiting_pops: 0,
            }),
            cond: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, FifoState<T>> {
        lock(&self.state)
    }

    /// Stores `obj` as its key's newest object; queues the key unless it holds an object
    /// already. Marks the queue populated.
    pub fn add(&self, obj: Arc<T>) -> Result<(), KeyError> {
        let key = (self.key_fn)(&obj)?;
        let mut st = self.lock();
        st.populated = true;
        st.queue_if_absent(key, obj, true);
        self.cond.notify_all();
        Ok(())
    }

    /// The same as [`add`](Self::add): a FIFO does not tell adds from updates.
    pub fn update(&self, obj: Arc<T>) -> Result<(), KeyError> {
        self.add(obj)
    }

    /// Drops the object of `obj`'s key. Its key may stay queued; `pop` then skips it.
    /// Marks the queue populated.
    pub fn delete(&self, obj: &T) -> Result<(), KeyError> {
        let key = (self.key_fn)(obj)?;
        let mut st = self.lock();
        st.populated = true;
        st.items.remove(&key);
        Ok(())
    }

    /// Replaces everything with `list` (the newest object per key), queued in the list's
    /// first-occurrence order. The first call sets the initial population count to the number
    /// of distinct keys. A key error changes nothing.
    pub fn replace(&self, list: Vec<Arc<T>>) -> Result<(), KeyError> {
        let mut items = KeyMap::with_capacity_and_hasher(list.len(), Default::default());
        let mut queue = VecDeque::with_capacity(list.len());
        for obj in list {
            let key = (self.key_fn)(&obj)?;
            if items.insert(key.clone(), obj).is_none() {
                queue.push_back(key);
            }
        }
        let mut st = self.lock();
        if !st.populated {
            st.populated = true;
            st.initial_population_count = items.len();
        }
        st.items = items;
        st.queue = queue;
        if !st.queue.is_empty() {
            self.cond.notify_all();
        }
        Ok(())
    }

    /// Queues (in sorted order) every key holding an object that is not queued. The operations
    /// here keep every such key queued, so this finds nothing to do; it exists because
    /// client-go's `Resync` does the same check.
    pub fn resync(&self) {
        let mut st = self.lock();
        let in_queue: KeySet = st.queue.iter().cloned().collect();
        let mut missing: Vec<Key> = st
            .items
            .keys()
            .filter(|key| !in_queue.contains(*key))
            .cloned()
            .collect();
        missing.sort_unstable();
        st.queue.extend(missing);
        if !st.queue.is_empty() {
            self.cond.notify_all();
        }
    }

    /// Stores and queues `obj` unless its key already holds an object, which then wins (it is
    /// newer than a requeued one). Marks the queue populated.
    pub fn add_if_not_present(&self, obj: Arc<T>) -> Result<(), KeyError> {
        let key = (self.key_fn)(&obj)?;
        let mut st = self.lock();
        st.populated = true;
        if st.queue_if_absent(key, obj, false) {
            self.cond.notify_all();
        }
        Ok(())
    }

    /// How many pops are blocked on an empty queue.
    #[cfg(test)]
    pub(crate) fn waiting_pops(&self) -> usize {
        self.lock().waiting_pops
    }

    /// Blocks until an object is queued, takes it, and returns `process(obj,
    /// is_in_initial_list)`. [`Closed`] once closed and empty. Queued keys whose object was
    /// deleted are skipped.
    ///
    /// `process` runs **under the queue's lock**, as in client-go; it must not call back into
    /// this queue (the lock is not reentrant).
    pub fn pop<R, F>(&self, process: F) -> Result<R, Closed>
    where
        F: FnOnce(Arc<T>, bool) -> R,
    {
        let mut st = self.lock();
        loop {
            while st.queue.is_empty() {
                if st.closed {
                    return Err(Closed);
                }
                st.waiting_pops += 1;
                st = wait(&self.cond, st);
                st.waiting_pops -= 1;
            }
            if let Some((obj, is_in_initial_list)) = st.take_front() {
                let out = process(obj, is_in_initial_list);
                drop(st);
                return Ok(out);
            }
        }
    }

    /// Like [`pop`](Self::pop), but returns at once when nothing is queued.
    pub fn try_pop<R, F>(&self, process: F) -> TryPop<R>
    where
        F: FnOnce(Arc<T>, bool) -> R,
    {
        let mut st = self.lock();
        loop {
            if st.queue.is_empty() {
                return if st.closed {
                    TryPop::Closed
                } else {
                    TryPop::Empty
                };
            }
            if let Some((obj, is_in_initial_list)) = st.take_front() {
                let out = process(obj, is_in_initial_list);
                drop(st);
                return TryPop::Popped(out);
            }
        }
    }

    /// The queued object of `obj`'s key, if any.
    pub fn get(&self, obj: &T) -> Result<Option<Arc<T>>, KeyError> {
        let key = (self.key_fn)(obj)?;
        Ok(self.get_by_key(&key))
    }

    /// The queued object of `key`, if any.
    pub fn get_by_key(&self, key: &Key) -> Option<Arc<T>> {
        self.lock().items.get(key).cloned()
    }

    /// Every queued object, in pop order.
    pub fn list(&self) -> Vec<Arc<T>> {
        let st = self.lock();
        live_keys(&st)
            .map(|key| Arc::clone(&st.items[key]))
            .collect()
    }

    /// The key of every queued object, in pop order.
    pub fn list_keys(&self) -> Vec<Key> {
        let st = self.lock();
        live_keys(&st).cloned().collect()
    }

    /// How many objects are queued (skipped queue entries of deleted objects do not count).
    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    /// Whether no object is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Populated, and every entry queued by the first `replace` has been popped.
    pub fn has_synced(&self) -> bool {
        self.lock().has_synced()
    }

    /// Closes the queue: pops on an empty queue return [`Closed`]; queued objects stay poppable.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        self.cond.notify_all();
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }
}

/// The keys that hold an object, each once, in pop order (the first occurrence is the one that
/// pops the object).
fn live_keys<T>(st: &FifoState<T>) -> impl Iterator<Item = &Key> {
    let mut seen = KeySet::default();
    st.queue
        .iter()
        .filter(move |key| st.items.contains_key(*key) && seen.insert((*key).clone()))
}

impl<T> fmt::Debug for Fifo<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Fifo");
        // try_lock: formatting from inside `process` (under the lock) must not deadlock.
        let st = match self.state.try_lock() {
            Ok(st) => Some(st),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        match st {
            Some(st) => d
                .field("queued_objects", &st.items.len())
                .field("queue_entries", &st.queue.len())
                .field("populated", &st.populated)
                .field("initial_population_count", &st.initial_population_count)
                .field("closed", &st.closed),
            None => d.field("state", &"<locked>"),
        };
        d.finish()
    }
}

#[cfg(all(test, not(kcache_loom)))]
mod tests {
    use super::*;
    use crate::reference::test_support::{blocks_until_woken, key_fn, key_texts, obj, Obj};

    fn fifo() -> Fifo<Obj> {
        Fifo::new(key_fn())
    }

    /// Pops one object: (key, v, is_in_initial_list).
    fn pop1(f: &Fifo<Obj>) -> (&'static str, u32, bool) {
        match f.try_pop(|o, initial| (o.key, o.v, initial)) {
            TryPop::Popped(p) => p,
            other => panic!("expected a pop, got {other:?}"),
        }
    }

    fn keys(f: &Fifo<Obj>) -> Vec<String> {
        key_texts(&f.list_keys())
    }

    #[test]
    fn fifo_keeps_only_the_newest_object_queued_once() {
        let f = fifo();
        f.add(obj("a", 1)).unwrap();
        f.add(obj("b", 1)).unwrap();
        f.update(obj("a", 2)).unwrap();
        assert_eq!(keys(&f), ["a", "b"]);
        assert_eq!(f.len(), 2);
        assert_eq!(pop1(&f), ("a", 2, false));
        assert_eq!(pop1(&f), ("b", 1, false));
        assert_eq!(f.try_pop(|_, _| ()), TryPop::Empty);
    }

    #[test]
    fn fifo_add_marks_populated() {
        let f = fifo();
        assert!(!f.has_synced());
        f.add(obj("a", 1)).unwrap();
        assert!(f.has_synced());
    }

    #[test]
    fn fifo_delete_drops_the_object_and_pop_skips_its_key() {
        let f = fifo();
        f.add(obj("a", 1)).unwrap();
        f.add(obj("b", 1)).unwrap();
        f.delete(&Obj { key: "a", v: 0 }).unwrap();
        assert_eq!(f.len(), 1);
        assert!(f.get_by_key(&Key::new("a")).is_none());
        assert_eq!(pop1(&f), ("b", 1, false));
        assert_eq!(f.try_pop(|_, _| ()), TryPop::Empty);
    }

    #[test]
    fn fifo_delete_then_add_pops_the_object_once() {
        // The deleted key stays queued; the re-add queues it again. The first entry pops the
        // object, the second finds nothing and is skipped.
        let f = fifo();
        f.add(obj("a", 1)).unwrap();
        f.delete(&Obj { key: "a", v: 1 }).unwrap();
        f.add(obj("a", 2)).unwrap();
        assert_eq!(keys(&f), ["a"]);
        assert_eq!(pop1(&f), ("a", 2, false));
        assert_eq!(f.try_pop(|_, _| ()), TryPop::Empty);
    }

    #[test]
    fn fifo_pop_skip_still_decrements_initial_count() {
        let f = fifo();
        f.replace(vec![obj("a", 1), obj("b", 1)]).unwrap();
        f.delete(&Obj { key: "a", v: 1 }).unwrap();
        // a's entry is consumed (count 2 → 1) without a pop; b is still in the initial list.
        assert_eq!(pop1(&f), ("b", 1, true));
        assert!(f.has_synced());
    }

    #[test]
    fn fifo_replace_replaces_all() {
        let f = fifo();
        f.add(obj("x", 1)).unwrap();
        f.replace(vec![obj("b", 1), obj("a", 1), obj("b", 2)])
            .unwrap();
        assert_eq!(keys(&f), ["b", "a"], "first-occurrence order of the list");
        assert!(f.get_by_key(&Key::new("x")).is_none());
        assert_eq!(
            f.get(&Obj { key: "b", v: 0 }).unwrap().map(|o| o.v),
            Some(2)
        );
        let listed: Vec<u32> = f.list().iter().map(|o| o.v).collect();
        assert_eq!(listed, [2, 1]);
    }

    #[test]
    fn fifo_replace_sets_initial_count_only_once() {
        let f = fifo();
        f.replace(vec![obj("a", 1), obj("b", 1), obj("a", 2)])
            .unwrap();
        assert!(!f.has_synced());
        assert_eq!(pop1(&f), ("a", 2, true));
        assert!(!f.has_synced());
        f.replace(vec![obj("c", 1), obj("d", 1)]).unwrap();
        assert_eq!(pop1(&f), ("c", 1, true));
        assert!(
            f.has_synced(),
            "the second replace must not raise the count"
        );
        assert_eq!(pop1(&f), ("d", 1, false));
    }

    #[test]
    fn fifo_key_error_changes_nothing() {
        let f = fifo();
        let bad = || obj("", 1);
        assert!(f.add(bad()).is_err());
        assert!(f.delete(&bad()).is_err());
        assert!(f.add_if_not_present(bad()).is_err());
        assert!(f.replace(vec![obj("b", 1), bad()]).is_err());
        assert!(f.is_empty());
        assert!(!f.has_synced());
        f.add(obj("c", 1)).unwrap();
        assert!(f.replace(vec![obj("b", 1), bad()]).is_err());
        assert_eq!(keys(&f), ["c"]);
        assert!(f.get(&bad()).is_err());
    }

    #[test]
    fn fifo_add_if_not_present_keeps_the_queued_object() {
        let f = fifo();
        f.add(obj("a", 2)).unwrap();
        f.add_if_not_present(obj("a", 1)).unwrap();
        f.add_if_not_present(obj("b", 1)).unwrap();
        assert_eq!(keys(&f), ["a", "b"]);
        assert_eq!(pop1(&f), ("a", 2, false));
    }

    #[test]
    fn fifo_resync_does_not_requeue_queued_keys() {
        let f = fifo();
        f.add(obj("a", 1)).unwrap();
        f.resync();
        assert_eq!(pop1(&f), ("a", 1, false));
        assert_eq!(f.try_pop(|_, _| ()), TryPop::Empty);
    }

    #[test]
    fn fifo_close_keeps_items_poppable() {
        let f = fifo();
        f.add(obj("a", 1)).unwrap();
        f.close();
        assert!(f.is_closed());
        assert_eq!(f.pop(|o, _| o.v), Ok(1));
        assert_eq!(f.pop(|_, _| ()), Err(Closed));
        assert_eq!(f.try_pop(|_, _| ()), TryPop::Closed);
    }

    #[test]
    fn fifo_pop_blocks_until_add() {
        let f = Arc::new(fifo());
        let popper = Arc::clone(&f);
        let popped = blocks_until_woken(
            move || popper.pop(|o, _| o.v),
            || f.waiting_pops(),
            || f.add(obj("a", 7)).unwrap(),
        );
        assert_eq!(popped, Ok(7));
    }

    #[test]
    fn fifo_pop_runs_process_under_the_lock() {
        let f = fifo();
        f.add(obj("a", 1)).unwrap();
        let text = f.pop(|_, _| format!("{f:?}")).unwrap();
        assert!(text.contains("<locked>"), "{text}");
        f.add(obj("secret", 1)).unwrap();
        let text = format!("{f:?}");
        assert!(
            text.contains("queued_objects: 1") && !text.contains("secret"),
            "{text}"
        );
    }
}
