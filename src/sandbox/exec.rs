//! The trampoline: `switchboard sandbox-exec [options] -- PROGRAM ARGS…` (hidden from `--help`),
//! or the same from the small `switchboard-sandbox` binary (`src/bin/`), the process that runs
//! each confined call — forked by the engine's spawner (below), or started by the engine. It
//! confines *itself* with safe crates and then execs the command, so the crate needs no
//! `unsafe` `pre_exec` hook.
//!
//! Two stages, because mounting a fresh `/proc` needs privileges that Landlock takes away:
//!
//! 1. **outer** (a child of the engine's spawner, or of the engine): parent-death signal
//!    `SIGKILL` (so `kill -9` of the engine ends the call); joins the call's cgroups (`0` written
//!    to their `tasks` files); sets the rlimits (`RLIMIT_FSIZE`, `RLIMIT_CPU`, and
//!    `RLIMIT_NPROC` / `RLIMIT_AS` where no cgroup bounds processes / memory); then makes the
//!    call's namespaces itself with `unshare(2)` and **forks** their init (no second program
//!    start: [`super::fork`]; a process that is not single-threaded — an embedder's binary that
//!    started threads first — starts this binary again as `sandbox-exec --inner --mount-proc …`
//!    instead), waits for it and exits as it did. When the spawner made the call's PID
//!    namespace (a root engine), this process is pid 1 of it already and becomes the init
//!    itself, without a fork. Where the namespaces need a user namespace (not root), it makes
//!    that one too and maps its user and group to root inside it (`--user --map-root-user`);
//!    only where the kernel refuses the namespaces does it exec `unshare <flags> -- <this
//!    binary> sandbox-exec --inner …`, whose `--kill-child` plays the same part; without
//!    namespaces it runs the inner stage itself.
//! 2. **inner** (pid 1 of the call's PID namespace, behind its own `/proc` — which it mounts
//!    itself when the outer stage made the namespaces, with its own parent-death signal — in IPC,
//!    UTS and cgroup namespaces of its own and, without `--allow-network`, in a network namespace
//!    with only loopback): covers the host's socket directories (and, for a root engine, the
//!    root-only entries of `/etc`, `--hide`) in its private mount namespace and
//!    mounts the call's `TMPDIR` as a tmpfs of `--tmp-size` bytes ([`super::mounts`]), applies
//!    the Landlock ruleset ([`super::landlock_rules`]), drops every capability (bounding set
//!    included, so not even a root command gets them back), then runs the command as the
//!    namespace's **init**: it starts the command's shell as its child (pid 2, so `kill $$`
//!    works), reaps every orphan, and when that shell ends writes what the engine needs to know
//!    (the signal that killed it; whether the `TMPDIR` was full) to the engine's `--status`
//!    file and exits with the shell's status (`128 + N` for signal N) — which ends the
//!    namespace and everything left in it. It marks itself non-dumpable first, so the command
//!    (same user, same Landlock domain) can neither `ptrace` it nor open its descriptors through
//!    `/proc/1/fd`; the status file itself lies outside the command's Landlock rules and below a
//!    covered directory. Without namespaces (no `unshare`) the inner stage runs in the outer
//!    process and execs the command instead: the engine then waits for the shell itself.
//!
//! `--mode off` makes the namespaces and their init and nothing else (no mounts covered, no
//! Landlock, capabilities kept): how an unconfined call gets its PID namespace with one program
//! start fewer than `unshare` and an init shell ([`super::Sandbox::begin_unconfined_call`]).
//!
//! `--spawner` makes the trampoline the engine's spawner ([`super::spawner`]): started once, it
//! forks this same trampoline for each call, with the call's arguments, environment and stdio
//! — so every call runs what is described here without a program start of its own.
//!
//! `--contain` runs the outer stage alone and then execs the program: how helpers that are not
//! confined (MCP stdio servers) are kept under process-tree control ([`super::contain`]).
//!
//! Both stages first mark every descriptor above stderr close-on-exec, whatever the engine (or an
//! embedder's process) inherited: the command gets stdin, stdout and stderr, nothing else. And a
//! call leads a session of its own, with no controlling terminal, before anything else runs
//! (`setsid`: in the spawner's child as it is forked, else first thing in the outer stage), so
//! the terminal the engine may run in is out of reach: `/dev/tty` fails to open (`ENXIO`), and
//! neither a write nor `TIOCSTI` reaches the terminal, in every mode, `off` included.
//!
//! Any failure exits [`TRAMPOLINE_FAILED`] with one line on stderr starting with
//! [`FAILURE_PREFIX`]; the engine turns that into an `execution_error`. Nothing runs then.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use rustix::process::{Pid, Resource, Rlimit, Signal, WaitOptions, getpid, getppid, setrlimit};

use super::landlock_rules;
use super::policy::CallPolicy;

/// The subcommand name.
pub const SUBCOMMAND: &str = "sandbox-exec";
/// Exit status of a trampoline that could not confine itself (nothing ran).
pub const TRAMPOLINE_FAILED: u8 = 125;
/// First words of the trampoline's failure line on stderr.
pub const FAILURE_PREFIX: &str = "switchboard sandbox-exec:";
/// A line of the init's report: `signal N`, the signal that killed the command's shell.
pub(super) const REPORT_SIGNAL: &str = "signal ";
/// A line of the init's report: the private `TMPDIR` had no room left when the shell ended.
pub(super) const REPORT_TMP_FULL: &str = "tmp-full";
/// Signals whose deaths the init reports as plain exit statuses, as bash's own job notices do:
/// a ctrl-c or a closed pipe is how a command stops, not a crash.
const NOT_REPORTED: [i32; 2] = [2, 13];

/// Runs the trampoline when this process was started as one (`argv[1] == "sandbox-exec"`), and
/// returns its exit code (it only returns on failure: on success it has become the command).
/// `None` otherwise. Embedders whose binary is not `switchboard` call this first thing in `main`
/// and point [`super::SandboxConfig::trampoline`] at their own binary.
pub fn run_if_requested() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(SUBCOMMAND)) {
        return None;
    }
    Some(exec_main(args.collect()))
}

/// The trampoline's main, given the arguments after `sandbox-exec`.
pub fn exec_main(args: Vec<OsString>) -> ExitCode {
    // Nothing the engine's process inherited passes on to the command.
    crate::process_guard::close_inherited_fds();
    ExitCode::from(run_args(args))
}

/// The trampoline given its arguments: its exit code, after one failure line on stderr when it
/// could not confine the command.
pub(super) fn run_args(args: Vec<OsString>) -> u8 {
    finish(Plan::parse(args).and_then(run))
}

/// The trampoline's exit code for how it ended.
fn finish(ran: Result<u8, String>) -> u8 {
    match ran {
        Ok(code) => code,
        Err(e) => {
            eprintln!("{FAILURE_PREFIX} {e}");
            TRAMPOLINE_FAILED
        }
    }
}

/// An exit status as a process exit code (its low byte, as the kernel keeps it).
fn exit_code(code: i32) -> u8 {
    u8::try_from(code & 0xff).unwrap_or(u8::MAX)
}

/// The parsed command line.
#[derive(Debug, Default)]
struct Plan {
    probe: bool,
    /// `--spawner`: serve calls from the engine on stdin ([`super::spawner`]).
    spawner: bool,
    /// The command's whole environment, when it is not this process's (a call forked by the
    /// spawner, which keeps none of the engine's environment).
    env: Option<Vec<(OsString, OsString)>>,
    /// A network namespace to join instead of making one (from the spawner: made ahead, or
    /// that of a call that has ended).
    netns: Option<std::os::fd::OwnedFd>,
    /// This process is already pid 1 of the call's PID namespace, which the spawner made: it
    /// makes the other namespaces and becomes their init without forking.
    pid_ns_made: bool,
    /// A pidfd of the spawner that forked this process (see [`super::spawner::Forked`]).
    spawner_pidfd: Option<std::os::fd::OwnedFd>,
    /// The spawner that forked this process had emptied its bounding set (so this one has).
    bounding_set_empty: bool,
    /// This process leads a session of its own already (the spawner's fork did it).
    in_own_session: bool,
    /// Only the outer stage, then exec the program (a helper under process-tree control, see
    /// [`super::contain`]).
    contain: bool,
    inner: bool,
    /// The inner stage runs in its own mount namespace (started by `unshare --mount-proc`).
    private_mounts: bool,
    /// The inner stage mounts the fresh `/proc` itself (the outer stage made the namespaces).
    mount_proc: bool,
    /// How the call is confined: the options the engine gave ([`CallPolicy`]).
    policy: CallPolicy,
    program: Vec<OsString>,
}

impl Plan {
    /// Where `program` is, found as `execvp` would find it — in the directories of the
    /// command's `PATH` (this process's without an environment of the command's own) — once this
    /// process is confined (what the command can run is what it can see). Found ahead so that
    /// the command starts by `posix_spawn`, without copying this process's page tables (the
    /// standard library forks instead for a bare name when the command's environment sets its
    /// own `PATH`): about a fifth of a millisecond per call here. A name with a `/`, or one found
    /// nowhere, is left as it is (then the start fails as it would have).
    fn path_of(&self, program: &OsStr) -> PathBuf {
        use std::os::unix::ffi::OsStrExt;
        if program.as_bytes().contains(&b'/') || program.is_empty() {
            return program.into();
        }
        let path = match &self.env {
            Some(env) => env
                .iter()
                .find(|(k, _)| k == "PATH")
                .map(|(_, v)| v.clone()),
            None => std::env::var_os("PATH"),
        };
        // `execvp`'s own default when there is no `PATH`.
        let path = path.unwrap_or_else(|| "/bin:/usr/bin".into());
        for dir in std::env::split_paths(&path) {
            // An empty entry is the working directory, as for `execvp`.
            let candidate = if dir.as_os_str().is_empty() {
                PathBuf::from(".").join(program)
            } else {
                dir.join(program)
            };
            let executable = rustix::fs::access(&candidate, rustix::fs::Access::EXEC_OK).is_ok()
                && std::fs::metadata(&candidate).is_ok_and(|m| m.is_file());
            if executable {
                return candidate;
            }
        }
        program.into()
    }

    /// A command that runs `program` with the call's environment.
    fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut command = Command::new(program);
        if let Some(env) = &self.env {
            command.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
        }
        command
    }

    /// The trampoline's command line: its stages' flags, the call's policy, then the program
    /// after `--`.
    fn parse(args: Vec<OsString>) -> Result<Plan, String> {
        let mut plan = Plan::default();
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let flag = arg.to_string_lossy().into_owned();
            match flag.as_str() {
                "--" => {
                    plan.program = it.collect();
                    break;
                }
                "--probe" => plan.probe = true,
                "--spawner" => plan.spawner = true,
                "--contain" => plan.contain = true,
                "--inner" => plan.inner = true,
                "--private-mounts" => plan.private_mounts = true,
                "--mount-proc" => plan.mount_proc = true,
                other => {
                    if !plan.policy.read_option(other, &mut it)? {
                        return Err(format!("unknown option {other}"));
                    }
                }
            }
        }
        if !plan.probe && !plan.spawner && plan.program.is_empty() {
            return Err("no command after --".into());
        }
        Ok(plan)
    }

    /// A call the spawner forked: its policy, read once by the spawner, and its program.
    fn forked(policy: CallPolicy, program: Vec<OsString>, forked: super::spawner::Forked) -> Plan {
        let mut plan = Plan {
            policy,
            program,
            ..Plan::default()
        };
        plan.env = Some(forked.env);
        plan.policy.parent = Some(forked.spawner);
        plan.netns = forked.netns;
        plan.pid_ns_made = forked.pid_ns;
        plan.spawner_pidfd = forked.spawner_pidfd;
        plan.bounding_set_empty = forked.bounding_set_empty;
        plan.in_own_session = true;
        plan
    }
}

fn run(mut plan: Plan) -> Result<u8, String> {
    if plan.probe {
        println!("landlock_abi={}", landlock_rules::probe_abi());
        return Ok(0);
    }
    if plan.spawner {
        // A call it forks runs here, in the child: the command's environment is the one sent,
        // the parent whose death ends the call is the spawner, and it may have been given a
        // network namespace to join.
        return match super::spawner::serve(plan.policy.parent)? {
            super::spawner::Served::Done => Ok(0),
            super::spawner::Served::Call(policy, program, forked) => {
                Ok(finish(run(Plan::forked(policy, program, forked))))
            }
        };
    }
    if plan.contain {
        outer(&plan)?;
        let err = Command::new(&plan.program[0])
            .args(&plan.program[1..])
            .exec();
        return Err(format!("cannot run {:?}: {err}", plan.program[0]));
    }
    if !plan.inner {
        if !plan.in_own_session {
            // A call started by the engine itself: first a session of its own, as the spawner
            // gives the calls it forks (the engine starts this process in the engine's own
            // process group, so it is no group leader and `setsid` can succeed).
            super::spawner::own_session();
        }
        outer(&plan)?;
        if let Some(unshare) = &plan.policy.unshare {
            let me = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
            // The namespaces made here (a user namespace mapping this user to root included,
            // where one is needed: not root), then this process forked as their init: no
            // program start besides the command's. Where the kernel refuses, `unshare` tries.
            if let Some(mut flags) = namespace_flags(&plan.policy.ns_flags) {
                if plan.pid_ns_made {
                    flags.remove(rustix::thread::UnshareFlags::NEWPID);
                }
                if own_namespaces(join_made_netns(flags, plan.netns.take()))? {
                    if plan.pid_ns_made {
                        // Pid 1 already: the init itself.
                        plan.inner = true;
                        plan.private_mounts = true;
                        plan.mount_proc = true;
                        return run_inner(plan);
                    }
                    return run_init(&me, plan);
                }
            }
            let err = plan
                .command(unshare)
                .args(&plan.policy.ns_flags)
                .arg("--")
                .arg(me)
                .arg(SUBCOMMAND)
                .arg("--inner")
                .arg("--private-mounts")
                .args(plan.policy.inner_args())
                .arg("--")
                .args(&plan.program)
                .exec();
            return Err(format!("cannot run {}: {err}", unshare.display()));
        }
    }
    run_inner(plan)
}

/// The inner stage, then the command: run by the namespace's init (pid 1) as its child, or
/// exec'd (without namespaces).
fn run_inner(plan: Plan) -> Result<u8, String> {
    let status = inner(&plan)?;
    let mut command = plan.command(plan.path_of(&plan.program[0]));
    command.arg0(&plan.program[0]).args(&plan.program[1..]);
    if plan.inner && getpid().is_init() {
        return init(command, status, plan.policy.tmp.as_deref());
    }
    let err = command.exec();
    Err(format!("cannot run {:?}: {err}", plan.program[0]))
}

/// The namespaces `unshare` would make for `ns_flags` (`--pid --fork --mount-proc --kill-child`,
/// `--user --map-root-user` where needed, and the per-call ones), or `None` when they ask for
/// something only `unshare` does (a user namespace without that mapping, an unknown flag).
fn namespace_flags(ns_flags: &[OsString]) -> Option<rustix::thread::UnshareFlags> {
    use rustix::thread::UnshareFlags;
    let mut flags = UnshareFlags::empty();
    let mut map_root = false;
    for flag in ns_flags {
        flags |= match flag.to_str()? {
            "--user" => UnshareFlags::NEWUSER,
            "--map-root-user" => {
                map_root = true;
                UnshareFlags::empty()
            }
            "--pid" => UnshareFlags::NEWPID,
            "--mount-proc" | "--mount" => UnshareFlags::NEWNS,
            "--net" => UnshareFlags::NEWNET,
            "--ipc" => UnshareFlags::NEWIPC,
            "--uts" => UnshareFlags::NEWUTS,
            "--cgroup" => UnshareFlags::NEWCGROUP,
            "--fork" | "--kill-child" => UnshareFlags::empty(),
            _ => return None,
        };
    }
    let user = flags.contains(UnshareFlags::NEWUSER);
    (flags.contains(UnshareFlags::NEWPID | UnshareFlags::NEWNS) && user == map_root)
        .then_some(flags)
}

/// `flags` without the network namespace when this process joined `netns`, one the spawner
/// made ahead or took back from an ended call — never inside a user namespace of the call's own.
fn join_made_netns(
    mut flags: rustix::thread::UnshareFlags,
    netns: Option<std::os::fd::OwnedFd>,
) -> rustix::thread::UnshareFlags {
    use rustix::thread::{LinkNameSpaceType, UnshareFlags, move_into_link_name_space};
    use std::os::fd::AsFd;
    if let Some(netns) = netns
        && flags.contains(UnshareFlags::NEWNET)
        && !flags.contains(UnshareFlags::NEWUSER)
        && move_into_link_name_space(netns.as_fd(), Some(LinkNameSpaceType::Network)).is_ok()
    {
        flags.remove(UnshareFlags::NEWNET);
    }
    flags
}

/// Moves this process into fresh namespaces (its next child is pid 1 of the PID namespace).
/// `Ok(false)` when the kernel refuses them (nothing changed: `unshare` may try); with a user
/// namespace, this user and group are then mapped to root inside it, as `unshare
/// --map-root-user` does — a failure there is an error, the process being half-moved.
#[allow(deprecated)]
fn own_namespaces(flags: rustix::thread::UnshareFlags) -> Result<bool, String> {
    use rustix::thread::UnshareFlags;
    // `unshare` is sound here: the trampoline is single-threaded and the flags never include
    // `FILES` (the reason rustix deprecated the safe function in favour of an unsafe one).
    debug_assert!(!flags.contains(UnshareFlags::FILES));
    let (uid, gid) = (rustix::process::geteuid(), rustix::process::getegid());
    if rustix::thread::unshare(flags).is_err() {
        return Ok(false);
    }
    if flags.contains(UnshareFlags::NEWUSER) {
        let write = |file: &str, text: String| {
            std::fs::write(format!("/proc/self/{file}"), text)
                .map_err(|e| format!("cannot write /proc/self/{file}: {e}"))
        };
        // Kernels before 3.19 have no `setgroups` file, and need none.
        match write("setgroups", "deny".into()) {
            Err(_) if !Path::new("/proc/self/setgroups").exists() => {}
            other => other?,
        }
        write("uid_map", format!("0 {} 1", uid.as_raw()))?;
        write("gid_map", format!("0 {} 1", gid.as_raw()))?;
    }
    Ok(true)
}

/// Becomes the init of the namespaces just made, waits for it and exits as it did: its code, or
/// `128 + N` if signal N killed it — as `unshare --fork` does. The init is this process forked
/// (one program start fewer, see [`super::fork`]), or, should this process not be
/// single-threaded (an embedder's binary that started threads before the trampoline ran), this
/// binary started again as `sandbox-exec --inner`. Either way the init mounts `/proc` itself and
/// has its own parent-death signal, so killing this process ends it.
fn run_init(me: &Path, mut plan: Plan) -> Result<u8, String> {
    let init = match super::fork::fork() {
        Ok(super::fork::Forked::Child) => {
            plan.inner = true;
            plan.private_mounts = true;
            plan.mount_proc = true;
            return run_inner(plan);
        }
        Ok(super::fork::Forked::Parent(pid)) => pid,
        Err(_) => {
            let child = plan
                .command(me)
                .arg(SUBCOMMAND)
                .arg("--inner")
                .arg("--private-mounts")
                .arg("--mount-proc")
                .args(plan.policy.inner_args())
                .arg("--")
                .args(&plan.program)
                .spawn()
                .map_err(|e| format!("cannot start the call's init: {e}"))?;
            Pid::from_child(&child)
        }
    };
    let ended = loop {
        match rustix::process::waitpid(Some(init), WaitOptions::empty()) {
            Ok(Some((_, ended))) => break ended,
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(format!("waiting for the call's init: {e}")),
        }
    };
    let code = ended
        .exit_status()
        .or_else(|| ended.terminating_signal().map(|s| 128 + s))
        .unwrap_or(128);
    Ok(exit_code(code))
}

/// Pid 1 of the call's namespaces: runs `command` as its child, reaps every process orphaned
/// into the namespace, and once the child has ended reports to `status` and exits with the
/// child's status. Non-dumpable, so the command cannot reach it (see the module docs).
fn init(mut command: Command, status: Option<File>, tmp: Option<&Path>) -> Result<u8, String> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(|e| format!("cannot mark the init non-dumpable: {e}"))?;
    let child = command
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", command.get_program()))?;
    let shell = Pid::from_child(&child);
    let ended = loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, ended))) if pid == shell => break ended,
            // An orphan of the namespace, reaped.
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(format!("waiting for the command: {e}")),
        }
    };
    let mut report = String::new();
    let code = match (ended.exit_status(), ended.terminating_signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => {
            if !NOT_REPORTED.contains(&signal) {
                report.push_str(&format!("{REPORT_SIGNAL}{signal}\n"));
            }
            128 + signal
        }
        (None, None) => 128,
    };
    if tmp.is_some_and(full) {
        report.push_str(REPORT_TMP_FULL);
        report.push('\n');
    }
    if let Some(mut status) = status
        && !report.is_empty()
    {
        // Best effort: a report that cannot be written leaves the plain exit status.
        let _ = status.write_all(report.as_bytes());
    }
    Ok(exit_code(code))
}

/// True when the file system of `dir` has no block or no inode left for an ordinary user.
fn full(dir: &Path) -> bool {
    rustix::fs::statvfs(dir).is_ok_and(|fs| fs.f_bavail == 0 || fs.f_favail == 0)
}

/// Stage 1: parent-death signal, cgroups, rlimits.
fn outer(plan: &Plan) -> Result<(), String> {
    let policy = &plan.policy;
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
    // The engine may have died between starting us and the line above. In a PID namespace of
    // its own (made by the spawner) `getppid` says 0: the spawner's pidfd tells instead.
    let gone = match &plan.spawner_pidfd {
        Some(pidfd) if plan.pid_ns_made => super::spawner::readable_now(pidfd),
        _ => plan
            .policy
            .parent
            .is_some_and(|parent| getppid() != Pid::from_raw(parent)),
    };
    if gone {
        return Err("the engine is gone".into());
    }
    // `0` is the writing thread (a `tasks` file) or process (`cgroup.procs`): this one.
    for procs in &policy.cgroups {
        std::fs::write(procs, "0")
            .map_err(|e| format!("cannot join cgroup {}: {e}", procs.display()))?;
    }
    let limits = [
        (Resource::Fsize, policy.fsize, "file size"),
        (Resource::Nproc, policy.nproc, "process"),
        (Resource::As, policy.address_space, "address space"),
    ];
    for (resource, limit, what) in limits {
        if let Some(n) = limit {
            set_limit(resource, n, n, what)?;
        }
    }
    if let Some(secs) = policy.cpu {
        // SIGXCPU at the soft limit, SIGKILL a second later.
        set_limit(Resource::Cpu, secs, secs.saturating_add(1), "CPU time")?;
    }
    Ok(())
}

fn set_limit(resource: Resource, soft: u64, hard: u64, what: &str) -> Result<(), String> {
    setrlimit(
        resource,
        Rlimit {
            current: Some(soft),
            maximum: Some(hard),
        },
    )
    .map_err(|e| format!("cannot set the {what} limit: {e}"))
}

/// Stage 2: the status file opened (before the mounts hide it), the mounts, Landlock, then no
/// capabilities (`--mode off`: the status file only). Returns the status file for the init.
fn inner(plan: &Plan) -> Result<Option<File>, String> {
    let policy = &plan.policy;
    if plan.mount_proc {
        // Started by the outer stage itself (not by `unshare`): die with it, and mount the
        // namespace's own `/proc` as `unshare --mount-proc` would.
        // (Its parent is outside the PID namespace, so `getppid` cannot tell whether it is still
        // there; should it have died just before this line, the call's process group and
        // cgroups, which the engine kills when the call ends, still hold this process.)
        rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
            .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
        super::mounts::mount_proc()?;
    }
    let status = match &policy.status {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map_err(|e| format!("cannot open the status file {}: {e}", path.display()))?,
        ),
        None => None,
    };
    if policy.unconfined() {
        return Ok(status);
    }
    let (Some(workspace), Some(tmp)) = (&policy.workspace, &policy.tmp) else {
        return Err("--workspace and --tmp are required".into());
    };
    if plan.private_mounts {
        let mut keep: Vec<&Path> = vec![workspace];
        keep.extend(policy.read.iter().map(PathBuf::as_path));
        let scratch = super::mounts::Scratch {
            path: tmp,
            size: policy.tmp_size,
        };
        let hidden = super::mounts::hide_host_dirs(&keep, &scratch, plan.mount_proc)
            .and_then(|()| super::mounts::hide_secrets(&policy.hide));
        match hidden {
            Ok(()) => {}
            Err(_) if policy.best_effort() => {}
            Err(e) => return Err(e),
        }
    }
    match landlock_rules::restrict_self(
        workspace,
        policy.workspace_writable(),
        tmp,
        &policy.read,
        policy.landlock_tcp,
    ) {
        Ok(_) => {}
        Err(_) if policy.best_effort() => {}
        Err(e) => return Err(e),
    }
    drop_capabilities(policy.best_effort(), plan.bounding_set_empty)?;
    Ok(status)
}

/// Empties the bounding set (so an exec as root regains nothing; unless `bounding_set_empty`:
/// the spawner that forked this process emptied its own) and then every capability set.
/// Without `CAP_SETPCAP` (not root) the bounding set cannot shrink, but then there is nothing to
/// drop either; `best_effort` ignores failures.
fn drop_capabilities(best_effort: bool, bounding_set_empty: bool) -> Result<(), String> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    if !bounding_set_empty {
        match super::caps::empty_bounding_set() {
            Ok(()) => {}
            Err(e) if !best_effort => return Err(e),
            Err(_) => {}
        }
    }
    let none = CapabilitySets {
        effective: CapabilitySet::empty(),
        permitted: CapabilitySet::empty(),
        inheritable: CapabilitySet::empty(),
    };
    match rustix::thread::set_capabilities(None, none) {
        Ok(()) => Ok(()),
        Err(_) if best_effort => Ok(()),
        Err(e) => Err(format!("cannot drop capabilities: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_is_found_in_the_commands_path_as_execvp_would() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(b.join("sub")).unwrap();
        // Not executable in `a`, executable in `b`; a directory of that name is no program.
        std::fs::write(a.join("tool"), "").unwrap();
        std::fs::write(b.join("tool"), "").unwrap();
        std::fs::set_permissions(b.join("tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths([&a, &b]).unwrap();
        let plan = Plan {
            env: Some(vec![("PATH".into(), path)]),
            ..Plan::default()
        };
        assert_eq!(plan.path_of(OsStr::new("tool")), b.join("tool"));
        assert_eq!(plan.path_of(OsStr::new("sub")), PathBuf::from("sub"));
        assert_eq!(
            plan.path_of(OsStr::new("missing")),
            PathBuf::from("missing")
        );
        assert_eq!(plan.path_of(OsStr::new("./tool")), PathBuf::from("./tool"));
    }

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_outer_stage_passes_the_confinement_on_to_the_inner_one() {
        let plan = Plan::parse(os(&[
            "--mode",
            "read-only",
            "--workspace",
            "/w",
            "--tmp",
            "/t",
            "--tmp-size",
            "4096",
            "--status",
            "/s",
            "--cgroup",
            "/sys/fs/cgroup/pids/x/tasks",
            "--fsize",
            "10",
            "--unshare",
            "/usr/bin/unshare",
            "--ns-flag",
            "--net",
            "--",
            "bash",
            "-c",
            "true",
        ]))
        .unwrap();
        assert!(!plan.policy.workspace_writable());
        assert_eq!(
            plan.policy.inner_args(),
            os(&[
                "--mode",
                "read-only",
                "--workspace",
                "/w",
                "--tmp",
                "/t",
                "--tmp-size",
                "4096",
                "--status",
                "/s"
            ])
        );
        assert_eq!(plan.program, os(&["bash", "-c", "true"]));
        assert_eq!(plan.policy.ns_flags, os(&["--net"]));
        assert!(Plan::parse(os(&["--mode", "bogus", "--", "x"])).is_err());
        assert!(Plan::parse(os(&["--mode", "off"])).is_err());
    }
}
