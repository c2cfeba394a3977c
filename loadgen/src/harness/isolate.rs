//! One engine run per child process, so that memory figures are honest.
//!
//! An allocator keeps memory that a finished run freed (mimalloc purges after a delay, and
//! pages of exited threads stay cached), and the next run in the same process reuses it
//! without raising the resident size: its "peak memory added" would read near zero. A child
//! process per engine starts clean. The parent hands the child its row as JSON on stdin (a
//! [`RunSpec`](crate::runner::run_spec::RunSpec): see that module for why stdin) and starts it as the
//! hidden `loadgen child`; the child regenerates the workload from the same seed, so every
//! engine still sees exactly the same events, and writes its results as JSON to a temporary
//! file, which the parent reads back.
//!
//! [`run_each`] is the one place that decides, for `run`, `compare` and `replay` alike, whether
//! the engines run here or in children.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

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

/// What a child writes to its report file: `{"results": [...]}`.
#[derive(Serialize, Deserialize)]
pub struct ChildReport {
    /// The child's rows.
    pub results: Vec<RunResult>,
}

/// A report file name no other child of any loadgen process uses.
fn report_path() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("loadgen-{}-{n}.json", std::process::id()))
}

/// Runs `spec` in a child `loadgen child` (the spec as JSON on its stdin), with stderr shared
/// so its progress shows, and returns the results it reported. A failed verdict (exit 1) is a
/// result, not an error.
pub fn run_child(spec: &impl Serialize) -> Result<Vec<RunResult>, IsolateError> {
    run_child_with(spec, false)
}

/// [`run_child`], with the child's stderr captured instead of shown: for a command that draws
/// a progress bar of its own over many children (`capacity`). The child's stderr is shown only
/// in the error when it fails.
pub fn run_child_quietly(spec: &impl Serialize) -> Result<Vec<RunResult>, IsolateError> {
    run_child_with(spec, true)
}

fn run_child_with(spec: &impl Serialize, quiet: bool) -> Result<Vec<RunResult>, IsolateError> {
    let path = report_path();
    let json = serde_json::to_string(spec).expect("a run spec serialises");
    let command = format!("loadgen child --report {} <<< '{json}'", path.display());
    let spawn_error = |source| IsolateError::Spawn {
        command: command.clone(),
        source,
    };
    let exe = std::env::current_exe().map_err(spawn_error)?;
    let mut child = Command::new(exe)
        .arg("child")
        .arg("--report")
        .arg(&path)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(if quiet {
            Stdio::piped()
        } else {
            Stdio::inherit()
        })
        .spawn()
        .map_err(spawn_error)?;
    // A child that dies before reading its spec fails below with its own exit status.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(json.as_bytes());
    }
    let output = child.wait_with_output().map_err(spawn_error)?;
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

/// Runs `specs` (one row of a run each) and returns their results in order: here, through
/// `here`, when there is only one or `in_process` is set; otherwise each in a child process of
/// its own ([`run_child`]), which runs that one row in-process.
pub fn run_each<S: Serialize, E: From<IsolateError>>(
    specs: &[S],
    in_process: bool,
    here: impl FnOnce(&[S]) -> Result<Vec<RunResult>, E>,
) -> Result<Vec<RunResult>, E> {
    if specs.len() <= 1 || in_process {
        return here(specs);
    }
    let mut results = Vec::with_capacity(specs.len());
    for spec in specs {
        results.extend(run_child(spec)?);
    }
    Ok(results)
}
