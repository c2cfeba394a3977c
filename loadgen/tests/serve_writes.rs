//! Writes to `loadgen serve --writes` over HTTP, each status the API server gives: create
//! (201, 409 AlreadyExists, 422 Invalid, 400), replace (200, 409 Conflict on a stale resource
//! version, 404), merge and strategic merge patches, delete with preconditions (200 with the
//! deleted pod, 409, 404), and the watch events and list they make; without `--writes`, 405;
//! kube-rs' `Api<Pod>` writes; a written pod in protobuf.
#![cfg(feature = "wire")]

mod serve_common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use loadgen::serve::{ServeConfig, Server};
use serde_json::{json, Value};
use workloads::{PodProfile, Workload, WorkloadSpec};

/// A server of 3 minimal pods, no churn, writes on or off.
async fn start(writes: bool) -> Server {
    let mut config = ServeConfig::new(WorkloadSpec::new(Workload::W1).keys(3).events(0), 1.0);
    config.pod_profile = PodProfile::Minimal;
    config.writes = writes;
    Server::start(config).await.expect("the server starts")
}

async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    serve_common::connect(addr).await
}

/// An answer: status, headers, body as JSON.
struct Answer {
    code: u16,
    headers: hyper::HeaderMap,
    body: Value,
}

/// One request on a new connection (a refused write closes its connection).
async fn call(
    addr: SocketAddr,
    method: &str,
    path: &str,
    content_type: &str,
    body: Value,
) -> Answer {
    let body = match body {
        Value::Null => Bytes::new(),
        Value::String(raw) => Bytes::from(raw),
        json => Bytes::from(serde_json::to_vec(&json).unwrap()),
    };
    let mut sender = connect(addr).await;
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "loadgen")
        .header("content-type", content_type)
        .body(Full::new(body))
        .unwrap();
    let response = sender.send_request(request).await.expect("an answer");
    let code = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let body = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{method} {path}: {code} body is not JSON ({e}): {bytes:?}"));
    Answer {
        code,
        headers,
        body,
    }
}

const JSON: &str = "application/json";
const PODS: &str = "/api/v1/namespaces/default/pods";

fn pod(name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "tier": "web" } },
        "spec": { "containers": [{ "name": "app", "image": image }] },
    })
}

fn rv(object: &Value) -> u64 {
    object["metadata"]["resourceVersion"]
        .as_str()
        .expect("a resource version")
        .parse()
        .unwrap()
}

/// Asserts `answer` is the API server's `Status` for `code` and `reason`.
fn assert_status(answer: &Answer, code: u16, reason: &str) {
    let body = &answer.body;
    assert_eq!(answer.code, code, "{body}");
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["apiVersion"], "v1", "{body}");
    assert_eq!(body["status"], "Failure", "{body}");
    assert_eq!(body["code"], code, "{body}");
    assert_eq!(body["reason"], reason, "{body}");
}

/// A watch, read line by line.
struct Watch {
    body: hyper::body::Incoming,
    buffered: Vec<u8>,
    _sender: SendRequest<Full<Bytes>>,
}

impl Watch {
    /// A watch of `pods` (a collection path) from `from`.
    async fn open(addr: SocketAddr, pods: &str, from: u64) -> Watch {
        let mut sender = connect(addr).await;
        let request = hyper::Request::builder()
            .uri(format!("{pods}?watch=1&resourceVersion={from}"))
            .header("host", "loadgen")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = sender.send_request(request).await.expect("a watch");
        assert_eq!(response.status(), 200);
        Watch {
            body: response.into_body(),
            buffered: Vec::new(),
            _sender: sender,
        }
    }

    /// The next event, as (type, object).
    async fn next(&mut self) -> (String, Value) {
        loop {
            if let Some(end) = self.buffered.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buffered.drain(..=end).collect();
                let event: Value = serde_json::from_slice(&line).unwrap();
                return (
                    event["type"].as_str().unwrap().to_owned(),
                    event["object"].clone(),
                );
            }
            let frame = tokio::time::timeout(Duration::from_secs(10), self.body.frame())
                .await
                .expect("an event within 10 s")
                .expect("the watch goes on")
                .unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffered.extend_from_slice(&data);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_write_answers_as_the_api_server_and_is_a_watch_event() {
    let server = start(true).await;
    let addr = server.addr();
    let mut watch = Watch::open(addr, PODS, server.store().resource_version()).await;

    // Create: 201 with what the server set.
    let created = call(addr, "POST", PODS, JSON, pod("web", "nginx:1")).await;
    assert_eq!(created.code, 201, "{}", created.body);
    let meta = &created.body["metadata"];
    assert_eq!(meta["namespace"], "default");
    assert!(
        meta["uid"].as_str().is_some_and(|u| u.len() == 36),
        "{meta}"
    );
    assert!(meta["creationTimestamp"].is_string(), "{meta}");
    assert_eq!(created.body["status"]["phase"], "Pending");
    let v1 = rv(&created.body);
    assert_eq!(v1, 4, "after the 3 initial pods");
    let uid = meta["uid"].as_str().unwrap().to_owned();
    let (kind, object) = watch.next().await;
    assert_eq!((kind.as_str(), rv(&object)), ("ADDED", v1));
    assert_eq!(object["metadata"]["uid"], uid.as_str());

    // Create again: 409 AlreadyExists.
    let again = call(addr, "POST", PODS, JSON, pod("web", "nginx:1")).await;
    assert_status(&again, 409, "AlreadyExists");
    assert_eq!(again.body["message"], "pods \"web\" already exists");
    assert_eq!(
        again.body["details"],
        json!({ "name": "web", "kind": "pods" })
    );

    // Replace with the current version: 200, a new version, MODIFIED.
    let mut replacement = created.body.clone();
    replacement["spec"]["containers"][0]["image"] = json!("nginx:2");
    let path = format!("{PODS}/web");
    let replaced = call(addr, "PUT", &path, JSON, replacement.clone()).await;
    assert_eq!(replaced.code, 200, "{}", replaced.body);
    let v2 = rv(&replaced.body);
    assert!(v2 > v1);
    assert_eq!(replaced.body["spec"]["containers"][0]["image"], "nginx:2");
    assert_eq!(
        replaced.body["metadata"]["uid"],
        uid.as_str(),
        "the uid stays"
    );
    let (kind, object) = watch.next().await;
    assert_eq!((kind.as_str(), rv(&object)), ("MODIFIED", v2));

    // Replace with the stale version: 409 Conflict, no event.
    let stale = call(addr, "PUT", &path, JSON, replacement).await;
    assert_status(&stale, 409, "Conflict");
    assert_eq!(
        stale.body["message"],
        "Operation cannot be fulfilled on pods \"web\": the object has been modified; \
         please apply your changes to the latest version and try again"
    );
    // Replace a pod that does not exist: 404.
    let missing = call(addr, "PUT", &format!("{PODS}/nope"), JSON, pod("nope", "x")).await;
    assert_status(&missing, 404, "NotFound");

    // A JSON merge patch: labels merge, a null removes.
    let merged = call(
        addr,
        "PATCH",
        &path,
        "application/merge-patch+json",
        json!({ "metadata": { "labels": { "tier": null, "team": "a" } } }),
    )
    .await;
    assert_eq!(merged.code, 200, "{}", merged.body);
    assert_eq!(merged.body["metadata"]["labels"], json!({ "team": "a" }));
    let v3 = rv(&merged.body);
    let (kind, object) = watch.next().await;
    assert_eq!((kind.as_str(), rv(&object)), ("MODIFIED", v3));

    // A strategic merge patch as kubectl apply sends it: the container merges by name.
    let strategic = call(
        addr,
        "PATCH",
        &path,
        "application/strategic-merge-patch+json",
        json!({ "spec": {
            "$setElementOrder/containers": [{ "name": "app" }],
            "containers": [{ "name": "app", "image": "nginx:3" }],
        } }),
    )
    .await;
    assert_eq!(strategic.code, 200, "{}", strategic.body);
    assert_eq!(
        strategic.body["spec"]["containers"],
        json!([{ "name": "app", "image": "nginx:3" }])
    );
    let v4 = rv(&strategic.body);
    let (kind, object) = watch.next().await;
    assert_eq!((kind.as_str(), rv(&object)), ("MODIFIED", v4));

    // A patch that changes nothing writes nothing: same version, no event.
    let same = call(
        addr,
        "PATCH",
        &path,
        "application/merge-patch+json",
        json!({ "metadata": { "labels": { "team": "a" } } }),
    )
    .await;
    assert_eq!((same.code, rv(&same.body)), (200, v4));
    // A patch of a missing pod: 404; a patch in another format: 415.
    let missing = call(
        addr,
        "PATCH",
        &format!("{PODS}/nope"),
        "application/merge-patch+json",
        json!({}),
    )
    .await;
    assert_status(&missing, 404, "NotFound");
    let apply = call(
        addr,
        "PATCH",
        &path,
        "application/apply-patch+yaml",
        json!("{}"),
    )
    .await;
    assert_status(&apply, 415, "UnsupportedMediaType");
    // A JSON patch (RFC 6902): applied whole, or refused with 422 and nothing written.
    let json_patched = call(
        addr,
        "PATCH",
        &path,
        "application/json-patch+json",
        json!([{ "op": "add", "path": "/metadata/labels/by", "value": "json" }]),
    )
    .await;
    assert_eq!(json_patched.code, 200, "{}", json_patched.body);
    assert_eq!(json_patched.body["metadata"]["labels"]["by"], "json");
    // The newest version from here on.
    let v4 = rv(&json_patched.body);
    let (kind, object) = watch.next().await;
    assert_eq!((kind.as_str(), rv(&object)), ("MODIFIED", v4));
    let not_applied = call(
        addr,
        "PATCH",
        &path,
        "application/json-patch+json",
        json!([{ "op": "remove", "path": "/metadata/labels/nope" }]),
    )
    .await;
    assert_status(&not_applied, 422, "Invalid");

    // Delete with preconditions that do not hold: 409, with the API server's messages.
    let wrong_uid = call(
        addr,
        "DELETE",
        &path,
        JSON,
        json!({ "kind": "DeleteOptions", "apiVersion": "v1", "preconditions": { "uid": "other" } }),
    )
    .await;
    assert_status(&wrong_uid, 409, "Conflict");
    assert_eq!(
        wrong_uid.body["message"],
        format!(
            "Operation cannot be fulfilled on pods \"web\": Precondition failed: UID in \
             precondition: other, UID in object meta: {uid}"
        )
    );
    let wrong_rv = call(
        addr,
        "DELETE",
        &path,
        JSON,
        json!({ "preconditions": { "resourceVersion": v1.to_string() } }),
    )
    .await;
    assert_status(&wrong_rv, 409, "Conflict");
    // Delete with the right ones: 200 with the deleted pod at the deletion's version.
    let deleted = call(
        addr,
        "DELETE",
        &path,
        JSON,
        json!({ "preconditions": { "uid": uid, "resourceVersion": v4.to_string() } }),
    )
    .await;
    assert_eq!(deleted.code, 200, "{}", deleted.body);
    assert_eq!(deleted.body["kind"], "Pod");
    let v5 = rv(&deleted.body);
    assert!(v5 > v4);
    let (kind, object) = watch.next().await;
    assert_eq!((kind.as_str(), rv(&object)), ("DELETED", v5));
    assert_eq!(object["metadata"]["name"], "web");
    let twice = call(addr, "DELETE", &path, JSON, Value::Null).await;
    assert_status(&twice, 404, "NotFound");
    assert_eq!(twice.body["message"], "pods \"web\" not found");

    // The list follows: the three pods of the start, at the newest version.
    let list = call(addr, "GET", "/api/v1/pods", JSON, Value::Null).await;
    assert_eq!(list.body["items"].as_array().unwrap().len(), 3);
    assert_eq!(rv(&list.body), v5);
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_pods_get_422_and_bad_bodies_400() {
    let server = start(true).await;
    let addr = server.addr();
    let version = server.store().resource_version();

    let no_name = call(addr, "POST", PODS, JSON, pod("", "nginx")).await;
    assert_status(&no_name, 422, "Invalid");
    assert_eq!(
        no_name.body["message"],
        "Pod \"\" is invalid: metadata.name: Required value: name or generateName is required"
    );
    assert_eq!(
        no_name.body["details"]["causes"][0]["field"],
        "metadata.name"
    );
    assert_eq!(
        no_name.body["details"]["causes"][0]["reason"],
        "FieldValueRequired"
    );

    let mut no_containers = pod("empty", "nginx");
    no_containers["spec"]["containers"] = json!([]);
    let answer = call(addr, "POST", PODS, JSON, no_containers).await;
    assert_status(&answer, 422, "Invalid");
    assert_eq!(
        answer.body["message"],
        "Pod \"empty\" is invalid: spec.containers: Required value"
    );

    let bad_name = call(addr, "POST", PODS, JSON, pod("Not_A_Name", "nginx")).await;
    assert_status(&bad_name, 422, "Invalid");
    let no_image = call(addr, "POST", PODS, JSON, pod("noimage", "")).await;
    assert_status(&no_image, 422, "Invalid");
    assert_eq!(
        no_image.body["details"]["causes"][0]["field"],
        "spec.containers[0].image"
    );

    let mut elsewhere = pod("elsewhere", "nginx");
    elsewhere["metadata"]["namespace"] = json!("other");
    let answer = call(addr, "POST", PODS, JSON, elsewhere).await;
    assert_status(&answer, 400, "BadRequest");
    assert_eq!(
        answer.body["message"],
        "the namespace of the provided object does not match the namespace sent on the request"
    );

    let garbage = call(addr, "POST", PODS, JSON, json!("{not json")).await;
    assert_status(&garbage, 400, "BadRequest");
    let wrong_type = call(
        addr,
        "POST",
        PODS,
        JSON,
        json!({ "spec": { "containers": 3 } }),
    )
    .await;
    assert_status(&wrong_type, 400, "BadRequest");
    let yaml = call(addr, "POST", PODS, "application/yaml", json!("kind: Pod")).await;
    assert_status(&yaml, 415, "UnsupportedMediaType");

    // An unknown field: refused under fieldValidation=Strict, a warning by default.
    let mut unknown = pod("unknown", "nginx");
    unknown["spec"]["bogus"] = json!(1);
    let strict = call(
        addr,
        "POST",
        &format!("{PODS}?fieldValidation=Strict"),
        JSON,
        unknown.clone(),
    )
    .await;
    assert_status(&strict, 400, "BadRequest");
    assert_eq!(
        strict.body["message"],
        "strict decoding error: unknown field \"spec.bogus\""
    );
    assert_eq!(server.store().resource_version(), version, "nothing stored");
    let warned = call(addr, "POST", PODS, JSON, unknown).await;
    assert_eq!(warned.code, 201, "{}", warned.body);
    assert_eq!(
        warned.headers["warning"],
        "299 - \"unknown field \\\"spec.bogus\\\"\""
    );
    assert!(warned.body["spec"].get("bogus").is_none());

    // generateName: a name with the prefix; dryRun=All: the answer, nothing stored.
    let mut generated = pod("", "nginx");
    generated["metadata"]["generateName"] = json!("gen-");
    let answer = call(addr, "POST", PODS, JSON, generated).await;
    assert_eq!(answer.code, 201, "{}", answer.body);
    let name = answer.body["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");
    let before = server.store().resource_version();
    let dry = call(
        addr,
        "POST",
        &format!("{PODS}?dryRun=All"),
        JSON,
        pod("dry", "nginx"),
    )
    .await;
    assert_eq!(dry.code, 201, "{}", dry.body);
    assert_eq!(server.store().resource_version(), before);
    assert!(server.store().get("default", "dry").is_none());

    // An update may not change the spec beyond images.
    let path = format!("{PODS}/unknown");
    let forbidden = call(
        addr,
        "PATCH",
        &path,
        "application/merge-patch+json",
        json!({ "spec": { "nodeName": "node-9" } }),
    )
    .await;
    assert_status(&forbidden, 422, "Invalid");
    assert_eq!(forbidden.body["details"]["causes"][0]["field"], "spec");
    // Writes where there is nothing to write: 405; unknown paths: 404.
    let version = call(addr, "POST", "/version", JSON, json!({})).await;
    assert_status(&version, 405, "MethodNotAllowed");
    let all = call(addr, "POST", "/api/v1/pods", JSON, pod("a", "b")).await;
    assert_status(&all, 405, "MethodNotAllowed");
    let nowhere = call(addr, "POST", "/api/v1/nodes", JSON, json!({})).await;
    assert_status(&nowhere, 404, "NotFound");
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_writes_every_write_is_405_and_nothing_changes() {
    let server = start(false).await;
    let addr = server.addr();
    let version = server.store().resource_version();
    let pods = server.store().snapshot(None).pods;
    let existing = format!(
        "/api/v1/namespaces/{}/pods/{}",
        pods[0].namespace, pods[0].name
    );
    for (method, path) in [
        ("POST", PODS.to_owned()),
        ("PUT", existing.clone()),
        ("PATCH", existing.clone()),
        ("DELETE", existing),
    ] {
        let answer = call(addr, method, &path, JSON, pod("x", "nginx")).await;
        assert_status(&answer, 405, "MethodNotAllowed");
    }
    assert_eq!(server.store().resource_version(), version);
    let discovery = call(addr, "GET", "/api/v1", JSON, Value::Null).await;
    assert_eq!(
        discovery.body["resources"][0]["verbs"],
        json!(["get", "list", "watch"])
    );
    server.stop().await.unwrap();
}

/// kube-rs' `Api<Pod>` writes as it would to a cluster: create, replace, both patches, delete
/// (whose answer it reads as the deleted pod), and its errors carry the `Status` fields.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_writes_pods_and_reads_the_errors() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

    let server = start(true).await;
    let config = kube::Config::new(server.url().parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let new: Pod = serde_json::from_value(pod("kube", "nginx:1")).unwrap();

    let created = pods.create(&PostParams::default(), &new).await.unwrap();
    let uid = created.metadata.uid.clone().unwrap();
    let again = pods.create(&PostParams::default(), &new).await.unwrap_err();
    assert!(
        matches!(&again, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists"),
        "{again:?}"
    );

    let mut changed = created.clone();
    changed.spec.as_mut().unwrap().containers[0].image = Some("nginx:2".into());
    let replaced = pods
        .replace("kube", &PostParams::default(), &changed)
        .await
        .unwrap();
    assert_ne!(
        replaced.metadata.resource_version,
        created.metadata.resource_version
    );
    let stale = pods
        .replace("kube", &PostParams::default(), &changed)
        .await
        .unwrap_err();
    assert!(
        matches!(&stale, kube::Error::Api(s) if s.code == 409 && s.reason == "Conflict"),
        "{stale:?}"
    );

    let params = PatchParams::default();
    let merged = pods
        .patch(
            "kube",
            &params,
            &Patch::Merge(json!({ "metadata": { "labels": { "by": "merge" } } })),
        )
        .await
        .unwrap();
    assert_eq!(merged.metadata.labels.unwrap()["by"], "merge");
    let strategic = pods
        .patch(
            "kube",
            &params,
            &Patch::Strategic(
                json!({ "spec": { "containers": [{ "name": "app", "image": "nginx:3" }] } }),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        strategic.spec.unwrap().containers[0].image.as_deref(),
        Some("nginx:3")
    );

    let deleted = pods.delete("kube", &DeleteParams::default()).await.unwrap();
    let deleted = deleted
        .left()
        .expect("the deleted pod, as for pods on a cluster");
    assert_eq!(deleted.metadata.uid.as_deref(), Some(uid.as_str()));
    let missing = pods.get("kube").await.unwrap_err();
    assert!(
        matches!(&missing, kube::Error::Api(s) if s.code == 404 && s.reason == "NotFound"),
        "{missing:?}"
    );
    server.stop().await.unwrap();
}

/// A written pod is served in protobuf too, with the fields it was written with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_written_pod_is_served_in_protobuf() {
    use k8s_pb::api::core::v1 as pb;
    use prost::Message;

    let server = start(true).await;
    let addr = server.addr();
    let created = call(addr, "POST", PODS, JSON, pod("proto", "nginx:1")).await;
    assert_eq!(created.code, 201, "{}", created.body);
    let mut sender = connect(addr).await;
    let request = hyper::Request::builder()
        .uri(format!("{PODS}/proto"))
        .header("host", "loadgen")
        .header("accept", "application/vnd.kubernetes.protobuf")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..4], b"k8s\0");
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(&body[4..]).unwrap();
    let decoded = pb::Pod::decode(unknown.raw.as_deref().unwrap()).unwrap();
    let metadata = decoded.metadata.unwrap();
    assert_eq!(metadata.name.as_deref(), Some("proto"));
    assert_eq!(
        metadata.uid.as_deref(),
        created.body["metadata"]["uid"].as_str()
    );
    assert_eq!(metadata.labels["tier"], "web");
    assert_eq!(
        decoded.spec.unwrap().containers[0].image.as_deref(),
        Some("nginx:1")
    );
    server.stop().await.unwrap();
}

/// Writes while the churn runs: one log, every version once, in order, the writes' events
/// among the churn's at the versions their answers gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_the_churn_share_one_gapless_log() {
    let events = 400;
    let mut config = ServeConfig::new(
        WorkloadSpec::new(Workload::W1).keys(50).events(events),
        1_000.0,
    );
    config.pod_profile = PodProfile::Minimal;
    config.writes = true;
    config.publish_interval = Duration::ZERO;
    let server = Server::start(config).await.expect("the server starts");
    let addr = server.addr();
    let from = server.initial_resource_version();
    // Every namespace: the churn's pods are in their own.
    let mut watch = Watch::open(addr, "/api/v1/pods", from).await;
    let mut written = std::collections::BTreeMap::new();
    for i in 0..20 {
        let name = format!("w-{i}");
        let created = call(addr, "POST", PODS, JSON, pod(&name, "nginx")).await;
        assert_eq!(created.code, 201, "{}", created.body);
        written.insert(rv(&created.body), name);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let summary = serve_common::churn_done(&server, Duration::from_secs(30)).await;
    let last = server.store().resource_version();
    assert_eq!(last, from + events as u64 + 20, "{summary:?}");
    // The churn (0.4 s) was still publishing after the first write (so its events were
    // numbered again after the writes took theirs).
    let first_write = *written.keys().next().unwrap();
    assert!(
        first_write < last - 20,
        "every write came after the churn: {written:?}"
    );
    let mut expected = from + 1;
    while expected <= last {
        let (kind, object) = watch.next().await;
        assert_eq!(rv(&object), expected, "every version once, in order");
        if let Some(name) = written.get(&expected) {
            assert_eq!(
                (kind.as_str(), &object["metadata"]["name"]),
                ("ADDED", &json!(name))
            );
        }
        expected += 1;
    }
    let list = call(addr, "GET", PODS, JSON, Value::Null).await;
    let names: Vec<&str> = list.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .filter(|n| n.starts_with("w-"))
        .collect();
    assert_eq!(names.len(), 20, "{names:?}");
    server.stop().await.unwrap();
}
