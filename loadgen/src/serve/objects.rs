//! What `loadgen serve` writes on the wire as JSON: pods (written from a template once per
//! change, [`super::encode`], and held to the `k8s-openapi` types), watch-event lines,
//! bookmarks, `Status` errors and the discovery documents.

use std::net::SocketAddr;

use bytes::Bytes;
use serde_json::{json, Value};
use workloads::PodProfile;

/// The Kubernetes version `/version` claims: kubectl 1.32 (the version CI installs) talks to it
/// without a skew warning.
pub const CLAIMED_MAJOR: &str = "1";
/// See [`CLAIMED_MAJOR`].
pub const CLAIMED_MINOR: &str = "32";

/// The label every pod carries with the workload's own version of the object (it counts the
/// key's changes, while `resourceVersion` counts every change of every pod): lets a client check
/// its final state against the workload's model.
pub const VERSION_LABEL: &str = "loadgen/version";

/// The annotation of the bookmark that ends `sendInitialEvents`.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// How `k8s-openapi` starts every serialised pod. A list item is the pod without it (the real
/// server puts `kind` and `apiVersion` once, on the list).
pub const POD_HEAD: &[u8] = br#"{"apiVersion":"v1","kind":"Pod","#;

/// A watch event's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// A pod appeared.
    Added,
    /// A pod changed.
    Modified,
    /// A pod went away; the object is its last state at the deletion's resource version.
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One pod's state, as the churn describes it, borrowed: what the encoders take.
pub type PodState<'a> = PodStateOf<&'a str>;

/// One pod's state, with its strings as `S`: borrowed ([`PodState`]) or owned
/// ([`PodFields`](super::encode::PodFields)).
#[derive(Debug, Clone, Copy)]
pub struct PodStateOf<S> {
    /// `metadata.namespace`.
    pub namespace: S,
    /// `metadata.name`.
    pub name: S,
    /// `spec.nodeName`.
    pub node: Option<S>,
    /// The workload's dense key number (part of the uid).
    pub id: u32,
    /// How many times this key was created before this incarnation (part of the uid: a pod
    /// deleted and created again is a new object with a new uid).
    pub incarnation: u32,
    /// The workload's version of the key ([`VERSION_LABEL`]).
    pub version: u64,
    /// `metadata.resourceVersion`.
    pub resource_version: u64,
    /// `metadata.creationTimestamp`, in seconds since the Unix epoch (when this incarnation
    /// was created: kubectl's AGE).
    pub created: i64,
    /// How much of a real pod it carries (docs/workloads.md, "Pod profiles").
    pub profile: PodProfile,
    /// What happened to this incarnation since it was created (`minimal` pods ignore it).
    pub revision: Revision,
}

/// The changes an incarnation went through, beyond its version (which counts them all): what
/// the `typical` and `large` pods show of them. The churn keeps one per key and picks, per
/// update, a kubelet status update (a container restarts), a metadata change (an annotation)
/// or a spec change (the first container's image).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Revision {
    /// Container restarts (status updates), spread over the pod's containers.
    pub restarts: u32,
    /// Spec changes: the image tag, and `metadata.generation` - 1.
    pub spec: u32,
    /// Metadata changes: the `loadgen/touched` annotation.
    pub touched: u32,
    /// Seconds from creation to the kubelet's last status update.
    pub status_at: u32,
    /// Seconds from creation to the last metadata or spec change.
    pub touched_at: u32,
}

/// A watch line `{"type":T,"object":O}\n` in one allocation, `O` written by `object` (which
/// returns what it likes, such as where a part of `O` is), and the range of `O` in it, so that
/// one allocation serves the watchers (the line) and lists and gets (the object, a slice).
pub fn event_line<R>(
    kind: EventType,
    object: impl FnOnce(&mut Vec<u8>) -> R,
) -> (Bytes, std::ops::Range<usize>, R) {
    let mut line = Vec::with_capacity(400);
    line.extend_from_slice(br#"{"type":""#);
    line.extend_from_slice(kind.as_str().as_bytes());
    line.extend_from_slice(br#"","object":"#);
    let start = line.len();
    let written = object(&mut line);
    let end = line.len();
    line.extend_from_slice(b"}\n");
    (Bytes::from(line), start..end, written)
}

/// A `BOOKMARK` line at `resource_version`; `initial_events_end` adds the annotation that ends
/// `sendInitialEvents`.
pub fn bookmark_line(resource_version: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({ "resourceVersion": resource_version.to_string() });
    if initial_events_end {
        metadata["annotations"] = json!({ INITIAL_EVENTS_END: "true" });
    }
    let event = json!({
        "type": "BOOKMARK",
        "object": { "kind": "Pod", "apiVersion": "v1", "metadata": metadata },
    });
    line_of(&event)
}

/// An `ERROR` line carrying `status`.
pub fn error_line(status: &Status) -> Bytes {
    line_of(&json!({ "type": "ERROR", "object": status.to_json() }))
}

fn line_of(value: &Value) -> Bytes {
    let mut line = serde_json::to_vec(value).expect("a JSON value always serialises");
    line.push(b'\n');
    Bytes::from(line)
}

/// A failure, answered as a `v1.Status` with the HTTP status the real API server uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The HTTP status, also `code` in the body.
    pub code: u16,
    /// `reason`: `NotFound`, `BadRequest`, `Expired`, …
    pub reason: &'static str,
    /// `message`, for people.
    pub message: String,
    /// `details`, when the real server gives some (the missing pod, a cause).
    pub details: Option<Value>,
}

impl Status {
    /// 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 404 `NotFound` for a path the server does not serve.
    pub fn no_such_path() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 404 `NotFound` for a pod that does not exist.
    pub fn pod_not_found(name: &str) -> Self {
        let mut status = Self::new(404, "NotFound", format!("pods \"{name}\" not found"));
        status.details = Some(json!({ "name": name, "kind": "pods" }));
        status
    }

    /// 405 `MethodNotAllowed`: the server only reads.
    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource: {method}"),
        )
    }

    /// This status with the details naming the pod `name`.
    fn about_pod(mut self, name: &str) -> Self {
        self.details = Some(json!({ "name": name, "kind": "pods" }));
        self
    }

    /// 409 `AlreadyExists`: a create of a pod that exists.
    pub fn already_exists(name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("pods \"{name}\" already exists"),
        )
        .about_pod(name)
    }

    /// 409 `Conflict`: a write whose precondition (resource version, uid) the pod no longer
    /// meets; `why` is the API server's reason, e.g. "the object has been modified; ...".
    pub fn conflict(name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on pods \"{name}\": {why}"),
        )
        .about_pod(name)
    }

    /// 422 `Invalid` for a pod that fails validation: one cause per `(field, reason, detail)`,
    /// e.g. `("spec.containers", "FieldValueRequired", "Required value")`, and the message the
    /// API server writes from them.
    pub fn invalid_pod(name: &str, causes: &[(String, &'static str, String)]) -> Self {
        let errors: Vec<String> = causes
            .iter()
            .map(|(field, _, detail)| format!("{field}: {detail}"))
            .collect();
        let listed = match errors.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut status = Self::new(
            422,
            "Invalid",
            format!("Pod \"{name}\" is invalid: {listed}"),
        );
        let causes: Vec<Value> = causes
            .iter()
            .map(|(field, reason, detail)| {
                json!({ "reason": reason, "message": detail, "field": field })
            })
            .collect();
        status.details = Some(json!({ "name": name, "kind": "Pod", "causes": causes }));
        status
    }

    /// 413 `RequestEntityTooLarge`: a request body over `limit` bytes.
    pub fn request_entity_too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// 415 `UnsupportedMediaType`: a body in a format the server does not read.
    pub fn unsupported_media_type(content_type: &str, accepted: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({content_type}) - accepted media types include: {accepted}"
            ),
        )
    }

    /// 410 `Expired`: a watch or list from a resource version the server no longer has.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 422 `Invalid`: list options that contradict each other.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(422, "Invalid", message)
    }

    /// 429 `TooManyRequests`, as the API server's overload protection answers: retry after
    /// `seconds` (also sent as the `Retry-After` header).
    pub fn too_many_requests(seconds: u64) -> Self {
        let mut status = Self::new(
            429,
            "TooManyRequests",
            "Too many requests, please try again later.",
        );
        status.details = Some(json!({ "retryAfterSeconds": seconds }));
        status
    }

    /// 500 `InternalError`.
    pub fn internal_error(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// `details.retryAfterSeconds`, if set (sent as the `Retry-After` header too).
    pub fn retry_after_seconds(&self) -> Option<u64> {
        self.details.as_ref()?.get("retryAfterSeconds")?.as_u64()
    }

    /// 504 `Timeout` for a resource version newer than the server's, with the cause client-go
    /// recognises (`ResourceVersionTooLarge`).
    pub fn too_large(requested: u64, current: u64) -> Self {
        let mut status = Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        status.details = Some(json!({
            "causes": [{ "reason": "ResourceVersionTooLarge", "message": "Too large resource version" }],
            "retryAfterSeconds": 1,
        }));
        status
    }

    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// The `v1.Status` object.
    pub fn to_json(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// `GET /version`: every field `version.Info` has (kube-rs requires them all).
pub fn version() -> Value {
    json!({
        "major": CLAIMED_MAJOR,
        "minor": CLAIMED_MINOR,
        "gitVersion": format!("v{CLAIMED_MAJOR}.{CLAIMED_MINOR}.0-loadgen"),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    })
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// `GET /`: the paths the server answers.
pub fn root_paths() -> Value {
    json!({ "paths": ["/api", "/api/v1", "/apis", "/loadgen/status", "/openapi/v3", "/version"] })
}

/// `GET /api`: the core group's versions.
pub fn api_versions(addr: SocketAddr) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{ "clientCIDR": "0.0.0.0/0", "serverAddress": addr.to_string() }],
    })
}

/// `GET /apis`: no named groups.
pub fn api_group_list() -> Value {
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": [] })
}

/// `GET /api/v1`: the one resource, `pods`, with the verbs served (the writes only with
/// `--writes`).
pub fn api_resource_list(writes: bool) -> Value {
    let verbs: &[&str] = if writes {
        &[
            "create", "delete", "get", "list", "patch", "update", "watch",
        ]
    } else {
        &["get", "list", "watch"]
    };
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [{
            "name": "pods",
            "singularName": "pod",
            "namespaced": true,
            "kind": "Pod",
            "verbs": verbs,
            "shortNames": ["po"],
            "categories": ["all"],
        }],
    })
}

/// `GET /openapi/v3`: where the one group-version's document is.
pub fn openapi_v3_root() -> Value {
    json!({ "paths": { "api/v1": { "serverRelativeURL": "/openapi/v3/api/v1" } } })
}

/// `GET /openapi/v3/api/v1`: the pods' operations, with no schemas. kubectl reads it for one
/// thing: whether the `PATCH` of a Pod takes `fieldValidation` (then it leaves validation to
/// the server instead of downloading schemas); `kubectl apply` then computes its strategic
/// merge patches from its built-in types. The writes are described with or without `--writes`
/// (without it they answer 405, as they would from a server that forbids them), so kubectl
/// sends a write and shows the server's answer rather than failing to validate it.
pub fn openapi_v3_core() -> Value {
    let gvk = json!({ "group": "", "version": "v1", "kind": "Pod" });
    let operation = |id: &str, action: &str| {
        let mut parameters =
            vec![json!({ "name": "pretty", "in": "query", "schema": { "type": "string" } })];
        if !matches!(action, "get" | "list" | "watch") {
            for name in ["dryRun", "fieldManager", "fieldValidation"] {
                parameters
                    .push(json!({ "name": name, "in": "query", "schema": { "type": "string" } }));
            }
        }
        json!({
            "operationId": id,
            "parameters": parameters,
            "responses": {},
            "x-kubernetes-action": action,
            "x-kubernetes-group-version-kind": gvk,
        })
    };
    let collection = json!({
        "get": operation("listCoreV1NamespacedPod", "list"),
        "post": operation("createCoreV1NamespacedPod", "post"),
    });
    let item = json!({
        "get": operation("readCoreV1NamespacedPod", "get"),
        "put": operation("replaceCoreV1NamespacedPod", "put"),
        "patch": operation("patchCoreV1NamespacedPod", "patch"),
        "delete": operation("deleteCoreV1NamespacedPod", "delete"),
    });
    json!({
        "openapi": "3.0.0",
        "info": { "title": "Kubernetes", "version": format!("v{CLAIMED_MAJOR}.{CLAIMED_MINOR}.0-loadgen") },
        "paths": {
            "/api/v1/namespaces/{namespace}/pods": collection,
            "/api/v1/namespaces/{namespace}/pods/{name}": item,
        },
    })
}

/// The label every pod carries besides [`VERSION_LABEL`].
pub const APP_LABEL: (&str, &str) = ("app", "loadgen");

/// `metadata.uid`: the incarnation and the key, so a pod created again gets a new uid.
pub fn uid(state: &PodState<'_>) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", state.incarnation, state.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::encode::pod_json;
    use k8s_openapi::api::core::v1::Pod;

    #[test]
    fn a_pod_is_a_valid_v1_pod_and_its_line_slices_it() {
        let state = PodState {
            namespace: "ns-3",
            name: "pod-3",
            node: Some("node-3"),
            id: 3,
            incarnation: 1,
            version: 7,
            resource_version: 1234,
            created: 1_700_000_000,
            profile: PodProfile::Minimal,
            revision: Revision::default(),
        };
        let json = pod_json(&state);
        assert!(json.starts_with(POD_HEAD));
        let pod: Pod = serde_json::from_slice(&json).unwrap();
        assert_eq!(pod.metadata.namespace.as_deref(), Some("ns-3"));
        assert_eq!(pod.metadata.resource_version.as_deref(), Some("1234"));
        assert_eq!(
            pod.metadata.uid.as_deref(),
            Some("00000001-0000-4000-8000-000000000003")
        );
        assert_eq!(pod.metadata.labels.unwrap()[VERSION_LABEL], "7");
        let created = pod.metadata.creation_timestamp.unwrap();
        assert_eq!(created.0.as_second(), 1_700_000_000);
        assert_eq!(
            pod.spec.unwrap().node_name.as_deref(),
            Some("node-3"),
            "spec.nodeName"
        );

        let (line, range, ()) = event_line(EventType::Deleted, |out| out.extend_from_slice(&json));
        assert_eq!(&line[range], &json[..]);
        let event: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(event["type"], "DELETED");
        assert_eq!(event["object"]["kind"], "Pod");
        assert!(line.ends_with(b"}\n"));
    }

    #[test]
    fn bookmarks_and_errors_carry_kind_and_api_version() {
        let bookmark: Value = serde_json::from_slice(&bookmark_line(42, true)).unwrap();
        assert_eq!(bookmark["type"], "BOOKMARK");
        assert_eq!(bookmark["object"]["kind"], "Pod");
        assert_eq!(bookmark["object"]["apiVersion"], "v1");
        assert_eq!(bookmark["object"]["metadata"]["resourceVersion"], "42");
        assert_eq!(
            bookmark["object"]["metadata"]["annotations"][INITIAL_EVENTS_END],
            "true"
        );
        let plain: Value = serde_json::from_slice(&bookmark_line(42, false)).unwrap();
        assert!(plain["object"]["metadata"].get("annotations").is_none());

        let error: Value =
            serde_json::from_slice(&error_line(&Status::expired("too old resource version")))
                .unwrap();
        assert_eq!(error["type"], "ERROR");
        assert_eq!(error["object"]["kind"], "Status");
        assert_eq!(error["object"]["apiVersion"], "v1");
        assert_eq!(error["object"]["code"], 410);
        assert_eq!(error["object"]["reason"], "Expired");
    }
}
