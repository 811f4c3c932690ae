//! `--sandbox-read`: a toolchain installed where the sandbox hides or refuses (a home directory,
//! `/tmp`, anywhere outside the system's directories) becomes readable and runnable by bash —
//! never writable — and a session can narrow the engine's sandbox to `read-only`.

use crate::common;

use common::sandbox::*;
use switchboard::sandbox::{SandboxError, SandboxMode};
use switchboard::{RegistryError, SessionOptions};

/// A directory outside every readable place, holding an executable `tool` script.
fn toolchain() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let tool = bin.join("tool");
    std::fs::write(&tool, "#!/bin/sh\necho toolchain says hi\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

#[tokio::test]
async fn a_read_path_makes_a_hidden_toolchain_runnable_but_never_writable() {
    let chain = toolchain();
    let tool = chain.path().join("bin/tool");
    let (_dir, ws) = temp_workspace();
    let Some(plain) = engine(None, config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let without = bash(
        &plain.session_in(ws.clone()),
        &format!("{}", tool.display()),
    )
    .await;
    assert!(
        !without.content.contains("toolchain says hi") && without.content.contains("exit code"),
        "ran without a read path: {}",
        without.content
    );

    let with = config(SandboxMode::WorkspaceWrite).read_paths([chain.path().to_path_buf()]);
    let Some(engine) = engine(None, with) else {
        return;
    };
    let session = engine.session_in(ws.clone());
    let ran = bash(&session, &format!("{}", tool.display())).await;
    assert_eq!(ok_text(&ran).trim(), "toolchain says hi");
    let wrote = bash(
        &session,
        &format!(
            "echo changed > {}/bin/tool; echo extra > {}/new",
            chain.path().display(),
            chain.path().display()
        ),
    )
    .await;
    assert!(
        wrote.content.contains("exit code"),
        "a read path was written: {}",
        wrote.content
    );
    assert_eq!(
        std::fs::read_to_string(&tool).unwrap(),
        "#!/bin/sh\necho toolchain says hi\n"
    );
    assert!(!chain.path().join("new").exists());
    let described = engine.sandbox().describe();
    assert_eq!(
        described["read_paths"][0],
        chain.path().canonicalize().unwrap().display().to_string()
    );
}

#[tokio::test]
async fn a_read_path_that_does_not_exist_is_refused_at_start_naming_it() {
    let missing = std::path::PathBuf::from("/nonexistent/toolchain");
    let built = switchboard::Engine::builder()
        .sandbox(config(SandboxMode::Off).read_paths([missing.clone()]))
        .build();
    match built {
        Err(RegistryError::Sandbox(e @ SandboxError::BadReadPath { .. })) => {
            assert!(e.to_string().contains("/nonexistent/toolchain"), "{e}");
            assert!(
                !e.to_string().contains("--"),
                "a library message names no flag: {e}"
            );
        }
        other => panic!("expected a refused read path, got {other:?}"),
    }
}

#[tokio::test]
async fn a_session_can_narrow_the_engines_sandbox_to_read_only() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(None, config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let writer = engine.session_in(ws.clone());
    let reader = engine
        .session_with(
            SessionOptions::new()
                .id("reader-1")
                .workspace(ws.clone())
                .sandbox(config(SandboxMode::ReadOnly)),
        )
        .await
        .unwrap();
    assert_eq!(reader.id(), "reader-1");
    ok_text(&bash(&writer, "echo a > by-writer.txt").await);
    let refused = bash(&reader, "echo b > by-reader.txt").await;
    assert!(
        refused.content.contains("Permission denied") || refused.content.contains("Read-only"),
        "{}",
        refused.content
    );
    assert!(!ws.root().join("by-reader.txt").exists());
    assert_eq!(
        ok_text(&bash(&reader, "cat by-writer.txt").await).trim(),
        "a"
    );
}
