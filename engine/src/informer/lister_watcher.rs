//! What an informer reads from: a [`ListerWatcher`] lists a resource in pages and watches it for
//! changes from a resource version (client-go's `ListerWatcher`, `ListOptions`, `watch.Event`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use thiserror::Error;

use crate::queue::QueueError;

/// An object that carries a resource version (Kubernetes' `metadata.resourceVersion`).
///
/// Resource versions are opaque strings: an informer only stores the newest one it saw and
/// hands it back to the server, and compares two of them for equality (a resync update whose
/// old and new objects have the same version is a *sync*, not a change).
pub trait Versioned {
    /// The object's resource version.
    fn resource_version(&self) -> &str;
}

/// An object whose resource version a server can set: what a server that stores typed objects
/// (the simulated API server in the `kcache-sim` crate, a test's own) needs to stamp a write.
pub trait SetResourceVersion: Versioned {
    /// Sets the object's resource version.
    fn set_resource_version(&mut self, resource_version: &str);
}

/// How to list (client-go's `metav1.ListOptions` as a list uses it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// At most this many items per page; 0 asks for everything at once.
    pub limit: usize,
    /// The `continue` token of the previous page; `None` for the first page.
    pub continue_token: Option<String>,
    /// `""`: the most recent state (a consistent read); `"0"`: any state the server has at hand;
    /// `"N"`: a state not older than `N`.
    pub resource_version: String,
}

/// One page of a list.
pub struct Page<T> {
    /// The objects of this page.
    pub items: Vec<Arc<T>>,
    /// The resource version the whole list is consistent with.
    pub resource_version: String,
    /// Pass this back in [`ListOptions::continue_token`] for the next page; `None` on the last.
    pub continue_token: Option<String>,
}

impl<T> fmt::Debug for Page<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Page")
            .field("items", &self.items.len())
            .field("resource_version", &self.resource_version)
            .field("continue_token", &self.continue_token)
            .finish()
    }
}

/// How to watch (client-go's `metav1.ListOptions` as a watch uses it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchOptions {
    /// Send every change after this version. `""` or `"0"`: first an `Added` for every current
    /// object, then the changes.
    pub resource_version: String,
    /// Let the server send [`WatchEvent::Bookmark`]s.
    pub allow_bookmarks: bool,
    /// The server ends the watch after this long (`timeoutSeconds`); `None`: its own default.
    pub timeout: Option<Duration>,
}

/// A status the server answered with (Kubernetes' `metav1.Status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// The HTTP status code: 410 for a resource version too old, 429 for too many requests…
    pub code: u16,
    /// The machine-readable reason (`Expired`, `Gone`, `TooManyRequests`, `BadRequest`, …).
    pub reason: String,
    /// For humans.
    pub message: String,
    /// How long the server asked the client to wait before trying again (the `Retry-After`
    /// header, or `details.retryAfterSeconds`), if it did.
    pub retry_after: Option<Duration>,
}

impl Status {
    /// A status from its parts.
    pub fn new(code: u16, reason: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// The same status, asking the client to wait `retry_after` before trying again.
    pub fn with_retry_after(mut self, retry_after: Option<Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// `410 Expired`: the resource version asked for is older than the server keeps.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

/// One event of a watch (client-go's `watch.Event`).
pub enum WatchEvent<T> {
    /// An object was created (or, on a watch from `""`/`"0"`, already existed).
    Added(Arc<T>),
    /// An object changed.
    Modified(Arc<T>),
    /// An object was deleted; this is its last state.
    Deleted(Arc<T>),
    /// Every change up to this version has been sent; nothing changed for this watcher.
    Bookmark {
        /// The version the watcher is now up to date with.
        resource_version: String,
    },
    /// The server ended the watch with a status (410 when the version is too old).
    Error(Status),
}

impl<T> Clone for WatchEvent<T> {
    fn clone(&self) -> Self {
        match self {
            WatchEvent::Added(o) => WatchEvent::Added(Arc::clone(o)),
            WatchEvent::Modified(o) => WatchEvent::Modified(Arc::clone(o)),
            WatchEvent::Deleted(o) => WatchEvent::Deleted(Arc::clone(o)),
            WatchEvent::Bookmark { resource_version } => WatchEvent::Bookmark {
                resource_version: resource_version.clone(),
            },
            WatchEvent::Error(s) => WatchEvent::Error(s.clone()),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for WatchEvent<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WatchEvent::Added(o) => f.debug_tuple("Added").field(o).finish(),
            WatchEvent::Modified(o) => f.debug_tuple("Modified").field(o).finish(),
            WatchEvent::Deleted(o) => f.debug_tuple("Deleted").field(o).finish(),
            WatchEvent::Bookmark { resource_version } => f
                .debug_struct("Bookmark")
                .field("resource_version", resource_version)
                .finish(),
            WatchEvent::Error(s) => f.debug_tuple("Error").field(s).finish(),
        }
    }
}

/// Why a list, a watch or a reflector step failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    /// The server answered with a status.
    #[error("server answered {0}")]
    Api(Status),
    /// The connection failed (refused, reset, timed out): worth retrying after a pause.
    #[error("transport error: {0}")]
    Transport(String),
    /// What the server sent could not be understood.
    #[error("cannot decode what the server sent: {0}")]
    Decode(String),
    /// A watch closed within a second without a single event: the server is likely unhealthy
    /// (client-go's `VeryShortWatchError`).
    #[error("very short watch: the watch closed within a second without any event")]
    VeryShortWatch,
    /// The queue refused what the reflector gave it (a key or transform failure).
    #[error("the queue refused an object: {0}")]
    Queue(#[from] QueueError),
}

impl Error {
    /// The server status, if it answered with one.
    pub fn status(&self) -> Option<&Status> {
        match self {
            Error::Api(status) => Some(status),
            _ => None,
        }
    }

    /// The resource version asked for is older than the server keeps (`410 Gone`, reason
    /// `Expired` or `Gone`): only a fresh list helps (client-go's `isExpiredError`).
    pub fn is_expired(&self) -> bool {
        self.status()
            .is_some_and(|s| s.code == 410 || s.reason == "Expired" || s.reason == "Gone")
    }

    /// The resource version asked for is newer than the server has seen (client-go's
    /// `isTooLargeResourceVersionError`).
    pub fn is_too_large_resource_version(&self) -> bool {
        self.status()
            .is_some_and(|s| s.message.contains("Too large resource version"))
    }

    /// How long the server asked to wait before the next attempt (`Retry-After`), if it did:
    /// client-go waits that long before retrying, whatever its backoff says.
    pub fn retry_after(&self) -> Option<Duration> {
        self.status().and_then(|s| s.retry_after)
    }

    /// `429 Too Many Requests`.
    pub fn is_too_many_requests(&self) -> bool {
        self.status().is_some_and(|s| s.code == 429)
    }

    /// A failed watch worth re-opening after a backoff without relisting: a transport error
    /// or 429 (client-go's `isWatchErrorRetriable`).
    pub fn is_retriable_watch_error(&self) -> bool {
        matches!(self, Error::Transport(_)) || self.is_too_many_requests()
    }
}

/// The events of one watch, in order. The stream ends when the watch does; an `Err` item is a
/// failure of the connection itself (the server's own errors are [`WatchEvent::Error`]).
pub type WatchStream<T> = Pin<Box<dyn Stream<Item = Result<WatchEvent<T>, Error>> + Send>>;

/// Lists and watches one resource (client-go's `ListerWatcher`).
///
/// Implemented in memory by the `kcache-sim` crate's `MemoryListerWatcher`; an HTTP one
/// against a Kubernetes API server returns what the server sends.
pub trait ListerWatcher<T>: Send + Sync {
    /// One page of the list.
    fn list(&self, options: ListOptions) -> impl Future<Output = Result<Page<T>, Error>> + Send;

    /// Starts a watch.
    fn watch(
        &self,
        options: WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<T>, Error>> + Send;
}

impl<T, L: ListerWatcher<T>> ListerWatcher<T> for Arc<L> {
    fn list(&self, options: ListOptions) -> impl Future<Output = Result<Page<T>, Error>> + Send {
        (**self).list(options)
    }

    fn watch(
        &self,
        options: WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<T>, Error>> + Send {
        (**self).watch(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_classification_follows_client_go() {
        assert!(Error::Api(Status::expired("too old")).is_expired());
        assert!(Error::Api(Status::new(410, "Gone", "")).is_expired());
        assert!(!Error::Api(Status::new(500, "InternalError", "")).is_expired());
        assert!(Error::Api(Status::new(429, "TooManyRequests", "")).is_retriable_watch_error());
        assert!(Error::Transport("connection refused".into()).is_retriable_watch_error());
        assert!(!Error::VeryShortWatch.is_retriable_watch_error());
        let large = Error::Api(Status::new(504, "Timeout", "Too large resource version: 9"));
        assert!(large.is_too_large_resource_version());
    }
}
