//! The per-key table of a registration that coalesces ([`HandlerOptions::coalesce`]):
//! its delivery moves every batch it receives into this table at once, then calls the handler
//! for the oldest key's change, then takes in what arrived meanwhile, and so on. A handler
//! slower than the informer therefore never fills its buffer (the merging costs its own thread
//! far less than a call), the consumers do not wait for it, and it hears each key's latest
//! state.
//!
//! [`HandlerOptions::coalesce`]: super::HandlerOptions::coalesce
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
//! level-triggered handler (a controller that enqueues keys), the same a relist gives it. The
//! table holds at most one entry per key. Keys are delivered in the order in which their
//! first pending change arrived.
//!
//! A notification whose key cannot be computed is kept as it is, in order.

use std::collections::VecDeque;

use super::notification::Notification;
use crate::delta::DeltaObject;
use crate::key::{Key, KeyFn, KeyMap};

/// One key's pending change; see the module docs.
struct Entry<T> {
    gone: Option<DeltaObject<T>>,
    /// An add or an update, never a deletion.
    now: Option<Notification<T>>,
}

impl<T> Entry<T> {
    const EMPTY: Self = Self {
        gone: None,
        now: None,
    };

    /// Notifications it would deliver.
    fn len(&self) -> usize {
        usize::from(self.gone.is_some()) + usize::from(self.now.is_some())
    }

    /// Merges `next` in; the count of initial-list adds that vanished.
    fn merge(&mut self, next: Notification<T>) -> usize {
        let mut vanished_initial = 0;
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
                vanished_initial = usize::from(initial);
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
        vanished_initial
    }

    fn into_notifications(self) -> impl Iterator<Item = Notification<T>> {
        self.gone
            .map(Notification::Delete)
            .into_iter()
            .chain(self.now)
    }
}

/// What [`Coalesced::absorb`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Absorbed {
    /// Notifications that will not be delivered: merged into another, or cancelled.
    pub(crate) merged: usize,
    /// Of those, initial-list adds (the registration's sync count must let go of them).
    pub(crate) vanished_initial: usize,
}

/// The pending changes of a coalescing registration, one per key, oldest key first.
pub(crate) struct Coalesced<T> {
    key_fn: KeyFn<T>,
    /// Each key's entry, as its sequence number (`entries[seq - first]`).
    slots: KeyMap<u64>,
    /// Oldest first, with the key each belongs to (`None`: no key could be computed).
    entries: VecDeque<(Option<Key>, Entry<T>)>,
    /// The sequence number of `entries[0]`.
    first: u64,
}

impl<T> Coalesced<T> {
    /// An empty table, keyed by `key_fn`.
    pub(crate) fn new(key_fn: KeyFn<T>) -> Self {
        Self {
            key_fn,
            slots: KeyMap::default(),
            entries: VecDeque::new(),
            first: 0,
        }
    }

    /// Keys with a pending change (some may have merged down to nothing to say).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
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

    /// Takes `items` in, after everything taken in before.
    pub(crate) fn absorb(&mut self, items: Vec<Notification<T>>) -> Absorbed {
        let mut absorbed = Absorbed::default();
        for notification in items {
            let next = self.first + self.entries.len() as u64;
            // One key made per notification, cloned only for a key new to the table: most
            // notifications of a lagging handler merge into an entry already there.
            let seq = match self.key_of(&notification) {
                Some(key) => match self.slots.get(&key) {
                    Some(&seq) => seq,
                    None => {
                        self.slots.insert(key.clone(), next);
                        self.entries.push_back((Some(key), Entry::EMPTY));
                        next
                    }
                },
                None => {
                    self.entries.push_back((None, Entry::EMPTY));
                    next
                }
            };
            // The slot is within the table: slots are removed when their entry leaves it.
            let entry = &mut self.entries[(seq - self.first) as usize].1;
            let before = entry.len();
            absorbed.vanished_initial += entry.merge(notification);
            absorbed.merged += before + 1 - entry.len();
        }
        absorbed
    }

    /// The oldest key's pending change (possibly nothing, when it merged away), and `None`
    /// when the table is empty.
    pub(crate) fn pop(&mut self) -> Option<impl Iterator<Item = Notification<T>>> {
        let (key, entry) = self.entries.pop_front()?;
        self.first += 1;
        if let Some(key) = key {
            self.slots.remove(&key);
        }
        Some(entry.into_notifications())
    }
}

impl<T> std::fmt::Debug for Coalesced<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalesced")
            .field("keys", &self.entries.len())
            .finish_non_exhaustive()
    }
}

/// Unit tests of the merge rules, on strings keyed by their first letter.
#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::delta::Tombstone;

    fn first_letter() -> KeyFn<String> {
        Arc::new(|s: &String| {
            if s.starts_with('?') {
                Err(crate::key::KeyError::new("no key"))
            } else {
                Ok(Key::new(&s[..1]))
            }
        })
    }

    fn add_with(s: &str, initial: bool) -> Notification<String> {
        Notification::Add {
            obj: Arc::new(s.to_string()),
            initial,
        }
    }

    fn add(s: &str) -> Notification<String> {
        add_with(s, false)
    }

    fn initial_add(s: &str) -> Notification<String> {
        add_with(s, true)
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

    fn show(n: &Notification<String>) -> String {
        match n {
            Notification::Add { obj, initial } => format!("add {obj} {initial}"),
            Notification::Update { old, new } => format!("update {old}>{new}"),
            Notification::Delete(DeltaObject::Object(obj)) => format!("delete {obj}"),
            Notification::Delete(DeltaObject::Tombstone(t)) => format!("tombstone {}", t.key),
        }
    }

    /// Everything the table holds, key by key (an empty entry shows as nothing).
    fn drain(table: &mut Coalesced<String>) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(change) = table.pop() {
            out.extend(change.map(|n| show(&n)));
        }
        out
    }

    #[test]
    fn each_key_keeps_one_change_from_what_the_handler_last_heard() {
        let mut table = Coalesced::new(first_letter());
        let absorbed = table.absorb(vec![
            update("a1", "a2"),
            add("b1"),
            update("a2", "a3"),
            update("b1", "b2"),
            delete("c1"),
            update("a3", "a4"),
        ]);
        assert_eq!(
            absorbed,
            Absorbed {
                merged: 3,
                vanished_initial: 0
            }
        );
        assert_eq!(table.len(), 3);
        assert_eq!(
            drain(&mut table),
            ["update a1>a4", "add b2 false", "delete c1"],
            "keys in the order of their first change"
        );
        assert!(table.is_empty());
        assert!(table.pop().is_none());
    }

    #[test]
    fn a_deletion_is_heard_before_the_key_comes_back_and_an_unheard_add_vanishes() {
        let mut table = Coalesced::new(first_letter());
        let absorbed = table.absorb(vec![
            update("a1", "a2"),
            delete("a2"),
            add("a3"),
            update("a3", "a4"),
            add("b1"),
            delete("b1"),
        ]);
        assert_eq!(absorbed.merged, 4);
        assert_eq!(drain(&mut table), ["delete a2", "add a4 false"]);
    }

    #[test]
    fn a_key_popped_starts_again_at_the_back() {
        let mut table = Coalesced::new(first_letter());
        table.absorb(vec![update("a1", "a2"), update("b1", "b2")]);
        let first: Vec<_> = table.pop().unwrap().map(|n| show(&n)).collect();
        assert_eq!(first, ["update a1>a2"]);
        table.absorb(vec![update("a2", "a3"), update("b2", "b3")]);
        assert_eq!(drain(&mut table), ["update b1>b3", "update a2>a3"]);
    }

    #[test]
    fn tombstones_merge_by_their_key_and_initial_adds_that_vanish_are_counted() {
        let mut table = Coalesced::new(first_letter());
        let tombstone = Tombstone {
            key: Key::new("a"),
            last_known: Some(Arc::new("a1".to_string())),
        };
        let absorbed = table.absorb(vec![
            initial_add("a1"),
            Notification::Delete(DeltaObject::Tombstone(Arc::new(tombstone))),
            initial_add("b1"),
            update("b1", "b2"),
        ]);
        assert_eq!(
            absorbed,
            Absorbed {
                merged: 3,
                vanished_initial: 1
            }
        );
        assert_eq!(drain(&mut table), ["add b2 true"]);
    }

    #[test]
    fn notifications_without_a_key_stay_as_they_are() {
        let mut table = Coalesced::new(first_letter());
        table.absorb(vec![add("?1"), add("a1"), add("?2"), update("a1", "a2")]);
        assert_eq!(table.len(), 3);
        assert_eq!(
            drain(&mut table),
            ["add ?1 false", "add a2 false", "add ?2 false"]
        );
    }
}
