//! The verdict of a run through the informer, per handler: what each handler must hear
//! ([`Plan`]), what it heard, checked notification by notification ([`HandlerRecord`]), and
//! whether it ends knowing the server's final state ([`judge`]).
//!
//! The per-key rules are the [verdict ledger's](crate::judging::handler_ledger) (adds and deletes
//! alternate, an update's `old` and a delete's object are the state last told, versions never
//! go back, the final state is the server's), over dense pod ids. On top of them:
//!
//! - a key's first notification is `on_add(initial=true)` exactly when the key was in the
//!   informer's initial list (the churn starts after the informer has synced, so this is exact).

pub use crate::judging::handler_ledger::{same_state, KeyView};
use crate::judging::handler_ledger::{Id, KeyLedger};
use std::time::Duration;

use crate::judging::verdict::Verdict;
use crate::result::HandlerResult;
use workloads::{Generated, Op};

/// What a run through the informer must do, worked out from the generated ops.
#[derive(Debug, Clone)]
pub struct Plan {
    /// How many leading ops are the initial population (written before the informer starts).
    pub initial_ops: usize,
    /// By pod id: the key is in the informer's initial list.
    pub in_initial_list: Vec<bool>,
    /// By pod id: the final state (a deleted key keeps the version it was deleted at).
    pub final_views: Vec<KeyView>,
}

impl Plan {
    /// The plan of `gen`: its leading adds (or its first relist) are the initial population.
    pub fn of(gen: &Generated) -> Self {
        let keys = gen.universe.keys.len();
        let initial_ops = match gen.ops.first() {
            Some(Op::Replace(_)) => 1,
            _ => gen
                .ops
                .iter()
                .take_while(|op| matches!(op, Op::Add(_)))
                .count(),
        };
        let mut views = vec![KeyView::default(); keys];
        let mut in_initial_list = vec![false; keys];
        for (n, op) in gen.ops.iter().enumerate() {
            apply_to_views(&mut views, op);
            if n + 1 == initial_ops {
                for (flag, view) in in_initial_list.iter_mut().zip(&views) {
                    *flag = view.alive;
                }
            }
        }
        Self {
            initial_ops,
            in_initial_list,
            final_views: views,
        }
    }
}

/// What `op` does to the state of every key.
fn apply_to_views(views: &mut [KeyView], op: &Op) {
    match op {
        Op::Add(p) | Op::Update(p) => {
            views[p.id as usize] = KeyView {
                version: p.version,
                alive: true,
            };
        }
        Op::Delete(p) => {
            views[p.id as usize] = KeyView {
                version: p.version,
                alive: false,
            };
        }
        Op::Replace(relist) => {
            let mut listed = vec![false; views.len()];
            for p in &relist.objects {
                listed[p.id as usize] = true;
                views[p.id as usize] = KeyView {
                    version: p.version,
                    alive: true,
                };
            }
            for (view, listed) in views.iter_mut().zip(listed) {
                if !listed {
                    view.alive = false;
                }
            }
        }
        Op::Resync => {}
    }
}

/// What one handler heard, checked notification by notification: the [`KeyLedger`]'s rules
/// over dense pod ids, plus the informer path's own: the initial-list flag and tombstones.
///
/// Its methods take what a notification says about a key (its id, versions, the initial
/// flag) so that a test can feed it a sequence by hand.
#[derive(Debug, Clone, Default)]
pub struct HandlerRecord {
    /// By pod id: the key as this handler last heard of it, and the rules it broke.
    pub ledger: KeyLedger<Vec<KeyView>>,
    /// `on_add` calls with the initial-list flag set.
    pub initial_adds: u64,
    /// `on_delete` calls with a tombstone (a deletion learnt from a relist).
    pub tombstones: u64,
}

impl HandlerRecord {
    /// A record of `keys` keys, none heard of.
    pub fn new(keys: usize) -> Self {
        Self {
            ledger: KeyLedger::new(vec![KeyView::default(); keys]),
            ..Self::default()
        }
    }

    /// A record of `keys` keys for a handler that coalesces when full: it may skip
    /// intermediate states ([`KeyLedger::coalescing`]), and an initial-list add that was
    /// deleted before it was heard is not heard at all.
    pub fn coalescing(keys: usize) -> Self {
        let mut record = Self::new(keys);
        record.ledger.coalescing = true;
        record
    }

    /// By pod id: each key as this handler last heard of it.
    pub fn views(&self) -> &[KeyView] {
        &self.ledger.keys
    }

    /// Handler calls.
    pub fn notifications(&self) -> u64 {
        self.ledger.notifications
    }

    /// `on_delete` with a tombstone that carries no state: the handler cannot tell which key
    /// version went away (the informer's store knew the key, so this must not happen).
    pub fn stateless_tombstone(&mut self, key: &str) {
        self.ledger.notifications += 1;
        self.tombstones += 1;
        (self.ledger).violate("tombstone without a state", || format!("key {key}"));
    }

    /// `on_add(version, initial)` for key `id`; `in_initial_list`: the key was listed first.
    pub fn add(&mut self, id: usize, version: u64, initial: bool, in_initial_list: bool) {
        let view = self.ledger.add(&Id(id), version);
        let want_initial = in_initial_list && view.version == 0;
        // A coalescing handler may not hear a listed key's initial add (added and deleted
        // before it was heard): the key's next add then comes without the flag.
        let excused = self.ledger.coalescing && !initial;
        if initial != want_initial && !excused {
            self.ledger.violate("initial-list flag", || {
                format!("key #{id} v{version}: on_add initial={initial}, expected {want_initial}")
            });
        }
        self.initial_adds += u64::from(initial);
    }

    /// `on_update(old, new)` for key `id`.
    pub fn update(&mut self, id: usize, old: u64, new: u64) {
        self.ledger.update(&Id(id), old, new);
    }

    /// `on_delete` of key `id` carrying `version` (a tombstone's last known state, or the
    /// deleted object).
    pub fn delete(&mut self, id: usize, version: u64, tombstone: bool) {
        self.tombstones += u64::from(tombstone);
        self.ledger.delete(&Id(id), Some(version));
    }
}

/// Judges one handler: no per-key rule broken, every initial-list key announced once as such,
/// and a final view equal to the server's final state (`server_final`, by pod id).
pub fn judge(
    record: &HandlerRecord,
    in_initial_list: &[bool],
    server_final: &[KeyView],
) -> Verdict {
    let listed = in_initial_list.iter().filter(|&&f| f).count() as u64;
    let initial_ok = if record.ledger.coalescing {
        record.initial_adds <= listed
    } else {
        record.initial_adds == listed
    };
    let mut failures = Vec::new();
    if !initial_ok {
        failures.push(format!(
            "initial-list adds: {} heard, {listed} objects listed",
            record.initial_adds
        ));
    }
    if record.views().len() != server_final.len() {
        failures.push(format!(
            "the handler knows {} keys, the server {}",
            record.views().len(),
            server_final.len()
        ));
    }
    failures.extend(record.ledger.failures(&server_final.to_vec(), &[]));
    Verdict::from_failures(failures)
}

/// Judges handler `h` of a run that followed `plan` ([`judge`], against `server_final`) and
/// makes its row of the report (its buffer's figures empty, not slow); its failures go to
/// `failures` too, after `prefix`.
pub fn handler_result(
    h: usize,
    (record, caught_up): &(HandlerRecord, Option<Duration>),
    plan: &Plan,
    server_final: &[KeyView],
    prefix: &str,
    failures: &mut Vec<String>,
) -> HandlerResult {
    let verdict = judge(record, &plan.in_initial_list, server_final);
    failures.extend(verdict.failures().iter().map(|f| format!("{prefix}{f}")));
    HandlerResult {
        handler: h,
        slow: false,
        notifications: record.notifications(),
        tombstones: record.tombstones,
        caught_up_s: caught_up.map(|d| d.as_secs_f64()),
        peak_pending: 0,
        waits: 0,
        merged: 0,
        verdict: verdict.summary(),
        failures: verdict.failures().to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use workloads::{generate, Workload, WorkloadSpec};

    fn tiny(w: Workload) -> Generated {
        generate(&WorkloadSpec::new(w).keys(200).events(3_000))
    }

    #[test]
    fn the_plan_takes_the_leading_adds_or_the_first_relist_as_the_initial_list() {
        let w1 = Plan::of(&tiny(Workload::W1));
        assert_eq!(w1.initial_ops, 200);
        assert!(w1.in_initial_list.iter().all(|&f| f));
        let w3 = Plan::of(&tiny(Workload::W3));
        assert_eq!(w3.initial_ops, 1);
        assert!(w3.in_initial_list.iter().all(|&f| f));
        assert!(
            w3.final_views.iter().any(|v| !v.alive),
            "W3's relists leave some keys out"
        );
    }

    #[test]
    fn a_coalescing_handler_may_skip_states_but_not_reorder_them() {
        // Key 0: heard at v1, its updates to v2 and v3 merged into the deletion of v3.
        // Key 1: listed, added and deleted unheard, then added again (without the flag).
        let heard = |r: &mut HandlerRecord| {
            r.add(0, 1, true, true);
            r.delete(0, 3, false);
            r.add(1, 5, false, true);
        };
        let mut strict = HandlerRecord::new(2);
        heard(&mut strict);
        assert!(strict.ledger.violations.contains_key("missed notification"));
        assert!(strict.ledger.violations.contains_key("initial-list flag"));
        let mut coalescing = HandlerRecord::coalescing(2);
        heard(&mut coalescing);
        assert!(
            coalescing.ledger.violations.is_empty(),
            "{:?}",
            coalescing.ledger.examples
        );
        let server = [
            KeyView::default(),
            KeyView {
                version: 5,
                alive: true,
            },
        ];
        assert!(judge(&coalescing, &[true, true], &server).is_ok());
        assert!(!judge(&strict, &[true, true], &server).is_ok());
        // Going back stays a violation, coalescing or not.
        coalescing.update(1, 5, 4);
        assert!(coalescing
            .ledger
            .violations
            .contains_key("version went back"));
    }

    #[test]
    fn a_sequence_heard_in_order_breaks_no_rule() {
        let mut r = HandlerRecord::new(2);
        r.add(0, 1, true, true);
        r.update(0, 1, 2);
        r.update(0, 2, 2);
        r.delete(0, 2, false);
        r.add(0, 3, false, true);
        r.add(1, 4, false, false);
        r.delete(1, 4, true);
        assert!(r.ledger.violations.is_empty(), "{:?}", r.ledger.examples);
        let server = [
            KeyView {
                version: 3,
                alive: true,
            },
            KeyView {
                version: 4,
                alive: false,
            },
        ];
        let verdict = judge(&r, &[true, false], &server);
        assert!(verdict.is_ok(), "{verdict}");
    }

    #[test]
    fn every_rule_is_caught() {
        let mut r = HandlerRecord::new(1);
        r.add(0, 1, false, true); // the initial flag is missing
        r.add(0, 2, false, true); // added twice
        r.update(0, 3, 4); // v3 was never heard
        r.delete(0, 1, false); // an old state
        r.update(0, 4, 5); // while absent
        let kinds: Vec<&str> = r.ledger.violations.keys().copied().collect();
        assert_eq!(
            kinds,
            [
                "add of a present key",
                "initial-list flag",
                "missed notification",
                "update of an absent key",
                "version went back"
            ]
        );
    }
}
