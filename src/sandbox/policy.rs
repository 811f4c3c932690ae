//! One call's confinement as a typed value: what the engine decides for a call
//! ([`super::CallSandbox`]), what the spawner reads to prepare the call's namespaces
//! ([`super::spawner`]) and what the trampoline enforces ([`super::exec`]).
//!
//! It crosses two process boundaries — the spawner's socket and, for a trampoline the engine
//! starts itself, an `exec` — as the trampoline's options ([`CallPolicy::args`]), and is read
//! back once where it arrives ([`CallPolicy::parse`]): one codec, one reading. The spawner
//! decides from the typed value (does the call confine, does it want a PID or a network
//! namespace made ahead) and hands that same value to the call it forks, which does not read
//! its options again. A [`CallCommand`] is the policy with the program it runs and the process
//! the engine starts when no spawner serves.

use std::ffi::OsString;
use std::path::PathBuf;

use tokio::process::Command;

use super::SandboxMode;

/// How one call is confined. `Default`: nothing asked (the options of `--contain` and
/// `--probe` need no more).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct CallPolicy {
    /// The sandbox mode (`None`: no mode given, as for `--contain`).
    pub mode: Option<SandboxMode>,
    /// The call's workspace.
    pub workspace: Option<PathBuf>,
    /// The call's private `TMPDIR` (a directory of the host; a tmpfs there with private mounts).
    pub tmp: Option<PathBuf>,
    /// Size of the `TMPDIR` tmpfs, bytes.
    pub tmp_size: Option<u64>,
    /// The engine's file for the init's report.
    pub status: Option<PathBuf>,
    /// More paths to keep visible and readable.
    pub read: Vec<PathBuf>,
    /// Root-only system files to cover (a root engine's calls).
    pub hide: Vec<PathBuf>,
    /// Refuse TCP with Landlock (no network namespace to take the network away).
    pub landlock_tcp: bool,
    /// The engine's pid: the call ends when it does.
    pub parent: Option<i32>,
    /// The cgroup task files the call joins.
    pub cgroups: Vec<PathBuf>,
    /// `RLIMIT_NPROC`, where no cgroup bounds processes.
    pub nproc: Option<u64>,
    /// `RLIMIT_AS`, bytes, where no cgroup bounds memory.
    pub address_space: Option<u64>,
    /// `RLIMIT_FSIZE`, bytes.
    pub fsize: Option<u64>,
    /// `RLIMIT_CPU`, seconds.
    pub cpu: Option<u64>,
    /// The `unshare` program, when the call runs in namespaces of its own.
    pub unshare: Option<PathBuf>,
    /// The namespaces asked for, as `unshare`'s flags (`--pid`, `--fork`, `--net`…): the
    /// trampoline makes them itself where the kernel lets it, else passes them to `unshare`.
    pub ns_flags: Vec<OsString>,
}

impl CallPolicy {
    /// The mode is one that confines (Landlock, private mounts, no capabilities).
    pub fn confines(&self) -> bool {
        self.mode.is_some_and(SandboxMode::confines)
    }

    /// `--mode off`: only the namespaces and their init.
    pub fn unconfined(&self) -> bool {
        self.mode.is_some_and(|m| !m.confines())
    }

    /// `best-effort`: a confinement the kernel refuses is skipped, not an error.
    pub fn best_effort(&self) -> bool {
        self.mode == Some(SandboxMode::BestEffort)
    }

    /// The command may write its workspace.
    pub fn workspace_writable(&self) -> bool {
        self.mode.is_some_and(SandboxMode::workspace_writable)
    }

    /// The call runs in namespaces of its own and asks for namespace `flag` (`--pid`, `--net`…).
    pub fn asks_for(&self, flag: &str) -> bool {
        self.unshare.is_some() && self.ns_flags.iter().any(|f| f == flag)
    }

    /// As the trampoline's options (before its `--`).
    pub fn args(&self) -> Vec<OsString> {
        let mut args = self.inner_args();
        if let Some(parent) = self.parent {
            args.extend(["--parent".into(), parent.to_string().into()]);
        }
        for procs in &self.cgroups {
            args.extend(["--cgroup".into(), procs.into()]);
        }
        let limits = [
            ("--nproc", self.nproc),
            ("--as", self.address_space),
            ("--fsize", self.fsize),
            ("--cpu", self.cpu),
        ];
        for (flag, value) in limits {
            if let Some(n) = value {
                args.extend([flag.into(), n.to_string().into()]);
            }
        }
        if let Some(unshare) = &self.unshare {
            args.extend(["--unshare".into(), unshare.into()]);
        }
        for flag in &self.ns_flags {
            args.extend(["--ns-flag".into(), flag.clone()]);
        }
        args
    }

    /// The options the inner stage needs (when it is started again, by `unshare` or as a
    /// program of its own): the mode, the paths and the network rule — not the outer stage's
    /// cgroups, limits and namespaces.
    pub fn inner_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        if let Some(mode) = self.mode {
            args.extend(["--mode".into(), mode.as_str().into()]);
        }
        let paths = [("--workspace", &self.workspace), ("--tmp", &self.tmp)];
        for (flag, path) in paths {
            if let Some(path) = path {
                args.extend([flag.into(), path.into()]);
            }
        }
        if let Some(size) = self.tmp_size {
            args.extend(["--tmp-size".into(), size.to_string().into()]);
        }
        if let Some(status) = &self.status {
            args.extend(["--status".into(), status.into()]);
        }
        for path in &self.read {
            args.extend(["--read".into(), path.into()]);
        }
        for path in &self.hide {
            args.extend(["--hide".into(), path.into()]);
        }
        if self.landlock_tcp {
            args.push("--landlock-tcp".into());
        }
        args
    }

    /// Reads option `flag` (its value from `rest`) into the policy: `Ok(false)` when `flag` is
    /// not one of the policy's options.
    pub fn read_option(
        &mut self,
        flag: &str,
        rest: &mut impl Iterator<Item = OsString>,
    ) -> Result<bool, String> {
        let mut value = || rest.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: OsString| {
            v.to_string_lossy()
                .parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v:?}"))
        };
        match flag {
            "--mode" => {
                let mode = value()?.to_string_lossy().parse::<SandboxMode>();
                self.mode = Some(mode.map_err(|e| e.to_string())?);
            }
            "--workspace" => self.workspace = Some(value()?.into()),
            "--tmp" => self.tmp = Some(value()?.into()),
            "--tmp-size" => self.tmp_size = Some(number(value()?)?),
            "--status" => self.status = Some(value()?.into()),
            "--read" => self.read.push(value()?.into()),
            "--hide" => self.hide.push(value()?.into()),
            "--landlock-tcp" => self.landlock_tcp = true,
            "--parent" => {
                let parent = number(value()?)?;
                let parent = i32::try_from(parent).map_err(|_| format!("{flag}: not a pid"))?;
                self.parent = Some(parent);
            }
            "--cgroup" => self.cgroups.push(value()?.into()),
            "--nproc" => self.nproc = Some(number(value()?)?),
            "--as" => self.address_space = Some(number(value()?)?),
            "--fsize" => self.fsize = Some(number(value()?)?),
            "--cpu" => self.cpu = Some(number(value()?)?),
            "--unshare" => self.unshare = Some(value()?.into()),
            "--ns-flag" => self.ns_flags.push(value()?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The policy `args` (made by [`CallPolicy::args`]) describe; an error for anything else.
    pub fn parse(args: Vec<OsString>) -> Result<CallPolicy, String> {
        let mut policy = CallPolicy::default();
        let mut rest = args.into_iter();
        while let Some(arg) = rest.next() {
            let flag = arg.to_string_lossy().into_owned();
            if !policy.read_option(&flag, &mut rest)? {
                return Err(format!("unknown option {flag}"));
            }
        }
        Ok(policy)
    }
}

/// A confined call's command ([`super::CallSandbox::command`]): the policy and program it runs, as the
/// trampoline's command line and as the typed values the engine's spawner gets.
#[derive(Debug)]
pub struct CallCommand {
    pub(super) policy: CallPolicy,
    pub(super) program: Vec<OsString>,
    command: Command,
}

impl CallCommand {
    pub(super) fn new(policy: CallPolicy, program: Vec<OsString>, command: Command) -> Self {
        CallCommand {
            policy,
            program,
            command,
        }
    }

    /// The process to start, for its environment, directory and stdio (its program and
    /// arguments are the sandbox's).
    pub fn command_mut(&mut self) -> &mut Command {
        &mut self.command
    }

    /// The process to start.
    pub fn command(&self) -> &Command {
        &self.command
    }

    /// The process to start, when the engine starts it itself.
    pub(super) fn into_command(self) -> Command {
        self.command
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> CallPolicy {
        CallPolicy {
            mode: Some(SandboxMode::WorkspaceWrite),
            workspace: Some("/w s".into()),
            tmp: Some("/t".into()),
            tmp_size: Some(64 << 20),
            status: Some("/s".into()),
            read: vec!["/r1".into(), "/r2".into()],
            hide: vec!["/etc/shadow".into()],
            landlock_tcp: true,
            parent: Some(4242),
            cgroups: vec!["/sys/fs/cgroup/pids/x/tasks".into()],
            nproc: Some(256),
            address_space: Some(1 << 30),
            fsize: Some(1 << 20),
            cpu: Some(31),
            unshare: Some("/usr/bin/unshare".into()),
            ns_flags: vec!["--pid".into(), "--fork".into(), "--net".into()],
        }
    }

    #[test]
    fn a_policy_reads_back_as_it_was_written() {
        for policy in [full(), CallPolicy::default()] {
            assert_eq!(CallPolicy::parse(policy.args()).unwrap(), policy);
        }
        let off = CallPolicy {
            mode: Some(SandboxMode::Off),
            status: Some("/s".into()),
            parent: Some(1),
            ..CallPolicy::default()
        };
        assert_eq!(CallPolicy::parse(off.args()).unwrap(), off);
    }

    #[test]
    fn the_inner_stage_gets_the_mode_and_paths_not_the_outer_stages_limits() {
        let inner = CallPolicy::parse(full().inner_args()).unwrap();
        assert_eq!(inner.mode, Some(SandboxMode::WorkspaceWrite));
        assert_eq!(inner.read.len(), 2);
        assert!(inner.landlock_tcp);
        assert_eq!((inner.parent, inner.cpu, inner.unshare), (None, None, None));
        assert!(inner.cgroups.is_empty() && inner.ns_flags.is_empty());
    }

    #[test]
    fn bad_options_are_refused_with_their_name() {
        let parse = |a: &[&str]| CallPolicy::parse(a.iter().map(OsString::from).collect());
        assert!(parse(&["--mode", "open"]).is_err());
        assert!(parse(&["--cpu", "many"]).unwrap_err().contains("--cpu"));
        assert!(parse(&["--tmp"]).unwrap_err().contains("needs a value"));
        assert!(parse(&["--bogus"]).unwrap_err().contains("--bogus"));
        assert!(parse(&["--parent", "99999999999"]).is_err());
    }

    #[test]
    fn what_the_spawner_decides_comes_from_the_typed_fields() {
        let policy = full();
        assert!(policy.confines() && policy.workspace_writable() && !policy.best_effort());
        assert!(policy.asks_for("--pid") && policy.asks_for("--net"));
        assert!(!policy.asks_for("--user"));
        // Namespace flags count only with `unshare`: without it the call makes none.
        let no_unshare = CallPolicy {
            unshare: None,
            ..full()
        };
        assert!(!no_unshare.asks_for("--pid"));
        let off = CallPolicy {
            mode: Some(SandboxMode::Off),
            ..CallPolicy::default()
        };
        assert!(!off.confines() && off.unconfined());
        assert!(!CallPolicy::default().confines() && !CallPolicy::default().unconfined());
    }
}
