//! A hard link inside the workspace can be another name of a file outside it; no path check can
//! tell the two names apart. `read_file` and `edit_file` therefore refuse regular files with more
//! than one link (`permission_denied`, `hard-linked file: …`) unless the workspace allows them
//! (`--allow-hard-links`, `Workspace::allow_hard_links`); `write_file` replaces the name it is
//! given and never writes through, so the outside file keeps its content.

use crate::common;

use std::path::Path;

use serde_json::json;

use common::answers::{answers, dispatch, turn};
use common::cli::BIN;

const SECRET: &str = "outside secret\n";

/// `<tmp>/outside/secret.txt` and `<tmp>/ws/link.txt`, two names of one file.
fn planted() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let outside = tmp.path().join("outside");
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&outside).unwrap();
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(outside.join("secret.txt"), SECRET).unwrap();
    std::fs::hard_link(outside.join("secret.txt"), ws.join("link.txt")).unwrap();
    (tmp, outside, ws)
}

#[test]
fn a_hard_link_to_an_outside_file_is_not_read_nor_edited() {
    let (_tmp, outside, ws) = planted();
    std::fs::write(ws.join("plain.txt"), "plain").unwrap();
    let answers = dispatch(
        &ws,
        &[
            ("read_file", json!({"path": "link.txt"})),
            (
                "edit_file",
                json!({"path": "link.txt", "old_text": "outside", "new_text": "pwned"}),
            ),
            ("read_file", json!({"path": "plain.txt"})),
        ],
    );
    for a in &answers[..2] {
        assert_eq!(a.outcome(), "permission_denied", "{a:?}");
        assert!(a.content.contains("hard-linked file: link.txt"), "{a:?}");
        assert!(!a.content.contains("secret"), "{a:?}");
    }
    assert_eq!(answers[2].content, "plain");
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        SECRET
    );
}

#[test]
fn write_file_replaces_the_link_and_leaves_the_outside_file_alone() {
    let (_tmp, outside, ws) = planted();
    let answers = dispatch(
        &ws,
        &[
            ("write_file", json!({"path": "link.txt", "content": "new"})),
            ("read_file", json!({"path": "link.txt"})),
        ],
    );
    assert_eq!(answers[0].content, "Wrote 3 bytes to link.txt");
    // The name now stands for a file of its own, with a single link: readable again.
    assert_eq!(answers[1].content, "new");
    assert_eq!(
        std::fs::read_to_string(outside.join("secret.txt")).unwrap(),
        SECRET
    );
}

#[test]
fn the_option_allows_hard_links_for_workspaces_that_use_them() {
    let (_tmp, _outside, ws) = planted();
    let doc = turn(&[("read_file", json!({"path": "link.txt"}))]).to_string();
    let out = run_with_flag(&ws, &doc);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(answers(&out)[0].content, SECRET.trim_end());
}

fn run_with_flag(ws: &Path, doc: &str) -> std::process::Output {
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(["dispatch", "--allow-hard-links", "--workspace"])
        .arg(ws);
    common::cli::fed(cmd, doc.as_bytes())
}
