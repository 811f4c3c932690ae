//! Each call runs in namespaces of its own — PID, mount, network, and IPC, UTS and cgroup: a
//! System V shared-memory segment one session's command creates is invisible to another
//! session's command running at the same time, and a segment of a host process (0600, owned by
//! the engine's user) can be neither seen nor removed with `ipcrm`.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::sandbox::*;
use switchboard::Workspace;
use switchboard::sandbox::SandboxMode;

/// The rows of an `ipcs -m` listing (segments, not headers).
fn segments(listing: &str) -> Vec<&str> {
    listing.lines().filter(|l| l.starts_with("0x")).collect()
}

/// True when an `ipcs -m` listing has a segment with this shmid (the second column).
fn listed(listing: &str, id: &str) -> bool {
    segments(listing)
        .iter()
        .any(|row| row.split_whitespace().nth(1) == Some(id))
}

/// `Shared memory id: N` → N.
fn shmid(ipcmk_output: &str) -> String {
    ipcmk_output
        .trim()
        .rsplit(' ')
        .next()
        .filter(|id| id.parse::<u32>().is_ok())
        .unwrap_or_else(|| panic!("not ipcmk's answer: {ipcmk_output:?}"))
        .to_string()
}

/// A segment of this (host) process, removed when dropped.
struct HostSegment(String);

impl HostSegment {
    fn create() -> HostSegment {
        let out = Command::new("ipcmk")
            .args(["-M", "4096", "-p", "0600"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        HostSegment(shmid(&String::from_utf8_lossy(&out.stdout)))
    }

    fn exists(&self) -> bool {
        let out = Command::new("ipcs").arg("-m").output().unwrap();
        listed(&String::from_utf8_lossy(&out.stdout), &self.0)
    }
}

impl Drop for HostSegment {
    fn drop(&mut self) {
        let _ = Command::new("ipcrm").args(["-m", &self.0]).output();
    }
}

/// A segment a call made, by `KEY SHMID`: removed from the host if it is there when dropped.
struct LeftBehind(String);

impl Drop for LeftBehind {
    fn drop(&mut self) {
        let out = Command::new("ipcs").arg("-m").output().unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        let on_host = segments(&listing)
            .iter()
            .any(|row| row.split_whitespace().take(2).collect::<Vec<_>>().join(" ") == self.0);
        if let (true, Some(id)) = (on_host, self.0.split(' ').nth(1)) {
            let _ = Command::new("ipcrm").args(["-m", id]).output();
        }
    }
}

fn tools_present() -> bool {
    available(
        "ipcmk and ipcs (util-linux)",
        Path::new("/usr/bin/ipcmk").exists() && Path::new("/usr/bin/ipcs").exists(),
    )
}

/// The namespace links of this process, `ipc:[4026531839]`…, by kind.
fn own_namespace(kind: &str) -> String {
    std::fs::read_link(format!("/proc/self/ns/{kind}"))
        .unwrap()
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sessions_shared_memory_is_invisible_to_another_session() {
    if !tools_present() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    let Some(engine) = engine(None, config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    if !available(
        "an IPC namespace per call",
        engine.sandbox().status().namespaces.contains(&"ipc"),
    ) {
        return;
    }
    let session_a = engine.session_in(Workspace::open(&a).unwrap());
    let session_b = engine.session_in(Workspace::open(&b).unwrap());
    // A makes a segment and keeps running (its namespace alive) until B has looked.
    let cmd_a = "ipcmk -M 4096 > made.tmp && mv made.tmp made; \
                 for i in $(seq 1 600); do [ -e release ] && break; sleep 0.05; done; \
                 echo NS $(readlink /proc/self/ns/ipc); ipcs -m";
    let looker = async {
        for _ in 0..600 {
            if a.join("made").exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let made = std::fs::read_to_string(a.join("made")).expect("A made its segment");
        let r = bash(&session_b, "echo NS $(readlink /proc/self/ns/ipc); ipcs -m").await;
        std::fs::write(a.join("release"), "").unwrap();
        (shmid(&made), ok_text(&r).to_string())
    };
    let (ra, (id, seen_by_b)) = tokio::join!(bash(&session_a, cmd_a), looker);
    let seen_by_a = ok_text(&ra);
    // Were A's segment the host's (no IPC namespace), it would outlive the test: remove it then.
    let _cleanup = segments(seen_by_a)
        .first()
        .map(|row| LeftBehind(row.split_whitespace().take(2).collect::<Vec<_>>().join(" ")));
    // A sees its own segment; B, running at the same time, sees no segment at all.
    assert_eq!(segments(seen_by_a).len(), 1, "{seen_by_a}");
    assert!(listed(seen_by_a, &id), "{seen_by_a}");
    assert_eq!(segments(&seen_by_b), Vec::<&str>::new(), "{seen_by_b}");
    let ns = |text: &str| {
        text.lines()
            .find(|l| l.starts_with("NS "))
            .unwrap()
            .to_string()
    };
    assert_ne!(
        ns(seen_by_a),
        ns(&seen_by_b),
        "two calls, one IPC namespace"
    );
}

#[tokio::test]
async fn a_host_segment_can_be_neither_seen_nor_removed() {
    if !tools_present() {
        return;
    }
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    if !available(
        "an IPC namespace per call",
        engine.sandbox().status().namespaces.contains(&"ipc"),
    ) {
        return;
    }
    let host = HostSegment::create();
    assert!(host.exists());
    let r = bash(
        &engine.session(),
        &format!(
            "ipcs -m; ipcrm -m {id} 2>/dev/null; echo removed $?",
            id = host.0
        ),
    )
    .await;
    let text = ok_text(&r);
    assert_eq!(segments(text), Vec::<&str>::new(), "{text}");
    assert!(text.contains("removed 1"), "{text}");
    assert!(host.exists(), "the host's segment is gone");
}

#[tokio::test]
async fn a_call_has_its_own_ipc_uts_cgroup_network_pid_and_mount_namespaces() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let status = engine.sandbox().status();
    let mut kinds: Vec<&str> = vec!["pid", "mnt"];
    kinds.extend(status.namespaces.iter().copied());
    if status.network_namespace {
        kinds.push("net");
    }
    for ns in ["ipc", "uts", "cgroup"] {
        if !available(&format!("a {ns} namespace per call"), kinds.contains(&ns)) {
            return;
        }
    }
    let command: Vec<String> = kinds
        .iter()
        .map(|k| format!("readlink /proc/self/ns/{k}"))
        .collect();
    let r = bash(&engine.session(), &command.join("; ")).await;
    let inside: Vec<&str> = ok_text(&r).lines().collect();
    assert_eq!(inside.len(), kinds.len(), "{inside:?}");
    for (kind, link) in kinds.iter().zip(inside) {
        assert!(link.starts_with(&format!("{kind}:[")), "{link}");
        assert_ne!(
            link,
            own_namespace(kind),
            "the call shares the host's {kind} namespace"
        );
    }
}
