//! A [`ListerWatcher`] over kube-rs' [`kube::Api`], so a [`SharedInformer`](super::SharedInformer)
//! lists and watches a real Kubernetes API server (from a kubeconfig, in cluster, or any URL),
//! with kcache's indexes and sharded queue where kube-rs has a plain store.
//!
//! Built with the `kube` feature. The adapter only translates: a page of kcache's list is one
//! `Api::list` call (`limit`, `continue`, `resourceVersion`), a watch is one `Api::watch` call
//! (from a resource version, with bookmarks and `timeoutSeconds`), and kube-rs' events and
//! errors become the trait's. Retrying, relisting on `410`, backing off and resyncing stay the
//! reflector's job, exactly as with client-go's `ListWatch`.
//!
//! Build the client with `kube::Config::default_retry` off: kube-rs' own retry layer retries
//! 429, 503 and 504 up to 15 times inside one call, so the reflector would learn of a
//! `504 ResourceVersionTooLarge` (a server restarted without its state) only a minute or more
//! later, and its backoff and `Retry-After` handling would not apply.
//!
//! Kube objects carry their resource version in `metadata.resourceVersion`; with this feature
//! every [`kube::Resource`] is [`Versioned`] (an object without one reads as `""`), and
//! [`kube_key`] is client-go's `MetaNamespaceKeyFunc` for them.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt};
use kube::api::{Api, ListParams, WatchParams};
use kube::core::WatchEvent as KubeWatchEvent;
use kube::Resource;
use serde::de::DeserializeOwned;

use super::lister_watcher::{
    Error, ListOptions, ListerWatcher, Page, Status, Versioned, WatchEvent, WatchOptions,
    WatchStream,
};
use crate::key::{namespace_name_key, Key, KeyError, KeyFn};

/// The longest `timeoutSeconds` kube-rs accepts for a watch (it refuses 295 and above, because
/// its HTTP client gives up on a silent connection after 295 s). Longer asks are shortened.
pub const MAX_WATCH_TIMEOUT_SECS: u32 = 290;

impl<K: Resource> Versioned for K {
    fn resource_version(&self) -> &str {
        self.meta().resource_version.as_deref().unwrap_or("")
    }
}

/// client-go's `MetaNamespaceKeyFunc` for kube objects: `namespace/name`, or `name` for
/// cluster-scoped ones; an object without a name has no key.
pub fn kube_key<K: Resource>(obj: &K) -> Result<Key, KeyError> {
    let meta = obj.meta();
    namespace_name_key(
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or(""),
    )
}

/// [`kube_key`] as a [`KeyFn`], for [`SharedInformer::builder`](super::SharedInformer::builder).
pub fn kube_key_fn<K: Resource + 'static>() -> KeyFn<K> {
    Arc::new(|obj: &K| kube_key(obj))
}

/// Lists and watches `K` through a [`kube::Api<K>`] (all namespaces, one namespace, or
/// cluster-scoped: whatever the `Api` was made for), optionally narrowed by label and field
/// selectors.
pub struct KubeListerWatcher<K> {
    api: Api<K>,
    label_selector: Option<String>,
    field_selector: Option<String>,
}

impl<K> KubeListerWatcher<K> {
    /// Lists and watches everything `api` reaches.
    pub fn new(api: Api<K>) -> Self {
        Self {
            api,
            label_selector: None,
            field_selector: None,
        }
    }

    /// Only objects whose labels match `selector` (`app=web,tier!=db`).
    pub fn label_selector(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// Only objects whose fields match `selector` (`spec.nodeName=node-1`).
    pub fn field_selector(mut self, selector: impl Into<String>) -> Self {
        self.field_selector = Some(selector.into());
        self
    }
}

impl<K> fmt::Debug for KubeListerWatcher<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeListerWatcher")
            .field("resource", &std::any::type_name::<K>())
            .field("label_selector", &self.label_selector)
            .field("field_selector", &self.field_selector)
            .finish()
    }
}

/// The trait's error for one of kube-rs': the server's `Status` stays a status (so a `410`
/// still reads as expired and a `429` as retriable), a body that does not parse is a decode
/// error, and everything else (connect, TLS, HTTP, a cut stream) is a transport error worth
/// retrying.
pub fn from_kube_error(error: kube::Error) -> Error {
    match error {
        kube::Error::Api(status) => Error::Api(from_kube_status(&status)),
        kube::Error::SerdeError(e) => Error::Decode(e.to_string()),
        kube::Error::FromUtf8(e) => Error::Decode(e.to_string()),
        kube::Error::LinesCodecMaxLineLengthExceeded => {
            Error::Decode("a watch event longer than the line limit".to_owned())
        }
        other => Error::Transport(other.to_string()),
    }
}

/// The status, with the server's `details.retryAfterSeconds` (kube-rs drops the `Retry-After`
/// header, but the API server puts the same number in the body of every status that has one).
fn from_kube_status(status: &kube::core::Status) -> Status {
    let retry_after = status
        .details
        .as_ref()
        .map(|d| d.retry_after_seconds)
        .filter(|&seconds| seconds > 0)
        .map(|seconds| std::time::Duration::from_secs(u64::from(seconds)));
    Status::new(status.code, status.reason.clone(), status.message.clone())
        .with_retry_after(retry_after)
}

/// One kube-rs watch event as the trait's.
pub fn from_kube_event<K>(event: KubeWatchEvent<K>) -> WatchEvent<K> {
    match event {
        KubeWatchEvent::Added(o) => WatchEvent::Added(Arc::new(o)),
        KubeWatchEvent::Modified(o) => WatchEvent::Modified(Arc::new(o)),
        KubeWatchEvent::Deleted(o) => WatchEvent::Deleted(Arc::new(o)),
        KubeWatchEvent::Bookmark(b) => WatchEvent::Bookmark {
            resource_version: b.metadata.resource_version,
        },
        KubeWatchEvent::Error(status) => WatchEvent::Error(from_kube_status(&status)),
    }
}

impl<K> KubeListerWatcher<K> {
    fn list_params(&self, options: ListOptions) -> Result<ListParams, Error> {
        let limit = match options.limit {
            0 => None,
            n => Some(u32::try_from(n).map_err(|_| {
                Error::Api(Status::new(
                    400,
                    "BadRequest",
                    format!("list limit {n} does not fit the API's 32 bits"),
                ))
            })?),
        };
        Ok(ListParams {
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            limit,
            continue_token: options.continue_token,
            // "" is a consistent read (no resourceVersion at all); "0" and "N" are sent as they
            // are and the server applies its default match (not older than).
            resource_version: (!options.resource_version.is_empty())
                .then_some(options.resource_version),
            ..ListParams::default()
        })
    }

    fn watch_params(&self, options: &WatchOptions) -> WatchParams {
        let timeout = options.timeout.map(|t| {
            // Round up so a sub-second ask does not become 0 ("the server's default").
            let secs = t.as_secs() + u64::from(t.subsec_nanos() > 0);
            u32::try_from(secs)
                .unwrap_or(u32::MAX)
                .min(MAX_WATCH_TIMEOUT_SECS)
        });
        WatchParams {
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            timeout,
            bookmarks: options.allow_bookmarks,
            ..WatchParams::default()
        }
    }
}

impl<K> ListerWatcher<K> for KubeListerWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
{
    fn list(&self, options: ListOptions) -> impl Future<Output = Result<Page<K>, Error>> + Send {
        let params = self.list_params(options);
        async move {
            let list = self.api.list(&params?).await.map_err(from_kube_error)?;
            Ok(Page {
                items: list.items.into_iter().map(Arc::new).collect(),
                resource_version: list.metadata.resource_version.unwrap_or_default(),
                continue_token: list.metadata.continue_.filter(|token| !token.is_empty()),
            })
        }
    }

    fn watch(
        &self,
        options: WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<K>, Error>> + Send {
        let params = self.watch_params(&options);
        async move {
            let stream = self
                .api
                .watch(&params, &options.resource_version)
                .await
                .map_err(from_kube_error)?;
            let stream: WatchStream<K> = stream
                .map_ok(from_kube_event)
                .map_err(from_kube_error)
                .boxed();
            Ok(stream)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Namespace, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::time::Duration;

    fn pod(namespace: Option<&str>, name: Option<&str>, rv: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: namespace.map(str::to_owned),
                name: name.map(str::to_owned),
                resource_version: rv.map(str::to_owned),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn keys_and_versions_come_from_the_metadata() {
        let p = pod(Some("default"), Some("web-0"), Some("42"));
        assert_eq!(kube_key(&p).unwrap().as_str(), "default/web-0");
        assert_eq!(Versioned::resource_version(&p), "42");
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some("kube-system".into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        assert_eq!(kube_key(&ns).unwrap().as_str(), "kube-system");
        assert_eq!(Versioned::resource_version(&ns), "");
        assert!(kube_key(&pod(Some("default"), None, None)).is_err());
        assert!(kube_key(&pod(Some("default"), Some(""), None)).is_err());
        assert_eq!(
            kube_key(&pod(Some(""), Some("a"), None)).unwrap().as_str(),
            "a"
        );
        assert_eq!(
            (kube_key_fn::<Pod>())(&p).unwrap().as_str(),
            "default/web-0"
        );
    }

    #[test]
    fn a_410_from_kube_reads_as_expired_and_a_cut_stream_as_retriable() {
        let status = kube::core::Status::failure("too old resource version: 1 (5)", "Expired")
            .with_code(410);
        let error = from_kube_error(kube::Error::Api(status.clone().boxed()));
        assert!(error.is_expired(), "{error:?}");
        match from_kube_event::<Pod>(KubeWatchEvent::Error(status.boxed())) {
            WatchEvent::Error(s) => assert_eq!((s.code, s.reason.as_str()), (410, "Expired")),
            other => panic!("expected an Error event, got {other:?}"),
        }
        let cut = from_kube_error(kube::Error::ReadEvents(std::io::Error::other("reset")));
        assert!(cut.is_retriable_watch_error(), "{cut:?}");
        let garbled = serde_json::from_str::<Pod>("{").unwrap_err();
        assert!(matches!(
            from_kube_error(kube::Error::SerdeError(garbled)),
            Error::Decode(_)
        ));
    }

    #[test]
    fn events_keep_their_objects_and_bookmarks_their_version() {
        let p = pod(Some("ns"), Some("a"), Some("7"));
        match from_kube_event(KubeWatchEvent::Modified(p.clone())) {
            WatchEvent::Modified(o) => assert_eq!(*o, p),
            other => panic!("expected Modified, got {other:?}"),
        }
        let bookmark: KubeWatchEvent<Pod> = serde_json::from_str(
            r#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"99"}}}"#,
        )
        .unwrap();
        match from_kube_event(bookmark) {
            WatchEvent::Bookmark { resource_version } => assert_eq!(resource_version, "99"),
            other => panic!("expected a Bookmark, got {other:?}"),
        }
    }

    #[test]
    fn options_become_kube_params() {
        let client_free = |options: ListOptions| {
            // Called inside the runtime below: a kube Client needs one to be built.
            let lw = KubeListerWatcher::<Pod> {
                api: Api::all(fake_client()),
                label_selector: Some("app=web".into()),
                field_selector: None,
            };
            lw.list_params(options)
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let consistent = client_free(ListOptions {
                limit: 500,
                ..ListOptions::default()
            })
            .unwrap();
            assert_eq!(consistent.limit, Some(500));
            assert_eq!(consistent.resource_version, None);
            assert_eq!(consistent.label_selector.as_deref(), Some("app=web"));
            let any = client_free(ListOptions {
                limit: 0,
                continue_token: Some("tok".into()),
                resource_version: "0".into(),
            })
            .unwrap();
            assert_eq!(any.limit, None);
            assert_eq!(any.continue_token.as_deref(), Some("tok"));
            assert_eq!(any.resource_version.as_deref(), Some("0"));

            let lw = KubeListerWatcher::<Pod>::new(Api::all(fake_client()));
            let short = lw.watch_params(&WatchOptions {
                resource_version: "5".into(),
                allow_bookmarks: true,
                timeout: Some(Duration::from_millis(1_500)),
            });
            assert_eq!((short.timeout, short.bookmarks), (Some(2), true));
            let long = lw.watch_params(&WatchOptions {
                timeout: Some(Duration::from_secs(3_600)),
                ..WatchOptions::default()
            });
            assert_eq!(long.timeout, Some(MAX_WATCH_TIMEOUT_SECS));
        });
    }

    /// A client for an address nothing listens on: enough to build `Api`s, never called.
    fn fake_client() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }
}
