//! W7, a controller under a resync storm: a small paced run through both engines with and
//! without the priority queue passes W6's verdict (every key's last event reconciled after it
//! arrived, never two workers on one key) while the informer resyncs every object every second.

#![forbid(unsafe_code)]

use std::time::Duration;

use loadgen::engines::{EngineConfig, EngineKind};
use loadgen::pipelines::controller_informer::{drops_none, measure, Storm};
use loadgen::pipelines::controller_loop::ControllerConfig;
use loadgen::progress::NoProgress;
use workloads::{generate, Workload, WorkloadSpec};

#[test]
fn w7_reconciles_every_live_change_under_resyncs_with_and_without_priority() {
    let keys = 300;
    let gen = generate(&WorkloadSpec::new(Workload::W7).keys(keys).events(3_000));
    let cfg = EngineConfig {
        shards: 4,
        consumers: 2,
        // 2 s of churn: the informer resyncs every object twice meanwhile.
        rate: Some(1_500),
        ..EngineConfig::for_workload(Workload::W7)
    };
    for engine in EngineKind::ALL {
        for priority in [false, true] {
            let storm = Storm {
                resync: Duration::from_secs(1),
                priority,
            };
            let row = measure(
                engine,
                &gen,
                &cfg,
                &ControllerConfig::default(),
                drops_none(),
                Some(storm),
                &NoProgress,
            )
            .expect("the run completes");
            assert!(
                row.is_ok(),
                "{engine} {}: {:?}",
                storm.label(),
                row.failures
            );
            assert_eq!(row.workload, storm.label());
            let c = row.controller.expect("controller figures");
            // The initial list, the live changes, and at least one resync of every key.
            assert!(
                c.reconciles as usize >= 2 * keys,
                "{engine} {}: resyncs reconciled every key again: {c:?}",
                storm.label()
            );
            assert!(
                row.latency_us.p99.is_some(),
                "live changes' latency is reported"
            );
        }
    }
}
