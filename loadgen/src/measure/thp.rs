//! Keeps mimalloc from asking for transparent huge pages, whose faults stall the consumer.
//!
//! mimalloc 3 advises the kernel (`madvise(MADV_HUGEPAGE)`) to back its arenas with 2 MiB
//! transparent huge pages. With the common kernel setting `defrag = madvise`, the first touch of
//! each such 2 MiB region then allocates, zeroes and if need be *compacts memory for* a huge
//! page synchronously, in the faulting thread: milliseconds each on a busy machine. An engine
//! whose tables grow in many medium allocations (the sharded indexer's 64 shards, an index set
//! per value) touches fresh arena memory at every doubling, and its consumer stalled there:
//! measured in thread CPU time on W1 at 1M keys (results/BENCHMARKS.md, "Large clusters"),
//! 89 operations took over 1 ms (493 ms together) with huge pages, 8 (23 ms) without.
//!
//! mimalloc reads its options from the environment once, when the process loads, so the only
//! way to turn the advice off from inside is to start again with `MIMALLOC_ALLOW_THP=0` set:
//! [`reexec_without_thp`] replaces this process by the same command line with it (child
//! processes inherit it). A value the user set is left alone.

use std::ffi::OsString;

/// The mimalloc option that turns its huge-page advice off (`0`).
pub const ENV: &str = "MIMALLOC_ALLOW_THP";

/// Replaces this process by itself with [`ENV`] set to `0`, unless the variable is already
/// set. Returns only if it is set or the exec failed (then the run goes on with huge pages
/// and a note on stderr).
pub fn reexec_without_thp() {
    if std::env::var_os(ENV).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let error = exec(&exe, &args);
    eprintln!("loadgen: could not restart with {ENV}=0 ({error}); huge-page faults may stall runs");
}

#[cfg(unix)]
fn exec(exe: &std::path::Path, args: &[OsString]) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(exe)
        .args(args)
        .env(ENV, "0")
        .exec()
}

#[cfg(not(unix))]
fn exec(_exe: &std::path::Path, _args: &[OsString]) -> std::io::Error {
    std::io::Error::other("not a Unix system")
}
