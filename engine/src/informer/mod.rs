//! The informer pipeline around the queue and the indexer (client-go's `Reflector`,
//! `ListerWatcher` and `sharedIndexInformer`): a [`Reflector`] lists and watches a
//! [`ListerWatcher`] into a [`DeltaQueue`](crate::DeltaQueue); a [`SharedInformer`]'s consumers
//! pop what it queued, apply it to an [`Indexer`](crate::Indexer), and hand the notifications to
//! every handler [`Registration`].
//!
//! Built with the `informer` feature (on by default), on tokio. The contract is in
//! `docs/informer.md`.
//!
//! - [`ListerWatcher`]: the source: paged lists and watches from a resource version, with the
//!   server's errors (`410 Expired` among them).
//! - [`SetResourceVersion`]: what a server that stores typed objects needs of them. The
//!   simulated API server (its state machine and an in-process `ListerWatcher` with scripted
//!   failures) is not part of this library: it is the `kcache-sim` crate, for tests and the
//!   load generator.
//! - [`Reflector`] and [`Backoff`]: list, replace, watch, relist on 410, back off on failure,
//!   resync.
//! - `KubeListerWatcher` (feature `kube`): the same over kube-rs' `Api<K>`, against a real
//!   API server.
//! - `wire` (feature `wire`): kcache's own client for a real API server, over kube-rs'
//!   `Client` but decoding itself: protobuf for built-in types (as client-go), JSON for the
//!   rest (`WireListerWatcher`).
//! - [`SharedInformer`]: one reflector, one queue, one indexer, many handlers, each with its own
//!   bounded buffer and delivery thread (or inline on the consumers, or an
//!   [`AsyncEventHandler`]'s task), `has_synced` and resync period ([`HandlerOptions`]);
//!   [`StoreReader`] reads the store; [`AppliedVersion`] says which resource version the store
//!   has applied and waits for one.

mod applied;
mod backoff;
mod coalesce;
mod handler;
mod handoff;
#[cfg(feature = "kube")]
mod kube;
mod lister_watcher;
mod notification;
mod processor;
mod reader;
mod reflector;
mod shared_informer;
mod stop;
#[cfg(feature = "wire")]
pub mod wire;

#[cfg(feature = "kube")]
pub use self::kube::{
    from_kube_error, from_kube_event, kube_key, kube_key_fn, KubeListerWatcher,
    MAX_WATCH_TIMEOUT_SECS,
};
pub use applied::{version_at_least, AppliedVersion, VersionWait};
pub use backoff::{Backoff, BackoffTimer};
pub use handler::{AsyncEventHandler, HandlerOptions, Lag, LagHandler, DEFAULT_HANDLER_BUFFER};
/// The consumer-to-handler hand-off, public only for the loom model (`tests/loom_fanout.rs`).
#[cfg(kcache_loom)]
#[doc(hidden)]
pub use handoff::{Handoff, HandoffClosed, TryRecv};
pub use lister_watcher::{
    Error, ListOptions, ListerWatcher, Page, SetResourceVersion, Status, Versioned, WatchEvent,
    WatchOptions, WatchStream,
};
pub use processor::{Registration, MINIMUM_RESYNC_PERIOD};
pub use reader::StoreReader;
pub use reflector::{
    OnSynced, Reflector, ReflectorHandle, ReflectorOptions, ShouldResync, WatchErrorHandler,
    DEFAULT_MIN_WATCH_TIMEOUT, DEFAULT_PAGE_SIZE, DEFAULT_READ_AHEAD,
};
pub use shared_informer::{InformerError, SharedInformer, SharedInformerBuilder, DEFAULT_BATCH};
pub use stop::StopSignal;
