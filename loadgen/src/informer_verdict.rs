//! The verdict of a run through the informer, per handler: what each handler must hear
//! ([`Plan`]), what it heard, checked notification by notification ([`HandlerRecord`]), and
//! whether it ends knowing the server's final state ([`judge`]).
//!
//! The rules (docs/informer.md's promises to a handler):
//!
//! - adds and deletes of a key alternate: no add of a present key, no update or delete of an
//!   absent one;
//! - a key's versions never go back, and an update's `old` (a delete's object) is the state
//!   the handler was last told: a missed notification shows up here;
//! - a key's first notification is `on_add(initial=true)` exactly when the key was in the
//!   informer's initial list (the churn starts after the informer has synced, so this is exact);
//! - at the end, the handler knows every key the server holds, at the server's version, and
//!   no other.

use std::collections::BTreeMap;

use crate::verdict::Verdict;
use workloads::{Generated, Op};

/// At most this many violations of one kind are spelled out per handler.
const MAX_EXAMPLES: usize = 3;

/// A key as someone last heard of it: its version (0: never heard of) and whether it exists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyView {
    /// The workload version of the last state heard.
    pub version: u64,
    /// Whether the key exists.
    pub alive: bool,
}

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

/// What one handler heard, checked notification by notification.
///
/// Its methods take what a notification says about a key (its id, versions, the initial
/// flag) so that a test can feed it a sequence by hand.
#[derive(Debug, Clone, Default)]
pub struct HandlerRecord {
    /// By pod id: the key as this handler last heard of it.
    pub views: Vec<KeyView>,
    /// Handler calls.
    pub notifications: u64,
    /// `on_add` calls with the initial-list flag set.
    pub initial_adds: u64,
    /// `on_delete` calls with a tombstone (a deletion learnt from a relist).
    pub tombstones: u64,
    /// Violations of the per-key rules, by kind.
    pub violations: BTreeMap<&'static str, u64>,
    /// The first few violations of each kind, spelled out.
    pub examples: Vec<String>,
    /// The handler coalesces when its buffer is full: it may skip intermediate states, so a
    /// deletion may carry a newer state than the last one heard, and an initial-list add that
    /// was deleted before it was heard is not heard at all. Every other rule holds.
    pub coalescing: bool,
}

impl HandlerRecord {
    /// A record of `keys` keys, none heard of.
    pub fn new(keys: usize) -> Self {
        Self {
            views: vec![KeyView::default(); keys],
            ..Self::default()
        }
    }

    /// A record of `keys` keys for a handler that coalesces when full (see `coalescing`).
    pub fn coalescing(keys: usize) -> Self {
        Self {
            coalescing: true,
            ..Self::new(keys)
        }
    }

    fn violate(&mut self, kind: &'static str, message: impl FnOnce() -> String) {
        let n = self.violations.entry(kind).or_default();
        *n += 1;
        if *n <= MAX_EXAMPLES as u64 {
            self.examples.push(message());
        }
    }

    /// `on_delete` with a tombstone that carries no state: the handler cannot tell which key
    /// version went away (the informer's store knew the key, so this must not happen).
    pub fn stateless_tombstone(&mut self, key: &str) {
        self.notifications += 1;
        self.tombstones += 1;
        self.violate("tombstone without a state", || format!("key {key}"));
    }

    /// `on_add(version, initial)` for key `id`; `in_initial_list`: the key was listed first.
    pub fn add(&mut self, id: usize, version: u64, initial: bool, in_initial_list: bool) {
        self.notifications += 1;
        let view = self.views[id];
        let want_initial = in_initial_list && view.version == 0;
        // A coalescing handler may not hear a listed key's initial add (added and deleted
        // before it was heard): the key's next add then comes without the flag.
        let excused = self.coalescing && !initial;
        if initial != want_initial && !excused {
            self.violate("initial-list flag", || {
                format!("key #{id} v{version}: on_add initial={initial}, expected {want_initial}")
            });
        }
        self.initial_adds += u64::from(initial);
        if view.alive {
            self.violate("add of a present key", || {
                format!(
                    "key #{id}: on_add v{version} while v{} is present",
                    view.version
                )
            });
        }
        if version <= view.version {
            self.violate("version went back", || {
                format!("key #{id}: on_add v{version} after v{}", view.version)
            });
        }
        self.views[id] = KeyView {
            version,
            alive: true,
        };
    }

    /// `on_update(old, new)` for key `id`.
    pub fn update(&mut self, id: usize, old: u64, new: u64) {
        self.notifications += 1;
        let view = self.views[id];
        if !view.alive {
            self.violate("update of an absent key", || {
                format!("key #{id}: on_update v{old}->v{new} while absent")
            });
        }
        if old != view.version {
            self.violate("missed notification", || {
                format!(
                    "key #{id}: on_update from v{old}, but the last state heard is v{}",
                    view.version
                )
            });
        }
        if new < old || new < view.version {
            self.violate("version went back", || {
                format!("key #{id}: on_update v{old}->v{new}")
            });
        }
        self.views[id] = KeyView {
            version: new.max(view.version),
            alive: true,
        };
    }

    /// `on_delete` of key `id` carrying `version` (a tombstone's last known state, or the
    /// deleted object).
    pub fn delete(&mut self, id: usize, version: u64, tombstone: bool) {
        self.notifications += 1;
        self.tombstones += u64::from(tombstone);
        let view = self.views[id];
        if !view.alive {
            self.violate("delete of an absent key", || {
                format!("key #{id}: on_delete v{version} while absent")
            });
        }
        if version != view.version && !(self.coalescing && version > view.version) {
            self.violate("missed notification", || {
                format!(
                    "key #{id}: on_delete of v{version}, but the last state heard is v{}",
                    view.version
                )
            });
        }
        if version < view.version {
            self.violate("version went back", || {
                format!("key #{id}: on_delete of v{version} after v{}", view.version)
            });
        }
        self.views[id] = KeyView {
            version: version.max(view.version),
            alive: false,
        };
    }
}

/// Judges one handler: no per-key rule broken, every initial-list key announced once as such,
/// and a final view equal to the server's final state (`server_final`, by pod id).
pub fn judge(
    record: &HandlerRecord,
    in_initial_list: &[bool],
    server_final: &[KeyView],
) -> Verdict {
    let mut failures = Vec::new();
    for (kind, n) in &record.violations {
        failures.push(format!("{kind}: {n} times"));
    }
    failures.extend(record.examples.iter().cloned());
    let listed = in_initial_list.iter().filter(|&&f| f).count() as u64;
    let initial_ok = if record.coalescing {
        record.initial_adds <= listed
    } else {
        record.initial_adds == listed
    };
    if !initial_ok {
        failures.push(format!(
            "initial-list adds: {} heard, {listed} objects listed",
            record.initial_adds
        ));
    }
    let mut differ = 0usize;
    for (id, (got, want)) in record.views.iter().zip(server_final).enumerate() {
        if !same_state(*got, *want) {
            differ += 1;
            if differ <= MAX_EXAMPLES {
                failures.push(format!(
                    "key #{id}: the handler ends with {}, the server with {}",
                    describe(*got),
                    describe(*want)
                ));
            }
        }
    }
    if record.views.len() != server_final.len() {
        failures.push(format!(
            "the handler knows {} keys, the server {}",
            record.views.len(),
            server_final.len()
        ));
    }
    if differ > 0 {
        failures.push(format!(
            "final state: {differ} keys differ from the server's"
        ));
    }
    Verdict::from_failures(failures)
}

/// Whether a handler that heard `got` knows the state `want`: the same version if the key
/// exists, absent if not. (The version a key was deleted at is not part of its state: a key
/// created and deleted again between two lists is never heard of, as in client-go.)
pub(crate) fn same_state(got: KeyView, want: KeyView) -> bool {
    got.alive == want.alive && (!want.alive || got.version == want.version)
}

fn describe(view: KeyView) -> String {
    if view.alive {
        format!("v{}", view.version)
    } else {
        "no object".to_string()
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
        assert!(strict.violations.contains_key("missed notification"));
        assert!(strict.violations.contains_key("initial-list flag"));
        let mut coalescing = HandlerRecord::coalescing(2);
        heard(&mut coalescing);
        assert!(
            coalescing.violations.is_empty(),
            "{:?}",
            coalescing.examples
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
        assert!(coalescing.violations.contains_key("version went back"));
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
        assert!(r.violations.is_empty(), "{:?}", r.examples);
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
        let kinds: Vec<&str> = r.violations.keys().copied().collect();
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
