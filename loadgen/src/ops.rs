//! `loadgen ops` (not built yet: see the issue that builds it).

use std::process::ExitCode;

/// Arguments of `loadgen ops`.
#[derive(Debug, clap::Args)]
pub struct OpsArgs {}

/// Runs `loadgen ops`.
pub fn main(_args: OpsArgs) -> ExitCode {
    eprintln!("loadgen ops: not built yet");
    ExitCode::from(2)
}
