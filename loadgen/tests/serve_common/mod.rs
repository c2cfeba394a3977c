//! Helpers shared by the `loadgen serve` tests (loadgen/tests/serve_*.rs).

#![allow(dead_code)] // each test file uses a different subset

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use kcache::informer::{Error, ListOptions, ListerWatcher, Page, WatchOptions, WatchStream};

use loadgen::serve::{ServeConfig, Server};
use workloads::{PodProfile, Workload, WorkloadSpec};

/// A server for W1 with `keys` typical pods churning `events` events at `rate` per second,
/// with a window of `window` events and bookmarks every 200 ms (so tests see some).
pub async fn start(keys: usize, events: usize, rate: f64, window: usize) -> Server {
    start_with(PodProfile::Typical, keys, events, rate, window).await
}

/// [`start`] with pods of `profile`.
pub async fn start_with(
    profile: PodProfile,
    keys: usize,
    events: usize,
    rate: f64,
    window: usize,
) -> Server {
    let mut config = ServeConfig::new(
        WorkloadSpec::new(Workload::W1).keys(keys).events(events),
        rate,
    );
    config.pod_profile = profile;
    config.window = window;
    config.bookmark_interval = Duration::from_millis(200);
    Server::start(config).await.expect("the server starts")
}

/// The server's pods now: `namespace/name` → resource version.
pub fn server_state(server: &Server) -> BTreeMap<String, u64> {
    server.pod_versions()
}

/// Waits for the churn, at most `limit`.
pub async fn churn_done(server: &Server, limit: Duration) -> loadgen::serve::churn::ChurnSummary {
    tokio::time::timeout(limit, server.churn_finished())
        .await
        .expect("the churn finishes in time")
}

/// One keep-alive HTTP/1.1 connection to `addr`, sending bodies of type `B`; its connection
/// task runs on the test's runtime.
pub async fn connect<B>(addr: SocketAddr) -> SendRequest<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connects");
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    sender
}

/// A lister-watcher that counts the full lists (first pages) and the watches it passes on to
/// `inner`.
pub struct Counted<L> {
    pub inner: L,
    lists: AtomicUsize,
    watches: AtomicUsize,
}

impl<L> Counted<L> {
    pub fn new(inner: L) -> Self {
        Self {
            inner,
            lists: AtomicUsize::new(0),
            watches: AtomicUsize::new(0),
        }
    }

    pub fn lists(&self) -> usize {
        self.lists.load(Ordering::Relaxed)
    }

    pub fn watches(&self) -> usize {
        self.watches.load(Ordering::Relaxed)
    }
}

impl<T, L: ListerWatcher<T>> ListerWatcher<T> for Counted<L> {
    fn list(&self, options: ListOptions) -> impl Future<Output = Result<Page<T>, Error>> + Send {
        if options.continue_token.is_none() {
            self.lists.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.list(options)
    }

    fn watch(
        &self,
        options: WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<T>, Error>> + Send {
        self.watches.fetch_add(1, Ordering::Relaxed);
        self.inner.watch(options)
    }
}
