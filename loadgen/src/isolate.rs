//! One engine run per child process, so that memory figures are honest.
//!
//! An allocator keeps memory that a finished run freed (mimalloc purges after a delay, and
//! pages of exited threads stay cached), and the next run in the same process reuses it
//! without raising the resident size: its "peak memory added" would read near zero. A child
//! process per engine starts clean. It regenerates the workload from the same seed, so every
//! engine still sees exactly the same events; the child writes its results as JSON to a
//! temporary file, which the parent reads back.
//!
//! [`run_each`] is the one place that decides, for `run`, `compare` and `replay` alike, whether
//! the engines run here or in children.

use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;

use crate::result::RunResult;

/// A child run could not be started or did not report.
#[derive(Debug, thiserror::Error)]
pub enum IsolateError {
    /// The loadgen binary could not be found or started.
    #[error("cannot start a child loadgen ({command}): {source}; `--in-process` avoids children")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The child failed without results (its error is on stderr above, or in `stderr`).
    #[error("child loadgen failed with {status}: {command}{stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// How it ended.
        status: ExitStatus,
        /// What the child wrote on stderr, when it was captured (a newline first); empty when
        /// it went to this process's stderr.
        stderr: String,
    },
    /// The child's report could not be read.
    #[error("cannot read the child's report {path}: {message}")]
    Report {
        /// The temporary report file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

#[derive(Deserialize)]
struct ChildReport {
    results: Vec<RunResult>,
}

/// A report file name no other child of any loadgen process uses.
fn report_path() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("loadgen-{}-{n}.json", std::process::id()))
}

/// Runs this loadgen binary with `args` (a `run` or `replay` command line without `--json`),
/// with stderr shared so its progress shows, and returns the results it reported. A failed
/// verdict (exit 1) is a result, not an error.
pub fn run_child(args: &[String]) -> Result<Vec<RunResult>, IsolateError> {
    run_child_with(args, false)
}

/// [`run_child`], with the child's stderr captured instead of shown: for a command that draws
/// a progress bar of its own over many children (`capacity`). The child's stderr is shown only
/// in the error when it fails.
pub fn run_child_quietly(args: &[String]) -> Result<Vec<RunResult>, IsolateError> {
    run_child_with(args, true)
}

fn run_child_with(args: &[String], quiet: bool) -> Result<Vec<RunResult>, IsolateError> {
    let path = report_path();
    let command = format!("loadgen {} --json {}", args.join(" "), path.display());
    let exe = std::env::current_exe().map_err(|source| IsolateError::Spawn {
        command: command.clone(),
        source,
    })?;
    let output = Command::new(exe)
        .args(args)
        .arg("--json")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if quiet {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .output()
        .map_err(|source| IsolateError::Spawn {
            command: command.clone(),
            source,
        })?;
    let status = output.status;
    if !matches!(status.code(), Some(0 | 1)) {
        let _ = std::fs::remove_file(&path);
        let said = String::from_utf8_lossy(&output.stderr);
        let stderr = if said.trim().is_empty() {
            String::new()
        } else {
            format!("\n{}", said.trim_end())
        };
        return Err(IsolateError::Failed {
            command,
            status,
            stderr,
        });
    }
    let text = std::fs::read_to_string(&path);
    let _ = std::fs::remove_file(&path);
    let report: ChildReport = text
        .map_err(|e| e.to_string())
        .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        .map_err(|message| IsolateError::Report {
            path: path.clone(),
            message,
        })?;
    Ok(report.results)
}

/// Runs `engines` for one command and returns their results in order: here, through `here`,
/// when there is only one engine or `in_process` is set; otherwise each engine in a child
/// process of its own, started with `child_args(engine)` (a command line that runs that one
/// engine with `--in-process`, so the child does not spawn children of its own).
///
/// An "engine" is usually an [`EngineKind`](crate::engines::EngineKind); a run through the
/// in-memory server also runs the harness floor as one
/// ([`Subject`](crate::harness_floor::Subject)).
pub fn run_each<T: Copy, E: From<IsolateError>>(
    engines: &[T],
    in_process: bool,
    child_args: impl Fn(T) -> Vec<String>,
    here: impl FnOnce(&[T]) -> Result<Vec<RunResult>, E>,
) -> Result<Vec<RunResult>, E> {
    if engines.len() <= 1 || in_process {
        return here(engines);
    }
    let mut results = Vec::with_capacity(engines.len());
    for &engine in engines {
        results.extend(run_child(&child_args(engine))?);
    }
    Ok(results)
}
