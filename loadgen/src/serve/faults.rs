//! Faults `serve` injects on purpose, so a client can be held to what a real API server and a
//! real network do to it (docs/wire.md, "Faults"): a connection reset in the middle of a chunk,
//! a watch frame cut short, an oversized frame, a 1.5 MiB object, a stall (no bytes, no close),
//! `429` with `Retry-After`, `500`s and `410`s in the middle of a paged list. Each one injected
//! is counted ([`FaultCounts`]), and the counts are in `GET /loadgen/status` and the server's
//! report.
//!
//! A plan is written `name=value,...` (`--faults reset-mid-chunk=0.001,stall=30s@60s`): a
//! probability per chunk or per request, or `DURATION@AFTER` for a stall. Decisions come from
//! a counter hashed with the plan's seed, so they need no lock and one seed gives the same
//! sequence of coin flips.

use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use serde_json::Value;
use tokio::time::Instant;

use super::objects::Status;

/// The size of a "1.5 MiB object": the largest object etcd accepts by default.
pub const BIG_OBJECT_BYTES: usize = 1536 * 1024;
/// The size of an oversized frame: just over the 16 MiB client-go refuses in a protobuf watch
/// frame. A JSON line has no such limit, so a client must take it.
pub const OVERSIZED_FRAME_BYTES: usize = 16 * 1024 * 1024 + 1;
/// `Retry-After` of an injected 429, in seconds.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// Which faults to inject, and how often.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultPlan {
    /// Per watch chunk: send half of it, then reset the connection.
    pub reset_mid_chunk: f64,
    /// Per watch chunk: cut its last line in half and end the stream there.
    pub truncate_frame: f64,
    /// Per watch chunk: pad one event's object to [`OVERSIZED_FRAME_BYTES`].
    pub oversized_frame: f64,
    /// Per watch chunk: pad one event's object to [`BIG_OBJECT_BYTES`].
    pub big_object: f64,
    /// Every watch stops sending (and does not close) for a while.
    pub stall: Option<Stall>,
    /// Per request: `429 TooManyRequests` with `Retry-After`.
    pub too_many_requests: f64,
    /// Per list page after the first (a request with `continue`): `500 InternalError`.
    pub list_500: f64,
    /// Per list page after the first: `410 Expired` (the `continue` token is too old).
    pub expire_continue: f64,
    /// The seed of the coin flips.
    pub seed: u64,
}

/// A stall: from `after` the server's start, for `duration`, no watch sends a byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    /// How long after the start it begins.
    pub after: Duration,
    /// How long it lasts.
    pub duration: Duration,
}

/// A plan that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--faults {input:?}: {problem} (expected name=value,...; names: {NAMES})")]
pub struct FaultPlanError {
    input: String,
    problem: String,
}

const NAMES: &str = "reset-mid-chunk, truncate-frame, oversized-frame, big-object, \
                     too-many-requests, list-500, expire-continue (probabilities in [0, 1]), \
                     stall (DURATION@AFTER, e.g. 30s@60s), seed";

impl std::str::FromStr for FaultPlan {
    type Err = FaultPlanError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let fail = |problem: String| FaultPlanError {
            input: input.to_string(),
            problem,
        };
        let mut plan = FaultPlan::default();
        for item in input.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, value) = item
                .split_once('=')
                .ok_or_else(|| fail(format!("{item:?} has no '='")))?;
            let probability = || -> Result<f64, FaultPlanError> {
                match value.parse::<f64>() {
                    Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
                    _ => Err(fail(format!(
                        "{name}: {value:?} is not a probability in [0, 1]"
                    ))),
                }
            };
            match name {
                "reset-mid-chunk" => plan.reset_mid_chunk = probability()?,
                "truncate-frame" => plan.truncate_frame = probability()?,
                "oversized-frame" => plan.oversized_frame = probability()?,
                "big-object" => plan.big_object = probability()?,
                "too-many-requests" => plan.too_many_requests = probability()?,
                "list-500" => plan.list_500 = probability()?,
                "expire-continue" => plan.expire_continue = probability()?,
                "seed" => {
                    plan.seed = value
                        .parse()
                        .map_err(|_| fail(format!("seed: {value:?} is not a number")))?
                }
                "stall" => {
                    let (duration, after) = value
                        .split_once('@')
                        .ok_or_else(|| fail(format!("stall: {value:?} is not DURATION@AFTER")))?;
                    plan.stall = Some(Stall {
                        duration: parse_duration(duration).map_err(&fail)?,
                        after: parse_duration(after).map_err(&fail)?,
                    });
                }
                other => return Err(fail(format!("unknown fault {other:?}"))),
            }
        }
        Ok(plan)
    }
}

/// `250ms`, `30s`, `2m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or((s, ""), |at| s.split_at(at));
    let seconds = match (number.parse::<f64>(), unit) {
        (Ok(n), "ms") => n / 1000.0,
        (Ok(n), "s") => n,
        (Ok(n), "m") => n * 60.0,
        (Ok(n), "h") => n * 3600.0,
        _ => return Err(format!("{s:?} is not a duration (250ms, 30s, 2m, 1h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{s:?} is not a duration"))
}

/// How many of each fault were injected (and what the limits did), since the start.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Connections reset in the middle of a chunk.
    pub resets: AtomicU64,
    /// Watch streams ended in the middle of a line.
    pub truncated_frames: AtomicU64,
    /// Events padded to [`OVERSIZED_FRAME_BYTES`].
    pub oversized_frames: AtomicU64,
    /// Events padded to [`BIG_OBJECT_BYTES`].
    pub big_objects: AtomicU64,
    /// Watch chunks held back by a stall.
    pub stalled_chunks: AtomicU64,
    /// Requests answered 429.
    pub too_many_requests: AtomicU64,
    /// List pages answered 500.
    pub list_500s: AtomicU64,
    /// List pages answered 410.
    pub expired_continues: AtomicU64,
    /// Watchers closed because they fell too far behind (not a fault: the limit).
    pub slow_watchers_closed: AtomicU64,
    /// Checks of a connection for a slow watcher (not a fault, and not in [`FaultReport`]:
    /// what proves to a test that the checks ran; see `Server::slow_watcher_checks`).
    pub slow_watcher_checks: AtomicU64,
    /// Requests for a resource version newer than the server's that waited, then got 504.
    pub too_large_versions: AtomicU64,
}

/// A copy of [`FaultCounts`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultReport {
    /// See [`FaultCounts::resets`].
    pub resets: u64,
    /// See [`FaultCounts::truncated_frames`].
    pub truncated_frames: u64,
    /// See [`FaultCounts::oversized_frames`].
    pub oversized_frames: u64,
    /// See [`FaultCounts::big_objects`].
    pub big_objects: u64,
    /// See [`FaultCounts::stalled_chunks`].
    pub stalled_chunks: u64,
    /// See [`FaultCounts::too_many_requests`].
    pub too_many_requests: u64,
    /// See [`FaultCounts::list_500s`].
    pub list_500s: u64,
    /// See [`FaultCounts::expired_continues`].
    pub expired_continues: u64,
    /// See [`FaultCounts::slow_watchers_closed`].
    pub slow_watchers_closed: u64,
    /// See [`FaultCounts::too_large_versions`].
    pub too_large_versions: u64,
}

impl FaultCounts {
    /// The counts now. Relaxed: each counter is read on its own, for a report.
    pub fn report(&self) -> FaultReport {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        FaultReport {
            resets: get(&self.resets),
            truncated_frames: get(&self.truncated_frames),
            oversized_frames: get(&self.oversized_frames),
            big_objects: get(&self.big_objects),
            stalled_chunks: get(&self.stalled_chunks),
            too_many_requests: get(&self.too_many_requests),
            list_500s: get(&self.list_500s),
            expired_continues: get(&self.expired_continues),
            slow_watchers_closed: get(&self.slow_watchers_closed),
            too_large_versions: get(&self.too_large_versions),
        }
    }
}

/// Counts one more. Relaxed: a counter orders nothing.
pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl fmt::Display for FaultReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "resets {}, truncated frames {}, oversized frames {}, 1.5 MiB objects {}, \
             stalled chunks {}, 429s {}, list 500s {}, expired continues {}, \
             slow watchers closed {}, too-large versions {}",
            self.resets,
            self.truncated_frames,
            self.oversized_frames,
            self.big_objects,
            self.stalled_chunks,
            self.too_many_requests,
            self.list_500s,
            self.expired_continues,
            self.slow_watchers_closed,
            self.too_large_versions
        )
    }
}

/// A plan in force: its coin flips and counts.
#[derive(Debug)]
pub struct Faults {
    /// Read for every decision; replaced whole by [`Faults::set_plan`].
    plan: RwLock<FaultPlan>,
    started: Instant,
    flips: AtomicU64,
    /// What was injected.
    pub counts: FaultCounts,
}

impl Faults {
    /// `plan`, with stalls timed from now.
    pub fn new(plan: FaultPlan) -> Arc<Self> {
        Arc::new(Self {
            plan: RwLock::new(plan),
            started: Instant::now(),
            flips: AtomicU64::new(0),
            counts: FaultCounts::default(),
        })
    }

    /// The plan in force.
    pub fn plan(&self) -> FaultPlan {
        self.plan.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Injects `plan` from now on (a stall is still timed from the start); the counts go on.
    pub fn set_plan(&self, plan: FaultPlan) {
        *self.plan.write().unwrap_or_else(|e| e.into_inner()) = plan;
    }

    /// Stalls every watch for `duration` from now.
    pub fn stall_from_now(&self, duration: Duration) {
        let after = self.started.elapsed();
        self.plan.write().unwrap_or_else(|e| e.into_inner()).stall =
            Some(Stall { after, duration });
    }

    /// One probability of the plan in force.
    fn p(&self, pick: impl FnOnce(&FaultPlan) -> f64) -> f64 {
        pick(&self.plan.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// True with probability `p`.
    fn chance(&self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        // Relaxed: the counter only has to hand out distinct numbers.
        let n = self.flips.fetch_add(1, Ordering::Relaxed);
        let seed = self.plan.read().unwrap_or_else(|e| e.into_inner()).seed;
        let bits = splitmix64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        // The top 53 bits as a uniform number in [0, 1).
        ((bits >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// The fault a request gets instead of its answer, if any: a 429 on any request, a 500 or
    /// a 410 on a list page after the first.
    pub fn on_request(&self, query: Option<&str>) -> Option<Status> {
        if self.chance(self.p(|p| p.too_many_requests)) {
            bump(&self.counts.too_many_requests);
            return Some(Status::too_many_requests(RETRY_AFTER_SECONDS));
        }
        let query = query.unwrap_or("");
        let continued =
            form_urlencoded::parse(query.as_bytes()).any(|(k, v)| k == "continue" && !v.is_empty());
        let watch = form_urlencoded::parse(query.as_bytes())
            .any(|(k, v)| k == "watch" && (v == "1" || v == "true"));
        if continued && !watch {
            if self.chance(self.p(|p| p.list_500)) {
                bump(&self.counts.list_500s);
                return Some(Status::internal_error(
                    "injected fault: the server failed while listing",
                ));
            }
            if self.chance(self.p(|p| p.expire_continue)) {
                bump(&self.counts.expired_continues);
                return Some(Status::expired(
                    "The provided continue parameter is too old to display a consistent list \
                     result. You can start a new list without the continue parameter.",
                ));
            }
        }
        None
    }

    /// When a stall going on now ends.
    fn stalled_until(&self) -> Option<Instant> {
        let stall = self.plan.read().unwrap_or_else(|e| e.into_inner()).stall?;
        let begins = self.started + stall.after;
        let ends = begins + stall.duration;
        let now = Instant::now();
        (begins <= now && now < ends).then_some(ends)
    }

    /// A watch body with the plan's faults in it: `chunks` as they come, some cut, padded,
    /// held back or ending in a reset.
    pub fn watch_body(
        self: Arc<Self>,
        chunks: impl Stream<Item = Bytes> + Send + 'static,
    ) -> impl Stream<Item = Result<Bytes, io::Error>> + Send + 'static {
        let chunks = Box::pin(chunks);
        futures_util::stream::unfold(
            (chunks, self, false),
            |(mut chunks, faults, ended)| async move {
                if ended {
                    return None;
                }
                let mut chunk = chunks.next().await?;
                if let Some(until) = faults.stalled_until() {
                    bump(&faults.counts.stalled_chunks);
                    tokio::time::sleep_until(until).await;
                }
                let plan = faults.plan();
                if faults.chance(plan.reset_mid_chunk) && chunk.len() > 1 {
                    bump(&faults.counts.resets);
                    // Half a chunk, then an error: hyper aborts the connection without the
                    // chunked encoding's last chunk, as a reset network does.
                    let half = chunk.slice(..chunk.len() / 2);
                    let rest = futures_util::stream::iter([
                        Ok(half),
                        Err(io::Error::new(
                            io::ErrorKind::ConnectionReset,
                            "injected fault: reset mid-chunk",
                        )),
                    ]);
                    return Some((rest.boxed(), (chunks, faults, true)));
                }
                if faults.chance(plan.truncate_frame) {
                    if let Some(cut) = truncate_last_line(&chunk) {
                        bump(&faults.counts.truncated_frames);
                        let one = futures_util::stream::iter([Ok(cut)]);
                        return Some((one.boxed(), (chunks, faults, true)));
                    }
                }
                if faults.chance(plan.oversized_frame) {
                    if let Some(padded) = pad_first_object(&chunk, OVERSIZED_FRAME_BYTES) {
                        bump(&faults.counts.oversized_frames);
                        chunk = padded;
                    }
                } else if faults.chance(plan.big_object) {
                    if let Some(padded) = pad_first_object(&chunk, BIG_OBJECT_BYTES) {
                        bump(&faults.counts.big_objects);
                        chunk = padded;
                    }
                }
                let one = futures_util::stream::iter([Ok(chunk)]);
                Some((one.boxed(), (chunks, faults, false)))
            },
        )
        .flatten()
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The chunk with its last line cut in the middle (no newline at the end), or `None` when the
/// last line is too short to cut.
fn truncate_last_line(chunk: &Bytes) -> Option<Bytes> {
    let body = chunk.strip_suffix(b"\n").unwrap_or(chunk);
    let start = body
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |at| at + 1);
    let line = body.len() - start;
    (line >= 2).then(|| chunk.slice(..start + line / 2))
}

/// The chunk with the first `ADDED` or `MODIFIED` event's object padded with an annotation to
/// at least `size` bytes; `None` when it has no such event. The event stays a valid pod: only
/// `metadata.annotations` grows.
fn pad_first_object(chunk: &Bytes, size: usize) -> Option<Bytes> {
    let mut offset = 0;
    for line in chunk.split_inclusive(|&b| b == b'\n') {
        let end = offset + line.len();
        let object_event =
            line.starts_with(br#"{"type":"ADDED""#) || line.starts_with(br#"{"type":"MODIFIED""#);
        if object_event {
            let mut event: Value = serde_json::from_slice(line).ok()?;
            let metadata = event.get_mut("object")?.get_mut("metadata")?;
            let annotations = metadata
                .as_object_mut()?
                .entry("annotations")
                .or_insert_with(|| Value::Object(Default::default()));
            annotations.as_object_mut()?.insert(
                "loadgen/padding".into(),
                Value::String("x".repeat(size.saturating_sub(line.len()))),
            );
            let mut out = BytesMut::with_capacity(chunk.len() + size);
            out.extend_from_slice(&chunk[..offset]);
            out.extend_from_slice(&serde_json::to_vec(&event).ok()?);
            out.extend_from_slice(b"\n");
            out.extend_from_slice(&chunk[end..]);
            return Some(out.freeze());
        }
        offset = end;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_parse_and_bad_ones_say_why() {
        let plan: FaultPlan = "reset-mid-chunk=0.001, stall=30s@60s,too-many-requests=0.5,seed=7"
            .parse()
            .unwrap();
        assert_eq!(plan.reset_mid_chunk, 0.001);
        assert_eq!(plan.too_many_requests, 0.5);
        assert_eq!(plan.seed, 7);
        assert_eq!(
            plan.stall,
            Some(Stall {
                duration: Duration::from_secs(30),
                after: Duration::from_secs(60)
            })
        );
        assert_eq!("".parse::<FaultPlan>().unwrap(), FaultPlan::default());
        for bad in [
            "reset-mid-chunk=2",
            "nonsense=1",
            "stall=30s",
            "list-500",
            "stall=x@1s",
        ] {
            let err = bad.parse::<FaultPlan>().unwrap_err().to_string();
            assert!(err.contains("expected name=value"), "{bad}: {err}");
        }
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    }

    #[test]
    fn coin_flips_follow_the_probability() {
        let faults = Faults::new(FaultPlan {
            seed: 3,
            ..FaultPlan::default()
        });
        let hits = (0..10_000).filter(|_| faults.chance(0.25)).count();
        assert!((2_200..2_800).contains(&hits), "{hits}");
        assert!(!(0..1000).any(|_| faults.chance(0.0)));
        assert!((0..1000).all(|_| faults.chance(1.0)));
    }

    #[test]
    fn a_truncated_chunk_ends_inside_its_last_line() {
        let chunk = Bytes::from_static(b"{\"a\":1}\n{\"b\":22}\n");
        let cut = truncate_last_line(&chunk).unwrap();
        assert_eq!(&cut[..], b"{\"a\":1}\n{\"b\"");
        assert_eq!(truncate_last_line(&Bytes::from_static(b"x\n")), None);
    }

    #[test]
    fn padding_keeps_the_event_a_valid_pod() {
        let chunk = Bytes::from_static(
            b"{\"type\":\"BOOKMARK\",\"object\":{\"metadata\":{}}}\n{\"type\":\"MODIFIED\",\"object\":{\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\"}}}\n",
        );
        let padded = pad_first_object(&chunk, 4096).unwrap();
        let lines: Vec<&[u8]> = padded.split(|&b| b == b'\n').collect();
        assert_eq!(lines.len(), 3, "two lines and the empty tail");
        let event: Value = serde_json::from_slice(lines[1]).unwrap();
        assert_eq!(event["object"]["metadata"]["name"], "p");
        assert!(lines[1].len() >= 4096);
        assert_eq!(
            pad_first_object(&Bytes::from_static(b"{\"type\":\"BOOKMARK\"}\n"), 10),
            None
        );
    }
}
