//! The churn's thread, and a restart that loses the server's state: resource versions go
//! back, and a client that remembers a newer one gets `504 ResourceVersionTooLarge` (after the
//! wait) until it lists afresh, as from a real API server whose etcd was restored from a
//! backup.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch as signal;

use super::churn::{Churn, ChurnSummary, Pace};
use super::store::Store;
use super::Server;
use workloads::generate;

/// Starts `churn` on `store` at `pace` on a thread of its own; its summary goes to `done`.
/// Returns the flag that stops it and, when `hold`, the gate whose drop lets it begin.
pub(super) fn spawn_churn(
    churn: Churn,
    store: Arc<Store>,
    pace: Pace,
    hold: bool,
    done: signal::Sender<Option<ChurnSummary>>,
) -> io::Result<(Arc<AtomicBool>, Option<ChurnGate>)> {
    let stop = Arc::new(AtomicBool::new(false));
    let (gate, held) = if hold {
        let (sender, held) = std::sync::mpsc::channel::<()>();
        let waiting = Arc::new(AtomicBool::new(false));
        let gate = ChurnGate {
            sender,
            waiting: Arc::clone(&waiting),
        };
        (Some(gate), Some((held, waiting)))
    } else {
        (None, None)
    };
    let churn_stop = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("serve-churn".into())
        .spawn(move || {
            if let Some((held, waiting)) = held {
                // Release: whoever sees the flag sees that nothing was published before it.
                waiting.store(true, Ordering::Release);
                // Nothing is ever sent: the gate opens when its sender is dropped.
                let _ = held.recv();
                waiting.store(false, Ordering::Release);
            }
            let summary = churn.run(&store, pace, &churn_stop);
            // Nobody waiting is fine.
            let _ = done.send(Some(summary));
        })?;
    Ok((stop, gate))
}

/// A held churn's gate: dropping it lets the churn begin; a message lets a stopped churn past
/// it to end.
#[derive(Debug)]
pub(super) struct ChurnGate {
    pub(super) sender: std::sync::mpsc::Sender<()>,
    /// The churn thread is parked at the gate (it has published nothing).
    pub(super) waiting: Arc<AtomicBool>,
}

impl Server {
    /// A restart that lost the state: every watch and connection ends, the address refuses
    /// connections for `down`, then a new state is served: the workload generated again with
    /// `seed` (a different seed: different pods and versions), from its first resource
    /// version, churning at the same rate (held until [`Server::release_churn`] when `hold`).
    /// Versions go back: a client's last version is now in
    /// the server's future, which it answers with `504 ResourceVersionTooLarge` after the wait
    /// (`ServeConfig::too_large_wait`). Fault counts carry on.
    pub async fn restart_without_state(
        &mut self,
        down: Duration,
        seed: u64,
        hold: bool,
    ) -> io::Result<()> {
        // Relaxed: the flag carries no data (see Churn::run).
        self.stop_churn.store(true, Ordering::Relaxed);
        self.churn_gate = None;
        let _ = self.shutdown.send(true);
        let old = std::mem::replace(&mut self.http, tokio::spawn(async { Ok(()) }));
        old.await.map_err(io::Error::other)??;
        let spec = self.config.workload.seed(seed);
        let profile = self.config.pod_profile;
        let (churn, initial, resource_version) =
            tokio::task::spawn_blocking(move || Churn::new(generate(&spec), profile))
                .await
                .map_err(io::Error::other)?;
        tokio::time::sleep(down).await;
        self.initial_pods = initial.len();
        self.store = Arc::new(Store::new(initial, resource_version, self.config.window));
        let (done, churn_rx) = signal::channel(None);
        self.app.store = Arc::clone(&self.store);
        self.app.churn = churn_rx.clone();
        self.churn = churn_rx;
        self.serve_again()?;
        let (stop, gate) = spawn_churn(
            churn,
            Arc::clone(&self.store),
            self.config.pace(),
            hold,
            done,
        )?;
        self.stop_churn = stop;
        self.churn_gate = gate;
        Ok(())
    }
}
