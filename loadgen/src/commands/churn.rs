//! `loadgen churn`: a workload's pods written into any API server a kubeconfig reaches
//! (`serve --writes`, or a real cluster through `kubectl proxy`), as a controller writes them:
//! creates, replaces and deletes at the workload's mix and an offered rate (docs/real-clusters.md).
//!
//! **It only touches what it created.** Every pod it writes carries [`RUN_LABEL`] with the run's
//! id and a name that starts with the prefix; a replace re-reads a pod after a conflict and
//! gives up if the pod is no longer the run's; a delete carries the uid it created as a
//! precondition; `--cleanup` deletes exactly the pods with the run's label *and* the prefix. It
//! refuses to start in a namespace that holds pods without [`RUN_LABEL`] unless
//! `--allow-foreign`, and in one that holds a pod of a name it would create.
//!
//! **The writes.** The workload's leading adds (W3: its first relist) create the initial
//! population; after that an add is a `POST`, an update a `PUT` of the pod the last write
//! returned with the change applied, a delete a `DELETE` (grace period 0, as for a pod on no
//! node), and a later relist (W3) the creates, replaces and deletes that bring the namespace to
//! the list. `--concurrency` writes are in flight at once (1 by default), each key's in order;
//! a server slower than the offered rate sets the pace (the summary says so). A pod is the `typical` profile's pod as its controller would post it (serve's
//! [`typed_pod`], without what the API server, the scheduler and the kubelet add: uid, resource
//! version, times, `managedFields`, owner, node, priority, status). An update changes
//! [`VERSION_LABEL`] (the workload's version) and, as serve's churn picks them, one in ten the
//! first container's image (a spec change) and one in ten [`TOUCHED_ANNOTATION`] (a metadata
//! change); the rest stand for the kubelet's status updates, which a client may not write.
//!
//! **Conflicts.** A replace answered `409 Conflict` (someone wrote the pod since: on a real
//! cluster, the kubelet) is retried as a controller retries it: GET the pod, apply the same
//! change to it, PUT again, at most [`MAX_CONFLICT_RETRIES`] times; the retries are counted.
//!
//! **The record** (`--record FILE`): one JSON line per write, with when it returned (Unix
//! nanoseconds) and the resource version the server gave, so a reader of the server's watch can
//! measure its lag without the server's clock.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufWriter, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::stream::{FuturesUnordered, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use workloads::{generate, Generated, Op, PodProfile};

use crate::args::{parse_concurrency, parse_rate, PodWorkloadArgs};
use crate::progress::Progress;
use crate::serve::objects::{PodState, Revision, VERSION_LABEL};
use crate::serve::profile::{mix, typed_pod, Shape, Values, TOUCHED_ANNOTATION};
use crate::ui::Ui;

/// The label that marks a pod as written by a churn run; its value is the run's id.
pub const RUN_LABEL: &str = "loadgen.kcache.io/run";
/// How many times a replace is retried after a `409 Conflict` before the run fails.
pub const MAX_CONFLICT_RETRIES: u32 = 8;
/// At most this many pods per list page (the start's check, `--cleanup`).
const LIST_PAGE: u32 = 500;

/// Arguments of `loadgen churn`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChurnArgs {
    /// The pods' workload.
    #[command(flatten)]
    pub pods: PodWorkloadArgs,
    /// The kubeconfig naming the API server [default: $KUBECONFIG, then ~/.kube/config].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The namespace written to [default: the kubeconfig context's, else `default`].
    #[arg(long)]
    pub namespace: Option<String>,
    /// Offered rate of writes, per second (the initial population's creates included).
    #[arg(long, default_value = "100", value_parser = parse_rate)]
    pub rate: f64,
    /// The run's id, the value of the `loadgen.kcache.io/run` label on every pod written
    /// [default: generated, printed at the start]; `--cleanup` needs it.
    #[arg(long, value_parser = parse_run)]
    pub run: Option<String>,
    /// What every pod name written starts with.
    #[arg(long, default_value = "lg-", value_parser = parse_prefix)]
    pub prefix: String,
    /// Delete the pods of `--run` (its label and the prefix, both) and exit.
    #[arg(long)]
    pub cleanup: bool,
    /// Write into a namespace that holds pods loadgen did not create (they are never touched).
    #[arg(long)]
    pub allow_foreign: bool,
    /// Record each write (when it returned, the resource version given) here, as JSON lines.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Writes in flight at once (each key's writes stay in order: a key's next write waits
    /// for its last). With more than one, the record's lines are in the order the answers came.
    #[arg(long, default_value_t = 1, value_parser = parse_concurrency)]
    pub concurrency: usize,
    /// After the initial population, print `populated` on stdout and wait for a line on stdin
    /// before the churn (`loadgen e2e --kubeconfig` lets its client sync first).
    #[arg(long)]
    pub hold: bool,
}

/// A run id: a label value (1 to 63 letters, digits, `-`, `_`, `.`, alphanumeric at both ends).
pub fn parse_run(s: &str) -> Result<String, String> {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let ok = (1..=63).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && alnum(s.chars().next())
        && alnum(s.chars().last());
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a run id: expected 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (a label value)"
        ))
    }
}

/// A name prefix: lowercase letters, digits and `-`, starting with a letter or digit, at most
/// 200 characters (the pods' names must stay RFC 1123 subdomains).
pub fn parse_prefix(s: &str) -> Result<String, String> {
    let ok = (1..=200).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a name prefix: expected 1 to 200 lowercase letters, digits or '-', starting with a letter or digit"
        ))
    }
}

/// Why a churn stopped.
#[derive(Debug, thiserror::Error)]
pub enum ChurnError {
    /// The kubeconfig could not be read or used, or the run could not go on (`--hold`'s pipe,
    /// a plan that updates a pod before creating it).
    #[error("{0}")]
    Config(String),
    /// The namespace holds pods the run must not share it with.
    #[error("{0}")]
    Refused(String),
    /// A pod the run wrote is no longer the run's (someone replaced it).
    #[error("pod {name} no longer carries {RUN_LABEL}={run} (someone else wrote it); churn leaves it alone and stops")]
    NotOurs {
        /// The pod.
        name: String,
        /// The run.
        run: String,
    },
    /// A replace kept meeting conflicts.
    #[error("replacing pod {0} met {MAX_CONFLICT_RETRIES} conflicts in a row; giving up")]
    Conflicts(String),
    /// The API server refused a write or a read.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// Ctrl-C stopped the churn between two writes.
    #[error("interrupted")]
    Interrupted,
    /// The record could not be written.
    #[error("writing the record {path}: {source}")]
    Record {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

fn api_error(what: impl Into<String>) -> impl FnOnce(kube::Error) -> ChurnError {
    let what = what.into();
    move |source| ChurnError::Api { what, source }
}

/// Whether `error` is the API server's `409 Conflict` for a stale resource version.
fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

/// What a write does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// `POST`.
    Create,
    /// `PUT`.
    Update,
    /// `DELETE`.
    Delete,
}

impl WriteKind {
    fn as_str(self) -> &'static str {
        match self {
            WriteKind::Create => "create",
            WriteKind::Update => "update",
            WriteKind::Delete => "delete",
        }
    }
}

/// One write of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// What it does.
    pub kind: WriteKind,
    /// The workload's key.
    pub id: u32,
    /// The key's workload version after it ([`VERSION_LABEL`]).
    pub version: u64,
    /// What the pod went through, as serve's churn counts it.
    pub revision: Revision,
}

/// The writes that carry `generated` out, in order, and how many of them are the initial
/// population.
pub fn plan(generated: &Generated) -> (Vec<Planned>, usize) {
    let keys = generated.universe.keys.len();
    let mut plan = Plan {
        alive: vec![None; keys],
        revisions: vec![Revision::default(); keys],
        writes: Vec::with_capacity(generated.ops.len()),
    };
    let mut ops = generated.ops.iter().peekable();
    if let Some(Op::Replace(relist)) = ops.peek() {
        for pod in &relist.objects {
            plan.step(WriteKind::Create, pod.id, pod.version);
        }
        ops.next();
    } else {
        while let Some(Op::Add(pod)) = ops.peek() {
            plan.step(WriteKind::Create, pod.id, pod.version);
            ops.next();
        }
    }
    let initial = plan.writes.len();
    for op in ops {
        match op {
            Op::Add(pod) => plan.step(WriteKind::Create, pod.id, pod.version),
            Op::Update(pod) => plan.step(WriteKind::Update, pod.id, pod.version),
            Op::Delete(pod) => plan.step(WriteKind::Delete, pod.id, pod.version),
            Op::Replace(relist) => {
                let mut listed = vec![false; keys];
                for pod in &relist.objects {
                    listed[pod.id as usize] = true;
                    match plan.alive[pod.id as usize] {
                        None => plan.step(WriteKind::Create, pod.id, pod.version),
                        Some(v) if v != pod.version => {
                            plan.step(WriteKind::Update, pod.id, pod.version)
                        }
                        Some(_) => {}
                    }
                }
                for (id, listed) in listed.into_iter().enumerate() {
                    if let (false, Some(v)) = (listed, plan.alive[id]) {
                        plan.step(WriteKind::Delete, id as u32, v);
                    }
                }
            }
            Op::Resync => {}
        }
    }
    (plan.writes, initial)
}

/// The plan as it is made: what is alive at which version, each key's revision.
struct Plan {
    alive: Vec<Option<u64>>,
    revisions: Vec<Revision>,
    writes: Vec<Planned>,
}

impl Plan {
    /// Appends a `kind` write of key `id` at `version`, moving its revision on as serve's churn
    /// does.
    fn step(&mut self, kind: WriteKind, id: u32, version: u64) {
        let i = id as usize;
        let revision = &mut self.revisions[i];
        match kind {
            WriteKind::Create => *revision = Revision::default(),
            WriteKind::Delete => {}
            WriteKind::Update => match mix(u64::from(id) << 32 ^ version) % 10 {
                0 => revision.spec = revision.spec.wrapping_add(1),
                1 => revision.touched = revision.touched.wrapping_add(1),
                _ => revision.restarts = revision.restarts.wrapping_add(1),
            },
        }
        self.alive[i] = (kind != WriteKind::Delete).then_some(version);
        self.writes.push(Planned {
            kind,
            id,
            version,
            revision: *revision,
        });
    }
}

/// The name of key `id`'s pod.
pub fn pod_name(prefix: &str, id: u32) -> String {
    format!("{prefix}pod-{id}")
}

/// Key `id`'s pod at `version` as its controller would create it: serve's `typical` pod
/// without what the API server, the scheduler and the kubelet add, labelled with the run.
pub fn pod_to_create(namespace: &str, name: &str, run: &str, planned: &Planned) -> Pod {
    let state = PodState {
        namespace,
        name,
        node: None,
        id: planned.id,
        incarnation: 0,
        version: planned.version,
        resource_version: 0,
        created: 0,
        profile: PodProfile::Typical,
        revision: planned.revision,
    };
    let shape = Shape::of(&state);
    let mut pod = typed_pod(shape, &Values::of(&state, shape));
    let meta = &mut pod.metadata;
    meta.uid = None;
    meta.resource_version = None;
    meta.creation_timestamp = None;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.generation = None;
    meta.generate_name = None;
    meta.labels
        .get_or_insert_with(BTreeMap::new)
        .insert(RUN_LABEL.to_string(), run.to_string());
    if let Some(spec) = &mut pod.spec {
        // The scheduler's; and admission's (a real API server refuses a `priority` that its
        // admission would not compute).
        spec.node_name = None;
        spec.priority = None;
        spec.preemption_policy = None;
    }
    pod.status = None;
    pod
}

/// Applies `planned` (an update) to `pod`: the version label, and the image and annotation the
/// revision says.
pub fn apply_update(pod: &mut Pod, planned: &Planned, desired: &Pod) {
    pod.metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(VERSION_LABEL.to_string(), planned.version.to_string());
    if let Some(touched) = desired
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TOUCHED_ANNOTATION))
    {
        pod.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(TOUCHED_ANNOTATION.to_string(), touched.clone());
    }
    let image = desired
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone());
    if let (Some(image), Some(first)) = (
        image,
        pod.spec.as_mut().and_then(|s| s.containers.first_mut()),
    ) {
        first.image = Some(image);
    }
}

/// What the churn writes through: `Api<Pod>` on a real client, a fake in tests.
pub trait Pods {
    /// `GET` one pod.
    fn get(&self, name: &str) -> impl std::future::Future<Output = Result<Pod, kube::Error>>;
    /// `PUT` one pod.
    fn replace(
        &self,
        name: &str,
        pod: &Pod,
    ) -> impl std::future::Future<Output = Result<Pod, kube::Error>>;
}

impl Pods for Api<Pod> {
    async fn get(&self, name: &str) -> Result<Pod, kube::Error> {
        Api::get(self, name).await
    }

    async fn replace(&self, name: &str, pod: &Pod) -> Result<Pod, kube::Error> {
        Api::replace(self, name, &PostParams::default(), pod).await
    }
}

/// Replaces `current` with `change` applied, as a controller does: on `409 Conflict`, GET the
/// pod, check it is still the run's, apply the change again and PUT again. Returns the pod the
/// server stored and the conflicts met.
pub async fn replace_retrying(
    pods: &impl Pods,
    name: &str,
    run: &str,
    current: &Pod,
    change: impl Fn(&mut Pod),
) -> Result<(Pod, u32), ChurnError> {
    let mut pod = current.clone();
    let mut conflicts = 0;
    loop {
        change(&mut pod);
        match pods.replace(name, &pod).await {
            Ok(stored) => return Ok((stored, conflicts)),
            Err(e) if is_conflict(&e) => {
                conflicts += 1;
                if conflicts > MAX_CONFLICT_RETRIES {
                    return Err(ChurnError::Conflicts(name.to_string()));
                }
                pod = pods
                    .get(name)
                    .await
                    .map_err(api_error(format!("reading pod {name} after a conflict")))?;
                if run_of(&pod) != Some(run) {
                    return Err(ChurnError::NotOurs {
                        name: name.to_string(),
                        run: run.to_string(),
                    });
                }
            }
            Err(e) => return Err(api_error(format!("replacing pod {name}"))(e)),
        }
    }
}

fn run_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(RUN_LABEL))
        .map(String::as_str)
}

/// How a churn went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChurnCounts {
    /// Creates written.
    pub creates: u64,
    /// Replaces written.
    pub updates: u64,
    /// Deletes written.
    pub deletes: u64,
    /// Conflicts met and retried.
    pub conflicts: u64,
}

impl fmt::Display for ChurnCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} writes ({} creates, {} updates, {} deletes), {} conflicts retried",
            self.creates + self.updates + self.deletes,
            self.creates,
            self.updates,
            self.deletes,
            self.conflicts
        )
    }
}

/// `loadgen churn`.
pub fn main(args: ChurnArgs) -> ExitCode {
    if args.cleanup && args.run.is_none() {
        eprintln!("loadgen churn: --cleanup deletes the pods of one run: name it with --run ID");
        return ExitCode::from(2);
    }
    if let Err(e) = args.pods.spec() {
        eprintln!("loadgen churn: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("loadgen churn: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let (client, namespace) = connect(args.kubeconfig.as_ref(), args.namespace.as_deref())
            .await
            .map_err(ChurnError::Config)?;
        let api: Api<Pod> = Api::namespaced(client, &namespace);
        if args.cleanup {
            let run = args.run.as_deref().unwrap_or_default();
            let deleted = cleanup(&api, run, &args.prefix).await?;
            Ui::detect().note(&format!(
                "loadgen churn: deleted {deleted} pods of run {run} from namespace {namespace}"
            ));
            return Ok(());
        }
        churn(&api, &namespace, &args).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(ChurnError::Interrupted) => {
            eprintln!("loadgen churn: interrupted; its pods stay until `loadgen churn --cleanup --run ID`");
            ExitCode::from(130)
        }
        Err(e @ ChurnError::Refused(_)) => {
            eprintln!("loadgen churn: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("loadgen churn: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A client for the kubeconfig at `path` (or the usual resolution), and the namespace to use.
async fn connect(
    path: Option<&PathBuf>,
    namespace: Option<&str>,
) -> Result<(Client, String), String> {
    let config = match path {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .map_err(|e| format!("reading the kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| format!("using the kubeconfig {}: {e}", path.display()))?
        }
        None => Config::infer()
            .await
            .map_err(|e| format!("finding a kubeconfig (give one with --kubeconfig): {e}"))?,
    };
    if config.cluster_url.scheme_str() != Some("http") {
        return Err(format!(
            "the kubeconfig's server is {}; this loadgen speaks plain HTTP only: run `kubectl proxy --port 8001` and point a kubeconfig at http://127.0.0.1:8001 (docs/real-clusters.md)",
            config.cluster_url
        ));
    }
    let namespace = namespace
        .map(str::to_string)
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| format!("making a client: {e}"))?;
    Ok((client, namespace))
}

/// Every pod of the namespace, page by page.
async fn list_all(api: &Api<Pod>) -> Result<Vec<Pod>, ChurnError> {
    let mut pods = Vec::new();
    let mut params = ListParams::default().limit(LIST_PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(api_error("listing the namespace's pods"))?;
        pods.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(pods),
        }
    }
}

/// Deletes the pods with `run`'s label and a name that starts with `prefix`; returns how many.
pub async fn cleanup(api: &Api<Pod>, run: &str, prefix: &str) -> Result<u64, ChurnError> {
    let mut deleted = 0;
    for pod in list_all(api).await? {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if run_of(&pod) != Some(run) || !name.starts_with(prefix) {
            continue;
        }
        match api.delete(&name, &delete_params(pod.metadata.uid)).await {
            Ok(_) => deleted += 1,
            // Gone meanwhile: nothing to do.
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => return Err(api_error(format!("deleting pod {name}"))(e)),
        }
    }
    Ok(deleted)
}

/// A delete of the incarnation with `uid`, at once (grace period 0: no kubelet waits on it).
fn delete_params(uid: Option<String>) -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}

/// Refuses a namespace with foreign pods (unless allowed) or with pods of the names to come.
async fn check_namespace(
    api: &Api<Pod>,
    namespace: &str,
    args: &ChurnArgs,
    names: &[Option<String>],
) -> Result<(), ChurnError> {
    let pods = list_all(api).await?;
    let foreign: Vec<&str> = pods
        .iter()
        .filter(|p| run_of(p).is_none())
        .filter_map(|p| p.metadata.name.as_deref())
        .collect();
    if !foreign.is_empty() && !args.allow_foreign {
        let some = foreign
            .iter()
            .take(3)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        return Err(ChurnError::Refused(format!(
            "namespace {namespace} holds {} pods loadgen did not create (without the {RUN_LABEL} label: {some}{}); churn never touches them, but it shares a namespace only with --allow-foreign (or give --namespace)",
            foreign.len(),
            if foreign.len() > 3 { ", …" } else { "" }
        )));
    }
    let wanted: std::collections::HashSet<&str> =
        names.iter().flatten().map(String::as_str).collect();
    if let Some(pod) = pods.iter().find(|p| {
        p.metadata
            .name
            .as_deref()
            .is_some_and(|n| wanted.contains(n))
    }) {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let hint = match run_of(pod) {
            Some(run) => format!("it belongs to run {run}: `loadgen churn --cleanup --run {run}` removes that run's pods"),
            None => "it is not loadgen's".to_string(),
        };
        return Err(ChurnError::Refused(format!(
            "namespace {namespace} already holds pod {name}, a name this run would create ({hint}), or give another --prefix"
        )));
    }
    Ok(())
}

/// One line of the record.
#[derive(Debug, serde::Serialize)]
struct RecordLine<'a> {
    write: u64,
    op: &'static str,
    name: &'a str,
    version: u64,
    resource_version: Option<&'a str>,
    returned_unix_ns: u128,
    conflicts: u32,
}

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn default_run() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("r{secs:x}-{:x}", std::process::id())
}

async fn churn(api: &Api<Pod>, namespace: &str, args: &ChurnArgs) -> Result<(), ChurnError> {
    let ui = Ui::detect();
    // Checked in `main`.
    let spec = args.pods.spec().map_err(ChurnError::Config)?;
    let generated = generate(&spec);
    let (writes, initial) = plan(&generated);
    let run = args.run.clone().unwrap_or_else(default_run);
    let keys = generated.universe.keys.len();
    let names: Vec<Option<String>> = {
        let mut used = vec![false; keys];
        for w in &writes {
            used[w.id as usize] = true;
        }
        (0..keys)
            .map(|id| used[id].then(|| pod_name(&args.prefix, id as u32)))
            .collect()
    };
    check_namespace(api, namespace, args, &names).await?;
    ui.note(&format!(
        "loadgen churn: run {run}, {} writes ({initial} creates of the initial population) into namespace {namespace} at {} /s; `loadgen churn --cleanup --run {run}` removes its pods",
        writes.len(),
        args.rate
    ));
    let mut record = match &args.record {
        None => None,
        Some(path) => Some((
            BufWriter::new(
                std::fs::File::create(path).map_err(|source| ChurnError::Record {
                    path: path.clone(),
                    source,
                })?,
            ),
            path,
        )),
    };
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                // Relaxed: the flag carries no data.
                stop.store(true, Ordering::Relaxed);
                // A second Ctrl-C does not wait for a write that hangs.
                if tokio::signal::ctrl_c().await.is_ok() {
                    std::process::exit(130);
                }
            }
        });
    }
    let phase = ui.phase("churn", writes.len() as u64);
    let mut current: Vec<Option<Pod>> = vec![None; keys];
    // Keys with a write in flight: a key's next write waits for its last (per-key order).
    let mut busy = vec![false; keys];
    let mut in_flight = FuturesUnordered::new();
    let mut counts = ChurnCounts::default();
    let mut finished: u64 = 0;
    let mut start = Instant::now();
    // The write the pacing counts from (the first of the churn after a hold).
    let mut paced_from = 0;
    // Takes in one finished write: the key's pod, the counts, the record, progress.
    let mut finish = |done: Done,
                      current: &mut Vec<Option<Pod>>,
                      busy: &mut Vec<bool>|
     -> Result<(), ChurnError> {
        let planned = &writes[done.n];
        let id = planned.id as usize;
        busy[id] = false;
        match planned.kind {
            WriteKind::Create => counts.creates += 1,
            WriteKind::Update => counts.updates += 1,
            WriteKind::Delete => counts.deletes += 1,
        }
        counts.conflicts += u64::from(done.conflicts);
        let resource_version = done
            .stored
            .as_ref()
            .and_then(|p| p.metadata.resource_version.clone())
            .or(done.deleted_resource_version);
        current[id] = done.stored;
        if let Some((file, path)) = &mut record {
            let line = RecordLine {
                write: done.n as u64,
                op: planned.kind.as_str(),
                name: names[id].as_deref().unwrap_or_default(),
                version: planned.version,
                resource_version: resource_version.as_deref(),
                returned_unix_ns: done.returned_unix_ns,
                conflicts: done.conflicts,
            };
            serde_json::to_writer(&mut *file, &line)
                .map_err(io::Error::from)
                .and_then(|()| file.write_all(b"\n"))
                .map_err(|source| ChurnError::Record {
                    path: (*path).clone(),
                    source,
                })?;
        }
        finished += 1;
        if finished % 64 == 0 {
            phase.set(finished);
        }
        Ok(())
    };
    for (n, planned) in writes.iter().enumerate() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        if args.hold && n == initial {
            // The whole population is written before the go-ahead is asked for.
            while let Some(done) = in_flight.next().await {
                finish(done?, &mut current, &mut busy)?;
            }
            wait_for_go().await?;
            start = Instant::now();
            paced_from = n;
        }
        let due = Duration::try_from_secs_f64((n - paced_from) as f64 / args.rate)
            .unwrap_or(Duration::MAX);
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
        let id = planned.id as usize;
        while busy[id] || in_flight.len() >= args.concurrency {
            match in_flight.next().await {
                Some(done) => finish(done?, &mut current, &mut busy)?,
                None => break,
            }
        }
        busy[id] = true;
        let name = names[id].as_deref().unwrap_or_default();
        in_flight.push(write_one(
            api,
            namespace,
            &run,
            name,
            n,
            planned,
            current[id].take(),
        ));
    }
    while let Some(done) = in_flight.next().await {
        finish(done?, &mut current, &mut busy)?;
    }
    if args.hold && initial == writes.len() && !stop.load(Ordering::Relaxed) {
        // Nothing after the population: still say so, and wait, as promised.
        wait_for_go().await?;
    }
    if let Some((mut file, path)) = record {
        file.flush().map_err(|source| ChurnError::Record {
            path: path.clone(),
            source,
        })?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let done = counts.creates + counts.updates + counts.deletes;
    let interrupted = stop.load(Ordering::Relaxed);
    // Over the paced writes (after a hold: the churn's, not the population's).
    let achieved = done.saturating_sub(paced_from as u64) as f64 / seconds.max(1e-9);
    // A server slower than the offered rate sets the pace.
    let behind = if achieved < args.rate * 0.9 {
        format!(
            " (behind: {} write(s) in flight at a time; more with --concurrency)",
            args.concurrency
        )
    } else {
        String::new()
    };
    phase.finish(&format!(
        "run {run}: {counts}, {achieved:.0} writes/s of {} offered{behind}",
        args.rate
    ));
    if interrupted {
        return Err(ChurnError::Interrupted);
    }
    Ok(())
}

/// One write's outcome.
struct Done {
    /// Its place in the plan.
    n: usize,
    /// The pod the server stored (none after a delete).
    stored: Option<Pod>,
    /// A delete's resource version, when the server answered with the deleted pod.
    deleted_resource_version: Option<String>,
    /// Conflicts met and retried.
    conflicts: u32,
    /// When its answer arrived, Unix nanoseconds.
    returned_unix_ns: u128,
}

/// Write `n` of the plan, `planned`, of pod `name`, whose last stored state is `current`.
async fn write_one(
    api: &Api<Pod>,
    namespace: &str,
    run: &str,
    name: &str,
    n: usize,
    planned: &Planned,
    current: Option<Pod>,
) -> Result<Done, ChurnError> {
    let mut done = Done {
        n,
        stored: None,
        deleted_resource_version: None,
        conflicts: 0,
        returned_unix_ns: 0,
    };
    match planned.kind {
        WriteKind::Create => {
            let pod = pod_to_create(namespace, name, run, planned);
            let stored = api
                .create(&PostParams::default(), &pod)
                .await
                .map_err(api_error(format!("creating pod {name}")))?;
            done.returned_unix_ns = unix_ns();
            done.stored = Some(stored);
        }
        WriteKind::Update => {
            let Some(pod) = current else {
                return Err(ChurnError::Config(format!(
                    "the workload updates pod {name} before creating it"
                )));
            };
            let desired = pod_to_create(namespace, name, run, planned);
            let (stored, met) =
                replace_retrying(api, name, run, &pod, |p| apply_update(p, planned, &desired))
                    .await?;
            done.returned_unix_ns = unix_ns();
            done.conflicts = met;
            done.stored = Some(stored);
        }
        WriteKind::Delete => {
            let uid = current.and_then(|p| p.metadata.uid);
            let answer = api
                .delete(name, &delete_params(uid))
                .await
                .map_err(api_error(format!("deleting pod {name}")))?;
            done.returned_unix_ns = unix_ns();
            done.deleted_resource_version = answer.left().and_then(|p| p.metadata.resource_version);
        }
    }
    Ok(done)
}

/// `--hold`: says `populated` on stdout and waits for a line on stdin.
async fn wait_for_go() -> Result<(), ChurnError> {
    let hold = |source: io::Error| ChurnError::Config(format!("--hold: {source}"));
    {
        let mut stdout = io::stdout().lock();
        writeln!(stdout, "populated").map_err(hold)?;
        stdout.flush().map_err(hold)?;
    }
    let read = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        io::stdin().read_line(&mut line).map(|n| n > 0)
    })
    .await
    .map_err(|e| ChurnError::Config(format!("--hold: {e}")))?
    .map_err(hold)?;
    if read {
        Ok(())
    } else {
        Err(ChurnError::Config(
            "--hold: stdin ended before the go-ahead; stopping after the initial population".into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::{Cell, RefCell};
    use workloads::{Workload, WorkloadSpec};

    #[test]
    fn the_plan_ends_in_the_models_state() {
        for workload in [Workload::W1, Workload::W2, Workload::W3] {
            let generated = generate(&WorkloadSpec::new(workload).keys(50).events(400));
            let (writes, initial) = plan(&generated);
            assert_eq!(initial, 50, "{workload}: the initial population");
            let mut alive: BTreeMap<u32, u64> = BTreeMap::new();
            for w in &writes {
                match w.kind {
                    WriteKind::Create => assert!(alive.insert(w.id, w.version).is_none()),
                    WriteKind::Update => assert!(alive.insert(w.id, w.version).is_some()),
                    WriteKind::Delete => assert!(alive.remove(&w.id).is_some()),
                }
            }
            let model: BTreeMap<u32, u64> = generated
                .model
                .alive
                .iter()
                .flatten()
                .map(|p| (p.id, p.version))
                .collect();
            assert_eq!(alive, model, "{workload}");
        }
    }

    #[test]
    fn a_pod_to_create_carries_the_run_and_nothing_the_server_sets() {
        let planned = Planned {
            kind: WriteKind::Create,
            id: 7,
            version: 3,
            revision: Revision::default(),
        };
        let pod = pod_to_create("ns", "lg-pod-7", "r1", &planned);
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[RUN_LABEL], "r1");
        assert_eq!(labels[VERSION_LABEL], "3");
        assert_eq!(pod.metadata.name.as_deref(), Some("lg-pod-7"));
        assert!(pod.metadata.uid.is_none() && pod.metadata.resource_version.is_none());
        assert!(pod.metadata.owner_references.is_none() && pod.metadata.managed_fields.is_none());
        assert!(pod.status.is_none());
        let spec = pod.spec.as_ref().unwrap();
        assert!(spec.node_name.is_none() && spec.priority.is_none());
        assert!(!pod.spec.as_ref().unwrap().containers.is_empty());
    }

    #[test]
    fn run_ids_and_prefixes_are_checked() {
        assert!(parse_run("r1-a.b_c").is_ok());
        for bad in ["", "-a", "a-", "a b", &"x".repeat(64)] {
            assert!(parse_run(bad).is_err(), "{bad:?}");
        }
        assert!(parse_prefix("lg-").is_ok());
        for bad in ["", "-x", "Lg-", "a_b", "a.b"] {
            assert!(parse_prefix(bad).is_err(), "{bad:?}");
        }
    }

    /// A server holding one pod, whose first `conflicts` replaces are stale.
    struct Fake {
        stored: RefCell<Pod>,
        conflicts: Cell<u32>,
        gets: Cell<u32>,
    }

    impl Fake {
        fn new(stored: Pod, conflicts: u32) -> Fake {
            Fake {
                stored: RefCell::new(stored),
                conflicts: Cell::new(conflicts),
                gets: Cell::new(0),
            }
        }

        /// Replaces our run's `lg-pod-1` (read at version 10) through `replace_retrying`.
        fn replace_ours(&self) -> Result<(Pod, u32), ChurnError> {
            block_on(replace_retrying(
                self,
                "lg-pod-1",
                "r1",
                &ours(10, "r1"),
                set_version,
            ))
        }
    }

    /// The resource version after `stored`'s: one past it.
    fn next_version(stored: &Pod) -> Option<String> {
        let rv: u64 = stored
            .metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse()
            .unwrap();
        Some((rv + 1).to_string())
    }

    fn conflict() -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status::failure(
            "the object has been modified; please apply your changes to the latest version and try again",
            "Conflict",
        ).with_code(409)))
    }

    impl Pods for Fake {
        async fn get(&self, _name: &str) -> Result<Pod, kube::Error> {
            self.gets.set(self.gets.get() + 1);
            Ok(self.stored.borrow().clone())
        }

        async fn replace(&self, _name: &str, pod: &Pod) -> Result<Pod, kube::Error> {
            let mut stored = self.stored.borrow_mut();
            if self.conflicts.get() > 0
                || pod.metadata.resource_version != stored.metadata.resource_version
            {
                self.conflicts.set(self.conflicts.get().saturating_sub(1));
                // Someone else (the kubelet) writes meanwhile: a new version.
                stored.metadata.resource_version = next_version(&stored);
                return Err(conflict());
            }
            let mut new = pod.clone();
            new.metadata.resource_version = next_version(&stored);
            *stored = new.clone();
            Ok(new)
        }
    }

    fn ours(rv: u64, run: &str) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("lg-pod-1".into());
        pod.metadata.resource_version = Some(rv.to_string());
        pod.metadata.labels = Some(BTreeMap::from([(RUN_LABEL.to_string(), run.to_string())]));
        pod
    }

    fn set_version(pod: &mut Pod) {
        pod.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(VERSION_LABEL.to_string(), "9".to_string());
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    #[test]
    fn a_conflict_is_retried_on_the_pod_read_again() {
        let fake = Fake::new(ours(10, "r1"), 2);
        let (stored, conflicts) = fake.replace_ours().unwrap();
        assert_eq!(conflicts, 2);
        assert_eq!(fake.gets.get(), 2, "one GET per conflict");
        assert_eq!(stored.metadata.resource_version.as_deref(), Some("13"));
        assert_eq!(stored.metadata.labels.unwrap()[VERSION_LABEL], "9");
    }

    #[test]
    fn endless_conflicts_give_up() {
        let fake = Fake::new(ours(10, "r1"), u32::MAX);
        let err = fake.replace_ours().unwrap_err();
        assert!(matches!(err, ChurnError::Conflicts(_)), "{err}");
        assert_eq!(fake.gets.get(), MAX_CONFLICT_RETRIES);
    }

    #[test]
    fn a_pod_someone_else_took_over_is_left_alone() {
        let fake = Fake::new(ours(10, "someone-else"), 1);
        let err = fake.replace_ours().unwrap_err();
        assert!(matches!(err, ChurnError::NotOurs { .. }), "{err}");
        assert_eq!(
            fake.stored
                .borrow()
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .get(VERSION_LABEL),
            None,
            "the other's pod is not written"
        );
    }
}
