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

use super::objects::{bookmark_line, error_line, Status};
use super::protobuf::{self, push_frame, CONTENT_TYPE, WATCH_CONTENT_TYPE};
use super::store::StoredPod;

/// A wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/json` (the default).
    Json,
    /// `application/vnd.kubernetes.protobuf`.
    Protobuf,
}

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
            // A conversion (`as=Table`, `as=PartialObjectMetadata`) is not served.
            let converts = parts.any(|p| {
                p.split_once('=')
                    .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("as"))
            });
            if converts {
                continue;
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
        Format::negotiate(accept).unwrap_or(Format::Json)
    }

    /// The `Content-Type` of an object body.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Protobuf => CONTENT_TYPE,
        }
    }

    /// The `Content-Type` of a watch.
    pub fn watch_content_type(self) -> &'static str {
        match self {
            Format::Json => "application/json",
            Format::Protobuf => WATCH_CONTENT_TYPE,
        }
    }

    /// The event that made `pod`, as this format's watch sends it (the shared bytes).
    pub fn event(self, pod: &StoredPod) -> &[u8] {
        match self {
            Format::Json => &pod.line,
            Format::Protobuf => pod.protobuf().frame(),
        }
    }

    /// Appends `pod` as an `ADDED` event (a watch's initial events).
    pub fn push_added(self, chunk: &mut BytesMut, pod: &StoredPod) {
        match self {
            Format::Json => {
                chunk.put_slice(br#"{"type":"ADDED","object":"#);
                chunk.put_slice(&pod.object);
                chunk.put_slice(b"}\n");
            }
            Format::Protobuf => push_frame(chunk, "ADDED", &pod.protobuf().body()),
        }
    }

    /// A `BOOKMARK` event.
    pub fn bookmark(self, resource_version: u64, initial_events_end: bool) -> Bytes {
        match self {
            Format::Json => bookmark_line(resource_version, initial_events_end),
            Format::Protobuf => protobuf::bookmark_frame(resource_version, initial_events_end),
        }
    }

    /// An `ERROR` event carrying `status`.
    pub fn error(self, status: &Status) -> Bytes {
        match self {
            Format::Json => error_line(status),
            Format::Protobuf => protobuf::error_frame(status),
        }
    }

    /// `status` as a body.
    pub fn status_body(self, status: &Status) -> Bytes {
        match self {
            Format::Json => serde_json::to_vec(&status.to_json())
                .expect("a JSON value always serialises")
                .into(),
            Format::Protobuf => protobuf::status_body(status).into(),
        }
    }
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
        for refused in [
            "application/yaml",
            "text/html",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
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
