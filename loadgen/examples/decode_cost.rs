//! What one watch event costs a client to decode, by decoding path and pod profile.
//!
//! ```sh
//! cargo build --release -p loadgen --features wire --example decode_cost
//! # Wall time, median of 5 passes (noisy on a shared machine; compare paths in one run):
//! target/release/examples/decode_cost typical all 20000
//! # Instructions, repeatable (subtract mode `none` and divide by the events):
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!   target/release/examples/decode_cost typical compact-protobuf 20000 2>&1 | grep Collected
//! ```
//!
//! Each mode decodes the same `MODIFIED` events of `loadgen serve`'s pods of one profile (the
//! bytes `serve` sends: its JSON lines and protobuf frames) and drops what it decoded, as a
//! cache eventually does:
//!
//! - `kube-rs`: kube-rs' `WatchEvent<Pod>` (k8s-openapi) from the line's bytes (what
//!   `Api::watch` decodes each line into);
//! - `json`: kcache's `JsonCodec<Pod>` (k8s-openapi, from a `&str`);
//! - `protobuf`: kcache's `ProtobufCodec` (prost into the `k8s-pb` pod);
//! - `compact-json`, `compact-protobuf`: kcache's `CompactCodec` (the compact object,
//!   `managedFields` stripped, `spec.nodeName` declared);
//! - `compact-json+decode`, `compact-protobuf+decode`: the same, then the whole object decoded
//!   on demand from the compact one (into k8s-openapi's pod, or k8s-pb's);
//! - `none`: only walks the inputs (the baseline to subtract under callgrind).

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kcache::informer::wire::{pod_fields, Codec, CompactCodec, Format, JsonCodec, ProtobufCodec};
use loadgen::serve::encode::PodFields;
use loadgen::serve::objects::{EventType, Revision};
use loadgen::serve::store::StoredPod;
use workloads::PodProfile;

const MODES: &[&str] = &[
    "kube-rs",
    "json",
    "protobuf",
    "compact-json",
    "compact-protobuf",
    "compact-json+decode",
    "compact-protobuf+decode",
];

/// Event `i`: a pod of `profile` with a few changes behind it.
fn event(profile: PodProfile, i: u32) -> StoredPod {
    let fields = PodFields {
        namespace: Arc::from(format!("ns-{}", i % 1000)),
        name: Arc::from(format!("pod-{i}")),
        node: Some(Arc::from(format!("node-{}", i % 5000))),
        id: i,
        incarnation: 1,
        version: u64::from(i % 17) + 5,
        resource_version: 100_000 + u64::from(i),
        created: 1_795_723_200,
        profile,
        revision: Revision {
            restarts: i % 3,
            spec: i % 2,
            touched: 1,
            status_at: 60,
            touched_at: 30,
        },
    };
    StoredPod::new(EventType::Modified, fields)
}

/// Decodes every input once with `mode`.
fn pass(mode: &str, lines: &[Vec<u8>], frames: &[Vec<u8>]) {
    let json = JsonCodec::<Pod>::new();
    let pb = ProtobufCodec::<k8s_pb::api::core::v1::Pod>::new();
    let compact_json =
        CompactCodec::json_only("", "v1", "pods").index_field(pod_fields::node_name());
    let compact_pb =
        CompactCodec::protobuf::<k8s_pb::api::core::v1::Pod>().index_field(pod_fields::node_name());
    let object = |event| match event {
        kcache::informer::WatchEvent::Modified(o) => o,
        other => panic!("not a change: {other:?}"),
    };
    match mode {
        "none" => lines.iter().chain(frames).for_each(|i| {
            black_box(i);
        }),
        "kube-rs" => lines.iter().for_each(|line| {
            let event: kube::core::WatchEvent<Pod> = serde_json::from_slice(line).expect("decodes");
            black_box(event);
        }),
        "json" => lines.iter().for_each(|line| {
            black_box(json.event(Format::Json, line).expect("decodes"));
        }),
        "protobuf" => frames.iter().for_each(|frame| {
            black_box(pb.event(Format::Protobuf, frame).expect("decodes"));
        }),
        "compact-json" => lines.iter().for_each(|line| {
            black_box(compact_json.event(Format::Json, line).expect("decodes"));
        }),
        "compact-protobuf" => frames.iter().for_each(|frame| {
            black_box(compact_pb.event(Format::Protobuf, frame).expect("decodes"));
        }),
        "compact-json+decode" => lines.iter().for_each(|line| {
            let o = object(compact_json.event(Format::Json, line).expect("decodes"));
            black_box(o.decode_json::<Pod>().expect("decodes"));
        }),
        "compact-protobuf+decode" => frames.iter().for_each(|frame| {
            let o = object(compact_pb.event(Format::Protobuf, frame).expect("decodes"));
            black_box(
                o.decode_protobuf::<k8s_pb::api::core::v1::Pod>()
                    .expect("decodes"),
            );
        }),
        other => {
            eprintln!("unknown mode {other:?}: none, all, {}", MODES.join(", "));
            std::process::exit(2);
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let profile: PodProfile = match args.next().unwrap_or_else(|| "typical".into()).parse() {
        Ok(profile) => profile,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let mode = args.next().unwrap_or_else(|| "all".into());
    let events: u32 = match args.next().map(|n| n.parse()) {
        None => 20_000,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("EVENTS is a positive number");
            std::process::exit(2);
        }
    };
    let stored: Vec<StoredPod> = (0..events).map(|i| event(profile, i)).collect();
    let lines: Vec<Vec<u8>> = stored.iter().map(|p| p.line().to_vec()).collect();
    let frames: Vec<Vec<u8>> = stored
        .iter()
        .map(|p| p.protobuf().frame()[4..].to_vec())
        .collect();
    drop(stored);
    if mode != "all" {
        pass(&mode, &lines, &frames);
        return;
    }
    let bytes = |inputs: &[Vec<u8>]| inputs.iter().map(Vec::len).sum::<usize>() / inputs.len();
    println!(
        "{profile} pods: {} bytes per JSON line, {} per protobuf frame; µs per event, median of 5 passes of {events}",
        bytes(&lines),
        bytes(&frames)
    );
    for mode in MODES {
        let mut times: Vec<f64> = (0..5)
            .map(|_| {
                let start = Instant::now();
                pass(mode, &lines, &frames);
                start.elapsed().as_secs_f64() * 1e6 / f64::from(events)
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!("{mode:<26} {:>8.2}", times[2]);
    }
}
