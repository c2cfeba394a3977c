//! The compact object (`kcache::informer::wire::compact`) against the full decoders: for random
//! pods, in protobuf and in JSON, what it decodes once equals the typed object's metadata, a
//! decode on demand gives exactly what the full decoder gives (less `managedFields` when
//! stripped), and no input, however corrupt, makes it panic.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as openapi;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as openapi_meta;
use k8s_pb::api::core::v1 as pb;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as pb_meta;
use kcache::informer::wire::codec::{watch_frame as frame, wrap_object as envelope};
use kcache::informer::wire::{compact_key, pod_fields, Codec, CompactCodec, CompactObject, Format};
use kcache::informer::{SetResourceVersion, Versioned, WatchEvent};
use proptest::prelude::*;
use prost::Message;

/// A container: name, image, environment.
type ContainerShape = (String, String, Vec<(String, String)>);
/// An owner reference: API version, kind, name, uid, controller.
type OwnerShape = (String, String, String, String, Option<bool>);

/// What the random pods are made of, in both type families.
#[derive(Debug, Clone)]
struct Shape {
    namespace: String,
    name: String,
    uid: String,
    resource_version: String,
    generation: Option<i64>,
    deletion: Option<i64>,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
    owners: Vec<OwnerShape>,
    managers: Vec<(String, String)>,
    node: Option<String>,
    phase: Option<String>,
    containers: Vec<ContainerShape>,
}

fn text() -> impl Strategy<Value = String> {
    // Mostly names; sometimes what JSON must escape, and non-ASCII.
    prop_oneof![
        6 => "[a-z0-9][a-z0-9.-]{0,20}",
        1 => "[ -~]{0,12}",
        1 => "\\PC{0,6}",
    ]
}

fn shape() -> impl Strategy<Value = Shape> {
    let meta = (
        text(),
        "[a-z0-9][a-z0-9-]{0,20}",
        "[0-9a-f-]{0,36}",
        "[0-9]{1,12}",
        proptest::option::of(0i64..1_000),
        proptest::option::of(0i64..4_000_000_000),
        proptest::collection::btree_map(text(), text(), 0..6),
        proptest::collection::btree_map(text(), text(), 0..4),
    );
    let rest = (
        proptest::collection::vec(
            (
                text(),
                text(),
                text(),
                text(),
                proptest::option::of(any::<bool>()),
            ),
            0..3,
        ),
        proptest::collection::vec((text(), "[{}\":a-z,.]{0,40}"), 0..4),
        proptest::option::of(text()),
        proptest::option::of("Pending|Running|Succeeded|Failed"),
        proptest::collection::vec(
            (
                text(),
                text(),
                proptest::collection::vec((text(), text()), 0..6),
            ),
            0..4,
        ),
    );
    (meta, rest).prop_map(
        |(
            (namespace, name, uid, resource_version, generation, deletion, labels, annotations),
            (owners, managers, node, phase, containers),
        )| Shape {
            namespace,
            name,
            uid,
            resource_version,
            generation,
            deletion,
            labels,
            annotations,
            owners,
            managers,
            node,
            phase,
            containers,
        },
    )
}

fn pb_pod(s: &Shape) -> pb::Pod {
    pb::Pod {
        metadata: Some(pb_meta::ObjectMeta {
            name: Some(s.name.clone()),
            namespace: Some(s.namespace.clone()),
            uid: Some(s.uid.clone()),
            resource_version: Some(s.resource_version.clone()),
            generation: s.generation,
            creation_timestamp: Some(pb_meta::Time {
                seconds: Some(1_700_000_000),
                nanos: None,
            }),
            deletion_timestamp: s.deletion.map(|seconds| pb_meta::Time {
                seconds: Some(seconds),
                nanos: None,
            }),
            labels: s.labels.clone(),
            annotations: s.annotations.clone(),
            owner_references: s
                .owners
                .iter()
                .map(
                    |(api_version, kind, name, uid, controller)| pb_meta::OwnerReference {
                        api_version: Some(api_version.clone()),
                        kind: Some(kind.clone()),
                        name: Some(name.clone()),
                        uid: Some(uid.clone()),
                        controller: *controller,
                        block_owner_deletion: Some(true),
                    },
                )
                .collect(),
            managed_fields: s
                .managers
                .iter()
                .map(|(manager, fields)| pb_meta::ManagedFieldsEntry {
                    manager: Some(manager.clone()),
                    operation: Some("Update".into()),
                    api_version: Some("v1".into()),
                    fields_type: Some("FieldsV1".into()),
                    fields_v1: Some(pb_meta::FieldsV1 {
                        raw: Some(fields.clone().into_bytes()),
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        spec: Some(pb::PodSpec {
            node_name: s.node.clone(),
            containers: s
                .containers
                .iter()
                .map(|(name, image, env)| pb::Container {
                    name: Some(name.clone()),
                    image: Some(image.clone()),
                    env: env
                        .iter()
                        .map(|(n, v)| pb::EnvVar {
                            name: Some(n.clone()),
                            value: Some(v.clone()),
                            value_from: None,
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        status: s.phase.as_ref().map(|phase| pb::PodStatus {
            phase: Some(phase.clone()),
            ..Default::default()
        }),
    }
}

fn time(seconds: i64) -> openapi_meta::Time {
    openapi_meta::Time(k8s_openapi::jiff::Timestamp::from_second(seconds).unwrap())
}

fn openapi_pod(s: &Shape) -> openapi::Pod {
    let map = |m: &BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone());
    openapi::Pod {
        metadata: openapi_meta::ObjectMeta {
            name: Some(s.name.clone()),
            namespace: Some(s.namespace.clone()),
            uid: Some(s.uid.clone()),
            resource_version: Some(s.resource_version.clone()),
            generation: s.generation,
            creation_timestamp: Some(time(1_700_000_000)),
            deletion_timestamp: s.deletion.map(time),
            labels: map(&s.labels),
            annotations: map(&s.annotations),
            owner_references: (!s.owners.is_empty()).then(|| {
                s.owners
                    .iter()
                    .map(|(api_version, kind, name, uid, controller)| {
                        openapi_meta::OwnerReference {
                            api_version: api_version.clone(),
                            kind: kind.clone(),
                            name: name.clone(),
                            uid: uid.clone(),
                            controller: *controller,
                            block_owner_deletion: Some(true),
                        }
                    })
                    .collect()
            }),
            managed_fields: (!s.managers.is_empty()).then(|| {
                s.managers
                    .iter()
                    .map(|(manager, _)| openapi_meta::ManagedFieldsEntry {
                        manager: Some(manager.clone()),
                        operation: Some("Update".into()),
                        api_version: Some("v1".into()),
                        fields_type: Some("FieldsV1".into()),
                        time: Some(time(1_700_000_000)),
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        },
        spec: Some(openapi::PodSpec {
            node_name: s.node.clone(),
            containers: s
                .containers
                .iter()
                .map(|(name, image, env)| openapi::Container {
                    name: name.clone(),
                    image: Some(image.clone()),
                    env: (!env.is_empty()).then(|| {
                        env.iter()
                            .map(|(n, v)| openapi::EnvVar {
                                name: n.clone(),
                                value: Some(v.clone()),
                                value_from: None,
                            })
                            .collect()
                    }),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }),
        status: s.phase.as_ref().map(|phase| openapi::PodStatus {
            phase: Some(phase.clone()),
            ..Default::default()
        }),
    }
}

fn codec(json: bool, keep: bool) -> CompactCodec {
    let codec = if json {
        CompactCodec::json_only("", "v1", "pods")
    } else {
        CompactCodec::protobuf::<pb::Pod>()
    };
    codec
        .keep_managed_fields(keep)
        .index_field(pod_fields::node_name())
        .index_field(pod_fields::phase())
}

/// The metadata the compact object read equals the shape's.
fn check_metadata(
    object: &CompactObject,
    s: &Shape,
    codec: &CompactCodec,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(object.namespace(), s.namespace.as_str());
    prop_assert_eq!(object.name(), s.name.as_str());
    prop_assert_eq!(object.uid(), s.uid.as_str());
    prop_assert_eq!(object.resource_version(), s.resource_version.as_str());
    prop_assert_eq!(object.generation(), s.generation.unwrap_or(0));
    prop_assert_eq!(object.deletion_timestamp(), s.deletion);
    let labels: BTreeMap<String, String> = object
        .labels()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    prop_assert_eq!(&labels, &s.labels);
    let annotations: BTreeMap<String, String> = object
        .annotations()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    prop_assert_eq!(&annotations, &s.annotations);
    for (key, value) in &s.labels {
        prop_assert_eq!(object.label(key), Some(value.as_str()));
    }
    let owners: Vec<_> = object
        .owner_references()
        .map(|o| {
            (
                o.api_version.to_owned(),
                o.kind.to_owned(),
                o.name.to_owned(),
                o.uid.to_owned(),
                o.controller,
            )
        })
        .collect();
    let expected: Vec<_> = s
        .owners
        .iter()
        .map(|(a, k, n, u, c)| {
            (
                a.clone(),
                k.clone(),
                n.clone(),
                u.clone(),
                c.unwrap_or(false),
            )
        })
        .collect();
    prop_assert_eq!(owners, expected);
    let node = codec.field_id("spec.nodeName").unwrap();
    let phase = codec.field_id("status.phase").unwrap();
    prop_assert_eq!(object.field(node), s.node.as_deref());
    prop_assert_eq!(object.field(phase), s.phase.as_deref());
    if !s.name.is_empty() {
        let key = compact_key(object).unwrap();
        let expected = if s.namespace.is_empty() {
            s.name.clone()
        } else {
            format!("{}/{}", s.namespace, s.name)
        };
        prop_assert_eq!(key.as_str(), expected.as_str());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn protobuf_decodes_once_and_on_demand_as_the_full_decoder(s in shape(), keep: bool) {
        let typed = pb_pod(&s);
        let codec = codec(false, keep);
        let event = codec
            .event(Format::Protobuf, &frame("MODIFIED", envelope("Pod", typed.encode_to_vec())))
            .unwrap();
        let WatchEvent::Modified(object) = event else { panic!("{event:?}") };
        prop_assert_eq!(object.format(), Format::Protobuf);
        check_metadata(&object, &s, &codec)?;
        let mut expected = typed.clone();
        if !keep {
            expected.metadata.as_mut().unwrap().managed_fields.clear();
        }
        let on_demand: pb::Pod = object.decode_protobuf().unwrap();
        prop_assert_eq!(&on_demand, &expected);
        // Stripped bytes are exactly the message prost writes without managedFields.
        prop_assert_eq!(object.bytes(), &expected.encode_to_vec()[..]);
        prop_assert!(object.decode_json::<openapi::Pod>().is_err());
    }

    #[test]
    fn json_decodes_once_and_on_demand_as_the_full_decoder(s in shape(), keep: bool) {
        let typed = openapi_pod(&s);
        let codec = codec(true, keep);
        let line = serde_json::to_vec(&serde_json::json!({"type": "ADDED", "object": &typed})).unwrap();
        let event = codec.event(Format::Json, &line).unwrap();
        let WatchEvent::Added(object) = event else { panic!("{event:?}") };
        prop_assert_eq!(object.format(), Format::Json);
        check_metadata(&object, &s, &codec)?;
        let mut expected = typed.clone();
        if !keep {
            expected.metadata.managed_fields = None;
        }
        let on_demand: openapi::Pod = object.decode_json().unwrap();
        prop_assert_eq!(&on_demand, &expected);
        prop_assert!(object.decode_protobuf::<pb::Pod>().is_err());
        // The object before its type decodes the same.
        let reversed = format!(
            r#"{{"object":{},"type":"ADDED"}}"#,
            serde_json::to_string(&typed).unwrap()
        );
        let WatchEvent::Added(again) = codec.event(Format::Json, reversed.as_bytes()).unwrap() else {
            panic!("not an add")
        };
        prop_assert_eq!(&*again, &*object);
    }

    #[test]
    fn lists_in_either_format_give_every_item(shapes in proptest::collection::vec(shape(), 0..5)) {
        let json_codec = codec(true, false);
        let list = serde_json::json!({
            "kind": "PodList", "apiVersion": "v1",
            "metadata": {"resourceVersion": "77", "continue": "c"},
            "items": shapes.iter().map(openapi_pod).collect::<Vec<_>>(),
        });
        let page = json_codec.list(Format::Json, &serde_json::to_vec(&list).unwrap()).unwrap();
        prop_assert_eq!(page.resource_version.as_str(), "77");
        prop_assert_eq!(page.continue_token.as_deref(), Some("c"));
        prop_assert_eq!(page.items.len(), shapes.len());
        for (object, s) in page.items.iter().zip(&shapes) {
            check_metadata(object, s, &json_codec)?;
        }

        let pb_codec = codec(false, false);
        let list = pb::PodList {
            metadata: Some(pb_meta::ListMeta {
                resource_version: Some("78".into()),
                ..Default::default()
            }),
            items: shapes.iter().map(pb_pod).collect(),
        };
        let page = pb_codec
            .list(Format::Protobuf, &envelope("PodList", list.encode_to_vec()))
            .unwrap();
        prop_assert_eq!(page.resource_version.as_str(), "78");
        prop_assert_eq!(page.items.len(), shapes.len());
        for (object, s) in page.items.iter().zip(&shapes) {
            check_metadata(object, s, &pb_codec)?;
        }
    }

    #[test]
    fn setting_the_resource_version_writes_the_object_again(s in shape(), json: bool, rv in "[0-9]{1,9}") {
        let codec = codec(json, false);
        let mut object = if json {
            codec.object(Format::Json, &serde_json::to_vec(&openapi_pod(&s)).unwrap()).unwrap()
        } else {
            codec.object(Format::Protobuf, &pb_pod(&s).encode_to_vec()).unwrap()
        };
        object.set_resource_version(&rv);
        let mut expected = s.clone();
        expected.resource_version = rv.clone();
        check_metadata(&object, &expected, &codec)?;
        if json {
            let pod: openapi::Pod = object.decode_json().unwrap();
            prop_assert_eq!(pod.metadata.resource_version.as_deref(), Some(rv.as_str()));
        } else {
            let pod: pb::Pod = object.decode_protobuf().unwrap();
            let metadata = pod.metadata.unwrap();
            prop_assert_eq!(metadata.resource_version.as_deref(), Some(rv.as_str()));
        }
    }

    #[test]
    fn corrupt_input_is_an_error_never_a_panic(
        s in shape(),
        cut in any::<proptest::sample::Index>(),
        flip in any::<proptest::sample::Index>(),
        byte: u8,
        noise in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let pb_codec = codec(false, false);
        let json_codec = codec(true, false);
        let valid = frame("ADDED", envelope("Pod", pb_pod(&s).encode_to_vec()));
        let line = serde_json::to_vec(&serde_json::json!({"type": "ADDED", "object": openapi_pod(&s)})).unwrap();
        for bytes in [&valid, &line] {
            let truncated = &bytes[..cut.index(bytes.len())];
            let mut flipped = bytes.to_vec();
            let at = flip.index(flipped.len());
            flipped[at] = byte;
            for input in [truncated, &flipped[..], &noise[..]] {
                for format in [Format::Protobuf, Format::Json] {
                    let _ = pb_codec.event(format, input);
                    let _ = json_codec.event(format, input);
                    let _ = pb_codec.list(format, input);
                    let _ = json_codec.list(format, input);
                    let _ = pb_codec.object(format, input);
                }
            }
        }
        // A frame cut short is an error, in both formats.
        prop_assert!(pb_codec.event(Format::Protobuf, &valid[..valid.len() - 1]).is_err());
        prop_assert!(json_codec.event(Format::Json, &line[..line.len() - 1]).is_err());
    }
}

#[test]
fn bookmarks_and_errors_in_either_format() {
    let codec = codec(true, false);
    let bookmark = br#"{"type":"BOOKMARK","object":{"kind":"Pod","apiVersion":"v1","metadata":{"resourceVersion":"12"}}}"#;
    assert!(matches!(
        codec.event(Format::Json, bookmark).unwrap(),
        WatchEvent::Bookmark { resource_version } if resource_version == "12"
    ));
    let error = br#"{"type":"ERROR","object":{"kind":"Status","code":410,"reason":"Expired","message":"too old"}}"#;
    assert!(matches!(
        codec.event(Format::Json, error).unwrap(),
        WatchEvent::Error(s) if s.code == 410 && s.reason == "Expired"
    ));
    let unknown = br#"{"type":"SOMETHING","object":{"metadata":{}}}"#;
    assert!(codec.event(Format::Json, unknown).is_err());

    let codec = CompactCodec::protobuf::<pb::Pod>();
    let bookmark_pod = pb::Pod {
        metadata: Some(pb_meta::ObjectMeta {
            resource_version: Some("13".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let event = codec
        .event(
            Format::Protobuf,
            &frame("BOOKMARK", envelope("Pod", bookmark_pod.encode_to_vec())),
        )
        .unwrap();
    assert!(matches!(event, WatchEvent::Bookmark { resource_version } if resource_version == "13"));
    let status = pb_meta::Status {
        code: Some(410),
        reason: Some("Expired".into()),
        ..Default::default()
    };
    let event = codec
        .event(
            Format::Protobuf,
            &frame("ERROR", envelope("Status", status.encode_to_vec())),
        )
        .unwrap();
    assert!(matches!(event, WatchEvent::Error(s) if s.code == 410));
}

#[test]
fn an_object_without_metadata_or_with_a_wrongly_typed_name_is_an_error() {
    let codec = CompactCodec::protobuf::<pb::Pod>();
    let err = codec.object(Format::Protobuf, &[0x12, 0]).unwrap_err();
    assert!(err.to_string().contains("without metadata"), "{err}");
    // metadata { name: varint 1 }
    let err = codec
        .object(Format::Protobuf, &[0x0a, 2, 0x08, 1])
        .unwrap_err();
    assert!(err.to_string().contains("wrong wire type"), "{err}");
    let json = CompactCodec::json_only("", "v1", "pods");
    let err = json
        .object(Format::Json, br#"{"metadata":{"name":7}}"#)
        .unwrap_err();
    assert!(err.to_string().contains("not a string"), "{err}");
}

/// Compact objects through the whole pipeline: the in-memory server, a shared informer with
/// indexes on the namespace, a label and a declared field, a handler, and a controller whose
/// reconcile reads the cached object's metadata and decodes the rest on demand.
#[test]
fn informers_indexes_and_controllers_work_with_compact_objects() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use kcache::controller::{Action, Controller, Request};
    use kcache::informer::wire::{
        compact_key_fn, index_by_field, index_by_label, index_by_namespace,
    };
    use kcache::informer::SharedInformer;
    use kcache::EventHandler;
    use kcache_sim::MemoryListerWatcher;

    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let codec = codec(false, false);
        let node = codec.field_id("spec.nodeName").unwrap();
        let server = MemoryListerWatcher::new(compact_key_fn());
        let pod = |name: &str, node: &str, app: &str| {
            let mut s = shape_of(name, node);
            s.labels.insert("app".into(), app.into());
            codec
                .object(Format::Protobuf, &pb_pod(&s).encode_to_vec())
                .unwrap()
        };
        server.upsert(pod("a", "node-1", "web")).unwrap();
        server.upsert(pod("b", "node-1", "db")).unwrap();
        server.upsert(pod("c", "node-2", "web")).unwrap();

        struct Count(Arc<AtomicUsize>);
        impl EventHandler<CompactObject> for Count {
            fn on_add(&mut self, _: &Arc<CompactObject>, _: bool) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
            fn on_update(&mut self, _: &Arc<CompactObject>, _: &Arc<CompactObject>) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let informer = SharedInformer::builder(server.clone(), compact_key_fn())
            .indexers(vec![
                ("namespace".into(), index_by_namespace()),
                ("app".into(), index_by_label("app")),
                ("node".into(), index_by_field(node)),
            ])
            .build();
        let heard = Arc::new(AtomicUsize::new(0));
        let registration = informer
            .add_event_handler(Count(Arc::clone(&heard)))
            .unwrap();

        fn reconcile(
            req: &Request<CompactObject>,
            seen: &std::sync::Mutex<Vec<String>>,
        ) -> Result<Action, String> {
            if let Some(pod) = req.object() {
                let typed: pb::Pod = pod.decode_protobuf().map_err(|e| e.to_string())?;
                let image = typed.spec.unwrap().containers[0].image.clone().unwrap();
                seen.lock().unwrap().push(format!(
                    "{} {} {image}",
                    req.key(),
                    pod.resource_version()
                ));
            }
            Ok(Action::Done)
        }
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let controller = Controller::builder(&informer)
            .workers(2)
            .run(reconcile, Arc::clone(&seen))
            .unwrap();
        informer.start().unwrap();
        registration.wait_for_sync().await;

        let store = informer.store();
        assert_eq!(store.by_index("namespace", "ns").unwrap().len(), 3);
        assert_eq!(store.by_index("app", "web").unwrap().len(), 2);
        assert_eq!(store.by_index("node", "node-1").unwrap().len(), 2);
        assert_eq!(store.by_index("node", "node-2").unwrap().len(), 1);

        // A change moves the pod between index values.
        server.upsert(pod("b", "node-2", "web")).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while store.by_index("node", "node-2").unwrap().len() != 2 {
            assert!(
                std::time::Instant::now() < deadline,
                "the update never reached the index"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(store.by_index("app", "web").unwrap().len(), 3);
        // The workqueue may merge b's first add with its update (a key queued twice before a
        // worker takes it is reconciled once): wait for the reconcile that saw the update.
        let reconciled_update = |seen: &[String]| seen.iter().any(|l| l.starts_with("ns/b 4 "));
        while !reconciled_update(&seen.lock().unwrap()) {
            assert!(
                std::time::Instant::now() < deadline,
                "the controller never reconciled the update"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        controller.shutdown().await;
        informer.shutdown().await;
        assert!(heard.load(Ordering::Relaxed) >= 4);
        let seen = seen.lock().unwrap();
        assert!(
            seen.iter().any(|line| line.starts_with("ns/b 4 ")),
            "{seen:?}"
        );
        assert!(
            seen.iter().all(|line| line.ends_with(" image-0")),
            "{seen:?}"
        );
    });
}

/// A plain pod named `name` in namespace `ns` on `node`, with one container `image-0`.
fn shape_of(name: &str, node: &str) -> Shape {
    Shape {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        resource_version: String::new(),
        generation: Some(1),
        deletion: None,
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        owners: vec![],
        managers: vec![("kubelet".into(), "{}".into())],
        node: Some(node.into()),
        phase: Some("Running".into()),
        containers: vec![("app".into(), "image-0".into(), vec![])],
    }
}
