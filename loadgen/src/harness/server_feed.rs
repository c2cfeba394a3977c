//! The in-memory API server a run through the informer reads, and the producer that writes a
//! workload into it: what `run --through informer`, W6 through the shared informer and the
//! harness floor ([`harness_floor`](crate::pipelines::harness_floor)) share, so that all three see the
//! same server, the same writes and the same pacing.
//!
//! The server is kcache's [`MemoryListerWatcher`] over [`ServedPod`]s. The workload's initial
//! population is written before the clock starts ([`serve_initial`]); [`produce`] writes the
//! rest, paced if asked, and makes W3's relists real ([`relist`]: an outage, the deletions no
//! watch sees, a scripted 410, and a wait for the client's list).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use kcache::informer::{SetResourceVersion, Versioned};
use kcache::{IndexFunc, IndexValues, Indexers, KeyFn};
use kcache_sim::{MemoryListerWatcher, Writes};
use smallvec::smallvec;

use crate::harness::pacing::{due_time, pace, PACE_EVERY};
use crate::judging::informer_verdict::KeyView;
use crate::measure::latency::SAMPLE_EVERY;
use crate::progress::Progress;
use workloads::{Generated, Op, Pod, NAMESPACE_INDEX, NODE_INDEX};

/// How long the producer waits for the reflector to relist after an outage, and for a client
/// that fell behind to move again.
pub const RELIST_TIMEOUT: Duration = Duration::from_secs(60);

/// How far the client may fall behind the server's newest write before the producer waits:
/// half the window, so that no watch falls out of it. A watch that did would get `410`, and its
/// relist would skip the intermediate states: that engine's events/s would count work it never
/// did, and which engine relists varies from run to run.
pub const MAX_CLIENT_LAG: u64 = SERVER_WINDOW as u64 / 2;

/// Events the in-memory server keeps for watches that resume. Large enough that the watch a
/// reflector opens after a relist resumes even while the producer writes at full speed, so
/// the only relists are the workload's (a small window turns each into a chain of 410s).
pub const SERVER_WINDOW: usize = 200_000;

/// What the in-memory server stores: a workload pod and the resource version the server gave
/// its write. Cloning copies the version string and shares the pod.
#[derive(Debug, Clone)]
pub struct ServedPod {
    /// The workload's object.
    pub pod: Arc<Pod>,
    /// The server's resource version of the write that made this state.
    pub rv: String,
}

impl ServedPod {
    /// A pod not yet written (the server stamps the version).
    pub fn new(pod: Arc<Pod>) -> Self {
        Self {
            pod,
            rv: String::new(),
        }
    }
}

impl Versioned for ServedPod {
    fn resource_version(&self) -> &str {
        &self.rv
    }
}

impl SetResourceVersion for ServedPod {
    fn set_resource_version(&mut self, resource_version: &str) {
        self.rv.clear();
        self.rv.push_str(resource_version);
    }
}

/// The key function of the served pods: the pod's precomputed key.
pub fn served_key_fn() -> KeyFn<ServedPod> {
    Arc::new(|p: &ServedPod| Ok(p.pod.key.clone()))
}

/// The `namespace` and `node` indexes of the served pods (the bare path's, one level down).
pub fn served_indexers() -> Indexers<ServedPod> {
    let by_namespace: IndexFunc<ServedPod> =
        Arc::new(|p: &ServedPod| -> IndexValues { smallvec![p.pod.namespace.clone()] });
    let by_node: IndexFunc<ServedPod> =
        Arc::new(|p: &ServedPod| -> IndexValues { p.pod.node.iter().cloned().collect() });
    vec![
        (NAMESPACE_INDEX.to_string(), by_namespace),
        (NODE_INDEX.to_string(), by_node),
    ]
}

/// A server holding the first `initial_ops` ops of `gen` (the initial population the client
/// lists), with [`SERVER_WINDOW`] events kept for resuming watches.
pub fn serve_initial(
    gen: &Generated,
    initial_ops: usize,
) -> Result<MemoryListerWatcher<ServedPod>, String> {
    let server = MemoryListerWatcher::with_window(served_key_fn(), SERVER_WINDOW);
    for ops in gen.ops[..initial_ops].chunks(WRITE_BATCH) {
        server.write_batch(|w| ops.iter().try_for_each(|op| write(w, op)))?;
    }
    Ok(server)
}

/// The most ops the producer writes into the server in one batch: as many as the reflector
/// queues in one batch, so one write batch reaches the queue as one `apply_events` call.
pub const WRITE_BATCH: usize = 256;

/// Writes one op into a batch of the server's writes; an error names an op the server could
/// not mirror.
pub fn write(w: &mut Writes<'_, '_, ServedPod>, op: &Op) -> Result<(), String> {
    match op {
        Op::Add(p) | Op::Update(p) => w
            .upsert(ServedPod::new(Arc::clone(p)))
            .map(drop)
            .map_err(|e| e.to_string()),
        Op::Delete(p) => w
            .delete(&p.key)
            .map(drop)
            .ok_or_else(|| format!("the server has no {} to delete", p.key)),
        Op::Replace(relist) => {
            for p in &relist.objects {
                w.upsert(ServedPod::new(Arc::clone(p)))
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        }
        Op::Resync => Ok(()),
    }
}

/// The newest resource version a client has taken in, as an integer; `None` before it has
/// one (the producer then does not wait for it).
pub type ClientVersion<'a> = &'a (dyn Fn() -> Option<u64> + Sync);

/// A duration in whole milliseconds, for the reports.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Parses a resource version of the in-memory server (its versions are integers).
pub fn parse_version(rv: &str) -> Option<u64> {
    rv.parse().ok()
}

/// Waits while the client is more than [`MAX_CLIENT_LAG`] events behind the server; the time
/// waited is added to `held`. Errs if the client does not move for [`RELIST_TIMEOUT`].
fn wait_for_client(
    server: &MemoryListerWatcher<ServedPod>,
    client: ClientVersion<'_>,
    held: &mut Duration,
) -> Result<(), String> {
    let newest = parse_version(&server.resource_version()).unwrap_or(0);
    let behind = |seen: u64| newest.saturating_sub(seen) > MAX_CLIENT_LAG;
    let Some(mut seen) = client().filter(|&seen| behind(seen)) else {
        return Ok(());
    };
    let waiting = Instant::now();
    let mut moved = waiting;
    while behind(seen) {
        thread::sleep(Duration::from_micros(200));
        match client() {
            Some(now) if now != seen => {
                seen = now;
                moved = Instant::now();
            }
            None => break,
            Some(_) if moved.elapsed() > RELIST_TIMEOUT => {
                return Err(format!(
                    "the client stayed {} events behind for {RELIST_TIMEOUT:?}",
                    newest.saturating_sub(seen)
                ))
            }
            Some(_) => {}
        }
    }
    *held += waiting.elapsed();
    Ok(())
}

/// Writes the ops of `batch` into the server as one batch (one log segment, one wake-up per
/// watch), and empties it.
fn flush(server: &MemoryListerWatcher<ServedPod>, batch: &mut Vec<&Op>) -> Result<(), String> {
    if batch.is_empty() {
        return Ok(());
    }
    let written = server.write_batch(|w| batch.iter().try_for_each(|op| write(w, op)));
    batch.clear();
    written
}

/// A relist of the workload, made real: the server goes down, deletes what the relist leaves
/// out, scripts a 410 for the next watch and comes back; then the reflector's list is waited
/// for.
pub fn relist(
    server: &MemoryListerWatcher<ServedPod>,
    listed: &[Arc<Pod>],
    keys: usize,
) -> Result<(), String> {
    let mut in_list = vec![false; keys];
    for p in listed {
        in_list[p.id as usize] = true;
    }
    server.set_unavailable(true);
    server.expire_next_watches(1);
    let gone = server.objects();
    server.write_batch(|w| {
        for obj in gone.iter().filter(|obj| !in_list[obj.pod.id as usize]) {
            w.delete(&obj.pod.key);
        }
    });
    if server.len() != listed.len() {
        server.set_unavailable(false);
        return Err(format!(
            "the server holds {} objects, the workload's relist {}",
            server.len(),
            listed.len()
        ));
    }
    let lists_before = server.list_calls();
    server.set_unavailable(false);
    let waited = Instant::now();
    while server.list_calls() == lists_before {
        if waited.elapsed() > RELIST_TIMEOUT {
            return Err(format!(
                "the reflector did not relist within {RELIST_TIMEOUT:?} of the scripted 410"
            ));
        }
        thread::sleep(Duration::from_micros(100));
    }
    Ok(())
}

/// What the producer did beyond its writes.
#[derive(Debug, Clone, Copy, Default)]
pub struct Produced {
    /// Workload resyncs left out (the informer resyncs on its own timer).
    pub skipped_resyncs: u64,
    /// How long it waited for a client more than [`MAX_CLIENT_LAG`] events behind.
    pub held: Duration,
    /// Paced: how far behind its schedule it fell at worst (zero when unpaced).
    pub lag: Duration,
    /// The ops it paced: those after `from`.
    pub paced_ops: usize,
}

/// The producer: every op after the initial population into the server, paced if asked,
/// never more than [`MAX_CLIENT_LAG`] events ahead of `client`.
///
/// Writes go in batches ([`MemoryListerWatcher::write_batch`], up to [`WRITE_BATCH`] ops, in
/// workload order): a batch is one segment of the server's log and one wake-up of the watch,
/// as an API server's watch cache hands a busy watcher what piled up. A batch is written when
/// it is full, before a relist, and, when paced, before each wait for an op not yet due, so
/// pacing decides the batch size: at a low rate every op goes out on its own, on time.
/// Before each batch it checks the client's version and waits while the client is too far
/// behind (see [`MAX_CLIENT_LAG`]): the run measures what the client sustains without relists.
///
/// `start` is the clock of the write stamps (the handlers measure latency against it); the
/// schedule starts when the producer does, so the time the informer took to list and sync is
/// not owed as a burst of overdue writes: offered to both engines alike, the churn is the
/// same rate from its first op.
pub fn produce(
    server: &MemoryListerWatcher<ServedPod>,
    gen: &Generated,
    from: usize,
    start: Instant,
    rate: Option<u64>,
    client: ClientVersion<'_>,
    progress: &dyn Progress,
) -> Result<Produced, String> {
    let mut produced = Produced {
        paced_ops: gen.ops.len().saturating_sub(from),
        ..Produced::default()
    };
    let keys = gen.universe.keys.len();
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    let schedule = Instant::now();
    for (n, op) in gen.ops.iter().enumerate().skip(from) {
        let done = n - from;
        if let Some(rate) = rate.filter(|_| done % PACE_EVERY == 0) {
            let (due, now) = (due_time(done, rate), schedule.elapsed());
            if due > now {
                // Op `done` is not due yet: what is due goes out before the wait.
                flush(server, &mut batch)?;
                pace(schedule, done, rate);
            } else {
                produced.lag = produced.lag.max(now - due);
            }
        }
        match op {
            Op::Add(p) | Op::Update(p) | Op::Delete(p) => {
                if n % SAMPLE_EVERY == 0 {
                    // Stamped when the op is due, not when its batch is written: the wait in
                    // the batch is part of the latency. Relaxed: the server's channel and the
                    // queue order this before the handler's read.
                    let now = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
                    p.enqueued_ns.store(now + 1, Ordering::Relaxed);
                }
                batch.push(op);
                if batch.len() == WRITE_BATCH {
                    flush(server, &mut batch)?;
                    wait_for_client(server, client, &mut produced.held)?;
                }
            }
            Op::Replace(r) => {
                flush(server, &mut batch)?;
                relist(server, &r.objects, keys)?;
            }
            Op::Resync => produced.skipped_resyncs += 1,
        }
        if n % (1 << 14) == 0 {
            progress.set(n as u64);
        }
    }
    flush(server, &mut batch)?;
    progress.set(gen.ops.len() as u64);
    Ok(produced)
}

/// The server's state by pod id.
pub fn server_views(server: &MemoryListerWatcher<ServedPod>, keys: usize) -> Vec<KeyView> {
    let mut views = vec![KeyView::default(); keys];
    for obj in server.objects() {
        views[obj.pod.id as usize] = KeyView {
            version: obj.pod.version,
            alive: true,
        };
    }
    views
}
