//! Under the default sandbox (`workspace-write`), bash reads and writes its own workspace and
//! private `TMPDIR` and runs the system's tools, and every way out — `..`, absolute paths, a
//! sibling session's workspace, a symlink, `cd / && rm -rf` — is refused with nothing outside
//! changed. `read-only` keeps the workspace unwritten, by bash and by the file tools alike.

use crate::common;

use std::path::Path;

use common::sandbox::*;
use serde_json::json;
use switchboard::sandbox::{HIDDEN_DIRS, SandboxMode};
use switchboard::{ErrorCode, ToolCall, Workspace};

#[tokio::test]
async fn escapes_from_the_workspace_are_refused_and_change_nothing_outside() {
    let (dir, ws) = temp_workspace();
    // Outside the workspace: a secret (like ~/.bashrc), a sibling session's workspace, and a
    // tree that a `cd / && rm -rf` aims at.
    // Below the build's own temporary directory: outside the directories the sandbox hides
    // (`/tmp`, …) — so Landlock alone must refuse — unless the checkout itself lies below one of
    // them (a clone in `/tmp`); then the sandbox's mounts hide it as well.
    let visible = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let hidden_by = hidden_by_the_sandbox(visible.path());
    if let Some(hidden) = hidden_by {
        println!(
            "note: the checkout lies below {hidden}, which the sandbox hides: the files outside \
             are out of sight, so only `ls /` shows Landlock's own refusal"
        );
    }
    let outside = visible.path().join("outside");
    std::fs::create_dir_all(outside.join("tree/sub")).unwrap();
    std::fs::write(outside.join("secret"), "TOP-SECRET-42").unwrap();
    std::fs::write(outside.join("tree/sub/keep"), "keep me").unwrap();
    let sibling = dir.path().join("sibling");
    std::fs::create_dir(&sibling).unwrap();
    std::fs::write(sibling.join("notes.md"), "SIBLING-NOTES-7").unwrap();
    let Some(engine) = engine(None, config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let session = engine.session_in(ws.clone());
    let _other = engine.session_in(Workspace::open(&sibling).unwrap());
    let before = snapshot(dir.path());
    let visible_before = snapshot(visible.path());
    let etc_before = std::fs::read_dir("/etc").unwrap().count();

    let secret = outside.join("secret");
    let tree = outside.join("tree");
    let tree_from_root = tree.strip_prefix("/").unwrap();
    let attempts = [
        "touch ../x".to_string(),
        "echo pwned > /etc/switchboard-sandbox-test".to_string(),
        format!("cat {}", sibling.join("notes.md").display()),
        format!("cat {}", secret.display()),
        format!("ls {}", sibling.display()),
        format!("ln -s {} link && cat link", secret.display()),
        format!(
            "ln -s {} dirlink && echo x > dirlink/planted",
            outside.display()
        ),
        format!("cd / && rm -rf {}", tree_from_root.display()),
        format!("cp {} ./copied", secret.display()),
        format!("mv {} ./moved", sibling.join("notes.md").display()),
        // The engine (this test process) is out of sight and out of reach.
        format!("cat /proc/{}/environ", std::process::id()),
        // World-readable and hidden by no mount wherever the checkout lies: Landlock refuses.
        "ls /".to_string(),
    ];
    for command in &attempts {
        let r = bash(&session, command).await;
        let text = ok_text(&r);
        let visible_rel = visible.path().strip_prefix("/").unwrap().to_string_lossy();
        let on_visible = command.contains(&*visible_rel) && !command.starts_with("ln");
        // `rm -f` of a path it cannot see at all says nothing; the snapshots below prove that
        // the tree is still there.
        let silent = on_visible && hidden_by.is_some() && command.contains("rm -rf");
        // Refused by Landlock, or not even visible (below a directory the sandbox hides).
        assert!(
            silent
                || [
                    "Permission denied",
                    "Operation not permitted",
                    "No such file or directory"
                ]
                .iter()
                .any(|refusal| text.contains(refusal)),
            "{command}: {text}"
        );
        if (on_visible && hidden_by.is_none()) || command == "ls /" {
            assert!(text.contains("Permission denied"), "{command}: {text}");
        }
        assert!(
            !text.contains("TOP-SECRET-42") && !text.contains("SIBLING-NOTES-7"),
            "{command} leaked: {text}"
        );
    }
    // Signals to the engine are refused (`kill -0` only checks, so a failure here cannot stop
    // the test process).
    let r = bash(
        &session,
        &format!("kill -0 {} && echo REACHABLE", std::process::id()),
    )
    .await;
    let text = ok_text(&r);
    assert!(
        !text.contains("REACHABLE") && text.contains("[exit code: 1]"),
        "{text}"
    );
    // Only the workspace changed (the symlinks the commands made inside it).
    let after: Vec<_> = snapshot(dir.path())
        .into_iter()
        .filter(|(p, _)| !p.starts_with(&ws.root().display().to_string()))
        .collect();
    let before: Vec<_> = before
        .into_iter()
        .filter(|(p, _)| !p.starts_with(&ws.root().display().to_string()))
        .collect();
    assert_eq!(after, before, "something outside the workspace changed");
    assert_eq!(
        snapshot(visible.path()),
        visible_before,
        "something outside changed"
    );
    assert!(!std::path::Path::new("/etc/switchboard-sandbox-test").exists());
    assert_eq!(std::fs::read_dir("/etc").unwrap().count(), etc_before);
    assert!(!ws.root().join("copied").exists() && !ws.root().join("moved").exists());
}

/// The directory of [`HIDDEN_DIRS`] that `path` lies below, if any — judged as the sandbox
/// does (real directories only; `path` resolved).
fn hidden_by_the_sandbox(path: &Path) -> Option<&'static str> {
    let path = path.canonicalize().unwrap();
    HIDDEN_DIRS.into_iter().find(|dir| {
        std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) && path.starts_with(dir)
    })
}

#[tokio::test]
async fn the_workspace_tmpdir_and_system_tools_work_inside() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let session = engine.session();
    let r = bash(
        &session,
        "mkdir -p d && echo inside > d/f && cat d/f && echo scratch > \"$TMPDIR/t\" && \
         cat \"$TMPDIR/t\" && echo \"$TMPDIR\" && /usr/bin/env sort --version | head -n 1 && \
         printf 'b\\na\\n' | sort | tr '\\n' ' '",
    )
    .await;
    let text = ok_text(&r).to_string();
    assert!(text.starts_with("inside\nscratch\n"), "{text}");
    assert!(
        text.contains("sort (GNU coreutils)") && text.contains("a b"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.root().join("d/f")).unwrap(),
        "inside\n"
    );
    // The private TMPDIR is outside the workspace, and its files are gone once the call has
    // ended: on the host its path is an empty directory (the mount point of the call's tmpfs,
    // kept for a later call) or nothing.
    let tmpdir = text.lines().nth(2).unwrap().to_string();
    assert!(
        !tmpdir.starts_with(&ws.root().display().to_string()),
        "{tmpdir}"
    );
    let left = std::fs::read_dir(&tmpdir).map_or(0, |d| d.count());
    assert_eq!(left, 0, "{tmpdir} kept files of the call");
    // Later calls, given the same TMPDIR path or another, find none of the first one's files.
    for _ in 0..3 {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let r = bash(&session, "ls -A \"$TMPDIR\" | wc -l").await;
        assert_eq!(ok_text(&r).trim(), "0");
    }
}

#[tokio::test]
async fn read_only_keeps_the_workspace_unwritten_by_bash_and_the_file_tools() {
    let (_dir, ws) = temp_workspace();
    std::fs::write(ws.root().join("a.txt"), "original").unwrap();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::ReadOnly)) else {
        return;
    };
    let session = engine.session();
    let r = bash(
        &session,
        "cat a.txt; echo; echo changed > a.txt; touch new; echo tmp > \"$TMPDIR/x\" && echo tmp-ok",
    )
    .await;
    let text = ok_text(&r);
    assert!(text.starts_with("original\n"), "{text}");
    assert!(
        text.contains("Permission denied") && text.contains("tmp-ok"),
        "{text}"
    );
    let results = session
        .dispatch(vec![
            ToolCall::new("w", "write_file", json!({"path": "b.txt", "content": "x"})),
            ToolCall::new(
                "e",
                "edit_file",
                json!({"path": "a.txt", "old_text": "original", "new_text": "edited"}),
            ),
            ToolCall::new("r", "read_file", json!({"path": "a.txt"})),
        ])
        .await
        .expect("engine available");
    error_text(&results[0], ErrorCode::PermissionDenied);
    error_text(&results[1], ErrorCode::PermissionDenied);
    assert_eq!(ok_text(&results[2]), "original");
    assert_eq!(
        std::fs::read_to_string(ws.root().join("a.txt")).unwrap(),
        "original"
    );
    assert!(!ws.root().join("b.txt").exists() && !ws.root().join("new").exists());
}

/// A command of an engine running as root runs as uid 0, the owner of `/etc/shadow` and the
/// other root-only files under `/etc`: the sandbox hides each of them (a file reads empty, a
/// directory is empty), while what every user may read stays readable. As another user the
/// files are unreadable anyway; the test then checks that much.
#[tokio::test]
async fn root_only_system_files_are_not_readable_by_a_root_command() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let session = engine.session();
    // Root-only files of this machine, and one file anybody may read.
    let secrets: Vec<String> = ["/etc/shadow", "/etc/gshadow", "/etc/ssl/private"]
        .into_iter()
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o004 == 0))
        .map(str::to_string)
        .collect();
    assert!(
        !secrets.is_empty() || std::fs::metadata("/etc/shadow").is_err(),
        "this machine's /etc/shadow is world-readable?"
    );
    for secret in &secrets {
        let r = bash(
            &session,
            &format!("cat {secret} 2>/dev/null | wc -c; ls -A {secret} 2>/dev/null | wc -l"),
        )
        .await;
        let text = ok_text(&r).to_string();
        let mut counts = text.split_whitespace();
        assert_eq!(counts.next(), Some("0"), "{secret} read: {text}");
        if std::fs::metadata(secret).unwrap().is_dir() {
            assert_eq!(counts.next(), Some("0"), "{secret} listed: {text}");
        }
    }
    let r = bash(&session, "head -c 4 /etc/passwd").await;
    assert_eq!(ok_text(&r), "root", "{}", r.content);
}

/// A command cannot make a new name inside the workspace for a file outside it (the way a
/// hard link would lead writes outside): Landlock refuses linking across its rules.
#[tokio::test]
async fn a_command_cannot_hard_link_an_outside_file_into_the_workspace() {
    // Both below the build's own temporary directory: one filesystem (a link is possible at all)
    // and not below a directory the sandbox hides (Landlock alone must refuse).
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    std::fs::create_dir(dir.path().join("ws")).unwrap();
    let ws = Workspace::open(dir.path().join("ws")).unwrap();
    let outside = dir.path().join("outside.txt");
    std::fs::write(&outside, "keep").unwrap();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let session = engine.session();
    let r = bash(
        &session,
        &format!("ln {} hl && echo linked; ls", outside.display()),
    )
    .await;
    let text = ok_text(&r).to_string();
    assert!(!text.contains("linked") && !text.contains("hl\n"), "{text}");
    assert!(!ws.root().join("hl").exists(), "{text}");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
}
