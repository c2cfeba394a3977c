//! Differential test: the sharded indexer against the reference port (and both against a naive
//! model recomputed from the items), driven by the same random operations.
//!
//! After every step both indexers must hold the same items and give the same answers to every
//! query, for every index name (known or not) and every value of a small universe; so must a
//! third, the sharded indexer answering through its borrowed reads
//! ([`indexer_guarded::Guarded`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kcache::{
    reference, sharded, IndexError, IndexFunc, Indexer, Indexers, Key, KeyError, KeyFn,
    KnownObjects, Store,
};
use proptest::prelude::*;

mod indexer_guarded;
use indexer_guarded::Guarded;

/// A pod with a namespace and one or two nodes (the second may repeat the first).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Obj {
    ns: u8,
    name: u8,
    node: u8,
    extra_node: Option<u8>,
    v: u32,
}

impl Obj {
    fn key(&self) -> String {
        format!("ns-{}/pod-{}", self.ns, self.name)
    }
}

/// Every index name the test uses; `bogus` is never added.
const NAMES: [&str; 5] = ["namespace", "node", "zone", "name", "bogus"];

fn key_fn() -> KeyFn<Obj> {
    Arc::new(|o: &Obj| {
        // A name of 255 stands for an object without identity.
        if o.name == u8::MAX {
            Err(KeyError::new("object has no name"))
        } else {
            Ok(Key::new(&o.key()))
        }
    })
}

fn index_func(name: &str) -> IndexFunc<Obj> {
    match name {
        "namespace" => {
            Arc::new(|o: &Obj| [Key::new(&format!("ns-{}", o.ns))].into_iter().collect())
        }
        "node" => Arc::new(|o: &Obj| {
            let mut values: kcache::IndexValues = [Key::new(&format!("node-{}", o.node))]
                .into_iter()
                .collect();
            if let Some(extra) = o.extra_node {
                values.push(Key::new(&format!("node-{extra}")));
            }
            values
        }),
        "zone" => Arc::new(|o: &Obj| {
            [Key::new(&format!("zone-{}", o.node % 2))]
                .into_iter()
                .collect()
        }),
        // Two distinct functions under one name is how a conflict would slip through.
        "name" => Arc::new(|o: &Obj| [Key::new(&format!("pod-{}", o.name))].into_iter().collect()),
        _ => Arc::new(|_: &Obj| kcache::IndexValues::new()),
    }
}

fn indexers(names: &[&str]) -> Indexers<Obj> {
    names
        .iter()
        .map(|name| (name.to_string(), index_func(name)))
        .collect()
}

/// Every value any index function can give in this test's universe, plus one nobody has.
fn value_universe() -> Vec<String> {
    let mut values = vec!["none".to_string()];
    values.extend((0..3).map(|i| format!("ns-{i}")));
    values.extend((0..4).map(|i| format!("node-{i}")));
    values.extend((0..2).map(|i| format!("zone-{i}")));
    values.extend((0..5).map(|i| format!("pod-{i}")));
    values
}

#[derive(Debug, Clone)]
enum Op {
    Insert(Obj),
    Update(Obj),
    Remove { ns: u8, name: u8 },
    Delete(Obj),
    Replace(Vec<Obj>),
    AddIndexers(Vec<&'static str>),
}

fn obj() -> impl Strategy<Value = Obj> {
    (
        0..3u8,
        0..5u8,
        0..4u8,
        proptest::option::of(0..4u8),
        0..1000u32,
    )
        .prop_map(|(ns, name, node, extra_node, v)| Obj {
            ns,
            name,
            node,
            extra_node,
            v,
        })
}

/// Mostly valid objects, sometimes one the key function refuses.
fn maybe_keyless_obj() -> impl Strategy<Value = Obj> {
    prop_oneof![
        9 => obj(),
        1 => obj().prop_map(|o| Obj { name: u8::MAX, ..o }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let name = prop::sample::select(&["namespace", "node", "zone", "name"][..]);
    prop_oneof![
        8 => maybe_keyless_obj().prop_map(Op::Insert),
        4 => maybe_keyless_obj().prop_map(Op::Update),
        3 => (0..3u8, 0..5u8).prop_map(|(ns, name)| Op::Remove { ns, name }),
        2 => maybe_keyless_obj().prop_map(Op::Delete),
        1 => prop::collection::vec(maybe_keyless_obj(), 0..8).prop_map(Op::Replace),
        1 => prop::collection::vec(name, 0..3).prop_map(Op::AddIndexers),
    ]
}

/// The initial index set: any subset of the four real indexes.
fn initial_names() -> impl Strategy<Value = Vec<&'static str>> {
    prop::sample::subsequence(vec!["namespace", "node", "zone", "name"], 0..=4)
}

fn sorted(keys: Vec<Key>) -> Vec<String> {
    let mut names: Vec<String> = keys.into_iter().map(|k| k.as_str().to_owned()).collect();
    names.sort();
    names
}

fn sorted_objects(objs: Vec<Arc<Obj>>) -> Objects {
    let mut pairs: Vec<(String, u32)> = objs.iter().map(|o| (o.key(), o.v)).collect();
    pairs.sort();
    pairs
}

type Query<T> = Result<T, IndexError>;

/// Objects as sorted `(key, version)` pairs.
type Objects = Vec<(String, u32)>;

/// Everything observable about one indexer, in a comparable form.
#[derive(Debug, PartialEq)]
struct Observed {
    items: Objects,
    keys: Vec<String>,
    len: usize,
    per_index: Vec<(String, Query<Vec<String>>, Vec<IndexQueries>)>,
}

#[derive(Debug, PartialEq)]
struct IndexQueries {
    value: String,
    keys: Query<Vec<String>>,
    objects: Query<Objects>,
}

fn observe<I: Indexer<Obj>>(idx: &I, probes: &[Obj]) -> (Observed, Vec<Query<Objects>>) {
    let mut per_index = Vec::new();
    let mut index_answers = Vec::new();
    for name in NAMES {
        let values = idx.list_index_func_values(name).map(sorted);
        let queries = value_universe()
            .into_iter()
            .map(|value| IndexQueries {
                keys: idx.index_keys(name, &value).map(sorted),
                objects: idx.by_index(name, &value).map(sorted_objects),
                value,
            })
            .collect();
        per_index.push((name.to_string(), values, queries));
        for probe in probes {
            index_answers.push(idx.index(name, probe).map(sorted_objects));
        }
    }
    let observed = Observed {
        items: sorted_objects(idx.list()),
        keys: sorted(idx.list_keys()),
        len: idx.len(),
        per_index,
    };
    (observed, index_answers)
}

/// Checks `observed` against indices recomputed from its own items: catches a bug that both
/// indexers share.
fn check_against_model(observed: &Observed, items: &[Arc<Obj>], names: &BTreeSet<&str>) {
    for (name, values, queries) in &observed.per_index {
        if !names.contains(name.as_str()) {
            assert_eq!(values, &Err(IndexError::UnknownIndex(name.clone())));
            continue;
        }
        let func = index_func(name);
        let mut model: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for obj in items {
            for value in func(obj) {
                model
                    .entry(value.as_str().to_owned())
                    .or_default()
                    .insert(obj.key());
            }
        }
        let model_values: Vec<String> = model.keys().cloned().collect();
        assert_eq!(values.as_ref().unwrap(), &model_values, "values of {name}");
        for query in queries {
            let expected: Vec<String> = model
                .get(&query.value)
                .map(|keys| keys.iter().cloned().collect())
                .unwrap_or_default();
            assert_eq!(
                query.keys.as_ref().unwrap(),
                &expected,
                "{name}={}",
                query.value
            );
        }
    }
}

fn apply<I: Indexer<Obj>>(idx: &I, op: &Op) -> String {
    // The outcome of each call, so that return values are compared too.
    match op {
        Op::Insert(o) => match idx.key_of(o) {
            Ok(key) => format!(
                "{:?}",
                idx.insert_by_key(key, Arc::new(o.clone())).map(|old| old.v)
            ),
            Err(e) => format!("{e}"),
        },
        Op::Update(o) => format!("{:?}", idx.update(Arc::new(o.clone()))),
        Op::Remove { ns, name } => {
            let key = Key::new(&format!("ns-{ns}/pod-{name}"));
            format!("{:?}", idx.remove_by_key(&key).map(|old| old.v))
        }
        Op::Delete(o) => format!("{:?}", idx.delete(o)),
        Op::Replace(list) => {
            format!(
                "{:?}",
                idx.replace(list.iter().cloned().map(Arc::new).collect())
            )
        }
        Op::AddIndexers(names) => format!("{:?}", idx.add_indexers(indexers(names))),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn sharded_indexer_matches_reference_after_every_step(
        initial in initial_names(),
        ops in prop::collection::vec(op(), 1..40),
        probes in prop::collection::vec(obj(), 2),
    ) {
        let reference = reference::IndexedStore::new(key_fn(), indexers(&initial));
        let sharded = sharded::IndexedStore::new(key_fn(), indexers(&initial));
        let guarded = Guarded::new(key_fn(), indexers(&initial));
        let mut names: BTreeSet<&str> = initial.iter().copied().collect();
        for (step, op) in ops.iter().enumerate() {
            let outcome_ref = apply(&reference, op);
            let outcome_sharded = apply(&sharded, op);
            prop_assert_eq!(&outcome_ref, &outcome_sharded, "step {}: {:?}", step, op);
            let outcome_guarded = apply(&guarded, op);
            prop_assert_eq!(&outcome_ref, &outcome_guarded, "step {}: {:?}", step, op);
            if let (Op::AddIndexers(added), "Ok(())") = (op, outcome_ref.as_str()) {
                names.extend(added.iter().copied());
            }
            let (seen_ref, index_ref) = observe(&reference, &probes);
            let (seen_sharded, index_sharded) = observe(&sharded, &probes);
            prop_assert_eq!(&seen_ref, &seen_sharded, "step {}: {:?}", step, op);
            prop_assert_eq!(&index_ref, &index_sharded, "step {}: index() after {:?}", step, op);
            let (seen_guarded, index_guarded) = observe(&guarded, &probes);
            prop_assert_eq!(&seen_ref, &seen_guarded, "step {}: guarded, {:?}", step, op);
            prop_assert_eq!(&index_ref, &index_guarded, "step {}: guarded index() after {:?}", step, op);
            check_against_model(&seen_sharded, &sharded.list(), &names);
            for key in seen_ref.keys.iter() {
                let key = Key::new(key);
                let a = reference.get_by_key(&key).map(|o| o.v);
                let b = sharded.get_by_key(&key).map(|o| o.v);
                prop_assert_eq!(a, b);
                let c = guarded.0.pin().get_by_key(&key).map(|o| o.v);
                prop_assert_eq!(a, c);
            }
        }
    }
}
