//! Fixtures shared by the informer tests: a versioned object, a server of them, and a
//! ListerWatcher wrapper that records every call.
#![allow(dead_code)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use kcache::informer::{Error, ListOptions, ListerWatcher, Page, WatchOptions, WatchStream};
use kcache::{Key, KeyError, KeyFn};
use kcache_sim::MemoryListerWatcher;

/// A test object: a name, a payload value and the server's resource version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub name: String,
    pub value: u64,
    pub rv: String,
}

/// Implements `Versioned` and `SetResourceVersion` for a test object that keeps its resource
/// version in a `rv: String` field.
#[macro_export]
macro_rules! versioned_by_rv_field {
    ($object:ty) => {
        impl kcache::informer::Versioned for $object {
            fn resource_version(&self) -> &str {
                &self.rv
            }
        }

        impl kcache::informer::SetResourceVersion for $object {
            fn set_resource_version(&mut self, rv: &str) {
                self.rv = rv.to_string();
            }
        }
    };
}

versioned_by_rv_field!(Pod);

impl Pod {
    /// The resource version as a number (the in-memory server's are numbers).
    pub fn rv_number(&self) -> u64 {
        self.rv
            .parse()
            .expect("the in-memory server stamps numbers")
    }
}

pub fn pod(name: &str, value: u64) -> Pod {
    Pod {
        name: name.to_string(),
        value,
        rv: String::new(),
    }
}

pub fn key_fn() -> KeyFn<Pod> {
    Arc::new(|p: &Pod| -> Result<Key, KeyError> {
        if p.name.is_empty() {
            Err(KeyError::new("pod without a name"))
        } else {
            Ok(Key::new(&p.name))
        }
    })
}

pub fn server(window: usize) -> MemoryListerWatcher<Pod> {
    MemoryListerWatcher::with_window(key_fn(), window)
}

/// A server with `window` events of history, holding `pods`.
pub fn server_of(window: usize, pods: impl IntoIterator<Item = Pod>) -> MemoryListerWatcher<Pod> {
    let srv = server(window);
    for p in pods {
        srv.upsert(p).expect("test pods have keys");
    }
    srv
}

/// `n` pods `p0`, `p1`, … (numbered `width` digits wide), each written at version `rv`.
pub fn upsert_pods(srv: &MemoryListerWatcher<Pod>, n: usize, width: usize, rv: u64) {
    for i in 0..n {
        srv.upsert(pod(&format!("p{i:0width$}"), rv)).unwrap();
    }
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One call a [`Recording`] saw: when (tokio's clock), and what was asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    List { rv: String, continued: bool },
    Watch { rv: String, bookmarks: bool },
}

/// Wraps a ListerWatcher and records every call with the time it was made.
#[derive(Clone)]
pub struct Recording<L> {
    pub inner: L,
    pub calls: Arc<Mutex<Vec<(tokio::time::Instant, Call)>>>,
}

impl<L> Recording<L> {
    pub fn new(inner: L) -> Self {
        Self {
            inner,
            calls: Arc::default(),
        }
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|(_, c)| c.clone())
            .collect()
    }

    pub fn times(&self) -> Vec<tokio::time::Instant> {
        self.calls.lock().unwrap().iter().map(|(t, _)| *t).collect()
    }

    pub fn watches(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Watch { rv, .. } => Some(rv),
                Call::List { .. } => None,
            })
            .collect()
    }

    pub fn lists(&self) -> Vec<String> {
        self.calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::List {
                    rv,
                    continued: false,
                } => Some(rv),
                _ => None,
            })
            .collect()
    }
}

impl<L: ListerWatcher<Pod>> ListerWatcher<Pod> for Recording<L> {
    async fn list(&self, options: ListOptions) -> Result<Page<Pod>, Error> {
        self.calls.lock().unwrap().push((
            tokio::time::Instant::now(),
            Call::List {
                rv: options.resource_version.clone(),
                continued: options.continue_token.is_some(),
            },
        ));
        self.inner.list(options).await
    }

    async fn watch(&self, options: WatchOptions) -> Result<WatchStream<Pod>, Error> {
        self.calls.lock().unwrap().push((
            tokio::time::Instant::now(),
            Call::Watch {
                rv: options.resource_version.clone(),
                bookmarks: options.allow_bookmarks,
            },
        ));
        self.inner.watch(options).await
    }
}

/// Collects every error a reflector reports.
pub fn error_log() -> (Arc<Mutex<Vec<Error>>>, kcache::informer::WatchErrorHandler) {
    let log: Arc<Mutex<Vec<Error>>> = Arc::default();
    let sink = Arc::clone(&log);
    (
        log,
        Arc::new(move |e: &Error| sink.lock().unwrap().push(e.clone())),
    )
}

/// A door a handler (or a consumer) waits at until the test opens it.
#[derive(Default)]
pub struct Gate {
    open: Mutex<bool>,
    cond: Condvar,
}

impl Gate {
    /// Waits until the door is open.
    pub fn wait(&self) {
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.cond.wait(open).unwrap();
        }
    }

    /// Opens the door for every waiter, now and later.
    pub fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.cond.notify_all();
    }
}

/// Polls `cond` until it holds, pausing between polls; fails the test once `expired` (a
/// liveness guard, not a timing).
async fn poll_until<F: std::future::Future>(
    what: &str,
    expired: impl Fn() -> bool,
    mut pause: impl FnMut() -> F,
    mut cond: impl FnMut() -> bool,
) {
    while !cond() {
        assert!(!expired(), "timed out waiting for {what}");
        pause().await;
    }
}

/// Polls `cond` every millisecond until it holds; fails after `limit` of real time.
pub async fn eventually(what: &str, limit: Duration, cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    let expired = || std::time::Instant::now() >= deadline;
    poll_until(what, expired, || tokio::time::sleep(ms(1)), cond).await;
}

/// Polls `cond` every 2 ms of tokio's clock until it holds; fails after `limit` on that clock,
/// so under a paused clock the sleeps advance it and the limit costs no real time.
pub async fn eventually_on_tokio_clock(what: &str, limit: Duration, cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    let expired = || tokio::time::Instant::now() >= deadline;
    poll_until(what, expired, || tokio::time::sleep(ms(2)), cond).await;
}

/// Polls `cond` until it holds without letting tokio's paused clock move: the task yields
/// instead of sleeping, so the runtime is never idle and never auto-advances the clock while
/// the informer's threads work in real time. Fails after `limit` of real time.
pub async fn frozen_until(what: &str, limit: Duration, cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + limit;
    let expired = || std::time::Instant::now() >= deadline;
    poll_until(what, expired, tokio::task::yield_now, cond).await;
}
