//! The verdict: correct runs pass; a corrupted store or corrupted counters fail.

#![forbid(unsafe_code)]

mod common;

use std::sync::Arc;

use kcache::{IndexError, Indexer, Indexers, Key, KeyError, KnownObjects, Store};
use loadgen::engines::{EngineKind, Mode};
use loadgen::harness::driver::{execute, Finished};
use loadgen::judging::verdict::{check, Counters};
use loadgen::progress::NoProgress;
use workloads::{generate, Generated, Pod, Workload, WorkloadSpec};

fn spec(w: Workload) -> WorkloadSpec {
    WorkloadSpec::new(w).keys(400).events(6_000)
}

fn run(engine: EngineKind, w: Workload) -> (Generated, Finished) {
    let gen = generate(&spec(w));
    let cfg = common::engine_config(4, 2, w, std::time::Duration::from_micros(2));
    let done = execute(engine, &gen, Mode::of(w), &cfg, &NoProgress).expect("workload fits");
    (gen, done)
}

/// Asserts the verdict on `done` fails, with a failure that mentions `what`.
fn assert_fails_with(gen: &Generated, done: &Finished, what: &str) {
    let verdict = check(&gen.model, &*done.store, &done.counters);
    assert!(
        verdict.failures().iter().any(|f| f.contains(what)),
        "{verdict}"
    );
}

/// A correct reference run of W1, and one alive and one deleted pod of its model.
fn w1_reference() -> (Generated, Finished, Arc<Pod>, Key) {
    let (gen, done) = run(EngineKind::Reference, Workload::W1);
    let verdict = check(&gen.model, &*done.store, &done.counters);
    assert!(verdict.is_ok(), "uncorrupted run must pass: {verdict}");
    let alive = gen
        .model
        .alive
        .iter()
        .flatten()
        .next()
        .cloned()
        .expect("some key alive");
    let dead = gen
        .model
        .alive
        .iter()
        .position(Option::is_none)
        .map(|id| gen.universe.keys[id].clone())
        .expect("W1 deletes some keys");
    (gen, done, alive, dead)
}

fn pod_like(p: &Pod, version: u64, node: Option<Key>) -> Arc<Pod> {
    Arc::new(Pod::new(
        p.id,
        p.key.clone(),
        p.namespace.clone(),
        node,
        version,
    ))
}

#[test]
fn correct_runs_pass_the_verdict_on_every_workload_and_engine() {
    for engine in EngineKind::ALL {
        for w in Workload::ALL {
            let (gen, done) = run(engine, w);
            let verdict = check(&gen.model, &*done.store, &done.counters);
            assert!(verdict.is_ok(), "{engine} {w}: {:?}", verdict.failures());
            assert_eq!(verdict.summary(), "ok");
            assert_eq!(done.store.len(), gen.model.alive_count());
        }
    }
}

#[test]
fn a_queue_run_counts_every_generated_delta_once() {
    let (gen, done) = run(EngineKind::Reference, Workload::W3);
    let (c, e) = (done.counters, gen.model.expected);
    assert_eq!(
        (c.added, c.updated, c.deleted, c.replaced, c.tombstones),
        (e.added, e.updated, e.deleted, e.replaced, e.tombstones)
    );
    assert!(e.tombstones > 0, "W3 must miss some deletions");
    assert!(c.pops > 0 && c.pops <= c.deltas);
    assert!(!done.latency.is_empty(), "sampled events must be timed");
}

#[test]
fn a_wrong_version_in_the_store_fails_the_verdict() {
    let (gen, done, alive, _) = w1_reference();
    done.store.insert_by_key(
        alive.key.clone(),
        pod_like(&alive, alive.version + 1, alive.node.clone()),
    );
    assert_fails_with(&gen, &done, "version");
}

#[test]
fn a_missing_key_fails_the_verdict() {
    let (gen, done, alive, _) = w1_reference();
    done.store.remove_by_key(&alive.key);
    assert_fails_with(&gen, &done, "missing key");
}

#[test]
fn an_extra_key_fails_the_verdict() {
    let (gen, done, alive, dead) = w1_reference();
    let ghost = Arc::new(Pod::new(0, dead.clone(), alive.namespace.clone(), None, 1));
    done.store.insert_by_key(dead, ghost);
    assert_fails_with(&gen, &done, "extra key");
}

#[test]
fn an_object_indexed_under_the_wrong_node_fails_the_verdict() {
    let (gen, done, alive, _) = w1_reference();
    let moved = pod_like(&alive, alive.version, Some(Key::new("node-elsewhere")));
    done.store.insert_by_key(alive.key.clone(), moved);
    let verdict = check(&gen.model, &*done.store, &done.counters);
    let failures = verdict.failures().join("\n");
    assert!(failures.contains("index node"), "{failures}");
    assert!(failures.contains("node-elsewhere"), "{failures}");
}

/// A store whose items are right but whose `by_index` loses one key: only the index check
/// can see it.
struct LossyIndex {
    inner: Arc<dyn Indexer<Pod>>,
    lost: Key,
}

impl KnownObjects<Pod> for LossyIndex {
    fn list_keys(&self) -> Vec<Key> {
        self.inner.list_keys()
    }
    fn get_by_key(&self, key: &Key) -> Option<Arc<Pod>> {
        self.inner.get_by_key(key)
    }
}

impl Store<Pod> for LossyIndex {
    fn key_of(&self, obj: &Pod) -> Result<Key, KeyError> {
        self.inner.key_of(obj)
    }
    fn insert_by_key(&self, key: Key, obj: Arc<Pod>) -> Option<Arc<Pod>> {
        self.inner.insert_by_key(key, obj)
    }
    fn remove_by_key(&self, key: &Key) -> Option<Arc<Pod>> {
        self.inner.remove_by_key(key)
    }
    fn replace(&self, list: Vec<Arc<Pod>>) -> Result<(), KeyError> {
        self.inner.replace(list)
    }
    fn list(&self) -> Vec<Arc<Pod>> {
        self.inner.list()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
}

impl Indexer<Pod> for LossyIndex {
    fn index(&self, name: &str, obj: &Pod) -> Result<Vec<Arc<Pod>>, IndexError> {
        self.inner.index(name, obj)
    }
    fn index_keys(&self, name: &str, value: &str) -> Result<Vec<Key>, IndexError> {
        self.inner.index_keys(name, value)
    }
    fn by_index(&self, name: &str, value: &str) -> Result<Vec<Arc<Pod>>, IndexError> {
        let mut objs = self.inner.by_index(name, value)?;
        objs.retain(|p| p.key != self.lost);
        Ok(objs)
    }
    fn list_index_func_values(&self, name: &str) -> Result<Vec<Key>, IndexError> {
        self.inner.list_index_func_values(name)
    }
    fn add_indexers(&self, indexers: Indexers<Pod>) -> Result<(), IndexError> {
        self.inner.add_indexers(indexers)
    }
}

#[test]
fn an_index_that_loses_a_key_fails_the_verdict() {
    let (gen, done, alive, _) = w1_reference();
    let lossy = LossyIndex {
        inner: Arc::clone(&done.store),
        lost: alive.key.clone(),
    };
    let verdict = check(&gen.model, &lossy, &done.counters);
    let failures = verdict.failures();
    // Both indexes lose it, and nothing else is wrong.
    assert_eq!(failures.len(), 2, "{failures:?}");
    assert!(failures.iter().any(|f| f.starts_with("index namespace[")));
    assert!(failures.iter().any(|f| f.starts_with("index node[")));
}

/// A corruption of a run's counters, and the start of the failure it must cause.
type Corruption = (fn(&mut Counters), &'static str);

#[test]
fn lost_duplicated_or_regressing_deltas_fail_the_verdict() {
    let (gen, done, _, _) = w1_reference();
    let cases: [Corruption; 6] = [
        (
            |c| {
                c.updated -= 1;
                c.deltas -= 1;
                c.on_update -= 1;
            },
            "Updated deltas",
        ),
        (
            |c| {
                c.added += 1;
                c.deltas += 1;
                c.on_update += 1;
            },
            "Added deltas",
        ),
        (|c| c.duplicated = 1, "event objects delivered twice"),
        (|c| c.version_regressions = 1, "version regressions"),
        (
            |c| {
                c.tombstones += 1;
                c.deltas += 1;
                c.on_delete += 1;
            },
            "tombstones",
        ),
        (
            |c| {
                c.on_add -= 1;
                c.on_update += 1;
            },
            "handler balance",
        ),
    ];
    for (corrupt, failure) in cases {
        let mut counters = done.counters;
        corrupt(&mut counters);
        let verdict = check(&gen.model, &*done.store, &counters);
        assert!(
            verdict.failures().iter().any(|f| f.starts_with(failure)),
            "{failure}: {verdict}"
        );
    }
}

#[test]
fn the_verdict_is_a_pure_function_of_its_inputs() {
    let (gen, done, _, _) = w1_reference();
    let a = check(&gen.model, &*done.store, &done.counters);
    let b = check(&gen.model, &*done.store, &done.counters);
    assert_eq!(a, b);
    let mut c = done.counters;
    c.deleted += 1;
    assert_eq!(
        check(&gen.model, &*done.store, &c),
        check(&gen.model, &*done.store, &c)
    );
}

#[test]
fn a_failed_verdict_summary_names_the_first_failure_and_counts_the_rest() {
    let (gen, done, alive, _) = w1_reference();
    done.store.remove_by_key(&alive.key);
    let verdict = check(&gen.model, &*done.store, &done.counters);
    let summary = verdict.summary();
    assert!(summary.starts_with("FAIL: missing key"), "{summary}");
    assert!(summary.contains("more)"), "{summary}");
}

#[test]
fn the_cli_runs_each_engine_and_reports_the_documented_json() {
    let json = std::env::temp_dir().join(format!("loadgen-cli-{}.json", std::process::id()));
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "run",
            "--workload",
            "w3",
            "--keys",
            "300",
            "--events",
            "3000",
            "--json",
        ])
        .arg(&json)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("loadgen runs");
    assert!(status.success(), "ok verdicts exit 0: {status}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).ok();
    let results = doc["results"].as_array().expect("results array");
    let engines: Vec<&str> = results
        .iter()
        .filter_map(|r| r["engine"].as_str())
        .collect();
    assert_eq!(engines, ["reference", "sharded"]);
    for r in results {
        for field in [
            "engine",
            "workload",
            "events",
            "wall_s",
            "events_per_s",
            "pops",
            "deltas_per_pop",
            "latency_us",
            "peak_rss_bytes",
            "reads_per_s",
            "verdict",
        ] {
            assert!(r.get(field).is_some(), "missing {field}");
        }
        for p in ["p50", "p99", "p999"] {
            assert!(r["latency_us"][p].as_f64().is_some(), "latency {p}");
        }
        assert_eq!(r["verdict"], "ok");
        assert_eq!(r["workload"], "w3");
    }
}
