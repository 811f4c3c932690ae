//! The crate's one `unsafe` exception, reviewed: `fork(2)` in the sandbox trampoline, so that
//! the init of a call's namespaces is the trampoline itself rather than a second start of its
//! binary (a program start is most of what an unconfined call costs; see `docs/sandbox.md`).
//!
//! Why it is sound: after `fork` only the calling thread exists in the child, so a lock another
//! thread held (the allocator's, stdio's) would stay locked there forever. [`fork`] therefore
//! forks only a process that has exactly one thread — the trampoline, which runs first thing in
//! `main`, before any runtime or thread exists — and says so when it has more, so its caller
//! starts a fresh process instead. With one thread the child is an exact copy in which every
//! Rust invariant holds. Nothing is buffered in stdout when the trampoline forks (it has printed
//! nothing), so nothing is written twice. rustix offers `fork` only as an experimental runtime
//! API, hence `libc`.

#![allow(unsafe_code)]

use rustix::process::Pid;

/// Which side of the fork this is.
pub(super) enum Forked {
    /// The new process.
    Child,
    /// This process; the pid is the child's.
    Parent(Pid),
}

/// Forks this process when it is single-threaded; `Err` (with why) when it is not or the kernel
/// refuses.
pub(super) fn fork() -> Result<Forked, String> {
    let threads = std::fs::read_dir("/proc/self/task")
        .map_err(|e| format!("cannot count this process's threads: {e}"))?
        .count();
    if threads != 1 {
        return Err(format!(
            "{threads} threads: only a single-threaded process forks"
        ));
    }
    // SAFETY: the process has one thread (checked just above; the trampoline starts none), so
    // the child is a complete copy with no lock held by a thread that does not exist there.
    let pid = unsafe { libc::fork() };
    match pid {
        0 => Ok(Forked::Child),
        n if n > 0 => Pid::from_raw(n)
            .map(Forked::Parent)
            .ok_or_else(|| format!("fork returned pid {n}")),
        _ => Err(format!("fork: {}", std::io::Error::last_os_error())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_with_more_than_one_thread_is_never_forked() {
        // The test harness runs this on a thread of its own; one more makes sure.
        let (stop, parked) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || parked.recv());
        match fork() {
            Err(why) => assert!(why.contains("threads"), "{why}"),
            Ok(_) => panic!("a multi-threaded process was forked"),
        }
        stop.send(()).unwrap();
        other.join().unwrap().unwrap();
    }
}
