//! `loadgen child --report FILE`: one row of a run, in a process of its own (hidden; started by
//! [`isolate`](crate::harness::isolate)). It reads a [`RunSpec`] as JSON from stdin, runs it here
//! ([`execute_here`]) and writes `{"results": [...]}` to `FILE`. Exit code 0 when the verdict
//! is ok, 1 when it failed (a result all the same), 2 when it could not run.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::harness::isolate::ChildReport;
use crate::reports::report::{finish, refuse, write_json};
use crate::runner::run_spec::{execute_here, RunSpec};
use crate::ui::Ui;

/// Arguments of `loadgen child`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    /// Where to write the results.
    #[arg(long)]
    pub report: PathBuf,
}

/// Runs `loadgen child`.
pub fn main(args: ChildArgs) -> ExitCode {
    let mut json = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut json) {
        return refuse("child", format!("cannot read the run spec on stdin: {e}"));
    }
    let spec: RunSpec = match serde_json::from_str(&json) {
        Ok(spec) => spec,
        Err(e) => return refuse("child", format!("not a run spec: {e}")),
    };
    let results = match spec
        .check()
        .and_then(|()| execute_here(&[spec], Ui::detect()))
    {
        Ok(results) => results,
        Err(e) => return refuse("child", e),
    };
    // As `run` ends: failed verdicts on stderr, exit code 1 when one failed.
    finish("child", "", &results, || {
        write_json(
            &args.report,
            &ChildReport {
                results: results.clone(),
            },
        )
        .map_err(|e| e.to_string())
    })
}
