//! Process-tree control without confinement: how the engine keeps hold of every process a
//! long-lived helper starts — an MCP stdio server, whose files and network are its own business
//! — with the same mechanisms as a bash call, and no Landlock, namespaces or limits.
//!
//! * The helper leads a **process group** of its own (the caller sets that up; stopping it
//!   signals the group).
//! * It is started through the **trampoline's outer stage** (`switchboard sandbox-exec
//!   --contain …`, [`super::exec`]): the **parent-death signal** (SIGKILL when the engine dies,
//!   even by `kill -9`), then it joins a **cgroup of its own** (created under the engine's, as a
//!   bash call's, without limits) and only then execs the program — so everything the helper
//!   starts, `setsid` daemons and double forks included, is in that cgroup from its first
//!   instruction. [`Tree::kill`] kills every process left in the cgroup and removes it.
//! * Where no cgroup can be made (cgroup v2, a read-only hierarchy) or no trampoline is found,
//!   the helper carries a token in its environment ([`TOKEN_VAR`]) and [`Tree::kill`] also
//!   **sweeps** every process that still carries it — bash's direct mode ([`sweep`]). Without a
//!   trampoline there is no parent-death signal; a cgroup, if any, is joined right after the
//!   spawn.
//!
//! What survives: after `kill -9` of the engine, the helper itself dies (parent-death signal),
//! but processes it started in a session of their own stay until something kills them (bash
//! calls have PID namespaces for that; helpers do not, so that their view of the system is the
//! engine's).

use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::process::Command;

use super::Sandbox;
use super::cgroup::{CallCgroup, CgroupParents};
use super::exec::SUBCOMMAND;
use super::policy::CallPolicy;
use super::probe::{find_trampoline, probe_landlock};

/// The variable that marks every process of a tree that has no cgroup: a token unique to it.
pub const TOKEN_VAR: &str = crate::process_tree::CALL_TOKEN_VAR;

/// Distinguishes the tokens of concurrent trees.
static TOKEN_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A token unique to one tree of this engine.
pub fn new_token() -> String {
    format!(
        "{}-{}",
        std::process::id(),
        TOKEN_COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// What this machine offers for process-tree control, found once per engine.
#[derive(Debug, Clone, Default)]
pub struct Containment {
    trampoline: Option<PathBuf>,
    cgroups: CgroupParents,
}

impl Containment {
    /// The trampoline and cgroups of `sandbox` when it probed them (a confining mode), else
    /// found now — the trampoline from the sandbox's configuration or next to this binary,
    /// checked by asking it to answer as one.
    pub fn find(sandbox: &Sandbox) -> Containment {
        let status = sandbox.status();
        let trampoline = status.trampoline.clone().or_else(|| {
            sandbox
                .config()
                .trampoline
                .clone()
                .or_else(find_trampoline)
                .filter(|t| probe_landlock(t) >= 0)
        });
        let cgroups = if status.cgroups.pids.is_some() || status.cgroups.memory.is_some() {
            status.cgroups.clone()
        } else {
            CgroupParents::find()
        };
        Containment {
            trampoline,
            cgroups,
        }
    }

    /// `program args` with exactly the environment `env`, as a command that runs contained, and
    /// the guard of its tree. The caller adds its stdio and its process group; after the spawn,
    /// it hands the pid to [`Tree::adopt`].
    pub fn command<I, K, V>(&self, program: &str, args: &[String], env: I) -> (Command, Tree)
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        let cgroup = self.cgroups.create_tree();
        let mut cmd = match &self.trampoline {
            Some(trampoline) => {
                // The outer stage's part of a call's policy: the engine's pid and the cgroups.
                let policy = CallPolicy {
                    parent: Some(std::process::id() as i32),
                    cgroups: cgroup.iter().flat_map(CallCgroup::task_files).collect(),
                    ..CallPolicy::default()
                };
                let mut cmd = Command::new(trampoline);
                cmd.args([SUBCOMMAND, "--contain"])
                    .args(policy.args())
                    .arg("--")
                    .arg(program);
                cmd
            }
            None => Command::new(program),
        };
        cmd.args(args).env_clear().envs(env);
        // The token where the cgroup does not hold the tree from its first instruction.
        let token = (cgroup.is_none() || self.trampoline.is_none()).then(new_token);
        if let Some(token) = &token {
            cmd.env(TOKEN_VAR, token);
        }
        let joined = self.trampoline.is_some();
        (
            cmd,
            Tree {
                cgroup,
                joined,
                token,
            },
        )
    }
}

/// The guard of one helper's process tree: [`Tree::kill`] (or dropping it) kills every process
/// left of it.
#[derive(Debug)]
pub struct Tree {
    cgroup: Option<CallCgroup>,
    /// The helper joins the cgroup itself (through the trampoline).
    joined: bool,
    token: Option<String>,
}

impl Tree {
    /// Moves the spawned helper into its cgroup when the trampoline did not (right after the
    /// spawn; what it started before that is found by its token).
    pub fn adopt(&self, pid: u32) {
        if self.joined {
            return;
        }
        for procs in self.cgroup.iter().flat_map(CallCgroup::procs_files) {
            let _ = std::fs::write(procs, pid.to_string());
        }
    }

    /// Kills every process left of the tree (its cgroup, its token) and removes its cgroup.
    pub async fn kill(mut self) {
        let cgroup = self.cgroup.take();
        let token = self.token.take();
        if let Some(cgroup) = cgroup {
            let _ = tokio::task::spawn_blocking(move || cgroup.remove()).await;
        }
        if let Some(token) = token {
            sweep(token).await;
        }
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        let (cgroup, token) = (self.cgroup.take(), self.token.take());
        if cgroup.is_none() && token.is_none() {
            return;
        }
        let job = move || {
            if let Some(cgroup) = cgroup {
                cgroup.remove();
            }
            if let Some(token) = token {
                crate::process_tree::sweep_now(&token);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(job)),
            Err(_) => job(),
        }
    }
}

/// Kills every process whose environment carries `TOKEN_VAR=token` (processes that left their
/// group); see [`crate::process_tree::sweep`]. Bounded to two seconds.
pub use crate::process_tree::sweep;

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::process::{Pid, Signal, kill_process};
    use std::time::Duration;

    fn gone(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    }

    /// Polls for at most 5 s: a killed process takes a moment to die.
    async fn soon_gone(pid: u32) -> bool {
        for _ in 0..250 {
            if gone(pid) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        gone(pid)
    }

    /// Starts `sh` under `containment`; it starts `setsid sleep 60` (out of its group; without
    /// the token when `unmarked`) and prints that pid. Kills the tree and checks the sleep is
    /// gone.
    async fn a_setsid_child_is_killed_with_the_tree(containment: &Containment, unmarked: bool) {
        let path = std::env::var("PATH").unwrap_or_default();
        let unset = if unmarked {
            "env -u SWITCHBOARD_CALL_TOKEN"
        } else {
            ""
        };
        let script =
            format!("sleep 0.2; {unset} setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $!");
        let (mut cmd, tree) =
            containment.command("sh", &["-c".to_string(), script], [("PATH", path)]);
        let mut child = cmd
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        tree.adopt(child.id().unwrap());
        let mut out = String::new();
        let stdout = child.stdout.take().unwrap();
        tokio::io::AsyncBufReadExt::read_line(&mut tokio::io::BufReader::new(stdout), &mut out)
            .await
            .unwrap();
        let sleeper: u32 = out.trim().parse().expect(&out);
        let _ = child.wait().await;
        assert!(
            !gone(sleeper),
            "the setsid child runs after its parent ended"
        );
        tree.kill().await;
        assert!(
            soon_gone(sleeper).await,
            "the setsid child {sleeper} outlived its tree"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn without_a_cgroup_the_token_finds_what_left_the_group() {
        a_setsid_child_is_killed_with_the_tree(&Containment::default(), false).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_cgroup_of_its_own_holds_what_left_the_group() {
        let containment = Containment {
            trampoline: None,
            cgroups: CgroupParents::find(),
        };
        if containment.cgroups.pids.is_none() && containment.cgroups.memory.is_none() {
            eprintln!("SKIPPED: no writable v1 pids or memory cgroup here");
            return;
        }
        // Without its token: only the cgroup can find it.
        a_setsid_child_is_killed_with_the_tree(&containment, true).await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_sweep_kills_what_carries_the_token_and_nothing_else() {
        let token = new_token();
        let marked = std::process::Command::new("sleep")
            .arg("60")
            .env(TOKEN_VAR, &token)
            .spawn()
            .unwrap();
        let other = std::process::Command::new("sleep")
            .arg("60")
            .env(TOKEN_VAR, new_token())
            .spawn()
            .unwrap();
        sweep(token).await;
        assert!(soon_gone(marked.id()).await, "the marked process was swept");
        assert!(!gone(other.id()), "another token's process was left alone");
        let _ = kill_process(Pid::from_child(&other), Signal::KILL);
        let (mut marked, mut other) = (marked, other);
        let _ = (marked.wait(), other.wait());
    }
}
