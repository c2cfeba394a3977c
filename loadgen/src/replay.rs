//! `loadgen replay` (not built yet: see the issue that builds it).

use std::process::ExitCode;

/// Arguments of `loadgen replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {}

/// Runs `loadgen replay`.
pub fn main(_args: ReplayArgs) -> ExitCode {
    eprintln!("loadgen replay: not built yet");
    ExitCode::from(2)
}
