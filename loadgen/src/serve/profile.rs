//! The pods of the `typical` and `large` profiles (docs/workloads.md, "Pod profiles"): what a
//! Deployment's pod looks like on a real API server, built as a typed `k8s_openapi` pod from
//! the values that vary from event to event.
//!
//! A pod is made in the order a real cluster makes it: the ReplicaSet controller creates it
//! from the pod template (`kube-controller-manager`'s `managedFields` entry owns exactly those
//! fields); admission adds the service-account token volume and its mounts, the two default
//! `NoExecute` tolerations, `priority` and `preemptionPolicy`; the scheduler sets `nodeName`;
//! the kubelet writes the status (its own `managedFields` entry, subresource `status`). A third
//! manager, `loadgen`, owns the annotation and the image the churn's metadata and spec changes
//! rewrite.
//!
//! Everything that is not in [`Values`] is fixed by the pod's [`Shape`] (the profile, the
//! number of application containers, whether it is scheduled), so one typed pod per shape with
//! sentinel values compiles into a template ([`super::template`]) that every event of that
//! shape is rendered from. This module is the reference the templates are tested against; the
//! churn never builds a typed pod.

use k8s_openapi::api::core::v1::Pod;
use serde_json::{json, Map, Value};
use workloads::PodProfile;

use super::bytes::push_rfc3339;
use super::objects::{uid, PodState, APP_LABEL, VERSION_LABEL};

/// At most this many regular containers (3 application containers, 2 sidecars).
pub const MAX_CONTAINERS: usize = 5;
/// At most this many init containers.
pub const MAX_INIT_CONTAINERS: usize = 2;

/// What fixes a pod's layout: every pod of one shape renders from one template.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// `typical` or `large` (`minimal` has a template of its own, [`super::encode`]).
    pub profile: PodProfile,
    /// Application containers, 1..=3 (deterministic from the pod's id).
    pub containers: u8,
    /// Whether the pod has a node (`Running` on it) or waits for one (`Pending`).
    pub scheduled: bool,
}

impl Shape {
    /// How many shapes there are (for a table of templates).
    pub const COUNT: usize = 2 * 3 * 2;

    /// The shape of the pod `state` describes (`state.profile` is not `minimal`): one
    /// application container for 60% of the ids, two for 30%, three for 10%.
    pub fn of(state: &PodState<'_>) -> Shape {
        debug_assert_ne!(state.profile, PodProfile::Minimal);
        let containers = match mix(u64::from(state.id)) % 20 {
            0..=11 => 1,
            12..=17 => 2,
            _ => 3,
        };
        Shape {
            profile: state.profile,
            containers,
            scheduled: state.node.is_some(),
        }
    }

    /// This shape's place in `0..COUNT`.
    pub fn index(self) -> usize {
        let profile = usize::from(self.profile == PodProfile::Large);
        (profile * 3 + usize::from(self.containers - 1)) * 2 + usize::from(self.scheduled)
    }

    /// Every shape, in [`Shape::index`] order.
    pub fn all() -> impl Iterator<Item = Shape> {
        [PodProfile::Typical, PodProfile::Large]
            .into_iter()
            .flat_map(|profile| {
                (1..=3).flat_map(move |containers| {
                    [false, true].map(|scheduled| Shape {
                        profile,
                        containers,
                        scheduled,
                    })
                })
            })
    }

    fn large(self) -> bool {
        self.profile == PodProfile::Large
    }

    /// The regular containers: the application's, then (large) the sidecars.
    fn regular(self) -> Vec<ContainerSpec> {
        let mut out: Vec<ContainerSpec> = APP_CONTAINERS[..usize::from(self.containers)].to_vec();
        if self.large() {
            out.extend_from_slice(&SIDECARS);
        }
        out
    }

    /// How many regular containers (restarts are spread over them).
    pub fn regular_count(self) -> usize {
        usize::from(self.containers) + if self.large() { SIDECARS.len() } else { 0 }
    }

    fn init(self) -> &'static [ContainerSpec] {
        if self.large() {
            &INIT_CONTAINERS
        } else {
            &[]
        }
    }

    /// A container's env vars: its own, and (large) ~40 for the application's.
    fn env_count(self, container: &ContainerSpec) -> usize {
        let app = APP_CONTAINERS.iter().any(|c| c.name == container.name);
        if self.large() && app {
            container.env + 32
        } else {
            container.env
        }
    }
}

/// A string that varies per event: its place in [`Values`].
pub mod s {
    /// `metadata.name`.
    pub const NAME: usize = 0;
    /// `metadata.namespace`.
    pub const NAMESPACE: usize = 1;
    /// `metadata.uid`.
    pub const UID: usize = 2;
    /// `metadata.resourceVersion`.
    pub const RESOURCE_VERSION: usize = 3;
    /// The `loadgen/version` label.
    pub const VERSION: usize = 4;
    /// `spec.nodeName`.
    pub const NODE: usize = 5;
    /// The `loadgen/touched` annotation (metadata changes).
    pub const TOUCHED: usize = 6;
    /// The first container's image (spec changes).
    pub const IMAGE: usize = 7;
    /// Its `imageID`.
    pub const IMAGE_ID: usize = 8;
    /// `status.podIP`.
    pub const POD_IP: usize = 9;
    /// `status.hostIP`.
    pub const HOST_IP: usize = 10;
    /// Each regular container's `containerID`.
    pub const CONTAINER_ID: usize = 11;
    /// Each init container's `containerID`.
    pub const INIT_CONTAINER_ID: usize = CONTAINER_ID + super::MAX_CONTAINERS;
    /// How many.
    pub const COUNT: usize = INIT_CONTAINER_ID + super::MAX_INIT_CONTAINERS;
}

/// An integer that varies per event.
pub mod i {
    /// `metadata.generation` (and `status.observedGeneration`).
    pub const GENERATION: usize = 0;
    /// Each regular container's `restartCount`.
    pub const RESTARTS: usize = 1;
    /// How many.
    pub const COUNT: usize = RESTARTS + super::MAX_CONTAINERS;
}

/// A time that varies per event.
pub mod t {
    /// `metadata.creationTimestamp`, also when the pod was scheduled and started.
    pub const CREATED: usize = 0;
    /// When it was initialized.
    pub const INITIALIZED: usize = 1;
    /// When its containers first started.
    pub const STARTED: usize = 2;
    /// The kubelet's last status update (when it last became ready).
    pub const STATUS: usize = 3;
    /// `loadgen`'s last change (the annotation or the image).
    pub const TOUCHED: usize = 4;
    /// Each regular container's `state.running.startedAt`.
    pub const CONTAINER_STARTED: usize = 5;
    /// How many.
    pub const COUNT: usize = CONTAINER_STARTED + super::MAX_CONTAINERS;
}

/// The values that vary per event, in the slots of [`s`], [`i`] and [`t`]: a template's holes.
#[derive(Debug, Clone)]
pub struct Values {
    text: String,
    strs: [(u32, u32); s::COUNT],
    /// Integers (non-negative).
    pub ints: [u64; i::COUNT],
    /// Times, Unix seconds within the years 1970..=9999.
    pub times: [i64; t::COUNT],
}

/// The latest second a four-digit year can write: 9999-12-31T23:59:59Z.
pub const MAX_RFC3339_SECOND: i64 = 253_402_300_799;
/// The latest creation time a pod of these profiles carries (its later times are offsets of
/// up to `u32::MAX` seconds from it and must stay within four-digit years).
const MAX_CREATED: i64 = MAX_RFC3339_SECOND - u32::MAX as i64 - 16;

impl Values {
    /// The value of string slot `slot`.
    pub fn str(&self, slot: usize) -> &str {
        let (start, end) = self.strs[slot];
        &self.text[start as usize..end as usize]
    }

    /// Sentinels: a unique value in every slot, which no fixed part of a pod contains (strings
    /// `@@NN@@`; integers and times far from anything a pod holds), so that the encodings of a
    /// pod built from them show where each value goes.
    pub fn sentinels() -> Values {
        let mut values = Values::empty();
        for slot in 0..s::COUNT {
            values.push_str(slot, |text| text.push_str(&sentinel_str(slot)));
        }
        for slot in 0..i::COUNT {
            values.ints[slot] = sentinel_int(slot);
        }
        for slot in 0..t::COUNT {
            values.times[slot] = sentinel_time(slot);
        }
        values
    }

    fn empty() -> Values {
        Values {
            text: String::with_capacity(512),
            strs: [(0, 0); s::COUNT],
            ints: [0; i::COUNT],
            times: [0; t::COUNT],
        }
    }

    fn push_str(&mut self, slot: usize, write: impl FnOnce(&mut String)) {
        let start = self.text.len();
        write(&mut self.text);
        self.strs[slot] = (start as u32, self.text.len() as u32);
    }

    /// The values of the pod `state` describes, of shape `shape`.
    pub fn of(state: &PodState<'_>, shape: Shape) -> Values {
        use std::fmt::Write as _;
        let revision = state.revision;
        let id = u64::from(state.id);
        let incarnation = u64::from(state.incarnation);
        let mut v = Values::empty();
        v.push_str(s::NAME, |t| t.push_str(state.name));
        v.push_str(s::NAMESPACE, |t| t.push_str(state.namespace));
        v.push_str(s::UID, |t| t.push_str(&uid(state)));
        v.push_str(s::RESOURCE_VERSION, |t| {
            let _ = write!(t, "{}", state.resource_version);
        });
        v.push_str(s::VERSION, |t| {
            let _ = write!(t, "{}", state.version);
        });
        v.push_str(s::NODE, |t| t.push_str(state.node.unwrap_or("")));
        v.push_str(s::TOUCHED, |t| {
            let _ = write!(t, "{}", revision.touched);
        });
        v.push_str(s::IMAGE, |t| {
            let _ = write!(t, "{}:1.{}.0", APP_CONTAINERS[0].image, revision.spec);
        });
        v.push_str(s::IMAGE_ID, |t| {
            t.push_str(APP_CONTAINERS[0].image);
            t.push_str("@sha256:");
            push_hex64(t, mix(0x1_0000_0000 | u64::from(revision.spec)));
        });
        v.push_str(s::POD_IP, |t| {
            let _ = write!(
                t,
                "10.{}.{}.{}",
                64 + (id >> 16 & 63),
                id >> 8 & 255,
                id & 255
            );
        });
        v.push_str(s::HOST_IP, |t| {
            let h = state.node.map_or(0, |n| fnv(n.as_bytes()));
            let _ = write!(
                t,
                "172.{}.{}.{}",
                16 + (h & 15),
                h >> 8 & 255,
                1 + (h >> 16) % 254
            );
        });
        let n = shape.regular_count() as u64;
        let restarts = u64::from(revision.restarts);
        // The slots of containers the shape does not have stay empty.
        for c in 0..n {
            let own = restarts / n + u64::from(c < restarts % n);
            v.push_str(s::CONTAINER_ID + c as usize, |t| {
                t.push_str("containerd://");
                push_hex64(t, mix(id << 24 ^ incarnation << 8 ^ c ^ own << 40));
            });
            v.ints[i::RESTARTS + c as usize] = own.min(i32::MAX as u64);
        }
        for k in 0..shape.init().len() as u64 {
            v.push_str(s::INIT_CONTAINER_ID + k as usize, |t| {
                t.push_str("containerd://");
                push_hex64(t, mix(id << 24 ^ incarnation << 8 ^ (0x80 + k)));
            });
        }
        v.ints[i::GENERATION] = 1 + u64::from(revision.spec);
        let created = state.created.clamp(0, MAX_CREATED);
        let at = |offset: u32| created + i64::from(offset);
        v.times[t::CREATED] = created;
        v.times[t::INITIALIZED] = at(1);
        v.times[t::STARTED] = at(2);
        v.times[t::STATUS] = at(revision.status_at.max(3));
        v.times[t::TOUCHED] = at(revision.touched_at);
        // The container that restarted last started at the last status update; the others
        // when the pod started.
        let last = (restarts > 0).then(|| (restarts - 1) % n);
        for c in 0..n {
            v.times[t::CONTAINER_STARTED + c as usize] = if Some(c) == last {
                v.times[t::STATUS]
            } else {
                v.times[t::STARTED]
            };
        }
        v
    }
}

/// The sentinel of string slot `slot`.
pub fn sentinel_str(slot: usize) -> String {
    format!("@@{slot:02}@@")
}

/// The sentinel of integer slot `slot` (an `int32`, as `restartCount` is).
pub fn sentinel_int(slot: usize) -> u64 {
    2_109_876_000 + 16 * slot as u64
}

/// The sentinel of time slot `slot`: a second in the year 9892.
pub fn sentinel_time(slot: usize) -> i64 {
    250_000_000_000 + 1_000_003 * slot as i64
}

/// splitmix64's finaliser: the deterministic choices made from an id.
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ z >> 30).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ z >> 27).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ z >> 31
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// 64 hex digits from one 64-bit seed (a digest's look, not a digest).
fn push_hex64(out: &mut String, seed: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 64];
    let mut x = seed;
    for word in digits.chunks_exact_mut(16) {
        x = mix(x);
        for (k, digit) in word.iter_mut().enumerate() {
            *digit = HEX[(x >> (60 - 4 * k) & 15) as usize];
        }
    }
    out.push_str(std::str::from_utf8(&digits).expect("hex digits are ASCII"));
}

/// One container's fixed parts.
#[derive(Debug, Clone, Copy)]
struct ContainerSpec {
    name: &'static str,
    image: &'static str,
    tag: &'static str,
    command: &'static [&'static str],
    args: &'static [&'static str],
    port: Option<(&'static str, i32)>,
    env: usize,
    /// 2: liveness and readiness probes, 1: readiness only, 0: none.
    probes: u8,
    cpu: (&'static str, &'static str),
    memory: (&'static str, &'static str),
}

const APP_CONTAINERS: [ContainerSpec; 3] = [
    ContainerSpec {
        name: "app",
        image: "registry.example.com/shop/checkout",
        tag: "",
        command: &["/app/bin/checkout"],
        args: &["serve", "--config=/etc/app/config.yaml", "--log-level=info"],
        port: Some(("http", 8080)),
        env: 8,
        probes: 2,
        cpu: ("250m", "1"),
        memory: ("256Mi", "512Mi"),
    },
    ContainerSpec {
        name: "worker",
        image: "registry.example.com/shop/checkout-worker",
        tag: "2.14.3",
        command: &["/app/bin/worker"],
        args: &["--queue=orders", "--concurrency=8"],
        port: Some(("metrics", 9090)),
        env: 5,
        probes: 1,
        cpu: ("100m", "500m"),
        memory: ("128Mi", "256Mi"),
    },
    ContainerSpec {
        name: "exporter",
        image: "quay.io/prometheus/statsd-exporter",
        tag: "v0.27.1",
        command: &["/bin/statsd_exporter"],
        args: &["--statsd.mapping-config=/etc/app/mapping.yaml"],
        port: Some(("metrics-exp", 9102)),
        env: 5,
        probes: 0,
        cpu: ("50m", "200m"),
        memory: ("32Mi", "64Mi"),
    },
];

const SIDECARS: [ContainerSpec; 2] = [
    ContainerSpec {
        name: "istio-proxy",
        image: "docker.io/istio/proxyv2",
        tag: "1.23.2",
        command: &[],
        args: &[
            "proxy",
            "sidecar",
            "--domain",
            "$(POD_NAMESPACE).svc.cluster.local",
            "--proxyLogLevel=warning",
            "--proxyComponentLogLevel=misc:error",
            "--log_output_level=default:info",
        ],
        port: Some(("http-envoy-prom", 15090)),
        env: 12,
        probes: 1,
        cpu: ("100m", "2"),
        memory: ("128Mi", "1Gi"),
    },
    ContainerSpec {
        name: "log-shipper",
        image: "cr.fluentbit.io/fluent/fluent-bit",
        tag: "3.1.9",
        command: &["/fluent-bit/bin/fluent-bit"],
        args: &["--config=/fluent-bit/etc/fluent-bit.conf"],
        port: Some(("http-fb", 2020)),
        env: 6,
        probes: 0,
        cpu: ("20m", "100m"),
        memory: ("32Mi", "128Mi"),
    },
];

const INIT_CONTAINERS: [ContainerSpec; 2] = [
    ContainerSpec {
        name: "init-config",
        image: "registry.example.com/shop/config-render",
        tag: "0.9.4",
        command: &["sh", "-c"],
        args: &["cp /config-src/* /etc/app/ && render --in-place /etc/app"],
        port: None,
        env: 6,
        probes: 0,
        cpu: ("10m", "100m"),
        memory: ("16Mi", "64Mi"),
    },
    ContainerSpec {
        name: "istio-init",
        image: "docker.io/istio/proxyv2",
        tag: "1.23.2",
        command: &[],
        args: &[
            "istio-iptables",
            "-p",
            "15001",
            "-z",
            "15006",
            "-u",
            "1337",
            "-m",
            "REDIRECT",
            "-i",
            "*",
            "-x",
            "",
            "-b",
            "*",
            "-d",
            "15090,15021,15020",
        ],
        port: None,
        env: 2,
        probes: 0,
        cpu: ("10m", "100m"),
        memory: ("40Mi", "128Mi"),
    },
];

/// The ReplicaSet every pod claims (one Deployment per shape: `loadgen-<hash>`).
const REPLICA_SET: &str = "loadgen-5d8f7c9b4d";
const POD_TEMPLATE_HASH: &str = "5d8f7c9b4d";
const REPLICA_SET_UID: &str = "3f2a9c1e-7b4d-4e8a-9c6f-0d1e2f3a4b5c";
/// The service-account token volume admission adds (its suffix is random on a real server).
const TOKEN_VOLUME: &str = "kube-api-access-x7k2p";
const TOKEN_MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The annotation `loadgen` rewrites on a metadata change.
pub const TOUCHED_ANNOTATION: &str = "loadgen/touched";

/// The pod of `shape` with `values`, as `k8s-openapi` holds it.
pub fn typed_pod(shape: Shape, values: &Values) -> Pod {
    serde_json::from_value(pod_value(shape, values)).expect("the profile's pod is a valid v1.Pod")
}

/// The pod of `shape` with `values`, as a JSON value (the reference's source).
fn pod_value(shape: Shape, v: &Values) -> Value {
    let time = |slot: usize| Value::String(rfc3339(v.times[slot]));
    let template_spec = template_spec(shape, v);
    let mut template_metadata = json!({
        "generateName": format!("{REPLICA_SET}-"),
        "labels": { APP_LABEL.0: APP_LABEL.1, "pod-template-hash": POD_TEMPLATE_HASH },
        "ownerReferences": [{
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": REPLICA_SET,
            "uid": REPLICA_SET_UID,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
    });
    let controller_fields = json!({
        "f:metadata": fields_of(&template_metadata, false),
        "f:spec": fields_of(&template_spec, false),
    });

    let mut annotations = Map::new();
    annotations.insert(
        "kubectl.kubernetes.io/restartedAt".into(),
        "2025-01-14T09:30:00Z".into(),
    );
    annotations.insert("prometheus.io/scrape".into(), "true".into());
    annotations.insert("prometheus.io/port".into(), "9090".into());
    annotations.insert("prometheus.io/path".into(), "/metrics".into());
    annotations.insert(TOUCHED_ANNOTATION.into(), v.str(s::TOUCHED).into());
    if shape.large() {
        for (k, val) in LARGE_ANNOTATIONS {
            annotations.insert((*k).into(), (*val).into());
        }
    }
    let mut labels = template_metadata["labels"].take();
    labels[VERSION_LABEL] = v.str(s::VERSION).into();

    let mut managed = vec![json!({
        "manager": "kube-controller-manager",
        "operation": "Update",
        "apiVersion": "v1",
        "time": time(t::CREATED),
        "fieldsType": "FieldsV1",
        "fieldsV1": controller_fields,
    })];
    let status = status(shape, v);
    if shape.scheduled {
        let mut owned = status.clone();
        // The scheduler's condition is not the kubelet's.
        owned["conditions"]
            .as_array_mut()
            .expect("conditions")
            .retain(|c| c["type"] != "PodScheduled");
        managed.push(json!({
            "manager": "kubelet",
            "operation": "Update",
            "apiVersion": "v1",
            "time": time(t::STATUS),
            "fieldsType": "FieldsV1",
            "fieldsV1": { "f:status": fields_of(&owned, false) },
            "subresource": "status",
        }));
    } else {
        managed.push(json!({
            "manager": "kube-scheduler",
            "operation": "Update",
            "apiVersion": "v1",
            "time": time(t::CREATED),
            "fieldsType": "FieldsV1",
            "fieldsV1": { "f:status": { "f:conditions": { ".": {},
                "k:{\"type\":\"PodScheduled\"}": {
                    ".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {},
                    "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {} } } } },
            "subresource": "status",
        }));
    }
    managed.push(json!({
        "manager": "loadgen",
        "operation": "Update",
        "apiVersion": "v1",
        "time": time(t::TOUCHED),
        "fieldsType": "FieldsV1",
        "fieldsV1": {
            "f:metadata": { "f:annotations": { ".": {}, format!("f:{TOUCHED_ANNOTATION}"): {} } },
            "f:spec": { "f:containers": {
                format!("k:{{\"name\":\"{}\"}}", APP_CONTAINERS[0].name): { "f:image": {} } } },
        },
    }));

    let metadata = json!({
        "name": v.str(s::NAME),
        "generateName": template_metadata["generateName"].take(),
        "namespace": v.str(s::NAMESPACE),
        "uid": v.str(s::UID),
        "resourceVersion": v.str(s::RESOURCE_VERSION),
        "generation": v.ints[i::GENERATION],
        "creationTimestamp": time(t::CREATED),
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": template_metadata["ownerReferences"].take(),
        "managedFields": managed,
    });

    // What admission adds to the template's spec, then the scheduler's node.
    let mut spec = template_spec;
    let token_mount = json!({ "name": TOKEN_VOLUME, "readOnly": true, "mountPath": TOKEN_MOUNT });
    for list in ["initContainers", "containers"] {
        if let Some(containers) = spec.get_mut(list).and_then(Value::as_array_mut) {
            for container in containers {
                container["volumeMounts"]
                    .as_array_mut()
                    .expect("mounts")
                    .push(token_mount.clone());
            }
        }
    }
    spec["volumes"]
        .as_array_mut()
        .expect("volumes")
        .push(json!({
            "name": TOKEN_VOLUME,
            "projected": {
                "sources": [
                    { "serviceAccountToken": { "expirationSeconds": 3607, "path": "token" } },
                    { "configMap": { "name": "kube-root-ca.crt",
                        "items": [{ "key": "ca.crt", "path": "ca.crt" }] } },
                    { "downwardAPI": { "items": [{ "path": "namespace",
                        "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.namespace" } }] } },
                ],
                "defaultMode": 420,
            },
        }));
    spec["serviceAccountName"] = "default".into();
    spec["serviceAccount"] = "default".into();
    spec["tolerations"] = json!([
        { "key": "node.kubernetes.io/not-ready", "operator": "Exists",
          "effect": "NoExecute", "tolerationSeconds": 300 },
        { "key": "node.kubernetes.io/unreachable", "operator": "Exists",
          "effect": "NoExecute", "tolerationSeconds": 300 },
    ]);
    spec["priority"] = 0.into();
    spec["preemptionPolicy"] = "PreemptLowerPriority".into();
    if shape.scheduled {
        spec["nodeName"] = v.str(s::NODE).into();
    }

    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
        "status": status,
    })
}

const LARGE_ANNOTATIONS: &[(&str, &str)] = &[
    (
        "sidecar.istio.io/status",
        r#"{"initContainers":["istio-init"],"containers":["istio-proxy"],"volumes":["workload-socket","credential-socket","workload-certs","istio-envoy","istio-data","istio-podinfo","istio-token","istiod-ca-cert"],"imagePullSecrets":null,"revision":"default"}"#,
    ),
    ("kubectl.kubernetes.io/default-container", "app"),
    ("kubectl.kubernetes.io/default-logs-container", "app"),
    ("istio.io/rev", "default"),
    ("prometheus.io/scheme", "http"),
    (
        "checksum/config",
        "9f2c4e1d8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e",
    ),
    (
        "checksum/secrets",
        "1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809",
    ),
    ("cluster-autoscaler.kubernetes.io/safe-to-evict", "true"),
    ("fluentbit.io/parser", "json"),
    ("vault.hashicorp.com/agent-inject", "false"),
    ("app.kubernetes.io/managed-by", "Helm"),
    ("meta.helm.sh/release-name", "checkout"),
    ("meta.helm.sh/release-namespace", "shop"),
    ("deployment.kubernetes.io/revision", "42"),
    (
        "ad.datadoghq.com/app.logs",
        r#"[{"source":"checkout","service":"checkout","log_processing_rules":[{"type":"multi_line","name":"stack","pattern":"^\\s+at "}]}]"#,
    ),
];

/// The pod template's spec, as the ReplicaSet controller sends it.
fn template_spec(shape: Shape, v: &Values) -> Value {
    let containers: Vec<Value> = shape
        .regular()
        .iter()
        .enumerate()
        .map(|(c, spec)| {
            let image = if c == 0 {
                v.str(s::IMAGE).to_owned()
            } else {
                format!("{}:{}", spec.image, spec.tag)
            };
            container(shape, spec, image, true)
        })
        .collect();
    let mut volumes = vec![json!({
        "name": "config",
        "configMap": { "name": "checkout-config", "defaultMode": 420 },
    })];
    let mut spec = json!({
        "containers": containers,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "enableServiceLinks": true,
    });
    if shape.large() {
        spec["initContainers"] = shape
            .init()
            .iter()
            .map(|spec| container(shape, spec, format!("{}:{}", spec.image, spec.tag), false))
            .collect();
        for name in ["istio-envoy", "istio-data"] {
            volumes.push(json!({ "name": name, "emptyDir": { "medium": "Memory" } }));
        }
        spec["securityContext"] = json!({ "runAsNonRoot": true, "fsGroup": 1337 });
    }
    spec["volumes"] = volumes.into();
    spec
}

/// One container of the template.
fn container(shape: Shape, spec: &ContainerSpec, image: String, probes: bool) -> Value {
    let mut env = vec![
        json!({ "name": "POD_NAME", "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.name" } } }),
        json!({ "name": "POD_NAMESPACE", "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.namespace" } } }),
        json!({ "name": "POD_IP", "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "status.podIP" } } }),
        json!({ "name": "DB_PASSWORD", "valueFrom": { "secretKeyRef": { "name": "checkout-db", "key": "password" } } }),
    ];
    let plain = [
        ("LOG_FORMAT", "json"),
        ("HTTP_ADDR", ":8080"),
        ("DB_HOST", "postgres.shop.svc.cluster.local"),
        ("DB_PORT", "5432"),
        (
            "CACHE_URL",
            "redis://redis-master.shop.svc.cluster.local:6379/0",
        ),
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "http://otel-collector.observability:4317",
        ),
        ("OTEL_SERVICE_NAME", "checkout"),
        ("GOMAXPROCS", "2"),
        ("GOMEMLIMIT", "460MiB"),
        ("FEATURE_FLAGS", "new-cart,express-checkout"),
        ("REGION", "eu-west-1"),
    ];
    for k in 0..shape.env_count(spec).saturating_sub(env.len()) {
        let (name, value) = match plain.get(k) {
            Some(&(name, value)) => (name.to_owned(), value.to_owned()),
            None => (
                format!("FEATURE_{:02}_ENABLED", k - plain.len()),
                if k % 3 == 0 { "false" } else { "true" }.to_owned(),
            ),
        };
        env.push(json!({ "name": name, "value": value }));
    }
    let mut c = json!({
        "name": spec.name,
        "image": image,
        "env": env,
        "resources": {
            "requests": { "cpu": spec.cpu.0, "memory": spec.memory.0 },
            "limits": { "cpu": spec.cpu.1, "memory": spec.memory.1 },
        },
        "volumeMounts": [{ "name": "config", "readOnly": true, "mountPath": "/etc/app" }],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
    });
    if !spec.command.is_empty() {
        c["command"] = json!(spec.command);
    }
    if !spec.args.is_empty() {
        c["args"] = json!(spec.args);
    }
    if let Some((name, port)) = spec.port {
        c["ports"] = json!([{ "name": name, "containerPort": port, "protocol": "TCP" }]);
        if probes && spec.probes == 2 {
            c["livenessProbe"] = json!({
                "httpGet": { "path": "/healthz", "port": port, "scheme": "HTTP" },
                "initialDelaySeconds": 10, "timeoutSeconds": 1, "periodSeconds": 10,
                "successThreshold": 1, "failureThreshold": 3,
            });
        }
        if probes && spec.probes >= 1 {
            c["readinessProbe"] = json!({
                "tcpSocket": { "port": port },
                "timeoutSeconds": 1, "periodSeconds": 5,
                "successThreshold": 1, "failureThreshold": 3,
            });
        }
    }
    c
}

/// The status: `Running` on its node, or `Pending` without one.
fn status(shape: Shape, v: &Values) -> Value {
    let time = |slot: usize| Value::String(rfc3339(v.times[slot]));
    let generation = v.ints[i::GENERATION];
    let condition = |kind: &str, at: usize| {
        json!({ "type": kind, "status": "True", "lastProbeTime": null,
                "lastTransitionTime": time(at), "observedGeneration": generation })
    };
    if !shape.scheduled {
        return json!({
            "phase": "Pending",
            "conditions": [{
                "type": "PodScheduled", "status": "False", "lastProbeTime": null,
                "lastTransitionTime": time(t::CREATED), "observedGeneration": generation,
                "reason": "Unschedulable",
                "message": "0/5000 nodes are available: 5000 Insufficient cpu. preemption: 0/5000 nodes are available: 5000 No preemption victims found for incoming pod.",
            }],
            "qosClass": "Burstable",
            "observedGeneration": generation,
        });
    }
    let statuses: Vec<Value> = shape
        .regular()
        .iter()
        .enumerate()
        .map(|(c, spec)| {
            let (image, image_id) = if c == 0 {
                (v.str(s::IMAGE).to_owned(), v.str(s::IMAGE_ID).to_owned())
            } else {
                static_image(spec)
            };
            json!({
                "name": spec.name,
                "state": { "running": { "startedAt": time(t::CONTAINER_STARTED + c) } },
                "lastState": {},
                "ready": true,
                "restartCount": v.ints[i::RESTARTS + c],
                "image": image,
                "imageID": image_id,
                "containerID": v.str(s::CONTAINER_ID + c),
                "started": true,
            })
        })
        .collect();
    let mut status = json!({
        "phase": "Running",
        "conditions": [
            condition("PodReadyToStartContainers", t::STARTED),
            condition("Initialized", t::INITIALIZED),
            condition("Ready", t::STATUS),
            condition("ContainersReady", t::STATUS),
            condition("PodScheduled", t::CREATED),
        ],
        "hostIP": v.str(s::HOST_IP),
        "hostIPs": [{ "ip": v.str(s::HOST_IP) }],
        "podIP": v.str(s::POD_IP),
        "podIPs": [{ "ip": v.str(s::POD_IP) }],
        "startTime": time(t::CREATED),
        "containerStatuses": statuses,
        "qosClass": "Burstable",
        "observedGeneration": generation,
    });
    if shape.large() {
        status["initContainerStatuses"] = shape
            .init()
            .iter()
            .enumerate()
            .map(|(k, spec)| {
                let (image, image_id) = static_image(spec);
                json!({
                    "name": spec.name,
                    "state": { "terminated": {
                        "exitCode": 0, "reason": "Completed",
                        "startedAt": time(t::CREATED), "finishedAt": time(t::INITIALIZED),
                        "containerID": v.str(s::INIT_CONTAINER_ID + k),
                    } },
                    "lastState": {},
                    "ready": true,
                    "restartCount": 0,
                    "image": image,
                    "imageID": image_id,
                    "containerID": v.str(s::INIT_CONTAINER_ID + k),
                    "started": false,
                })
            })
            .collect();
    }
    status
}

/// A fixed image and its digest.
fn static_image(spec: &ContainerSpec) -> (String, String) {
    let mut id = format!("{}@sha256:", spec.image);
    push_hex64(&mut id, fnv(spec.image.as_bytes()));
    (format!("{}:{}", spec.image, spec.tag), id)
}

/// `YYYY-MM-DDTHH:MM:SSZ`, as `k8s-openapi` writes a `Time`.
fn rfc3339(second: i64) -> String {
    let mut out = Vec::with_capacity(20);
    push_rfc3339(&mut out, second);
    String::from_utf8(out).expect("ASCII")
}

/// The `fieldsV1` of `value` as the API server's field manager writes it: `f:<field>` for
/// every field, `k:{…}` for the items of the lists merged by key, `.` for every object or
/// keyed list owned as a whole below the top; lists that are not merged by key (and the
/// addresses, whose key would carry the pod's own IP) are atomic, `{}`.
fn fields_of(value: &Value, nested: bool) -> Value {
    let mut out = Map::new();
    match value {
        Value::Object(map) => {
            if nested {
                out.insert(".".into(), json!({}));
            }
            for (field, v) in map {
                if v.is_null() {
                    continue;
                }
                let owned = match (field.as_str(), v) {
                    (
                        list @ ("containers" | "initContainers" | "env" | "ports" | "volumeMounts"
                        | "volumes" | "conditions" | "ownerReferences"),
                        Value::Array(items),
                    ) => keyed(list, items),
                    (_, Value::Object(m)) if m.is_empty() => json!({}),
                    // Selectors are atomic.
                    ("fieldRef" | "secretKeyRef", _) => json!({}),
                    (_, Value::Object(_)) => fields_of(v, true),
                    _ => json!({}),
                };
                out.insert(format!("f:{field}"), owned);
            }
        }
        _ => return json!({}),
    }
    Value::Object(out)
}

/// A list merged by key: `k:{"key":value}` per item.
fn keyed(list: &str, items: &[Value]) -> Value {
    let mut out = Map::new();
    if !matches!(list, "containers" | "initContainers" | "conditions") {
        out.insert(".".into(), json!({}));
    }
    for item in items {
        let key = match list {
            "ports" => {
                json!({ "containerPort": item["containerPort"], "protocol": item["protocol"] })
            }
            "volumeMounts" => json!({ "mountPath": item["mountPath"] }),
            "conditions" => json!({ "type": item["type"] }),
            "ownerReferences" => json!({ "uid": item["uid"] }),
            _ => json!({ "name": item["name"] }),
        };
        out.insert(format!("k:{key}"), fields_of(item, true));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_indexed_densely() {
        let shapes: Vec<Shape> = Shape::all().collect();
        assert_eq!(shapes.len(), Shape::COUNT);
        for (index, shape) in shapes.iter().enumerate() {
            assert_eq!(shape.index(), index, "{shape:?}");
        }
    }

    #[test]
    fn the_sentinels_are_unique_and_valid() {
        let v = Values::sentinels();
        let strs: std::collections::HashSet<&str> = (0..s::COUNT).map(|k| v.str(k)).collect();
        assert_eq!(strs.len(), s::COUNT);
        assert!(v.ints.iter().all(|&n| n <= i32::MAX as u64));
        assert!(v
            .times
            .iter()
            .all(|&t| (0..=MAX_RFC3339_SECOND).contains(&t)));
        for shape in Shape::all() {
            let _ = typed_pod(shape, &v);
        }
    }
}
