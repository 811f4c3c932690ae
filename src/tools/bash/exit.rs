//! How a command's end is read: an exit status (a successful result with `[exit code: N]`) or a
//! death by signal (an `execution_error` naming the signal), told apart without mistaking
//! `exit 137` for a SIGKILL.

use std::os::unix::process::ExitStatusExt;

/// The signal that killed the command's shell, if one did.
///
/// The rule, chosen so that a plain exit status is never mistaken for a death: in direct mode
/// the shell is our child and its wait status says whether a signal ended it. In namespace mode
/// our child is `unshare`, whose child, the init shell, exits with `128 + N` when the command's
/// shell died by signal N — a status any program can also exit with (`exit 137`). So there the
/// status counts only together with the init's job notice (`Killed`, `Terminated`, …), which
/// bash prints only for a child that really died by a signal (not for SIGINT or SIGPIPE, which
/// stay plain exit codes). A shell that exits with `128 + N` because a command *it* ran was
/// killed is a plain exit status too (`[exit code: 137]`): bash runs the last command of a
/// command line in place of itself, so a program killed there (the OOM killer's usual victim)
/// is the shell's own death.
pub(super) fn death_signal(
    status: std::process::ExitStatus,
    init_notice: Option<&[u8]>,
) -> Option<i32> {
    if let Some(signal) = status.signal() {
        return Some(signal);
    }
    let code = status.code()?;
    let noticed = init_notice.is_some_and(|n| !n.trim_ascii().is_empty());
    (code > 128 && noticed).then_some(code - 128)
}

/// `killed by SIGKILL`, `killed by SIGSEGV`, `killed by signal 40`. A kill by the OOM killer is
/// said by the sandbox, which knows it (the call's memory cgroup counted it), never guessed
/// from the signal.
pub(super) fn killed_by(signal: i32) -> String {
    const NAMES: [&str; 32] = [
        "",
        "SIGHUP",
        "SIGINT",
        "SIGQUIT",
        "SIGILL",
        "SIGTRAP",
        "SIGABRT",
        "SIGBUS",
        "SIGFPE",
        "SIGKILL",
        "SIGUSR1",
        "SIGSEGV",
        "SIGUSR2",
        "SIGPIPE",
        "SIGALRM",
        "SIGTERM",
        "SIGSTKFLT",
        "SIGCHLD",
        "SIGCONT",
        "SIGSTOP",
        "SIGTSTP",
        "SIGTTIN",
        "SIGTTOU",
        "SIGURG",
        "SIGXCPU",
        "SIGXFSZ",
        "SIGVTALRM",
        "SIGPROF",
        "SIGWINCH",
        "SIGIO",
        "SIGPWR",
        "SIGSYS",
    ];
    match usize::try_from(signal).ok().and_then(|i| NAMES.get(i)) {
        Some(name) if !name.is_empty() => format!("killed by {name}"),
        _ => format!("killed by signal {signal}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::ExitStatus;

    #[test]
    fn only_a_real_signal_or_a_noticed_128_plus_n_is_a_death() {
        let killed = ExitStatus::from_raw(9); // wait status: terminated by signal 9
        let exit_137 = ExitStatus::from_raw(137 << 8); // wait status: exited with 137
        assert_eq!(death_signal(killed, None), Some(9));
        assert_eq!(death_signal(exit_137, None), None);
        assert_eq!(death_signal(exit_137, Some(b"")), None);
        assert_eq!(death_signal(exit_137, Some(b"line 1: 2 Killed\n")), Some(9));
        // A notice with a status that is no 128 + N (cannot happen; never a guess).
        assert_eq!(
            death_signal(ExitStatus::from_raw(3 << 8), Some(b"Killed")),
            None
        );
    }

    #[test]
    fn signals_are_named() {
        assert_eq!(killed_by(9), "killed by SIGKILL");
        assert_eq!(killed_by(11), "killed by SIGSEGV");
        assert_eq!(killed_by(40), "killed by signal 40");
    }
}
