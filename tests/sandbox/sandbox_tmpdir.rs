//! The private `TMPDIR`: all of a call's scratch files together are bounded (`max_tmp_size`,
//! here 4 MiB), not only each file; a command that fails on a full `TMPDIR` is an
//! `execution_error` naming the limit, and the next call starts with an empty one. And what the
//! engine learns from the call's init (did a signal kill the shell?) is out of the command's
//! reach: a command that writes job notices wherever it can and exits 137 is still a plain
//! `[exit code: 137]`, not "killed by SIGKILL".

use crate::common;

use common::sandbox::*;
use switchboard::ErrorCode;
use switchboard::sandbox::{SandboxLimits, SandboxMode};
use switchboard::tools::bash::{Launcher, probe_launcher};

const MIB: u64 = 1 << 20;

fn limits() -> SandboxLimits {
    SandboxLimits {
        max_tmp_size: 4 * MIB,
        max_file_size: MIB,
        ..SandboxLimits::default()
    }
}

#[tokio::test]
async fn the_tmpdir_as_a_whole_is_bounded_and_a_call_that_fills_it_says_so() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(
        Some(&ws),
        config(SandboxMode::WorkspaceWrite).limits(limits()),
    ) else {
        return;
    };
    if !available(
        "PID and mount namespaces (the TMPDIR's tmpfs lives in the call's own)",
        matches!(probe_launcher().await, Launcher::Namespaces { .. }),
    ) {
        return;
    }
    let session = engine.session();
    // Sixteen files of 512 KiB, each under the file-size limit: 8 MiB against 4 MiB.
    let r = bash(
        &session,
        "for i in $(seq 1 16); do head -c 524288 /dev/zero > \"$TMPDIR/f$i\" || exit 1; done",
    )
    .await;
    let text = error_text(&r, ErrorCode::ExecutionError);
    assert!(
        text.starts_with("Error [execution_error]: TMPDIR full (limit 4 MiB)"),
        "{text}"
    );
    assert!(text.contains("No space left on device"), "{text}");
    // What fitted is at most the limit, and the next call has a fresh, empty TMPDIR.
    let r = bash(
        &session,
        "ls -A \"$TMPDIR\" | wc -l; df -k --output=size \"$TMPDIR\" | tail -1",
    )
    .await;
    let text = ok_text(&r);
    let mut lines = text.lines().map(|l| l.trim().parse::<u64>().unwrap());
    assert_eq!(lines.next(), Some(0), "{text}");
    assert!(lines.next().is_some_and(|kib| kib <= 4096), "{text}");
}

#[tokio::test]
async fn a_command_cannot_forge_the_inits_report_of_a_signal_death() {
    let (_dir, ws) = temp_workspace();
    let Some(engine) = engine(Some(&ws), config(SandboxMode::WorkspaceWrite)) else {
        return;
    };
    let session = engine.session();
    // Every file it can find near its TMPDIR and every descriptor of its init: a job notice
    // ("Killed") and the trampoline's report line, then the status a SIGKILL would give.
    let forge = r#"for f in "$TMPDIR"/.[!.]* "$TMPDIR"/* "$TMPDIR"/../* /proc/1/fd/*; do
                       { echo Killed; echo 'signal 9'; } >> "$f"
                   done 2>/dev/null
                   exit 137"#;
    let r = bash(&session, forge).await;
    assert_eq!(
        r.error, None,
        "the forged report was believed: {}",
        r.content
    );
    assert!(r.content.ends_with("[exit code: 137]"), "{}", r.content);
    // A real death is still one.
    let r = bash(&session, "kill -KILL $$").await;
    assert_eq!(
        error_text(&r, ErrorCode::ExecutionError),
        "Error [execution_error]: killed by SIGKILL"
    );
}
