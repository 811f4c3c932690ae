//! Hardening of the engine process itself, applied once at start-up.
//!
//! [`close_inherited_fds`] marks every descriptor above stderr **close-on-exec**: whatever the
//! engine's launcher left open (a CI runner's log, `Popen(close_fds=False)`, a socket passed by
//! socket activation, a shell's `3>log`) never reaches a child — a bash command, an MCP stdio
//! server, a hook. The engine's own descriptors are opened close-on-exec already (Rust's
//! standard library does so), so after this call only stdin, stdout and stderr pass to a child,
//! and what a spawn sets up for it on purpose. The CLI calls it first thing; an embedder calls it
//! early in its own `main` (the library does not, unasked: an embedder may hand descriptors of
//! its own to its children, a `make` jobserver for one). The sandbox's trampoline does the same
//! for itself whatever the embedder did, so a sandboxed bash command gets only 0, 1 and 2.
//!
//! [`harden_current_process`] marks the engine **non-dumpable** (`prctl(PR_SET_DUMPABLE, 0)`):
//! no core dumps, and its `/proc/<pid>/` files (`environ`, `mem`, `maps`, `fd/`, …) become owned
//! by root and refuse `ptrace` access. For an engine running as an ordinary user, that stops
//! every other process of the same user — a `bash` child included — from reading the engine's
//! environment block (its API keys) through `/proc/<engine pid>/environ` or `ps eww`.
//!
//! For an engine running as **root** it is not enough: root children keep `CAP_SYS_PTRACE` and
//! `CAP_DAC_OVERRIDE` and read a non-dumpable process's `/proc` files anyway. There the `bash`
//! tool's PID and mount namespaces do the job (see [`crate::tools::bash`]): a command cannot see
//! the engine's process at all. Both layers are meant to be on; neither replaces the environment
//! allowlist of the children.

use std::io;

use rustix::process::{DumpableBehavior, dumpable_behavior, set_dumpable_behavior};

/// Marks the current process non-dumpable (Linux). Call it once, early in `main`, before any
/// child process is started. Idempotent.
pub fn harden_current_process() -> io::Result<()> {
    set_dumpable_behavior(DumpableBehavior::NotDumpable)?;
    Ok(())
}

/// Marks every descriptor numbered 3 or above close-on-exec (`close_range` with
/// `CLOSE_RANGE_CLOEXEC`, or a walk of `/proc/self/fd` on older kernels). The descriptors stay
/// open and usable in this process; no child started afterwards inherits one. Call it early in
/// `main`. Idempotent, and safe with other threads running (it closes nothing).
pub fn close_inherited_fds() {
    INHERITED.get_or_init(|| close_fds::iter_open_fds_threadsafe(3).collect());
    close_fds::set_fds_cloexec_threadsafe(3, &[]);
}

/// The descriptors above stderr that were open when [`close_inherited_fds`] first ran.
static INHERITED: std::sync::OnceLock<Vec<i32>> = std::sync::OnceLock::new();

/// True when descriptor `fd` was open when [`close_inherited_fds`] first ran — one the process
/// inherited from its launcher (when that ran first thing in `main`), not one it opened itself
/// since (an async runtime's, a socket's). False before that call, and for 0, 1 and 2.
pub fn was_inherited(fd: i32) -> bool {
    INHERITED.get().is_some_and(|fds| fds.contains(&fd))
}

/// True once [`close_inherited_fds`] has run (and so [`was_inherited`] knows the answer).
pub fn inherited_known() -> bool {
    INHERITED.get().is_some()
}

/// True when the current process is marked non-dumpable.
pub fn is_hardened() -> bool {
    matches!(dumpable_behavior(), Ok(DumpableBehavior::NotDumpable))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inherited_descriptors_become_close_on_exec() {
        use rustix::io::{FdFlags, fcntl_getfd};
        // Opened without O_CLOEXEC, as a launcher's descriptor would be.
        let fd = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDONLY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        assert!(!fcntl_getfd(&fd).unwrap().contains(FdFlags::CLOEXEC));
        close_inherited_fds();
        assert!(fcntl_getfd(&fd).unwrap().contains(FdFlags::CLOEXEC));
    }

    #[test]
    fn hardening_marks_the_process_non_dumpable() {
        // The unit-test binary is its own process; marking it non-dumpable harms nothing.
        harden_current_process().unwrap();
        assert!(is_hardened());
        harden_current_process().unwrap();
        assert!(is_hardened());
    }
}
