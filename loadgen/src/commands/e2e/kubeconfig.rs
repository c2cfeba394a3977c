//! `loadgen e2e --kubeconfig FILE`: the client rows against an API server that is already
//! running (`serve --writes`, or a real cluster through `kubectl proxy`), with `loadgen churn`
//! as a child process writing the workload into it (docs/real-clusters.md).
//!
//! Per row: the churn creates the initial population and holds (`churn --hold`); the client
//! starts, lists and syncs; the churn writes the workload's updates, deletes and creates at the
//! offered rate, recording when each write returned and the resource version it got; the
//! client then waits for the last of them and compares its cache with a fresh list of the
//! server (the verdict). Lag is from the write's return in the churn to the client's handler
//! (both read the same clock, on one machine), matched by resource version; events the churn
//! did not write (a kubelet's status updates on a real cluster) have no lag. After the row the
//! churn's pods are deleted (`churn --cleanup`), so every row starts from the same state.
//!
//! What `serve` alone can say is not here: no server CPU (the server is another process), and
//! no `serve-alone` rows.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::kube_churn::{cleanup, read_record, spawn_held};
pub use crate::kube_churn::{cluster_url, Target};

use super::client::read_seen;
use super::{
    client_report, end_child, seen_path, wait_child, ClientReport, OneClient, SYNC_TIMEOUT,
};

/// One row: `client` in a child against `target`, while a `loadgen churn` child writes.
pub async fn run_client(
    exe: &Path,
    client: OneClient,
    target: &Target<'_>,
    settle_seconds: f64,
    streaming_lists: bool,
) -> Result<ClientReport, String> {
    let run = format!("e2e-{}-{}", std::process::id(), client.name());
    let seen = seen_path(client);
    let record: PathBuf = seen.with_extension("record");
    let mut churn = spawn_held(exe, target, &run, &record)?;
    let mut churn_lines = crate::kube_churn::lines(&mut churn);
    match tokio::time::timeout(SYNC_TIMEOUT, churn_lines.recv()).await {
        Ok(Some(line)) if line == "populated" => {}
        other => {
            end_child(churn).await;
            let _ = cleanup(exe, target, &run).await;
            return Err(match other {
                Ok(Some(line)) => format!("expected `populated` from the churn, got {line:?}"),
                Ok(None) => {
                    "the churn ended before it populated the namespace (its error is above)".into()
                }
                Err(_) => format!(
                    "the churn did not populate within {} s",
                    SYNC_TIMEOUT.as_secs()
                ),
            });
        }
    }
    let result = measure(
        exe,
        client,
        target,
        settle_seconds,
        streaming_lists,
        churn,
        &seen,
        &record,
    )
    .await;
    let _ = std::fs::remove_file(&seen);
    let _ = std::fs::remove_file(&record);
    let cleaned = cleanup(exe, target, &run).await;
    let report = result?;
    cleaned.map(|()| report)
}

/// The client's part of a row, once the churn holds after its population.
#[allow(clippy::too_many_arguments)]
async fn measure(
    exe: &Path,
    client: OneClient,
    target: &Target<'_>,
    settle_seconds: f64,
    streaming_lists: bool,
    mut churn: std::process::Child,
    seen: &Path,
    record: &Path,
) -> Result<ClientReport, String> {
    let mut child = match Command::new(exe)
        .arg("e2e-client")
        .args(["--url", target.url, "--client", client.name()])
        .args(["--settle-seconds", &settle_seconds.to_string()])
        .args(streaming_lists.then_some("--streaming-lists"))
        .arg("--seen")
        .arg(seen)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            end_child(churn).await;
            return Err(format!("cannot start {} e2e-client: {e}", exe.display()));
        }
    };
    let mut lines = crate::kube_churn::lines(&mut child);
    let synced = tokio::time::timeout(SYNC_TIMEOUT, lines.recv()).await;
    if !matches!(&synced, Ok(Some(line)) if line == "synced") {
        end_child(child).await;
        end_child(churn).await;
        return Err(match synced {
            Ok(Some(line)) => format!("expected `synced` from the client, got {line:?}"),
            Ok(None) => "the client process ended before it synced (its error is above)".into(),
            Err(_) => format!(
                "the client did not sync within {} s",
                SYNC_TIMEOUT.as_secs()
            ),
        });
    }
    // The go-ahead: the churn's updates, deletes and creates, at the offered rate.
    let go = churn.stdin.take().map(|mut stdin| stdin.write_all(b"go\n"));
    let churn_start = Instant::now();
    let status = wait_child(churn).await?;
    let churn_seconds = churn_start.elapsed().as_secs_f64();
    if !matches!(go, Some(Ok(()))) || !status.success() {
        end_child(child).await;
        return Err(format!(
            "the churn ended with {status} (its error is above)"
        ));
    }
    let returned = read_record(record)?;
    let last = returned.keys().max().copied();
    let churned = match last {
        Some(rv) => format!("churned {rv}\n"),
        None => "churned\n".to_owned(),
    };
    let outcome = client_report(child, &mut lines, &churned).await?;
    let events =
        read_seen(&seen.to_path_buf()).map_err(|e| format!("reading {}: {e}", seen.display()))?;
    let mut lags = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
        .map_err(|e| format!("histogram: {e}"))?;
    for &(rv, at) in &events {
        if let Some(&written) = returned.get(&rv) {
            lags.saturating_record(at.saturating_sub(written) / 1_000);
        }
    }
    Ok(ClientReport {
        client: client.name(),
        received: outcome.received,
        applied: outcome.applied,
        churn_seconds,
        lag_us: (
            lags.value_at_quantile(0.5),
            lags.value_at_quantile(0.99),
            lags.max(),
        ),
        peak_bytes: outcome.peak_bytes,
        bytes_per_pod: None,
        client_cpu_seconds: outcome.cpu_seconds,
        client_sync_cpu_seconds: outcome.sync_cpu_seconds,
        server_cpu_seconds: None,
        client_cpu_us_per_event: crate::measure::cpu::cpu_figures(
            outcome.cpu_seconds.map(std::time::Duration::from_secs_f64),
            outcome.received,
        )
        .1,
        server_cpu_us_per_event: None,
        settle_seconds: outcome.settle_seconds,
        ok: outcome.ok,
        pods: (outcome.served, outcome.cached),
    })
}
