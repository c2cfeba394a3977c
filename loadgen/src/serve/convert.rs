//! A `k8s-openapi` pod as the same `k8s-pb` pod: the protobuf reference of the profiles'
//! templates ([`super::profile`] builds the `k8s-openapi` one).
//!
//! It converts the fields a served pod uses (docs/workloads.md, "Pod profiles") and refuses,
//! in a debug assertion, a pod with fields it does not know, so a profile that grows a field
//! grows it here too or its tests fail. A pod a client wrote (`serve --writes`) may carry any
//! field: [`written_pod`] converts what it knows and leaves the rest out of the protobuf form
//! (docs/wire.md, "Writes").

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as oa;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as oameta;
use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::api::resource::Quantity;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pbmeta;
use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;

/// The `k8s-pb` form of `pod`, a profile's pod: every field it has is one the conversion knows.
pub fn pod(pod: &oa::Pod) -> pb::Pod {
    debug_assert!(
        only_known_fields(pod),
        "a field the conversion does not know"
    );
    written_pod(pod)
}

/// The `k8s-pb` form of a pod a client wrote: the fields the conversion knows, the others left
/// out.
pub fn written_pod(pod: &oa::Pod) -> pb::Pod {
    pb::Pod {
        metadata: Some(object_meta(&pod.metadata)),
        spec: pod.spec.as_ref().map(spec),
        status: pod.status.as_ref().map(status),
    }
}

/// Whether `pod` has none of the fields a profile's pod never has, which the conversion leaves
/// out (a profile that grows one must grow the conversion too).
fn only_known_fields(pod: &oa::Pod) -> bool {
    let m = &pod.metadata;
    let containers = || {
        pod.spec.iter().flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
    };
    let probes = containers().flat_map(|c| [&c.liveness_probe, &c.readiness_probe]);
    let states = pod.status.iter().flat_map(|s| {
        s.container_statuses
            .iter()
            .chain(s.init_container_statuses.iter())
            .flatten()
            .flat_map(|c| [&c.state, &c.last_state])
    });
    m.finalizers.is_none()
        && m.deletion_timestamp.is_none()
        && pod
            .spec
            .iter()
            .all(|s| s.affinity.is_none() && s.node_selector.is_none() && s.host_network.is_none())
        && containers().all(|c| {
            c.lifecycle.is_none() && c.security_context.is_none() && c.startup_probe.is_none()
        })
        && probes
            .flatten()
            .all(|p| p.exec.is_none() && p.grpc.is_none())
        && states.flatten().all(|s| s.waiting.is_none())
}

fn object_meta(m: &oameta::ObjectMeta) -> pbmeta::ObjectMeta {
    pbmeta::ObjectMeta {
        name: m.name.clone(),
        generate_name: m.generate_name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        generation: m.generation,
        creation_timestamp: m.creation_timestamp.as_ref().map(time),
        labels: m.labels.clone().unwrap_or_default(),
        annotations: m.annotations.clone().unwrap_or_default(),
        owner_references: m
            .owner_references
            .iter()
            .flatten()
            .map(|o| pbmeta::OwnerReference {
                api_version: Some(o.api_version.clone()),
                kind: Some(o.kind.clone()),
                name: Some(o.name.clone()),
                uid: Some(o.uid.clone()),
                controller: o.controller,
                block_owner_deletion: o.block_owner_deletion,
            })
            .collect(),
        managed_fields: m
            .managed_fields
            .iter()
            .flatten()
            .map(|e| pbmeta::ManagedFieldsEntry {
                manager: e.manager.clone(),
                operation: e.operation.clone(),
                api_version: e.api_version.clone(),
                time: e.time.as_ref().map(time),
                fields_type: e.fields_type.clone(),
                fields_v1: e.fields_v1.as_ref().map(|f| pbmeta::FieldsV1 {
                    raw: Some(serde_json::to_vec(&f.0).expect("JSON")),
                }),
                subresource: e.subresource.clone(),
            })
            .collect(),
        ..pbmeta::ObjectMeta::default()
    }
}

/// A `Time`: seconds (the profiles' times are whole seconds).
fn time(t: &oameta::Time) -> pbmeta::Time {
    pbmeta::Time {
        seconds: Some(t.0.as_second()),
        nanos: None,
    }
}

fn spec(s: &oa::PodSpec) -> pb::PodSpec {
    pb::PodSpec {
        volumes: s.volumes.iter().flatten().map(volume).collect(),
        init_containers: s.init_containers.iter().flatten().map(container).collect(),
        containers: s.containers.iter().map(container).collect(),
        restart_policy: s.restart_policy.clone(),
        termination_grace_period_seconds: s.termination_grace_period_seconds,
        dns_policy: s.dns_policy.clone(),
        service_account_name: s.service_account_name.clone(),
        service_account: s.service_account.clone(),
        node_name: s.node_name.clone(),
        security_context: s.security_context.as_ref().map(|c| pb::PodSecurityContext {
            run_as_non_root: c.run_as_non_root,
            fs_group: c.fs_group,
            ..pb::PodSecurityContext::default()
        }),
        scheduler_name: s.scheduler_name.clone(),
        tolerations: s
            .tolerations
            .iter()
            .flatten()
            .map(|t| pb::Toleration {
                key: t.key.clone(),
                operator: t.operator.clone(),
                value: t.value.clone(),
                effect: t.effect.clone(),
                toleration_seconds: t.toleration_seconds,
            })
            .collect(),
        priority: s.priority,
        enable_service_links: s.enable_service_links,
        preemption_policy: s.preemption_policy.clone(),
        ..pb::PodSpec::default()
    }
}

fn volume(v: &oa::Volume) -> pb::Volume {
    let source = pb::VolumeSource {
        config_map: v.config_map.as_ref().map(|c| pb::ConfigMapVolumeSource {
            local_object_reference: Some(reference(&c.name)),
            items: c.items.iter().flatten().map(key_to_path).collect(),
            default_mode: c.default_mode,
            optional: c.optional,
        }),
        empty_dir: v.empty_dir.as_ref().map(|e| pb::EmptyDirVolumeSource {
            medium: e.medium.clone(),
            size_limit: e.size_limit.as_ref().map(|q| Quantity {
                string: Some(q.0.clone()),
            }),
        }),
        projected: v.projected.as_ref().map(|p| pb::ProjectedVolumeSource {
            sources: p
                .sources
                .iter()
                .flatten()
                .map(|s| pb::VolumeProjection {
                    service_account_token: s.service_account_token.as_ref().map(|t| {
                        pb::ServiceAccountTokenProjection {
                            audience: t.audience.clone(),
                            expiration_seconds: t.expiration_seconds,
                            path: Some(t.path.clone()),
                        }
                    }),
                    config_map: s.config_map.as_ref().map(|c| pb::ConfigMapProjection {
                        local_object_reference: Some(reference(&c.name)),
                        items: c.items.iter().flatten().map(key_to_path).collect(),
                        optional: c.optional,
                    }),
                    downward_api: s.downward_api.as_ref().map(|d| pb::DownwardAPIProjection {
                        items: d
                            .items
                            .iter()
                            .flatten()
                            .map(|f| pb::DownwardAPIVolumeFile {
                                path: Some(f.path.clone()),
                                field_ref: f.field_ref.as_ref().map(field_ref),
                                mode: f.mode,
                                ..pb::DownwardAPIVolumeFile::default()
                            })
                            .collect(),
                    }),
                    ..pb::VolumeProjection::default()
                })
                .collect(),
            default_mode: p.default_mode,
        }),
        ..pb::VolumeSource::default()
    };
    pb::Volume {
        name: Some(v.name.clone()),
        volume_source: Some(source),
    }
}

/// A `LocalObjectReference` (`name` is optional in `k8s-openapi`, a plain field in Go).
fn reference(name: &str) -> pb::LocalObjectReference {
    pb::LocalObjectReference {
        name: Some(name.to_owned()),
    }
}

fn key_to_path(k: &oa::KeyToPath) -> pb::KeyToPath {
    pb::KeyToPath {
        key: Some(k.key.clone()),
        path: Some(k.path.clone()),
        mode: k.mode,
    }
}

fn field_ref(f: &oa::ObjectFieldSelector) -> pb::ObjectFieldSelector {
    pb::ObjectFieldSelector {
        api_version: f.api_version.clone(),
        field_path: Some(f.field_path.clone()),
    }
}

fn container(c: &oa::Container) -> pb::Container {
    pb::Container {
        name: Some(c.name.clone()),
        image: c.image.clone(),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        ports: c
            .ports
            .iter()
            .flatten()
            .map(|p| pb::ContainerPort {
                name: p.name.clone(),
                container_port: Some(p.container_port),
                protocol: p.protocol.clone(),
                ..pb::ContainerPort::default()
            })
            .collect(),
        env: c
            .env
            .iter()
            .flatten()
            .map(|e| pb::EnvVar {
                name: Some(e.name.clone()),
                value: e.value.clone(),
                value_from: e.value_from.as_ref().map(|f| pb::EnvVarSource {
                    field_ref: f.field_ref.as_ref().map(field_ref),
                    secret_key_ref: f.secret_key_ref.as_ref().map(|s| pb::SecretKeySelector {
                        local_object_reference: Some(reference(&s.name)),
                        key: Some(s.key.clone()),
                        optional: s.optional,
                    }),
                    ..pb::EnvVarSource::default()
                }),
            })
            .collect(),
        resources: c.resources.as_ref().map(|r| pb::ResourceRequirements {
            limits: quantities(r.limits.as_ref()),
            requests: quantities(r.requests.as_ref()),
            ..pb::ResourceRequirements::default()
        }),
        volume_mounts: c
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| pb::VolumeMount {
                name: Some(m.name.clone()),
                read_only: m.read_only,
                mount_path: Some(m.mount_path.clone()),
                ..pb::VolumeMount::default()
            })
            .collect(),
        liveness_probe: c.liveness_probe.as_ref().map(probe),
        readiness_probe: c.readiness_probe.as_ref().map(probe),
        termination_message_path: c.termination_message_path.clone(),
        termination_message_policy: c.termination_message_policy.clone(),
        image_pull_policy: c.image_pull_policy.clone(),
        ..pb::Container::default()
    }
}

fn quantities(
    q: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
) -> BTreeMap<String, Quantity> {
    q.into_iter()
        .flatten()
        .map(|(k, v)| {
            (
                k.clone(),
                Quantity {
                    string: Some(v.0.clone()),
                },
            )
        })
        .collect()
}

fn probe(p: &oa::Probe) -> pb::Probe {
    pb::Probe {
        handler: Some(pb::ProbeHandler {
            http_get: p.http_get.as_ref().map(|h| pb::HttpGetAction {
                path: h.path.clone(),
                port: Some(int_or_string(&h.port)),
                host: h.host.clone(),
                scheme: h.scheme.clone(),
                http_headers: Vec::new(),
            }),
            tcp_socket: p.tcp_socket.as_ref().map(|t| pb::TcpSocketAction {
                port: Some(int_or_string(&t.port)),
                host: t.host.clone(),
            }),
            ..pb::ProbeHandler::default()
        }),
        initial_delay_seconds: p.initial_delay_seconds,
        timeout_seconds: p.timeout_seconds,
        period_seconds: p.period_seconds,
        success_threshold: p.success_threshold,
        failure_threshold: p.failure_threshold,
        termination_grace_period_seconds: p.termination_grace_period_seconds,
    }
}

/// An `IntOrString` as Go writes it: all three fields (type 0 is an int).
fn int_or_string(v: &k8s_openapi::apimachinery::pkg::util::intstr::IntOrString) -> IntOrString {
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString as Oa;
    match v {
        Oa::Int(n) => IntOrString {
            r#type: Some(0),
            int_val: Some(*n),
            str_val: Some(String::new()),
        },
        Oa::String(s) => IntOrString {
            r#type: Some(1),
            int_val: Some(0),
            str_val: Some(s.clone()),
        },
    }
}

fn status(s: &oa::PodStatus) -> pb::PodStatus {
    pb::PodStatus {
        observed_generation: s.observed_generation,
        phase: s.phase.clone(),
        conditions: s
            .conditions
            .iter()
            .flatten()
            .map(|c| pb::PodCondition {
                r#type: Some(c.type_.clone()),
                observed_generation: c.observed_generation,
                status: Some(c.status.clone()),
                last_probe_time: c.last_probe_time.as_ref().map(time),
                last_transition_time: c.last_transition_time.as_ref().map(time),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect(),
        host_ip: s.host_ip.clone(),
        host_ips: s
            .host_ips
            .iter()
            .flatten()
            .map(|ip| pb::HostIp {
                ip: Some(ip.ip.clone()),
            })
            .collect(),
        pod_ip: s.pod_ip.clone(),
        pod_ips: s
            .pod_ips
            .iter()
            .flatten()
            .map(|ip| pb::PodIp {
                ip: Some(ip.ip.clone()),
            })
            .collect(),
        start_time: s.start_time.as_ref().map(time),
        init_container_statuses: s
            .init_container_statuses
            .iter()
            .flatten()
            .map(container_status)
            .collect(),
        container_statuses: s
            .container_statuses
            .iter()
            .flatten()
            .map(container_status)
            .collect(),
        qos_class: s.qos_class.clone(),
        ..pb::PodStatus::default()
    }
}

fn container_status(c: &oa::ContainerStatus) -> pb::ContainerStatus {
    pb::ContainerStatus {
        name: Some(c.name.clone()),
        state: c.state.as_ref().map(container_state),
        last_state: c.last_state.as_ref().map(container_state),
        ready: Some(c.ready),
        restart_count: Some(c.restart_count),
        image: Some(c.image.clone()),
        image_id: Some(c.image_id.clone()),
        container_id: c.container_id.clone(),
        started: c.started,
        ..pb::ContainerStatus::default()
    }
}

fn container_state(s: &oa::ContainerState) -> pb::ContainerState {
    pb::ContainerState {
        running: s.running.as_ref().map(|r| pb::ContainerStateRunning {
            started_at: r.started_at.as_ref().map(time),
        }),
        terminated: s.terminated.as_ref().map(|t| pb::ContainerStateTerminated {
            exit_code: Some(t.exit_code),
            signal: t.signal,
            reason: t.reason.clone(),
            message: t.message.clone(),
            started_at: t.started_at.as_ref().map(time),
            finished_at: t.finished_at.as_ref().map(time),
            container_id: t.container_id.clone(),
        }),
        ..pb::ContainerState::default()
    }
}
