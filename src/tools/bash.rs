//! `bash`: runs `bash -c <command>` in the workspace and returns its output the way the seed does
//! (stdout then stderr, trimmed, `(no output)` when empty).
//!
//! This module owns the child processes of one call, and nothing it starts outlives the call:
//!
//! * **Environment: an allowlist.** The child's environment is rebuilt from nothing: `PATH`,
//!   `LANG`, `LANGUAGE`, the standard locale categories (`LC_ALL`, `LC_CTYPE`, … — see
//!   [`INHERITED_ENV`]) and `TMPDIR` are copied from the engine if present; `HOME` and `PWD` are
//!   the workspace root; `SWITCHBOARD_CALL_ID` is the call's id (a marker naming the call, so
//!   its processes can be found); `SWITCHBOARD_IDEMPOTENCY_KEY` is the call's idempotency key
//!   ([`ToolContext::idempotency_key`], for a command that calls a service which deduplicates;
//!   see `docs/idempotency.md`). Nothing else of the engine's environment reaches the command,
//!   whatever its name: API keys, `DATABASE_URL`, `SSH_AUTH_SOCK`, `BASH_ENV`, `ENV`,
//!   `LD_PRELOAD` included. The working directory is the workspace root; stdin is `/dev/null`.
//! * **The engine's own environment is out of reach.** When the system allows it (root, or
//!   unprivileged user namespaces), the command runs inside fresh PID and mount namespaces:
//!   `unshare --pid --fork --mount-proc --kill-child bash -c …` (with `--user --map-root-user`
//!   when plain `unshare` is refused). A tiny init is pid 1 and runs the command's shell as
//!   pid 2, so the command behaves as usual (`kill $$` works; the init tells us when that shell
//!   died by a signal): the sandbox's trampoline, forked by the engine's spawner, which makes
//!   the namespaces itself and forks the init (or, for a root engine, is forked by the spawner
//!   into a PID namespace the spawner made, as its init), whenever the engine has one —
//!   sandboxed (it reports to the engine where the command cannot write) or with `--sandbox
//!   off` (one program start instead of `unshare` and an init shell) — else (a context made
//!   outside an engine) an init shell whose job notice goes to a temporary file. Inside,
//!   `/proc` shows only the call's own processes, so `/proc/$PPID/environ` (`$PPID` is that
//!   init: its environment is the allowlisted one, or empty when the engine's spawner forked
//!   it), `ps eww -A` and `/proc/<engine pid>/environ` show nothing of the engine — also when
//!   everything runs as root, where file permissions and the
//!   non-dumpable flag ([`crate::process_guard`]) do not stop a reader. Whether this works is
//!   probed once per tool instance (the first call); where it does not, bash runs directly and a
//!   warning is logged once.
//! * **Process control.** The process started for the call leads a new session, and so a new
//!   process group, without a controlling terminal (the trampoline calls `setsid` first thing,
//!   or the engine's spawner as it forks it; without a trampoline, `setsid(1)` when the system
//!   has it): `/dev/tty` fails to open (`ENXIO`), so nothing a command does reaches the terminal
//!   the engine runs in. A guard kills the whole group (`SIGKILL`) when the call ends for any
//!   reason — exit, deadline, cancellation, or the engine dropping the future — and the first
//!   process itself on a deadline or cancellation, in case it had not made its session yet. In
//!   namespace mode, when the namespace's init ends (after the command's shell, or killed with
//!   the group) the kernel kills every process left in the namespace, including ones that left
//!   the process group (`setsid`, double forks, daemons). Pids printed by a command are pids of its namespace; the
//!   `SWITCHBOARD_CALL_ID` marker is how to find its processes from outside. In direct mode a second sweep kills every process whose environment still carries the
//!   call's private token (`SWITCHBOARD_CALL_TOKEN`, set only in that mode).
//! * **Deadlines.** `timeout_ms` (1 to [`MAX_TIMEOUT_MS`], default [`DEFAULT_TIMEOUT`]) bounds
//!   one call; the engine's policy timeout ([`MAX_TIMEOUT`]) stays the outer bound. On timeout
//!   the answer is `timeout (Ns)`, on cancellation `cancelled`, each followed by
//!   `; partial output:\n…` with what the command printed so far (capped) when it printed
//!   anything.
//! * **Bounded output.** stdout and stderr are read concurrently into bounded buffers (head and
//!   rolling tail, at most the output cap per stream); a flood never grows memory. After the
//!   shell exits, the pipes are drained for at most 200 ms — a backgrounded child that still
//!   holds them does not hold the result back — then the group is killed.
//!
//! Deliberate additions to the seed: a non-zero exit status is still a successful result, but a
//! final line `[exit code: N]` is appended so the model can see it (a non-zero status is how
//! `grep`, `diff` and `test` answer, and tests that fail are output the model needs to read, not
//! a failure of the tool); a command whose shell died by a signal is an `execution_error` naming
//! the signal (`killed by SIGKILL`, see `death_signal` for how that is
//! told apart from an exit status of 128 + N); a blocked or timed-out command is a real error
//! (`permission_denied`, `timeout`), not text.
//!
//! **Confinement is the engine's OS sandbox** ([`crate::sandbox`]): when the call's session
//! carries one (every engine's does unless built with `--sandbox off`), the command is started
//! through the trampoline, which confines itself (Landlock, no capabilities, no network, limits)
//! and then execs the launcher above; the call gets a private `TMPDIR`, and a limit that killed
//! it is an `execution_error` naming the limit. Without it (`off`, or a context made outside an
//! engine) the namespaces isolate processes and `/proc` only, not files or the network. The
//! seed's dangerous-command list ([`DANGEROUS_SUBSTRINGS`]) is kept for parity; it is a
//! substring match that any rephrasing defeats, no security boundary.

use std::ffi::OsString;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::process::Command;

use super::bash_capture::{Capture, NO_OUTPUT, combine};
use crate::process_tree::{GroupKiller, NAMESPACE_INIT, ProcessTree};
pub use crate::process_tree::{Isolation, Launcher, probe_launcher};

mod exit;
mod redirect;
use crate::protocol::ErrorCode;
use crate::sandbox::{CallCommand, CallSandbox, Running};
use crate::tool::{Handler, OutputStream, ToolContext, ToolError, ToolOutcome, ToolSpec};
use crate::tools::str_arg;
use exit::{death_signal, killed_by};
pub use redirect::HARMLESS_DEVICES;
use redirect::redirects_to_device;

/// Timeout of one call when it gives no `timeout_ms`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest `timeout_ms` a call may ask for (10 minutes).
pub const MAX_TIMEOUT_MS: u64 = 600_000;
/// The tool's policy timeout: the engine's outer bound, equal to the largest `timeout_ms`.
pub const MAX_TIMEOUT: Duration = Duration::from_millis(MAX_TIMEOUT_MS);
/// Output cap of `bash`, in bytes.
pub const OUTPUT_CAP: usize = 50_000;
/// The seed's refused substrings (parity only; see the module docs).
pub const DANGEROUS_SUBSTRINGS: [&str; 5] = ["rm -rf /", "sudo", "shutdown", "reboot", "> /dev/"];
/// Variables copied from the engine's environment when present; nothing else is.
pub use crate::process_env::TOOL_ENV as INHERITED_ENV;
/// The marker variable naming the call in every process it starts.
pub const CALL_ID_VAR: &str = "SWITCHBOARD_CALL_ID";
/// The variable holding the call's idempotency key ([`ToolContext::idempotency_key`]): the same
/// for every copy of the call, so a command can pass it to a service that deduplicates.
pub const IDEMPOTENCY_KEY_VAR: &str = "SWITCHBOARD_IDEMPOTENCY_KEY";
/// How long the pipes are still read after the shell itself has exited.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);
/// How long the pipes are still read after the call's processes were killed.
const DRAIN_AFTER_KILL: Duration = Duration::from_millis(100);
/// Room left in the output cap for the `timeout (Ns); partial output:` prefix.
const PARTIAL_CAP: usize = OUTPUT_CAP - 100;
/// The `bash` spec: async, not concurrency-safe and **exclusive** (a command may touch anything:
/// it runs after every earlier call of its turn and before every later one), policy timeout [`MAX_TIMEOUT`] (each call is
/// bounded by its own `timeout_ms`, default 120 s), 50,000 bytes. Namespaces are used when they
/// work ([`Isolation::Auto`]).
pub fn spec() -> ToolSpec {
    spec_with(Isolation::Auto)
}

/// The `bash` spec with an explicit [`Isolation`] choice.
pub fn spec_with(isolation: Isolation) -> ToolSpec {
    let tool = Arc::new(Bash {
        tree: ProcessTree::new(isolation),
    });
    ToolSpec::new(
        "bash",
        "Run a shell command in the workspace with `bash -c` (stdin is empty; output is stdout then \
         stderr, capped keeping head and tail). Every process it starts is stopped when the call \
         ends: background jobs do not survive. `timeout_ms` bounds the call (default 120000, at \
         most 600000).",
        json!({
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "The command, run with `bash -c`."},
                "timeout_ms": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_TIMEOUT_MS,
                    "description": "Time limit of this call in milliseconds (default 120000, at most 600000)."
                }
            },
            "required": ["command"],
            "additionalProperties": false
        }),
        Handler::future(move |args, ctx| {
            let tool = Arc::clone(&tool);
            async move { tool.run(args, ctx).await }
        }),
    )
    .subject(|args| {
        args.get("command")
            .and_then(serde_json::Value::as_str)
            .map(|c| crate::tool::Subject::Command(c.to_string()))
    })
    .concurrency_safe(false)
    .defer(crate::tool::Defer::Never)
    .timeout(MAX_TIMEOUT)
    .output_cap(OUTPUT_CAP)
}

/// The first of [`DANGEROUS_SUBSTRINGS`] found in `command`, if any.
///
/// The seed's `> /dev/` entry is read as "a redirection to a device node": any `>` (also `>>`,
/// `2>`, `&>`, `>|`), optional blanks or a quote, then `/dev/NAME` — refused unless NAME is one
/// of [`HARMLESS_DEVICES`] (`/dev/null`, `/dev/stdout`, `/dev/stderr`). So `ls > /dev/null` and
/// `2>/dev/null` run, while `> /dev/sda` and `>/dev/sda` are refused. Like the rest of the list,
/// this is a convenience for parity with the seed, not a security boundary (`tee /dev/sda`,
/// `dd of=/dev/sda` are not caught).
pub fn blocked_by(command: &str) -> Option<&'static str> {
    const DEVICE: &str = "> /dev/";
    DANGEROUS_SUBSTRINGS
        .into_iter()
        .filter(|bad| *bad != DEVICE)
        .find(|bad| command.contains(bad))
        .or_else(|| redirects_to_device(command).then_some(DEVICE))
}

/// One `bash` tool instance: how its commands run ([`ProcessTree`], probed on first use). The
/// workspace comes with each call.
struct Bash {
    tree: ProcessTree,
}

/// How the wait for the command ended.
enum End {
    Exited(std::io::Result<std::process::ExitStatus>),
    Stopped(ErrorCode),
}

impl Bash {
    async fn run(&self, args: Value, ctx: ToolContext) -> ToolOutcome {
        let command = str_arg(&args, "command")?;
        let timeout = timeout_arg(&args)?;
        if let Some(which) = blocked_by(command) {
            return Err(ToolError::permission(format!(
                "dangerous command blocked: {which}"
            )));
        }
        if ctx.cancel.is_cancelled() {
            return Err(ToolError::new(ErrorCode::Cancelled, "cancelled"));
        }
        let launcher = self.tree.launcher("bash").await;
        let started = Instant::now();
        // The call's own limit, unless the engine's deadline comes first.
        let (deadline, budget) = match started.checked_add(timeout) {
            Some(own) if own < ctx.deadline => (own, timeout),
            _ => (
                ctx.deadline,
                ctx.deadline.saturating_duration_since(started),
            ),
        };
        let token = launcher.token();

        let root = ctx.workspace()?.root();
        // The OS sandbox of this call (its TMPDIR and cgroups), when the engine has one.
        // Unconfined (`off`) with namespaces, the trampoline is the namespace's init.
        let sandbox = match (ctx.session.sandbox(), launcher) {
            (Some(sandbox), _) if sandbox.confines() => sandbox.begin_call(root, budget),
            (Some(sandbox), Launcher::Namespaces { .. }) => sandbox.begin_unconfined_call(),
            _ => Ok(None),
        }
        .map_err(|e| ToolError::execution(format!("cannot set up the sandbox of the call: {e}")))?;
        // Unconfined namespace mode: where the init shell writes its job notices (see
        // `death_signal`). A sandboxed call's init is the trampoline, which reports to the
        // sandbox instead, out of the command's reach.
        let notice = match (launcher, &sandbox) {
            (Launcher::Namespaces { .. }, None) => tempfile::NamedTempFile::new().ok(),
            _ => None,
        };
        let cmd = shell(
            root,
            command,
            &ctx,
            token.as_deref(),
            (launcher, self.tree.setsid()),
            sandbox.as_ref(),
            notice.as_ref().map(|f| f.path()),
        );
        // Through the engine's spawner when the call has a trampoline (one program start
        // fewer), else as a child of this process.
        let mut child = match cmd {
            Shell::Sandboxed(sandbox, call) => sandbox.spawn(call).await,
            Shell::Plain(mut cmd) => cmd.spawn().map(Running::Child),
        }
        .map_err(|e| ToolError::execution(format!("failed to start bash: {e}")))?;
        // The first process leads the call's session, so its pid is the group id.
        let group = GroupKiller::of_id(child.id());
        let (stdout, stderr) = (child.take_stdout(), child.take_stderr());
        let mut out = Capture::new(OUTPUT_CAP);
        let mut err = Capture::new(OUTPUT_CAP);

        let end = {
            let reading = futures::future::join(
                out.fill(stdout, &ctx.progress, OutputStream::Stdout),
                err.fill(stderr, &ctx.progress, OutputStream::Stderr),
            );
            tokio::pin!(reading);
            let mut read_all = false;
            let end = loop {
                tokio::select! {
                    biased;
                    () = ctx.cancel.cancelled() => {
                        // The engine cancels the call's token at its own deadline too.
                        let code = if Instant::now() >= ctx.deadline {
                            ErrorCode::Timeout
                        } else {
                            ErrorCode::Cancelled
                        };
                        break End::Stopped(code);
                    }
                    () = tokio::time::sleep_until(deadline.into()) => {
                        break End::Stopped(ErrorCode::Timeout);
                    }
                    _ = &mut reading, if !read_all => read_all = true,
                    status = child.wait() => break End::Exited(status),
                }
            };
            let drain = match end {
                End::Exited(_) => DRAIN_AFTER_EXIT,
                End::Stopped(_) => {
                    group.kill();
                    // The first process too, in case it had not made its session yet.
                    child.start_kill();
                    DRAIN_AFTER_KILL
                }
            };
            if !read_all {
                // Whatever still holds the pipes gets a short moment, no more.
                let _ = tokio::time::timeout(drain, &mut reading).await;
            }
            end
        };
        drop(group);
        if let Some(token) = token {
            crate::process_tree::sweep(token).await;
        }

        match end {
            End::Stopped(code) => {
                // Reap the killed leader (bounded: it was sent SIGKILL).
                let _ = tokio::time::timeout(DRAIN_AFTER_KILL, child.wait()).await;
                let what = match code {
                    ErrorCode::Timeout => format!("timeout ({})", seconds(budget)),
                    _ => "cancelled".to_string(),
                };
                // A limit that was hit meanwhile (a fork bomb at the process limit) is named.
                let what = match sandbox.as_ref().and_then(|s| s.limit_hit()) {
                    Some(hit) => format!("{what}; {hit}"),
                    None => what,
                };
                if let Some(s) = sandbox {
                    s.finish();
                }
                let text = combine(out, err, PARTIAL_CAP);
                let detail = if text == NO_OUTPUT {
                    what
                } else {
                    format!("{what}; partial output:\n{text}")
                };
                Err(ToolError::new(code, detail))
            }
            End::Exited(status) => {
                let status =
                    status.map_err(|e| ToolError::execution(format!("waiting for bash: {e}")))?;
                let mut text = combine(out, err, OUTPUT_CAP - 40);
                // Read before the sandbox's TMPDIR, where it may live, is removed.
                let notice = notice.and_then(|f| std::fs::read(f.path()).ok());
                let mut signal = death_signal(status, notice.as_deref());
                // A limit of the sandbox that killed the command is named first (it knows which).
                if let Some(sandbox) = sandbox {
                    let why = sandbox.verdict(&status, &text);
                    signal = sandbox.death_signal(&status);
                    sandbox.finish();
                    if let Some(why) = why {
                        return Err(ToolError::execution(if text == NO_OUTPUT {
                            why
                        } else {
                            format!("{why}; output:\n{text}")
                        }));
                    }
                }
                if let Some(signal) = signal {
                    let what = killed_by(signal);
                    return Err(ToolError::execution(if text == NO_OUTPUT {
                        what
                    } else {
                        format!("{what}; output:\n{text}")
                    }));
                }
                if let Some(code) = status.code().filter(|&code| code != 0) {
                    text.push_str(&format!("\n[exit code: {code}]"));
                }
                Ok(text.into())
            }
        }
    }
}

/// The call's own time limit: `timeout_ms` (1 to [`MAX_TIMEOUT_MS`]) or [`DEFAULT_TIMEOUT`].
fn timeout_arg(args: &Value) -> Result<Duration, ToolError> {
    match args.get("timeout_ms") {
        None => Ok(DEFAULT_TIMEOUT),
        Some(v) => match v.as_u64() {
            Some(ms) if (1..=MAX_TIMEOUT_MS).contains(&ms) => Ok(Duration::from_millis(ms)),
            _ => Err(ToolError::invalid(format!(
                "argument 'timeout_ms' must be an integer from 1 to {MAX_TIMEOUT_MS}"
            ))),
        },
    }
}

/// One call's shell: confined by its call's sandbox, or a plain command.
#[allow(
    clippy::large_enum_variant,
    reason = "one per call, made and started once; both variants carry a command"
)]
enum Shell<'a> {
    Sandboxed(&'a CallSandbox, CallCommand),
    Plain(Command),
}

impl Shell<'_> {
    fn command_mut(&mut self) -> &mut Command {
        match self {
            Shell::Sandboxed(_, call) => call.command_mut(),
            Shell::Plain(cmd) => cmd,
        }
    }
}

/// The command line for one call, with the rebuilt environment and the settings described in the
/// module docs; `launcher` with the `setsid` it starts an unsandboxed command through.
fn shell<'a>(
    root: &Path,
    command: &str,
    ctx: &ToolContext,
    token: Option<&str>,
    (launcher, setsid): (&Launcher, Option<&Path>),
    sandbox: Option<&'a CallSandbox>,
    notice: Option<&Path>,
) -> Shell<'a> {
    let mut program: Vec<OsString> = match (launcher, sandbox) {
        // Unconfined: an init shell runs the command's shell. Sandboxed, the trampoline is the
        // namespace's init itself.
        (Launcher::Namespaces { .. }, None) => vec![
            "bash".into(),
            "-c".into(),
            NAMESPACE_INIT.into(),
            "switchboard-init".into(),
            notice.unwrap_or(Path::new("/dev/null")).into(),
            "bash".into(),
        ],
        _ => vec!["bash".into()],
    };
    program.extend(["-c".into(), command.into()]);
    let mut shell = match sandbox {
        // The trampoline confines itself, then execs `unshare` (if any), then bash.
        Some(sandbox) => {
            let unshare = match launcher {
                Launcher::Namespaces { unshare, flags } => {
                    Some((unshare.as_path(), flags.as_slice()))
                }
                Launcher::Direct => None,
            };
            Shell::Sandboxed(sandbox, sandbox.command(unshare, &program))
        }
        None => Shell::Plain(launcher.command_in_session(&program, setsid)),
    };
    let cmd = shell.command_mut();
    crate::process_env::inherit_tool_env(cmd);
    if let Some(sandbox) = sandbox.filter(|s| s.confines()) {
        cmd.env("TMPDIR", sandbox.tmp());
    }
    cmd.env("HOME", root)
        .env("PWD", root)
        .env(CALL_ID_VAR, &*ctx.call_id)
        .env(IDEMPOTENCY_KEY_VAR, ctx.idempotency_key());
    Launcher::mark(cmd, token);
    // No `process_group(0)`: the first process makes a session of its own (the trampoline
    // first thing, else `setsid`), which a group leader cannot.
    cmd.current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    shell
}

/// `120s`, or `0.3s` for a fraction, rounded to a tenth; under 50 ms, `7ms`.
fn seconds(d: Duration) -> String {
    let tenths = (d.as_millis() + 50) / 100;
    if tenths == 0 {
        format!("{}ms", d.as_millis())
    } else if tenths.is_multiple_of(10) {
        format!("{}s", tenths / 10)
    } else {
        format!("{}.{}s", tenths / 10, tenths % 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn timeout_ms_defaults_and_bounds() {
        assert_eq!(timeout_arg(&json!({})).unwrap(), DEFAULT_TIMEOUT);
        assert_eq!(
            timeout_arg(&json!({"timeout_ms": 1500})).unwrap(),
            Duration::from_millis(1500)
        );
        for bad in [json!(0), json!(-1), json!(600_001), json!("10"), json!(1.5)] {
            assert_eq!(
                timeout_arg(&json!({ "timeout_ms": bad })).unwrap_err().code,
                ErrorCode::InvalidArguments,
                "{bad}"
            );
        }
    }

    #[test]
    fn dangerous_substrings_are_named_and_durations_read_naturally() {
        assert_eq!(blocked_by("echo hi && sudo ls"), Some("sudo"));
        assert_eq!(blocked_by("ls -la"), None);
        assert_eq!(blocked_by("ls > /dev/null"), None);
        assert_eq!(blocked_by("echo x >/dev/sda"), Some("> /dev/"));
        assert_eq!(seconds(Duration::from_millis(119_996)), "120s");
        assert_eq!(seconds(Duration::from_millis(298)), "0.3s");
        assert_eq!(seconds(Duration::from_millis(1)), "1ms");
    }
}
