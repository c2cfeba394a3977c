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
//!
//! A watch body is cut into frames ([`frames`]: length-prefixed protobuf, or JSON lines) as its
//! chunks arrive. Bytes that cannot be cut or decoded (a truncated frame, one over 16 MiB, bad
//! magic, a malformed message) end the watch with an [`Error::Decode`] saying what was wrong;
//! the reflector reports it to its error handler and lists afresh. Nothing here panics on what
//! a server sends.

pub mod codec;
pub mod frames;

use std::fmt;
use std::future::Future;

use http::header::{ACCEPT, CONTENT_TYPE};
use http_body_util::BodyExt;
use kube::client::Body;

use super::kube::MAX_WATCH_TIMEOUT_SECS;
use super::lister_watcher::{Error, ListOptions, ListerWatcher, Page, WatchOptions, WatchStream};
pub use codec::{
    proto_key, proto_key_fn, Codec, Format, JsonCodec, Proto, ProtobufCodec, ResourcePath,
};
use frames::{Frames, Framing};

/// Lists and watches one resource through a [`kube::Client`], decoding with `C`.
pub struct WireListerWatcher<C> {
    client: kube::Client,
    codec: C,
    collection: String,
    label_selector: Option<String>,
    field_selector: Option<String>,
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
        }
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
                        let event = codec.event(format, &frame);
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
                            Ok(Some(last)) => Some((codec.event(format, &last), None)),
                            Ok(None) => None,
                            Err(e) => Some((Err(Error::Decode(e.to_string())), None)),
                        }
                    }
                }
            }
        }
    }))
}
