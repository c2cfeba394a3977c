//! The correctness verdict: after the drain, does the consumer's indexer equal the generator's
//! model, and was every delta delivered exactly once?
//!
//! [`check`] is a pure function of the model, the store and the consumer's [`Counters`], so a
//! test can corrupt any of the three and watch it fail.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use kcache::{Indexer, Key};

use workloads::{Model, Pod, NAMESPACE_INDEX, NODE_INDEX};

/// What the consumers saw, summed over all consumer threads.
///
/// The kind counts come from the popped deltas; the `on_*` counts from the handler calls that
/// applying them made, so the two sides check each other.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counters {
    /// Keys popped (calls of the pop callback).
    pub pops: u64,
    /// Deltas popped.
    pub deltas: u64,
    /// `Added` deltas.
    pub added: u64,
    /// `Updated` deltas.
    pub updated: u64,
    /// `Deleted` deltas carrying an object.
    pub deleted: u64,
    /// `Deleted` deltas carrying a tombstone.
    pub tombstones: u64,
    /// `Replaced` deltas.
    pub replaced: u64,
    /// `Sync` deltas.
    pub synced: u64,
    /// Handler `on_add` calls.
    pub on_add: u64,
    /// Handler `on_update` calls.
    pub on_update: u64,
    /// Handler `on_delete` calls.
    pub on_delete: u64,
    /// Handler updates whose new object is older than the one it replaces: a key's deltas
    /// came out of order.
    pub version_regressions: u64,
    /// Event objects (`Added`/`Updated`/`Deleted`) delivered a second time.
    pub duplicated: u64,
    /// Queue calls the producer saw fail.
    pub enqueue_errors: u64,
}

impl Counters {
    /// Adds `other` into `self` (merging per-consumer counters).
    pub fn merge(&mut self, other: &Counters) {
        self.pops += other.pops;
        self.deltas += other.deltas;
        self.added += other.added;
        self.updated += other.updated;
        self.deleted += other.deleted;
        self.tombstones += other.tombstones;
        self.replaced += other.replaced;
        self.synced += other.synced;
        self.on_add += other.on_add;
        self.on_update += other.on_update;
        self.on_delete += other.on_delete;
        self.version_regressions += other.version_regressions;
        self.duplicated += other.duplicated;
        self.enqueue_errors += other.enqueue_errors;
    }
}

/// The outcome of [`check`]: `ok`, or every failed rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    failures: Vec<String>,
}

/// At most this many mismatches of one kind are spelled out; the rest are counted.
const MAX_DETAILS: usize = 5;

impl Verdict {
    /// A verdict with these failures (none: ok).
    pub fn from_failures(failures: Vec<String>) -> Self {
        Self { failures }
    }

    /// Whether every rule held.
    pub fn is_ok(&self) -> bool {
        self.failures.is_empty()
    }

    /// What failed, one line per rule (or per mismatch, up to a few of each kind).
    pub fn failures(&self) -> &[String] {
        &self.failures
    }

    /// `ok`, or `FAIL: <first failure> (+N more)`: what the report's `verdict` field holds.
    pub fn summary(&self) -> String {
        match self.failures.as_slice() {
            [] => "ok".to_string(),
            [only] => format!("FAIL: {only}"),
            [first, rest @ ..] => format!("FAIL: {first} (+{} more)", rest.len()),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

/// Collects failures, spelling out only the first few of each kind.
#[derive(Default)]
struct Failures {
    lines: Vec<String>,
    per_kind: BTreeMap<&'static str, usize>,
}

impl Failures {
    fn push(&mut self, kind: &'static str, message: String) {
        let n = self.per_kind.entry(kind).or_default();
        *n += 1;
        if *n <= MAX_DETAILS {
            self.lines.push(message);
        }
    }

    fn expect_eq(&mut self, what: &'static str, got: u64, want: u64) {
        if got != want {
            self.push(what, format!("{what}: got {got}, expected {want}"));
        }
    }

    fn finish(mut self) -> Verdict {
        for (kind, n) in &self.per_kind {
            if *n > MAX_DETAILS {
                self.lines
                    .push(format!("{kind}: {} more not shown", n - MAX_DETAILS));
            }
        }
        Verdict::from_failures(self.lines)
    }
}

/// Judges a finished run (the verdict of docs/workloads.md).
///
/// The store must hold exactly the model's alive keys, each at the model's version with the
/// model's namespace and node; both indexes must list exactly the model's values and, under
/// each, exactly the model's keys. The counters must show every `Added`, `Updated` and
/// `Deleted` the generator enqueued delivered once, every relisted object once, one tombstone
/// per deletion a relist missed, no version going backwards, and handler calls that add up.
pub fn check<S>(model: &Model, store: &S, counters: &Counters) -> Verdict
where
    S: Indexer<Pod> + ?Sized,
{
    check_with(model, store, counters, false)
}

/// [`check`] for a run whose queue may have compacted updates (`--compact-updates`): the
/// final store and indexes must be exactly the same, but a compacted `Updated` or `Replaced`
/// delta is never delivered, so those two counts may fall short of what was enqueued (never
/// exceed it); every other count is checked as by [`check`].
pub fn check_with<S>(model: &Model, store: &S, counters: &Counters, compacted: bool) -> Verdict
where
    S: Indexer<Pod> + ?Sized,
{
    let mut f = Failures::default();
    check_items(model, store, &mut f);
    check_index(
        model,
        store,
        NAMESPACE_INDEX,
        |p| Some(&p.namespace),
        &mut f,
    );
    check_index(model, store, NODE_INDEX, |p| p.node.as_ref(), &mut f);
    check_counters(model, store.len() as u64, counters, compacted, &mut f);
    f.finish()
}

fn check_items<S: Indexer<Pod> + ?Sized>(model: &Model, store: &S, f: &mut Failures) {
    let mut want_keys = BTreeSet::new();
    for pod in model.alive.iter().flatten() {
        want_keys.insert(pod.key.clone());
        match store.get_by_key(&pod.key) {
            None => f.push("missing key", format!("missing key {}", pod.key)),
            Some(got) => {
                if got.version != pod.version {
                    f.push(
                        "wrong version",
                        format!(
                            "key {}: version {} in the store, {} in the model",
                            pod.key, got.version, pod.version
                        ),
                    );
                }
                if got.namespace != pod.namespace || got.node != pod.node {
                    f.push(
                        "wrong object",
                        format!("key {}: namespace or node differ from the model", pod.key),
                    );
                }
            }
        }
    }
    let got_keys: BTreeSet<Key> = store.list_keys().into_iter().collect();
    for extra in got_keys.difference(&want_keys) {
        f.push(
            "extra key",
            format!("extra key {extra} (deleted in the model)"),
        );
    }
    if store.len() != want_keys.len() {
        f.push(
            "store size",
            format!(
                "store holds {} objects, the model {}",
                store.len(),
                want_keys.len()
            ),
        );
    }
}

fn check_index<S, F>(model: &Model, store: &S, index: &'static str, value_of: F, f: &mut Failures)
where
    S: Indexer<Pod> + ?Sized,
    F: Fn(&Pod) -> Option<&Key>,
{
    let mut want: BTreeMap<Key, BTreeSet<Key>> = BTreeMap::new();
    for pod in model.alive.iter().flatten() {
        if let Some(value) = value_of(pod) {
            want.entry(value.clone())
                .or_default()
                .insert(pod.key.clone());
        }
    }
    let values = match store.list_index_func_values(index) {
        Ok(values) => values,
        Err(e) => {
            f.push("index error", format!("index {index}: {e}"));
            return;
        }
    };
    let got_values: BTreeSet<Key> = values.into_iter().collect();
    let want_values: BTreeSet<Key> = want.keys().cloned().collect();
    for v in got_values.difference(&want_values) {
        f.push(
            "index values",
            format!("index {index}: value {v} listed but no object of the model has it"),
        );
    }
    for v in want_values.difference(&got_values) {
        f.push(
            "index values",
            format!("index {index}: value {v} missing from list_index_func_values"),
        );
    }
    // Query every value either side knows, so a value missing from the listing but still
    // answering by_index is caught too.
    for value in want_values.union(&got_values) {
        let got: BTreeSet<Key> = match store.by_index(index, value.as_str()) {
            Ok(objs) => objs.iter().map(|p: &Arc<Pod>| p.key.clone()).collect(),
            Err(e) => {
                f.push("index error", format!("index {index}: {e}"));
                continue;
            }
        };
        let empty = BTreeSet::new();
        let expected = want.get(value).unwrap_or(&empty);
        if &got != expected {
            let missing = expected.difference(&got).count();
            let extra = got.difference(expected).count();
            f.push(
                "index contents",
                format!(
                    "index {index}[{value}]: {} keys, model {} ({missing} missing, {extra} extra)",
                    got.len(),
                    expected.len()
                ),
            );
        }
    }
}

fn check_counters(model: &Model, store_len: u64, c: &Counters, compacted: bool, f: &mut Failures) {
    let e = &model.expected;
    f.expect_eq("Added deltas delivered", c.added, e.added);
    if compacted {
        for (what, delivered, enqueued) in [
            ("Updated deltas delivered", c.updated, e.updated),
            ("Replaced deltas delivered", c.replaced, e.replaced),
        ] {
            if delivered > enqueued {
                f.push(
                    what,
                    format!("{what}: {delivered}, more than the {enqueued} enqueued"),
                );
            }
        }
    } else {
        f.expect_eq("Updated deltas delivered", c.updated, e.updated);
        f.expect_eq("Replaced deltas delivered", c.replaced, e.replaced);
    }
    f.expect_eq("Deleted deltas delivered", c.deleted, e.deleted);
    f.expect_eq("tombstones delivered", c.tombstones, e.tombstones);
    f.expect_eq("version regressions", c.version_regressions, 0);
    f.expect_eq("event objects delivered twice", c.duplicated, 0);
    f.expect_eq("enqueue errors", c.enqueue_errors, 0);
    let kinds = c.added + c.updated + c.deleted + c.tombstones + c.replaced + c.synced;
    f.expect_eq("deltas (sum of kinds)", c.deltas, kinds);
    f.expect_eq(
        "handler calls (one per delta)",
        c.on_add + c.on_update + c.on_delete,
        c.deltas,
    );
    // Each add made a key appear and each delete made one disappear, so what is left is the
    // store's size. (An on_delete for a key not stored would break this: none happens here.)
    if c.on_add.checked_sub(c.on_delete) != Some(store_len) {
        f.push(
            "handler balance",
            format!(
                "handler balance: {} adds - {} deletes != {store_len} objects stored",
                c.on_add, c.on_delete
            ),
        );
    }
    // A queued key always holds at least one delta, so a pop delivers at least one.
    if c.pops > c.deltas {
        f.push(
            "pops",
            format!("{} pops delivered only {} deltas", c.pops, c.deltas),
        );
    }
}
