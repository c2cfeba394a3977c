//! What one watch event costs to decode, by path: count it in instructions, not time.
//!
//! ```sh
//! cargo build --release -p kcache --features wire --example decode_cost
//! for mode in none json-codec json-slice json-str kube-rs none-protobuf protobuf; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/decode_cost $mode 20000 2>&1 | grep 'Collected'
//! done
//! ```
//!
//! Each mode decodes the same `EVENTS` watch events of a pod like `loadgen serve`'s (one
//! container, two labels, a node): subtract `none` (which only makes the JSON events) or
//! `none-protobuf` (the protobuf ones) from each mode and divide by `EVENTS`.
//!
//! - `json-codec`: kcache's `JsonCodec` (the whole event: the line's type, the object straight
//!   into `k8s_openapi`'s `Pod`, its `Arc`);
//! - `json-slice`: serde_json from the line's bytes into the same event shape;
//! - `json-str`: the same after one UTF-8 check of the whole line (`from_str`: serde_json then
//!   skips the per-string checks; what `JsonCodec` does);
//! - `kube-rs`: kube-rs' watch event type, `kube::core::WatchEvent<Pod>`, from the same bytes
//!   (what `Api::watch` decodes each line into);
//! - `protobuf`: kcache's `ProtobufCodec` (the frame's envelope walked, the `k8s-pb` pod decoded
//!   by prost).

use std::hint::black_box;

use k8s_openapi::api::core::v1::Pod;
use kcache::informer::wire::{Codec, Format, JsonCodec, ProtobufCodec};
use prost::Message;
use serde::Deserialize;

fn json_line(i: u64) -> Vec<u8> {
    format!(
        concat!(
            r#"{{"type":"MODIFIED","object":{{"apiVersion":"v1","kind":"Pod","metadata":{{"#,
            r#""creationTimestamp":"2026-11-26T20:00:00Z","labels":{{"app":"loadgen","#,
            r#""loadgen/version":"{v}"}},"name":"pod-{i}","namespace":"ns-{ns}","#,
            r#""resourceVersion":"{rv}","uid":"00000001-0000-4000-8000-{i:012x}"}},"#,
            r#""spec":{{"containers":[{{"image":"registry.k8s.io/pause:3.10","name":"app"}}],"#,
            r#""nodeName":"node-{node}"}}}}}}"#
        ),
        v = i % 17,
        i = i,
        ns = i % 1000,
        rv = 100_000 + i,
        node = i % 5000
    )
    .into_bytes()
}

fn protobuf_frame(i: u64) -> Vec<u8> {
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
    use k8s_pb::apimachinery::pkg::runtime::{RawExtension, TypeMeta, Unknown};
    let pod = core::Pod {
        metadata: Some(meta::ObjectMeta {
            name: Some(format!("pod-{i}")),
            namespace: Some(format!("ns-{}", i % 1000)),
            uid: Some(format!("00000001-0000-4000-8000-{i:012x}")),
            resource_version: Some((100_000 + i).to_string()),
            creation_timestamp: Some(meta::Time {
                seconds: Some(1_795_723_200),
                nanos: None,
            }),
            labels: [
                ("app".to_owned(), "loadgen".to_owned()),
                ("loadgen/version".to_owned(), (i % 17).to_string()),
            ]
            .into(),
            ..Default::default()
        }),
        spec: Some(core::PodSpec {
            containers: vec![core::Container {
                name: Some("app".into()),
                image: Some("registry.k8s.io/pause:3.10".into()),
                ..Default::default()
            }],
            node_name: Some(format!("node-{}", i % 5000)),
            ..Default::default()
        }),
        status: None,
    };
    let mut body = b"k8s\0".to_vec();
    Unknown {
        type_meta: Some(TypeMeta {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
        }),
        raw: Some(pod.encode_to_vec()),
        content_encoding: Some(String::new()),
        content_type: Some(String::new()),
    }
    .encode(&mut body)
    .expect("a Vec grows");
    meta::WatchEvent {
        r#type: Some("MODIFIED".into()),
        object: Some(RawExtension { raw: Some(body) }),
    }
    .encode_to_vec()
}

/// The codec's own event shape (its object variants), decoded here from bytes or from a `&str`.
#[derive(Deserialize)]
#[serde(tag = "type", content = "object")]
enum StrEvent {
    #[serde(rename = "ADDED")]
    Added(Pod),
    #[serde(rename = "MODIFIED")]
    Modified(Pod),
    #[serde(rename = "DELETED")]
    Deleted(Pod),
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "none".into());
    let events: u64 = args
        .next()
        .map(|n| n.parse().expect("EVENTS is a number"))
        .unwrap_or(20_000);
    let protobuf = mode.ends_with("protobuf");
    let inputs: Vec<Vec<u8>> = (0..events)
        .map(|i| {
            if protobuf {
                protobuf_frame(i)
            } else {
                json_line(i)
            }
        })
        .collect();
    let json = JsonCodec::<Pod>::new();
    let pb = ProtobufCodec::<k8s_pb::api::core::v1::Pod>::new();
    for input in &inputs {
        match mode.as_str() {
            "none" | "none-protobuf" => {
                black_box(input);
            }
            "json-codec" => {
                black_box(json.event(Format::Json, input).expect("decodes"));
            }
            "json-slice" => {
                let event: StrEvent = serde_json::from_slice(input).expect("decodes");
                black_box(match event {
                    StrEvent::Added(p) | StrEvent::Modified(p) | StrEvent::Deleted(p) => p,
                });
            }
            "json-str" => {
                let text = std::str::from_utf8(input).expect("UTF-8");
                let event: StrEvent = serde_json::from_str(text).expect("decodes");
                black_box(match event {
                    StrEvent::Added(p) | StrEvent::Modified(p) | StrEvent::Deleted(p) => p,
                });
            }
            "kube-rs" => {
                let event: kube::core::WatchEvent<Pod> =
                    serde_json::from_slice(input).expect("decodes");
                black_box(event);
            }
            "protobuf" => {
                black_box(pb.event(Format::Protobuf, input).expect("decodes"));
            }
            other => {
                eprintln!(
                    "unknown mode {other:?}: none, json-codec, json-slice, json-str, kube-rs, \
                     none-protobuf, protobuf"
                );
                std::process::exit(2);
            }
        }
    }
}
