//! The two wire formats `serve` speaks, and choosing one from a request's `Accept` header
//! (docs/wire.md, "Formats").
//!
//! The media types of `Accept` are honoured in the order given (the API server's own
//! negotiation picks the first it can produce; q-values are not weighed): JSON for
//! `application/json`, `application/*` and `*/*` (and when there is no `Accept` at all),
//! protobuf for `application/vnd.kubernetes.protobuf` (with or without `;stream=watch`).
//! What it cannot produce is skipped: YAML, and any `as=` conversion (`Table`,
//! `PartialObjectMetadata`), which kubectl lists before a plain `application/json`. When
//! nothing in the list can be produced the answer is `406 NotAcceptable`, as JSON.

use bytes::{BufMut, Bytes, BytesMut};

use prost::Message;

use super::bytes::bytes_field;
use super::objects::{bookmark_line, error_line, Status, INITIAL_EVENTS_END};
use super::protobuf::{self, push_frame, CONTENT_TYPE, WATCH_CONTENT_TYPE};
use super::store::{Page, StoredPod};

/// A wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/json` (the default).
    Json,
    /// `application/vnd.kubernetes.protobuf`.
    Protobuf,
    /// `application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`: the pods'
    /// `metadata` only, as `meta.k8s.io/v1` `PartialObjectMetadata[List]`.
    JsonMetadata,
}

/// The `kind` and `apiVersion` of a metadata-only object, up to its `metadata`.
const PARTIAL_HEAD: &[u8] =
    br#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":"#;

/// What `serve` can produce, for the 406's message.
const PRODUCED: &str = "application/json, application/vnd.kubernetes.protobuf";

impl Format {
    /// The format `accept` (the header's value; `None` when absent) asks for, or a 406.
    pub fn negotiate(accept: Option<&str>) -> Result<Format, Status> {
        let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
            return Ok(Format::Json);
        };
        for media in accept.split(',') {
            let mut parts = media.split(';').map(str::trim);
            let essence = parts.next().unwrap_or("").to_ascii_lowercase();
            let params: Vec<(&str, &str)> = parts
                .filter_map(|p| p.split_once('='))
                .map(|(k, v)| (k.trim(), v.trim()))
                .collect();
            let param = |name: &str| {
                params
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|&(_, v)| v)
            };
            match param("as") {
                None => {}
                // Metadata only, as JSON: served (either kind, for lists, watches and gets).
                Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                    if essence == "application/json"
                        && param("g") == Some("meta.k8s.io")
                        && param("v") == Some("v1") =>
                {
                    return Ok(Format::JsonMetadata)
                }
                // Any other conversion (`as=Table`, metadata as protobuf) is not served.
                Some(_) => continue,
            }
            match essence.as_str() {
                "application/json" | "application/*" | "*/*" => return Ok(Format::Json),
                CONTENT_TYPE => return Ok(Format::Protobuf),
                _ => {}
            }
        }
        Err(Status {
            code: 406,
            reason: "NotAcceptable",
            message: format!(
                "only the following media types are accepted: {PRODUCED} (asked for: {accept})"
            ),
            details: None,
        })
    }

    /// The format an error answers in: the negotiated one, JSON when none could be.
    pub fn for_errors(accept: Option<&str>) -> Format {
        match Format::negotiate(accept) {
            Ok(Format::Protobuf) => Format::Protobuf,
            _ => Format::Json,
        }
    }

    /// The `Content-Type` of an object body.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json | Format::JsonMetadata => "application/json",
            Format::Protobuf => CONTENT_TYPE,
        }
    }

    /// The `Content-Type` of a watch.
    pub fn watch_content_type(self) -> &'static str {
        match self {
            Format::Json | Format::JsonMetadata => "application/json",
            Format::Protobuf => WATCH_CONTENT_TYPE,
        }
    }

    /// Appends the event that made `pod`, as this format's watch sends it: the shared bytes
    /// (metadata only: the shared metadata inside a fixed envelope).
    pub fn push_event(self, chunk: &mut BytesMut, pod: &StoredPod) {
        match self {
            Format::Json => chunk.put_slice(pod.line()),
            Format::Protobuf => chunk.put_slice(pod.protobuf().frame()),
            Format::JsonMetadata => push_metadata_line(chunk, pod.kind.as_str(), pod),
        }
    }

    /// Appends `pod` as an `ADDED` event (a watch's initial events).
    pub fn push_added(self, chunk: &mut BytesMut, pod: &StoredPod) {
        match self {
            Format::Json => {
                chunk.put_slice(br#"{"type":"ADDED","object":"#);
                chunk.put_slice(pod.object());
                chunk.put_slice(b"}\n");
            }
            Format::Protobuf => push_frame(chunk, "ADDED", &pod.protobuf().body()),
            Format::JsonMetadata => push_metadata_line(chunk, "ADDED", pod),
        }
    }

    /// A list page's body.
    pub fn list_body(self, page: &Page) -> Bytes {
        match self {
            Format::Json => json_list_body(page).into(),
            Format::Protobuf => protobuf_list_body(page).into(),
            Format::JsonMetadata => metadata_list_body(page).into(),
        }
    }

    /// One pod's body.
    pub fn pod_body(self, pod: &StoredPod) -> Bytes {
        match self {
            Format::Json => pod.object_bytes(),
            Format::Protobuf => pod.protobuf().body(),
            Format::JsonMetadata => {
                let mut body = BytesMut::new();
                body.put_slice(PARTIAL_HEAD);
                body.put_slice(pod.metadata_json());
                body.put_u8(b'}');
                body.freeze()
            }
        }
    }

    /// A `BOOKMARK` event.
    pub fn bookmark(self, resource_version: u64, initial_events_end: bool) -> Bytes {
        match self {
            Format::Json => bookmark_line(resource_version, initial_events_end),
            Format::Protobuf => protobuf::bookmark_frame(resource_version, initial_events_end),
            Format::JsonMetadata => metadata_bookmark_line(resource_version, initial_events_end),
        }
    }

    /// An `ERROR` event carrying `status`.
    pub fn error(self, status: &Status) -> Bytes {
        match self {
            Format::Json | Format::JsonMetadata => error_line(status),
            Format::Protobuf => protobuf::error_frame(status),
        }
    }

    /// `status` as a body.
    pub fn status_body(self, status: &Status) -> Bytes {
        match self {
            Format::Json | Format::JsonMetadata => serde_json::to_vec(&status.to_json())
                .expect("a JSON value always serialises")
                .into(),
            Format::Protobuf => protobuf::status_body(status).into(),
        }
    }
}

/// `{"type":T,"object":{PartialObjectMetadata with the pod's metadata}}\n`.
fn push_metadata_line(chunk: &mut BytesMut, event_type: &str, pod: &StoredPod) {
    chunk.put_slice(br#"{"type":""#);
    chunk.put_slice(event_type.as_bytes());
    chunk.put_slice(br#"","object":"#);
    chunk.put_slice(PARTIAL_HEAD);
    chunk.put_slice(pod.metadata_json());
    chunk.put_slice(b"}}\n");
}

fn metadata_bookmark_line(resource_version: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = serde_json::json!({ "resourceVersion": resource_version.to_string() });
    if initial_events_end {
        metadata["annotations"] = serde_json::json!({ INITIAL_EVENTS_END: "true" });
    }
    let event = serde_json::json!({
        "type": "BOOKMARK",
        "object": {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": metadata,
        },
    });
    let mut line = serde_json::to_vec(&event).expect("a JSON value always serialises");
    line.push(b'\n');
    line.into()
}

/// The list's `metadata`: its version and, with more pages, the token and the count left.
fn list_metadata(page: &Page) -> serde_json::Value {
    let mut metadata =
        serde_json::json!({ "resourceVersion": page.snapshot.resource_version.to_string() });
    if let Some(next) = &page.continue_token {
        metadata["continue"] = next.as_str().into();
        metadata["remainingItemCount"] = page.remaining().into();
    }
    metadata
}

/// A list page: `k8s\0` + `Unknown{v1, PodList, raw = PodList{metadata, items}}`.
fn protobuf_list_body(page: &Page) -> Vec<u8> {
    let metadata = k8s_pb::apimachinery::pkg::apis::meta::v1::ListMeta {
        resource_version: Some(page.snapshot.resource_version.to_string()),
        r#continue: page.continue_token.clone(),
        remaining_item_count: page
            .continue_token
            .as_ref()
            .map(|_| page.remaining() as i64),
        ..Default::default()
    };
    let pods = page.items();
    let mut list = Vec::with_capacity(
        64 + pods
            .iter()
            .map(|p| p.protobuf().pod().len() + 4)
            .sum::<usize>(),
    );
    bytes_field(&mut list, 1, &metadata.encode_to_vec());
    for pod in pods {
        bytes_field(&mut list, 2, pod.protobuf().pod());
    }
    protobuf::object_body("v1", "PodList", &list).0
}

/// A `PodList` page: `kind` and `apiVersion` once, at the top, the items without them.
fn json_list_body(page: &Page) -> Vec<u8> {
    let pods = page.items();
    let head = format!(
        r#"{{"kind":"PodList","apiVersion":"v1","metadata":{},"items":["#,
        list_metadata(page)
    );
    let size = head.len() + pods.iter().map(|p| p.object().len()).sum::<usize>() + pods.len() + 2;
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(head.as_bytes());
    for (i, pod) in pods.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.push(b'{');
        body.extend_from_slice(pod.list_item());
    }
    body.extend_from_slice(b"]}");
    body
}

/// A `PartialObjectMetadataList` page.
fn metadata_list_body(page: &Page) -> Vec<u8> {
    let pods = page.items();
    let head = format!(
        r#"{{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{},"items":["#,
        list_metadata(page)
    );
    let mut body = Vec::with_capacity(head.len() + pods.len() * 300);
    body.extend_from_slice(head.as_bytes());
    for (i, pod) in pods.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(PARTIAL_HEAD);
        body.extend_from_slice(pod.metadata_json());
        body.push(b'}');
    }
    body.extend_from_slice(b"]}");
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_is_honoured_in_order_with_json_the_fallback() {
        let n = |a| Format::negotiate(a);
        assert_eq!(n(None), Ok(Format::Json));
        assert_eq!(n(Some("")), Ok(Format::Json));
        assert_eq!(n(Some("*/*")), Ok(Format::Json));
        assert_eq!(n(Some("application/json")), Ok(Format::Json));
        assert_eq!(
            n(Some(
                "application/vnd.kubernetes.protobuf, application/json"
            )),
            Ok(Format::Protobuf),
            "client-go's header for built-in types"
        );
        assert_eq!(
            n(Some("application/vnd.kubernetes.protobuf;stream=watch")),
            Ok(Format::Protobuf)
        );
        assert_eq!(
            n(Some(
                "application/json, application/vnd.kubernetes.protobuf"
            )),
            Ok(Format::Json)
        );
        assert_eq!(
            n(Some(
                "application/yaml, application/vnd.kubernetes.protobuf"
            )),
            Ok(Format::Protobuf)
        );
        assert_eq!(
            n(Some(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            )),
            Ok(Format::Json),
            "kubectl get's header: the tables are skipped"
        );
        assert_eq!(
            n(Some(
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
            )),
            Ok(Format::JsonMetadata)
        );
        assert_eq!(
            n(Some(
                "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
            )),
            Ok(Format::JsonMetadata),
            "client-go's metadata informer's header: metadata as protobuf is skipped"
        );
        for refused in [
            "application/yaml",
            "text/html",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v2",
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
        ] {
            let status = n(Some(refused)).unwrap_err();
            assert_eq!(
                (status.code, status.reason),
                (406, "NotAcceptable"),
                "{refused}"
            );
        }
        assert_eq!(Format::for_errors(Some("text/html")), Format::Json);
    }
}
