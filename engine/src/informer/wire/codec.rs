//! Decoding what an API server sends, by the content type it answered with: protobuf into the
//! `k8s-pb` messages ([`ProtobufCodec`]), JSON through serde ([`JsonCodec`]).
//!
//! Protobuf bodies are read without copying the envelope: the `k8s\0` magic, the
//! `runtime.Unknown` around an object, the bare `WatchEvent` of a watch frame and its
//! `RawExtension` are walked as borrowed slices, and only the object itself is decoded (by
//! prost, into the generated message). Every malformed input is an [`Error::Decode`] saying
//! what was wrong, never a panic.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use prost::Message;
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::super::lister_watcher::{Error, Page, Status, Versioned, WatchEvent};
use super::protowire::{Fields, Value};
use crate::key::{namespace_name_key, Key, KeyError, KeyFn};

/// What starts every protobuf object body.
pub const MAGIC: &[u8; 4] = b"k8s\0";
/// The protobuf content type.
pub const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// The JSON content type.
pub const JSON: &str = "application/json";

/// The format of a body, from its `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `application/json` (any parameters).
    Json,
    /// `application/vnd.kubernetes.protobuf` (any parameters, `;stream=watch` among them).
    Protobuf,
}

impl Format {
    /// The format of a `Content-Type`; a missing one is JSON (what servers default to).
    pub fn of_content_type(content_type: Option<&str>) -> Result<Format, Error> {
        let Some(content_type) = content_type else {
            return Ok(Format::Json);
        };
        let essence = content_type.split(';').next().unwrap_or("").trim();
        if essence.eq_ignore_ascii_case(PROTOBUF) {
            Ok(Format::Protobuf)
        } else if essence.eq_ignore_ascii_case(JSON) {
            Ok(Format::Json)
        } else {
            Err(Error::Decode(format!(
                "the server answered with content type {content_type:?}, neither JSON nor protobuf"
            )))
        }
    }
}

/// Decodes one resource's lists and watch events.
///
/// Codecs are stateless markers: a watch stream owns a clone.
pub trait Codec: Clone + Send + Sync + 'static {
    /// The object the informer stores.
    type Object: Versioned + Send + Sync + 'static;
    /// The `Accept` header of lists.
    fn accept(&self) -> &'static str;
    /// The `Accept` header of watches.
    fn watch_accept(&self) -> &'static str;
    /// The resource's path, without namespace: group, version and plural.
    fn resource(&self) -> ResourcePath;
    /// One list page, as the server answered it.
    fn list(&self, format: Format, body: &[u8]) -> Result<Page<Self::Object>, Error>;
    /// One watch event (a frame or a line, without its length or newline).
    fn event(&self, format: Format, frame: &[u8]) -> Result<WatchEvent<Self::Object>, Error>;
}

/// Where a resource lives: `/api/{version}` or `/apis/{group}/{version}`, then its plural.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    /// The API group; `""` for the core group.
    pub group: String,
    /// The version (`v1`).
    pub version: String,
    /// The plural (`pods`).
    pub plural: String,
}

impl ResourcePath {
    /// The collection's path, in `namespace` or across all of them.
    pub fn collection(&self, namespace: Option<&str>) -> String {
        let mut path = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        if let Some(ns) = namespace {
            path.push_str("/namespaces/");
            path.push_str(ns);
        }
        path.push('/');
        path.push_str(&self.plural);
        path
    }
}

/// A `k8s-pb` message as the informer stores it: the decoded message itself (no conversion),
/// made [`Versioned`] by its `metadata.resourceVersion`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Proto<T>(pub T);

impl<T> std::ops::Deref for Proto<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

fn object_meta<T: k8s_pb::Metadata<Ty = meta::ObjectMeta>>(obj: &T) -> Option<&meta::ObjectMeta> {
    obj.metadata()
}

impl<T: k8s_pb::Metadata<Ty = meta::ObjectMeta>> Versioned for Proto<T> {
    fn resource_version(&self) -> &str {
        object_meta(&self.0)
            .and_then(|m| m.resource_version.as_deref())
            .unwrap_or("")
    }
}

/// client-go's `MetaNamespaceKeyFunc` for [`Proto`] objects: `namespace/name`, or `name` for
/// cluster-scoped ones; an object without a name has no key.
pub fn proto_key<T: k8s_pb::Metadata<Ty = meta::ObjectMeta>>(
    obj: &Proto<T>,
) -> Result<Key, KeyError> {
    let meta = object_meta(&obj.0);
    namespace_name_key(
        meta.and_then(|m| m.namespace.as_deref()).unwrap_or(""),
        meta.and_then(|m| m.name.as_deref()).unwrap_or(""),
    )
}

/// [`proto_key`] as a [`KeyFn`].
pub fn proto_key_fn<T>() -> KeyFn<Proto<T>>
where
    T: k8s_pb::Metadata<Ty = meta::ObjectMeta> + 'static,
{
    Arc::new(|obj: &Proto<T>| proto_key(obj))
}

/// Built-in types over protobuf, as client-go's clients for them: asks for
/// `application/vnd.kubernetes.protobuf, application/json` and decodes protobuf answers
/// straight into `T` (a `k8s-pb` message). A server that answers JSON anyway (one without
/// protobuf support) gets a decode error that says to use [`JsonCodec`] for it: `k8s-pb`'s
/// messages have no JSON form.
pub struct ProtobufCodec<T>(PhantomData<fn() -> T>);

impl<T> ProtobufCodec<T> {
    /// The codec.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Clone for ProtobufCodec<T> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<T> Default for ProtobufCodec<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for ProtobufCodec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProtobufCodec<{}>", std::any::type_name::<T>())
    }
}

fn json_answer_to_protobuf_client() -> Error {
    Error::Decode(
        "the server answered JSON to a protobuf client (ProtobufCodec); it does not serve \
         this type as protobuf: use JsonCodec with a k8s-openapi type for this server"
            .to_owned(),
    )
}

impl<T> Codec for ProtobufCodec<T>
where
    T: Message
        + Default
        + k8s_pb::Resource
        + k8s_pb::Metadata<Ty = meta::ObjectMeta>
        + Send
        + Sync
        + 'static,
{
    type Object = Proto<T>;

    fn accept(&self) -> &'static str {
        "application/vnd.kubernetes.protobuf, application/json"
    }

    fn watch_accept(&self) -> &'static str {
        "application/vnd.kubernetes.protobuf;stream=watch, application/json"
    }

    fn resource(&self) -> ResourcePath {
        ResourcePath {
            group: T::GROUP.to_owned(),
            version: T::VERSION.to_owned(),
            plural: T::URL_PATH_SEGMENT.to_owned(),
        }
    }

    fn list(&self, format: Format, body: &[u8]) -> Result<Page<Proto<T>>, Error> {
        if format == Format::Json {
            return Err(json_answer_to_protobuf_client());
        }
        protobuf_list(body, |item| {
            let item = T::decode(item).map_err(|e| decode_error("a list item", e))?;
            Ok(Arc::new(Proto(item)))
        })
    }

    fn event(&self, format: Format, frame: &[u8]) -> Result<WatchEvent<Proto<T>>, Error> {
        if format == Format::Json {
            return Err(json_answer_to_protobuf_client());
        }
        let (event_type, raw) = watch_event(frame)?;
        let object = unwrap_object(raw)?;
        let decode = || {
            T::decode(object.raw)
                .map(|o| Arc::new(Proto(o)))
                .map_err(|e| decode_error("a watch event's object", e))
        };
        Ok(match event_type {
            "ADDED" => WatchEvent::Added(decode()?),
            "MODIFIED" => WatchEvent::Modified(decode()?),
            "DELETED" => WatchEvent::Deleted(decode()?),
            "BOOKMARK" => WatchEvent::Bookmark {
                resource_version: decode()?.resource_version().to_owned(),
            },
            "ERROR" => WatchEvent::Error(protobuf_status(object.raw)?),
            other => {
                return Err(Error::Decode(format!(
                    "a watch event of unknown type {other:?}"
                )))
            }
        })
    }
}

/// A protobuf list body (`k8s\0` + `Unknown` + a `…List` message): its metadata read, each
/// item (field 2, the item's own message) made by `item`.
pub(crate) fn protobuf_list<T>(
    body: &[u8],
    mut item: impl FnMut(&[u8]) -> Result<Arc<T>, Error>,
) -> Result<Page<T>, Error> {
    let list = unwrap_object(body)?;
    let mut page = Page {
        items: Vec::new(),
        resource_version: String::new(),
        continue_token: None,
    };
    for field in Fields::new(list.raw) {
        match field? {
            (1, Value::Bytes(bytes)) => {
                let metadata = meta::ListMeta::decode(bytes)
                    .map_err(|e| decode_error("the list's metadata", e))?;
                page.resource_version = metadata.resource_version.unwrap_or_default();
                page.continue_token = metadata.r#continue.filter(|c| !c.is_empty());
            }
            (2, Value::Bytes(bytes)) => page.items.push(item(bytes)?),
            _ => {}
        }
    }
    Ok(page)
}

/// Any serde type over JSON (custom resources, `k8s-openapi` types): asks for
/// `application/json` only.
pub struct JsonCodec<K>(PhantomData<fn() -> K>);

impl<K> JsonCodec<K> {
    /// The codec.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<K> Clone for JsonCodec<K> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<K> Default for JsonCodec<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> fmt::Debug for JsonCodec<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JsonCodec<{}>", std::any::type_name::<K>())
    }
}

#[derive(Deserialize)]
#[serde(bound = "K: DeserializeOwned")]
struct JsonList<K> {
    #[serde(default)]
    metadata: JsonListMeta,
    #[serde(default = "Vec::new")]
    items: Vec<K>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JsonListMeta {
    #[serde(default)]
    pub(crate) resource_version: Option<String>,
    #[serde(default, rename = "continue")]
    pub(crate) continue_token: Option<String>,
}

/// A watch line: `type` first, then the object decoded straight into its type.
#[derive(Deserialize)]
#[serde(tag = "type", content = "object", bound = "K: DeserializeOwned")]
enum JsonEvent<K> {
    #[serde(rename = "ADDED")]
    Added(K),
    #[serde(rename = "MODIFIED")]
    Modified(K),
    #[serde(rename = "DELETED")]
    Deleted(K),
    #[serde(rename = "BOOKMARK")]
    Bookmark(JsonBookmark),
    #[serde(rename = "ERROR")]
    Error(JsonStatus),
}

#[derive(Deserialize)]
pub(crate) struct JsonBookmark {
    pub(crate) metadata: JsonBookmarkMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JsonBookmarkMeta {
    pub(crate) resource_version: String,
}

/// A `metav1.Status` as JSON.
#[derive(Debug, Deserialize, Default)]
pub(crate) struct JsonStatus {
    #[serde(default)]
    code: u16,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    message: String,
}

impl From<JsonStatus> for Status {
    fn from(s: JsonStatus) -> Status {
        Status::new(s.code, s.reason, s.message)
    }
}

fn json_error(what: &str, e: serde_json::Error) -> Error {
    Error::Decode(format!("{what} is not valid JSON for the type: {e}"))
}

/// Decodes JSON after one UTF-8 check of the whole input: serde_json then reads every string
/// from a `&str` without checking each again, 11% fewer instructions per watch event than
/// decoding from the bytes (loadgen/examples/decode_cost.rs under callgrind, for a served pod:
/// 20.5k against 23.1k instructions).
fn from_json<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, Error> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| Error::Decode(format!("{what} is not UTF-8: {e}")))?;
    serde_json::from_str(text).map_err(|e| json_error(what, e))
}

impl<K> Codec for JsonCodec<K>
where
    K: kube::Resource<DynamicType = ()> + DeserializeOwned + Versioned + Send + Sync + 'static,
{
    type Object = K;

    fn accept(&self) -> &'static str {
        JSON
    }

    fn watch_accept(&self) -> &'static str {
        JSON
    }

    fn resource(&self) -> ResourcePath {
        ResourcePath {
            group: K::group(&()).into_owned(),
            version: K::version(&()).into_owned(),
            plural: K::plural(&()).into_owned(),
        }
    }

    fn list(&self, format: Format, body: &[u8]) -> Result<Page<K>, Error> {
        if format == Format::Protobuf {
            return Err(Error::Decode(
                "the server answered protobuf to a JSON-only request".to_owned(),
            ));
        }
        let list: JsonList<K> = from_json("a list", body)?;
        Ok(Page {
            items: list.items.into_iter().map(Arc::new).collect(),
            resource_version: list.metadata.resource_version.unwrap_or_default(),
            continue_token: list.metadata.continue_token.filter(|c| !c.is_empty()),
        })
    }

    fn event(&self, format: Format, frame: &[u8]) -> Result<WatchEvent<K>, Error> {
        if format == Format::Protobuf {
            return Err(Error::Decode(
                "the server answered protobuf to a JSON-only watch".to_owned(),
            ));
        }
        let event: JsonEvent<K> = from_json("a watch event", frame)?;
        Ok(match event {
            JsonEvent::Added(o) => WatchEvent::Added(Arc::new(o)),
            JsonEvent::Modified(o) => WatchEvent::Modified(Arc::new(o)),
            JsonEvent::Deleted(o) => WatchEvent::Deleted(Arc::new(o)),
            JsonEvent::Bookmark(b) => WatchEvent::Bookmark {
                resource_version: b.metadata.resource_version,
            },
            JsonEvent::Error(s) => WatchEvent::Error(s.into()),
        })
    }
}

/// Metadata only, as client-go's metadata informers: asks for
/// `application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1` (lists) and
/// `…;as=PartialObjectMetadata;…` (watches), with plain `application/json` as the fallback,
/// and decodes into `kube`'s `PartialObjectMeta<K>` (the object's `metadata`, nothing else;
/// from a server that sends whole objects anyway, the rest is skipped while decoding).
pub struct MetadataCodec<K>(PhantomData<fn() -> K>);

impl<K> MetadataCodec<K> {
    /// The codec.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<K> Clone for MetadataCodec<K> {
    fn clone(&self) -> Self {
        Self::new()
    }
}

impl<K> Default for MetadataCodec<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K> fmt::Debug for MetadataCodec<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MetadataCodec<{}>", std::any::type_name::<K>())
    }
}

impl<K> Codec for MetadataCodec<K>
where
    K: kube::Resource<DynamicType = ()> + Send + Sync + 'static,
    JsonCodec<kube::core::PartialObjectMeta<K>>: Codec<Object = kube::core::PartialObjectMeta<K>>,
{
    type Object = kube::core::PartialObjectMeta<K>;

    fn accept(&self) -> &'static str {
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
    }

    fn watch_accept(&self) -> &'static str {
        "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"
    }

    fn resource(&self) -> ResourcePath {
        ResourcePath {
            group: K::group(&()).into_owned(),
            version: K::version(&()).into_owned(),
            plural: K::plural(&()).into_owned(),
        }
    }

    fn list(&self, format: Format, body: &[u8]) -> Result<Page<Self::Object>, Error> {
        JsonCodec::<Self::Object>::new().list(format, body)
    }

    fn event(&self, format: Format, frame: &[u8]) -> Result<WatchEvent<Self::Object>, Error> {
        JsonCodec::<Self::Object>::new().event(format, frame)
    }
}

/// The `Status` of an error answer, in whichever format it came; a body that is no status
/// still gives one, with the HTTP code and the body's start as its message.
pub fn error_status(code: u16, format: Result<Format, Error>, body: &[u8]) -> Status {
    let decoded = match format {
        Ok(Format::Protobuf) => unwrap_object(body).and_then(|o| protobuf_status(o.raw)),
        Ok(Format::Json) => serde_json::from_slice::<JsonStatus>(body)
            .map(Status::from)
            .map_err(|e| json_error("a status", e)),
        Err(e) => Err(e),
    };
    match decoded {
        Ok(mut status) => {
            if status.code == 0 {
                status.code = code;
            }
            status
        }
        Err(_) => Status::new(
            code,
            "",
            String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        ),
    }
}

pub(crate) fn protobuf_status(raw: &[u8]) -> Result<Status, Error> {
    let status = meta::Status::decode(raw).map_err(|e| decode_error("a status", e))?;
    Ok(Status::new(
        status.code.and_then(|c| u16::try_from(c).ok()).unwrap_or(0),
        status.reason.unwrap_or_default(),
        status.message.unwrap_or_default(),
    ))
}

pub(crate) fn decode_error(what: &str, e: prost::DecodeError) -> Error {
    Error::Decode(format!("{what} is not a valid protobuf message: {e}"))
}

/// An object body's envelope (`k8s\0` + `runtime.Unknown`), borrowed.
#[derive(Debug, PartialEq, Eq)]
pub struct Unknown<'a> {
    /// `typeMeta.apiVersion`.
    pub api_version: &'a str,
    /// `typeMeta.kind`.
    pub kind: &'a str,
    /// The object's own message.
    pub raw: &'a [u8],
}

/// Checks the magic and reads the envelope of an object body.
pub fn unwrap_object(body: &[u8]) -> Result<Unknown<'_>, Error> {
    let Some(rest) = body.strip_prefix(MAGIC) else {
        return Err(Error::Decode(format!(
            "a protobuf body must start with the magic k8s\\0; it starts with {:02x?}",
            &body[..body.len().min(4)]
        )));
    };
    let mut unknown = Unknown {
        api_version: "",
        kind: "",
        raw: &[],
    };
    for field in Fields::new(rest) {
        match field? {
            (1, Value::Bytes(type_meta)) => {
                for field in Fields::new(type_meta) {
                    match field? {
                        (1, Value::Bytes(v)) => unknown.api_version = utf8(v, "apiVersion")?,
                        (2, Value::Bytes(v)) => unknown.kind = utf8(v, "kind")?,
                        _ => {}
                    }
                }
            }
            (2, Value::Bytes(raw)) => unknown.raw = raw,
            (3, Value::Bytes(encoding)) if !encoding.is_empty() => {
                return Err(Error::Decode(format!(
                    "a protobuf body with content encoding {:?} (only plain bodies are read)",
                    String::from_utf8_lossy(encoding)
                )))
            }
            _ => {}
        }
    }
    Ok(unknown)
}

/// The inverse of [`unwrap_object`]: an object body (`k8s\0` + a `runtime.Unknown` of
/// `apiVersion: v1`, `kind` and `raw`), as an API server sends it; for fakes and tests.
pub fn wrap_object(kind: &str, raw: Vec<u8>) -> Vec<u8> {
    use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown as PbUnknown};
    let mut out = MAGIC.to_vec();
    PbUnknown {
        type_meta: Some(TypeMeta {
            api_version: Some("v1".into()),
            kind: Some(kind.into()),
        }),
        raw: Some(raw),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    }
    .encode(&mut out)
    .expect("a Vec grows to fit");
    out
}

/// The inverse of [`watch_event`]: a watch frame of `event_type` around an object body; for
/// fakes and tests.
pub fn watch_frame(event_type: &str, object: Vec<u8>) -> Vec<u8> {
    use k8s_pb::apimachinery::pkg::runtime::RawExtension;
    meta::WatchEvent {
        r#type: Some(event_type.into()),
        object: Some(RawExtension { raw: Some(object) }),
    }
    .encode_to_vec()
}

/// A watch frame's bare `WatchEvent`: its type and its object's bytes (`object.raw`).
pub fn watch_event(frame: &[u8]) -> Result<(&str, &[u8]), Error> {
    let mut event_type = None;
    let mut raw: &[u8] = &[];
    for field in Fields::new(frame) {
        match field? {
            (1, Value::Bytes(t)) => event_type = Some(utf8(t, "a watch event's type")?),
            (2, Value::Bytes(extension)) => {
                for field in Fields::new(extension) {
                    if let (1, Value::Bytes(r)) = field? {
                        raw = r;
                    }
                }
            }
            _ => {}
        }
    }
    match event_type {
        Some(t) => Ok((t, raw)),
        None => Err(Error::Decode(
            "a watch frame without an event type".to_owned(),
        )),
    }
}

fn utf8<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, Error> {
    std::str::from_utf8(bytes).map_err(|_| Error::Decode(format!("{what} is not UTF-8")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use super::{watch_frame as frame, wrap_object as body};
    use k8s_pb::api::core::v1::Pod;
    use proptest::prelude::*;

    fn pod(ns: &str, name: &str, rv: &str) -> Pod {
        Pod {
            metadata: Some(meta::ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..meta::ObjectMeta::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn protobuf_events_decode_into_the_message() {
        let codec = ProtobufCodec::<Pod>::new();
        let p = pod("ns", "a", "7");
        let event = codec
            .event(
                Format::Protobuf,
                &frame("MODIFIED", body("Pod", p.encode_to_vec())),
            )
            .unwrap();
        match event {
            WatchEvent::Modified(o) => {
                assert_eq!(o.0, p);
                assert_eq!(proto_key(&o).unwrap().as_str(), "ns/a");
                assert_eq!(o.resource_version(), "7");
            }
            other => panic!("{other:?}"),
        }
        let bookmark = codec
            .event(
                Format::Protobuf,
                &frame("BOOKMARK", body("Pod", pod("", "", "9").encode_to_vec())),
            )
            .unwrap();
        assert!(
            matches!(bookmark, WatchEvent::Bookmark { resource_version } if resource_version == "9")
        );
        let status = meta::Status {
            code: Some(410),
            reason: Some("Expired".into()),
            message: Some("too old".into()),
            ..meta::Status::default()
        };
        let error = codec
            .event(
                Format::Protobuf,
                &frame("ERROR", body("Status", status.encode_to_vec())),
            )
            .unwrap();
        assert!(matches!(&error, WatchEvent::Error(s) if s.code == 410 && s.reason == "Expired"));
    }

    #[test]
    fn bad_magic_and_bad_messages_are_decode_errors() {
        let codec = ProtobufCodec::<Pod>::new();
        let mut bad = body("Pod", pod("n", "a", "1").encode_to_vec());
        bad[0] = b'K';
        let err = codec
            .event(Format::Protobuf, &frame("ADDED", bad))
            .unwrap_err();
        assert!(err.to_string().contains("magic"), "{err}");
        let err = codec
            .event(Format::Protobuf, &[0x0a, 0x40, b'A'])
            .unwrap_err();
        assert!(matches!(err, Error::Decode(_)), "{err}");
        let err = codec.event(Format::Json, b"{}").unwrap_err();
        assert!(err.to_string().contains("JsonCodec"), "{err}");
    }

    #[test]
    fn a_protobuf_list_reads_its_metadata_and_items() {
        let list = k8s_pb::api::core::v1::PodList {
            metadata: Some(meta::ListMeta {
                resource_version: Some("12".into()),
                r#continue: Some("12-2".into()),
                ..meta::ListMeta::default()
            }),
            items: vec![pod("a", "x", "3"), pod("b", "y", "4")],
        };
        let page = ProtobufCodec::<Pod>::new()
            .list(Format::Protobuf, &body("PodList", list.encode_to_vec()))
            .unwrap();
        assert_eq!(page.resource_version, "12");
        assert_eq!(page.continue_token.as_deref(), Some("12-2"));
        let items: Vec<Pod> = page.items.iter().map(|p| p.0.clone()).collect();
        assert_eq!(items, list.items);
    }

    #[test]
    fn statuses_decode_in_either_format() {
        let json = br#"{"kind":"Status","code":410,"reason":"Expired","message":"gone"}"#;
        assert_eq!(
            error_status(410, Ok(Format::Json), json),
            Status::new(410, "Expired", "gone")
        );
        assert_eq!(
            error_status(502, Ok(Format::Json), b"<html>bad gateway"),
            Status::new(502, "", "<html>bad gateway")
        );
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let codec = ProtobufCodec::<Pod>::new();
            let _ = codec.event(Format::Protobuf, &bytes);
            let _ = codec.list(Format::Protobuf, &bytes);
            let mut with_magic = MAGIC.to_vec();
            with_magic.extend_from_slice(&bytes);
            let _ = codec.list(Format::Protobuf, &with_magic);
            let _ = unwrap_object(&with_magic);
        }
    }
}
