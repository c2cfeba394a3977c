//! A stop signal that async tasks can wait on and any thread can raise (what a Go informer
//! gets as its `stopCh` or context).

use tokio::sync::watch;

/// Raised once by [`stop`](Self::stop); every clone sees it. Waiting is async
/// ([`stopped`](Self::stopped)), checking is not ([`is_stopped`](Self::is_stopped)).
///
/// ```
/// use kcache::informer::StopSignal;
/// let stop = StopSignal::new();
/// let seen_by_task = stop.clone();
/// assert!(!seen_by_task.is_stopped());
/// stop.stop();
/// assert!(seen_by_task.is_stopped());
/// ```
#[derive(Debug, Clone)]
pub struct StopSignal {
    tx: std::sync::Arc<watch::Sender<bool>>,
}

impl Default for StopSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl StopSignal {
    /// A signal not raised yet.
    pub fn new() -> Self {
        Self {
            tx: std::sync::Arc::new(watch::Sender::new(false)),
        }
    }

    /// Raises the signal; later calls do nothing.
    pub fn stop(&self) {
        self.tx.send_replace(true);
    }

    /// Whether [`stop`](Self::stop) was called.
    pub fn is_stopped(&self) -> bool {
        *self.tx.borrow()
    }

    /// Completes once the signal is raised.
    pub async fn stopped(&self) {
        let mut rx = self.tx.subscribe();
        // `wait_for` fails only when the sender is gone, and `self` holds it.
        let _ = rx.wait_for(|stopped| *stopped).await;
    }
}
