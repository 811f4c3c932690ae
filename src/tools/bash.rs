//! `bash`: runs `bash -c <command>` in the workspace, in its own process group, and returns its
//! output the way the seed does (stdout then stderr, trimmed, `(no output)` when empty).
//!
//! This module owns the child process for the length of one call, and nothing outlives the call:
//!
//! * The environment is rebuilt from an allowlist: `PATH`, `LANG`, every `LC_*`, `TMPDIR` from the
//!   parent if present; `HOME` and `PWD` set to the workspace root; `SWITCHBOARD_CALL_ID` set to the
//!   call's id. Nothing else of the engine's environment (API keys, agent sockets) reaches the
//!   command. The working directory is the workspace root; stdin is `/dev/null`.
//! * The shell leads a new process group. A guard kills the whole group (`SIGKILL`) when the call
//!   ends for any reason — normal exit, deadline, cancellation, or the engine dropping the future.
//! * `ctx.deadline` is enforced here too (`timeout (Ns)`), and `ctx.cancel` ends the call with
//!   `cancelled`.
//! * stdout and stderr are read concurrently into bounded buffers (head and rolling tail, at most
//!   the output cap per stream); a flood never grows memory. After the shell exits, the pipes are
//!   drained for at most 200 ms — a backgrounded child that still holds them does not hold the
//!   result back — then the group is killed.
//!
//! Deliberate additions to the seed: a non-zero exit status is still a successful result, but a
//! final line `[exit code: N]` (or `[killed by signal N]`) is appended so the model can see it; a
//! blocked or timed-out command is a real error (`permission_denied`, `timeout`), not text.
//!
//! The seed's dangerous-command list ([`DANGEROUS_SUBSTRINGS`]) is kept for parity. It is a
//! substring match that any rephrasing defeats: it is no security boundary. Confinement of what a
//! command can do needs an OS sandbox, which this crate does not provide.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process_group};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::Command;

use crate::protocol::ErrorCode;
use crate::tool::{Handler, ToolContext, ToolError, ToolOutcome, ToolSpec, cap_output};
use crate::tools::str_arg;
use crate::workspace::Workspace;

/// Policy timeout of `bash`.
pub const TIMEOUT: Duration = Duration::from_secs(120);
/// Output cap of `bash`, in bytes.
pub const OUTPUT_CAP: usize = 50_000;
/// The seed's refused substrings (parity only; see the module docs).
pub const DANGEROUS_SUBSTRINGS: [&str; 5] = ["rm -rf /", "sudo", "shutdown", "reboot", "> /dev/"];
/// How long the pipes are still read after the shell itself has exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);

/// The `bash` spec: async, not concurrency-safe, 120 s, 50,000 bytes.
pub fn spec(ws: &Workspace) -> ToolSpec {
    let root: Arc<Path> = Arc::from(ws.root());
    ToolSpec::new(
        "bash",
        "Run a shell command in the workspace.",
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command, run with `bash -c`."}
            },
            "required": ["command"],
            "additionalProperties": false
        }),
        Handler::future(move |args, ctx| {
            let root = Arc::clone(&root);
            async move { run(&root, args, ctx).await }
        }),
    )
    .concurrency_safe(false)
    .timeout(TIMEOUT)
    .output_cap(OUTPUT_CAP)
}

/// The first of [`DANGEROUS_SUBSTRINGS`] found in `command`, if any.
pub fn blocked_by(command: &str) -> Option<&'static str> {
    DANGEROUS_SUBSTRINGS
        .into_iter()
        .find(|bad| command.contains(bad))
}

async fn run(root: &Path, args: Value, ctx: ToolContext) -> ToolOutcome {
    let command = str_arg(&args, "command")?;
    if let Some(which) = blocked_by(command) {
        return Err(ToolError::permission(format!(
            "dangerous command blocked: {which}"
        )));
    }
    if ctx.cancel.is_cancelled() {
        return Err(ToolError::new(ErrorCode::Cancelled, "cancelled"));
    }
    let budget = ctx
        .deadline
        .saturating_duration_since(std::time::Instant::now());
    let deadline = tokio::time::Instant::from_std(ctx.deadline);

    let mut child = shell(root, command, &ctx.call_id)
        .spawn()
        .map_err(|e| ToolError::execution(format!("failed to start bash: {e}")))?;
    // The shell is the group leader, so its pid is the group id.
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .and_then(Pid::from_raw)
        .map(GroupKiller);
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let mut out = Capture::new(OUTPUT_CAP);
    let mut err = Capture::new(OUTPUT_CAP);

    let status = {
        let reading = futures::future::join(out.fill(stdout), err.fill(stderr));
        tokio::pin!(reading);
        let mut read_all = false;
        let status = loop {
            tokio::select! {
                biased;
                () = ctx.cancel.cancelled() => {
                    return Err(ToolError::new(ErrorCode::Cancelled, "cancelled"));
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(ToolError::new(
                        ErrorCode::Timeout,
                        format!("timeout ({})", seconds(budget)),
                    ));
                }
                _ = &mut reading, if !read_all => read_all = true,
                status = child.wait() => break status,
            }
        };
        if !read_all {
            // Something the shell left behind still holds the pipes: wait briefly, no more.
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, &mut reading).await;
        }
        status
    };
    drop(group);
    let status = status.map_err(|e| ToolError::execution(format!("waiting for bash: {e}")))?;

    let mut text = combine(out, err, OUTPUT_CAP);
    if let Some(code) = status.code() {
        if code != 0 {
            text.push_str(&format!("\n[exit code: {code}]"));
        }
    } else if let Some(signal) = status.signal() {
        text.push_str(&format!("\n[killed by signal {signal}]"));
    }
    Ok(text)
}

/// The `bash -c` command with the rebuilt environment and the process settings described above.
fn shell(root: &Path, command: &str, call_id: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(command).env_clear();
    for (name, value) in std::env::vars_os() {
        let keep = name
            .to_str()
            .is_some_and(|n| matches!(n, "PATH" | "LANG" | "TMPDIR") || n.starts_with("LC_"));
        if keep {
            cmd.env(name, value);
        }
    }
    cmd.env("HOME", root)
        .env("PWD", root)
        .env("SWITCHBOARD_CALL_ID", call_id)
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    cmd
}

/// Kills a whole process group when dropped. Errors (typically: the group is already gone) are
/// ignored: there is nothing left to kill.
struct GroupKiller(Pid);

impl Drop for GroupKiller {
    fn drop(&mut self) {
        let _ = kill_process_group(self.0, Signal::KILL);
    }
}

/// One output stream, bounded: the first `cap / 2` bytes, a rolling last `cap - cap / 2` bytes,
/// and how many bytes fell between them.
struct Capture {
    head: Vec<u8>,
    head_cap: usize,
    tail: VecDeque<u8>,
    tail_cap: usize,
    dropped: u64,
}

impl Capture {
    fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Capture {
            head: Vec::new(),
            head_cap,
            tail: VecDeque::new(),
            tail_cap: cap - head_cap,
            dropped: 0,
        }
    }

    /// Reads `pipe` to its end (or first error) into the buffers.
    async fn fill<R: AsyncRead + Unpin>(&mut self, pipe: Option<R>) {
        let Some(mut pipe) = pipe else { return };
        let mut buf = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut buf).await {
            if n == 0 {
                break;
            }
            self.push(&buf[..n]);
        }
    }

    fn push(&mut self, data: &[u8]) {
        let take = (self.head_cap - self.head.len()).min(data.len());
        self.head.extend_from_slice(&data[..take]);
        let rest = &data[take..];
        if rest.len() >= self.tail_cap {
            self.dropped += (self.tail.len() + rest.len() - self.tail_cap) as u64;
            self.tail.clear();
            self.tail.extend(&rest[rest.len() - self.tail_cap..]);
        } else {
            self.tail.extend(rest);
            let over = self.tail.len().saturating_sub(self.tail_cap);
            self.tail.drain(..over);
            self.dropped += over as u64;
        }
    }

    /// The stream as text pieces: one piece when complete, or head and tail around a gap.
    fn into_pieces(self) -> Vec<Piece> {
        let Capture {
            mut head,
            tail,
            dropped,
            ..
        } = self;
        if dropped == 0 {
            head.extend(tail);
            return vec![Piece::Text(String::from_utf8_lossy(&head).into_owned())];
        }
        let tail: Vec<u8> = tail.into();
        vec![
            Piece::Text(String::from_utf8_lossy(&head).into_owned()),
            Piece::Gap(dropped),
            Piece::Text(String::from_utf8_lossy(&tail).into_owned()),
        ]
    }
}

/// Part of the combined output: text we kept, or a count of bytes we never held.
enum Piece {
    Text(String),
    Gap(u64),
}

/// stdout followed by stderr, trimmed, `(no output)` when empty, capped like
/// [`cap_output`] — with a gap's bytes counted in the truncation marker.
fn combine(out: Capture, err: Capture, cap: usize) -> String {
    let mut pieces = out.into_pieces();
    pieces.extend(err.into_pieces());
    trim_pieces(&mut pieces);
    let dropped_unseen: u64 = pieces
        .iter()
        .map(|p| if let Piece::Gap(n) = p { *n } else { 0 })
        .sum();
    if dropped_unseen == 0 {
        let text: String = pieces
            .into_iter()
            .filter_map(|p| {
                if let Piece::Text(t) = p {
                    Some(t)
                } else {
                    None
                }
            })
            .collect();
        if text.is_empty() {
            return "(no output)".to_string();
        }
        return cap_output(text, cap);
    }
    let kept_len: usize = pieces
        .iter()
        .map(|p| if let Piece::Text(t) = p { t.len() } else { 0 })
        .sum();
    let head = take_head(&pieces, cap / 2);
    let tail = take_tail(&pieces, cap - cap / 2);
    let dropped = (kept_len - head.len() - tail.len()) as u64 + dropped_unseen;
    format!("{head}\n… {dropped} bytes truncated …\n{tail}")
}

/// Trims whitespace from the start and the end of the whole sequence, as `str::trim` would on
/// the joined text, stopping at a gap.
fn trim_pieces(pieces: &mut Vec<Piece>) {
    while let Some(Piece::Text(t)) = pieces.first_mut() {
        *t = t.trim_start().to_string();
        if !t.is_empty() {
            break;
        }
        pieces.remove(0);
    }
    while let Some(Piece::Text(t)) = pieces.last_mut() {
        t.truncate(t.trim_end().len());
        if !t.is_empty() {
            break;
        }
        pieces.pop();
    }
}

/// Up to `limit` bytes of text from the start, up to the first gap, cut on a char boundary.
fn take_head(pieces: &[Piece], limit: usize) -> String {
    let mut head = String::new();
    for piece in pieces {
        let Piece::Text(t) = piece else { break };
        let mut end = (limit - head.len()).min(t.len());
        while !t.is_char_boundary(end) {
            end -= 1;
        }
        head.push_str(&t[..end]);
        if head.len() >= limit || end < t.len() {
            break;
        }
    }
    head
}

/// Up to `limit` bytes of text from the end, back to the last gap, cut on a char boundary.
fn take_tail(pieces: &[Piece], limit: usize) -> String {
    let mut parts: Vec<&str> = Vec::new();
    let mut len = 0;
    for piece in pieces.iter().rev() {
        let Piece::Text(t) = piece else { break };
        let mut start = t.len() - (limit - len).min(t.len());
        while !t.is_char_boundary(start) {
            start += 1;
        }
        parts.push(&t[start..]);
        len += t.len() - start;
        if len >= limit || start > 0 {
            break;
        }
    }
    parts.into_iter().rev().collect()
}

/// `120s`, or `0.3s` for a fraction, rounded to a tenth.
fn seconds(d: Duration) -> String {
    let tenths = (d.as_millis() + 50) / 100;
    if tenths.is_multiple_of(10) {
        format!("{}s", tenths / 10)
    } else {
        format!("{}.{}s", tenths / 10, tenths % 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn captured(data: &[u8], cap: usize) -> Capture {
        let mut c = Capture::new(cap);
        for chunk in data.chunks(7) {
            c.push(chunk);
        }
        c
    }

    #[test]
    fn a_flood_keeps_head_and_tail_and_counts_every_dropped_byte() {
        let data: Vec<u8> = (0..1000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let text = combine(captured(&data, 100), Capture::new(100), 100);
        let full = String::from_utf8(data).unwrap();
        assert_eq!(text, cap_output(full, 100));
    }

    #[test]
    fn streams_join_trimmed_and_empty_output_says_so() {
        let text = combine(captured(b"  out\n", 100), captured(b"err \n", 100), 100);
        assert_eq!(text, "out\nerr");
        assert_eq!(
            combine(Capture::new(10), captured(b" \n", 10), 10),
            "(no output)"
        );
    }

    #[test]
    fn dangerous_substrings_are_named_and_durations_read_naturally() {
        assert_eq!(blocked_by("echo hi && sudo ls"), Some("sudo"));
        assert_eq!(blocked_by("ls -la"), None);
        assert_eq!(seconds(Duration::from_millis(119_996)), "120s");
        assert_eq!(seconds(Duration::from_millis(298)), "0.3s");
    }
}
