//! `loadgen soak --kubeconfig FILE`: the soak's pipeline (the informer through
//! `KubeListerWatcher`, the workqueue handler and its workers, the ledger handler) against the
//! API server a kubeconfig names, watching one namespace, while `loadgen churn` children write
//! W1's pods into it (docs/real-clusters.md, "`soak --kubeconfig`").
//!
//! **Segments.** A churn generates its workload whole, so a long soak is a sequence of churn
//! runs, each a segment: a fresh run id (`soak-<time>-<pid>-<n>`), another seed, `--hold`
//! (the population is created, then the go-ahead), `--record`, events sized to fit what is
//! left of `--duration` (at most `--segment-events`, by default a minute of churn). A
//! segment is never cut short (a write half done would leave the record and the server
//! disagreeing), so a server slower than `--rate` lengthens the run; the report says how long
//! it took. When a segment's churn exits, the checkpoint: within `--settle` the cache equals a
//! fresh list of the namespace, each pod the churn wrote is there at the resource version its
//! record gives (and each it deleted is gone), the workqueue is idle and every key was
//! reconciled at its version. Then `churn --cleanup` deletes the segment's pods, and the next
//! segment starts in a namespace as it was (this is also why successive runs, not one: a run
//! whose pods stay would make the next refuse the namespace).
//!
//! **Lag** is from the write's return in the churn (its record, read as it grows) to this
//! process's handler, matched by resource version, as `e2e --kubeconfig` measures it (one
//! clock, one machine). The samples' lag is the churn's writes returned that the handler has
//! not seen yet; the report gives the p50, p99 and max of the time lags.
//!
//! **No faults**: a server loadgen does not run takes none (`main` refuses the fault flags),
//! and the server's CPU is not ours to measure. On Ctrl-C or a failure the running segment's
//! churn is stopped and its pods deleted; a cleanup that fails names the run id.

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use k8s_openapi::api::core::v1::Pod;
use kcache::informer::Versioned;
use kcache::workqueue::WorkQueue;
use kcache::{DeltaObject, EventHandler};
use kube::api::{Api, ListParams};

use super::{judge_process, progress_start, sample, write_report, Pipeline, SoakArgs};
use crate::kube_churn::{self, RecordTail, Target};
use crate::serve::store::unix_nanos;
use crate::sync::lock;

/// What the handler heard, (resource version, Unix nanoseconds), until the sampler takes it.
type Stamps = Arc<Mutex<Vec<(u64, u64)>>>;

/// The third handler: stamps each event past the initial list with when it was heard.
struct Stamp(Stamps);

impl Stamp {
    fn record(&self, pod: &Pod) {
        if let Ok(rv) = Versioned::resource_version(pod).parse::<u64>() {
            lock(&self.0).push((rv, unix_nanos()));
        }
    }
}

impl EventHandler<Pod> for Stamp {
    fn on_add(&mut self, obj: &Arc<Pod>, initial: bool) {
        if !initial {
            self.record(obj);
        }
    }
    fn on_update(&mut self, _old: &Arc<Pod>, new: &Arc<Pod>) {
        self.record(new);
    }
    fn on_delete(&mut self, obj: &DeltaObject<Pod>) {
        if let Some(obj) = obj.object() {
            self.record(obj);
        }
    }
}

/// Matches the churn's writes (from its record) with the handler's stamps by resource version.
struct Lags {
    /// Writes returned, not heard yet: resource version → returned at.
    returned: HashMap<u64, u64>,
    /// Heard, no write returned for it yet: resource version → heard at.
    heard: HashMap<u64, u64>,
    /// Write return → handler, microseconds (0 when the handler heard first).
    histogram: Histogram<u64>,
}

impl Lags {
    fn new() -> Result<Self, String> {
        Ok(Self {
            returned: HashMap::new(),
            heard: HashMap::new(),
            histogram: Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .map_err(|e| format!("histogram: {e}"))?,
        })
    }

    fn take(&mut self, record: &mut RecordTail, stamps: &Stamps) -> Result<(), String> {
        for (rv, at) in std::mem::take(&mut *lock(stamps)) {
            if let Some(written) = self.returned.remove(&rv) {
                self.record(written, at);
            } else {
                self.heard.insert(rv, at);
            }
        }
        for (rv, written) in record.read_new()? {
            if let Some(at) = self.heard.remove(&rv) {
                self.record(written, at);
            } else {
                self.returned.insert(rv, written);
            }
        }
        Ok(())
    }

    /// One write's lag: returned at `written`, heard `at` (Unix nanoseconds).
    fn record(&mut self, written: u64, at: u64) {
        self.histogram
            .saturating_record(at.saturating_sub(written) / 1_000);
    }

    /// After a checkpoint: what is left unmatched is not the churn's (a cleanup's deletes, a
    /// pod someone else wrote) or was never heard as written (a delete's answer without the
    /// pod); it goes, so that memory does not grow with the run.
    fn forget(&mut self) {
        self.returned = HashMap::new();
        self.heard = HashMap::new();
    }
}

/// `namespace/name` → resource version of a listed namespace.
fn listed(pods: &[Pod]) -> BTreeMap<String, u64> {
    pods.iter()
        .filter_map(|p| {
            let key = kcache::informer::kube_key(p).ok()?;
            Some((
                key.as_str().to_string(),
                Versioned::resource_version(p).parse().ok()?,
            ))
        })
        .collect()
}

/// Every pod of the namespace, page by page.
async fn list_all(api: &Api<Pod>) -> Result<BTreeMap<String, u64>, String> {
    let mut pods = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| format!("listing the namespace's pods: {e}"))?;
        pods.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(listed(&pods)),
        }
    }
}

/// Why a wait ended early.
const INTERRUPTED: &str = "interrupted (Ctrl-C)";

/// Waits until the cache equals a fresh list of the namespace, every pod the churn wrote is
/// there at the version its record gives (`churned`: name → version, `None` for deleted), the
/// workqueue is idle and every key was reconciled; `Ok(None)` if `limit` passes first (with
/// what differed last), else the list it matched.
async fn settle(
    api: &Api<Pod>,
    namespace: &str,
    pipeline: &Pipeline,
    churned: &BTreeMap<String, Option<u64>>,
    limit: Duration,
    stop: &AtomicBool,
) -> Result<Result<BTreeMap<String, u64>, String>, String> {
    let deadline = Instant::now() + limit;
    loop {
        // Relaxed: the flag carries no data.
        if stop.load(Ordering::Relaxed) {
            return Err(INTERRUPTED.into());
        }
        let why = match list_all(api).await {
            Ok(state) => {
                let wrong = churned
                    .iter()
                    .filter(|(name, rv)| state.get(&format!("{namespace}/{name}")) != rv.as_ref())
                    .count();
                if wrong == 0 && pipeline.matches(&state) {
                    return Ok(Ok(state));
                }
                let cache = pipeline.informer.store().list().len();
                format!(
                    "the cache ({cache} pods) does not equal the server ({} pods), or the workers are behind; {wrong} of the churn's pods not at the version its record gives",
                    state.len()
                )
            }
            Err(e) => e,
        };
        if Instant::now() > deadline {
            return Ok(Err(why));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One segment's churn, as it runs.
struct Segment {
    run: String,
    record: PathBuf,
    child: Option<Child>,
}

/// `loadgen soak --kubeconfig FILE`.
pub(super) async fn soak(args: SoakArgs, path: PathBuf) -> Result<bool, String> {
    let mut config = kube_churn::kube_config(&path).await?;
    let url = config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_owned();
    let namespace = args
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    // kube-rs' own retries would hide 429s and 504s from the reflector (docs/informer.md).
    config.default_retry = false;
    let client = kube::Client::try_from(config).map_err(|e| format!("making a client: {e}"))?;
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find this loadgen's executable: {e}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                // Relaxed: the flag carries no data.
                stop.store(true, Ordering::Relaxed);
            }
        });
    }

    let pipeline = Pipeline::build(api.clone(), args.workers)?;
    let stamps: Stamps = Arc::default();
    pipeline
        .informer
        .add_event_handler(Stamp(Arc::clone(&stamps)))
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    pipeline.start(args.settle).await?;
    let segment_events = args
        .segment_events
        .unwrap_or_else(|| ((args.rate * 60.0) as usize).clamp(1_000, 2_000_000));
    eprintln!(
        "loadgen soak: against {url}, namespace {namespace}: {} pods, at most {segment_events} events per segment at {}/s for {:?}, no faults (a server loadgen does not run takes none)",
        args.keys, args.rate, args.duration
    );
    let run_base = format!(
        "soak-{:x}-{}",
        unix_nanos() / 1_000_000_000,
        std::process::id()
    );
    let mut state = State {
        samples: Vec::new(),
        checkpoints: Vec::new(),
        lags: Lags::new()?,
        next_sample: Duration::ZERO,
        sample_every: args.sample_every,
        events: 0,
    };
    let mut segment = Segment {
        run: String::new(),
        record: PathBuf::new(),
        child: None,
    };
    let ran = run_segments(
        &args,
        &exe,
        &url,
        &namespace,
        &api,
        &pipeline,
        &stamps,
        &stop,
        start,
        segment_events,
        &run_base,
        &mut state,
        &mut segment,
    )
    .await;
    // Whatever happened, the running segment's churn stops and its pods go.
    if let Some(child) = segment.child.take() {
        kube_churn::end(child).await;
    }
    let target = target(&path, &url, &namespace, &args, Vec::new());
    let cleaned = if segment.run.is_empty() {
        Ok(())
    } else {
        kube_churn::cleanup(&exe, &target, &segment.run).await
    };
    let _ = std::fs::remove_file(&segment.record);
    let segments = match (ran, cleaned) {
        (Ok(segments), Ok(())) => segments,
        (Err(e), Ok(())) => {
            pipeline.shutdown().await;
            return Err(e);
        }
        (Ok(_), Err(cleanup)) => {
            pipeline.shutdown().await;
            return Err(cleanup);
        }
        (Err(e), Err(cleanup)) => {
            pipeline.shutdown().await;
            return Err(format!("{e}; and then: {cleanup}"));
        }
    };

    // The end: the churn's pods are gone; the cache must equal the namespace as it is.
    let settled = settle(
        &api,
        &namespace,
        &pipeline,
        &BTreeMap::new(),
        args.settle,
        &stop,
    )
    .await;
    let settled = match settled {
        Ok(settled) => settled,
        Err(e) => {
            pipeline.shutdown().await;
            return Err(e);
        }
    };
    let expected = match &settled {
        Ok(state) => state.clone(),
        Err(_) => list_all(&api).await.unwrap_or_default(),
    };
    let ledger_verdict = lock(&pipeline.ledger).judge(&expected);
    let errors = lock(&pipeline.errors).clone();
    let reconciles = pipeline.reconciles.load(Ordering::Relaxed);
    pipeline.shutdown().await;

    let mut failures = Vec::new();
    if let Err(why) = &settled {
        failures.push(format!("at the end, {why}"));
    }
    if let Err(verdict) = &ledger_verdict {
        failures.push(format!("the ledger handler: {verdict}"));
    }
    if state.checkpoints.iter().any(|(_, ok)| !ok) {
        failures.push("a segment checkpoint failed".into());
    }
    let warmup = args.warmup.unwrap_or(args.duration / 6);
    let process_rows = judge_process(&state.samples, warmup, args.max_rss_growth, &mut failures);
    let lags = &state.lags.histogram;
    let mut rows = vec![
        (
            "duration".to_string(),
            format!(
                "{:.0} s ({segments} segments, {} churn events in all, at {}/s offered)",
                start.elapsed().as_secs_f64(),
                state.events,
                args.rate
            ),
        ),
        (
            "pods at the end (namespace, after the cleanups)".into(),
            expected.len().to_string(),
        ),
        ("reconciles".into(), reconciles.to_string()),
    ];
    rows.extend(process_rows);
    rows.extend([
        (
            "lag, write return → handler".to_string(),
            format!(
                "{} writes matched: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                lags.len(),
                lags.value_at_quantile(0.5) as f64 / 1000.0,
                lags.value_at_quantile(0.99) as f64 / 1000.0,
                lags.max() as f64 / 1000.0
            ),
        ),
        (
            "max lag".into(),
            format!(
                "{} writes returned, not yet heard",
                state
                    .samples
                    .iter()
                    .map(|s| s.lag_events)
                    .max()
                    .unwrap_or(0)
            ),
        ),
        (
            "faults injected".into(),
            "none (a server loadgen does not run)".into(),
        ),
        (
            "errors the watch error handler saw".into(),
            format!("{errors:?}"),
        ),
        (
            "checkpoints (s, ok)".into(),
            format!("{:?}", state.checkpoints),
        ),
    ]);
    write_report(
        &args.out,
        &state.samples,
        warmup,
        &format!("kubeconfig: {url} (namespace {namespace})"),
        &rows,
        &failures,
    )
}

/// What the segments gather.
struct State {
    samples: Vec<crate::reports::soak_report::Sample>,
    checkpoints: Vec<(f64, bool)>,
    lags: Lags,
    next_sample: Duration,
    sample_every: Duration,
    /// Churn events written, over the segments (the populations' creates not counted).
    events: usize,
}

fn target<'a>(
    path: &'a Path,
    url: &'a str,
    namespace: &'a str,
    args: &SoakArgs,
    workload_args: Vec<String>,
) -> Target<'a> {
    Target {
        kubeconfig: path,
        url,
        namespace,
        allow_foreign: args.allow_foreign,
        workload_args,
    }
}

/// Takes a sample if one is due.
fn maybe_sample(
    state: &mut State,
    start: Instant,
    pipeline: &Pipeline,
    segment: usize,
    record: &mut RecordTail,
    stamps: &Stamps,
) -> Result<(), String> {
    let now = start.elapsed();
    if now < state.next_sample {
        return Ok(());
    }
    state.next_sample = now + state.sample_every;
    state.lags.take(record, stamps)?;
    let s = sample(
        start,
        pipeline.informer.queued_keys(),
        pipeline.queue.len(),
        state.lags.returned.len() as u64,
        0,
    );
    eprintln!(
        "{} writes unheard, {} writes heard (p99 {:.2} ms), {} reconciles, segment {segment}, \
         watch errors {:?}",
        progress_start(&s),
        state.lags.histogram.len(),
        state.lags.histogram.value_at_quantile(0.99) as f64 / 1000.0,
        pipeline.reconciles.load(Ordering::Relaxed),
        lock(&pipeline.errors)
    );
    state.samples.push(s);
    Ok(())
}

/// Runs churn segments until `--duration` is spent; returns how many ran. The running one is
/// in `segment`, for the caller to stop and clean up whatever happens.
#[allow(clippy::too_many_arguments)]
async fn run_segments(
    args: &SoakArgs,
    exe: &Path,
    url: &str,
    namespace: &str,
    api: &Api<Pod>,
    pipeline: &Pipeline,
    stamps: &Stamps,
    stop: &AtomicBool,
    start: Instant,
    segment_events: usize,
    run_base: &str,
    state: &mut State,
    segment: &mut Segment,
) -> Result<usize, String> {
    let path = args.kubeconfig.as_deref().unwrap_or(Path::new(""));
    let mut n = 0;
    loop {
        let left = args.duration.saturating_sub(start.elapsed()).as_secs_f64() * args.rate;
        // What fits in what is left, the population's creates first; at least one segment.
        let events = (left as usize)
            .saturating_sub(args.keys)
            .min(segment_events);
        if n > 0 && events == 0 {
            return Ok(n);
        }
        let events = events.max(1);
        let run = format!("{run_base}-{n}");
        let record = std::env::temp_dir().join(format!("loadgen-{run}.record"));
        let workload_args = vec![
            "--workload=w1".to_string(),
            format!("--keys={}", args.keys),
            format!("--events={events}"),
            format!("--seed={}", args.seed + n as u64),
            format!("--rate={}", args.rate),
        ];
        let target = target(path, url, namespace, args, workload_args);
        segment.run.clone_from(&run);
        segment.record.clone_from(&record);
        let mut child = kube_churn::spawn_held(exe, &target, &run, &record)?;
        let mut lines = kube_churn::lines(&mut child);
        segment.child = Some(child);
        let mut tail = RecordTail::new(record.clone());
        let mut held = true;
        let status = loop {
            // Relaxed: the flag carries no data.
            if stop.load(Ordering::Relaxed) {
                return Err(format!("{INTERRUPTED} in segment {n} (run {run})"));
            }
            maybe_sample(state, start, pipeline, n, &mut tail, stamps)?;
            let child = segment
                .child
                .as_mut()
                .ok_or_else(|| "the churn is gone".to_string())?;
            if held {
                if let Ok(line) = lines.try_recv() {
                    if line != "populated" {
                        return Err(format!("expected `populated` from the churn, got {line:?}"));
                    }
                    let go = child.stdin.take().map(|mut stdin| stdin.write_all(b"go\n"));
                    if !matches!(go, Some(Ok(()))) {
                        return Err(format!("cannot give run {run}'s churn the go-ahead"));
                    }
                    held = false;
                }
            }
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) => {}
                Err(e) => return Err(format!("waiting for run {run}'s churn: {e}")),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        segment.child = None;
        if !status.success() || held {
            return Err(format!(
                "run {run}'s churn ended with {status}{} (its error is above)",
                if held {
                    " before it populated the namespace"
                } else {
                    ""
                }
            ));
        }
        state.events += events;
        let churned = kube_churn::final_versions(&record)?;
        let checkpoint = settle(api, namespace, pipeline, &churned, args.settle, stop).await?;
        state.lags.take(&mut tail, stamps)?;
        state.lags.forget();
        let ok = checkpoint.is_ok();
        state.checkpoints.push((start.elapsed().as_secs_f64(), ok));
        eprintln!(
            "soak: segment {n} (run {run}) over, checkpoint {}",
            match &checkpoint {
                Ok(_) => "ok".to_string(),
                Err(why) => format!("FAILED: {why}"),
            }
        );
        kube_churn::cleanup(exe, &target, &run).await?;
        let _ = std::fs::remove_file(&record);
        segment.run.clear();
        n += 1;
    }
}
