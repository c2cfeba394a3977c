//! The verdict ledger: what one handler was told, key by key, checked against the rules as
//! each notification arrives ([`KeyLedger`]), and judged at the end against a server's state.
//! One set of rules over two key spaces ([`KeySpace`]):
//!
//! - the workload's dense pod ids (`Vec<KeyView>`, [`Id`]): the runs through the informer
//!   ([`informer_verdict`](crate::judging::informer_verdict)), millions of notifications, nothing
//!   allocated per notification;
//! - `namespace/name` strings → resource version (`BTreeMap<String, u64>`): over the wire,
//!   where the workload's model is not at hand (faults, `loadgen soak`; [`Ledger`] and
//!   [`LedgerHandler`]).
//!
//! The rules (docs/informer.md's promises to a handler):
//!
//! - no `on_add` of a key the handler holds (a duplicate), no `on_update` or `on_delete` of
//!   one it does not (a lost add);
//! - an `on_update`'s `old` (a delete's object, when the key space knows versions of deleted
//!   keys) is the version the handler was last told, else a notification was lost;
//! - a key's versions never go back (a resync or relist may repeat one);
//! - at the end it holds every key the server holds, at the server's version, and no other.
//!
//! What differs between the two uses stays with its user: the initial-list flag and tombstones
//! are the informer path's ([`HandlerRecord`](crate::judging::informer_verdict::HandlerRecord)); a
//! handler that coalesces may skip states ([`KeyLedger::coalescing`]); after a server lost its
//! state, versions that went back are forgiven ([`Ledger::judge_after_lost_state`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use kcache::informer::Versioned;
use kcache::{DeltaObject, EventHandler, KeyFn};

use crate::sync::lock;

/// At most this many violations of one kind, and this many differing keys, are spelled out.
const MAX_EXAMPLES: usize = 3;

/// The kind of violation a server that lost its state may rightly cause.
pub const WENT_BACK: &str = "version went back";

/// A key as someone last heard of it: its version (0: never heard of) and whether it exists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyView {
    /// The version of the last state heard.
    pub version: u64,
    /// Whether the key exists.
    pub alive: bool,
}

/// Whether a handler that heard `got` knows the state `want`: the same version if the key
/// exists, absent if not. (The version a key was deleted at is not part of its state: a key
/// created and deleted again between two lists is never heard of, as in client-go.)
pub fn same_state(got: KeyView, want: KeyView) -> bool {
    got.alive == want.alive && (!want.alive || got.version == want.version)
}

fn describe(view: KeyView) -> String {
    if view.alive {
        format!("v{}", view.version)
    } else {
        "no object".to_string()
    }
}

/// How a ledger stores its keys' views.
pub trait KeySpace {
    /// How a key is named in a notification.
    type Key: ?Sized + fmt::Display;
    /// The view of `key` (the default view for a key never heard of).
    fn view(&self, key: &Self::Key) -> KeyView;
    /// Records `view` for `key`.
    fn set(&mut self, key: &Self::Key, view: KeyView);
    /// Calls `differ` with each key whose state here differs from `server`'s (a key either
    /// side lacks included), as the key's name, the view here and the server's.
    fn differences(&self, server: &Self, differ: &mut dyn FnMut(String, KeyView, KeyView));
}

/// A pod id of the dense key space, shown as `#id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Id(pub usize);

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Dense pod ids: every key has a slot, and a deleted key keeps the version it was deleted at.
impl KeySpace for Vec<KeyView> {
    type Key = Id;

    fn view(&self, key: &Id) -> KeyView {
        self[key.0]
    }

    fn set(&mut self, key: &Id, view: KeyView) {
        self[key.0] = view;
    }

    fn differences(&self, server: &Self, differ: &mut dyn FnMut(String, KeyView, KeyView)) {
        let len = self.len().max(server.len());
        for id in 0..len {
            let got = self.get(id).copied().unwrap_or_default();
            let want = server.get(id).copied().unwrap_or_default();
            if !same_state(got, want) || id >= self.len() || id >= server.len() {
                differ(Id(id).to_string(), got, want);
            }
        }
    }
}

/// Keys by name → resource version: only the keys held are stored.
impl KeySpace for BTreeMap<String, u64> {
    type Key = str;

    fn view(&self, key: &str) -> KeyView {
        self.get(key)
            .map_or_else(KeyView::default, |&version| KeyView {
                version,
                alive: true,
            })
    }

    fn set(&mut self, key: &str, view: KeyView) {
        match (view.alive, self.get_mut(key)) {
            (true, Some(held)) => *held = view.version,
            (true, None) => {
                self.insert(key.to_string(), view.version);
            }
            (false, _) => {
                self.remove(key);
            }
        }
    }

    fn differences(&self, server: &Self, differ: &mut dyn FnMut(String, KeyView, KeyView)) {
        for key in server
            .keys()
            .chain(self.keys().filter(|k| !server.contains_key(*k)))
        {
            let (got, want) = (self.view(key), server.view(key));
            if !same_state(got, want) {
                differ(key.clone(), got, want);
            }
        }
    }
}

/// What one handler was told, key by key, with every violation of the rules (see the module
/// docs) counted by kind and the first few of each spelled out.
#[derive(Debug, Clone, Default)]
pub struct KeyLedger<S> {
    /// Every key as the handler last heard of it.
    pub keys: S,
    /// Handler calls.
    pub notifications: u64,
    /// Violations of the per-key rules, by kind.
    pub violations: BTreeMap<&'static str, u64>,
    /// The first few violations of each kind, spelled out.
    pub examples: Vec<String>,
    /// The handler coalesces when its buffer is full: it may skip intermediate states, so a
    /// deletion may carry a newer state than the last one heard. Every other rule holds.
    pub coalescing: bool,
}

impl<S: KeySpace> KeyLedger<S> {
    /// A ledger over `keys`, none heard of.
    pub fn new(keys: S) -> Self {
        Self {
            keys,
            notifications: 0,
            violations: BTreeMap::new(),
            examples: Vec::new(),
            coalescing: false,
        }
    }

    /// Counts a violation of `kind`, spelling it out while there are few.
    pub fn violate(&mut self, kind: &'static str, message: impl FnOnce() -> String) {
        let n = self.violations.entry(kind).or_default();
        *n += 1;
        if *n <= MAX_EXAMPLES as u64 {
            self.examples.push(message());
        }
    }

    /// `on_add(key @ version)`; returns the view before.
    pub fn add(&mut self, key: &S::Key, version: u64) -> KeyView {
        self.notifications += 1;
        let view = self.keys.view(key);
        if view.alive {
            self.violate("add of a present key", || {
                format!(
                    "key {key}: on_add v{version} while v{} is present",
                    view.version
                )
            });
        } else if version <= view.version {
            self.violate(WENT_BACK, || {
                format!("key {key}: on_add v{version} after v{}", view.version)
            });
        }
        self.keys.set(
            key,
            KeyView {
                version,
                alive: true,
            },
        );
        view
    }

    /// `on_update(key @ old → new)`.
    pub fn update(&mut self, key: &S::Key, old: u64, new: u64) {
        self.notifications += 1;
        let view = self.keys.view(key);
        if !view.alive {
            self.violate("update of an absent key", || {
                format!("key {key}: on_update v{old}->v{new} while absent")
            });
        } else if old != view.version {
            self.violate("missed notification", || {
                format!(
                    "key {key}: on_update from v{old}, but the last state heard is v{}",
                    view.version
                )
            });
        }
        if new < old || new < view.version {
            self.violate(WENT_BACK, || format!("key {key}: on_update v{old}->v{new}"));
        }
        let version = new;
        self.keys.set(
            key,
            KeyView {
                version,
                alive: true,
            },
        );
    }

    /// `on_delete(key)`, carrying `version` when the handler learns which state went away (a
    /// tombstone's last known state, or the deleted object).
    pub fn delete(&mut self, key: &S::Key, version: Option<u64>) {
        self.notifications += 1;
        let view = self.keys.view(key);
        if !view.alive {
            self.violate("delete of an absent key", || {
                format!("key {key}: on_delete while absent")
            });
        } else if let Some(version) = version {
            if version != view.version && !(self.coalescing && version > view.version) {
                self.violate("missed notification", || {
                    format!(
                        "key {key}: on_delete of v{version}, but the last state heard is v{}",
                        view.version
                    )
                });
            }
            if version < view.version {
                self.violate(WENT_BACK, || {
                    format!("key {key}: on_delete of v{version} after v{}", view.version)
                });
            }
        }
        self.keys.set(
            key,
            KeyView {
                version: version.unwrap_or(view.version),
                alive: false,
            },
        );
    }

    /// Violations of every kind but `forgiven`.
    pub fn violation_count(&self, forgiven: &[&str]) -> u64 {
        (self.violations.iter())
            .filter(|(kind, _)| !forgiven.contains(kind))
            .map(|(_, n)| n)
            .sum()
    }

    /// How many keys end in another state than `server`'s, and the first few of them spelled
    /// out.
    pub fn differences(&self, server: &S) -> (usize, Vec<String>) {
        let mut differ = 0;
        let mut examples = Vec::new();
        self.keys.differences(server, &mut |key, got, want| {
            differ += 1;
            if examples.len() < MAX_EXAMPLES {
                examples.push(format!(
                    "key {key}: the handler ends with {}, the server with {}",
                    describe(got),
                    describe(want)
                ));
            }
        });
        (differ, examples)
    }

    /// Every failure of the ledger judged against `server`, violations of `forgiven` kinds
    /// left out: each kind of violation with its count, the examples, then the keys whose
    /// final state differs.
    pub fn failures(&self, server: &S, forgiven: &[&str]) -> Vec<String> {
        let mut failures: Vec<String> = (self.violations.iter())
            .filter(|(kind, _)| !forgiven.contains(kind))
            .map(|(kind, n)| format!("{kind}: {n} times"))
            .collect();
        if !failures.is_empty() {
            failures.extend(self.examples.iter().cloned());
        }
        let (differ, examples) = self.differences(server);
        if differ > 0 {
            failures.extend(examples);
            failures.push(format!(
                "final state: {differ} keys differ from the server's"
            ));
        }
        failures
    }
}

/// What one handler was told over the wire, keyed `namespace/name`.
#[derive(Debug, Default, Clone)]
pub struct Ledger(pub KeyLedger<BTreeMap<String, u64>>);

impl Ledger {
    /// `on_add(key @ rv)`.
    pub fn add(&mut self, key: &str, rv: u64) {
        self.0.add(key, rv);
    }

    /// `on_update(key @ old → new)`.
    pub fn update(&mut self, key: &str, old: u64, new: u64) {
        self.0.update(key, old, new);
    }

    /// `on_delete(key)`: the name alone (a deleted key's version is not kept).
    pub fn delete(&mut self, key: &str) {
        self.0.delete(key, None);
    }

    /// The keys held now.
    pub fn held(&self) -> &BTreeMap<String, u64> {
        &self.0.keys
    }

    /// `Ok` when no rule was broken and the handler holds exactly `expected`; otherwise what
    /// went wrong.
    pub fn judge(&self, expected: &BTreeMap<String, u64>) -> Result<(), LedgerVerdict> {
        self.judge_forgiving(expected, &[])
    }

    /// [`Ledger::judge`] for a run in which the server lost its state: versions that went
    /// back are not violations (a relist rightly takes a key back).
    pub fn judge_after_lost_state(
        &self,
        expected: &BTreeMap<String, u64>,
    ) -> Result<(), LedgerVerdict> {
        self.judge_forgiving(expected, &[WENT_BACK])
    }

    fn judge_forgiving(
        &self,
        expected: &BTreeMap<String, u64>,
        forgiven: &[&str],
    ) -> Result<(), LedgerVerdict> {
        let violations = self.0.violation_count(forgiven);
        let (different, differences) = self.0.differences(expected);
        if violations == 0 && different == 0 {
            return Ok(());
        }
        Err(LedgerVerdict {
            violations,
            examples: self.0.examples.clone(),
            different,
            differences,
        })
    }
}

/// Why a ledger was judged wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerVerdict {
    /// Rule violations.
    pub violations: u64,
    /// The first few.
    pub examples: Vec<String>,
    /// Keys whose final version differs from the server's (or that only one side has).
    pub different: usize,
    /// The first few.
    pub differences: Vec<String>,
}

impl fmt::Display for LedgerVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} rule violations {:?}; {} keys differ from the server {:?}",
            self.violations, self.examples, self.different, self.differences
        )
    }
}

/// A handler that keeps a [`Ledger`]; clone [`LedgerHandler::ledger`] to read it.
pub struct LedgerHandler<T> {
    ledger: Arc<Mutex<Ledger>>,
    key_fn: KeyFn<T>,
}

impl<T> LedgerHandler<T> {
    /// A handler keying objects by `key_fn`.
    pub fn new(key_fn: KeyFn<T>) -> Self {
        Self {
            ledger: Arc::default(),
            key_fn,
        }
    }

    /// The ledger it writes.
    pub fn ledger(&self) -> Arc<Mutex<Ledger>> {
        Arc::clone(&self.ledger)
    }

    fn key(&self, obj: &T) -> String {
        match (self.key_fn)(obj) {
            Ok(key) => key.as_str().to_string(),
            // The informer never hands over an object its key function refused.
            Err(e) => format!("<no key: {e}>"),
        }
    }
}

/// A resource version as a number (`serve`'s are decimal); anything else reads as 0.
fn rv_of<T: Versioned>(obj: &T) -> u64 {
    obj.resource_version().parse().unwrap_or(0)
}

impl<T: Versioned> EventHandler<T> for LedgerHandler<T> {
    fn on_add(&mut self, obj: &Arc<T>, _is_in_initial_list: bool) {
        let key = self.key(obj);
        lock(&self.ledger).add(&key, rv_of(&**obj));
    }

    fn on_update(&mut self, old: &Arc<T>, new: &Arc<T>) {
        let key = self.key(new);
        lock(&self.ledger).update(&key, rv_of(&**old), rv_of(&**new));
    }

    fn on_delete(&mut self, obj: &DeltaObject<T>) {
        let key = match (obj.tombstone(), obj.object()) {
            (Some(tombstone), _) => tombstone.key.as_str().to_string(),
            (None, Some(last)) => self.key(last),
            (None, None) => return,
        };
        lock(&self.ledger).delete(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_faithful_handler_passes_and_each_kind_of_slip_is_caught() {
        let mut ledger = Ledger::default();
        ledger.add("a", 1);
        ledger.add("b", 2);
        ledger.update("a", 1, 3);
        ledger.update("a", 3, 3); // a resync
        ledger.delete("b");
        assert_eq!(ledger.judge(&state(&[("a", 3)])), Ok(()));
        let wrong = ledger.judge(&state(&[("a", 4), ("c", 1)])).unwrap_err();
        assert_eq!((wrong.violations, wrong.different), (0, 2));

        let mut slips = Ledger::default();
        slips.add("a", 1);
        slips.add("a", 1); // duplicate
        slips.update("a", 2, 5); // lost the update to 2
        slips.update("z", 1, 2); // never added
        slips.delete("y"); // never added
        slips.update("a", 5, 4); // back
        let verdict = slips.judge(&state(&[("a", 4), ("z", 2)])).unwrap_err();
        assert_eq!(verdict.violations, 5, "{verdict}");
        let verdict = slips
            .judge_after_lost_state(&state(&[("a", 4), ("z", 2)]))
            .unwrap_err();
        assert_eq!(verdict.violations, 4, "going back is forgiven: {verdict}");
    }

    #[test]
    fn both_key_spaces_judge_the_same_sequence_alike() {
        let mut dense = KeyLedger::new(vec![KeyView::default(); 2]);
        let mut named = KeyLedger::new(BTreeMap::<String, u64>::new());
        dense.add(&Id(0), 1);
        named.add("a", 1);
        dense.update(&Id(0), 1, 2);
        named.update("a", 1, 2);
        dense.update(&Id(1), 1, 2); // never added
        named.update("b", 1, 2);
        dense.delete(&Id(1), Some(2));
        named.delete("b", None);
        dense.delete(&Id(1), Some(2)); // twice
        named.delete("b", None);
        assert_eq!(dense.violations, named.violations);
        assert_eq!(dense.notifications, 5);
        let server = vec![
            KeyView {
                version: 2,
                alive: true,
            },
            KeyView::default(),
        ];
        assert_eq!(dense.differences(&server).0, 0);
        assert_eq!(named.differences(&state(&[("a", 2)])).0, 0);
        assert_eq!(named.differences(&state(&[("a", 3), ("c", 1)])).0, 2);
    }
}
