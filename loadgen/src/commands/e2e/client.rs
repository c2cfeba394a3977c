//! One client of `loadgen e2e`, in a process of its own (`loadgen e2e-client`, hidden).
//!
//! The parent serves and churns; this process only lists and watches, so its peak memory and
//! CPU time are the client's alone. The protocol is four lines long: the parent starts this
//! process with the server's URL and holds the churn until this process prints `synced` (its
//! handler has seen the initial list), writes `churned` on its stdin when the server has
//! published its last event, and reads one JSON line ([`ClientOutcome`]) from its stdout. What the
//! handler saw, `(resource version, unix nanoseconds)` per event, goes to the `--seen` file
//! (little-endian `u64` pairs), from which the parent computes the lag against its own record
//! of when each version was published (both processes read the same realtime clock).

use std::collections::BTreeMap;
use std::future::Future;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kcache::informer::wire::{
    compact_key_fn, pod_fields, proto_key_fn, CompactCodec, CompactObject, JsonCodec,
    MetadataCodec, Proto, WireListerWatcher,
};
use kcache::informer::{
    kube_key_fn, Error, KubeListerWatcher, ListOptions, ListerWatcher, Page, SharedInformer,
    Versioned, WatchEvent, WatchOptions, WatchStream,
};
use kcache::{DeltaObject, EventHandler, KeyFn};
use kube::api::{Api, ListParams};
use kube::core::PartialObjectMeta;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Client, Config, ResourceExt};
use serde::{Deserialize, Serialize};

use super::discard::{served_resource_version, Reader, Wire};
use crate::measure::rss::status_field_bytes;
use crate::serve::store::unix_nanos;
use crate::sync::lock;

/// The client a child runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OneClient {
    /// kcache's SharedInformer through its kube-rs adapter (JSON).
    Kcache,
    /// kcache's SharedInformer through its own wire client, over protobuf.
    #[value(name = "kcache-protobuf")]
    KcacheProtobuf,
    /// kcache's SharedInformer through its own wire client, over JSON (its own decoding into
    /// the `k8s-openapi` pod rather than kube-rs').
    #[value(name = "kcache-json")]
    KcacheJson,
    /// kcache's SharedInformer through its own wire client, metadata only
    /// (`PartialObjectMetadata` into kube's `PartialObjectMeta<Pod>`).
    #[value(name = "kcache-metadata")]
    KcacheMetadata,
    /// kcache's SharedInformer through its own wire client, over protobuf, keeping compact
    /// objects (the bytes as they arrived, less managedFields, with the metadata decoded once).
    #[value(name = "kcache-compact-protobuf")]
    KcacheCompactProtobuf,
    /// The same over JSON.
    #[value(name = "kcache-compact-json")]
    KcacheCompactJson,
    /// kube-rs' own watcher + reflector.
    #[value(name = "kube-rs")]
    KubeRs,
    /// A raw HTTP client that reads the JSON watch and discards it: the server's own limit.
    #[value(name = "serve-alone")]
    ServeAlone,
    /// The same over protobuf.
    #[value(name = "serve-alone-protobuf")]
    ServeAloneProtobuf,
}

impl OneClient {
    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            OneClient::Kcache => "kcache",
            OneClient::KcacheProtobuf => "kcache-protobuf",
            OneClient::KcacheJson => "kcache-json",
            OneClient::KcacheMetadata => "kcache-metadata",
            OneClient::KcacheCompactProtobuf => "kcache-compact-protobuf",
            OneClient::KcacheCompactJson => "kcache-compact-json",
            OneClient::KubeRs => "kube-rs",
            OneClient::ServeAlone => "serve-alone",
            OneClient::ServeAloneProtobuf => "serve-alone-protobuf",
        }
    }

    /// The wire of a discarding reader; `None` for the real clients.
    pub fn discards(self) -> Option<Wire> {
        match self {
            OneClient::ServeAlone => Some(Wire::Json),
            OneClient::ServeAloneProtobuf => Some(Wire::Protobuf),
            _ => None,
        }
    }
}

/// Arguments of `loadgen e2e-client` (started by `loadgen e2e`, not by people).
#[derive(Debug, Clone, clap::Args)]
pub struct E2eClientArgs {
    /// The server, `http://ADDR`.
    #[arg(long)]
    pub url: String,
    /// Which client.
    #[arg(long, value_enum)]
    pub client: OneClient,
    /// Give up this many seconds after the churn if the cache still differs.
    #[arg(long)]
    pub settle_seconds: f64,
    /// Where to write what the handler saw.
    #[arg(long)]
    pub seen: PathBuf,
    /// kcache's own client lists by streaming (`sendInitialEvents`).
    #[arg(long)]
    pub streaming_lists: bool,
    /// Where the parent writes the server's final state (`namespace/name resourceVersion`
    /// lines) before it says `churned`; without it the client lists the server to find out.
    #[arg(long)]
    pub expected: Option<PathBuf>,
}

/// What the child reports on its stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClientOutcome {
    /// Watch events (added, modified, deleted) received.
    pub received: u64,
    /// Events the handler applied (initial-list adds excluded).
    pub applied: u64,
    /// Seconds from the parent's `churned` until the cache matched (or until giving up).
    pub settle_seconds: f64,
    /// Pods the server listed after the churn (a discarding reader: the events it expected).
    pub served: usize,
    /// Pods in the client's cache at the end (a discarding reader: the events it counted).
    pub cached: usize,
    /// Whether the cache equals the server's list (name and resource version of every pod).
    pub ok: bool,
    /// The process's peak resident memory (`VmHWM`), bytes.
    pub peak_bytes: Option<u64>,
    /// CPU seconds the process used from its initial sync (the churn's start) until its
    /// handler heard the last event: the churn's cost, user + system.
    pub cpu_seconds: Option<f64>,
    /// CPU seconds the process used until its initial sync (start-up and the initial list).
    #[serde(default)]
    pub sync_cpu_seconds: Option<f64>,
    /// Bytes the allocator committed for the client: just after its initial sync, less just
    /// before it started ([`crate::measure::allocator`]); what its cache of the initial list holds.
    #[serde(default)]
    pub cache_bytes: Option<u64>,
}

/// `loadgen e2e-client`.
pub fn main(args: E2eClientArgs) -> ExitCode {
    run_and_print("e2e-client", args.client.name(), run(&args))
}

/// What a child command (`e2e-client`, `e2e-watchers`) does with its `run`: drives it on a new
/// async runtime and prints its outcome as one JSON line; a failure goes to stderr as
/// `loadgen COMMAND (CLIENT): ERROR`.
pub(super) fn run_and_print<T: Serialize>(
    command: &str,
    client: &str,
    run: impl Future<Output = Result<T, String>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("loadgen {command}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run) {
        Ok(outcome) => {
            let line = serde_json::to_string(&outcome).expect("plain numbers serialise");
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("loadgen {command} ({client}): {e}");
            ExitCode::FAILURE
        }
    }
}

/// CPU seconds this process has used, from `/proc/self/stat` (user and system ticks, fields
/// 14 and 15, at Linux's fixed 100 ticks per second for user space).
pub fn process_cpu_seconds() -> Option<f64> {
    parse_cpu_seconds(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// User + system seconds from the text of a `/proc/<pid>/stat` file.
fn parse_cpu_seconds(stat: &str) -> Option<f64> {
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / 100.0)
}

/// What the handler saw: (resource version, unix nanoseconds).
#[derive(Debug, Default)]
pub(super) struct Seen {
    pub(super) events: Mutex<Vec<(u64, u64)>>,
    /// The highest version heard, for [`wait_for_catch_up`] to read without the lock.
    pub(super) latest: AtomicU64,
}

impl Seen {
    fn record(&self, pod: &impl Versioned) {
        if let Ok(rv) = Versioned::resource_version(pod).parse::<u64>() {
            lock(&self.events).push((rv, unix_nanos()));
            // Relaxed: a progress mark; the events themselves are behind the lock.
            self.latest.fetch_max(rv, Ordering::Relaxed);
        }
    }

    fn write(&self, path: &PathBuf) -> std::io::Result<()> {
        let events = lock(&self.events);
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for &(rv, at) in events.iter() {
            out.write_all(&rv.to_le_bytes())?;
            out.write_all(&at.to_le_bytes())?;
        }
        out.flush()
    }
}

/// Writes a server's final state for [`read_expected`]: a `namespace/name resourceVersion` line
/// per pod. The parent hands it over so that checking a cache of a million pods costs the
/// client no list (whose JSON the server would have to write for every pod, and the client
/// hold whole).
pub fn write_expected<'a>(
    path: &PathBuf,
    pods: impl Iterator<Item = (&'a str, &'a str, u64)>,
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for (namespace, name, rv) in pods {
        writeln!(out, "{namespace}/{name} {rv}")?;
    }
    out.flush()
}

/// Reads what [`write_expected`] wrote.
pub(super) fn read_expected(path: &PathBuf) -> Result<BTreeMap<String, String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("reading the server's final state {}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, line)| {
            line.split_once(' ')
                .map(|(key, rv)| (key.to_owned(), rv.to_owned()))
                .ok_or_else(|| format!("{}:{}: not `key version`", path.display(), i + 1))
        })
        .collect()
}

/// Reads a `--seen` file back.
pub fn read_seen(path: &PathBuf) -> std::io::Result<Vec<(u64, u64)>> {
    let bytes = std::fs::read(path)?;
    Ok(bytes
        .chunks_exact(16)
        .map(|pair| {
            let (rv, at) = pair.split_at(8);
            (
                u64::from_le_bytes(rv.try_into().expect("8 bytes")),
                u64::from_le_bytes(at.try_into().expect("8 bytes")),
            )
        })
        .collect())
}

struct Handler(Arc<Seen>);

impl<T: Versioned + Send + Sync + 'static> EventHandler<T> for Handler {
    fn on_add(&mut self, obj: &Arc<T>, is_in_initial_list: bool) {
        if !is_in_initial_list {
            self.0.record(&**obj);
        }
    }

    fn on_update(&mut self, _old: &Arc<T>, new: &Arc<T>) {
        self.0.record(&**new);
    }

    fn on_delete(&mut self, obj: &DeltaObject<T>) {
        if let Some(obj) = obj.object() {
            self.0.record(&**obj);
        }
    }
}

/// A client's `ListerWatcher`, counting the object events its watches deliver.
struct Counting<L> {
    inner: L,
    received: Arc<AtomicU64>,
}

impl<T: Send + Sync + 'static, L: ListerWatcher<T>> ListerWatcher<T> for Counting<L> {
    fn list(&self, options: ListOptions) -> impl Future<Output = Result<Page<T>, Error>> + Send {
        self.inner.list(options)
    }

    fn watch(
        &self,
        options: WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<T>, Error>> + Send {
        let received = Arc::clone(&self.received);
        let watch = self.inner.watch(options);
        async move {
            let stream: WatchStream<T> = watch
                .await?
                .inspect(move |event| {
                    if let Ok(
                        WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_),
                    ) = event
                    {
                        received.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .boxed();
            Ok(stream)
        }
    }
}

/// Reads a client's cache as `namespace/name` → resource version.
pub(super) type ReadCache = Box<dyn Fn() -> BTreeMap<String, String> + Send>;
/// Stops a client.
pub(super) type Stop =
    Box<dyn FnOnce() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send>;
/// Completes once the client's handler has seen the initial list.
pub(super) type Synced = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

fn state_of<'a, K: kube::Resource + 'a>(
    pods: impl Iterator<Item = &'a K>,
) -> BTreeMap<String, String> {
    pods.map(|p| {
        (
            format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
            Versioned::resource_version(p).to_owned(),
        )
    })
    .collect()
}

/// The cache of the protobuf client, as [`state_of`] reads the JSON ones'.
fn proto_state_of<'a>(
    pods: impl Iterator<Item = &'a Proto<k8s_pb::api::core::v1::Pod>>,
) -> BTreeMap<String, String> {
    pods.map(|p| {
        let meta = p.metadata.as_ref();
        let field = |f: Option<&String>| f.cloned().unwrap_or_default();
        (
            format!(
                "{}/{}",
                field(meta.and_then(|m| m.namespace.as_ref())),
                field(meta.and_then(|m| m.name.as_ref()))
            ),
            p.resource_version().to_owned(),
        )
    })
    .collect()
}

/// The cache of a compact client, as [`state_of`] reads the others'.
fn compact_state_of<'a>(pods: impl Iterator<Item = &'a CompactObject>) -> BTreeMap<String, String> {
    pods.map(|p| {
        (
            format!("{}/{}", p.namespace(), p.name()),
            p.resource_version().to_owned(),
        )
    })
    .collect()
}

/// The compact codec a controller indexing pods by node would use.
fn compact_codec(protobuf: bool) -> CompactCodec {
    let codec = if protobuf {
        CompactCodec::protobuf::<k8s_pb::api::core::v1::Pod>()
    } else {
        CompactCodec::json_only("", "v1", "pods")
    };
    codec.index_field(pod_fields::node_name())
}

/// Starts one of kcache's informers on `lister_watcher` (counted into `received`), with the
/// recording handler; returns how to read its cache (through `state`) and how to stop it.
fn start_informer<T, L>(
    lister_watcher: L,
    key_fn: KeyFn<T>,
    state: fn(&[Arc<T>]) -> BTreeMap<String, String>,
    seen: &Arc<Seen>,
    received: &Arc<AtomicU64>,
) -> Result<(ReadCache, Synced, Stop), String>
where
    T: Versioned + Send + Sync + 'static,
    L: ListerWatcher<T> + 'static,
{
    let lw = Counting {
        inner: lister_watcher,
        received: Arc::clone(received),
    };
    let informer = Arc::new(SharedInformer::builder(lw, key_fn).build());
    let registration = informer
        .add_event_handler(Handler(Arc::clone(seen)))
        .map_err(|e| e.to_string())?;
    informer.start().map_err(|e| e.to_string())?;
    let reader = Arc::clone(&informer);
    Ok((
        Box::new(move || state(&reader.store().list())),
        Box::pin(async move { registration.wait_for_sync().await }),
        Box::new(move || Box::pin(async move { informer.shutdown().await })),
    ))
}

/// Starts `client` against `api`; returns how to read its cache and how to stop it.
pub(super) fn start_client(
    client: OneClient,
    api: Api<Pod>,
    kube_client: Client,
    streaming_lists: bool,
    seen: &Arc<Seen>,
    received: &Arc<AtomicU64>,
) -> Result<(ReadCache, Synced, Stop), String> {
    match client {
        OneClient::KcacheProtobuf => start_informer(
            WireListerWatcher::protobuf(kube_client).streaming_list(streaming_lists),
            proto_key_fn::<k8s_pb::api::core::v1::Pod>(),
            |pods| proto_state_of(pods.iter().map(|p| &**p)),
            seen,
            received,
        ),
        OneClient::KcacheJson => start_informer(
            WireListerWatcher::<JsonCodec<Pod>>::json(kube_client).streaming_list(streaming_lists),
            kube_key_fn::<Pod>(),
            |pods| state_of(pods.iter().map(|p| &**p)),
            seen,
            received,
        ),
        OneClient::KcacheMetadata => start_informer(
            WireListerWatcher::<MetadataCodec<Pod>>::metadata(kube_client)
                .streaming_list(streaming_lists),
            kube_key_fn::<PartialObjectMeta<Pod>>(),
            |pods| state_of(pods.iter().map(|p| &**p)),
            seen,
            received,
        ),
        OneClient::KcacheCompactProtobuf | OneClient::KcacheCompactJson => start_informer(
            WireListerWatcher::new(
                kube_client,
                compact_codec(client == OneClient::KcacheCompactProtobuf),
            )
            .streaming_list(streaming_lists),
            compact_key_fn(),
            |pods| compact_state_of(pods.iter().map(|p| &**p)),
            seen,
            received,
        ),
        OneClient::ServeAlone | OneClient::ServeAloneProtobuf => {
            Err("the discarding readers keep no cache (run_discarding runs them)".to_owned())
        }
        OneClient::Kcache => start_informer(
            KubeListerWatcher::new(api),
            kube_key_fn::<Pod>(),
            |pods| state_of(pods.iter().map(|p| &**p)),
            seen,
            received,
        ),
        OneClient::KubeRs => {
            let (reader, writer) = reflector::store::<Pod>();
            let seen = Arc::clone(seen);
            let received = Arc::clone(received);
            let task = tokio::spawn(async move {
                let mut stream = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .reflect(writer)
                    .boxed();
                while let Some(event) = stream.next().await {
                    // Errors (a 410 among them) make the watcher relist on its next poll.
                    if let Ok(watcher::Event::Apply(pod) | watcher::Event::Delete(pod)) = event {
                        received.fetch_add(1, Ordering::Relaxed);
                        seen.record(&pod);
                    }
                }
            });
            let ready = reader.clone();
            Ok((
                Box::new(move || state_of(reader.state().iter().map(|p| &**p))),
                // The store is ready once the first list is in: the stream applied it and
                // yielded it to the loop above before it reads the next event.
                Box::pin(async move {
                    // An error means the writer is gone: the task ended; `churned` tells.
                    let _ = ready.wait_until_ready().await;
                }),
                Box::new(move || {
                    Box::pin(async move {
                        task.abort();
                        let _ = task.await;
                    })
                }),
            ))
        }
    }
}

async fn run(args: &E2eClientArgs) -> Result<ClientOutcome, String> {
    let url = args
        .url
        .parse()
        .map_err(|e| format!("the server's url {:?}: {e}", args.url))?;
    let kube_client = Client::try_from(Config::new(url))
        .map_err(|e| format!("cannot make a kube client: {e}"))?;
    if let Some(wire) = args.client.discards() {
        return run_discarding(args, wire).await;
    }
    let api: Api<Pod> = Api::all(kube_client.clone());
    let committed_before = crate::measure::allocator::committed_bytes();
    let seen = Arc::new(Seen::default());
    let received = Arc::new(AtomicU64::new(0));
    let (read_cache, synced, stop) = start_client(
        args.client,
        api.clone(),
        kube_client,
        args.streaming_lists,
        &seen,
        &received,
    )?;
    synced.await;
    let cache_bytes = committed_before
        .zip(crate::measure::allocator::committed_bytes())
        .map(|(before, after)| after.saturating_sub(before));
    let cpu_at_sync = process_cpu_seconds();
    say_synced()?;
    let written_last = wait_for_churned().await?;
    let churn_end = Instant::now();
    let settle = Duration::from_secs_f64(args.settle_seconds);
    let last = match written_last {
        Some(rv) => rv,
        None => served_resource_version(&args.url).await?,
    };
    let deadline = tokio::time::Instant::from_std(churn_end + settle);
    wait_for_catch_up(&seen, last, &received, deadline).await;
    // The client's figures end here: what follows (a list of the server's state and
    // comparisons with the cache) is the harness checking it, and costs what the client
    // does not.
    let peak_bytes = status_field_bytes("VmHWM");
    let cpu_at_catch_up = process_cpu_seconds();
    let expected = match &args.expected {
        Some(path) => read_expected(path)?,
        // The churn is over, so one list is the server's final state. Metadata is all the
        // comparison reads.
        None => state_of(
            api.list_metadata(&ListParams::default())
                .await
                .map_err(|e| format!("listing the server's final state: {e}"))?
                .items
                .iter(),
        ),
    };
    let mut cache = read_cache();
    while cache != expected && churn_end.elapsed() < settle {
        tokio::time::sleep(Duration::from_millis(10)).await;
        cache = read_cache();
    }
    let settle_seconds = churn_end.elapsed().as_secs_f64();
    stop().await;
    seen.write(&args.seen)
        .map_err(|e| format!("writing {}: {e}", args.seen.display()))?;
    let applied = lock(&seen.events).len() as u64;
    Ok(ClientOutcome {
        received: received.load(Ordering::Relaxed),
        applied,
        settle_seconds,
        served: expected.len(),
        cached: cache.len(),
        ok: cache == expected,
        peak_bytes,
        sync_cpu_seconds: cpu_at_sync,
        cpu_seconds: cpu_at_sync
            .zip(cpu_at_catch_up)
            .map(|(sync, caught_up)| caught_up - sync),
        cache_bytes,
    })
}

/// Waits until the handler heard version `last` (the server's final one), or until
/// `deadline`, or until nothing arrived for [`STALL`] (a client that relisted may never hear
/// `last` itself: its cache is then compared with the server's as it is). Polling an atomic
/// every millisecond costs the measured client next to nothing. Tokio's clock, so a test can
/// pause it.
pub(super) async fn wait_for_catch_up(
    seen: &Seen,
    last: u64,
    received: &AtomicU64,
    deadline: tokio::time::Instant,
) {
    use tokio::time::Instant;
    let (mut count, mut since) = (received.load(Ordering::Relaxed), Instant::now());
    while seen.latest.load(Ordering::Relaxed) < last && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let now = received.load(Ordering::Relaxed);
        if now != count {
            (count, since) = (now, Instant::now());
        } else if since.elapsed() >= CATCH_UP_STALL {
            return;
        }
    }
}

/// How long [`wait_for_catch_up`] waits with no event arriving before it stops waiting.
const CATCH_UP_STALL: Duration = Duration::from_secs(2);

/// Tells the parent, which holds the churn until this line, that the client is ready.
pub(super) fn say_synced() -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "synced")
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing stdout: {e}"))
}

/// Waits for the parent's word that the churn is over (end of input: the parent is gone).
pub(super) async fn wait_for_churned() -> Result<Option<u64>, String> {
    let word = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).map(|_| line)
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| format!("reading stdin: {e}"))?;
    // `churned`, or `churned RV` when the parent knows the last version written (a server
    // other than `serve`, which has no `/loadgen/status` to ask).
    let mut words = word.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("churned"), None, None) => Ok(None),
        (Some("churned"), Some(rv), None) => rv
            .parse()
            .map(Some)
            .map_err(|_| format!("expected `churned RV` on stdin, got {word:?}")),
        _ => Err(format!("expected `churned` on stdin, got {word:?}")),
    }
}

/// A discarding reader ([`super::discard`]): complete when it counted every event.
async fn run_discarding(args: &E2eClientArgs, wire: Wire) -> Result<ClientOutcome, String> {
    let reader = Reader::start(&args.url, wire).await?;
    let cpu_at_sync = process_cpu_seconds();
    say_synced()?;
    wait_for_churned().await?;
    let done = reader
        .finish(Duration::from_secs_f64(args.settle_seconds))
        .await?;
    if let Some(e) = done.error {
        return Err(e);
    }
    let seen = Seen::default();
    *lock(&seen.events) = done.seen;
    seen.write(&args.seen)
        .map_err(|e| format!("writing {}: {e}", args.seen.display()))?;
    Ok(ClientOutcome {
        received: done.events,
        applied: done.events,
        settle_seconds: done.settle_seconds,
        served: usize::try_from(done.expected).unwrap_or(usize::MAX),
        cached: usize::try_from(done.events).unwrap_or(usize::MAX),
        ok: done.events == done.expected,
        peak_bytes: status_field_bytes("VmHWM"),
        sync_cpu_seconds: cpu_at_sync,
        cpu_seconds: cpu_at_sync
            .zip(process_cpu_seconds())
            .map(|(sync, end)| end - sync),
        cache_bytes: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_states_read_back_what_was_written() {
        let path = std::env::temp_dir().join(format!("loadgen-expected-{}", std::process::id()));
        write_expected(&path, [("ns", "a", 7), ("", "b", 9)].into_iter()).unwrap();
        let state = read_expected(&path).unwrap();
        assert_eq!(state.get("ns/a").map(String::as_str), Some("7"));
        assert_eq!(state.get("/b").map(String::as_str), Some("9"));
        std::fs::write(&path, "ns/a 7\nbroken\n").unwrap();
        let err = read_expected(&path).unwrap_err();
        assert!(err.ends_with(":2: not `key version`"), "{err}");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn seen_files_read_back_what_was_written() {
        let seen = Seen::default();
        lock(&seen.events).extend([(1, 10), (u64::MAX, 0), (7, u64::MAX)]);
        let path = std::env::temp_dir().join(format!("loadgen-seen-{}", std::process::id()));
        seen.write(&path).unwrap();
        assert_eq!(
            read_seen(&path).unwrap(),
            vec![(1, 10), (u64::MAX, 0), (7, u64::MAX)]
        );
        std::fs::remove_file(path).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn catching_up_ends_at_the_last_version_or_when_events_stop_coming() {
        use tokio::time::Instant;
        let seen = Arc::new(Seen::default());
        let received = Arc::new(AtomicU64::new(0));
        let far = Instant::now() + Duration::from_secs(60);
        seen.latest.store(10, Ordering::Relaxed);

        let start = Instant::now();
        wait_for_catch_up(&seen, 10, &received, far).await;
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "the last version was heard already"
        );

        let start = Instant::now();
        wait_for_catch_up(&seen, 11, &received, far).await;
        let waited = start.elapsed();
        assert!(
            CATCH_UP_STALL <= waited && waited < CATCH_UP_STALL + Duration::from_millis(10),
            "nothing arrives: it stops after the stall, waited {waited:?}"
        );

        // Events keep coming for longer than the stall, and the last one is version 20.
        let feeder = tokio::spawn({
            let (seen, received) = (Arc::clone(&seen), Arc::clone(&received));
            async move {
                for rv in 11..=20 {
                    tokio::time::sleep(CATCH_UP_STALL / 2).await;
                    received.fetch_add(1, Ordering::Relaxed);
                    seen.latest.fetch_max(rv, Ordering::Relaxed);
                }
            }
        });
        let start = Instant::now();
        wait_for_catch_up(&seen, 20, &received, far).await;
        let waited = start.elapsed();
        assert!(
            CATCH_UP_STALL * 5 <= waited && waited < CATCH_UP_STALL * 5 + Duration::from_millis(10),
            "it waits while events arrive, until version 20: waited {waited:?}"
        );
        feeder.await.unwrap();

        let near = Instant::now() + Duration::from_millis(500);
        let start = Instant::now();
        wait_for_catch_up(&seen, 21, &received, near).await;
        let waited = start.elapsed();
        assert!(
            waited < CATCH_UP_STALL,
            "the deadline comes before the stall: waited {waited:?}"
        );
    }

    #[test]
    fn cpu_seconds_are_user_plus_system_ticks_after_the_command_name() {
        // A command name with a space and a parenthesis of its own.
        let stat = "42 (odd) name) S 1 42 42 0 -1 4194560 500 0 0 0 250 37 0 0 20 0 3 0";
        assert_eq!(parse_cpu_seconds(stat), Some(2.87));
        assert_eq!(parse_cpu_seconds("42 (short) S 1"), None);
        assert!(process_cpu_seconds().is_some(), "/proc/self/stat on Linux");
    }
}
