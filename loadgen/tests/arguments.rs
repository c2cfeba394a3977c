//! Command-line arguments that would make a run other than the one asked for.
//!
//! `--shards` takes a power of two from 1 to 65536 in every command, and refuses anything else
//! with a usage error (exit code 2) before any work starts: the engine would otherwise round
//! the count quietly and report a run that was not the one asked for. `--consumers 0` is
//! refused the same way.

#![forbid(unsafe_code)]

mod common;

/// Each command's required arguments, to which `--shards N` is appended.
const COMMANDS: [&[&str]; 5] = [
    &["ops", "--engine", "sharded"],
    &["run", "--workload", "w1"],
    &["compare", "--quick"],
    &["capacity", "--workload", "w1"],
    &["replay", "--trace", "testdata/watch-pods.json"],
];

/// Runs `command` with `extra` and asserts that clap refuses it (exit 2) saying `message`.
fn refused(command: &[&str], extra: &[&str], message: &str) -> std::process::Output {
    let args: Vec<&str> = command.iter().chain(extra).copied().collect();
    let output = common::run_loadgen(&args, b"");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(stderr.contains(message), "{args:?}: {stderr}");
    output
}

#[test]
fn zero_non_powers_of_two_and_too_many_shards_are_refused_everywhere() {
    for command in COMMANDS {
        for shards in ["0", "3", "12", "131072", "-4", "many"] {
            // `--shards=-4`: a separate `-4` would be read as an unknown flag.
            let flag = format!("--shards={shards}");
            let output = refused(
                command,
                &[&flag],
                "--shards must be a power of two between 1 and 65536",
            );
            assert!(output.stdout.is_empty(), "{command:?} {flag}: nothing ran");
        }
    }
}

#[test]
fn the_bounds_themselves_are_accepted() {
    let trace = br#"{"op":"add","obj":{"key":"ns/a","v":1}}
{"op":"pop"}
"#;
    for shards in ["1", "65536"] {
        let output =
            common::run_loadgen(&["ops", "--engine", "sharded", "--shards", shards], trace);
        assert_eq!(
            output.status.code(),
            Some(0),
            "--shards {shards}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(output.stdout.iter().filter(|&&b| b == b'\n').count(), 1);
    }
}

#[test]
fn zero_consumers_are_refused_everywhere() {
    for command in &COMMANDS[1..] {
        refused(
            command,
            &["--consumers", "0"],
            "--consumers must be a whole number of at least 1",
        );
    }
}
