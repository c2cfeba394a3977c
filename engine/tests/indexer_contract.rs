//! The indexer contract (client-go's `threadSafeMap` and `storeIndex`, docs/semantics.md), checked
//! through the public `Store`/`Indexer`/`KnownObjects` API on both engines.
//!
//! Every rule is one generic function over `I: Indexer<Pod>` that builds its indexer with the
//! constructor it is given; [`for_both_engines!`] turns each into a `#[test]` in the module
//! `reference`, one in the module `sharded` (`reference::update_moves_the_key_...`), so a
//! rule cannot be checked on one engine and forgotten on the other, and one in
//! `sharded_guarded`, where the sharded indexer answers through its borrowed reads
//! ([`indexer_guarded::Guarded`]). What only borrowed reads can show (a borrowed object
//! outlives its replacement) is checked at the end. What only one engine's
//! private state can show (its maps never keep an empty set, the sharded state swap) is tested
//! next to that state, in the engine's own `tests` module.

use std::fmt::Debug;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kcache::{IndexError, IndexFunc, Indexer, Indexers, Key, KeyError, KeyFn, Store};

mod indexer_guarded;
use indexer_guarded::Guarded;

/// A pod: identity, a namespace and one or two nodes (an object with two index values).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pod {
    ns: &'static str,
    name: &'static str,
    nodes: &'static [&'static str],
}

/// An engine's constructor: `reference::IndexedStore::new` or `sharded::IndexedStore::new`.
type New<I> = fn(KeyFn<Pod>, Indexers<Pod>) -> I;

fn pod(ns: &'static str, name: &'static str, nodes: &'static [&'static str]) -> Arc<Pod> {
    Arc::new(Pod { ns, name, nodes })
}

/// `ns/name`; a pod without a name has no key.
fn key_fn() -> KeyFn<Pod> {
    Arc::new(|p: &Pod| {
        if p.name.is_empty() {
            Err(KeyError::new("no name"))
        } else {
            Ok(Key::new(&format!("{}/{}", p.ns, p.name)))
        }
    })
}

fn by_ns() -> IndexFunc<Pod> {
    Arc::new(|p: &Pod| [Key::new(p.ns)].into_iter().collect())
}

fn by_node() -> IndexFunc<Pod> {
    Arc::new(|p: &Pod| p.nodes.iter().map(|n| Key::new(n)).collect())
}

/// The index names of [`indexer`].
const NAMES: [&str; 2] = ["namespace", "node"];

/// An empty indexer with the `namespace` and `node` indexes.
fn indexer<I>(new: New<I>) -> I {
    new(
        key_fn(),
        vec![("namespace".into(), by_ns()), ("node".into(), by_node())],
    )
}

fn sorted_keys(keys: Vec<Key>) -> Vec<String> {
    let mut names: Vec<String> = keys.iter().map(|k| k.as_str().to_owned()).collect();
    names.sort();
    names
}

fn sorted_names(objs: Vec<Arc<Pod>>) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = objs.iter().map(|p| p.name).collect();
    names.sort_unstable();
    names
}

/// No index keeps an empty set, as far as the API can tell: every value an index lists has at
/// least one key. (Each engine also checks its private maps directly, in its own tests.)
fn assert_no_empty_sets<I: Indexer<Pod>>(idx: &I) {
    for name in NAMES {
        for value in idx.list_index_func_values(name).unwrap() {
            assert!(
                !idx.index_keys(name, value.as_str()).unwrap().is_empty(),
                "{name}: {value} lists an empty set"
            );
        }
    }
}

/// Instantiates every listed rule as a `#[test]` on each engine: `reference::<rule>`,
/// `sharded::<rule>` and `sharded_guarded::<rule>`.
macro_rules! for_both_engines {
    ($($rule:ident),+ $(,)?) => {
        mod reference {
            $(
                #[test]
                fn $rule() {
                    super::$rule(kcache::reference::IndexedStore::new);
                }
            )+
        }

        mod sharded {
            $(
                #[test]
                fn $rule() {
                    super::$rule(kcache::sharded::IndexedStore::new);
                }
            )+
        }

        mod sharded_guarded {
            $(
                #[test]
                fn $rule() {
                    super::$rule(super::Guarded::new);
                }
            )+
        }
    };
}

for_both_engines!(
    add_stores_and_indexes_the_object,
    update_moves_the_key_between_index_values,
    update_keeping_one_of_two_values_moves_only_the_other,
    update_with_unchanged_values_returns_the_old_object_and_keeps_the_index,
    emptied_index_sets_are_removed,
    delete_unindexes_the_object,
    unknown_index_is_an_error_for_every_query,
    index_returns_the_union_over_the_objects_values,
    add_indexers_after_data_indexes_existing_items,
    add_indexers_conflict_is_refused_and_changes_nothing,
    new_with_a_repeated_name_keeps_the_later_function,
    replace_swaps_items_and_rebuilds_indices,
    replace_with_a_key_error_changes_nothing,
    key_errors_are_returned_by_add_and_delete,
    debug_shows_counts_only,
    a_panicking_index_function_changes_nothing,
    visits_see_what_list_keys_and_get_by_key_see,
    a_long_walk_visits_every_object_once,
    prefetch_is_a_hint_that_changes_nothing,
);

/// `KnownObjects::prefetch` (what the sharded queue asks of the store for the keys it is about
/// to hand out) reads nothing a caller can see change and changes nothing, at every step, for
/// stored and absent keys, in an empty store and across a replace.
fn prefetch_is_a_hint_that_changes_nothing<I: Indexer<Pod>>(new: New<I>) {
    use kcache::{KnownObjects, PrefetchStep};
    let steps = [
        PrefetchStep::Table,
        PrefetchStep::Entry,
        PrefetchStep::Object,
    ];
    let ask_everything = |idx: &I| {
        for name in ["a/p1", "a/p2", "b/p3", "absent/x", ""] {
            for step in steps {
                KnownObjects::prefetch(idx, &Key::new(name), step);
            }
        }
    };
    let idx = indexer(new);
    ask_everything(&idx);
    assert!(idx.is_empty());
    for (ns, name) in [("a", "p1"), ("a", "p2"), ("b", "p3")] {
        idx.add(pod(ns, name, &["n1"])).unwrap();
    }
    ask_everything(&idx);
    assert_eq!(sorted_keys(idx.list_keys()), ["a/p1", "a/p2", "b/p3"]);
    assert_eq!(
        sorted_names(idx.by_index("node", "n1").unwrap()),
        ["p1", "p2", "p3"]
    );
    assert_eq!(
        sorted_names(idx.by_index("namespace", "a").unwrap()),
        ["p1", "p2"]
    );
    // Writes after it land as usual.
    idx.update(pod("a", "p1", &["n2"])).unwrap();
    ask_everything(&idx);
    assert_eq!(sorted_names(idx.by_index("node", "n2").unwrap()), ["p1"]);
    idx.replace(vec![pod("c", "p9", &["n3"])]).unwrap();
    ask_everything(&idx);
    assert_eq!(sorted_keys(idx.list_keys()), ["c/p9"]);
    assert_eq!(sorted_names(idx.by_index("node", "n3").unwrap()), ["p9"]);
    assert_no_empty_sets(&idx);
}

/// `visit_keys` and `visit_objects` (what a queue walks the store with) see every key once,
/// with the object `get_by_key` returns; an object lent to `visit_objects` can be kept past the
/// walk and past its removal from the store.
fn visits_see_what_list_keys_and_get_by_key_see<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    for (ns, name) in [("a", "p1"), ("a", "p2"), ("b", "p3"), ("b", "p4")] {
        idx.add(pod(ns, name, &["n1"])).unwrap();
    }
    idx.update(pod("a", "p2", &["n2"])).unwrap();
    idx.delete(&pod("b", "p3", &[])).unwrap();

    let mut visited_keys = Vec::new();
    idx.visit_keys(&mut |key| visited_keys.push(key.clone()));
    assert_eq!(sorted_keys(visited_keys), sorted_keys(idx.list_keys()));

    let mut visited = Vec::new();
    idx.visit_objects(&mut |key, obj| visited.push((key.clone(), Arc::clone(obj))));
    visited.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        sorted_keys(visited.iter().map(|(key, _)| key.clone()).collect()),
        ["a/p1", "a/p2", "b/p4"]
    );
    for (key, obj) in &visited {
        assert_eq!(Some(obj), idx.get_by_key(key).as_ref(), "{key}");
    }
    assert_eq!(visited[1].1.nodes, ["n2"], "the updated object");

    idx.delete(&pod("a", "p1", &[])).unwrap();
    idx.update(pod("a", "p2", &["n3"])).unwrap();
    assert_eq!((visited[0].1.name, visited[1].1.nodes), ("p1", &["n2"][..]));
}

/// A walk over many keys (every items shard, far longer than the sharded walk's look-ahead)
/// visits each key once, with its current object.
fn a_long_walk_visits_every_object_once<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    let names: Vec<&'static str> = (0..2_000).map(|i| &*format!("p{i}").leak()).collect();
    for name in &names {
        idx.add(pod("a", name, &["n1"])).unwrap();
    }
    for name in names.iter().step_by(3) {
        idx.update(pod("a", name, &["n2"])).unwrap();
    }
    let mut visited = Vec::new();
    idx.visit_objects(&mut |key, obj| visited.push((key.clone(), Arc::clone(obj))));
    assert_eq!(visited.len(), names.len(), "each key once");
    visited.sort_by(|a, b| a.0.cmp(&b.0));
    visited.dedup_by(|a, b| a.0 == b.0);
    assert_eq!(visited.len(), names.len(), "no key twice");
    for (key, obj) in &visited {
        assert_eq!(
            key.as_ref(),
            format!("a/{}", obj.name),
            "the key's own object"
        );
        let updated = obj.name[1..].parse::<usize>().unwrap() % 3 == 0;
        assert_eq!(obj.nodes, [if updated { "n2" } else { "n1" }], "{key}");
    }
}

fn add_stores_and_indexes_the_object<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    assert_eq!(idx.len(), 1);
    assert_eq!(idx.get_by_key(&Key::new("a/p1")).unwrap().name, "p1");
    assert_eq!(
        sorted_keys(idx.index_keys("namespace", "a").unwrap()),
        ["a/p1"]
    );
    assert_eq!(sorted_names(idx.by_index("node", "n1").unwrap()), ["p1"]);
    assert_eq!(sorted_keys(idx.list_keys()), ["a/p1"]);
    assert_eq!(sorted_names(idx.list()), ["p1"]);
}

fn update_moves_the_key_between_index_values<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    idx.update(pod("a", "p1", &["n2"])).unwrap();
    assert!(idx.index_keys("node", "n1").unwrap().is_empty());
    assert_eq!(sorted_keys(idx.index_keys("node", "n2").unwrap()), ["a/p1"]);
    assert_eq!(
        sorted_keys(idx.list_index_func_values("node").unwrap()),
        ["n2"]
    );
    assert_no_empty_sets(&idx);
}

fn update_keeping_one_of_two_values_moves_only_the_other<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "p1", &["n1", "n2"])).unwrap();
    idx.update(pod("a", "p1", &["n2", "n3"])).unwrap();
    assert_eq!(
        sorted_keys(idx.list_index_func_values("node").unwrap()),
        ["n2", "n3"]
    );
    assert_eq!(sorted_keys(idx.index_keys("node", "n2").unwrap()), ["a/p1"]);
    assert_eq!(sorted_keys(idx.index_keys("node", "n3").unwrap()), ["a/p1"]);
}

fn update_with_unchanged_values_returns_the_old_object_and_keeps_the_index<I: Indexer<Pod>>(
    new: New<I>,
) {
    let idx = indexer(new);
    let first = pod("a", "p1", &["n1", "n2"]);
    idx.add(Arc::clone(&first)).unwrap();
    let old = idx.insert_by_key(Key::new("a/p1"), pod("a", "p1", &["n1", "n2"]));
    let old = old.expect("insert_by_key returns the previous object");
    assert!(Arc::ptr_eq(&old, &first));
    assert_eq!(sorted_keys(idx.index_keys("node", "n1").unwrap()), ["a/p1"]);
    assert_eq!(sorted_keys(idx.index_keys("node", "n2").unwrap()), ["a/p1"]);
}

fn emptied_index_sets_are_removed<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    idx.add(pod("a", "p2", &["n1"])).unwrap();
    idx.update(pod("a", "p1", &["n2"])).unwrap();
    idx.delete(&pod("a", "p2", &["n1"])).unwrap();
    assert_no_empty_sets(&idx);
    assert_eq!(
        sorted_keys(idx.list_index_func_values("node").unwrap()),
        ["n2"]
    );
}

fn delete_unindexes_the_object<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "p1", &["n1", "n2"])).unwrap();
    let removed = idx.remove_by_key(&Key::new("a/p1"));
    assert_eq!(removed.unwrap().name, "p1");
    assert!(idx.is_empty());
    assert!(idx.list_index_func_values("node").unwrap().is_empty());
    assert!(idx.list_index_func_values("namespace").unwrap().is_empty());
    assert!(idx.remove_by_key(&Key::new("a/p1")).is_none());
}

fn unknown_index_is_an_error_for_every_query<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    let unknown = IndexError::UnknownIndex("zone".into());
    assert_eq!(idx.by_index("zone", "z").unwrap_err(), unknown);
    assert_eq!(idx.index_keys("zone", "z").unwrap_err(), unknown);
    assert_eq!(idx.list_index_func_values("zone").unwrap_err(), unknown);
    assert_eq!(
        idx.index("zone", &pod("a", "p1", &["n1"])).unwrap_err(),
        unknown
    );
}

fn index_returns_the_union_over_the_objects_values<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    idx.add(pod("a", "p2", &["n2"])).unwrap();
    idx.add(pod("a", "p3", &["n1", "n2"])).unwrap();
    idx.add(pod("a", "p4", &["n3"])).unwrap();
    let probe = pod("x", "probe", &["n1", "n2"]);
    assert_eq!(
        sorted_names(idx.index("node", &probe).unwrap()),
        ["p1", "p2", "p3"]
    );
    let single = pod("x", "probe", &["n3"]);
    assert_eq!(sorted_names(idx.index("node", &single).unwrap()), ["p4"]);
}

fn add_indexers_after_data_indexes_existing_items<I: Indexer<Pod>>(new: New<I>) {
    let idx = new(key_fn(), vec![("namespace".into(), by_ns())]);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    idx.add(pod("b", "p2", &["n1", "n2"])).unwrap();
    idx.add_indexers(vec![("node".into(), by_node())]).unwrap();
    assert_eq!(
        sorted_names(idx.by_index("node", "n1").unwrap()),
        ["p1", "p2"]
    );
    assert_eq!(sorted_names(idx.by_index("node", "n2").unwrap()), ["p2"]);
    // The indexes that were there keep working.
    assert_eq!(
        sorted_keys(idx.index_keys("namespace", "b").unwrap()),
        ["b/p2"]
    );
    // And the new index follows later writes.
    idx.delete(&pod("b", "p2", &[])).unwrap();
    assert!(idx.index_keys("node", "n2").unwrap().is_empty());
    assert_no_empty_sets(&idx);
}

fn add_indexers_conflict_is_refused_and_changes_nothing<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    let err = idx
        .add_indexers(vec![("zone".into(), by_ns()), ("node".into(), by_ns())])
        .unwrap_err();
    assert_eq!(err, IndexError::Conflict("node".into()));
    assert!(idx.index_keys("zone", "a").is_err(), "zone was not added");
    let twice = idx
        .add_indexers(vec![("zone".into(), by_ns()), ("zone".into(), by_ns())])
        .unwrap_err();
    assert_eq!(twice, IndexError::Conflict("zone".into()));
    assert_eq!(sorted_keys(idx.index_keys("node", "n1").unwrap()), ["a/p1"]);
}

fn new_with_a_repeated_name_keeps_the_later_function<I: Indexer<Pod>>(new: New<I>) {
    let idx = new(
        key_fn(),
        vec![("x".into(), by_ns()), ("x".into(), by_node())],
    );
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    assert_eq!(
        sorted_keys(idx.list_index_func_values("x").unwrap()),
        ["n1"]
    );
}

fn replace_swaps_items_and_rebuilds_indices<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "old", &["n1"])).unwrap();
    idx.add(pod("a", "kept", &["n1"])).unwrap();
    idx.replace(vec![
        pod("a", "kept", &["n2"]),
        pod("b", "new", &["n2"]),
        pod("b", "new", &["n3"]), // a repeated key: the later object wins
    ])
    .unwrap();
    assert_eq!(sorted_keys(idx.list_keys()), ["a/kept", "b/new"]);
    assert_eq!(
        sorted_keys(idx.list_index_func_values("node").unwrap()),
        ["n2", "n3"]
    );
    assert_eq!(sorted_names(idx.by_index("node", "n2").unwrap()), ["kept"]);
    assert_eq!(sorted_names(idx.by_index("node", "n3").unwrap()), ["new"]);
    assert_eq!(
        sorted_keys(idx.list_index_func_values("namespace").unwrap()),
        ["a", "b"]
    );
    assert_no_empty_sets(&idx);
}

fn replace_with_a_key_error_changes_nothing<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    let err = idx.replace(vec![pod("a", "p2", &["n2"]), pod("a", "", &["n2"])]);
    assert!(err.is_err());
    assert_eq!(sorted_keys(idx.list_keys()), ["a/p1"]);
    assert_eq!(
        sorted_keys(idx.list_index_func_values("node").unwrap()),
        ["n1"]
    );
}

fn key_errors_are_returned_by_add_and_delete<I: Indexer<Pod>>(new: New<I>) {
    let idx = indexer(new);
    assert!(idx.add(pod("a", "", &["n1"])).is_err());
    assert!(idx.delete(&pod("a", "", &["n1"])).is_err());
    assert!(idx.is_empty());
}

fn debug_shows_counts_only<I: Indexer<Pod> + Debug>(new: New<I>) {
    let idx = indexer(new);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    let shown = format!("{idx:?}");
    assert!(shown.contains("items: 1"), "{shown}");
    assert!(shown.contains("indexes: 2"), "{shown}");
    assert!(!shown.contains("p1"), "{shown}");
}

/// Items and indices agree exactly: every stored pod is in the set of each of its values, and
/// every key of every set is a stored pod that has that value.
fn assert_items_and_indices_agree<I: Indexer<Pod>>(idx: &I) {
    let index_fns = [("namespace", by_ns()), ("node", by_node())];
    for (name, func) in &index_fns {
        for pod in idx.list() {
            let key = idx.key_of(&pod).unwrap();
            for value in func(&pod) {
                assert!(
                    idx.index_keys(name, value.as_str()).unwrap().contains(&key),
                    "{name}: {key} is stored with {value} but not indexed under it"
                );
            }
        }
        for value in idx.list_index_func_values(name).unwrap() {
            for key in idx.index_keys(name, value.as_str()).unwrap() {
                let pod = idx.get_by_key(&key).expect("an indexed key is stored");
                assert!(
                    func(&pod).contains(&value),
                    "{name}: {key} is indexed under {value}, which its stored object lacks"
                );
            }
        }
    }
    assert_no_empty_sets(idx);
}

/// A panic in an index function (user code) propagates and leaves items and indices as they
/// were: every write computes all the values it needs, the old object's included, first.
fn a_panicking_index_function_changes_nothing<I: Indexer<Pod>>(new: New<I>) {
    let armed = Arc::new(AtomicBool::new(false));
    let node_or_panic: IndexFunc<Pod> = {
        let armed = Arc::clone(&armed);
        Arc::new(move |p: &Pod| {
            let bad = p.nodes.contains(&"bad");
            assert!(
                !(bad && armed.load(Ordering::Relaxed)),
                "index function bug"
            );
            p.nodes.iter().map(|n| Key::new(n)).collect()
        })
    };
    let idx = new(
        key_fn(),
        vec![
            ("namespace".into(), by_ns()),
            ("node".into(), node_or_panic),
        ],
    );
    idx.add(pod("a", "p1", &["bad"])).unwrap();
    idx.add(pod("a", "p2", &["n1"])).unwrap();
    armed.store(true, Ordering::Relaxed);
    let panics = |what: &str, f: &dyn Fn()| {
        assert!(
            catch_unwind(AssertUnwindSafe(f)).is_err(),
            "{what} must panic"
        );
    };
    // The old object's values panic: on update and on delete.
    panics("update of p1", &|| {
        idx.update(pod("a", "p1", &["n2"])).unwrap()
    });
    panics("delete of p1", &|| {
        idx.delete(&pod("a", "p1", &[])).unwrap()
    });
    // The new object's values panic.
    panics("update of p2", &|| {
        idx.update(pod("a", "p2", &["bad"])).unwrap()
    });
    panics("add of p3", &|| idx.add(pod("a", "p3", &["bad"])).unwrap());
    armed.store(false, Ordering::Relaxed);

    assert_items_and_indices_agree(&idx);
    let p1 = idx.get_by_key(&Key::new("a/p1")).unwrap();
    assert_eq!(p1.nodes, ["bad"], "the update of p1 did not happen");
    assert_eq!(idx.get_by_key(&Key::new("a/p2")).unwrap().nodes, ["n1"]);
    assert!(idx.get_by_key(&Key::new("a/p3")).is_none());
    assert_eq!(
        sorted_keys(idx.index_keys("node", "bad").unwrap()),
        ["a/p1"]
    );
    assert!(idx.index_keys("node", "n2").unwrap().is_empty());
    // Still working.
    idx.update(pod("a", "p1", &["n2"])).unwrap();
    idx.delete(&pod("a", "p2", &[])).unwrap();
    assert_items_and_indices_agree(&idx);
    assert_eq!(sorted_keys(idx.index_keys("node", "n2").unwrap()), ["a/p1"]);
}

#[test]
fn a_borrowed_object_outlives_its_replacement_and_removal() {
    let idx = indexer(kcache::sharded::IndexedStore::new);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    idx.add(pod("a", "p2", &["n1"])).unwrap();
    let guard = idx.pin();
    let p1 = guard.get_by_key(&Key::new("a/p1")).unwrap();
    let on_n1 = guard.by_index("node", "n1").unwrap();
    idx.update(pod("a", "p1", &["n2"])).unwrap();
    idx.remove_by_key(&Key::new("a/p2"));
    idx.replace(vec![pod("b", "p3", &["n3"])]).unwrap();
    // What was borrowed is intact...
    assert_eq!(p1.nodes, ["n1"]);
    let mut names: Vec<&str> = on_n1.iter().map(|p| p.name).collect();
    names.sort_unstable();
    assert_eq!(names, ["p1", "p2"]);
    // ...and every later read through the same guard sees every completed write.
    assert!(guard.get_by_key(&Key::new("a/p1")).is_none());
    assert_eq!(guard.by_index("node", "n3").unwrap()[0].name, "p3");
    assert!(guard.by_index("node", "n1").unwrap().is_empty());
    let listed: Vec<&str> = guard.list().iter().map(|p| p.name).collect();
    assert_eq!(listed, ["p3"]);
}

#[test]
fn guarded_reads_refuse_unknown_indexes_and_key_errors() {
    let idx = indexer(kcache::sharded::IndexedStore::new);
    idx.add(pod("a", "p1", &["n1"])).unwrap();
    let mut guard = idx.pin();
    let unknown = IndexError::UnknownIndex("zone".into());
    assert_eq!(guard.by_index("zone", "z").unwrap_err(), unknown);
    assert_eq!(
        guard.index("zone", &pod("a", "p1", &[])).unwrap_err(),
        unknown
    );
    assert!(guard.get(&pod("a", "", &[])).is_err());
    guard.repin();
    assert_eq!(guard.get(&pod("a", "p1", &[])).unwrap().unwrap().name, "p1");
    assert!(format!("{guard:?}").contains("items: 1"));
}
