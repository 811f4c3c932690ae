//! The trampoline: `switchboard sandbox-exec [options] -- PROGRAM ARGS…` (hidden from `--help`),
//! the process the engine starts for each confined call. It confines *itself* with safe crates
//! and then execs the command, so the crate needs no `unsafe` `pre_exec` hook.
//!
//! Two stages, because mounting a fresh `/proc` needs privileges that Landlock takes away:
//!
//! 1. **outer** (a child of the engine): parent-death signal `SIGKILL` (so `kill -9` of the
//!    engine ends the call: the signal survives the exec into `unshare`, whose `--kill-child`
//!    then ends the namespace, and with it every process of the call); joins the call's cgroups;
//!    sets the rlimits (`RLIMIT_FSIZE`, `RLIMIT_CPU`, and `RLIMIT_NPROC` / `RLIMIT_AS` where
//!    no cgroup bounds processes / memory); then execs `unshare <flags> -- <this binary>
//!    sandbox-exec --inner …` (or runs the inner stage itself when namespaces are unavailable).
//! 2. **inner** (pid 1 of the call's PID namespace, behind its own `/proc`, in IPC, UTS and
//!    cgroup namespaces of its own and, without `--allow-network`, in a network namespace with
//!    only loopback): covers the host's socket
//!    directories in its private mount namespace ([`super::mounts`]), applies the Landlock
//!    ruleset ([`super::landlock_rules`]), drops every capability (bounding set included, so
//!    not even a root command gets them back), then execs the command.
//!
//! Both stages first mark every descriptor above stderr close-on-exec, whatever the engine (or an
//! embedder's process) inherited: the command gets stdin, stdout and stderr, nothing else.
//!
//! Any failure exits [`TRAMPOLINE_FAILED`] with one line on stderr starting with
//! [`FAILURE_PREFIX`]; the engine turns that into an `execution_error`. Nothing runs then.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use rustix::process::{Pid, Resource, Rlimit, Signal, getppid, setrlimit};

use super::landlock_rules;

/// The subcommand name.
pub const SUBCOMMAND: &str = "sandbox-exec";
/// Exit status of a trampoline that could not confine itself (nothing ran).
pub const TRAMPOLINE_FAILED: u8 = 125;
/// First words of the trampoline's failure line on stderr.
pub const FAILURE_PREFIX: &str = "switchboard sandbox-exec:";

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
    match Plan::parse(args).and_then(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{FAILURE_PREFIX} {e}");
            ExitCode::from(TRAMPOLINE_FAILED)
        }
    }
}

/// The parsed command line.
#[derive(Debug, Default)]
struct Plan {
    probe: bool,
    inner: bool,
    /// The inner stage runs in its own mount namespace (started by `unshare --mount-proc`).
    private_mounts: bool,
    best_effort: bool,
    workspace_writable: bool,
    workspace: Option<PathBuf>,
    tmp: Option<PathBuf>,
    /// More paths to keep visible and readable.
    read: Vec<PathBuf>,
    landlock_tcp: bool,
    parent: Option<i32>,
    cgroups: Vec<PathBuf>,
    nproc: Option<u64>,
    address_space: Option<u64>,
    fsize: Option<u64>,
    cpu: Option<u64>,
    unshare: Option<PathBuf>,
    ns_flags: Vec<OsString>,
    /// Everything that the inner stage needs again (re-passed by the outer stage).
    inner_args: Vec<OsString>,
    program: Vec<OsString>,
}

impl Plan {
    fn parse(args: Vec<OsString>) -> Result<Plan, String> {
        let mut plan = Plan::default();
        let mut it = args.into_iter();
        while let Some(arg) = it.next() {
            let flag = arg.to_string_lossy().into_owned();
            let value = |it: &mut std::vec::IntoIter<OsString>| {
                it.next().ok_or_else(|| format!("{flag} needs a value"))
            };
            let number = |v: OsString| {
                v.to_string_lossy()
                    .parse::<u64>()
                    .map_err(|_| format!("{flag}: not a number: {v:?}"))
            };
            match flag.as_str() {
                "--" => {
                    plan.program = it.collect();
                    break;
                }
                "--probe" => plan.probe = true,
                "--inner" => plan.inner = true,
                "--private-mounts" => plan.private_mounts = true,
                "--mode" => {
                    let mode = value(&mut it)?;
                    plan.inner_args.extend([arg, mode.clone()]);
                    let mode = mode
                        .to_string_lossy()
                        .parse::<super::SandboxMode>()
                        .map_err(|e| e.to_string())?;
                    plan.best_effort = mode == super::SandboxMode::BestEffort;
                    plan.workspace_writable = mode.workspace_writable();
                }
                "--workspace" | "--tmp" => {
                    let v = value(&mut it)?;
                    plan.inner_args.extend([arg.clone(), v.clone()]);
                    if flag == "--tmp" {
                        plan.tmp = Some(v.into());
                    } else {
                        plan.workspace = Some(v.into());
                    }
                }
                "--read" => {
                    let v = value(&mut it)?;
                    plan.inner_args.extend([arg.clone(), v.clone()]);
                    plan.read.push(v.into());
                }
                "--landlock-tcp" => {
                    plan.landlock_tcp = true;
                    plan.inner_args.push(arg);
                }
                "--parent" => plan.parent = Some(number(value(&mut it)?)? as i32),
                "--cgroup" => plan.cgroups.push(value(&mut it)?.into()),
                "--nproc" => plan.nproc = Some(number(value(&mut it)?)?),
                "--as" => plan.address_space = Some(number(value(&mut it)?)?),
                "--fsize" => plan.fsize = Some(number(value(&mut it)?)?),
                "--cpu" => plan.cpu = Some(number(value(&mut it)?)?),
                "--unshare" => plan.unshare = Some(value(&mut it)?.into()),
                "--ns-flag" => plan.ns_flags.push(value(&mut it)?),
                other => return Err(format!("unknown option {other}")),
            }
        }
        if !plan.probe && plan.program.is_empty() {
            return Err("no command after --".into());
        }
        Ok(plan)
    }
}

fn run(plan: Plan) -> Result<(), String> {
    if plan.probe {
        println!("landlock_abi={}", landlock_rules::probe_abi());
        return Ok(());
    }
    if !plan.inner {
        outer(&plan)?;
        if let Some(unshare) = &plan.unshare {
            let me = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
            let err = Command::new(unshare)
                .args(&plan.ns_flags)
                .arg("--")
                .arg(me)
                .arg(SUBCOMMAND)
                .arg("--inner")
                .arg("--private-mounts")
                .args(&plan.inner_args)
                .arg("--")
                .args(&plan.program)
                .exec();
            return Err(format!("cannot run {}: {err}", unshare.display()));
        }
    }
    inner(&plan)?;
    let err = Command::new(&plan.program[0])
        .args(&plan.program[1..])
        .exec();
    Err(format!("cannot run {:?}: {err}", plan.program[0]))
}

/// Stage 1: parent-death signal, cgroups, rlimits.
fn outer(plan: &Plan) -> Result<(), String> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
    // The engine may have died between starting us and the line above.
    if let Some(parent) = plan.parent
        && getppid() != Pid::from_raw(parent)
    {
        return Err("the engine is gone".into());
    }
    let me = std::process::id().to_string();
    for procs in &plan.cgroups {
        std::fs::write(procs, &me)
            .map_err(|e| format!("cannot join cgroup {}: {e}", procs.display()))?;
    }
    let limits = [
        (Resource::Fsize, plan.fsize, "file size"),
        (Resource::Nproc, plan.nproc, "process"),
        (Resource::As, plan.address_space, "address space"),
    ];
    for (resource, limit, what) in limits {
        if let Some(n) = limit {
            set_limit(resource, n, n, what)?;
        }
    }
    if let Some(secs) = plan.cpu {
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

/// Stage 2: Landlock, then no capabilities.
fn inner(plan: &Plan) -> Result<(), String> {
    let (Some(workspace), Some(tmp)) = (&plan.workspace, &plan.tmp) else {
        return Err("--workspace and --tmp are required".into());
    };
    if plan.private_mounts {
        let mut keep: Vec<&Path> = vec![workspace, tmp];
        keep.extend(plan.read.iter().map(PathBuf::as_path));
        match super::mounts::hide_host_dirs(&keep) {
            Ok(()) => {}
            Err(_) if plan.best_effort => {}
            Err(e) => return Err(e),
        }
    }
    match landlock_rules::restrict_self(
        workspace,
        plan.workspace_writable,
        tmp,
        &plan.read,
        plan.landlock_tcp,
    ) {
        Ok(_) => {}
        Err(_) if plan.best_effort => {}
        Err(e) => return Err(e),
    }
    drop_capabilities(plan.best_effort)
}

/// Empties the bounding set (so an exec as root regains nothing) and then every capability set.
/// Without `CAP_SETPCAP` (not root) the bounding set cannot shrink, but then there is nothing to
/// drop either; `best_effort` ignores failures.
fn drop_capabilities(best_effort: bool) -> Result<(), String> {
    use rustix::thread::{CapabilitySet, CapabilitySets};
    let held = rustix::thread::capabilities(None).map_err(|e| format!("capget: {e}"))?;
    if held.effective.contains(CapabilitySet::SETPCAP) {
        for cap in CapabilitySet::all().iter() {
            match rustix::thread::remove_capability_from_bounding_set(cap) {
                // EINVAL: a capability this kernel does not know.
                Ok(()) | Err(rustix::io::Errno::INVAL) => {}
                Err(e) if !best_effort => return Err(format!("cannot drop capabilities: {e}")),
                Err(_) => {}
            }
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
            "--cgroup",
            "/sys/fs/cgroup/pids/x/cgroup.procs",
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
        assert!(!plan.workspace_writable);
        assert_eq!(
            plan.inner_args,
            os(&["--mode", "read-only", "--workspace", "/w", "--tmp", "/t"])
        );
        assert_eq!(plan.program, os(&["bash", "-c", "true"]));
        assert_eq!(plan.ns_flags, os(&["--net"]));
        assert!(Plan::parse(os(&["--mode", "bogus", "--", "x"])).is_err());
        assert!(Plan::parse(os(&["--mode", "off"])).is_err());
    }
}
