//! The spawner: one process per engine, started with its first call, forks every call's
//! trampoline (no program start per call besides the command's shell). It keeps none of the
//! engine's environment; when it is killed, the call it was running fails with a clear error
//! and leaves nothing behind, and the next call gets a new one; it ends with the engine. A
//! trampoline that will not be a spawner still confines every call, started for each. Calls
//! running at once never share a network namespace the spawner made ahead, and one given to a
//! later call keeps nothing of the call before.

use crate::common;

use std::time::Duration;

use common::direct::{marked_processes, survivors};
use common::sandbox::*;
use switchboard::ErrorCode;
use switchboard::Workspace;
use switchboard::sandbox::SandboxMode;

/// The parent pid of `pid`, from `/proc/<pid>/stat` (the field after the name in parentheses).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    after_name.split(' ').nth(1)?.parse().ok()
}

/// True while `pid` is a live process (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|i| stat.get(i + 2..i + 3))
            .is_some_and(|state| state != "Z")
    })
}

/// Waits (bounded, 5 s) until the call `id` has a process, and returns one.
async fn first_process_of(id: &str) -> u32 {
    for _ in 0..100 {
        if let Some(pid) = marked_processes(id).first() {
            return pid.parse().unwrap();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the call {id} never started");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_spawner_per_engine_forks_every_call_and_keeps_none_of_the_engines_environment() {
    for mode in [SandboxMode::WorkspaceWrite, SandboxMode::Off] {
        let (_dir, ws) = temp_workspace();
        let Some(engine) = engine(Some(&ws), config(mode)) else {
            return;
        };
        assert_eq!(engine.sandbox().spawner_pid().await, None, "{mode}");
        let session = engine.session();
        let mut spawners = Vec::new();
        for _ in 0..2 {
            let id = common::fresh("spawned");
            let call = bash_call(&id, "sleep 1; echo done", Duration::from_secs(30));
            let running = {
                let session = session.clone();
                tokio::spawn(async move { session.dispatch(vec![call]).await })
            };
            // The command's shell (marked with the call's id) → the namespace's init → (where
            // the spawner could not make the PID namespace itself: the call's outer stage) →
            // the spawner → this process.
            let shell = first_process_of(&id).await;
            let mut chain = vec![parent_of(shell).unwrap()];
            while let Some(up) = parent_of(*chain.last().unwrap())
                && up != std::process::id()
                && chain.len() < 4
            {
                chain.push(up);
            }
            let spawner = *chain.last().unwrap();
            assert_eq!(parent_of(spawner), Some(std::process::id()), "{mode}");
            assert!((2..=3).contains(&chain.len()), "{mode}: {chain:?}");
            assert_eq!(
                engine.sandbox().spawner_pid().await,
                Some(spawner),
                "{mode}"
            );
            for pid in &chain {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
                assert!(
                    String::from_utf8_lossy(&cmdline).contains("--spawner"),
                    "{mode}: the call's processes are the spawner forked"
                );
            }
            if rustix::process::geteuid().is_root() {
                assert_eq!(
                    chain.len(),
                    2,
                    "{mode}: as root the init is the spawner's child"
                );
            }
            let environ = std::fs::read(format!("/proc/{spawner}/environ")).unwrap();
            assert!(
                environ.is_empty(),
                "{mode}: the spawner keeps none of the engine's environment: {:?}",
                String::from_utf8_lossy(&environ)
            );
            let r = running.await.unwrap().unwrap().remove(0);
            assert_eq!(ok_text(&r), "done", "{mode}");
            spawners.push(spawner);
        }
        assert_eq!(
            spawners[0], spawners[1],
            "{mode}: one spawner for both calls"
        );
        // It ends with the engine.
        drop(session);
        drop(engine);
        let spawner = spawners[0];
        for _ in 0..100 {
            if !alive(spawner) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!alive(spawner), "{mode}: the spawner outlived its engine");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawner_killed_during_a_call_fails_that_call_and_leaves_nothing_and_the_next_call_works()
{
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let session = engine.session();
    assert_eq!(ok_text(&bash(&session, "echo warm").await), "warm");
    let first = engine
        .sandbox()
        .spawner_pid()
        .await
        .expect("a spawner runs");

    let id = common::fresh("orphaned");
    let command = "setsid sleep 300 & (sleep 300 &); sleep 300";
    let call = bash_call(&id, command, Duration::from_secs(60));
    let running = {
        let session = session.clone();
        tokio::spawn(async move { session.dispatch(vec![call]).await })
    };
    first_process_of(&id).await;
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(first as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(20), running)
        .await
        .expect("the call ends when its spawner dies")
        .unwrap()
        .unwrap()
        .remove(0);
    let text = error_text(&r, ErrorCode::ExecutionError);
    assert!(text.contains("spawner ended"), "{text}");
    assert_eq!(survivors(&id).await, Vec::<String>::new());

    assert_eq!(ok_text(&bash(&session, "echo again").await), "again");
    let second = engine.sandbox().spawner_pid().await.expect("a new spawner");
    assert_ne!(first, second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_running_at_once_never_share_a_network_namespace() {
    let Some(engine) = engine(None, config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    // One workspace per session: commands of one workspace run one at a time.
    let dir = tempfile::tempdir().unwrap();
    let workspaces: Vec<Workspace> = (0..4)
        .map(|i| {
            let path = dir.path().join(i.to_string());
            std::fs::create_dir(&path).unwrap();
            Workspace::open(&path).unwrap()
        })
        .collect();
    let host = std::fs::read_link("/proc/self/ns/net").unwrap();
    // The spawner makes network namespaces while it waits and gives those of ended calls again
    // (as root): whichever call gets which, no two calls running at once may have the same
    // one, nor the host's. (Namespaces are given again, and a namespace's number may be reused
    // once it is gone, so only calls that overlapped count.)
    let look = "date +%s%N; readlink /proc/self/ns/net; sleep 0.3; date +%s%N";
    let mut overlapping = 0;
    for _ in 0..3 {
        let calls: Vec<_> = workspaces
            .iter()
            .map(|ws| {
                let session = engine.session_in(ws.clone());
                tokio::spawn(async move { bash(&session, look).await })
            })
            .collect();
        let mut seen: Vec<(u128, String, u128)> = Vec::new();
        for call in calls {
            let r = call.await.unwrap();
            let out = ok_text(&r).to_string();
            let lines: Vec<&str> = out.lines().collect();
            assert_ne!(std::path::Path::new(lines[1]), host, "{out}");
            seen.push((
                lines[0].parse().unwrap(),
                lines[1].to_string(),
                lines[2].parse().unwrap(),
            ));
        }
        for (i, a) in seen.iter().enumerate() {
            for b in &seen[..i] {
                if a.0 < b.2 && b.0 < a.2 {
                    overlapping += 1;
                    assert_ne!(a.1, b.1, "two calls at once shared a namespace: {seen:?}");
                }
            }
        }
    }
    assert!(overlapping > 0, "no two calls ran at once");
}

/// Every call the spawner forks has no capability, and none it could regain: its effective,
/// permitted and bounding sets are empty (the spawner empties its bounding set once, before
/// its first confined call, and its calls inherit it).
#[tokio::test]
async fn calls_forked_by_the_spawner_hold_no_capability_and_can_gain_none() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let session = engine.session();
    for _ in 0..2 {
        let r = bash(
            &session,
            "grep -E '^Cap(Eff|Prm|Bnd|Amb)' /proc/self/status",
        )
        .await;
        let text = ok_text(&r).to_string();
        assert_eq!(text.lines().count(), 4, "{text}");
        for line in text.lines() {
            assert!(line.ends_with("\t0000000000000000"), "{text}");
        }
    }
    assert!(engine.sandbox().spawner_pid().await.is_some());
}

/// A network namespace is given to a later call once every process of the call before has
/// ended: a socket that call left bound (by a process still running when its shell exited) is
/// gone, and its name free, for the next call in the same namespace.
#[tokio::test]
async fn a_network_namespace_given_again_keeps_nothing_of_the_call_before() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    if !available(
        "python3 (binds the abstract unix socket)",
        std::path::Path::new("/usr/bin/python3").exists(),
    ) {
        return;
    }
    let session = engine.session();
    // The spawner starts with this call, which may then find no namespace made ahead; the
    // next ones find one.
    assert_eq!(ok_text(&bash(&session, "echo warm").await), "warm");
    let bind = "import socket, time; s = socket.socket(socket.AF_UNIX); \
                s.bind('\\0switchboard-test'); s.listen(); print('bound', flush=True)";
    // The holder runs on after the shell has exited (until the call's end ends it).
    let first = bash(
        &session,
        &format!(
            "readlink /proc/self/ns/net; \
             (/usr/bin/python3 -c \"{bind}; time.sleep(60)\" 2>/dev/null &) | head -n 1"
        ),
    )
    .await;
    let out = ok_text(&first).to_string();
    let (netns, said) = out.split_once('\n').expect("two lines");
    assert_eq!(said, "bound", "{out}");
    // As root the next call gets the same namespace (given back as the call ends); any call
    // finds the name free.
    let again = bash(
        &session,
        &format!("readlink /proc/self/ns/net; /usr/bin/python3 -c \"{bind}\" 2>&1"),
    )
    .await;
    let out = ok_text(&again).to_string();
    assert!(out.ends_with("\nbound"), "{out}");
    if rustix::process::geteuid().is_root() {
        assert_eq!(out.lines().next(), Some(netns), "not given again: {out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_spawner_each_call_starts_its_trampoline_with_the_same_confinement() {
    // A trampoline that will not be a spawner (as an older build would refuse the flag): the
    // engine falls back to starting the trampoline for each call.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("no-spawner");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \" $* \" in *\" --spawner \"*) echo 'unknown option --spawner' >&2; exit 125;; esac\nexec {TRAMPOLINE} \"$@\"\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (_ws_dir, ws) = temp_workspace();
    let Some(engine) = engine(
        Some(&ws),
        config(SandboxMode::WorkspaceWrite).trampoline(&script),
    ) else {
        return;
    };
    let session = engine.session();
    for _ in 0..2 {
        let r = bash(
            &session,
            "echo $$; touch /etc/x 2>/dev/null || echo refused; tr '\\0' ' ' < /proc/1/cmdline",
        )
        .await;
        let out = ok_text(&r);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[..2], ["2", "refused"], "{out}");
        // The init is the trampoline started for this call, not a spawner forked.
        assert!(!lines[2].contains("--spawner"), "{out}");
        assert!(lines[2].contains(" sandbox-exec "), "{out}");
    }
    assert_eq!(engine.sandbox().spawner_pid().await, None);
}
