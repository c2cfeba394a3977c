//! kcache's `Controller` over the wire: a `SharedInformer` of `KubeListerWatcher<Pod>` (the
//! engine's `kube` feature) against `loadgen serve` with W1 churning, and a controller that
//! reconciles every pod from the informer's indexer. It must converge: once the churn is over,
//! every pod the server holds was last reconciled at its final resource version, and every pod
//! it deleted was last reconciled as "not found". Pods of real Kubernetes types map to their
//! owners through their `metadata.ownerReferences`.
#![cfg(feature = "wire")]

mod serve_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kcache::controller::{owner_keys, Action, Controller, Request};
use kcache::informer::{kube_key_fn, KubeListerWatcher, SharedInformer, Versioned};
use kcache::Key;
use kube::api::Api;
use kube::{Client, Config};
use serve_common::{churn_done, server_state, start};

fn client(url: &str) -> Client {
    Client::try_from(Config::new(url.parse().expect("a valid url"))).expect("a client")
}

/// Per key, the resource version the latest reconcile read (`None`: not found).
type Seen = Mutex<BTreeMap<String, Option<u64>>>;

fn reconcile(request: &Request<Pod>, seen: &Seen) -> Result<Action, String> {
    let version = match request.object() {
        Some(pod) => Some(
            pod.resource_version()
                .parse::<u64>()
                .map_err(|e| format!("{}: resource version: {e}", request.key()))?,
        ),
        None => None,
    };
    seen.lock()
        .unwrap()
        .insert(request.key().as_str().to_string(), version);
    Ok(Action::Done)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_over_kube_rs_converges_on_the_servers_pods() {
    // 800 pods, 4,000 events at 2,000/s: two seconds of churn, deletions and re-creations.
    let server = start(800, 4_000, 2_000.0, 100_000).await;
    let lister = KubeListerWatcher::new(Api::<Pod>::all(client(&server.url())));
    let informer = SharedInformer::builder(lister, kube_key_fn::<Pod>())
        .page_size(250)
        .build();
    let seen = Arc::new(Seen::default());
    let controller = Controller::builder(&informer)
        .name("pods")
        .workers(4)
        .run(reconcile, Arc::clone(&seen))
        .expect("the controller starts");
    informer.start().expect("the informer starts");
    churn_done(&server, Duration::from_secs(30)).await;
    let expected = server_state(&server);
    let converged = || {
        let seen = seen.lock().unwrap();
        expected
            .iter()
            .all(|(key, rv)| seen.get(key) == Some(&Some(*rv)))
            && seen
                .iter()
                .all(|(key, rv)| expected.contains_key(key) || rv.is_none())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(converged() && controller.is_idle()) {
        assert!(
            Instant::now() < deadline,
            "the controller did not converge: {} pods reconciled, the server holds {}, failure {:?}",
            seen.lock().unwrap().len(),
            expected.len(),
            informer.failure(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = controller.stats();
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert!(stats.success as usize >= expected.len());
    controller.shutdown().await;
    informer.shutdown().await;
    server.stop().await.unwrap();
}

fn owned_pod(namespace: &str, name: &str, owners: &[(&str, &str, bool)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_string()),
            name: Some(name.to_string()),
            owner_references: Some(
                owners
                    .iter()
                    .map(|(kind, name, controller)| OwnerReference {
                        api_version: "apps/v1".to_string(),
                        kind: kind.to_string(),
                        name: name.to_string(),
                        uid: format!("uid-{name}"),
                        controller: Some(*controller),
                        ..OwnerReference::default()
                    })
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        ..Pod::default()
    }
}

#[test]
fn kubernetes_pods_map_to_their_owners_through_owner_references() {
    let pod = owned_pod(
        "ns-1",
        "web-0",
        &[("ReplicaSet", "web-7d9", true), ("ConfigMap", "cfg", false)],
    );
    assert_eq!(
        owner_keys(&pod, "ReplicaSet", true),
        [Key::new("ns-1/web-7d9")]
    );
    assert!(
        owner_keys(&pod, "ConfigMap", true).is_empty(),
        "not the controller"
    );
    assert_eq!(owner_keys(&pod, "ConfigMap", false), [Key::new("ns-1/cfg")]);
    assert!(owner_keys(&Pod::default(), "ReplicaSet", false).is_empty());
}
