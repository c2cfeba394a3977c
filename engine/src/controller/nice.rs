//! Lowering a worker thread's scheduling priority
//! ([`ControllerBuilder::worker_nice`](super::ControllerBuilder::worker_nice)).
//!
//! On a machine with fewer cores than busy threads, CPU-bound reconciles compete with the
//! informer's reflector and consumers for the cores, and the informer falls behind: events
//! wait before their keys even reach the workqueue, where priorities would have put them
//! first. A worker at a higher `nice` value yields to them. Raising one's own niceness needs
//! no privilege; lowering it back does, so this only ever raises it.

use std::io;

/// Raises the calling thread's `nice` value to `nice` (0..=19); Linux only.
#[cfg(target_os = "linux")]
pub(crate) fn lower_this_thread(nice: i32) -> io::Result<()> {
    // Safety: `gettid` takes no argument and returns the caller's thread id; it cannot fail
    // and touches no memory of ours.
    let tid = unsafe { libc::gettid() };
    let tid = libc::id_t::try_from(tid).map_err(|_| io::Error::other("negative thread id"))?;
    // Safety: `setpriority` takes three integers and reads or writes no memory of ours; on
    // Linux, `PRIO_PROCESS` with a thread id sets that one thread's nice value.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Elsewhere, thread priorities are not per thread in the same way: not supported.
#[cfg(not(target_os = "linux"))]
pub(crate) fn lower_this_thread(_nice: i32) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "worker_nice needs Linux (setpriority on a thread id)",
    ))
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// This thread's nice value, read from procfs (field 19 of `/proc/thread-self/stat`).
    fn nice_of_this_thread() -> i32 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
        // The command name (field 2) may hold spaces: count from the `)` that ends it.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        after.split(' ').nth(16).unwrap().parse().unwrap()
    }

    #[test]
    fn a_thread_lowers_its_own_priority_and_no_other() {
        let before = nice_of_this_thread();
        let target = (before + 5).min(19);
        let lowered = std::thread::spawn(move || {
            lower_this_thread(target).unwrap();
            nice_of_this_thread()
        })
        .join()
        .unwrap();
        assert_eq!(lowered, target);
        assert_eq!(nice_of_this_thread(), before, "only the calling thread");
    }
}
