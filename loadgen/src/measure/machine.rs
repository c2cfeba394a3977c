//! What machine a result was measured on: a results page states it (STYLE: "a results page
//! that states the machine").

use std::process::Command;

use serde::Serialize;

/// The machine, toolchain and build a comparison ran on. Unknown fields are `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Machine {
    /// CPU model (`model name` in `/proc/cpuinfo`).
    pub cpu: Option<String>,
    /// Cores this process may use.
    pub cores: usize,
    /// `rustc -V`.
    pub rustc: Option<String>,
    /// `git rev-parse --short HEAD` of the source tree, with `-dirty` when it has changes.
    pub commit: Option<String>,
    /// The global allocator of this build.
    pub allocator: &'static str,
    /// How keys are hashed.
    pub hasher: &'static str,
    /// `release` or `debug`.
    pub profile: &'static str,
    /// Operating system and kernel release.
    pub os: String,
}

impl Machine {
    /// Looks everything up (runs `rustc -V` and `git`, reads `/proc`).
    pub fn detect() -> Self {
        Self {
            cpu: cpu_model(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            rustc: command_output("rustc", &["-V"]),
            commit: git_commit(),
            allocator: if cfg!(feature = "mimalloc") {
                "mimalloc"
            } else {
                "system"
            },
            hasher: "ahash 0.8, fixed seeds, computed once per Key",
            profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            os: format!(
                "{} {}",
                std::env::consts::OS,
                std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .map(|s| s.trim().to_string())
                    .unwrap_or_default()
            )
            .trim()
            .to_string(),
        }
    }
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!text.is_empty()).then_some(text)
}

/// The commit of the source tree this binary was built from (not of the working directory,
/// which may be anywhere).
fn git_commit() -> Option<String> {
    let tree = env!("CARGO_MANIFEST_DIR");
    let commit = command_output("git", &["-C", tree, "rev-parse", "--short", "HEAD"])?;
    let dirty = command_output(
        "git",
        &["-C", tree, "status", "--porcelain", "--untracked-files=no"],
    )
    .is_some();
    Some(if dirty {
        format!("{commit}-dirty")
    } else {
        commit
    })
}

/// The command line as anyone can rerun it from the repository (the binary's own path is
/// local to the machine), shell-quoted where needed.
pub fn command_line() -> String {
    let args = std::env::args().skip(1).map(|a| {
        if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)) {
            format!("'{}'", a.replace('\'', r"'\''"))
        } else {
            a
        }
    });
    std::iter::once("cargo run --release -p loadgen --".to_string())
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}
