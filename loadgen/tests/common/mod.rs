//! Helpers shared by the integration tests that drive the `loadgen` binary.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Runs the `loadgen` binary with `args`, feeding it `stdin`, and returns what it wrote.
pub fn run_loadgen(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the loadgen binary starts");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    let input = stdin.to_vec();
    // Written from another thread so a large output can never deadlock against the input.
    let writer = std::thread::spawn(move || pipe.write_all(&input));
    let output = child.wait_with_output().expect("loadgen runs");
    // The child may stop reading early (a malformed line); a broken pipe is then expected.
    let _ = writer.join();
    output
}
