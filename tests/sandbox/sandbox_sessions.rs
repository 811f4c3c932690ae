//! Two sessions of one engine, in two workspaces, running commands at the same time: neither
//! can read, list or write the other's files.

use crate::common;

use common::sandbox::*;
use switchboard::Workspace;
use switchboard::sandbox::SandboxMode;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sessions_running_at_once_cannot_see_each_others_files() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    let Some(engine) = engine(None, config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let session_a = engine.session_in(Workspace::open(&a).unwrap());
    let session_b = engine.session_in(Workspace::open(&b).unwrap());
    // Each writes its secret, waits until the other's exists (checked from outside: the test
    // sees both), then tries to read, list and write the other's workspace.
    let probe = |mine: &str, other: &std::path::Path| {
        format!(
            "echo {mine} > secret; for i in $(seq 1 100); do [ -e {marker} ] && break; sleep 0.05; done; \
             cat {other}/secret; ls {other}; echo intruder > {other}/intrusion; echo done",
            other = other.display(),
            marker = dir.path().join(format!("{mine}.go")).display(),
        )
    };
    let cmd_a = probe("SECRET-A", &b);
    let cmd_b = probe("SECRET-B", &a);
    let watcher = async {
        // Both commands are running once both secrets exist: let them go on.
        for _ in 0..200 {
            if a.join("secret").exists() && b.join("secret").exists() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        std::fs::write(dir.path().join("SECRET-A.go"), "").unwrap();
        std::fs::write(dir.path().join("SECRET-B.go"), "").unwrap();
    };
    let (ra, rb, ()) = tokio::join!(bash(&session_a, &cmd_a), bash(&session_b, &cmd_b), watcher);
    for (r, other_secret) in [(&ra, "SECRET-B"), (&rb, "SECRET-A")] {
        let text = ok_text(r);
        assert!(text.starts_with("done\n"), "{text}");
        assert!(!text.contains(other_secret), "{text}");
        // Refused by Landlock, or not even visible (below a directory the sandbox hides).
        let refused = text.matches("Permission denied").count()
            + text.matches("No such file or directory").count();
        assert_eq!(refused, 3, "{text}");
    }
    assert!(!a.join("intrusion").exists() && !b.join("intrusion").exists());
    assert_eq!(
        std::fs::read_to_string(a.join("secret")).unwrap(),
        "SECRET-A\n"
    );
    assert_eq!(
        std::fs::read_to_string(b.join("secret")).unwrap(),
        "SECRET-B\n"
    );
}
