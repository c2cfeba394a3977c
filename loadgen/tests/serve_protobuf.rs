//! `loadgen serve`'s protobuf over raw HTTP/1.1, decoded with the messages generated from the
//! official `.proto` files (`k8s-pb`): content negotiation (`Accept` in order, JSON the
//! default and the fallback, 406 as JSON), paged lists, single gets, `Status` errors, and a
//! protobuf watch that carries the same events as the JSON one, frame by frame.
#![cfg(feature = "wire")]

mod serve_common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use k8s_pb::api::core::v1::{Pod, PodList};
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message;
use serde_json::Value;
use serve_common::{churn_done, start};

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

async fn connect(addr: SocketAddr) -> SendRequest<Empty<Bytes>> {
    serve_common::connect(addr).await
}

/// GETs `path` with `accept`: status, content type, body.
async fn get(
    sender: &mut SendRequest<Empty<Bytes>>,
    path: &str,
    accept: Option<&str>,
) -> (u16, String, Bytes) {
    let mut request = hyper::Request::get(path).header("host", "loadgen");
    if let Some(accept) = accept {
        request = request.header("accept", accept);
    }
    sender.ready().await.expect("the connection is usable");
    let response = sender
        .send_request(request.body(Empty::new()).unwrap())
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, content_type, body)
}

/// The envelope of a protobuf body, after checking the magic.
fn unknown(body: &[u8]) -> Unknown {
    assert_eq!(&body[..4], b"k8s\0", "the magic");
    Unknown::decode(&body[4..]).expect("a runtime.Unknown")
}

fn kind_of(u: &Unknown) -> (&str, &str) {
    let t = u.type_meta.as_ref().unwrap();
    (
        t.api_version.as_deref().unwrap(),
        t.kind.as_deref().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_picks_the_format_json_stays_the_default_and_406_is_json() {
    let server = start(20, 50, 50_000.0, 1000).await;
    churn_done(&server, Duration::from_secs(30)).await;
    let mut c = connect(server.addr()).await;
    for (accept, expected) in [
        (None, "application/json"),
        (Some("*/*"), "application/json"),
        (
            Some("application/json, application/vnd.kubernetes.protobuf"),
            "application/json",
        ),
        (
            Some("application/vnd.kubernetes.protobuf, application/json"),
            PROTOBUF,
        ),
        (
            Some("application/yaml, application/vnd.kubernetes.protobuf"),
            PROTOBUF,
        ),
        (
            Some("application/json;as=Table;v=v1;g=meta.k8s.io, application/json"),
            "application/json",
        ),
    ] {
        let (status, content_type, _) = get(&mut c, "/api/v1/pods?limit=5", accept).await;
        assert_eq!(
            (status, content_type.as_str()),
            (200, expected),
            "{accept:?}"
        );
    }
    let (status, content_type, body) = get(&mut c, "/api/v1/pods", Some("application/yaml")).await;
    assert_eq!((status, content_type.as_str()), (406, "application/json"));
    let status_json: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(status_json["kind"], "Status");
    assert_eq!(status_json["reason"], "NotAcceptable");
    assert_eq!(status_json["code"], 406);
    // The connection is still usable, and discovery ignores the pods' negotiation.
    let (status, _, _) = get(&mut c, "/api/v1", Some("application/yaml")).await;
    assert_eq!(status, 200);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paged_protobuf_lists_gets_and_errors_decode_with_the_official_messages() {
    let server = start(120, 500, 50_000.0, 10_000).await;
    churn_done(&server, Duration::from_secs(30)).await;
    let mut c = connect(server.addr()).await;

    let mut pods = Vec::new();
    let mut path = "/api/v1/pods?limit=50".to_owned();
    let mut pages = 0;
    loop {
        let (status, content_type, body) = get(&mut c, &path, Some(PROTOBUF)).await;
        assert_eq!((status, content_type.as_str()), (200, PROTOBUF));
        let envelope = unknown(&body);
        assert_eq!(kind_of(&envelope), ("v1", "PodList"));
        assert_eq!(envelope.content_encoding.as_deref(), Some(""));
        assert_eq!(envelope.content_type.as_deref(), Some(""));
        let list = PodList::decode(envelope.raw.as_deref().unwrap()).unwrap();
        pages += 1;
        let metadata = list.metadata.unwrap();
        assert_eq!(
            metadata.resource_version.as_deref(),
            Some(server.store().resource_version().to_string().as_str())
        );
        pods.extend(list.items);
        match metadata.r#continue.filter(|c| !c.is_empty()) {
            Some(token) => {
                assert!(metadata.remaining_item_count.unwrap() > 0);
                path = format!("/api/v1/pods?limit=50&continue={token}");
            }
            None => break,
        }
    }
    assert_eq!(pages, server.store().len().div_ceil(50));
    assert_eq!(pods.len(), server.store().len());

    // Each pod equals its single GET, and the JSON GET of the same pod names the same version.
    for pod in pods.iter().take(10) {
        let m = pod.metadata.as_ref().unwrap();
        let path = format!(
            "/api/v1/namespaces/{}/pods/{}",
            m.namespace.as_deref().unwrap(),
            m.name.as_deref().unwrap()
        );
        let (status, _, body) = get(&mut c, &path, Some(PROTOBUF)).await;
        assert_eq!(status, 200);
        let envelope = unknown(&body);
        assert_eq!(kind_of(&envelope), ("v1", "Pod"));
        assert_eq!(&Pod::decode(envelope.raw.as_deref().unwrap()).unwrap(), pod);
        let (_, _, json) = get(&mut c, &path, None).await;
        let json: Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(
            json["metadata"]["resourceVersion"].as_str(),
            m.resource_version.as_deref()
        );
        assert_eq!(json["metadata"]["uid"].as_str(), m.uid.as_deref());
    }

    let (status, content_type, body) =
        get(&mut c, "/api/v1/namespaces/nope/pods/nope", Some(PROTOBUF)).await;
    assert_eq!((status, content_type.as_str()), (404, PROTOBUF));
    let envelope = unknown(&body);
    assert_eq!(kind_of(&envelope), ("v1", "Status"));
    let status = meta::Status::decode(envelope.raw.as_deref().unwrap()).unwrap();
    assert_eq!(status.code, Some(404));
    assert_eq!(status.reason.as_deref(), Some("NotFound"));
    assert_eq!(status.details.unwrap().name.as_deref(), Some("nope"));
    server.stop().await.unwrap();
}

/// Cuts a protobuf watch body into its events.
fn frames(mut body: &[u8]) -> Vec<meta::WatchEvent> {
    let mut out = Vec::new();
    while !body.is_empty() {
        let len = u32::from_be_bytes(body[..4].try_into().unwrap()) as usize;
        out.push(meta::WatchEvent::decode(&body[4..4 + len]).unwrap());
        body = &body[4 + len..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protobuf_watch_carries_the_json_watchs_events() {
    let server = start(40, 400, 50_000.0, 10_000).await;
    churn_done(&server, Duration::from_secs(30)).await;
    let mut c = connect(server.addr()).await;
    // From the version before the churn (the 40 pods present at start are versions 1..=40),
    // with a timeout so the body ends.
    let path = "/api/v1/pods?watch=true&resourceVersion=40&timeoutSeconds=1";
    let (status, content_type, body) = get(
        &mut c,
        path,
        Some("application/vnd.kubernetes.protobuf;stream=watch"),
    )
    .await;
    assert_eq!(
        (status, content_type.as_str()),
        (200, "application/vnd.kubernetes.protobuf;stream=watch")
    );
    let (_, _, json) = get(&mut c, path, None).await;
    let json: Vec<Value> = json
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    let protobuf = frames(&body);
    assert_eq!(protobuf.len(), json.len());
    assert_eq!(protobuf.len(), 400, "every churn event once");
    for (pb, js) in protobuf.iter().zip(&json) {
        assert_eq!(pb.r#type.as_deref(), js["type"].as_str());
        let envelope = unknown(pb.object.as_ref().unwrap().raw.as_deref().unwrap());
        assert_eq!(kind_of(&envelope), ("v1", "Pod"));
        let pod = Pod::decode(envelope.raw.as_deref().unwrap()).unwrap();
        let m = pod.metadata.unwrap();
        let jm = &js["object"]["metadata"];
        assert_eq!(
            m.resource_version.as_deref(),
            jm["resourceVersion"].as_str()
        );
        assert_eq!(m.name.as_deref(), jm["name"].as_str());
        assert_eq!(m.uid.as_deref(), jm["uid"].as_str());
        assert_eq!(
            m.labels["loadgen/version"].as_str(),
            jm["labels"]["loadgen/version"].as_str().unwrap()
        );
        assert_eq!(
            pod.spec.unwrap().node_name.as_deref(),
            js["object"]["spec"]["nodeName"].as_str()
        );
    }
    server.stop().await.unwrap();
}
