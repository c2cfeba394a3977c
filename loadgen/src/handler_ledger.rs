//! A handler's ledger over the wire: what one handler registration was told, key by key,
//! checked as it arrives, and judged at the end against the server's state (`namespace/name`
//! → resource version). Used where the workload's model is not at hand (faults over the wire,
//! `loadgen soak`), where [`informer_verdict`](crate::informer_verdict) needs it.
//!
//! The rules (docs/informer.md's promises to a handler):
//!
//! - no `on_add` of a key the handler holds (a duplicate), no `on_update` or `on_delete` of
//!   one it does not (a lost add);
//! - an `on_update`'s `old` is the version the handler was last told (else a notification
//!   was lost), and its `new` is not older (a resync or relist may repeat it, never go back);
//! - at the end it holds every key the server holds, at the server's version, and no other.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use kcache::informer::Versioned;
use kcache::{DeltaObject, EventHandler, KeyFn};

use crate::sync::lock;

/// At most this many violations are spelled out.
const MAX_EXAMPLES: usize = 5;

/// What one handler was told.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    /// Key → the resource version the handler last heard.
    held: BTreeMap<String, u64>,
    /// Notifications received.
    pub notifications: u64,
    /// Rule violations seen (all counted, the first few spelled out).
    pub violations: u64,
    /// Updates whose version went back (counted apart: after a server lost its state and its
    /// versions went back, a relist rightly takes a key back).
    pub went_back: u64,
    examples: Vec<String>,
}

impl Ledger {
    fn violation(&mut self, what: String) {
        self.violations += 1;
        if self.examples.len() < MAX_EXAMPLES {
            self.examples.push(what);
        }
    }

    /// `on_add(key @ rv)`.
    pub fn add(&mut self, key: &str, rv: u64) {
        self.notifications += 1;
        if let Some(held) = self.held.insert(key.to_string(), rv) {
            self.violation(format!("on_add of {key}@{rv}, already held at {held}"));
        }
    }

    /// `on_update(key @ old → new)`.
    pub fn update(&mut self, key: &str, old: u64, new: u64) {
        self.notifications += 1;
        match self.held.insert(key.to_string(), new) {
            None => self.violation(format!("on_update of {key} ({old} → {new}), never added")),
            Some(held) if held != old => self.violation(format!(
                "on_update of {key} from {old}, but the handler last heard {held}: a lost notification"
            )),
            Some(_) if new < old => {
                self.went_back += 1;
                if self.examples.len() < MAX_EXAMPLES {
                    self.examples
                        .push(format!("on_update of {key} went back from {old} to {new}"));
                }
            }
            Some(_) => {}
        }
    }

    /// `on_delete(key)`.
    pub fn delete(&mut self, key: &str) {
        self.notifications += 1;
        if self.held.remove(key).is_none() {
            self.violation(format!("on_delete of {key}, never added"));
        }
    }

    /// The keys held now.
    pub fn held(&self) -> &BTreeMap<String, u64> {
        &self.held
    }

    /// `Ok` when no rule was broken and the handler holds exactly `expected`; otherwise what
    /// went wrong.
    pub fn judge(&self, expected: &BTreeMap<String, u64>) -> Result<(), LedgerVerdict> {
        self.judge_with(expected, false)
    }

    /// [`Ledger::judge`] for a run in which the server lost its state: versions that went
    /// back are not violations.
    pub fn judge_after_lost_state(
        &self,
        expected: &BTreeMap<String, u64>,
    ) -> Result<(), LedgerVerdict> {
        self.judge_with(expected, true)
    }

    fn judge_with(
        &self,
        expected: &BTreeMap<String, u64>,
        versions_may_go_back: bool,
    ) -> Result<(), LedgerVerdict> {
        let violations = self.violations
            + if versions_may_go_back {
                0
            } else {
                self.went_back
            };
        let mut differences = Vec::new();
        let mut different = 0usize;
        for (key, rv) in expected {
            let held = self.held.get(key);
            if held != Some(rv) {
                different += 1;
                if differences.len() < MAX_EXAMPLES {
                    differences.push(format!("{key}: server {rv}, handler {held:?}"));
                }
            }
        }
        for (key, rv) in &self.held {
            if !expected.contains_key(key) {
                different += 1;
                if differences.len() < MAX_EXAMPLES {
                    differences.push(format!("{key}: handler {rv}, not on the server"));
                }
            }
        }
        if violations == 0 && different == 0 {
            return Ok(());
        }
        Err(LedgerVerdict {
            violations,
            examples: self.examples.clone(),
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
}
