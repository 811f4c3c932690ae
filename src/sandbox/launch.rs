//! The engine's side of one confined call: a directory of its own holding the command's private
//! `TMPDIR` and the report of the call's init (both removed when the call ends), the call's
//! cgroups, the trampoline's command line and its start (forked by the engine's spawner, else
//! a child of the engine: [`CallSandbox::spawn`]), and the verdict on limits once the command
//! has ended (a command killed by a limit is an `execution_error` naming the limit, never a
//! silent empty output). An unconfined call (`--sandbox off`, [`CallSandbox::unconfined`]) has
//! only the init's report, in a temporary file the command could write (that mode protects
//! nothing).
//!
//! The init's report (`status` beside `tmp/`) is engine state the command cannot touch: it lies
//! outside everything Landlock lets the command open, below a directory its mount namespace
//! covers, and only the init writes it — the trampoline itself, non-dumpable, so not even
//! through `/proc/1/fd` or `ptrace` (see [`super::exec`]).

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use tokio::process::Command;

use super::Sandbox;
use super::exec::{FAILURE_PREFIX, REPORT_SIGNAL, REPORT_TMP_FULL, SUBCOMMAND, TRAMPOLINE_FAILED};
use super::mode::{SandboxLimits, human_bytes};
use super::policy::{CallCommand, CallPolicy};
use super::slots::{Slot, Slots};
use super::spawned::{Running, SpawnerSlot};

const SIGXCPU: i32 = 24;
const SIGXFSZ: i32 = 25;

/// One confined call. Drop (or [`CallSandbox::finish`]) removes its directory (`TMPDIR`
/// included) and cgroups.
#[derive(Debug)]
pub struct CallSandbox {
    trampoline: PathBuf,
    /// How the call is confined (its namespaces are added by [`CallSandbox::command`]).
    policy: CallPolicy,
    /// Namespaces beside the launcher's: `--net` without network, and those of
    /// [`super::probe::CALL_NAMESPACES`] the kernel has.
    ns_flags: Vec<String>,
    /// The confined call's directory (`tmp/` and `status`) and cgroups, given back to `slots`
    /// when the call ends.
    slot: Option<Slot>,
    slots: Option<Arc<Slots>>,
    /// An unconfined call's `status` file, removed when the call ends.
    _status_file: Option<tempfile::TempPath>,
    tmp: PathBuf,
    status: PathBuf,
    limits: SandboxLimits,
    cpu_seconds: u64,
    /// False for an unconfined (`off`) call: the trampoline is only the init of its namespaces.
    confined: bool,
    /// The engine's spawner, which forks the trampoline ([`CallSandbox::spawn`]).
    spawner: Arc<SpawnerSlot>,
}

/// What the call's init reported once the command's shell had ended.
#[derive(Debug, Default, PartialEq, Eq)]
struct Report {
    /// The signal that killed the shell.
    signal: Option<i32>,
    /// The private `TMPDIR` had no room left.
    tmp_full: bool,
}

impl Report {
    fn parse(text: &str) -> Report {
        let mut report = Report::default();
        for line in text.lines() {
            if line == REPORT_TMP_FULL {
                report.tmp_full = true;
            } else if let Some(n) = line.strip_prefix(REPORT_SIGNAL) {
                report.signal = n.trim().parse().ok();
            }
        }
        report
    }
}

impl CallSandbox {
    pub(super) fn new(
        sandbox: &Sandbox,
        workspace: &Path,
        budget: Duration,
    ) -> std::io::Result<CallSandbox> {
        let config = sandbox.config();
        let status = sandbox.status();
        let trampoline = status
            .trampoline
            .clone()
            .ok_or_else(|| std::io::Error::other("no trampoline"))?;
        let limits = config.limits;
        let slot = sandbox.slots.take(&status.cgroups, &limits)?;
        let (tmp, status_file, cgroup) = (slot.tmp.clone(), slot.status.clone(), slot.cgroup());
        let cpu_seconds = budget.as_secs() + u64::from(budget.subsec_nanos() > 0);
        let policy = CallPolicy {
            mode: Some(config.mode),
            workspace: Some(workspace.into()),
            tmp: Some(tmp.clone()),
            tmp_size: Some(limits.max_tmp_size),
            status: Some(status_file.clone()),
            read: config.read_paths.clone(),
            hide: super::mounts::root_secrets().to_vec(),
            landlock_tcp: !config.allow_network && !status.network_namespace,
            parent: Some(std::process::id() as i32),
            cgroups: cgroup.task_files(),
            nproc: (!cgroup.limits_processes()).then_some(limits.max_processes),
            address_space: (!cgroup.limits_memory()).then_some(limits.max_memory),
            fsize: Some(limits.max_file_size),
            cpu: Some(cpu_seconds.max(1)),
            unshare: None,
            ns_flags: Vec::new(),
        };
        let mut ns_flags: Vec<String> = status
            .namespaces
            .iter()
            .map(|ns| format!("--{ns}"))
            .collect();
        if !config.allow_network && status.network_namespace {
            ns_flags.push("--net".into());
        }
        Ok(CallSandbox {
            trampoline,
            policy,
            ns_flags,
            slot: Some(slot),
            slots: Some(Arc::clone(&sandbox.slots)),
            _status_file: None,
            tmp,
            status: status_file,
            limits,
            cpu_seconds,
            confined: true,
            spawner: Arc::clone(&sandbox.spawner),
        })
    }

    /// An unconfined call (`--sandbox off`) whose namespaces' init is the trampoline: PID and
    /// mount namespaces and a fresh `/proc`, no Landlock, limits, cgroups or private `TMPDIR`
    /// — what `unshare` and an init shell give, one program start cheaper, with the init's
    /// report telling a death by signal.
    pub(super) fn unconfined(
        trampoline: PathBuf,
        spawner: &Arc<SpawnerSlot>,
    ) -> std::io::Result<CallSandbox> {
        // One file (mode 0600), not a directory: the call has no `TMPDIR` of its own.
        let status_file = tempfile::Builder::new()
            .prefix("switchboard-call-")
            .tempfile()?
            .into_temp_path();
        let policy = CallPolicy {
            mode: Some(super::SandboxMode::Off),
            status: Some(status_file.to_path_buf()),
            parent: Some(std::process::id() as i32),
            ..CallPolicy::default()
        };
        Ok(CallSandbox {
            trampoline,
            policy,
            ns_flags: Vec::new(),
            tmp: PathBuf::new(),
            status: status_file.to_path_buf(),
            _status_file: Some(status_file),
            slot: None,
            slots: None,
            limits: SandboxLimits::default(),
            cpu_seconds: 0,
            confined: false,
            spawner: Arc::clone(spawner),
        })
    }

    /// False for an unconfined call ([`super::Sandbox::begin_unconfined_call`]): no Landlock,
    /// no limits, no private `TMPDIR`.
    pub fn confines(&self) -> bool {
        self.confined
    }

    /// The path of the call's private temporary directory (its `TMPDIR`). With namespaces
    /// (`unshare` given to [`CallSandbox::command`]) the command finds a fresh tmpfs of
    /// `max_tmp_size` bytes there, in its own mount namespace — not this directory of the host,
    /// which stays empty; without them, it is this directory. Empty for an unconfined call,
    /// which has none ([`CallSandbox::confines`]).
    pub fn tmp(&self) -> &Path {
        &self.tmp
    }

    /// The command that runs `program` confined: the trampoline, which execs `unshare` with
    /// `ns_flags` (plus `--net` without network, and the IPC, UTS and cgroup namespaces the
    /// kernel has) when `unshare` is given — `ns_flags` must start a PID namespace (`--pid
    /// --fork`): the trampoline is its init — else confines itself and execs `program` directly.
    /// Set the command's environment, directory and stdio on [`CallCommand::command_mut`], then
    /// start it with [`CallSandbox::spawn`].
    pub fn command(&self, unshare: Option<(&Path, &[&str])>, program: &[OsString]) -> CallCommand {
        let mut policy = self.policy.clone();
        if let Some((path, flags)) = unshare {
            policy.unshare = Some(path.to_path_buf());
            let own = self.ns_flags.iter().map(String::as_str);
            policy.ns_flags = flags
                .iter()
                .copied()
                .chain(own)
                .map(OsString::from)
                .collect();
        }
        let mut command = Command::new(&self.trampoline);
        command
            .arg(SUBCOMMAND)
            .args(policy.args())
            .arg("--")
            .args(program);
        CallCommand::new(policy, program.to_vec(), command)
    }

    /// Starts `call` (made by [`CallSandbox::command`], with its environment and directory set):
    /// forked by the engine's spawner when it serves — no program start for the trampoline —
    /// else as a child of this process. Either way stdin is `/dev/null`, stdout and stderr are
    /// pipes, the process leads a session (and so a process group) of its own without a
    /// controlling terminal, and is killed if dropped before it ended; the command's own stdio
    /// and kill-on-drop settings count only for the child, which makes its session itself (so
    /// it must not make it a group leader: no `process_group(0)`).
    pub async fn spawn(&self, call: CallCommand) -> std::io::Result<Running> {
        if let Some(spawned) = self.spawner.spawn(&self.trampoline, &call).await {
            return Ok(Running::Spawned(spawned));
        }
        call.into_command().spawn().map(Running::Child)
    }

    /// The signal that killed the command's shell, if one did: its own wait status without
    /// namespaces; with them, the init's report, which counts only together with the matching
    /// `128 + N` status (the init exits with it). A plain `exit 137` is never a death here, and
    /// the command cannot write the report. As bash's own job notices do, the init reports no
    /// death by SIGINT or SIGPIPE (those stay exit statuses).
    pub fn death_signal(&self, status: &ExitStatus) -> Option<i32> {
        if let Some(signal) = status.signal() {
            return Some(signal);
        }
        let code = status.code()?;
        self.report()
            .signal
            .filter(|n| code > 128 && code - 128 == *n)
    }

    fn report(&self) -> Report {
        std::fs::read_to_string(&self.status)
            .map(|text| Report::parse(&text))
            .unwrap_or_default()
    }

    /// Why the command ended badly, when the sandbox is the reason: the trampoline could not
    /// confine it (`text` is then its failure line), the OOM killer acted in the call's memory
    /// cgroup, a fork hit the process limit, a command that failed had filled its private
    /// `TMPDIR`, or a process was killed for CPU time or file size.
    /// `None` for an ordinary exit.
    pub fn verdict(&self, status: &ExitStatus, text: &str) -> Option<String> {
        if status.code() == Some(i32::from(TRAMPOLINE_FAILED)) && text.starts_with(FAILURE_PREFIX) {
            let who = if self.confined {
                "the sandbox"
            } else {
                "the namespaces' init"
            };
            return Some(format!("{who} could not start the command: {text}"));
        }
        let cgroup = self.slot.as_ref()?.cgroup();
        // A memory kill is reported even if the command carried on; a refused fork only when
        // the command failed.
        if let Some(hit) = cgroup.limit_hit()
            && (hit.starts_with("killed") || !status.success())
        {
            return Some(hit);
        }
        if !status.success() && self.report().tmp_full {
            return Some(format!(
                "TMPDIR full (limit {})",
                human_bytes(self.limits.max_tmp_size)
            ));
        }
        // A signal death shows as 128 + N through the namespace's init, or as the signal itself.
        let signal = status
            .signal()
            .or_else(|| status.code().filter(|c| *c > 128).map(|c| c - 128));
        match signal {
            Some(SIGXCPU) => Some(format!(
                "killed: CPU time limit ({} s, the call's timeout)",
                self.cpu_seconds
            )),
            Some(SIGXFSZ) => Some(format!(
                "killed: file size limit ({})",
                human_bytes(self.limits.max_file_size)
            )),
            _ => None,
        }
    }

    /// The limit the call ran into, if any (for a call that timed out or was cancelled).
    pub fn limit_hit(&self) -> Option<String> {
        self.slot.as_ref()?.cgroup().limit_hit()
    }

    /// Ends the call: its directory and cgroups are kept for a later call when nothing of this
    /// one is left in them, else what is left in the cgroups is killed and they and the
    /// directory are removed — off the async runtime, not waited for. An unconfined call's
    /// report file is removed.
    pub fn finish(self) {
        drop(self);
    }
}

impl Drop for CallSandbox {
    fn drop(&mut self) {
        if let (Some(slot), Some(slots)) = (self.slot.take(), self.slots.take()) {
            // Also when dropped without finish (the call's future was dropped): off the async
            // runtime when there is one, else here (bounded either way).
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn_blocking(move || slots.give_back(slot));
                }
                Err(_) => slots.give_back(slot),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unconfined_calls_failure_to_start_is_not_blamed_on_a_sandbox_and_names_no_limit() {
        let call =
            CallSandbox::unconfined(PathBuf::from("/nonexistent/trampoline"), &Arc::default())
                .unwrap();
        assert!(!call.confines());
        let failed = ExitStatus::from_raw(i32::from(TRAMPOLINE_FAILED) << 8);
        let text = format!("{FAILURE_PREFIX} cannot make the call's namespaces: EPERM");
        assert_eq!(
            call.verdict(&failed, &text).unwrap(),
            format!("the namespaces' init could not start the command: {text}")
        );
        // No cgroup, no limits: a SIGXCPU or SIGXFSZ death is only a death.
        let xcpu = ExitStatus::from_raw((128 + SIGXCPU) << 8);
        assert_eq!(call.verdict(&xcpu, ""), None);
        let status = call.status.clone();
        assert!(status.exists());
        call.finish();
        assert!(!status.exists(), "the report file is removed with the call");
    }

    #[test]
    fn the_inits_report_is_read_line_by_line() {
        assert_eq!(Report::parse(""), Report::default());
        assert_eq!(
            Report::parse("signal 9\ntmp-full\n"),
            Report {
                signal: Some(9),
                tmp_full: true
            }
        );
        assert_eq!(Report::parse("Killed\n").signal, None);
    }
}
