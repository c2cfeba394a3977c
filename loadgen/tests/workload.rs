//! The generator: determinism, the rules of docs/workloads.md, and the model it keeps.

#![forbid(unsafe_code)]

use std::collections::HashMap;

use workloads::{generate, Generated, Op, Universe, Workload, WorkloadSpec, W3_ROUNDS};

fn small(w: Workload) -> WorkloadSpec {
    WorkloadSpec::new(w).keys(500).events(5_000)
}

/// Everything observable about a stream: op kinds, keys, versions, namespaces and nodes.
fn stream(g: &Generated) -> Vec<(char, String, u64, String, Option<String>)> {
    let mut out = Vec::new();
    for op in &g.ops {
        match op {
            Op::Add(p) | Op::Update(p) | Op::Delete(p) => out.push((
                op.summary().0,
                p.key.to_string(),
                p.version,
                p.namespace.to_string(),
                p.node.as_ref().map(ToString::to_string),
            )),
            Op::Replace(r) => {
                for p in &r.objects {
                    out.push(('R', p.key.to_string(), p.version, String::new(), None));
                }
            }
            Op::Resync => out.push(('S', String::new(), 0, String::new(), None)),
        }
    }
    out
}

#[test]
fn same_seed_gives_identical_event_streams_for_every_workload() {
    for w in Workload::ALL {
        let a = generate(&small(w));
        let b = generate(&small(w));
        assert!(!a.ops.is_empty(), "{w} generated nothing");
        assert_eq!(stream(&a), stream(&b), "{w} is not deterministic");
        assert_eq!(a.model.expected, b.model.expected);
    }
}

#[test]
fn different_seeds_give_different_event_streams() {
    for w in Workload::ALL {
        let a = generate(&small(w).seed(1));
        let b = generate(&small(w).seed(2));
        assert_ne!(stream(&a), stream(&b), "{w}: seeds 1 and 2 agree");
    }
}

#[test]
fn objects_are_named_and_placed_as_the_spec_says() {
    let u = Universe::synthetic(10_000);
    assert_eq!(u.keys[1234].as_str(), "ns-234/pod-1234");
    assert_eq!(u.namespaces.len(), 1000);
    assert_eq!(u.nodes.len(), 5000);
    let g = generate(&WorkloadSpec::new(Workload::W1).keys(10_000).events(0));
    let Op::Add(p) = &g.ops[6234] else {
        panic!("the initial population is all adds");
    };
    assert_eq!(p.key.as_str(), "ns-234/pod-6234");
    assert_eq!(p.namespace.as_str(), "ns-234");
    assert_eq!(p.node.as_ref().map(|n| n.as_str()), Some("node-1234"));
    assert_eq!(p.version, 1);
}

#[test]
fn w1_adds_every_key_at_version_one_then_churns() {
    let keys = 300;
    let g = generate(&WorkloadSpec::new(Workload::W1).keys(keys).events(3_000));
    assert_eq!(g.ops.len(), keys + 3_000);
    for (i, op) in g.ops[..keys].iter().enumerate() {
        assert_eq!(op.summary(), ('A', i as u64, 1));
    }
    assert!(g.ops[keys..]
        .iter()
        .all(|op| matches!(op, Op::Add(_) | Op::Update(_) | Op::Delete(_))));
}

#[test]
fn w1_rule_statistics_match_the_95_5_churn() {
    let (keys, events) = (1_000, 200_000);
    let g = generate(&WorkloadSpec::new(Workload::W1).keys(keys).events(events));
    let churn = &g.ops[keys..];
    let count = |c: char| churn.iter().filter(|op| op.summary().0 == c).count();
    let (adds, updates, deletes) = (count('A'), count('U'), count('D'));
    assert_eq!(adds + updates + deletes, events);
    // A key is alive with probability 1 / 1.05 at steady state, so 95% of that updates.
    let update_share = updates as f64 / events as f64;
    assert!(
        (0.89..0.92).contains(&update_share),
        "updates {update_share}"
    );
    let delete_share = deletes as f64 / events as f64;
    assert!(
        (0.04..0.055).contains(&delete_share),
        "deletes {delete_share}"
    );
    // Deletes and re-adds alternate per key, so what is alive at the end is exact.
    let alive = g.model.alive_count();
    assert_eq!(alive, keys + adds - deletes);
    assert_eq!(g.model.expected.added as usize, keys + adds);
    assert_eq!(g.model.expected.updated as usize, updates);
    assert_eq!(g.model.expected.deleted as usize, deletes);
    // Keys are drawn uniformly: every key is touched about events / keys times.
    let mut touched: HashMap<u64, usize> = HashMap::new();
    for op in churn {
        *touched.entry(op.summary().1).or_default() += 1;
    }
    assert_eq!(touched.len(), keys);
    assert!(touched.values().all(|&n| (120..300).contains(&n)));
}

#[test]
fn versions_grow_per_key_and_the_model_holds_the_last_state() {
    let g = generate(&WorkloadSpec::new(Workload::W1).keys(200).events(20_000));
    let mut last: HashMap<u64, (char, u64)> = HashMap::new();
    for op in &g.ops {
        let (kind, id, version) = op.summary();
        if let Some(&(prev_kind, prev)) = last.get(&id) {
            match kind {
                // A delete repeats the last state; everything else is a new version.
                'D' => assert_eq!(version, prev),
                _ => assert_eq!(version, prev + 1, "key {id} after {prev_kind}"),
            }
            assert!(
                !(prev_kind == 'D' && kind != 'A'),
                "a deleted key can only come back"
            );
        }
        last.insert(id, (kind, version));
    }
    for (id, state) in g.model.alive.iter().enumerate() {
        let (kind, version) = last[&(id as u64)];
        match state {
            Some(p) => {
                assert_ne!(kind, 'D');
                assert_eq!(p.version, version);
            }
            None => assert_eq!(kind, 'D'),
        }
    }
}

#[test]
fn w2_sends_half_the_updates_to_the_first_thousand_keys() {
    let (keys, events) = (100_000, 100_000);
    let g = generate(&WorkloadSpec::new(Workload::W2).keys(keys).events(events));
    let churn = &g.ops[keys..];
    assert!(churn.iter().all(|op| op.summary().0 == 'U'));
    let hot = churn.iter().filter(|op| op.summary().1 < 1000).count();
    let share = hot as f64 / events as f64;
    // 50% aimed at the hot set, plus 1% of the uniform half landing there too.
    assert!((0.49..0.52).contains(&share), "hot share {share}");
    assert_eq!(g.model.alive_count(), keys);
}

#[test]
fn w3_relists_everything_then_runs_rounds_that_miss_one_percent_of_deletions() {
    let (keys, events) = (5_000, 20_000);
    let g = generate(&WorkloadSpec::new(Workload::W3).keys(keys).events(events));
    let Op::Replace(first) = &g.ops[0] else {
        panic!("W3 starts with replace(all)");
    };
    assert_eq!(first.objects.len(), keys);
    let relists: Vec<usize> = g
        .ops
        .iter()
        .enumerate()
        .filter_map(|(i, op)| matches!(op, Op::Replace(_)).then_some(i))
        .collect();
    assert_eq!(relists.len(), W3_ROUNDS + 1);
    for &i in &relists[1..] {
        assert!(
            matches!(g.ops[i + 1], Op::Resync),
            "every relist is followed by a resync"
        );
    }
    let churn = g
        .ops
        .iter()
        .filter(|op| matches!(op, Op::Add(_) | Op::Update(_) | Op::Delete(_)))
        .count();
    assert_eq!(churn, events);
    // About 1% of some 4,800 alive keys per round are dropped by each relist.
    let missed = g.model.expected.tombstones;
    assert!((300..700).contains(&missed), "missed deletions {missed}");
    let Op::Replace(last) = &g.ops[*relists.last().unwrap()] else {
        unreachable!()
    };
    assert_eq!(last.objects.len(), g.model.alive_count());
}

#[test]
fn w4_w5_w6_and_w7_replay_w1s_stream() {
    let w1 = generate(&small(Workload::W1));
    for w in [Workload::W4, Workload::W5, Workload::W6, Workload::W7] {
        assert_eq!(stream(&generate(&small(w))), stream(&w1), "{w}");
    }
}

#[test]
fn workload_names_parse_case_insensitively() {
    assert_eq!("W3".parse::<Workload>(), Ok(Workload::W3));
    assert_eq!("W7".parse::<Workload>(), Ok(Workload::W7));
    assert_eq!("W8".parse::<Workload>(), Ok(Workload::W8));
    assert!("w9".parse::<Workload>().is_err());
}

#[test]
fn the_events_of_the_ops_add_up_to_the_runs_event_count() {
    for w in [Workload::W1, Workload::W2, Workload::W3] {
        let g = generate(&small(w));
        let carried: u64 = g.ops.iter().map(|op| op.events() as u64).sum();
        assert_eq!(carried, g.event_count(), "{w}");
    }
    // A relist carries one event per listed object, a resync none.
    let g = generate(&small(Workload::W3));
    let relist = g
        .ops
        .iter()
        .find(|op| matches!(op, Op::Replace(_)))
        .unwrap();
    assert_eq!(relist.events() as u64, relist.summary().1);
    assert!(g.ops.iter().any(|op| matches!(op, Op::Resync)));
    assert!(g
        .ops
        .iter()
        .filter(|op| matches!(op, Op::Resync))
        .all(|op| op.events() == 0));
}
