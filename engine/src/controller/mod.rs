//! A reconcile loop over kcache's informer and workqueue (kube-rs' `Controller`,
//! controller-runtime's controller), built with the `informer` feature.
//!
//! A [`Controller`] registers a handler on a primary [`SharedInformer`](crate::informer::SharedInformer)
//! that adds the key of every changed object to a workqueue, and on secondary informers
//! handlers that add the keys their objects map to ([`owns`](ControllerBuilder::owns): the
//! owner references, through [`Owned`]; [`watches`](ControllerBuilder::watches): a function of
//! yours). Workers take keys and call your reconcile function with a [`Request`]: the key and
//! the object as the informer's indexer holds it, shared (an `Arc`, never copied), or `None`
//! when it was deleted. The reconcile returns an [`Action`] or an error:
//!
//! - `Ok(Action::Done)`: the key's failures are forgotten; nothing more until it changes.
//! - `Ok(Action::RequeueAfter(d))`: forgotten too, and reconciled again after `d`.
//! - `Err(e)` (or a panic, caught): retried after the rate limiter's delay (the builder's
//!   [`rate_limiter`](ControllerBuilder::rate_limiter), client-go's default unless set).
//!
//! A reconcile that writes tells the controller the resource version the API server answered
//! with ([`Request::wrote`]); the key's next reconcile then waits until the informer's cache
//! has applied that version ([`SharedInformer::applied_version`](crate::informer::SharedInformer::applied_version)),
//! at most [`cache_wait_timeout`](ControllerBuilder::cache_wait_timeout), so it does not act on
//! a cache older than its own write.
//!
//! # Example
//!
//! ```
//! # tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap().block_on(async {
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//! use kcache::controller::{Action, Controller, Request};
//! use kcache::informer::{SetResourceVersion, SharedInformer, Versioned};
//! use kcache_sim::MemoryListerWatcher;
//! use kcache::{Key, KeyFn};
//!
//! #[derive(Clone)]
//! struct Pod { key: Key, image: String, rv: String }
//! impl Versioned for Pod { fn resource_version(&self) -> &str { &self.rv } }
//! impl SetResourceVersion for Pod { fn set_resource_version(&mut self, rv: &str) { self.rv = rv.into() } }
//!
//! let key_fn: KeyFn<Pod> = Arc::new(|p: &Pod| Ok(p.key.clone()));
//! let server = MemoryListerWatcher::new(key_fn.clone()); // any ListerWatcher<Pod>
//! let pod = |name: &str, image: &str| Pod { key: Key::new(name), image: image.into(), rv: String::new() };
//! server.upsert(pod("default/web-0", "nginx:1")).unwrap();
//!
//! let informer = SharedInformer::builder(server.clone(), key_fn).build();
//! // The state the reconcile drives; a real controller would call the API server.
//! type Seen = Mutex<HashMap<Key, Option<String>>>;
//! fn reconcile(request: &Request<Pod>, seen: &Seen) -> Result<Action, String> {
//!     let image = request.object().map(|pod| pod.image.clone()); // None: deleted
//!     seen.lock().unwrap().insert(request.key().clone(), image);
//!     Ok(Action::Done)
//! }
//! let seen = Arc::new(Seen::default());
//! let controller = Controller::builder(&informer)
//!     .name("pods")
//!     .workers(2)
//!     .run(reconcile, seen.clone())
//!     .unwrap();
//! informer.start().unwrap();
//! controller.wait_for_sync().await; // the initial list is enqueued
//!
//! server.upsert(pod("default/web-0", "nginx:2")).unwrap();
//! server.delete(&Key::new("default/web-0"));
//! let gone = |seen: &Seen| seen.lock().unwrap().get(&Key::new("default/web-0")) == Some(&None);
//! while !gone(&seen) {
//!     tokio::time::sleep(std::time::Duration::from_millis(1)).await;
//! }
//! controller.shutdown().await; // reconciles in flight finish first
//! informer.shutdown().await;
//! assert!(controller.stats().success >= 1);
//! # });
//! ```
//!
//! # Guarantees
//!
//! - **Nothing lost**: the handler adds a key after the informer's store holds the change, so
//!   a reconcile that starts after an event reads that event's state or a newer one, and
//!   every key gets a reconcile that starts after its last event.
//! - **One worker per key**: the workqueue never hands a key to a second worker before the
//!   first is done; a key changed meanwhile is reconciled again afterwards.
//! - **Graceful shutdown**: [`Controller::shutdown`] lets the reconciles in flight finish and
//!   waits for every worker; keys still queued are not reconciled (the next start lists them).
//! - **Priorities**: initial-list and resync keys are added at [`LOW_PRIORITY`], live changes
//!   at [`NORMAL_PRIORITY`]; on a queue with priorities ([`ControllerQueue::has_priorities`]),
//!   live changes pass the backlog a resync makes. The rate-limiting queue has none and keeps
//!   arrival order.
//!
//! Metrics: the workqueue's (client-go's names, through its
//! [`QueueConfig`](crate::workqueue::QueueConfig)) and the reconciles' (controller-runtime's
//! names, [`metrics`](ControllerBuilder::metrics)); [`Controller::stats`] reads the counts.
//! The contract and the design are in `docs/controller.md`.

mod handler;
mod mapping;
mod metrics;
#[allow(unsafe_code)] // Two system calls on integers: see their `Safety:` comments.
mod nice;
mod queue;
mod reconcile;
mod runtime;

pub use handler::{Event, EventFilter};
pub use mapping::{owner_keys, owner_mapper, Mapper, Owned};
#[cfg(feature = "prometheus")]
pub use metrics::ControllerPrometheus;
pub use metrics::{ReconcileMetricsProvider, ReconcileResult, ReconcileStats};
pub use queue::{ControllerQueue, Priority, LOW_PRIORITY, NORMAL_PRIORITY};
pub use reconcile::{Action, Request};
pub use runtime::{Controller, ControllerBuilder, ControllerError, DEFAULT_CACHE_WAIT_TIMEOUT};
