//! Per-connection limits, so clients `serve` did not write cannot exhaust it: the accept loop
//! that hands each connection to hyper with a bound on the request head, a timeout on reading
//! it, and a watchdog that closes a watcher fallen too far behind (docs/wire.md, "Limits").
//!
//! - **Request head size** ([`Limits::max_header_bytes`]): a longer head gets `431 Request
//!   Header Fields Too Large` (a longer URI alone, `414 URI Too Long`) and the connection
//!   closes.
//! - **Header-read timeout** ([`Limits::header_read_timeout`]): hyper starts it whenever it
//!   waits for a request head, so it closes both a connection that never sends a request (or
//!   sits idle after one) and a slow-loris client that sends its head a byte at a time.
//! - **Slow watchers** ([`Limits::slow_watcher_events`]): the API server gives each watcher a
//!   bounded buffer and closes the watch when it is full. Here a watch's events are read from
//!   the shared log when the connection can take them, so a watcher that does not read costs
//!   no memory, but would hold its connection forever; instead, once the newest event is more
//!   than the bound ahead of what it was sent, the connection is closed. The client sees its
//!   stream end and watches again from its last resource version.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Response, StatusCode};
use axum::Router;
use futures_util::future::Either;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::faults::{bump, Faults};
use super::store::Store;

/// The default bound on a request head (the API server's Go server allows 1 MiB).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 1 << 20;
/// The default header-read timeout (the API server's `ReadHeaderTimeout` is 32 s).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(32);
/// How long `stop` waits for connections to finish before cutting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The per-connection limits.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The longest request head, in bytes (at least 8,192, hyper's minimum).
    pub max_header_bytes: usize,
    /// How long a connection may take to send a request head, counted from when the server
    /// starts waiting for one (so also how long it may sit idle).
    pub header_read_timeout: Duration,
    /// A watcher this many events behind the newest is closed.
    pub slow_watcher_events: u64,
    /// How often each watching connection is checked against the bound.
    pub slow_watcher_check: Duration,
}

impl Limits {
    /// The defaults for a window of `window` events: a watcher is closed once it is a window
    /// behind, the point past which it could only get a 410 anyway.
    pub fn for_window(window: usize) -> Self {
        Self {
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            slow_watcher_events: window as u64,
            slow_watcher_check: Duration::from_secs(1),
        }
    }
}

/// What a watch on a connection has been sent, for the watchdog. Each request on the
/// connection sees it as a request extension; a watch marks it and advances it.
#[derive(Debug, Default)]
pub struct WatchProgress {
    watching: AtomicBool,
    resource_version: AtomicU64,
}

impl WatchProgress {
    /// A watch starts at `resource_version` on this connection; it is followed until the
    /// returned guard is dropped (with the watch's body).
    pub fn start(self: &Arc<Self>, resource_version: u64) -> WatchGuard {
        // Relaxed: the watchdog only needs each value eventually; a check one period late
        // closes the watcher one period late.
        self.resource_version
            .store(resource_version, Ordering::Relaxed);
        self.watching.store(true, Ordering::Relaxed);
        WatchGuard(Arc::clone(self))
    }

    /// How far behind `newest` the watch is; `None` when no watch runs.
    fn behind(&self, newest: u64) -> Option<u64> {
        // Relaxed: see `start`.
        self.watching
            .load(Ordering::Relaxed)
            .then(|| newest.saturating_sub(self.resource_version.load(Ordering::Relaxed)))
    }
}

/// A watch in progress on a connection (see [`WatchProgress::start`]); dropping it says the
/// watch is over, so a keep-alive connection's later requests are not judged as a watch.
#[derive(Debug)]
pub struct WatchGuard(Arc<WatchProgress>);

impl WatchGuard {
    /// Every event up to `resource_version` has been handed to the connection.
    pub fn sent(&self, resource_version: u64) {
        // Relaxed: see `WatchProgress::start`.
        self.0
            .resource_version
            .store(resource_version, Ordering::Relaxed);
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        // Relaxed: see `WatchProgress::start`.
        self.0.watching.store(false, Ordering::Relaxed);
    }
}

/// Serves `router` on `listener` under `limits` until `shutdown` turns true, then waits for
/// the connections to end (at most a few seconds: a client that does not read cannot hold a
/// stop up).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    store: Arc<Store>,
    faults: Arc<Faults>,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let mut connections = JoinSet::new();
    loop {
        let (tcp, _peer) = tokio::select! {
            _ = stopped(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                // Out of file descriptors or a connection gone before it was accepted: the
                // listener itself is fine; a pause keeps an fd shortage from spinning.
                Err(error) => {
                    eprintln!("loadgen serve: accept: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Reap finished connections so the set holds only live ones.
        while connections.try_join_next().is_some() {}
        // Without TCP_NODELAY, Nagle's algorithm holds a watch's small chunk back until the
        // client acknowledges the previous one, and the client delays its ACK by up to 40 ms.
        if let Err(error) = tcp.set_nodelay(true) {
            eprintln!("warning: TCP_NODELAY on a served connection: {error}");
        }
        connections.spawn(connection(
            tcp,
            Served {
                router: router.clone(),
                limits: limits.clone(),
                store: Arc::clone(&store),
                faults: Arc::clone(&faults),
                shutdown: shutdown.clone(),
            },
        ));
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        connections.shutdown().await;
    }
    Ok(())
}

/// What each connection is served with: the routes, the limits, the state, the faults and
/// the server's stop signal.
struct Served {
    router: Router,
    limits: Limits,
    store: Arc<Store>,
    faults: Arc<Faults>,
    shutdown: watch::Receiver<bool>,
}

/// One connection, until it ends, the server stops, or its watch falls too far behind.
async fn connection(tcp: tokio::net::TcpStream, mut served: Served) {
    // Until its first byte, a connection is only a parked task: hyper's read buffer (8 KiB)
    // and connection state wait until there is something to read, so thousands of idle
    // connections cost little. The header-read timeout covers this wait too.
    let mut first_byte = [0u8; 1];
    tokio::select! {
        // `peek`, not `readable`: a new socket can report read readiness with nothing to
        // read yet.
        first = tcp.peek(&mut first_byte) => {
            if !matches!(first, Ok(n) if n > 0) {
                return;
            }
        }
        _ = tokio::time::sleep(served.limits.header_read_timeout) => return,
        _ = stopped(&mut served.shutdown) => return,
    }
    // Boxed: the task's own future stays small while it waits above (an HTTP connection's
    // state machine is kilobytes).
    Box::pin(http_connection(tcp, served)).await;
}

/// The HTTP side of [`connection`], once the client has sent something.
async fn http_connection(tcp: tokio::net::TcpStream, served: Served) {
    let Served {
        router,
        limits,
        store,
        faults,
        mut shutdown,
    } = served;
    let progress = Arc::new(WatchProgress::default());
    let service = {
        let progress = Arc::clone(&progress);
        let router = TowerToHyperService::new(router);
        let max_header_bytes = limits.max_header_bytes;
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            if let Some(refusal) = head_too_large(&request, max_header_bytes) {
                return Either::Left(std::future::ready(Ok(refusal)));
            }
            request.extensions_mut().insert(Arc::clone(&progress));
            // The future owns a clone of the router: nothing borrowed outlives this call.
            // Boxed so the connection is `Unpin` and can hand its socket back at the end.
            Either::Right(Box::pin(hyper::service::Service::call(&router, request)))
        })
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(limits.max_header_bytes.max(8192));
    let mut conn = builder.serve_connection(TokioIo::new(tcp), service);
    let mut check = tokio::time::interval(limits.slow_watcher_check);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopping = false;
    loop {
        tokio::select! {
            // Errors are the client's (a reset, a head too large or too slow): the
            // connection is over either way. Without one, the socket comes back for a
            // lingering close.
            done = std::future::poll_fn(|cx| conn.poll_without_shutdown(cx)) => {
                if done.is_ok() {
                    lingering_close(conn.into_parts().io.into_inner()).await;
                }
                return;
            }
            _ = stopped(&mut shutdown), if !stopping => {
                stopping = true;
                // Ends the connection after the request in flight; open watches end on the
                // same signal.
                std::pin::Pin::new(&mut conn).graceful_shutdown();
            }
            _ = check.tick() => {
                bump(&faults.counts.slow_watcher_checks);
                let behind = progress.behind(store.resource_version());
                if behind.is_some_and(|behind| behind > limits.slow_watcher_events) {
                    bump(&faults.counts.slow_watchers_closed);
                    // Dropping the connection closes the socket.
                    return;
                }
            }
        }
    }
}

/// How long a connection that ended is read from (and what it sends thrown away) before it is
/// closed; Go's server waits 500 ms (`rstAvoidanceDelay`).
const LINGER: Duration = Duration::from_millis(500);
/// At most this much of what a client still sends is read and thrown away.
const LINGER_BYTES: usize = 8 << 20;

/// Ends a connection whose last answer has been written: a FIN after the answer, then what the
/// client still sends is read and dropped for a while, then the socket is closed.
///
/// A refused request (`413` for a body over the limit, `431`) leaves the rest of it unread.
/// Closing a socket with unread data makes the kernel send a reset, which can overtake the
/// answer and destroy it before the client reads it (the client sees "connection reset"
/// instead of the 413), the more likely the slower the link. Go's server avoids it the same
/// way (`closeWriteAndWait`). On loopback the answer is always delivered before the reset, so
/// the tests of loadgen/tests/serve_limits.rs pass with or without this; it is for real links.
async fn lingering_close(mut tcp: tokio::net::TcpStream) {
    // `poll_shutdown` is `shutdown(SHUT_WR)`. The peer may be gone already: nothing more to do
    // then.
    let shutdown = std::future::poll_fn(|cx| {
        tokio::io::AsyncWrite::poll_shutdown(std::pin::Pin::new(&mut tcp), cx)
    });
    if shutdown.await.is_err() {
        return;
    }
    let deadline = tokio::time::Instant::now() + LINGER;
    let mut sink = vec![0u8; 16 << 10];
    let mut drained = 0;
    while drained < LINGER_BYTES {
        if tokio::time::timeout_at(deadline, tcp.readable())
            .await
            .is_err()
        {
            return;
        }
        match tcp.try_read(&mut sink) {
            Ok(n) if n > 0 => drained += n,
            // Readiness that was not (the next wait decides).
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            // The client closed, or failed.
            _ => return,
        }
    }
}

/// The answer to a request whose head is over `max` bytes: `414 URI Too Long` if its request
/// line alone is, `431 Request Header Fields Too Large` otherwise; `None` for a head within
/// the limit.
///
/// hyper's own bound (`max_buf_size`) only bounds the buffer: it refuses a head when a parse
/// comes up incomplete with the buffer full, but one read can fill the buffer past the bound
/// (it reads into all the capacity the buffer grew to), and a head that arrives whole in that
/// read parses and is served. Which one happens depends on how the client's writes were cut,
/// so the same request was refused four times in five. Counting the parsed head here refuses
/// it every time; hyper's bound still caps the memory a head can take.
fn head_too_large<B>(request: &hyper::Request<B>, max: usize) -> Option<Response<Body>> {
    // As on the wire: `METHOD URI HTTP/1.1\r\n`, `Name: value\r\n` per header, `\r\n`.
    let request_line = request.method().as_str().len() + request.uri().to_string().len() + 12;
    let headers: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if request_line + headers + 2 <= max {
        return None;
    }
    let status = if request_line > max {
        StatusCode::URI_TOO_LONG
    } else {
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    };
    let mut response = Response::new(Body::empty());
    *response.status_mut() = status;
    // The connection ends with the answer, as hyper's own refusal ends it.
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    Some(response)
}

/// Completes once `shutdown` turns true, or its sender is gone (the server was dropped).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    // The guard `wait_for` returns is not `Send`: dropped here, before any other await.
    let _ = shutdown.wait_for(|stop| *stop).await.map(|_| ());
}
