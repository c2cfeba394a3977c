//! kcache's own wire client (feature `wire`): a [`ListerWatcher`] that talks to a Kubernetes API
//! server through kube-rs' [`kube::Client`] (kubeconfig, auth, TLS, the base URL) but sends its
//! own requests and decodes the bytes itself.
//!
//! Why not kube-rs' `Api<K>` (that is [`KubeListerWatcher`](super::KubeListerWatcher)): it only
//! speaks JSON, and decoding JSON into `k8s_openapi` types is the largest single cost of a watch.
//! Here, as client-go does for built-in types, the client asks for
//! `application/vnd.kubernetes.protobuf, application/json` and decodes what the server answered
//! by its `Content-Type`:
//!
//! - [`ProtobufCodec<T>`]: protobuf straight into the generated `k8s-pb` message `T` (for pods,
//!   `k8s_pb::api::core::v1::Pod`), stored as a [`Proto<T>`]: the message itself, made
//!   [`Versioned`](super::Versioned), with no conversion into another type. The object type was chosen for speed:
//!   converting into `k8s_openapi`'s types would cost a second walk and a second set of
//!   allocations per event, as much as the decoding it follows.
//! - [`JsonCodec<K>`]: JSON through serde into any `kube::Resource` (custom resources, or a
//!   `k8s_openapi` type against a server without protobuf), asking for `application/json` only.
//! - [`MetadataCodec<K>`]: metadata only (`PartialObjectMetadata`, as client-go's metadata
//!   informers), into `kube`'s `PartialObjectMeta<K>`.
//!
//! Lists are paged, or, with [`WireListerWatcher::streaming_list`], streamed as client-go's
//! `WatchListClient` does (`sendInitialEvents=true`, ended by the `k8s.io/initial-events-end`
//! bookmark).
//!
//! A watch body is cut into frames ([`frames`]: length-prefixed protobuf, or JSON lines) as its
//! chunks arrive. Bytes that cannot be cut or decoded (a truncated frame, one over 16 MiB, bad
//! magic, a malformed message) end the watch with an [`Error::Decode`] saying what was wrong;
//! the reflector reports it to its error handler and lists afresh. Nothing here panics on what
//! a server sends.

pub mod codec;
pub mod compact;
pub mod frames;
mod protowire;

use std::fmt;
use std::future::Future;

use http::header::{ACCEPT, CONTENT_TYPE};
use http_body_util::BodyExt;
use kube::client::Body;

use super::kube::MAX_WATCH_TIMEOUT_SECS;
use super::lister_watcher::{
    Error, ListOptions, ListerWatcher, Page, WatchEvent, WatchOptions, WatchStream,
};
pub use codec::{
    proto_key, proto_key_fn, Codec, Format, JsonCodec, MetadataCodec, Proto, ProtobufCodec,
    ResourcePath,
};
pub use compact::{
    compact_key, compact_key_fn, index_by_field, index_by_label, index_by_namespace, pod_fields,
    CompactCodec, CompactObject, FieldId, FieldPath, OwnerRef,
};
use frames::{Frames, Framing};

/// The annotation of the bookmark that ends a streaming list's initial events.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Lists and watches one resource through a [`kube::Client`], decoding with `C`.
pub struct WireListerWatcher<C> {
    client: kube::Client,
    codec: C,
    collection: String,
    label_selector: Option<String>,
    field_selector: Option<String>,
    streaming_list: bool,
}

impl<T> WireListerWatcher<ProtobufCodec<T>>
where
    ProtobufCodec<T>: Codec,
{
    /// A built-in type over protobuf (see [`ProtobufCodec`]), across all namespaces.
    pub fn protobuf(client: kube::Client) -> Self {
        Self::new(client, ProtobufCodec::new())
    }
}

impl<K> WireListerWatcher<JsonCodec<K>>
where
    JsonCodec<K>: Codec,
{
    /// Any resource over JSON (see [`JsonCodec`]), across all namespaces.
    pub fn json(client: kube::Client) -> Self {
        Self::new(client, JsonCodec::new())
    }
}

impl<K> WireListerWatcher<MetadataCodec<K>>
where
    MetadataCodec<K>: Codec,
{
    /// Only the metadata of a resource (see [`MetadataCodec`]), across all namespaces.
    pub fn metadata(client: kube::Client) -> Self {
        Self::new(client, MetadataCodec::new())
    }
}

impl<C: Codec> WireListerWatcher<C> {
    /// The resource `codec` decodes, across all namespaces.
    pub fn new(client: kube::Client, codec: C) -> Self {
        let collection = codec.resource().collection(None);
        Self {
            client,
            codec,
            collection,
            label_selector: None,
            field_selector: None,
            streaming_list: false,
        }
    }

    /// Lists by streaming (client-go's `WatchListClient`): a list is a watch with
    /// `sendInitialEvents=true` and `resourceVersionMatch=NotOlderThan`, whose `ADDED` events
    /// up to the bookmark annotated `k8s.io/initial-events-end` are the list, at that
    /// bookmark's version. The body is decoded event by event as it arrives instead of being
    /// held whole, and the server sends from its watch cache rather than building a list. A
    /// server that refuses the parameters (400, 403, 405, 422, 501) gets a paged list instead.
    pub fn streaming_list(mut self, on: bool) -> Self {
        self.streaming_list = on;
        self
    }

    /// Only `namespace`.
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.collection = self.codec.resource().collection(Some(namespace));
        self
    }

    /// Only objects whose labels match `selector`.
    pub fn label_selector(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// Only objects whose fields match `selector`.
    pub fn field_selector(mut self, selector: impl Into<String>) -> Self {
        self.field_selector = Some(selector.into());
        self
    }

    fn query(&self) -> form_urlencoded::Serializer<'static, String> {
        let mut query = form_urlencoded::Serializer::new(String::new());
        if let Some(s) = &self.label_selector {
            query.append_pair("labelSelector", s);
        }
        if let Some(s) = &self.field_selector {
            query.append_pair("fieldSelector", s);
        }
        query
    }

    fn list_request(&self, options: &ListOptions) -> Result<http::Request<Body>, Error> {
        let mut query = self.query();
        if options.limit > 0 {
            query.append_pair("limit", &options.limit.to_string());
        }
        if let Some(token) = &options.continue_token {
            query.append_pair("continue", token);
        }
        if !options.resource_version.is_empty() {
            query.append_pair("resourceVersion", &options.resource_version);
        }
        self.request(query.finish(), self.codec.accept())
    }

    fn watch_request(&self, options: &WatchOptions) -> Result<http::Request<Body>, Error> {
        let mut query = self.query();
        query.append_pair("watch", "true");
        if !options.resource_version.is_empty() {
            query.append_pair("resourceVersion", &options.resource_version);
        }
        if options.allow_bookmarks {
            query.append_pair("allowWatchBookmarks", "true");
        }
        if let Some(t) = options.timeout {
            // Round up so a sub-second ask does not become 0 ("the server's default"); kube-rs'
            // HTTP client gives up on a silent connection after 295 s, hence the cap.
            let secs = (t.as_secs() + u64::from(t.subsec_nanos() > 0))
                .min(u64::from(MAX_WATCH_TIMEOUT_SECS));
            query.append_pair("timeoutSeconds", &secs.to_string());
        }
        self.request(query.finish(), self.codec.watch_accept())
    }

    fn streaming_list_request(&self, options: &ListOptions) -> Result<http::Request<Body>, Error> {
        let mut query = self.query();
        query.append_pair("watch", "true");
        query.append_pair("sendInitialEvents", "true");
        query.append_pair("resourceVersionMatch", "NotOlderThan");
        query.append_pair("allowWatchBookmarks", "true");
        if !options.resource_version.is_empty() {
            query.append_pair("resourceVersion", &options.resource_version);
        }
        self.request(query.finish(), self.codec.watch_accept())
    }

    /// A list by streaming (see [`Self::streaming_list`]); `Ok(None)` when the server refuses
    /// the parameters.
    async fn list_by_streaming(
        &self,
        options: &ListOptions,
    ) -> Result<Option<Page<C::Object>>, Error> {
        use futures_util::StreamExt;
        let (format, body) = match self.send(self.streaming_list_request(options)?).await {
            Ok(answer) => answer,
            Err(Error::Api(s)) if matches!(s.code, 400 | 403 | 405 | 422 | 501) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut events = watch_stream_marking_end(self.codec.clone(), format, body);
        let mut items = Vec::new();
        while let Some(event) = events.next().await {
            match event? {
                (WatchEvent::Added(obj), _) => items.push(obj),
                (WatchEvent::Bookmark { resource_version }, true) => {
                    return Ok(Some(Page {
                        items,
                        resource_version,
                        continue_token: None,
                    }))
                }
                (WatchEvent::Bookmark { .. }, false) => {}
                (WatchEvent::Error(status), _) => return Err(Error::Api(status)),
                (WatchEvent::Modified(_) | WatchEvent::Deleted(_), _) => {
                    return Err(Error::Decode(
                        "a streaming list sent a change before its initial-events-end bookmark"
                            .to_owned(),
                    ))
                }
            }
        }
        Err(Error::Transport(
            "the streaming list ended before its initial-events-end bookmark".to_owned(),
        ))
    }

    fn request(&self, query: String, accept: &str) -> Result<http::Request<Body>, Error> {
        let uri = if query.is_empty() {
            self.collection.clone()
        } else {
            format!("{}?{query}", self.collection)
        };
        http::Request::get(uri)
            .header(ACCEPT, accept)
            .body(Body::empty())
            .map_err(|e| Error::Transport(format!("cannot build the request: {e}")))
    }

    /// Sends `request`; a non-2xx answer becomes the server's `Status`.
    async fn send(&self, request: http::Request<Body>) -> Result<(Format, Body), Error> {
        let response = self
            .client
            .send(request)
            .await
            .map_err(|e| Error::Transport(e.to_string()))?;
        let (parts, body) = response.into_parts();
        let format = Format::of_content_type(
            parts
                .headers
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
        );
        if !parts.status.is_success() {
            let bytes = body
                .collect_bytes()
                .await
                .map_err(|e| Error::Transport(e.to_string()))?;
            return Err(Error::Api(codec::error_status(
                parts.status.as_u16(),
                format,
                &bytes,
            )));
        }
        Ok((format?, body))
    }
}

impl<C> fmt::Debug for WireListerWatcher<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WireListerWatcher")
            .field("codec", &std::any::type_name::<C>())
            .field("collection", &self.collection)
            .field("label_selector", &self.label_selector)
            .field("field_selector", &self.field_selector)
            .finish()
    }
}

impl<C: Codec> ListerWatcher<C::Object> for WireListerWatcher<C> {
    fn list(
        &self,
        options: ListOptions,
    ) -> impl Future<Output = Result<Page<C::Object>, Error>> + Send {
        let request = self.list_request(&options);
        async move {
            // A streaming list is one page; the pages of a paged list follow their token.
            if self.streaming_list && options.continue_token.is_none() {
                if let Some(page) = self.list_by_streaming(&options).await? {
                    return Ok(page);
                }
            }
            let (format, body) = self.send(request?).await?;
            let bytes = body
                .collect_bytes()
                .await
                .map_err(|e| Error::Transport(e.to_string()))?;
            self.codec.list(format, &bytes)
        }
    }

    fn watch(
        &self,
        options: WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<C::Object>, Error>> + Send {
        let request = self.watch_request(&options);
        async move {
            let (format, body) = self.send(request?).await?;
            Ok(watch_stream(self.codec.clone(), format, body))
        }
    }
}

/// The events of a watch body: frames cut as chunks arrive, each decoded; a framing or decode
/// error is the stream's last item.
fn watch_stream<C: Codec>(codec: C, format: Format, body: Body) -> WatchStream<C::Object> {
    use futures_util::StreamExt;
    Box::pin(watch_stream_marking_end(codec, format, body).map(|e| e.map(|(event, _)| event)))
}

/// Whether a bookmark's frame carries the `k8s.io/initial-events-end` annotation. Bookmarks
/// are small and rare, so the frame's bytes are searched rather than decoded: the key is
/// written as it is in JSON and in protobuf, and the server only ever sets it to `"true"`.
fn ends_initial_events(frame: &[u8]) -> bool {
    frame
        .windows(INITIAL_EVENTS_END.len())
        .any(|w| w == INITIAL_EVENTS_END.as_bytes())
}

/// What [`watch_stream_marking_end`] yields.
type MarkedEvents<T> = std::pin::Pin<
    Box<dyn futures_util::Stream<Item = Result<(WatchEvent<T>, bool), Error>> + Send>,
>;

/// [`watch_stream`], each event with whether it is the bookmark that ends a streaming list's
/// initial events.
fn watch_stream_marking_end<C: Codec>(
    codec: C,
    format: Format,
    body: Body,
) -> MarkedEvents<C::Object> {
    let decode = move |codec: &C, frame: &[u8]| {
        codec.event(format, frame).map(|event| {
            let end = matches!(event, WatchEvent::Bookmark { .. }) && ends_initial_events(frame);
            (event, end)
        })
    };
    let framing = match format {
        Format::Json => Framing::Lines,
        Format::Protobuf => Framing::LengthPrefixed,
    };
    let state = Some((body, Frames::new(framing)));
    Box::pin(futures_util::stream::unfold(state, move |state| {
        let codec = codec.clone();
        async move {
            let (mut body, mut frames) = state?;
            loop {
                match frames.next_frame() {
                    Ok(Some(frame)) => {
                        let event = decode(&codec, &frame);
                        let next = event.is_ok().then_some((body, frames));
                        return Some((event, next));
                    }
                    Ok(None) => {}
                    Err(e) => return Some((Err(Error::Decode(e.to_string())), None)),
                }
                match body.frame().await {
                    Some(Ok(chunk)) => {
                        if let Ok(data) = chunk.into_data() {
                            frames.push(&data);
                        }
                    }
                    Some(Err(e)) => return Some((Err(Error::Transport(e.to_string())), None)),
                    None => {
                        return match frames.finish() {
                            Ok(Some(last)) => Some((decode(&codec, &last), None)),
                            Ok(None) => None,
                            Err(e) => Some((Err(Error::Decode(e.to_string())), None)),
                        }
                    }
                }
            }
        }
    }))
}
