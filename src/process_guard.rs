//! Hardening of the engine process itself, applied once at start-up.
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

/// True when the current process is marked non-dumpable.
pub fn is_hardened() -> bool {
    matches!(dumpable_behavior(), Ok(DumpableBehavior::NotDumpable))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardening_marks_the_process_non_dumpable() {
        // The unit-test binary is its own process; marking it non-dumpable harms nothing.
        harden_current_process().unwrap();
        assert!(is_hardened());
        harden_current_process().unwrap();
        assert!(is_hardened());
    }
}
