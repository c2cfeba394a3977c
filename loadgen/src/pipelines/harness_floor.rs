//! The harness floor: a client that lists and watches the in-memory server of a run through
//! the informer and drains every event into nothing, so a reader sees how far each engine is
//! from the limit of the server and the harness themselves (docs/workloads.md, "The harness
//! floor").
//!
//! The floor's run is an engine run with the engine taken out: the same server
//! ([`serve_initial`]), the same producer writing the same events at the same pace
//! ([`produce`]), the same clock (from the client's first list until it has read the server's
//! last write). Its client is the smallest reflector that follows the server: list, watch from
//! the list's version, watch again after a watch ends, list again after a `410 Expired` (W3's
//! scripted relists); no DeltaFIFO, no indexer, no handler, no workqueue. What it receives is
//! counted and dropped.
//!
//! Like an engine, the floor runs in a child process of its own ([`Subject::HarnessFloor`],
//! [`isolate`](crate::harness::isolate)), so its CPU and memory figures are its own.

use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use std::sync::Arc;

use kcache::informer::{ListOptions, ListerWatcher, Versioned, WatchEvent, WatchOptions};
use kcache::{DeltaObject, EventHandler};
use kcache_sim::MemoryListerWatcher;

use crate::engines::EngineKind;
use crate::harness::informer_handlers::{recorders, InformerConfig, Recorder};
use crate::harness::server_feed::{
    millis, parse_version, produce, serve_initial, Produced, ServedPod,
};
use crate::judging::informer_verdict::Plan;
use crate::judging::verdict::Verdict;
use crate::pipelines::bare::RunError;
use crate::progress::Progress;
use crate::result::{InformerStats, Meter, RunResult};
use crate::ui::Ui;
use crate::units::si;
use workloads::Generated;

/// The floor's name in the `engine` column of a report.
pub const FLOOR_NAME: &str = "harness-floor";

/// A client that hears nothing for this long, while it has not read the last write, has
/// stalled (as a handler of the informer path).
const STALL: Duration = Duration::from_secs(60);

/// How long the client waits on an idle watch before it checks whether the run is over.
const IDLE: Duration = Duration::from_millis(1);

/// What to wait after a refused call (the server is down during W3's relists): the informer
/// path's reflector starts its backoff at 1 ms too.
const RETRY: Duration = Duration::from_millis(1);

/// How often the client shows the producer its version: often enough next to the producer's
/// allowance ([`MAX_CLIENT_LAG`](crate::harness::server_feed::MAX_CLIENT_LAG)), rarely enough to cost nothing per event.
const SEEN_EVERY: u64 = 64;

/// What a run through the in-memory server measures: an engine, or the harness floor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    /// An engine's shared informer (or W6's controller on it).
    Engine(EngineKind),
    /// The draining client of this module.
    HarnessFloor,
}

/// Whether a run through the in-memory server adds the harness floor's row
/// (`--harness-floor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FloorChoice {
    /// The engines' rows, then the floor's.
    #[default]
    Row,
    /// The engines' rows only.
    None,
    /// The floor's row only (what the floor's child process runs).
    Only,
}

/// What to run, in order: the engines, then the floor, as `floor` asks.
///
/// ```
/// use loadgen::engines::EngineKind;
/// use loadgen::pipelines::harness_floor::{subjects, FloorChoice, Subject};
/// let both = subjects(&EngineKind::ALL, FloorChoice::Row);
/// assert_eq!(both.len(), 3);
/// assert_eq!(both[2], Subject::HarnessFloor);
/// assert_eq!(subjects(&EngineKind::ALL, FloorChoice::Only), [Subject::HarnessFloor]);
/// ```
pub fn subjects(engines: &[EngineKind], floor: FloorChoice) -> Vec<Subject> {
    let engines = engines.iter().map(|&e| Subject::Engine(e));
    match floor {
        FloorChoice::Row => engines.chain([Subject::HarnessFloor]).collect(),
        FloorChoice::None => engines.collect(),
        FloorChoice::Only => vec![Subject::HarnessFloor],
    }
}

/// What the floor's client did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FloorFinished {
    /// Objects received: every listed object and every watch event that carried one.
    pub received: u64,
    /// Notifications the handlers were called with, all handlers together (0: it only drained).
    pub notified: u64,
    /// Objects the lists returned (the initial list's and every relist's).
    pub listed: u64,
    /// Whether the client read the server's last write before the run ended.
    pub caught_up: bool,
    /// From the client's first list until it read the server's last write.
    pub wall: Duration,
    /// List and watch calls the server served.
    pub lists: u64,
    /// Watch calls.
    pub watches: u64,
    /// Calls refused and watches that ended with an error (W3's outages and 410s).
    pub errors: u64,
    /// W3's resyncs, left out as on the informer path.
    pub skipped_resyncs: u64,
    /// How long the producer waited for the client (as on the informer path).
    pub producer_held: Duration,
    /// Scripted 410s no watch had received when the run ended.
    pub expired_watches_pending: u64,
    /// Failures of the run (the producer, a stall).
    pub failures: Vec<String>,
}

/// What the client keeps while it reads.
struct Client<'a> {
    server: &'a MemoryListerWatcher<ServedPod>,
    produced: &'a AtomicBool,
    /// The version of the last thing read.
    rv: String,
    /// `rv` as an integer for the producer's back-pressure (0: none yet), refreshed every
    /// [`SEEN_EVERY`] events.
    seen: &'a AtomicU64,
    /// The server's version once the producer is done: the client is done when `rv` reaches it.
    last_write: Option<String>,
    received: u64,
    listed: u64,
    errors: u64,
    heard_at: Instant,
    /// When the client read the last write.
    done_at: Option<Instant>,
    /// The informer rows' handlers, called inline (none: the floor only drains).
    handlers: Vec<Recorder>,
    /// By pod id, the object the handlers last heard of (the `old` of an update).
    last: Vec<Option<Arc<ServedPod>>>,
    /// Whether the initial list has been read (later lists are relists).
    listed_once: bool,
}

/// How a watch ended.
enum WatchEnd {
    /// The client read the last write.
    Done,
    /// The server said the version is too old: list again.
    Expired,
    /// The watch ended or was refused: watch again from the same version.
    Again,
    /// Nothing heard for [`STALL`].
    Stalled,
}

impl Client<'_> {
    /// A whole list, as the informer's store would see it: the initial one adds every object
    /// (of the initial list); a relist updates the objects heard of before, adds the others
    /// and deletes those it no longer holds.
    fn replace(&mut self, listed: Vec<Arc<ServedPod>>) {
        if self.handlers.is_empty() {
            return;
        }
        let initial = !std::mem::replace(&mut self.listed_once, true);
        let mut kept = vec![false; self.last.len()];
        for obj in listed {
            let id = obj.pod.id as usize;
            kept[id] = true;
            match self.last[id].take() {
                Some(old) => self
                    .handlers
                    .iter_mut()
                    .for_each(|h| h.on_update(&old, &obj)),
                None => self
                    .handlers
                    .iter_mut()
                    .for_each(|h| h.on_add(&obj, initial)),
            }
            self.last[id] = Some(obj);
        }
        for id in (0..kept.len()).filter(|&id| !kept[id]) {
            if let Some(old) = self.last[id].take() {
                let gone = DeltaObject::Object(old);
                self.handlers.iter_mut().for_each(|h| h.on_delete(&gone));
            }
        }
    }

    /// One watch event to every handler.
    fn notify(&mut self, event: WatchEvent<ServedPod>) {
        match event {
            WatchEvent::Added(obj) => {
                self.handlers.iter_mut().for_each(|h| h.on_add(&obj, false));
                let id = obj.pod.id as usize;
                self.last[id] = Some(obj);
            }
            WatchEvent::Modified(obj) => {
                let id = obj.pod.id as usize;
                let old = self.last[id].replace(Arc::clone(&obj));
                let old = old.as_ref().unwrap_or(&obj);
                self.handlers
                    .iter_mut()
                    .for_each(|h| h.on_update(old, &obj));
            }
            WatchEvent::Deleted(obj) => {
                self.last[obj.pod.id as usize] = None;
                let gone = DeltaObject::Object(obj);
                self.handlers.iter_mut().for_each(|h| h.on_delete(&gone));
            }
            WatchEvent::Bookmark { .. } | WatchEvent::Error(_) => {}
        }
    }

    /// Shows the producer how far the client has read.
    fn publish_seen(&self) {
        // Relaxed: a hint for the producer's pacing; nothing is read through it.
        self.seen
            .store(parse_version(&self.rv).unwrap_or(0), Ordering::Relaxed);
    }

    /// Whether `rv` is the server's last write; reads that version once the producer is done.
    fn caught_up(&mut self) -> bool {
        if self.last_write.is_none() {
            // Acquire pairs with the producer thread's Release: its last write is in the
            // server, so the server's version now is the final one.
            if !self.produced.load(Ordering::Acquire) {
                return false;
            }
            self.last_write = Some(self.server.resource_version());
        }
        let done = self.last_write.as_deref() == Some(self.rv.as_str());
        if done && self.done_at.is_none() {
            self.done_at = Some(Instant::now());
        }
        done
    }

    /// Lists every page; `false` if the server refused.
    async fn list(&mut self) -> bool {
        let mut options = ListOptions::default();
        let mut listed = Vec::new();
        loop {
            match self.server.list(options.clone()).await {
                Ok(page) => {
                    let n = page.items.len() as u64;
                    self.listed += n;
                    self.received += n;
                    self.heard_at = Instant::now();
                    if !self.handlers.is_empty() {
                        listed.extend(page.items);
                    }
                    if page.continue_token.is_none() {
                        self.rv = page.resource_version;
                        self.publish_seen();
                        self.replace(listed);
                        return true;
                    }
                    options.continue_token = page.continue_token;
                }
                Err(_) => {
                    self.errors += 1;
                    return false;
                }
            }
        }
    }

    /// One watch from `rv`, drained until it ends.
    async fn watch(&mut self) -> WatchEnd {
        let options = WatchOptions {
            resource_version: self.rv.clone(),
            allow_bookmarks: true,
            timeout: None,
        };
        let mut stream = match self.server.watch(options).await {
            Ok(stream) => stream,
            Err(_) => {
                self.errors += 1;
                return WatchEnd::Again;
            }
        };
        loop {
            let next = poll_fn(|cx| stream.as_mut().poll_next(cx));
            let event = match tokio::time::timeout(IDLE, next).await {
                Err(_idle) => {
                    if self.caught_up() {
                        return WatchEnd::Done;
                    }
                    if self.heard_at.elapsed() > STALL {
                        return WatchEnd::Stalled;
                    }
                    continue;
                }
                Ok(None) => return WatchEnd::Again,
                Ok(Some(Err(_))) => {
                    self.errors += 1;
                    return WatchEnd::Again;
                }
                Ok(Some(Ok(event))) => event,
            };
            match event {
                WatchEvent::Added(ref obj)
                | WatchEvent::Modified(ref obj)
                | WatchEvent::Deleted(ref obj) => {
                    self.received += 1;
                    self.rv.clear();
                    self.rv.push_str(obj.resource_version());
                    if self.received % SEEN_EVERY == 0 {
                        self.publish_seen();
                    }
                    if !self.handlers.is_empty() {
                        self.notify(event);
                    }
                }
                WatchEvent::Bookmark { resource_version } => self.rv = resource_version,
                WatchEvent::Error(status) => {
                    self.errors += 1;
                    return if status.code == 410 {
                        WatchEnd::Expired
                    } else {
                        WatchEnd::Again
                    };
                }
            }
            self.heard_at = Instant::now();
            if self.caught_up() {
                return WatchEnd::Done;
            }
        }
    }

    /// After the initial list: watches until the last write is read, lists again after a
    /// 410, or gives up when the client stalls.
    async fn follow(&mut self) -> Result<(), String> {
        loop {
            if self.caught_up() {
                return Ok(());
            }
            match self.watch().await {
                WatchEnd::Done => return Ok(()),
                WatchEnd::Expired => {
                    while !self.list().await {
                        if self.heard_at.elapsed() > STALL {
                            return Err(format!("the server refused every list for {STALL:?}"));
                        }
                        tokio::time::sleep(RETRY).await;
                    }
                }
                WatchEnd::Again => tokio::time::sleep(RETRY).await,
                WatchEnd::Stalled => {
                    return Err(format!(
                        "the client stalled: nothing heard for {STALL:?} before the last write"
                    ))
                }
            }
        }
    }
}

/// Runs `gen`'s events through the server into the draining client.
pub fn execute(
    gen: &Generated,
    rate: Option<u64>,
    handlers: Option<&InformerConfig>,
    progress: &dyn Progress,
) -> Result<FloorFinished, RunError> {
    gen.reset_delivery();
    let plan = Plan::of(gen);
    let server = serve_initial(gen, plan.initial_ops).map_err(RunError::Informer)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| RunError::Informer(format!("cannot start a tokio runtime: {e}")))?;
    let produced = AtomicBool::new(false);
    let seen = AtomicU64::new(0);
    let start = Instant::now();
    let mut client = Client {
        server: &server,
        produced: &produced,
        rv: String::new(),
        seen: &seen,
        last_write: None,
        received: 0,
        listed: 0,
        errors: 0,
        heard_at: start,
        done_at: None,
        handlers: handlers.map_or_else(Vec::new, |icfg| {
            recorders(&Arc::new(plan.clone()), icfg, start)
                .into_iter()
                .map(|(recorder, _)| recorder)
                .collect()
        }),
        last: vec![None; gen.universe.keys.len()],
        listed_once: false,
    };
    let mut failures = Vec::new();
    // Relaxed: see `Client::publish_seen`.
    let client_version = || Some(seen.load(Ordering::Relaxed)).filter(|&rv| rv > 0);
    let fed = thread::scope(|scope| {
        // The churn starts once the initial list is read, as on the informer path (which
        // waits for the informer's sync).
        let listed = runtime.block_on(client.list());
        let producer = scope.spawn(|| {
            let result = produce(
                &server,
                gen,
                plan.initial_ops,
                start,
                rate,
                &client_version,
                progress,
            );
            // Release pairs with the client's Acquire: the last write is in the server.
            produced.store(true, Ordering::Release);
            result
        });
        if listed {
            if let Err(e) = runtime.block_on(client.follow()) {
                failures.push(e);
            }
        } else {
            failures.push("the server refused the initial list".to_string());
        }
        match producer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        {
            Ok(fed) => fed,
            Err(e) => {
                failures.push(format!("the server refused the workload: {e}"));
                Produced::default()
            }
        }
    });
    let caught_up = client.done_at.is_some();
    let wall = client
        .done_at
        .map_or_else(|| start.elapsed(), |at| at.saturating_duration_since(start));
    let notified = client
        .handlers
        .iter()
        .map(|h| h.shared().notifications.load(Ordering::Relaxed))
        .sum();
    Ok(FloorFinished {
        received: client.received,
        notified,
        listed: client.listed,
        caught_up,
        wall,
        lists: server.list_calls(),
        watches: server.watch_calls(),
        errors: client.errors,
        skipped_resyncs: fed.skipped_resyncs,
        producer_held: fed.held,
        expired_watches_pending: server.expired_watches_pending() as u64,
        failures,
    })
}

/// The floor's verdict: it read the server's last write, and where the workload has no relist
/// (one list) it received exactly the workload's events (the initial list's objects and one
/// watch event per later write).
pub fn check(done: &FloorFinished, events: u64) -> Vec<String> {
    let mut failures = done.failures.clone();
    if !done.caught_up {
        failures.push("the client never read the server's last write".to_string());
    }
    if done.lists == 1 && done.received != events {
        failures.push(format!(
            "the client received {} objects, the workload has {events} events",
            done.received
        ));
    }
    failures
}

/// Runs, measures and judges the floor on `gen`; the row reports `workload` as `label`.
pub fn measure(
    gen: &Generated,
    label: &str,
    rate: Option<u64>,
    handlers: Option<&InformerConfig>,
    progress: &dyn Progress,
) -> Result<RunResult, RunError> {
    let meter = Meter::start();
    let done = execute(gen, rate, handlers, progress)?;
    let spent = meter.finish();
    let events = gen.event_count();
    let verdict = Verdict::from_failures(check(&done, events));
    let keys = gen.universe.keys.len();
    let row = spent.row(FLOOR_NAME, label, keys, events, done.wall);
    Ok(RunResult {
        threads: 1,
        deltas: done.received,
        verdict: verdict.summary(),
        failures: verdict.failures().to_vec(),
        informer: Some(InformerStats {
            lists: done.lists,
            watches: done.watches,
            reflector_errors: done.errors,
            expired_watches_pending: done.expired_watches_pending,
            skipped_resyncs: done.skipped_resyncs,
            producer_held_ms: millis(done.producer_held),
        }),
        ..row
    })
}

/// Runs the floor on `gen` with a progress phase of its own: the floor's row of a run.
pub fn row(
    gen: &Generated,
    label: &str,
    rate: Option<u64>,
    handlers: Option<&InformerConfig>,
    ui: Ui,
) -> Result<RunResult, RunError> {
    let phase = ui.phase(format!("{label} {FLOOR_NAME}"), gen.ops.len() as u64);
    let result = measure(gen, label, rate, handlers, &phase)?;
    phase.finish(&format!(
        "{} events/s, {} µs CPU per event, verdict {}",
        si(result.events_per_s),
        result
            .cpu_us_per_event
            .map_or_else(|| "-".to_string(), |v| format!("{v:.2}")),
        result.verdict
    ));
    Ok(result)
}
