//! The `serve-alone` rows of `loadgen e2e`: a raw HTTP/1.1 client that reads a watch and
//! discards it, so what is measured is the server's own limit and its CPU per event, not a
//! client's decoding.
//!
//! It decodes nothing: it counts events by their framing (newlines of JSON lines, or the
//! length prefixes of protobuf frames), and since every event of the churn has the next
//! resource version, the `n`-th event after the watch's start is version `start + n`. Per chunk
//! read it notes the newest version and the time, which gives the lag without parsing. It is
//! judged complete when it has counted every event between its start and the server's final
//! version (`/loadgen/status` after the churn).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use crate::serve::store::unix_nanos;
use crate::sync::lock;

/// What the reader asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// JSON lines.
    Json,
    /// Protobuf frames.
    Protobuf,
}

/// Counts the events of a watch body as its chunks arrive.
#[derive(Debug)]
pub struct Counter {
    wire: Wire,
    /// Protobuf: bytes of the current frame still to skip.
    skip: usize,
    /// Protobuf: the bytes of a length prefix cut by a chunk boundary.
    prefix: Vec<u8>,
    /// Events counted.
    pub events: u64,
}

impl Counter {
    /// A counter for `wire`.
    pub fn new(wire: Wire) -> Self {
        Self {
            wire,
            skip: 0,
            prefix: Vec::with_capacity(4),
            events: 0,
        }
    }

    /// Counts the events that end in `chunk`.
    pub fn chunk(&mut self, mut chunk: &[u8]) {
        match self.wire {
            Wire::Json => self.events += chunk.iter().filter(|&&b| b == b'\n').count() as u64,
            Wire::Protobuf => loop {
                if self.skip > 0 {
                    let n = self.skip.min(chunk.len());
                    self.skip -= n;
                    chunk = &chunk[n..];
                    if self.skip == 0 {
                        self.events += 1;
                    }
                }
                if chunk.is_empty() {
                    return;
                }
                let want = 4 - self.prefix.len();
                let n = want.min(chunk.len());
                self.prefix.extend_from_slice(&chunk[..n]);
                chunk = &chunk[n..];
                if self.prefix.len() < 4 {
                    return;
                }
                let len = u32::from_be_bytes([
                    self.prefix[0],
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                ]) as usize;
                self.prefix.clear();
                if len == 0 {
                    self.events += 1;
                } else {
                    self.skip = len;
                }
            },
        }
    }
}

/// What the reader did.
#[derive(Debug)]
pub struct Discarded {
    /// Events counted.
    pub events: u64,
    /// Events expected: the server's final version less the watch's start.
    pub expected: u64,
    /// Seconds from `churned` until every event was counted (or until giving up).
    pub settle_seconds: f64,
    /// (newest resource version read, unix nanoseconds), one per chunk.
    pub seen: Vec<(u64, u64)>,
    /// Whether the watch ended before the reader stopped reading: the server closed it (as
    /// too slow, or shutting down) or the connection failed.
    pub ended: bool,
    /// How the connection failed, if it did.
    pub error: Option<String>,
}

async fn connect(addr: &str) -> Result<SendRequest<Empty<Bytes>>, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream
        .set_nodelay(true)
        .map_err(|e| format!("TCP_NODELAY: {e}"))?;
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake with {addr}: {e}"))?;
    tokio::spawn(connection);
    Ok(sender)
}

fn request(path: &str, accept: &str) -> Result<hyper::Request<Empty<Bytes>>, String> {
    hyper::Request::get(path)
        .header("host", "loadgen")
        .header("accept", accept)
        .body(Empty::new())
        .map_err(|e| format!("a request for {path}: {e}"))
}

/// GETs a JSON document and reads the string at `pointer` as a number.
async fn json_number(addr: &str, path: &str, pointer: &str) -> Result<u64, String> {
    let mut sender = connect(addr).await?;
    let response = sender
        .send_request(request(path, "application/json")?)
        .await
        .map_err(|e| format!("GET {path}: {e}"))?;
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("GET {path}: {e}"))?
        .to_bytes();
    let value: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| format!("GET {path}: not JSON: {e}"))?;
    value
        .pointer(pointer)
        .and_then(|v| v.as_str())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("GET {path}: no number at {pointer}"))
}

/// A started discarding watch.
pub struct Reader {
    addr: String,
    start: u64,
    counted: Arc<AtomicU64>,
    seen: Arc<Mutex<Vec<(u64, u64)>>>,
    task: tokio::task::JoinHandle<Result<(), String>>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("addr", &self.addr)
            .field("start", &self.start)
            .finish_non_exhaustive()
    }
}

/// The server's latest resource version (`GET /loadgen/status`; `url` is `http://ADDR`).
pub async fn served_resource_version(url: &str) -> Result<u64, String> {
    json_number(&addr_of(url)?, "/loadgen/status", "/resourceVersion").await
}

fn addr_of(url: &str) -> Result<String, String> {
    Ok(url
        .strip_prefix("http://")
        .ok_or_else(|| format!("{url}: the discarding reader speaks plain http:// only"))?
        .trim_end_matches('/')
        .to_owned())
}

impl Reader {
    /// Opens a watch of every pod from the server's current version (`url` is `http://ADDR`);
    /// returns once the server answered, with the body being read and discarded.
    pub async fn start(url: &str, wire: Wire) -> Result<Reader, String> {
        Self::start_stalling(url, wire, false).await
    }

    /// [`Reader::start`], but with `stall` the reader stops reading after its first chunk and
    /// holds the connection open: a watcher too slow for the server, which the server should
    /// close (`e2e --watchers` shows its count of closed watchers).
    pub async fn start_stalling(url: &str, wire: Wire, stall: bool) -> Result<Reader, String> {
        let addr = addr_of(url)?;
        let start = json_number(&addr, "/api/v1/pods?limit=1", "/metadata/resourceVersion").await?;
        let accept = match wire {
            Wire::Json => "application/json",
            Wire::Protobuf => "application/vnd.kubernetes.protobuf;stream=watch",
        };
        let mut sender = connect(&addr).await?;
        let path = format!("/api/v1/pods?watch=true&resourceVersion={start}");
        let response = sender
            .send_request(request(&path, accept)?)
            .await
            .map_err(|e| format!("GET {path}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("GET {path}: {}", response.status()));
        }
        let counted = Arc::new(AtomicU64::new(0));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (task_counted, task_seen) = (Arc::clone(&counted), Arc::clone(&seen));
        let task = tokio::spawn(async move {
            let _sender = sender;
            let mut body = response.into_body();
            let mut counter = Counter::new(wire);
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| format!("reading the watch: {e}"))?;
                if let Ok(data) = frame.into_data() {
                    counter.chunk(&data);
                    lock(&task_seen).push((start + counter.events, unix_nanos()));
                    // Relaxed: a count read for progress; the seen list is behind its lock.
                    task_counted.store(counter.events, Ordering::Relaxed);
                    if stall {
                        // Holds `body` (the connection) without reading until aborted.
                        std::future::pending::<()>().await;
                    }
                }
            }
            Ok(())
        });
        Ok(Reader {
            addr,
            start,
            counted,
            seen,
            task,
        })
    }

    /// After the churn: waits (up to `settle`) until every event up to the server's final
    /// version was counted, then stops reading.
    pub async fn finish(self, settle: Duration) -> Result<Discarded, String> {
        let churn_end = Instant::now();
        let last = json_number(&self.addr, "/loadgen/status", "/resourceVersion").await?;
        self.finish_at(last, churn_end, settle).await
    }

    /// [`Reader::finish`] with the server's final version `last` already known (many readers
    /// of one server ask it once), waiting up to `settle` from `churn_end`.
    pub async fn finish_at(
        self,
        last: u64,
        churn_end: Instant,
        settle: Duration,
    ) -> Result<Discarded, String> {
        let expected = last.saturating_sub(self.start);
        while self.counted.load(Ordering::Relaxed) < expected && churn_end.elapsed() < settle {
            if self.task.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let settle_seconds = churn_end.elapsed().as_secs_f64();
        let ended = self.task.is_finished();
        self.task.abort();
        let error = match tokio::time::timeout(Duration::from_secs(1), self.task).await {
            Ok(Ok(Err(e))) => Some(e),
            _ => None,
        };
        let events = self.counted.load(Ordering::Relaxed);
        let seen = std::mem::take(&mut *lock(&self.seen));
        Ok(Discarded {
            events,
            expected,
            settle_seconds,
            seen,
            ended,
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_lines_are_counted_across_any_chunking() {
        let mut body = Vec::new();
        for len in [0usize, 3, 300, 1, 70_000] {
            body.extend_from_slice(&(len as u32).to_be_bytes());
            body.extend(std::iter::repeat_n(7u8, len));
        }
        for size in [1, 2, 3, 5, 64, 4096, body.len()] {
            let mut counter = Counter::new(Wire::Protobuf);
            for chunk in body.chunks(size) {
                counter.chunk(chunk);
            }
            assert_eq!(counter.events, 5, "chunks of {size}");
        }
        let lines = b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}\n";
        let mut counter = Counter::new(Wire::Json);
        for chunk in lines.chunks(5) {
            counter.chunk(chunk);
        }
        assert_eq!(counter.events, 3);
    }
}
