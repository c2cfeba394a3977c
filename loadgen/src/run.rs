//! `loadgen run` (not built yet: see the issue that builds it).

use std::process::ExitCode;

/// Arguments of `loadgen run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {}

/// Runs `loadgen run`.
pub fn main(_args: RunArgs) -> ExitCode {
    eprintln!("loadgen run: not built yet");
    ExitCode::from(2)
}
