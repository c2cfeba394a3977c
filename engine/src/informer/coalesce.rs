//! What a registration that coalesces when full ([`HandlerOptions::coalesce_when_full`]) does
//! with the notifications its full buffer cannot take: it keeps one pending change per key.
//!
//! # Rules
//!
//! A key's pending change is at most a deletion the handler has to hear first (`gone`: the key
//! was deleted and added again) and the key's state to report (`now`: an add, or an update
//! from the state the handler last heard). A later notification of the same key merges in:
//!
//! | pending `now` | then | becomes |
//! |---|---|---|
//! | none | add `o` | add `o` |
//! | add `a` | update `→ b` | add `b` (the initial-list flag kept) |
//! | update `a → b` | update `→ c` | update `a → c` |
//! | add `a` | delete | nothing: the handler never heard of `a` (an earlier `gone` stays) |
//! | update `a → b` | delete `d` | `gone` = delete `d` |
//! | none | delete `d` | `gone` = delete `d` |
//!
//! So a handler hears, per key and in order, a subsequence of what it would have heard, ending
//! in the key's latest state: every intermediate state may be skipped, none is reordered, the
//! last is never lost, and `old` is always the state it last heard. That is the contract of a
//! level-triggered handler (a controller that enqueues keys), the same a relist gives it. Memory
//! is bounded by the number of keys, not by how far the handler lags. Keys keep the order in
//! which their first pending change arrived.
//!
//! A notification whose key cannot be computed is kept as it is, in order.

use super::handoff::Spill;
use super::processor::Notification;
use crate::delta::DeltaObject;
use crate::key::{Key, KeyFn, KeyMap};

/// One key's pending change; see the module docs.
struct Entry<T> {
    /// A deletion the handler hears before `now`.
    gone: Option<DeltaObject<T>>,
    /// The key's state to report: an add, or an update (never a deletion).
    now: Option<Notification<T>>,
}

impl<T> Entry<T> {
    fn merge(&mut self, next: Notification<T>, vanished_initial: &mut usize) {
        self.now = match (self.now.take(), next) {
            (Some(Notification::Add { initial, .. }), Notification::Update { new, .. }) => {
                Some(Notification::Add { obj: new, initial })
            }
            (Some(Notification::Update { old, .. }), Notification::Update { new, .. })
            | (Some(Notification::Update { old, .. }), Notification::Add { obj: new, .. }) => {
                Some(Notification::Update { old, new })
            }
            (Some(Notification::Add { initial, .. }), Notification::Delete(_)) => {
                // The handler never heard of this state: nothing to tell it.
                *vanished_initial += usize::from(initial);
                None
            }
            (Some(Notification::Update { .. }) | None, Notification::Delete(gone)) => {
                self.gone = Some(gone);
                None
            }
            (Some(Notification::Add { initial, .. }), Notification::Add { obj, .. }) => {
                Some(Notification::Add { obj, initial })
            }
            (None, next @ (Notification::Add { .. } | Notification::Update { .. })) => Some(next),
            (Some(Notification::Delete(_)), _) => {
                unreachable!("`now` never holds a deletion")
            }
        };
    }

    fn drain_into(self, out: &mut Vec<Notification<T>>) {
        out.extend(self.gone.map(Notification::Delete));
        out.extend(self.now);
    }
}

/// The pending changes of a registration whose buffer is full, one per key; a [`Spill`] of
/// its hand-off.
pub(crate) struct Coalesced<T> {
    key_fn: KeyFn<T>,
    /// Where each key's entry is in `entries`.
    slots: KeyMap<usize>,
    /// In the order of each key's first pending change (an entry may end up empty).
    entries: Vec<Entry<T>>,
    /// Notifications taken in since the last [`take`](Spill::take).
    absorbed: usize,
    /// Initial-list adds merged away without delivery (see `on_vanished_initial`).
    vanished_initial: usize,
    /// Told how many initial-list adds vanished, so the registration's sync count stays true.
    on_vanished_initial: Box<dyn Fn(usize) + Send>,
}

impl<T> Coalesced<T> {
    /// Coalesces by `key_fn`; `on_vanished_initial(n)` hears of initial-list adds that merged
    /// away (added, then deleted, before the handler heard either).
    pub(crate) fn new(key_fn: KeyFn<T>, on_vanished_initial: Box<dyn Fn(usize) + Send>) -> Self {
        Self {
            key_fn,
            slots: KeyMap::default(),
            entries: Vec::new(),
            absorbed: 0,
            vanished_initial: 0,
            on_vanished_initial,
        }
    }

    fn key_of(&self, notification: &Notification<T>) -> Option<Key> {
        match notification {
            Notification::Add { obj, .. } | Notification::Update { new: obj, .. } => {
                (self.key_fn)(obj).ok()
            }
            Notification::Delete(DeltaObject::Object(obj)) => (self.key_fn)(obj).ok(),
            Notification::Delete(DeltaObject::Tombstone(tombstone)) => Some(tombstone.key.clone()),
        }
    }

    fn absorb_one(&mut self, notification: Notification<T>) {
        self.absorbed += 1;
        let Some(key) = self.key_of(&notification) else {
            let mut entry = Entry {
                gone: None,
                now: None,
            };
            entry.merge(notification, &mut self.vanished_initial);
            self.entries.push(entry);
            return;
        };
        let next = self.entries.len();
        let slot = *self.slots.entry(key).or_insert(next);
        if slot == next {
            self.entries.push(Entry {
                gone: None,
                now: None,
            });
        }
        self.entries[slot].merge(notification, &mut self.vanished_initial);
    }
}

impl<T: Send + Sync> Spill<Notification<T>> for Coalesced<T> {
    fn absorb(&mut self, items: Vec<Notification<T>>) {
        for notification in items {
            self.absorb_one(notification);
        }
        if self.vanished_initial > 0 {
            (self.on_vanished_initial)(std::mem::take(&mut self.vanished_initial));
        }
    }

    fn is_empty(&self) -> bool {
        self.absorbed == 0
    }

    fn keys(&self) -> usize {
        self.entries.len()
    }

    fn take(&mut self) -> (Vec<Notification<T>>, usize) {
        let mut out = Vec::with_capacity(self.entries.len());
        for entry in self.entries.drain(..) {
            entry.drain_into(&mut out);
        }
        self.slots.clear();
        let absorbed = std::mem::take(&mut self.absorbed);
        (out, absorbed)
    }
}

impl<T> std::fmt::Debug for Coalesced<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalesced")
            .field("keys", &self.entries.len())
            .field("absorbed", &self.absorbed)
            .finish_non_exhaustive()
    }
}

/// Unit tests of the merge rules, on strings keyed by their first letter.
#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::delta::Tombstone;

    fn coalesced() -> Coalesced<String> {
        let key_fn: KeyFn<String> = Arc::new(|s: &String| Ok(Key::new(&s[..1])));
        Coalesced::new(key_fn, Box::new(|_| {}))
    }

    fn add(s: &str) -> Notification<String> {
        Notification::Add {
            obj: Arc::new(s.to_string()),
            initial: false,
        }
    }

    fn update(old: &str, new: &str) -> Notification<String> {
        Notification::Update {
            old: Arc::new(old.to_string()),
            new: Arc::new(new.to_string()),
        }
    }

    fn delete(s: &str) -> Notification<String> {
        Notification::Delete(DeltaObject::Object(Arc::new(s.to_string())))
    }

    fn show(items: &[Notification<String>]) -> Vec<String> {
        items
            .iter()
            .map(|n| match n {
                Notification::Add { obj, initial } => format!("add {obj} {initial}"),
                Notification::Update { old, new } => format!("update {old}>{new}"),
                Notification::Delete(DeltaObject::Object(obj)) => format!("delete {obj}"),
                Notification::Delete(DeltaObject::Tombstone(t)) => format!("tombstone {}", t.key),
            })
            .collect()
    }

    #[test]
    fn each_key_keeps_one_change_from_what_the_handler_last_heard() {
        let mut c = coalesced();
        c.absorb(vec![
            update("a1", "a2"),
            add("b1"),
            update("a2", "a3"),
            update("b1", "b2"),
            delete("c1"),
            update("a3", "a4"),
        ]);
        assert_eq!(c.keys(), 3);
        let (out, absorbed) = c.take();
        assert_eq!(absorbed, 6);
        assert_eq!(
            show(&out),
            ["update a1>a4", "add b2 false", "delete c1"],
            "keys in the order of their first change"
        );
        assert!(c.is_empty());
        assert_eq!(c.take().0.len(), 0);
    }

    #[test]
    fn a_deletion_is_heard_before_the_key_comes_back_and_an_unheard_add_vanishes() {
        let mut c = coalesced();
        c.absorb(vec![
            update("a1", "a2"),
            delete("a2"),
            add("a3"),
            update("a3", "a4"),
            add("b1"),
            delete("b1"),
        ]);
        let (out, absorbed) = c.take();
        assert_eq!(absorbed, 6);
        assert_eq!(show(&out), ["delete a2", "add a4 false"]);
        // The emptied entry of `b` is not a change: the spill has absorbed but yields nothing.
    }

    #[test]
    fn tombstones_merge_by_their_key_and_initial_adds_that_vanish_are_reported() {
        let vanished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = Arc::clone(&vanished);
        let key_fn: KeyFn<String> = Arc::new(|s: &String| Ok(Key::new(&s[..1])));
        let mut c = Coalesced::new(
            key_fn,
            Box::new(move |n| {
                seen.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            }),
        );
        let tombstone = Tombstone {
            key: Key::new("a"),
            last_known: Some(Arc::new("a1".to_string())),
        };
        c.absorb(vec![
            Notification::Add {
                obj: Arc::new("a1".to_string()),
                initial: true,
            },
            Notification::Delete(DeltaObject::Tombstone(Arc::new(tombstone))),
            Notification::Add {
                obj: Arc::new("b1".to_string()),
                initial: true,
            },
            update("b1", "b2"),
        ]);
        assert_eq!(vanished.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(show(&c.take().0), ["add b2 true"]);
    }

    #[test]
    fn notifications_without_a_key_stay_as_they_are() {
        let key_fn: KeyFn<String> = Arc::new(|s: &String| {
            if s.starts_with('?') {
                Err(crate::key::KeyError::new("no key"))
            } else {
                Ok(Key::new(&s[..1]))
            }
        });
        let mut c = Coalesced::new(key_fn, Box::new(|_| {}));
        c.absorb(vec![add("?1"), add("a1"), add("?2"), update("a1", "a2")]);
        assert_eq!(c.keys(), 3);
        assert_eq!(
            show(&c.take().0),
            ["add ?1 false", "add a2 false", "add ?2 false"]
        );
    }
}
