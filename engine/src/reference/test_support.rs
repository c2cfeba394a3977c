//! Fixtures for the unit tests that look inside the engines: the reference queues
//! ([`Fifo`](super::Fifo), [`DeltaFifo`](super::DeltaFifo)) and the private-state tests of both
//! indexers. One tiny object type serves them all, so a test reads the same everywhere.
//! (The indexers' public contract is tested in `tests/indexer_contract.rs`, with its own pods.)

use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::key::{Key, KeyError, KeyFn, KeyMap};
use crate::store::{IndexFunc, KnownObjects};

/// A tiny object: an empty `key` makes [`key_fn`] fail; `v` is a version (the delta FIFO's
/// tests give `v == 666` to their transformer to make it fail).
#[derive(Debug, PartialEq)]
pub(crate) struct Obj {
    pub(crate) key: &'static str,
    pub(crate) v: u32,
}

pub(crate) fn obj(key: &'static str, v: u32) -> Arc<Obj> {
    Arc::new(Obj { key, v })
}

/// The key is `key`; an empty one is a key error.
pub(crate) fn key_fn() -> KeyFn<Obj> {
    Arc::new(|o: &Obj| {
        if o.key.is_empty() {
            Err(KeyError::new("object has no key"))
        } else {
            Ok(Key::new(o.key))
        }
    })
}

/// An index function for the indexers' tests: one value, the version, so an update that
/// changes `v` moves the key to another set.
pub(crate) fn by_v() -> IndexFunc<Obj> {
    Arc::new(|o: &Obj| [Key::new(&o.v.to_string())].into_iter().collect())
}

/// The consumer's store, as a queue sees it. `ghosts` are listed but not found, like a key
/// deleted between `list_keys` and `get_by_key`.
#[derive(Default)]
pub(crate) struct Known {
    pub(crate) objects: Mutex<KeyMap<Arc<Obj>>>,
    pub(crate) ghosts: Vec<Key>,
}

impl KnownObjects<Obj> for Known {
    fn list_keys(&self) -> Vec<Key> {
        let objects = self.objects.lock().unwrap();
        objects
            .keys()
            .cloned()
            .chain(self.ghosts.iter().cloned())
            .collect()
    }

    fn get_by_key(&self, key: &Key) -> Option<Arc<Obj>> {
        self.objects.lock().unwrap().get(key).cloned()
    }
}

/// A store holding `objs`, each under its own key.
pub(crate) fn known(objs: &[Arc<Obj>]) -> Arc<Known> {
    let known = Known::default();
    for o in objs {
        known
            .objects
            .lock()
            .unwrap()
            .insert(Key::new(o.key), Arc::clone(o));
    }
    Arc::new(known)
}

/// The keys as text, in the order given (a queue's order matters).
pub(crate) fn key_texts(keys: &[Key]) -> Vec<String> {
    keys.iter().map(|k| k.to_string()).collect()
}

/// The keys as sorted text (a map's order does not matter).
pub(crate) fn sorted_key_texts(keys: &[Key]) -> Vec<String> {
    let mut texts = key_texts(keys);
    texts.sort();
    texts
}

/// Runs `pop` on another thread, waits until the queue reports it blocked (`waiting`, the
/// number of pops waiting on the queue's condition variable, reaches one) and checks it has
/// not returned, calls `wake`, and returns what `pop` returned once woken.
///
/// The queue's own count, not a sleep, says "blocked": a pop counted there is parked on the
/// condition variable, on however slow a machine.
pub(crate) fn blocks_until_woken<R: Send + 'static>(
    pop: impl FnOnce() -> R + Send + 'static,
    waiting: impl Fn() -> usize,
    wake: impl FnOnce(),
) -> R {
    let (tx, rx) = mpsc::channel();
    let popper = thread::spawn(move || tx.send(pop()).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting() == 0 {
        assert!(
            rx.try_recv().is_err(),
            "pop returned on an empty queue instead of blocking"
        );
        assert!(Instant::now() < deadline, "pop never blocked on the queue");
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(waiting(), 1, "one pop blocked");
    assert!(rx.try_recv().is_err(), "a blocked pop has not returned");
    wake();
    let popped = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the woken pop returns");
    popper.join().unwrap();
    assert_eq!(waiting(), 0, "no pop left waiting");
    popped
}
