//! `loadgen compare` (not built yet: see the issue that builds it).

use std::process::ExitCode;

/// Arguments of `loadgen compare`.
#[derive(Debug, clap::Args)]
pub struct CompareArgs {}

/// Runs `loadgen compare`.
pub fn main(_args: CompareArgs) -> ExitCode {
    eprintln!("loadgen compare: not built yet");
    ExitCode::from(2)
}
