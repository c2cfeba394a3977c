//! Kubernetes' protobuf wire format, as `serve` writes it (docs/wire.md, "Protobuf"):
//!
//! - an object body (a single pod, a list page, a `Status`) is the magic `k8s\0` followed by a
//!   `runtime.Unknown{typeMeta{apiVersion, kind}, raw, contentEncoding, contentType}` whose
//!   `raw` is the object's own message; `contentEncoding` and `contentType` are written empty,
//!   as the API server's Go encoder does;
//! - a watch is a sequence of frames: a 4-byte big-endian length, then a bare
//!   `metav1.WatchEvent{type, object.raw}` (no magic, no envelope around the event) whose
//!   `object.raw` is the inner object's body as above.
//!
//! The messages are `k8s-pb`'s (generated from the official `.proto` files) encoded by prost;
//! the per-event pod is the template of [`super::encode`], and an event's frame is written once
//! and shared: the pod's body and its bare message are slices of it.

use std::ops::Range;

use bytes::{BufMut, Bytes, BytesMut};
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message;

use super::bytes::{bytes_field, key, string_field, varint, varint_len, LEN};
use super::objects::{Status, INITIAL_EVENTS_END};

/// What starts every protobuf object body.
pub const MAGIC: &[u8; 4] = b"k8s\0";
/// The content type of protobuf bodies.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
/// The content type of a protobuf watch.
pub const WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// `k8s\0` + `Unknown{typeMeta{api_version, kind}, raw, "", ""}`; also returns where `raw` is.
pub fn object_body(api_version: &str, kind: &str, raw: &[u8]) -> (Vec<u8>, Range<usize>) {
    let mut type_meta = Vec::with_capacity(api_version.len() + kind.len() + 4);
    string_field(&mut type_meta, 1, api_version);
    string_field(&mut type_meta, 2, kind);
    let mut body = Vec::with_capacity(MAGIC.len() + type_meta.len() + raw.len() + 16);
    body.extend_from_slice(MAGIC);
    bytes_field(&mut body, 1, &type_meta);
    key(&mut body, 2, LEN);
    varint(&mut body, raw.len() as u64);
    let start = body.len();
    body.extend_from_slice(raw);
    let end = body.len();
    // contentEncoding and contentType, empty.
    body.extend_from_slice(&[3 << 3 | LEN, 0, 4 << 3 | LEN, 0]);
    (body, start..end)
}

/// Appends one watch frame: `be32(len)` + `WatchEvent{type, object: RawExtension{raw: body}}`.
pub fn push_frame(out: &mut BytesMut, event_type: &str, body: &[u8]) {
    let raw_extension = 1 + varint_len(body.len() as u64) + body.len();
    let event = 1
        + varint_len(event_type.len() as u64)
        + event_type.len()
        + 1
        + varint_len(raw_extension as u64)
        + raw_extension;
    let mut head = Vec::with_capacity(4 + 24 + event_type.len());
    // Frames over 4 GiB cannot happen: an event is a pod or a Status.
    head.extend_from_slice(&(event as u32).to_be_bytes());
    string_field(&mut head, 1, event_type);
    key(&mut head, 2, LEN);
    varint(&mut head, raw_extension as u64);
    key(&mut head, 1, LEN);
    varint(&mut head, body.len() as u64);
    out.reserve(head.len() + body.len());
    out.put_slice(&head);
    out.put_slice(body);
}

/// One event's protobuf forms, in one allocation: the watch frame, the object's body (a suffix
/// of the frame) and the bare pod (the `raw` inside the body).
#[derive(Debug, Clone)]
pub struct ProtobufPod {
    frame: Bytes,
    body: Range<usize>,
    pod: Range<usize>,
}

impl ProtobufPod {
    /// The forms of the bare pod message `pod`, made by an `event_type` event.
    pub fn new(event_type: &str, pod: &[u8]) -> Self {
        let (body, raw) = object_body("v1", "Pod", pod);
        let mut frame = BytesMut::new();
        push_frame(&mut frame, event_type, &body);
        let body_start = frame.len() - body.len();
        Self {
            frame: frame.freeze(),
            body: body_start..body_start + body.len(),
            pod: body_start + raw.start..body_start + raw.end,
        }
    }

    /// The watch frame of the event.
    pub fn frame(&self) -> &Bytes {
        &self.frame
    }

    /// The pod as an object body (`k8s\0` + `Unknown`), for a single-pod GET and for the
    /// `ADDED` frames of a watch's initial events.
    pub fn body(&self) -> Bytes {
        self.frame.slice(self.body.clone())
    }

    /// The bare `v1.Pod` message, for a list's items.
    pub fn pod(&self) -> &[u8] {
        &self.frame[self.pod.clone()]
    }
}

/// A `Status` as a protobuf body.
pub fn status_body(status: &Status) -> Vec<u8> {
    object_body("v1", "Status", &typed_status(status).encode_to_vec()).0
}

/// The `k8s-pb` form of a `Status`.
pub fn typed_status(status: &Status) -> meta::Status {
    let details = status.details.as_ref().map(|d| meta::StatusDetails {
        name: d["name"].as_str().map(str::to_owned),
        kind: d["kind"].as_str().map(str::to_owned),
        causes: d["causes"]
            .as_array()
            .map(|causes| {
                causes
                    .iter()
                    .map(|c| meta::StatusCause {
                        reason: c["reason"].as_str().map(str::to_owned),
                        message: c["message"].as_str().map(str::to_owned),
                        field: c["field"].as_str().map(str::to_owned),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        retry_after_seconds: d["retryAfterSeconds"].as_i64().map(|s| s as i32),
        ..meta::StatusDetails::default()
    });
    meta::Status {
        // The API server's Go encoder always writes the (empty) list metadata.
        metadata: Some(meta::ListMeta::default()),
        status: Some("Failure".to_owned()),
        message: Some(status.message.clone()),
        reason: Some(status.reason.to_owned()),
        details,
        code: Some(i32::from(status.code)),
    }
}

/// A `BOOKMARK` frame at `resource_version`; `initial_events_end` adds the annotation that
/// ends `sendInitialEvents`.
pub fn bookmark_frame(resource_version: u64, initial_events_end: bool) -> Bytes {
    let pod = core::Pod {
        metadata: Some(meta::ObjectMeta {
            resource_version: Some(resource_version.to_string()),
            annotations: if initial_events_end {
                [(INITIAL_EVENTS_END.to_owned(), "true".to_owned())].into()
            } else {
                Default::default()
            },
            ..meta::ObjectMeta::default()
        }),
        ..core::Pod::default()
    };
    let (body, _) = object_body("v1", "Pod", &pod.encode_to_vec());
    let mut frame = BytesMut::new();
    push_frame(&mut frame, "BOOKMARK", &body);
    frame.freeze()
}

/// An `ERROR` frame carrying `status`.
pub fn error_frame(status: &Status) -> Bytes {
    let mut frame = BytesMut::new();
    push_frame(&mut frame, "ERROR", &status_body(status));
    frame.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::encode::{pod_protobuf, typed_pod};
    use crate::serve::objects::PodState;
    use k8s_pb::apimachinery::pkg::runtime::Unknown;

    /// Splits a body into its envelope, checking the magic.
    fn unwrap_body(body: &[u8]) -> Unknown {
        assert_eq!(&body[..4], MAGIC, "the magic");
        Unknown::decode(&body[4..]).unwrap()
    }

    fn frames(mut stream: &[u8]) -> Vec<meta::WatchEvent> {
        let mut out = Vec::new();
        while !stream.is_empty() {
            let len = u32::from_be_bytes(stream[..4].try_into().unwrap()) as usize;
            out.push(meta::WatchEvent::decode(&stream[4..4 + len]).unwrap());
            stream = &stream[4 + len..];
        }
        out
    }

    fn state() -> PodState<'static> {
        PodState {
            namespace: "ns-0",
            name: "pod-4",
            node: None,
            id: 4,
            incarnation: 1,
            version: 2,
            resource_version: 99,
            created: 1_700_000_000,
            profile: workloads::PodProfile::Minimal,
            revision: Default::default(),
        }
    }

    #[test]
    fn an_event_frame_is_the_envelope_the_api_server_writes() {
        let pod = pod_protobuf(&state());
        let forms = ProtobufPod::new("MODIFIED", &pod);
        let events = frames(forms.frame());
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].r#type.as_deref(), Some("MODIFIED"));
        let raw = events[0].object.as_ref().unwrap().raw.as_deref().unwrap();
        assert_eq!(raw, &forms.body()[..], "the body is the frame's suffix");
        let unknown = unwrap_body(raw);
        let type_meta = unknown.type_meta.unwrap();
        assert_eq!(type_meta.api_version.as_deref(), Some("v1"));
        assert_eq!(type_meta.kind.as_deref(), Some("Pod"));
        assert_eq!(
            unknown.content_encoding.as_deref(),
            Some(""),
            "written, empty"
        );
        assert_eq!(unknown.content_type.as_deref(), Some(""), "written, empty");
        assert_eq!(unknown.raw.as_deref(), Some(forms.pod()));
        assert_eq!(core::Pod::decode(forms.pod()).unwrap(), typed_pod(&state()));
        // And the envelope is byte for byte what prost writes for the same Unknown.
        let expected = Unknown {
            type_meta: Some(k8s_pb::apimachinery::pkg::runtime::TypeMeta {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
            }),
            raw: Some(pod.clone()),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        assert_eq!(&forms.body()[4..], &expected.encode_to_vec()[..]);
        let event = meta::WatchEvent {
            r#type: Some("MODIFIED".into()),
            object: Some(k8s_pb::apimachinery::pkg::runtime::RawExtension {
                raw: Some(forms.body().to_vec()),
            }),
        };
        assert_eq!(&forms.frame()[4..], &event.encode_to_vec()[..]);
    }

    #[test]
    fn bookmarks_and_errors_are_frames_too() {
        let mut stream = BytesMut::new();
        stream.put_slice(&bookmark_frame(42, true));
        stream.put_slice(&error_frame(&Status::expired(
            "too old resource version: 1",
        )));
        let events = frames(&stream);
        assert_eq!(events[0].r#type.as_deref(), Some("BOOKMARK"));
        let bookmark = unwrap_body(events[0].object.as_ref().unwrap().raw.as_deref().unwrap());
        assert_eq!(bookmark.type_meta.unwrap().kind.as_deref(), Some("Pod"));
        let pod = core::Pod::decode(bookmark.raw.as_deref().unwrap()).unwrap();
        let metadata = pod.metadata.unwrap();
        assert_eq!(metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(metadata.annotations[INITIAL_EVENTS_END], "true");

        assert_eq!(events[1].r#type.as_deref(), Some("ERROR"));
        let error = unwrap_body(events[1].object.as_ref().unwrap().raw.as_deref().unwrap());
        assert_eq!(error.type_meta.unwrap().kind.as_deref(), Some("Status"));
        let status = meta::Status::decode(error.raw.as_deref().unwrap()).unwrap();
        assert_eq!(status.code, Some(410));
        assert_eq!(status.reason.as_deref(), Some("Expired"));
        assert_eq!(status.status.as_deref(), Some("Failure"));
    }

    #[test]
    fn status_details_carry_over() {
        let status = typed_status(&Status::too_large(9, 5));
        let details = status.details.unwrap();
        assert_eq!(details.retry_after_seconds, Some(1));
        assert_eq!(
            details.causes[0].reason.as_deref(),
            Some("ResourceVersionTooLarge")
        );
        let missing = typed_status(&Status::pod_not_found("p"));
        assert_eq!(missing.details.unwrap().name.as_deref(), Some("p"));
    }
}
