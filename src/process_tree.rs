//! The process tree of one external command — a `bash` call, a hook — and how nothing of it
//! outlives its end, whatever the command does (`setsid`, double forks, daemons).
//!
//! * **A PID namespace when the system allows it** ([`Launcher::Namespaces`]): the command runs as
//!   `unshare --pid --fork --mount-proc --kill-child …` (with `--user --map-root-user` when plain
//!   `unshare` is refused), so when the namespace's init ends the kernel kills every process left
//!   in it, including those that left the process group. Probed once per [`ProcessTree`].
//! * **A process group** led by the first process, killed (`SIGKILL`) when the command ends for
//!   any reason ([`GroupKiller`], also on drop).
//! * **A sweep, where namespaces are unavailable** ([`Launcher::Direct`]): the command's
//!   environment carries a private token ([`CALL_TOKEN_VAR`]), and every process whose environment
//!   still holds it is stopped and killed once the command ends ([`sweep`]).
//!
//! The bash tool adds the OS sandbox on top when the engine has one (its trampoline joins the
//! call's cgroups and sets the parent-death signal, see `crate::sandbox`); with `--sandbox off`
//! it still starts its commands through the trampoline, which makes the namespaces this
//! launcher probed for and is their init, in place of `unshare` and an init shell. Hooks use the
//! launcher as it is.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process, kill_process_group};
use tokio::process::Command;
use tokio::sync::OnceCell;

/// Bound on the one-time namespace probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Direct mode only: the variable carrying a token unique to one command, used to find its
/// escaped processes.
pub const CALL_TOKEN_VAR: &str = "SWITCHBOARD_CALL_TOKEN";

/// Init of an unconfined call's PID namespace (pid 1; a sandboxed bash call's init is the trampoline,
/// see [`crate::sandbox`]): runs the command's shell as its child, so that shell is an ordinary
/// process (pid 2; `kill $$` works), and exits with its status. The init's own
/// stderr goes to the notice file named by its first argument, so its job notices ("Killed")
/// do not mix into the output but tell that the command's shell died by a signal (see
/// `crate::tools::bash`'s `death_signal`); the command's stderr is the real one.
pub const NAMESPACE_INIT: &str =
    r#"n=$1; shift; exec 3>&2 2>/dev/null; { "$@" 2>&3 3>&-; } 2>"$n"; exit $?"#;
/// Distinguishes the tokens of concurrent commands in direct mode.
static TOKEN_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Whether commands may be isolated in PID and mount namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Use namespaces when the system allows it (probed once per [`ProcessTree`]), else run the
    /// command directly and log a warning.
    #[default]
    Auto,
    /// Always run the command directly (the engine's environment is then protected only by
    /// [`crate::process_guard`] and file permissions, which do not stop a root child).
    Off,
}

/// How commands run, decided once (the first command) and kept.
#[derive(Debug, Default)]
pub struct ProcessTree {
    isolation: Isolation,
    launcher: OnceCell<Launcher>,
    /// `setsid(1)`, looked for once ([`ProcessTree::setsid`]).
    setsid: std::sync::OnceLock<Option<PathBuf>>,
}

impl ProcessTree {
    /// A tree with the given isolation; nothing is probed until the first command.
    pub fn new(isolation: Isolation) -> ProcessTree {
        ProcessTree {
            isolation,
            launcher: OnceCell::new(),
            setsid: std::sync::OnceLock::new(),
        }
    }

    /// `setsid` (util-linux) on the engine's `PATH`, looked for on first use: what
    /// [`Launcher::command_in_session`] starts a command with.
    pub fn setsid(&self) -> Option<&Path> {
        self.setsid
            .get_or_init(|| find_program("setsid"))
            .as_deref()
    }

    /// The launcher, probed on first use (`what` names the commands in the warning logged when
    /// namespaces are unavailable).
    pub async fn launcher(&self, what: &str) -> &Launcher {
        self.launcher
            .get_or_init(|| async {
                if self.isolation == Isolation::Off {
                    return Launcher::Direct;
                }
                let launcher = probe_launcher().await;
                if launcher == Launcher::Direct {
                    tracing::warn!(
                        "{what}: PID/mount namespaces are unavailable (unshare failed); commands \
                         run directly, a root command could read the engine's environment, and \
                         processes that leave the group are found by a sweep"
                    );
                }
                launcher
            })
            .await
    }
}

impl Launcher {
    /// A fresh token for one command in direct mode (`None` with namespaces, which need none).
    pub fn token(&self) -> Option<String> {
        match self {
            Launcher::Direct => Some(format!(
                "{}-{}",
                std::process::id(),
                TOKEN_COUNTER.fetch_add(1, Ordering::Relaxed)
            )),
            Launcher::Namespaces { .. } => None,
        }
    }

    /// `program` (with its arguments) under this launcher, leading a new process group and
    /// killed if dropped; the environment is the caller's to set, after which [`Launcher::mark`]
    /// adds the token.
    pub fn command(&self, program: &[OsString]) -> Command {
        let mut cmd = match self {
            Launcher::Namespaces { unshare, flags } => {
                let mut cmd = Command::new(unshare);
                cmd.args(flags).arg("--").args(program);
                cmd
            }
            Launcher::Direct => {
                let mut cmd = Command::new(&program[0]);
                cmd.args(&program[1..]);
                cmd
            }
        };
        cmd.process_group(0).kill_on_drop(true);
        cmd
    }

    /// [`Launcher::command`], but leading a session of its own, without the engine's
    /// controlling terminal (if it has one: `/dev/tty` then fails to open, with `ENXIO`): started
    /// through `setsid` (the path given, from [`ProcessTree::setsid`]), which calls `setsid(2)`
    /// and execs the rest — so the session's id, and its process group's, is the pid started,
    /// as with [`Launcher::command`]. Until `setsid` has run, the process is in the engine's
    /// group and a [`GroupKiller`] finds no group of its pid: kill the process itself too
    /// (`kill_on_drop` does). Without `setsid`, [`Launcher::command`] as it is.
    pub fn command_in_session(&self, program: &[OsString], setsid: Option<&Path>) -> Command {
        let Some(setsid) = setsid else {
            return self.command(program);
        };
        let mut cmd = Command::new(setsid);
        if let Launcher::Namespaces { unshare, flags } = self {
            cmd.arg(unshare).args(flags).arg("--");
        }
        cmd.args(program).kill_on_drop(true);
        cmd
    }

    /// `bash -c COMMAND` for [`Launcher::command`]: with namespaces, run by the init shell
    /// ([`NAMESPACE_INIT`], job notices to `/dev/null`) so the command's shell is pid 2 and
    /// `kill $$` works; directly, as is. A shell killed by signal N shows as exit status 128 + N.
    pub fn shell(&self, command: &str) -> Vec<OsString> {
        let mut program: Vec<OsString> = match self {
            Launcher::Namespaces { .. } => vec![
                "bash".into(),
                "-c".into(),
                NAMESPACE_INIT.into(),
                "switchboard-init".into(),
                "/dev/null".into(),
            ],
            Launcher::Direct => Vec::new(),
        };
        program.extend(["bash".into(), "-c".into(), command.into()]);
        program
    }

    /// Sets the direct mode's token in `cmd`'s environment.
    pub fn mark(cmd: &mut Command, token: Option<&str>) {
        if let Some(token) = token {
            cmd.env(CALL_TOKEN_VAR, token);
        }
    }
}

/// How commands actually run, decided once per tool instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Launcher {
    /// `<unshare> <flags…> bash -c …`: the command is init of fresh PID and mount namespaces.
    Namespaces {
        /// Absolute path of `unshare`.
        unshare: PathBuf,
        /// The flags that worked.
        flags: Vec<&'static str>,
    },
    /// `bash -c …` directly.
    Direct,
}

/// Finds out whether commands can run in fresh PID and mount namespaces, trying plain `unshare`
/// and then `unshare --user --map-root-user`. Runs a probe command (bounded by a few seconds)
/// that checks it is init of its namespace and that `/proc` shows that namespace.
pub async fn probe_launcher() -> Launcher {
    let Some(unshare) = find_program("unshare") else {
        return Launcher::Direct;
    };
    let base = ["--pid", "--fork", "--mount-proc", "--kill-child"];
    let with_user = [
        "--user",
        "--map-root-user",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
    ];
    for flags in [&base[..], &with_user[..]] {
        let mut cmd = Command::new(&unshare);
        cmd.args(flags)
            .arg("bash")
            .arg("-c")
            .arg(r#"read -r c < /proc/1/comm && [ "$$" = 1 ] && [ "$c" = bash ] && [ ! -e /proc/2 ]"#)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        if let Some(path) = std::env::var_os("PATH") {
            cmd.env("PATH", path);
        }
        let ok = match cmd.spawn() {
            Ok(mut child) => matches!(
                tokio::time::timeout(PROBE_TIMEOUT, child.wait()).await,
                Ok(Ok(status)) if status.success()
            ),
            Err(_) => false,
        };
        if ok {
            return Launcher::Namespaces {
                unshare,
                flags: flags.to_vec(),
            };
        }
    }
    Launcher::Direct
}

/// The first executable file named `name` on the engine's `PATH`.
fn find_program(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Direct mode: kills every process whose environment carries `token` (processes that left the
/// call's process group). Stops them first, scanning until no new one appears (a few passes at
/// most), so a forking process cannot outrun the sweep, then kills them all.
pub async fn sweep(token: String) {
    let job = tokio::task::spawn_blocking(move || sweep_now(&token));
    let _ = tokio::time::timeout(Duration::from_secs(2), job).await;
}

/// [`sweep`], blocking (for a `Drop`).
pub fn sweep_now(token: &str) {
    {
        let mut needle = CALL_TOKEN_VAR.as_bytes().to_vec();
        needle.push(b'=');
        needle.extend_from_slice(token.as_bytes());
        needle.push(0);
        let mut found: Vec<Pid> = Vec::new();
        for _ in 0..8 {
            let fresh: Vec<Pid> = carrying(&needle)
                .into_iter()
                .filter(|p| !found.contains(p))
                .collect();
            if fresh.is_empty() {
                break;
            }
            for pid in &fresh {
                let _ = kill_process(*pid, Signal::STOP);
            }
            found.extend(fresh);
        }
        for pid in found {
            let _ = kill_process(pid, Signal::KILL);
        }
    }
}

/// Pids of processes (other than this one) whose initial environment contains `needle`.
fn carrying(needle: &[u8]) -> Vec<Pid> {
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != own)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.windows(needle.len()).any(|w| w == needle))
        })
        .filter_map(|pid| Pid::from_raw(i32::try_from(pid).ok()?))
        .collect()
}

/// Kills a whole process group when dropped (and on [`GroupKiller::kill`]). Errors (typically:
/// the group is already gone) are ignored: there is nothing left to kill.
pub struct GroupKiller(Option<Pid>);

impl GroupKiller {
    /// The group `child` leads (it was started with `process_group(0)`).
    pub fn of(child: &tokio::process::Child) -> GroupKiller {
        GroupKiller::of_id(child.id())
    }

    /// The group a process of this pid leads.
    pub fn of_id(id: Option<u32>) -> GroupKiller {
        GroupKiller(
            id.and_then(|id| i32::try_from(id).ok())
                .and_then(Pid::from_raw),
        )
    }

    /// Kills the group now (again on drop).
    pub fn kill(&self) {
        if let Some(pid) = self.0 {
            let _ = kill_process_group(pid, Signal::KILL);
        }
    }
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        self.kill();
    }
}
