//! kcache's own wire client (`kcache::informer::wire`, engine feature `wire`) against
//! `loadgen serve` on loopback: protobuf lists, watches and JSON agree on every served field;
//! a watch from a version out of the window gets `410 Expired` as an `ERROR` frame; informers
//! over protobuf and over JSON end with identical caches; a broken frame reaches the watch
//! error handler and makes the reflector list again.
#![cfg(feature = "wire")]

mod serve_common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1 as openapi;
use k8s_pb::api::core::v1::Pod;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use kcache::informer::wire::{proto_key_fn, JsonCodec, Proto, ProtobufCodec, WireListerWatcher};
use kcache::informer::{
    kube_key_fn, Error, ListOptions, ListerWatcher, SharedInformer, Versioned, WatchEvent,
    WatchOptions,
};
use kube::{Client, Config};
use loadgen::serve::Server;
use serve_common::{churn_done, server_state, start};

fn client(url: &str) -> Client {
    Client::try_from(Config::new(url.parse().expect("a valid url"))).expect("a client")
}

fn protobuf(url: &str) -> WireListerWatcher<ProtobufCodec<Pod>> {
    WireListerWatcher::protobuf(client(url))
}

fn json(url: &str) -> WireListerWatcher<JsonCodec<openapi::Pod>> {
    WireListerWatcher::json(client(url))
}

/// Every page of a list, `limit` at a time: the items and the list's resource version.
async fn list_all<T, L: ListerWatcher<T>>(lw: &L, limit: usize) -> (Vec<Arc<T>>, String) {
    let mut items = Vec::new();
    let mut options = ListOptions {
        limit,
        ..ListOptions::default()
    };
    loop {
        let page = lw.list(options.clone()).await.expect("a list page");
        items.extend(page.items);
        match page.continue_token {
            Some(token) => options.continue_token = Some(token),
            None => return (items, page.resource_version),
        }
    }
}

/// Asserts the protobuf pod and the JSON pod carry exactly the same fields and values: the
/// protobuf one is the JSON one converted field by field (`serve::convert`, the reference the
/// server's protobuf templates are held to), whatever the pod profile.
fn assert_same_pod(pb: &Pod, json: &openapi::Pod) {
    assert_eq!(
        &loadgen::serve::convert::pod(json),
        pb,
        "the protobuf pod and the JSON pod differ"
    );
}

fn key_of(ns: Option<&str>, name: Option<&str>) -> String {
    format!("{}/{}", ns.unwrap_or(""), name.unwrap_or(""))
}

/// The key of a protobuf pod.
fn proto_key(pod: &Pod) -> String {
    let m = pod.metadata.as_ref().unwrap();
    key_of(m.namespace.as_deref(), m.name.as_deref())
}

/// The key of a JSON object by its metadata.
fn json_key(m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    key_of(m.namespace.as_deref(), m.name.as_deref())
}

/// A cache's objects as key → resource version, to compare with [`server_state`].
fn cache_state<T: Versioned>(
    objects: &[Arc<T>],
    key: impl Fn(&T) -> String,
) -> BTreeMap<String, u64> {
    objects
        .iter()
        .map(|o| (key(o), o.resource_version().parse().unwrap()))
        .collect()
}

/// A server that has churned `events` over `keys` (at 50,000/s, keeping every event), and its
/// URL.
async fn churned(keys: usize, events: usize) -> (Server, String) {
    let server = start(keys, events, 50_000.0, 100_000).await;
    churn_done(&server, Duration::from_secs(60)).await;
    let url = server.url();
    (server, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protobuf_lists_watches_and_json_agree_on_every_served_field() {
    let (server, url) = churned(300, 3_000).await;

    let (pb_items, pb_rv) = list_all(&protobuf(&url), 70).await;
    let (json_items, json_rv) = list_all(&json(&url), 70).await;
    assert_eq!(pb_rv, json_rv, "both lists are of the same final state");
    assert_eq!(pb_rv, server.store().resource_version().to_string());
    let pb: BTreeMap<String, Arc<Proto<Pod>>> =
        pb_items.into_iter().map(|p| (proto_key(&p), p)).collect();
    let json: BTreeMap<String, Arc<openapi::Pod>> = json_items
        .into_iter()
        .map(|p| (json_key(&p.metadata), p))
        .collect();
    let served = server_state(&server);
    assert_eq!(pb.len(), served.len());
    assert_eq!(
        pb.keys().collect::<Vec<_>>(),
        json.keys().collect::<Vec<_>>()
    );
    for (key, pod) in &pb {
        assert_same_pod(pod, &json[key]);
        assert_eq!(pod.resource_version(), served[key].to_string());
    }

    // A watch from "0" starts with every current pod as ADDED: the same pods as the list.
    let mut stream = protobuf(&url)
        .watch(WatchOptions {
            resource_version: "0".into(),
            allow_bookmarks: false,
            timeout: Some(Duration::from_secs(30)),
        })
        .await
        .expect("a protobuf watch");
    let mut watched = BTreeMap::new();
    while watched.len() < pb.len() {
        match stream.next().await.expect("more events").expect("an event") {
            WatchEvent::Added(p) => {
                watched.insert(proto_key(&p), p);
            }
            other => panic!("expected only ADDED, got {other:?}"),
        }
    }
    for (key, pod) in &watched {
        assert_eq!(pod, &pb[key], "watch and list agree on {key}");
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_from_out_of_the_window_gets_410_over_protobuf() {
    // A window of 10 events and 200 events of churn: version 1 is long gone.
    let server = start(50, 200, 50_000.0, 10).await;
    churn_done(&server, Duration::from_secs(30)).await;
    let mut stream = protobuf(&server.url())
        .watch(WatchOptions {
            resource_version: "1".into(),
            allow_bookmarks: true,
            timeout: None,
        })
        .await
        .expect("the watch opens (the 410 comes as an event)");
    match stream.next().await {
        Some(Ok(WatchEvent::Error(status))) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(Error::Api(status).is_expired());
        }
        other => panic!("expected the 410 ERROR frame, got {other:?}"),
    }
    assert!(stream.next().await.is_none(), "then the stream ends");

    // An error answer to a list is a protobuf Status too. (Not a too-large version: kube-rs'
    // client retries the 504 that brings for minutes.)
    let err = protobuf(&server.url())
        .list(ListOptions {
            limit: 10,
            continue_token: Some("junk".into()),
            ..ListOptions::default()
        })
        .await
        .expect_err("a malformed continue token");
    let status = err.status().expect("the server's Status");
    assert_eq!(
        (status.code, status.reason.as_str()),
        (400, "BadRequest"),
        "{err}"
    );
    assert!(status.message.contains("continue"), "{err}");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn informers_over_protobuf_and_json_end_with_identical_caches() {
    let server = start(500, 20_000, 20_000.0, 100_000).await;
    let url = server.url();
    let pb = Arc::new(SharedInformer::builder(protobuf(&url), proto_key_fn::<Pod>()).build());
    let js = Arc::new(SharedInformer::builder(json(&url), kube_key_fn::<openapi::Pod>()).build());
    pb.start().unwrap();
    js.start().unwrap();
    churn_done(&server, Duration::from_secs(60)).await;
    let expected = server_state(&server);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let pb_state = cache_state(&pb.store().list(), |p| proto_key(p));
        let js_state = cache_state(&js.store().list(), |p| json_key(&p.metadata));
        if pb_state == expected && js_state == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the caches never matched the server: protobuf {} pods, JSON {} pods, server {}",
            pb_state.len(),
            js_state.len(),
            expected.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Field by field, not only the versions.
    for pod in pb.store().list() {
        let key = kcache::Key::new(&proto_key(&pod));
        let json_pod = js.store().get_by_key(&key).expect("in both caches");
        assert_same_pod(&pod, &json_pod);
    }
    pb.shutdown().await;
    js.shutdown().await;
    server.stop().await.unwrap();
}

/// A server whose lists are fine and whose watches send one good frame, then a frame cut
/// short, then end: counts lists.
async fn broken_frame_server(lists: Arc<AtomicUsize>) -> String {
    use axum::http::{header, Uri};
    use bytes::{BufMut, BytesMut};
    use loadgen::serve::bytes::bytes_field;
    use loadgen::serve::encode::{pod_protobuf, PodFields};
    use loadgen::serve::protobuf::{object_body, push_frame, CONTENT_TYPE, WATCH_CONTENT_TYPE};
    use prost::Message;

    let pod = |rv: u64| {
        pod_protobuf(
            &PodFields {
                namespace: "ns".into(),
                name: "p".into(),
                node: None,
                id: 1,
                incarnation: 1,
                version: rv,
                resource_version: rv,
                created: 0,
                profile: workloads::PodProfile::Minimal,
                revision: Default::default(),
            }
            .state(),
        )
    };
    let handler = move |uri: Uri| {
        let lists = Arc::clone(&lists);
        async move {
            if uri.query().unwrap_or("").contains("watch=true") {
                let mut body = BytesMut::new();
                push_frame(&mut body, "MODIFIED", &object_body("v1", "Pod", &pod(6)).0);
                let mut cut = BytesMut::new();
                push_frame(&mut cut, "MODIFIED", &object_body("v1", "Pod", &pod(7)).0);
                body.put_slice(&cut[..cut.len() - 5]);
                ([(header::CONTENT_TYPE, WATCH_CONTENT_TYPE)], body.freeze())
            } else {
                lists.fetch_add(1, Ordering::SeqCst);
                let mut list = Vec::new();
                let list_meta = meta::ListMeta {
                    resource_version: Some("5".into()),
                    ..Default::default()
                };
                bytes_field(&mut list, 1, &list_meta.encode_to_vec());
                bytes_field(&mut list, 2, &pod(5));
                let body = object_body("v1", "PodList", &list).0;
                (
                    [(header::CONTENT_TYPE, CONTENT_TYPE)],
                    bytes::Bytes::from(body),
                )
            }
        }
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(listener, axum::Router::new().fallback(handler))
            .await
            .unwrap();
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_frame_reaches_the_error_handler_and_makes_a_relist() {
    let lists = Arc::new(AtomicUsize::new(0));
    let url = broken_frame_server(Arc::clone(&lists)).await;
    let errors = Arc::new(Mutex::new(Vec::<Error>::new()));
    let seen = Arc::clone(&errors);
    let informer = SharedInformer::builder(protobuf(&url), proto_key_fn::<Pod>())
        .watch_error_handler(Arc::new(move |e: &Error| {
            seen.lock().unwrap().push(e.clone())
        }))
        .build();
    informer.start().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while lists.load(Ordering::SeqCst) < 2 {
        assert!(
            Instant::now() < deadline,
            "no relist after the broken frame"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, Error::Decode(m) if m.contains("ended inside a frame"))),
        "the handler was told what broke: {errors:?}"
    );
    assert!(
        !informer.is_stopped(),
        "a decode error is no reason to stop"
    );
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streaming_list_is_the_paged_list_and_an_informer_syncs_from_it() {
    let (server, url) = churned(400, 2_000).await;
    let (paged, paged_rv) = list_all(&protobuf(&url), 100).await;
    for streaming in [true, false] {
        let lw = protobuf(&url).streaming_list(streaming);
        let page = lw
            .list(ListOptions {
                limit: 100,
                ..ListOptions::default()
            })
            .await
            .expect("a list");
        assert_eq!(page.resource_version, paged_rv);
        if streaming {
            assert!(page.continue_token.is_none(), "one page");
            assert_eq!(page.items.len(), paged.len());
            let sorted = |items: &[Arc<Proto<Pod>>]| {
                let mut pods: Vec<Pod> = items.iter().map(|p| p.0.clone()).collect();
                pods.sort_by_key(proto_key);
                pods
            };
            assert_eq!(
                sorted(&page.items),
                sorted(&paged),
                "the same pods, field by field"
            );
        } else {
            assert_eq!(page.items.len(), 100, "paged when streaming is off");
        }
    }
    let (json_stream, json_rv) = list_all(&json(&url).streaming_list(true), 0).await;
    assert_eq!(
        (json_stream.len(), json_rv),
        (paged.len(), paged_rv.clone())
    );

    // An informer that lists by streaming syncs to the server's state and follows it.
    let informer =
        SharedInformer::builder(protobuf(&url).streaming_list(true), proto_key_fn::<Pod>()).build();
    informer.start().unwrap();
    let expected = server_state(&server);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = cache_state(&informer.store().list(), |p| proto_key(p));
        if state == expected {
            break;
        }
        assert!(Instant::now() < deadline, "never synced by streaming");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(informer.last_sync_resource_version(), paged_rv);
    informer.shutdown().await;
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_only_lists_watches_and_informers_carry_exactly_the_metadata() {
    use kcache::informer::wire::MetadataCodec;
    use kube::core::PartialObjectMeta;

    let server = start(300, 3_000, 50_000.0, 100_000).await;
    let url = server.url();
    let meta_lw = || WireListerWatcher::<MetadataCodec<openapi::Pod>>::metadata(client(&url));
    let informer = Arc::new(
        SharedInformer::builder(meta_lw(), kube_key_fn::<PartialObjectMeta<openapi::Pod>>())
            .build(),
    );
    informer.start().unwrap();
    churn_done(&server, Duration::from_secs(60)).await;

    // A metadata-only list is the full list's metadata, pod by pod, typed PartialObjectMetadata.
    let (partial, partial_rv) = list_all(&meta_lw(), 70).await;
    let (full, full_rv) = list_all(&json(&url), 70).await;
    assert_eq!(partial_rv, full_rv);
    assert_eq!(partial.len(), full.len());
    for (p, f) in partial.iter().zip(&full) {
        assert_eq!(p.metadata, f.metadata, "metadata only, all of it");
        let types = p.types.as_ref().expect("kind and apiVersion on each item");
        assert_eq!(types.kind, "PartialObjectMetadata");
        assert_eq!(types.api_version, "meta.k8s.io/v1");
    }

    // The informer over metadata-only watches ends with the server's state.
    let expected = server_state(&server);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let state = cache_state(&informer.store().list(), |p| json_key(&p.metadata));
        if state == expected {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the metadata informer never synced"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for pod in &full {
        let key = kcache::Key::new(&json_key(&pod.metadata));
        let cached = informer.store().get_by_key(&key).expect("cached");
        assert_eq!(cached.metadata, pod.metadata);
    }
    informer.shutdown().await;
    server.stop().await.unwrap();
}
