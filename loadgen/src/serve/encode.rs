//! A served pod written straight from its few varying fields, in JSON and in protobuf, without
//! building a typed object per event.
//!
//! Every pod of the `minimal` profile has the same shape (namespace, name, uid, resource
//! version, creation time, two labels, one container, maybe a node); only those fields vary. Building a
//! `k8s_openapi::Pod` (a dozen `String`s and a map) and serialising it cost more than the rest
//! of an event together, so the churn writes the bytes from a template instead. The templates
//! are held to the typed encoders by the tests below: the JSON is byte for byte what serde
//! writes for the `k8s_openapi` pod ([`typed_pod_json`]), the protobuf byte for byte
//! what prost writes for the `k8s-pb` pod ([`typed_pod`]). The `typical` and `large` profiles
//! render from templates compiled from typed pods ([`super::template`]); the functions here
//! choose by [`PodFields::profile`], and the same tests hold every profile to serde and prost.

use std::sync::Arc;

use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;

use super::bytes::{
    bytes_field, key, push_json_str, push_rfc3339, push_u64, string_field, varint, VARINT,
};
use super::objects::{uid, PodState, PodStateOf, APP_LABEL, VERSION_LABEL};
use super::profile::{Shape, Values};
use super::template::template;
use workloads::PodProfile;

/// The one container every served pod runs.
pub const CONTAINER_NAME: &str = "app";
/// Its image.
pub const CONTAINER_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// A pod's varying fields, owned, so an event can be encoded again later (the protobuf form is
/// made the first time a protobuf watcher or list asks for it).
pub type PodFields = PodStateOf<Arc<str>>;

impl PodFields {
    /// The borrowed form the encoders take.
    pub fn state(&self) -> PodState<'_> {
        PodState {
            namespace: &self.namespace,
            name: &self.name,
            node: self.node.as_deref(),
            id: self.id,
            incarnation: self.incarnation,
            version: self.version,
            resource_version: self.resource_version,
            created: self.created,
            profile: self.profile,
            revision: self.revision,
        }
    }
}

use super::profile::MAX_RFC3339_SECOND;

/// Whether the pod carries a creation time: the churn's are always now, so the template writes
/// the years 1970..=9999 and leaves the field out otherwise (the typed encoder would write
/// years before 1970 too; the churn never makes one).
fn has_creation_time(state: &PodState<'_>) -> bool {
    (0..=MAX_RFC3339_SECOND).contains(&state.created)
}

/// The pod as JSON (starting with [`super::objects::POD_HEAD`]), written directly.
pub fn pod_json(state: &PodState<'_>) -> Vec<u8> {
    pod_json_parts(state).0
}

/// [`pod_json`], and where its `metadata` object is in it (for metadata-only answers).
pub fn pod_json_parts(state: &PodState<'_>) -> (Vec<u8>, std::ops::Range<usize>) {
    let mut out = Vec::with_capacity(if state.profile == PodProfile::Minimal {
        320
    } else {
        8192
    });
    let metadata = write_pod_json(&mut out, state);
    (out, metadata)
}

/// Appends the pod as JSON to `out` (which may already hold what goes before it, such as an
/// event's head), and returns where its `metadata` object is in `out`.
pub fn write_pod_json(out: &mut Vec<u8>, state: &PodState<'_>) -> std::ops::Range<usize> {
    if state.profile != PodProfile::Minimal {
        let shape = Shape::of(state);
        return template(shape).write_json(out, &Values::of(state, shape));
    }
    out.extend_from_slice(br#"{"apiVersion":"v1","kind":"Pod","metadata":"#);
    let metadata_start = out.len();
    out.push(b'{');
    if has_creation_time(state) {
        out.extend_from_slice(br#""creationTimestamp":""#);
        push_rfc3339(out, state.created);
        out.extend_from_slice(b"\",");
    }
    out.extend_from_slice(br#""labels":{"app":"loadgen",""#);
    out.extend_from_slice(VERSION_LABEL.as_bytes());
    out.extend_from_slice(br#"":""#);
    push_u64(out, state.version);
    out.extend_from_slice(br#""},"name":"#);
    push_json_str(out, state.name);
    out.extend_from_slice(br#","namespace":"#);
    push_json_str(out, state.namespace);
    out.extend_from_slice(br#","resourceVersion":""#);
    push_u64(out, state.resource_version);
    out.extend_from_slice(br#"","uid":""#);
    out.extend_from_slice(uid(state).as_bytes());
    out.extend_from_slice(b"\"}");
    let metadata = metadata_start..out.len();
    out.extend_from_slice(br#","spec":{"containers":[{"image":""#);
    out.extend_from_slice(CONTAINER_IMAGE.as_bytes());
    out.extend_from_slice(br#"","name":""#);
    out.extend_from_slice(CONTAINER_NAME.as_bytes());
    out.extend_from_slice(b"\"}]");
    if let Some(node) = state.node {
        out.extend_from_slice(br#","nodeName":"#);
        push_json_str(out, node);
    }
    out.extend_from_slice(b"}}");
    metadata
}

/// The bare `v1.Pod` protobuf message (no envelope), written directly.
pub fn pod_protobuf(state: &PodState<'_>) -> Vec<u8> {
    if state.profile != PodProfile::Minimal {
        let shape = Shape::of(state);
        return template(shape).protobuf(&Values::of(state, shape));
    }
    let mut metadata = Vec::with_capacity(160);
    string_field(&mut metadata, 1, state.name);
    string_field(&mut metadata, 3, state.namespace);
    string_field(&mut metadata, 5, &uid(state));
    let mut number = Vec::with_capacity(20);
    push_u64(&mut number, state.resource_version);
    bytes_field(&mut metadata, 6, &number);
    if has_creation_time(state) {
        // Time{seconds}: field 1, varint (an int64's two's complement, as prost writes it).
        let mut time = Vec::with_capacity(11);
        key(&mut time, 1, VARINT);
        varint(&mut time, state.created as u64);
        bytes_field(&mut metadata, 8, &time);
    }
    // Labels: map entries in key order (prost's BTreeMap), each {1: key, 2: value}.
    number.clear();
    push_u64(&mut number, state.version);
    for (k, v) in [
        (APP_LABEL.0, APP_LABEL.1.as_bytes()),
        (VERSION_LABEL, &number),
    ] {
        let mut entry = Vec::with_capacity(k.len() + v.len() + 4);
        string_field(&mut entry, 1, k);
        bytes_field(&mut entry, 2, v);
        bytes_field(&mut metadata, 11, &entry);
    }

    let mut container = Vec::with_capacity(48);
    string_field(&mut container, 1, CONTAINER_NAME);
    string_field(&mut container, 2, CONTAINER_IMAGE);
    let mut spec = Vec::with_capacity(80);
    bytes_field(&mut spec, 2, &container);
    if let Some(node) = state.node {
        string_field(&mut spec, 10, node);
    }

    let mut pod = Vec::with_capacity(metadata.len() + spec.len() + 8);
    bytes_field(&mut pod, 1, &metadata);
    bytes_field(&mut pod, 2, &spec);
    pod
}

/// The `k8s-pb` pod for `state`: what the protobuf template must equal when prost encodes it,
/// and what a client decodes the template into.
pub fn typed_pod(state: &PodState<'_>) -> core::Pod {
    if state.profile != PodProfile::Minimal {
        let shape = Shape::of(state);
        let pod = super::profile::typed_pod(shape, &Values::of(state, shape));
        return super::convert::pod(&pod);
    }
    core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: Some(state.name.to_owned()),
            namespace: Some(state.namespace.to_owned()),
            uid: Some(uid(state)),
            resource_version: Some(state.resource_version.to_string()),
            creation_timestamp: has_creation_time(state).then_some(meta::Time {
                seconds: Some(state.created),
                nanos: None,
            }),
            labels: [
                (APP_LABEL.0.to_owned(), APP_LABEL.1.to_owned()),
                (VERSION_LABEL.to_owned(), state.version.to_string()),
            ]
            .into_iter()
            .collect(),
            ..meta::ObjectMeta::default()
        }),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: Some(CONTAINER_NAME.to_owned()),
                image: Some(CONTAINER_IMAGE.to_owned()),
                ..core::Container::default()
            }],
            node_name: state.node.map(str::to_owned),
            ..core::PodSpec::default()
        }),
        status: None,
    }
}

/// The `v1.Pod` for `state` built as a `k8s_openapi` object and serialised by serde (starting
/// with [`POD_HEAD`](super::objects::POD_HEAD)): the reference the template [`pod_json`] is tested against.
pub fn typed_pod_json(state: &PodState<'_>) -> Vec<u8> {
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    if state.profile != PodProfile::Minimal {
        use super::profile::typed_pod;
        let shape = Shape::of(state);
        return serde_json::to_vec(&typed_pod(shape, &Values::of(state, shape)))
            .expect("a Pod always serialises");
    }
    let pod = Pod {
        metadata: ObjectMeta {
            namespace: Some(state.namespace.to_string()),
            name: Some(state.name.to_string()),
            uid: Some(uid(state)),
            resource_version: Some(state.resource_version.to_string()),
            creation_timestamp: k8s_openapi::jiff::Timestamp::from_second(state.created)
                .ok()
                .map(Time),
            labels: Some(
                [
                    ("app".to_string(), "loadgen".to_string()),
                    (VERSION_LABEL.to_string(), state.version.to_string()),
                ]
                .into_iter()
                .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: state.node.map(str::to_string),
            containers: vec![Container {
                name: "app".to_string(),
                image: Some("registry.k8s.io/pause:3.10".to_string()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    };
    let json = serde_json::to_vec(&pod).expect("a Pod always serialises");
    debug_assert!(
        json.starts_with(super::objects::POD_HEAD),
        "k8s-openapi writes apiVersion and kind first"
    );
    json
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::bytes::{varint, varint_len};
    use crate::serve::objects::Revision;
    use proptest::prelude::*;
    use prost::Message;

    fn state<'a>(
        namespace: &'a str,
        name: &'a str,
        node: Option<&'a str>,
        numbers: (u32, u32, u64, u64, i64),
    ) -> PodState<'a> {
        let (id, incarnation, version, resource_version, created) = numbers;
        PodState {
            namespace,
            name,
            node,
            id,
            incarnation,
            version,
            resource_version,
            created,
            profile: PodProfile::Minimal,
            revision: Revision::default(),
        }
    }

    fn revision() -> impl Strategy<Value = Revision> {
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
        )
            .prop_map(
                |(restarts, spec, touched, status_at, touched_at)| Revision {
                    restarts,
                    spec,
                    touched,
                    status_at,
                    touched_at,
                },
            )
    }

    fn profile() -> impl Strategy<Value = PodProfile> {
        prop_oneof![
            Just(PodProfile::Minimal),
            Just(PodProfile::Typical),
            Just(PodProfile::Large)
        ]
    }

    proptest! {
        // Every profile and shape (the id picks the container count, the node whether it is
        // scheduled): the template writes what serde and prost write for the typed pod.
        #[test]
        fn the_templates_write_what_the_typed_encoders_write(
            namespace in "[a-z0-9-]{1,20}|.{0,8}",
            name in "[a-z0-9.-]{1,40}|.{0,8}",
            node in proptest::option::of("[a-z0-9-]{1,20}|.{0,6}"),
            id: u32,
            incarnation: u32,
            version: u64,
            resource_version: u64,
            created in prop_oneof![0i64..=4_102_444_800, 0i64..=MAX_RFC3339_SECOND],
            profile in profile(),
            revision in revision(),
        ) {
            let mut s = state(&namespace, &name, node.as_deref(),
                (id, incarnation, version, resource_version, created));
            s.profile = profile;
            s.revision = revision;
            let typed = typed_pod_json(&s);
            let template = pod_json(&s);
            prop_assert_eq!(
                String::from_utf8_lossy(&template), String::from_utf8_lossy(&typed));
            prop_assert_eq!(pod_protobuf(&s), typed_pod(&s).encode_to_vec());
            let (json, metadata) = pod_json_parts(&s);
            let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
            let slice: serde_json::Value = serde_json::from_slice(&json[metadata]).unwrap();
            prop_assert_eq!(&value["metadata"], &slice);
        }
    }

    #[test]
    fn the_protobuf_pod_decodes_to_the_served_fields() {
        let s = state(
            "ns-1",
            "pod-7",
            Some("node-2"),
            (7, 3, 12, 345, 1_700_000_000),
        );
        let pod = core::Pod::decode(&pod_protobuf(&s)[..]).unwrap();
        let metadata = pod.metadata.unwrap();
        assert_eq!(metadata.name.as_deref(), Some("pod-7"));
        assert_eq!(metadata.namespace.as_deref(), Some("ns-1"));
        assert_eq!(metadata.resource_version.as_deref(), Some("345"));
        assert_eq!(
            metadata.uid.as_deref(),
            Some("00000003-0000-4000-8000-000000000007")
        );
        assert_eq!(metadata.labels[VERSION_LABEL], "12");
        assert_eq!(
            metadata.creation_timestamp.unwrap().seconds,
            Some(1_700_000_000)
        );
        assert_eq!(pod.spec.unwrap().node_name.as_deref(), Some("node-2"));
    }

    /// A pod of `profile` as the churn makes one after a few changes.
    fn churned(profile: PodProfile, id: u32) -> PodState<'static> {
        PodState {
            namespace: "ns-123",
            name: "pod-45678",
            node: Some("node-4567"),
            id,
            incarnation: 1,
            version: 17,
            resource_version: 12_345_678,
            created: 1_760_000_000,
            profile,
            revision: Revision {
                restarts: 3,
                spec: 1,
                touched: 2,
                status_at: 3600,
                touched_at: 1800,
            },
        }
    }

    /// The sizes docs/workloads.md states ("Pod profiles"), per profile and application
    /// container count: JSON bytes, protobuf bytes (bare `v1.Pod`), within these ranges.
    #[test]
    fn pods_are_the_sizes_the_docs_state() {
        let expected = |profile, containers| match (profile, containers) {
            (PodProfile::Minimal, _) => (300..=400, 140..=200),
            (PodProfile::Typical, 1) => (7_000..=8_500, 4_500..=5_500),
            (PodProfile::Typical, 2) => (9_500..=11_000, 6_500..=7_500),
            (PodProfile::Typical, _) => (12_000..=13_500, 8_000..=9_500),
            (PodProfile::Large, 1) => (22_000..=26_000, 16_000..=19_000),
            (PodProfile::Large, 2) => (28_000..=32_000, 21_000..=24_000),
            (PodProfile::Large, _) => (34_000..=38_000, 26_000..=29_000),
        };
        for profile in PodProfile::ALL {
            let mut seen = std::collections::BTreeSet::new();
            for id in 0..64 {
                let s = churned(profile, id);
                let containers = match profile {
                    PodProfile::Minimal => 1,
                    _ => Shape::of(&s).containers,
                };
                if !seen.insert(containers) {
                    continue;
                }
                let (json, protobuf) = (pod_json(&s).len(), pod_protobuf(&s).len());
                let (json_range, protobuf_range) = expected(profile, containers);
                assert!(
                    json_range.contains(&json) && protobuf_range.contains(&protobuf),
                    "{profile} with {containers} containers: {json} bytes of JSON, \
                     {protobuf} of protobuf"
                );
            }
            let shapes = if profile == PodProfile::Minimal { 1 } else { 3 };
            assert_eq!(seen.len(), shapes, "{profile}: every container count seen");
        }
    }

    #[test]
    fn the_protobuf_pod_carries_what_the_json_pod_does() {
        for profile in [PodProfile::Typical, PodProfile::Large] {
            for id in 0..8 {
                let s = churned(profile, id);
                let json: serde_json::Value = serde_json::from_slice(&pod_json(&s)).unwrap();
                let pod = core::Pod::decode(&pod_protobuf(&s)[..]).unwrap();
                let (metadata, spec, status) = (
                    pod.metadata.unwrap(),
                    pod.spec.unwrap(),
                    pod.status.unwrap(),
                );
                let count = |v: &serde_json::Value| v.as_array().map_or(0, Vec::len);
                assert_eq!(metadata.labels[VERSION_LABEL], "17");
                assert_eq!(
                    metadata.annotations.len(),
                    json["metadata"]["annotations"].as_object().unwrap().len()
                );
                assert_eq!(
                    metadata.managed_fields.len(),
                    count(&json["metadata"]["managedFields"])
                );
                assert_eq!(
                    metadata.owner_references[0].kind.as_deref(),
                    Some("ReplicaSet")
                );
                assert_eq!(metadata.generation, Some(2));
                assert_eq!(spec.containers.len(), count(&json["spec"]["containers"]));
                assert_eq!(
                    spec.init_containers.len(),
                    count(&json["spec"]["initContainers"])
                );
                for (c, container) in spec.containers.iter().enumerate() {
                    let j = &json["spec"]["containers"][c];
                    assert_eq!(container.env.len(), count(&j["env"]));
                    assert_eq!(container.volume_mounts.len(), count(&j["volumeMounts"]));
                    assert_eq!(
                        container.liveness_probe.is_some(),
                        !j["livenessProbe"].is_null()
                    );
                    assert_eq!(
                        container.readiness_probe.is_some(),
                        !j["readinessProbe"].is_null()
                    );
                    assert_eq!(container.resources.as_ref().unwrap().limits.len(), 2);
                }
                assert_eq!(spec.volumes.len(), count(&json["spec"]["volumes"]));
                assert_eq!(spec.tolerations.len(), 2);
                assert_eq!(spec.node_name.as_deref(), Some("node-4567"));
                assert_eq!(status.phase.as_deref(), Some("Running"));
                assert_eq!(status.conditions.len(), 5);
                assert_eq!(status.container_statuses.len(), spec.containers.len());
                let restarts: i32 = status
                    .container_statuses
                    .iter()
                    .map(|c| c.restart_count.unwrap())
                    .sum();
                assert_eq!(restarts, 3, "the restarts, spread over the containers");
                assert_eq!(status.qos_class.as_deref(), Some("Burstable"));
            }
        }
    }

    /// What a pod costs to write per event, per profile and format, as the store writes it
    /// (the event line; the protobuf frame). Prints, asserts nothing about time:
    /// `cargo test --release -p loadgen --features wire --lib render_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement; run in release"]
    fn render_cost() {
        use crate::serve::objects::{event_line, EventType};
        use crate::serve::protobuf::ProtobufPod;
        const EVENTS: u32 = 200_000;
        for profile in PodProfile::ALL {
            let state = |n: u32| {
                let mut s = churned(profile, n % 100_000);
                s.resource_version = u64::from(n);
                s.revision.restarts = n % 7;
                s
            };
            let start = std::time::Instant::now();
            let mut bytes = 0;
            for n in 0..EVENTS {
                let s = state(n);
                let (line, _, _) = event_line(EventType::Modified, |out| write_pod_json(out, &s));
                bytes += line.len();
            }
            let json = start.elapsed().as_secs_f64() * 1e6 / f64::from(EVENTS);
            let start = std::time::Instant::now();
            for n in 0..EVENTS {
                let pod = ProtobufPod::new("MODIFIED", &pod_protobuf(&state(n)));
                bytes += pod.frame().len();
            }
            let protobuf = start.elapsed().as_secs_f64() * 1e6 / f64::from(EVENTS);
            eprintln!(
                "{profile}: JSON {json:.2} µs, protobuf {protobuf:.2} µs per event ({bytes} bytes)"
            );
        }
    }

    #[test]
    fn varint_lengths() {
        for n in [0, 1, 127, 128, 16_383, 16_384, u64::MAX >> 1, u64::MAX] {
            let mut out = Vec::new();
            varint(&mut out, n);
            assert_eq!(out.len(), varint_len(n), "{n}");
        }
    }
}
