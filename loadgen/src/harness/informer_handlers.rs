//! The handlers a run registers on the informer ([`InformerConfig`]): recorders that check
//! what they hear against the workload's plan (`informer_verdict`), the first measuring the
//! latency from each write, the last one slow. The informer path registers them; the harness
//! floor calls the same set inline, so that its row does the same handler work.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use kcache::informer::{AsyncEventHandler, HandlerOptions};
use kcache::{DeltaObject, EventHandler};

use crate::harness::server_feed::ServedPod;
use crate::judging::informer_verdict::{same_state, HandlerRecord, KeyView, Plan};
use crate::measure::latency::new_histogram;
use crate::sync::lock;
use workloads::Pod;

/// Handlers unless told otherwise.
pub const DEFAULT_HANDLERS: usize = 3;

/// What the slow handler spins per notification unless told otherwise, in microseconds.
pub const DEFAULT_SLOW_HANDLER_US: u64 = 1;

/// How the run registers its handlers: the informer's three kinds of registration, so that
/// the cost of each path from the queue to a handler can be measured on the same events.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// A thread per handler, fed by a bounded buffer (client-go's `processorListener`).
    #[default]
    Thread,
    /// On the consumer threads, right after each batch is applied (kube-rs' way).
    Inline,
    /// A tokio task per handler on the informer's runtime, fed by a bounded buffer.
    Async,
}

impl Delivery {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Thread => "thread",
            Self::Inline => "inline",
            Self::Async => "async",
        }
    }
}

/// The informer path's own knobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InformerConfig {
    /// Handler registrations; the last one is slow.
    pub handlers: usize,
    /// How every handler is registered.
    pub delivery: Delivery,
    /// What the slow handler spins (or waits) per notification.
    pub slow_handler: Duration,
    /// The slow handler sleeps its time instead of spinning (it waits on I/O).
    pub slow_handler_waits: bool,
    /// The slow handler coalesces per key when its buffer is full.
    pub slow_handler_coalesces: bool,
    /// The slow handler's buffer bound (default: the informer's).
    pub slow_handler_buffer: Option<usize>,
}

impl Default for InformerConfig {
    fn default() -> Self {
        Self {
            handlers: DEFAULT_HANDLERS,
            delivery: Delivery::Thread,
            slow_handler: Duration::from_micros(DEFAULT_SLOW_HANDLER_US),
            slow_handler_waits: false,
            slow_handler_coalesces: false,
            slow_handler_buffer: None,
        }
    }
}

impl InformerConfig {
    /// How a handler other than the slow one is registered.
    pub(crate) fn handler_options(&self) -> HandlerOptions {
        match self.delivery {
            Delivery::Inline => HandlerOptions::new().inline(),
            Delivery::Thread | Delivery::Async => HandlerOptions::new(),
        }
    }

    /// How the slow (last) handler is registered.
    pub(crate) fn slow_handler_options(&self) -> HandlerOptions {
        let mut options = self.handler_options().name("slow");
        if let Some(bound) = self.slow_handler_buffer {
            options = options.buffer(bound);
        }
        if self.slow_handler_coalesces {
            options = options.coalesce();
        }
        options
    }
}

/// The command line of [`InformerConfig`], shared by `run` and `capacity`.
#[derive(Debug, Clone, clap::Args)]
pub struct InformerArgs {
    /// `--through informer`: handler registrations; the last one is the slow one.
    #[arg(long, default_value_t = DEFAULT_HANDLERS, value_parser = parse_handlers)]
    pub handlers: usize,
    /// `--through informer`: how every handler is registered: `thread` (a thread and a bounded
    /// buffer each, client-go's way), `inline` (on the consumer threads after each batch,
    /// kube-rs' way) or `async` (a tokio task and a bounded buffer each).
    #[arg(long, value_enum, default_value = "thread")]
    pub delivery: Delivery,
    /// `--through informer`: CPU microseconds the slow handler spins per notification.
    #[arg(long, default_value_t = DEFAULT_SLOW_HANDLER_US)]
    pub slow_handler_us: u64,
    /// `--through informer`: the slow handler sleeps its time (a handler waiting on I/O)
    /// instead of spinning on a CPU.
    #[arg(long)]
    pub slow_handler_waits: bool,
    /// `--through informer`: the slow handler coalesces per key (`HandlerOptions::coalesce`):
    /// what waits for it is merged into one change per key, so it does not hold the informer.
    #[arg(long)]
    pub slow_handler_coalesces: bool,
    /// `--through informer`: the slow handler's buffer bound, in notifications (default: the
    /// informer's, 65,536).
    #[arg(long)]
    pub slow_handler_buffer: Option<usize>,
}

impl InformerArgs {
    /// The knobs these arguments ask for.
    pub fn config(&self) -> InformerConfig {
        InformerConfig {
            handlers: self.handlers,
            delivery: self.delivery,
            slow_handler: Duration::from_micros(self.slow_handler_us),
            slow_handler_waits: self.slow_handler_waits,
            slow_handler_coalesces: self.slow_handler_coalesces,
            slow_handler_buffer: self.slow_handler_buffer,
        }
    }
}

/// Parses `--handlers`: at least one.
///
/// ```
/// use loadgen::harness::informer_handlers::parse_handlers;
/// assert_eq!(parse_handlers("3"), Ok(3));
/// assert!(parse_handlers("0").is_err());
/// ```
pub fn parse_handlers(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=64).contains(&n) => Ok(n),
        _ => Err(format!(
            "--handlers must be a whole number from 1 to 64 (got {s:?})"
        )),
    }
}

/// A handler's progress, shared with the driver while it runs.
#[derive(Debug, Default)]
pub(crate) struct Progressing {
    /// Keys whose view is not yet the final one.
    pub(crate) mismatches: AtomicUsize,
    pub(crate) notifications: AtomicU64,
    /// When `mismatches` last fell to zero.
    pub(crate) caught_up: Mutex<Option<Instant>>,
    /// The record, handed over when the delivery thread drops the handler.
    pub(crate) record: Mutex<Option<(HandlerRecord, Option<Histogram<u64>>)>>,
}

/// A registered handler: records and checks what it hears, spins if it is the slow one.
/// W6's handler wraps one ([`controller_informer`](crate::pipelines::controller_informer)).
pub(crate) struct Recorder {
    record: HandlerRecord,
    plan: Arc<Plan>,
    shared: Arc<Progressing>,
    mismatches: usize,
    cost: Duration,
    /// Sleep `cost` rather than spin it.
    waits: bool,
    /// The fast handler that measures latency: from the write's stamp to this notification.
    latency: Option<(Instant, Histogram<u64>)>,
}

impl Recorder {
    pub(crate) fn new(plan: Arc<Plan>, cost: Duration, latency_from: Option<Instant>) -> Self {
        let keys = plan.final_views.len();
        let mismatches = plan
            .final_views
            .iter()
            .filter(|v| !same_state(KeyView::default(), **v))
            .count();
        let shared = Arc::new(Progressing::default());
        shared.mismatches.store(mismatches, Ordering::Relaxed);
        Self {
            record: HandlerRecord::new(keys),
            plan,
            shared,
            mismatches,
            cost,
            waits: false,
            latency: latency_from.map(|start| (start, new_histogram())),
        }
    }

    /// The slow handler of `icfg`: sleeping or spinning, judged as coalescing if it does.
    fn slow(plan: Arc<Plan>, icfg: &InformerConfig, latency_from: Option<Instant>) -> Self {
        let mut recorder = Self::new(plan, icfg.slow_handler, latency_from);
        recorder.record.ledger.coalescing = icfg.slow_handler_coalesces;
        recorder.waits = icfg.slow_handler_waits;
        recorder
    }

    /// Its progress, which the driver polls and which holds its record once it is dropped.
    pub(crate) fn shared(&self) -> Arc<Progressing> {
        Arc::clone(&self.shared)
    }

    fn matches_final(&self, id: usize) -> bool {
        same_state(self.record.views()[id], self.plan.final_views[id])
    }

    /// Runs `change` on key `id`'s view and keeps the count of keys not yet final.
    fn track(&mut self, id: usize, change: impl FnOnce(&mut HandlerRecord)) {
        let before = self.matches_final(id);
        change(&mut self.record);
        let after = self.matches_final(id);
        if before != after {
            if after {
                self.mismatches -= 1;
            } else {
                self.mismatches += 1;
            }
            // Release pairs with the driver's Acquire load: what a wrapping handler did before
            // this call (W6's workqueue `add`) is visible once the driver sees the view final.
            // The verdict reads the record after the thread has been joined.
            self.shared
                .mismatches
                .store(self.mismatches, Ordering::Release);
            if self.mismatches == 0 {
                *lock(&self.shared.caught_up) = Some(Instant::now());
            }
        }
        self.shared
            .notifications
            .store(self.record.notifications(), Ordering::Relaxed);
        self.burn();
    }

    fn sample(&mut self, pod: &Pod) {
        if let Some((start, hist)) = &mut self.latency {
            // Relaxed: the stamp travelled with the object through the server's channel and
            // the queue, whose synchronisation orders the producer's store before this.
            let stamped = pod.enqueued_ns.swap(0, Ordering::Relaxed);
            if stamped != 0 {
                let now = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX) + 1;
                hist.saturating_record(now.saturating_sub(stamped).max(1));
            }
        }
    }

    fn burn(&self) {
        if self.cost.is_zero() {
            return;
        }
        if self.waits {
            thread::sleep(self.cost);
            return;
        }
        spin(self.cost);
    }
}

/// Spins a CPU for `cost`.
fn spin(cost: Duration) {
    let t = Instant::now();
    while t.elapsed() < cost {
        std::hint::spin_loop();
    }
}

/// A [`Recorder`] registered as an async handler ([`Delivery::Async`]): it records as the
/// recorder does, then spends the slow handler's cost the async way, awaiting a timer when
/// the handler waits (tokio's timer has millisecond granularity: a 1 µs wait is a 1 ms one)
/// and spinning otherwise.
pub(crate) struct AsyncRecorder {
    recorder: Recorder,
    cost: Duration,
    waits: bool,
}

impl AsyncRecorder {
    /// Takes the cost out of `recorder`, so that it is spent here and not by a blocking call.
    pub(crate) fn new(mut recorder: Recorder) -> Self {
        let cost = std::mem::take(&mut recorder.cost);
        Self {
            waits: recorder.waits,
            recorder,
            cost,
        }
    }

    fn spend(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (cost, waits) = (self.cost, self.waits);
        async move {
            if cost.is_zero() {
            } else if waits {
                tokio::time::sleep(cost).await;
            } else {
                spin(cost);
            }
        }
    }
}

impl AsyncEventHandler<ServedPod> for AsyncRecorder {
    fn on_add(
        &mut self,
        obj: Arc<ServedPod>,
        is_in_initial_list: bool,
    ) -> impl std::future::Future<Output = ()> + Send {
        self.recorder.on_add(&obj, is_in_initial_list);
        self.spend()
    }

    fn on_update(
        &mut self,
        old: Arc<ServedPod>,
        new: Arc<ServedPod>,
    ) -> impl std::future::Future<Output = ()> + Send {
        self.recorder.on_update(&old, &new);
        self.spend()
    }

    fn on_delete(
        &mut self,
        obj: DeltaObject<ServedPod>,
    ) -> impl std::future::Future<Output = ()> + Send {
        self.recorder.on_delete(&obj);
        self.spend()
    }
}

impl EventHandler<ServedPod> for Recorder {
    fn on_add(&mut self, obj: &Arc<ServedPod>, is_in_initial_list: bool) {
        let (id, version) = (obj.pod.id as usize, obj.pod.version);
        self.sample(&obj.pod);
        let listed = self.plan.in_initial_list[id];
        self.track(id, |r| r.add(id, version, is_in_initial_list, listed));
    }

    fn on_update(&mut self, old: &Arc<ServedPod>, new: &Arc<ServedPod>) {
        let id = new.pod.id as usize;
        self.sample(&new.pod);
        let (old, new) = (old.pod.version, new.pod.version);
        self.track(id, |r| r.update(id, old, new));
    }

    fn on_delete(&mut self, obj: &DeltaObject<ServedPod>) {
        let (pod, tombstone) = match obj {
            DeltaObject::Object(o) => (&o.pod, false),
            DeltaObject::Tombstone(t) => match &t.last_known {
                Some(o) => (&o.pod, true),
                None => {
                    self.record.stateless_tombstone(t.key.as_str());
                    return;
                }
            },
        };
        let (id, version) = (pod.id as usize, pod.version);
        self.track(id, |r| r.delete(id, version, tombstone));
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let record = std::mem::take(&mut self.record);
        let latency = self.latency.take().map(|(_, h)| h);
        *lock(&self.shared.record) = Some((record, latency));
    }
}

/// The handlers of `icfg`, each with its registration options: the first measures the latency
/// from each write's stamp (taken against `start`), the last is the slow one (unless its cost
/// is zero).
pub(crate) fn recorders(
    plan: &Arc<Plan>,
    icfg: &InformerConfig,
    start: Instant,
) -> Vec<(Recorder, HandlerOptions)> {
    (0..icfg.handlers)
        .map(|h| {
            let slow = h + 1 == icfg.handlers && !icfg.slow_handler.is_zero();
            let latency_from = (h == 0).then_some(start);
            if slow {
                (
                    Recorder::slow(Arc::clone(plan), icfg, latency_from),
                    icfg.slow_handler_options(),
                )
            } else {
                let recorder = Recorder::new(Arc::clone(plan), Duration::ZERO, latency_from);
                (recorder, icfg.handler_options())
            }
        })
        .collect()
}
