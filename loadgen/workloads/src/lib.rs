//! The synthetic workloads W1–W8 of docs/workloads.md: what `loadgen` drives kcache's engines
//! with, and what the benchmarks (`bench`) measure them on.
//!
//! Everything an engine run touches is made here, before the clock starts: one `Arc<Pod>` per
//! event (the producer stamps a sample of them, so an `Arc` is never enqueued twice in one
//! run), every [`Key`](kcache::Key) interned once (a pod's key, its namespace's and its
//! node's), and the generator's own [`Model`] of the final state, which a verdict compares the
//! consumer's indexer to. A timed loop therefore formats nothing and hashes nothing.
//!
//! Random choices come from [`fastrand`] seeded with the spec's seed, so one spec gives the same
//! events every time.
//!
//! The crate is a stack of layers: a module imports only from its own layer or below, and no two
//! modules import each other (`scripts/layers` reads this table and checks it).
//!
//! | layer | modules | what they hold |
//! |---|---|---|
//! | 0 | [`pod`], [`spec`], [`shards`], [`profile`] | the object every workload moves ([`Pod`]), its key function and indexes, and the [`Universe`] of keys; which workload at which size and seed ([`Workload`], [`WorkloadSpec`]); the shard counts the sharded engine takes ([`parse_shards`]); how much of a real pod `loadgen serve` sends ([`PodProfile`]) |
//! | 1 | [`op`], [`model`] | one producer call ([`Op`]) and how it is performed on a queue; what a run must end with ([`Model`], [`Expected`]) |
//! | 2 | [`generate`](mod@generate) | the generator: a spec in, the ops and the model out ([`generate()`], [`Generated`]) |
//!
//! ```
//! use workloads::{generate, Workload, WorkloadSpec};
//! let gen = generate(&WorkloadSpec::new(Workload::W1).keys(100).events(1000));
//! assert_eq!(gen.ops.len(), 1100);
//! assert_eq!(gen.event_count(), 1100);
//! ```

#![forbid(unsafe_code)]

/// Implements `Display` (its `name()`) and `FromStr` (the one of `ALL` whose name it is, in
/// any case; else `$unknown` of the string) for a fieldless enum with an `ALL` array and a
/// `name(self) -> &'static str`: [`Workload`], [`PodProfile`], loadgen's engine kinds.
#[macro_export]
macro_rules! display_and_parse_by_name {
    ($ty:ty, $unknown:path) => {
        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = $unknown;
            fn from_str(s: &str) -> ::std::result::Result<Self, Self::Err> {
                <$ty>::ALL
                    .into_iter()
                    .find(|v| v.name().eq_ignore_ascii_case(s))
                    .ok_or_else(|| $unknown(s.to_string()))
            }
        }
    };
}

pub mod generate;
pub mod model;
pub mod op;
pub mod pod;
pub mod profile;
pub mod shards;
pub mod spec;

pub use generate::{generate, Generated};
pub use model::{Expected, Model};
pub use op::{Op, Relist};
pub use pod::{
    pod_indexers, pod_key_fn, Pod, Universe, NAMESPACES, NAMESPACE_INDEX, NODES, NODE_INDEX,
};
pub use profile::{PodProfile, UnknownPodProfile};
pub use shards::{parse_shards, MAX_SHARDS};
pub use spec::{UnknownWorkload, Workload, WorkloadSpec, DEFAULT_SEED, W3_ROUNDS};
