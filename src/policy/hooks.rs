//! Hooks: code that sees a call before it runs (`PreToolUse`: allow, deny, or replace its
//! arguments) and its result after (`PostToolUse`: replace or annotate the content).
//!
//! Two kinds. In-process closures ([`Hook::pre`], [`Hook::post`], given to
//! `Engine::builder().hook(…)`) cost a function call. External commands come from the policy
//! file's `hooks` object in Claude Code's settings shape:
//!
//! ```json
//! {"hooks": {"PreToolUse": [{"matcher": "bash|write_file",
//!                            "hooks": [{"type": "command", "command": "./check.sh", "timeout": 10}]}],
//!            "PostToolUse": [{"matcher": "write_file",
//!                             "hooks": [{"type": "command", "command": "./lint.sh"}]}]}}
//! ```
//!
//! `matcher` is a regex over tool names (anchored; empty or `*`: every tool), tried on the registry
//! name and, for a built-in, on Claude Code's names for it (`Bash`, `Write`, `Edit`,
//! `MultiEdit`, `Read`, `Glob`); a matcher naming a Claude Code tool Switchboard lacks (`Grep`,
//! `WebFetch`, …) is refused. A `command`
//! hook is started per call with `bash -c`, in the workspace, with the same environment allowlist
//! and the same process-tree control as `bash` ([`crate::process_tree`]: a PID namespace, a
//! process group, a sweep), so nothing it starts outlives it; it is named `hook:NAME` (its
//! `"name"`, else its place in the file), never by its command line; it reads Claude Code's hook input on stdin and answers with exit code 0 (stdout
//! empty: no opinion; or decision JSON), or exit code 2 (stderr is the reason). A `persistent`
//! hook (`"type": "persistent"`) is started once and speaks JSON lines: one request line per call
//! (the same input plus `"id"`), one answer line (the same output plus the `"id"`), so it costs a
//! pipe round trip; it is restarted if it dies, and calls it had not answered get the hook's
//! failure.
//!
//! What a failure means depends on the event ([`Reply::Failed`]: any other exit code, a crash, a
//! timeout — default 10 s —, stdout that is not JSON, a persistent hook that died). Before the
//! call (`PreToolUse`) it **denies** (fail closed, stricter than Claude Code). After the call
//! (`PostToolUse`) the call has already run, so its result is **kept, code and all**, and a line
//! naming the hook's failure is appended: an effect that happened is never reported as failed,
//! and a failed call never turns into a success.

use std::collections::HashMap;
use std::fmt;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use regex::Regex;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};

use super::rules::{CLAUDE_CODE_NAMES, CLAUDE_CODE_ONLY, PolicyError, claude_code_names};
use crate::process_tree::{GroupKiller, Isolation, Launcher, ProcessTree, sweep_now};
use crate::protocol::ToolDispatchResult;

/// Default timeout of an external hook.
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest stdout or stderr kept from a per-call hook.
const HOOK_OUTPUT_CAP: u64 = 64 * 1024;

/// What a `PreToolUse` hook sees.
#[derive(Debug)]
pub struct PreToolUse<'a> {
    /// The session's id.
    pub session_id: &'a str,
    /// The tool (registry name).
    pub tool_name: &'a str,
    /// The call's `tool_use_id`.
    pub tool_use_id: &'a str,
    /// The validated arguments.
    pub tool_input: &'a Value,
}

/// What a `PreToolUse` hook decides.
#[derive(Debug, Clone, PartialEq)]
pub enum PreDecision {
    /// No opinion: the rules decide.
    Continue,
    /// Run without asking (a deny rule still denies).
    Allow,
    /// Deny, with the reason the result carries.
    Deny(String),
    /// Replace the arguments (validated against the schema again).
    Rewrite(Value),
}

/// What a `PostToolUse` hook sees.
#[derive(Debug)]
pub struct PostToolUse<'a> {
    /// The session's id.
    pub session_id: &'a str,
    /// The tool.
    pub tool_name: &'a str,
    /// The call's `tool_use_id`.
    pub tool_use_id: &'a str,
    /// The arguments it ran with.
    pub tool_input: &'a Value,
    /// Its result (content and code).
    pub result: &'a ToolDispatchResult,
}

/// What a `PostToolUse` hook does with the content. It never changes the code: the content of a
/// failed call stays `Error [<code>]: …` with the hook's text as the detail.
#[derive(Debug, Clone, PartialEq)]
pub enum PostAction {
    /// Leave it.
    Keep,
    /// Replace the content (the detail, for a failed call).
    Replace(String),
    /// Append a line to the content.
    Annotate(String),
}

type PreFn = dyn Fn(&PreToolUse<'_>) -> PreDecision + Send + Sync;
type PostFn = dyn Fn(&PostToolUse<'_>) -> PostAction + Send + Sync;

/// An in-process hook: a named closure.
#[derive(Clone)]
pub enum Hook {
    /// Before the call.
    Pre(Arc<str>, Arc<PreFn>),
    /// After the call.
    Post(Arc<str>, Arc<PostFn>),
}

impl fmt::Debug for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hook::Pre(label, _) => write!(f, "Hook::Pre({label})"),
            Hook::Post(label, _) => write!(f, "Hook::Post({label})"),
        }
    }
}

impl Hook {
    /// A `PreToolUse` closure named `name` (the audit log and denials say `hook:NAME`).
    pub fn pre<F>(name: &str, f: F) -> Hook
    where
        F: Fn(&PreToolUse<'_>) -> PreDecision + Send + Sync + 'static,
    {
        Hook::Pre(Arc::from(format!("hook:{name}")), Arc::new(f))
    }

    /// A `PostToolUse` closure named `name`.
    pub fn post<F>(name: &str, f: F) -> Hook
    where
        F: Fn(&PostToolUse<'_>) -> PostAction + Send + Sync + 'static,
    {
        Hook::Post(Arc::from(format!("hook:{name}")), Arc::new(f))
    }
}

/// Applies a `PostToolUse` action to a result (the code never changes). A replaced result is
/// text only (its images are gone with the rest of the content); an annotation of a result with
/// images is one more text block after them.
pub fn apply_post(result: &mut ToolDispatchResult, action: PostAction) {
    match (action, result.error) {
        (PostAction::Keep, _) => {}
        (PostAction::Replace(text), None) => {
            result.content = text;
            result.blocks = None;
        }
        (PostAction::Replace(text), Some(code)) => {
            result.content = format!("Error [{}]: {text}", code.as_str())
        }
        (PostAction::Annotate(text), _) => {
            result.content.push('\n');
            result.content.push_str(&text);
            if let Some(blocks) = result.blocks.take() {
                let mut blocks = blocks.into_vec();
                blocks.push(crate::protocol::Block::text(text));
                result.blocks = Some(blocks.into_boxed_slice());
            }
        }
    }
}

/// One external hook of the policy file.
pub struct External {
    matcher: Option<Regex>,
    /// The command as written (never shown: it may hold a credential).
    pub command: String,
    /// `hook:NAME` — the hook's `"name"`, else its place in the file
    /// (`hook:PreToolUse[0].hooks[1]`) — as the audit log, denials and notes name it.
    pub label: Arc<str>,
    timeout: Duration,
    persistent: Option<Persistent>,
    tree: Arc<ProcessTree>,
}

impl fmt::Debug for External {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The command line stays out of logs: it may carry a credential.
        f.debug_struct("External")
            .field("label", &self.label)
            .field("matcher", &self.matcher.as_ref().map(Regex::as_str))
            .field("timeout", &self.timeout)
            .field("persistent", &self.persistent.is_some())
            .finish()
    }
}

/// The external hooks of a policy file.
#[derive(Debug, Default)]
pub struct ExternalHooks {
    /// `PreToolUse`, in file order.
    pub pre: Vec<External>,
    /// `PostToolUse`, in file order.
    pub post: Vec<External>,
}

impl ExternalHooks {
    /// Parses the `hooks` object; the error names the entry at fault.
    pub fn from_json(hooks: &Value) -> Result<ExternalHooks, PolicyError> {
        let err = |m: String| PolicyError::new(format!("hooks: {m}"));
        let Some(obj) = hooks.as_object() else {
            return Err(err("must be an object".into()));
        };
        let mut out = ExternalHooks::default();
        // One process-tree control for every hook (the namespace probe runs once).
        let tree = Arc::new(ProcessTree::new(Isolation::Auto));
        for (event, groups) in obj {
            let post = match event.as_str() {
                "PreToolUse" => false,
                "PostToolUse" => true,
                _ => {
                    return Err(err(format!(
                        "event \"{event}\" is not supported (only PreToolUse and PostToolUse)"
                    )));
                }
            };
            let Some(groups) = groups.as_array() else {
                return Err(err(format!("\"{event}\" must be an array")));
            };
            for (i, group) in groups.iter().enumerate() {
                let at = format!("{event}[{i}]");
                let matcher = match group.get("matcher").and_then(Value::as_str) {
                    None | Some("") | Some("*") => None,
                    Some(m) => Some(matcher(m).map_err(|e| err(format!("{at}: {e}")))?),
                };
                let Some(list) = group.get("hooks").and_then(Value::as_array) else {
                    return Err(err(format!("{at}: \"hooks\" must be an array")));
                };
                for (j, h) in list.iter().enumerate() {
                    let at = format!("{at}.hooks[{j}]");
                    let kind = h.get("type").and_then(Value::as_str).unwrap_or("");
                    let Some(command) = h.get("command").and_then(Value::as_str) else {
                        return Err(err(format!("{at}: \"command\" must be a string")));
                    };
                    let timeout = match h.get("timeout") {
                        None => DEFAULT_HOOK_TIMEOUT,
                        Some(t) => match t.as_f64() {
                            Some(s) if s > 0.0 && s <= 3600.0 => Duration::from_secs_f64(s),
                            _ => {
                                return Err(err(format!(
                                    "{at}: \"timeout\" must be seconds in (0, 3600]"
                                )));
                            }
                        },
                    };
                    let name = match h.get("name") {
                        None => at.clone(),
                        Some(Value::String(n))
                            if !n.is_empty()
                                && n.len() <= 64
                                && n.bytes()
                                    .all(|b| b.is_ascii_alphanumeric() || b"_-.:".contains(&b)) =>
                        {
                            n.clone()
                        }
                        Some(_) => {
                            return Err(err(format!(
                                "{at}: \"name\" must be 1 to 64 letters, digits, _ - . :"
                            )));
                        }
                    };
                    let label = format!("hook:{name}");
                    let persistent = match kind {
                        "command" => None,
                        "persistent" => Some(Persistent::new(command, &label)),
                        other => {
                            return Err(err(format!(
                                "{at}: type \"{other}\" (expected \"command\" or \"persistent\")"
                            )));
                        }
                    };
                    let list = if post { &mut out.post } else { &mut out.pre };
                    list.push(External {
                        matcher: matcher.clone(),
                        command: command.to_string(),
                        label: Arc::from(label),
                        timeout,
                        persistent,
                        tree: Arc::clone(&tree),
                    });
                }
            }
        }
        Ok(out)
    }

    /// True when some hook (before or after) runs for `tool`.
    pub fn any_for(&self, tool: &str) -> bool {
        self.pre.iter().chain(&self.post).any(|h| h.matches(tool))
    }

    /// True when the file names no hook at all.
    pub fn is_empty(&self) -> bool {
        self.pre.is_empty() && self.post.is_empty()
    }
}

/// A hook matcher: a regex over tool names, anchored. One that names a Claude Code tool with no
/// counterpart here (`Grep`, `WebFetch`, …) is refused: it would be accepted and never run.
fn matcher(m: &str) -> Result<Regex, String> {
    let regex =
        Regex::new(&format!("^(?:{m})$")).map_err(|e| format!("bad matcher \"{m}\": {e}"))?;
    let ours: Vec<&str> = CLAUDE_CODE_NAMES
        .iter()
        .map(|(theirs, _)| *theirs)
        .collect();
    if let Some(only) = CLAUDE_CODE_ONLY
        .iter()
        .find(|name| m.split('|').any(|alt| alt.trim() == **name))
    {
        return Err(format!(
            "matcher \"{m}\" names Claude Code's {only} tool, which Switchboard does not have \
             (Claude Code names it maps: {}; or use registry names such as bash, write_file, \
             mcp__server__tool)",
            ours.join(", ")
        ));
    }
    Ok(regex)
}

/// Where an external hook runs: the workspace (if any) as its directory, `HOME` and `PWD`.
#[derive(Debug, Clone, Copy)]
pub struct HookPlace<'a> {
    /// The session's workspace root.
    pub workspace: Option<&'a std::path::Path>,
}

impl External {
    /// True when the hook's matcher takes `tool`, by its registry name or, for a built-in, by
    /// one of Claude Code's names for it (`Bash`, `Write`, `Edit`, …).
    pub fn matches(&self, tool: &str) -> bool {
        self.matcher.as_ref().is_none_or(|m| {
            m.is_match(tool) || claude_code_names(tool).any(|name| m.is_match(name))
        })
    }

    /// The process id of a persistent hook, while it runs.
    pub async fn persistent_pid(&self) -> Option<u32> {
        match &self.persistent {
            Some(p) => p.pid().await,
            None => None,
        }
    }

    /// Runs the hook for one call: its answer, not yet read as a decision.
    pub async fn reply(&self, input: &Value, place: HookPlace<'_>) -> Reply {
        let launcher = self.tree.launcher("hooks").await;
        match &self.persistent {
            Some(p) => p.ask(input, self.timeout, place, launcher).await,
            None => {
                let hook = (self.command.as_str(), &*self.label);
                run_command(hook, input, self.timeout, place, launcher).await
            }
        }
    }

    /// Runs a `PreToolUse` hook for one call.
    pub async fn run(&self, input: &Value, place: HookPlace<'_>) -> PreDecision {
        pre_decision(self.reply(input, place).await)
    }
}

/// What an external hook answered, before it is read as a `PreToolUse` decision
/// (`pre_decision`) or `PostToolUse` actions (`post_actions`).
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// Exit 0 and nothing on stdout: no opinion.
    Silent,
    /// Exit 0 and a JSON object on stdout (or a persistent hook's answer line).
    Json(Value),
    /// Exit 2: stderr (or a default text) is the reason.
    Blocked(String),
    /// It did not answer as a hook must: what went wrong (exit code, crash, timeout, not JSON,
    /// could not start, died).
    Failed(String),
}

/// A `PreToolUse` hook's answer as a decision: a failure denies (fail closed).
pub fn pre_decision(reply: Reply) -> PreDecision {
    match reply {
        Reply::Silent => PreDecision::Continue,
        Reply::Json(v) => decision_of(&v),
        Reply::Blocked(reason) => PreDecision::Deny(reason),
        Reply::Failed(what) => PreDecision::Deny(format!("{what} (fail closed)")),
    }
}

/// A `PostToolUse` hook's answer as what it does to the result, in order (Claude Code's
/// output): `hookSpecificOutput.updatedMCPToolOutput` replaces the content (a string as is,
/// other JSON as its text); `decision: "block"` with `reason`, `"continue": false` with
/// `stopReason`, and exit 2 with stderr append `LABEL: reason`;
/// `hookSpecificOutput.additionalContext` appends its text. A failure keeps the result and
/// appends `LABEL failed: … (the result above is kept)`: the call already ran.
pub fn post_actions(label: &str, reply: Reply) -> Vec<PostAction> {
    let v = match reply {
        Reply::Silent => return Vec::new(),
        Reply::Blocked(reason) => return vec![PostAction::Annotate(format!("{label}: {reason}"))],
        Reply::Failed(what) => {
            return vec![PostAction::Annotate(format!(
                "{label} failed: {what} (the result above is kept)"
            ))];
        }
        Reply::Json(v) => v,
    };
    let specific = v.get("hookSpecificOutput");
    let mut actions = Vec::new();
    if let Some(updated) = specific.and_then(|s| s.get("updatedMCPToolOutput")) {
        actions.push(PostAction::Replace(match updated {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        }));
    }
    let text = |name: &str| v.get(name).and_then(Value::as_str);
    if v.get("decision").and_then(Value::as_str) == Some("block") {
        let reason = text("reason").unwrap_or("blocked");
        actions.push(PostAction::Annotate(format!("{label}: {reason}")));
    } else if v.get("continue") == Some(&Value::Bool(false)) {
        let reason = text("stopReason").unwrap_or("asks to stop");
        actions.push(PostAction::Annotate(format!("{label}: {reason}")));
    }
    if let Some(context) = specific
        .and_then(|s| s.get("additionalContext"))
        .and_then(Value::as_str)
    {
        actions.push(PostAction::Annotate(context.to_string()));
    }
    actions
}

/// `bash -c COMMAND` under the process-tree control bash's commands get ([`ProcessTree`]): a
/// PID namespace when the system allows it, a process group, and in direct mode a token the
/// sweep finds. The same environment allowlist as `bash`, in the workspace.
fn command_for(
    command: &str,
    place: HookPlace<'_>,
    launcher: &Launcher,
    token: Option<&str>,
) -> Command {
    let mut cmd = launcher.command(&launcher.shell(command));
    crate::process_env::inherit_tool_env(&mut cmd);
    Launcher::mark(&mut cmd, token);
    if let Some(root) = place.workspace {
        cmd.current_dir(root).env("HOME", root).env("PWD", root);
    }
    cmd
}

async fn run_command(
    (command, label): (&str, &str),
    input: &Value,
    timeout: Duration,
    place: HookPlace<'_>,
    launcher: &Launcher,
) -> Reply {
    let token = launcher.token();
    let mut cmd = command_for(command, place, launcher, token.as_deref());
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => return Reply::Failed(format!("{label} could not start: {e}")),
    };
    // Whatever the hook started dies with it: its group now, the rest with its namespace (or
    // the sweep), also when this future is dropped.
    let group = GroupKiller::of(&child);
    let _sweep = token.map(Sweep);
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let body = input.to_string();
    let talk = async {
        if let Some(mut s) = stdin.take() {
            // A hook that does not read its input is fine.
            let _ = s.write_all(body.as_bytes()).await;
            drop(s);
        }
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(s) = stdout.as_mut() {
                let _ = s.take(HOOK_OUTPUT_CAP).read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = stderr.as_mut() {
                let _ = s.take(HOOK_OUTPUT_CAP).read_to_end(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (status, out, err)
    };
    let outcome = tokio::time::timeout(timeout, talk).await;
    group.kill();
    let (status, out, err) = match outcome {
        Ok(done) => done,
        Err(_) => {
            return Reply::Failed(format!(
                "{label} did not answer within {} s",
                timeout.as_secs_f64()
            ));
        }
    };
    let stderr_text = String::from_utf8_lossy(&err).trim().to_string();
    match status.map(|s| (s.code(), s)) {
        Ok((Some(0), _)) => parse_output(label, &out),
        Ok((Some(2), _)) => Reply::Blocked(if stderr_text.is_empty() {
            format!("blocked by {label}")
        } else {
            stderr_text
        }),
        // In a PID namespace the hook's shell runs under an init, which reports a death by
        // signal N as 128 + N.
        Ok((Some(code), _)) if code > 128 && matches!(launcher, Launcher::Namespaces { .. }) => {
            Reply::Failed(format!(
                "{label} crashed (status {code}: signal {}){}",
                code - 128,
                tail(&stderr_text)
            ))
        }
        Ok((Some(code), _)) => Reply::Failed(format!(
            "{label} failed with exit code {code}{}",
            tail(&stderr_text)
        )),
        Ok((None, status)) => Reply::Failed(format!("{label} crashed ({status})")),
        Err(e) => Reply::Failed(format!("{label}: {e}")),
    }
}

/// Direct mode: sweeps the token's processes when dropped (off the async runtime).
struct Sweep(String);

impl Drop for Sweep {
    fn drop(&mut self) {
        let token = std::mem::take(&mut self.0);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(move || sweep_now(&token));
            }
            Err(_) => sweep_now(&token),
        }
    }
}

fn tail(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!(": {}", super::audit::truncate(stderr, 512))
    }
}

/// A hook's stdout: empty (no opinion) or Claude Code's decision JSON; anything else is a
/// failure.
fn parse_output(label: &str, out: &[u8]) -> Reply {
    let text = String::from_utf8_lossy(out);
    if text.trim().is_empty() {
        return Reply::Silent;
    }
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(v) if v.is_object() => Reply::Json(v),
        _ => Reply::Failed(format!(
            "{label} printed something that is not decision JSON"
        )),
    }
}

/// Claude Code's PreToolUse output: `hookSpecificOutput.permissionDecision` (`allow`, `deny`,
/// `ask`) with `permissionDecisionReason` and `updatedInput`, or the older top-level
/// `decision` (`approve`, `block`) with `reason`; `"continue": false` denies too.
pub fn decision_of(v: &Value) -> PreDecision {
    let specific = v.get("hookSpecificOutput");
    let field = |name: &str| {
        specific
            .and_then(|s| s.get(name))
            .or_else(|| v.get(name))
            .cloned()
    };
    let reason = field("permissionDecisionReason")
        .or_else(|| v.get("reason").cloned())
        .or_else(|| v.get("stopReason").cloned())
        .and_then(|r| r.as_str().map(str::to_string))
        .unwrap_or_else(|| "denied by hook".into());
    if v.get("continue") == Some(&Value::Bool(false)) {
        return PreDecision::Deny(reason);
    }
    let decision = field("permissionDecision").or_else(|| v.get("decision").cloned());
    match decision.as_ref().and_then(Value::as_str) {
        Some("deny") | Some("block") => return PreDecision::Deny(reason),
        Some("allow") | Some("approve") | None | Some("ask") => {}
        Some(other) => return PreDecision::Deny(format!("hook answered \"{other}\"")),
    }
    if let Some(updated) = field("updatedInput") {
        return PreDecision::Rewrite(updated);
    }
    match decision.as_ref().and_then(Value::as_str) {
        Some("allow") | Some("approve") => PreDecision::Allow,
        _ => PreDecision::Continue,
    }
}

/// Requests a persistent hook may have waiting for their answer; past it a call is not queued.
pub const PERSISTENT_MAX_WAITING: usize = 4_096;
/// Bytes of request lines queued for a persistent hook and not yet written to it (a hook that
/// stops reading its input); past it a call is not queued.
pub const PERSISTENT_QUEUE_BYTES: usize = 8 << 20;

/// A long-lived hook process speaking JSON lines.
///
/// Any number of requests are in flight on the one process: each line carries an `"id"` and its
/// answer is matched by it, in whatever order the hook answers. A call registers its answer
/// slot and queues its line without waiting for anything (a plain mutex, held for a map insert and
/// a channel send); one writer task per process writes every queued line in one `write`, so
/// calls never queue behind each other's writes, and one reader task hands each answer line to
/// the call it answers. The queue is bounded ([`PERSISTENT_MAX_WAITING`] requests waiting,
/// [`PERSISTENT_QUEUE_BYTES`] not yet written): a call that finds it full is answered at once
/// with the hook's failure (denied before the call, kept with a note after it), and a call that
/// stops waiting (timeout, cancellation) leaves no slot behind.
pub struct Persistent {
    command: String,
    label: String,
    next: AtomicU64,
    running: std::sync::Mutex<Option<Running>>,
}

impl fmt::Debug for Persistent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Persistent({})", self.label)
    }
}

/// The calls waiting for an answer, by request id; `None` once the process is dead (its stdout
/// ended or a write failed): dropping the senders answers every waiting call, and no new one is
/// accepted by this process.
type Waiting = Arc<std::sync::Mutex<Option<HashMap<u64, oneshot::Sender<Value>>>>>;

struct Running {
    /// Request lines for the writer task.
    lines: mpsc::UnboundedSender<Vec<u8>>,
    /// Bytes sent to the writer task and not yet written to the hook.
    queued: Arc<AtomicUsize>,
    waiting: Waiting,
    child: Child,
    /// Kills the process group when the process is replaced or the hooks are dropped.
    _group: GroupKiller,
    /// Direct mode: sweeps what left the group.
    _sweep: Option<Sweep>,
}

impl Running {
    fn alive(&self) -> bool {
        self.waiting.lock().is_ok_and(|w| w.is_some())
    }
}

/// Marks a process dead: every call still waiting is answered (its sender dropped).
fn dead(waiting: &Waiting) {
    if let Ok(mut w) = waiting.lock() {
        *w = None;
    }
}

/// A call's answer slot, removed when the call stops waiting for whatever reason.
struct Slot {
    waiting: Waiting,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut w) = self.waiting.lock()
            && let Some(w) = w.as_mut()
        {
            w.remove(&self.id);
        }
    }
}

impl Persistent {
    fn new(command: &str, label: &str) -> Persistent {
        Persistent {
            command: command.to_string(),
            label: label.to_string(),
            next: AtomicU64::new(0),
            running: std::sync::Mutex::new(None),
        }
    }

    /// The process's id, if it runs (for tests that kill it).
    pub async fn pid(&self) -> Option<u32> {
        self.running
            .lock()
            .ok()?
            .as_ref()
            .and_then(|r| r.child.id())
    }

    fn start(&self, place: HookPlace<'_>, launcher: &Launcher) -> std::io::Result<Running> {
        let token = launcher.token();
        let mut cmd = command_for(&self.command, place, launcher, token.as_deref());
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn()?;
        let group = GroupKiller::of(&child);
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let waiting: Waiting = Arc::new(std::sync::Mutex::new(Some(HashMap::new())));
        let reader_waiting = Arc::clone(&waiting);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                let Some(id) = v.get("id").and_then(Value::as_u64) else {
                    continue;
                };
                let tx = reader_waiting
                    .lock()
                    .ok()
                    .and_then(|mut w| w.as_mut().and_then(|w| w.remove(&id)));
                if let Some(tx) = tx {
                    let _ = tx.send(v);
                }
            }
            dead(&reader_waiting);
        });
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let writer_waiting = Arc::clone(&waiting);
        let queued = Arc::new(AtomicUsize::new(0));
        let writer_queued = Arc::clone(&queued);
        tokio::spawn(async move {
            // Everything queued by the time the writer runs goes out in one write.
            while let Some(mut batch) = rx.recv().await {
                while let Ok(more) = rx.try_recv() {
                    batch.extend_from_slice(&more);
                }
                let wrote = stdin.write_all(&batch).await;
                writer_queued.fetch_sub(batch.len(), Ordering::Relaxed);
                if wrote.is_err() {
                    dead(&writer_waiting);
                    break;
                }
            }
        });
        Ok(Running {
            lines: tx,
            queued,
            waiting,
            child,
            _group: group,
            _sweep: token.map(Sweep),
        })
    }

    /// Queues one request; the receiver gets its answer line, and the slot leaves the map when
    /// dropped. `Err` is the call's failure (the hook could not start, died, or its queue is
    /// full).
    fn send(
        &self,
        id: u64,
        line: Vec<u8>,
        place: HookPlace<'_>,
        launcher: &Launcher,
    ) -> Result<(oneshot::Receiver<Value>, Slot), Reply> {
        let label = &self.label;
        let mut running = self
            .running
            .lock()
            .map_err(|_| Reply::Failed(format!("{label} is not running")))?;
        if !running.as_ref().is_some_and(Running::alive) {
            // The old process (if any) and everything it started are killed as it is dropped.
            running.take();
            let started = self
                .start(place, launcher)
                .map_err(|e| Reply::Failed(format!("{label} could not start: {e}")))?;
            *running = Some(started);
        }
        let died = || Reply::Failed(format!("{label} died; it is restarted for the next call"));
        let r = running.as_ref().ok_or_else(died)?;
        let queued = r.queued.load(Ordering::Relaxed);
        if queued > 0 && queued + line.len() > PERSISTENT_QUEUE_BYTES {
            return Err(Reply::Failed(format!(
                "{label} is not reading its input: {queued} bytes of requests are queued for it \
                 (at most {PERSISTENT_QUEUE_BYTES}), so this call was not queued"
            )));
        }
        let (tx, rx) = oneshot::channel();
        let registered = {
            let Ok(mut w) = r.waiting.lock() else {
                return Err(died());
            };
            match w.as_mut() {
                None => return Err(died()),
                Some(w) if w.len() >= PERSISTENT_MAX_WAITING => {
                    return Err(Reply::Failed(format!(
                        "{label} has {PERSISTENT_MAX_WAITING} requests waiting for an answer, \
                         so this call was not queued"
                    )));
                }
                Some(w) => w.insert(id, tx).is_none(),
            }
        };
        let slot = Slot {
            waiting: Arc::clone(&r.waiting),
            id,
        };
        let len = line.len();
        r.queued.fetch_add(len, Ordering::Relaxed);
        if !registered || r.lines.send(line).is_err() {
            r.queued.fetch_sub(len, Ordering::Relaxed);
            return Err(died());
        }
        Ok((rx, slot))
    }

    async fn ask(
        &self,
        input: &Value,
        timeout: Duration,
        place: HookPlace<'_>,
        launcher: &Launcher,
    ) -> Reply {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (rx, _slot) = match self.send(id, request_line(id, input), place, launcher) {
            Ok(waiting) => waiting,
            Err(failed) => return failed,
        };
        let label = &self.label;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(answer)) => Reply::Json(answer),
            Ok(Err(_)) => Reply::Failed(format!(
                "{label} died before answering; it is restarted for the next call"
            )),
            Err(_) => Reply::Failed(format!(
                "{label} did not answer within {} s",
                timeout.as_secs_f64()
            )),
        }
    }
}

/// `input` (an object) as one request line with `"id"` first, without copying the input.
fn request_line(id: u64, input: &Value) -> Vec<u8> {
    let mut line = format!("{{\"id\":{id}").into_bytes();
    let body = serde_json::to_vec(input).unwrap_or_default();
    match body.strip_prefix(b"{") {
        Some(b"}") | None => line.push(b'}'),
        Some(rest) => {
            line.push(b',');
            line.extend_from_slice(rest);
        }
    }
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn claude_code_decision_json_is_understood() {
        let deny = json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
            "permissionDecision": "deny", "permissionDecisionReason": "no rm"}});
        assert_eq!(decision_of(&deny), PreDecision::Deny("no rm".into()));
        let allow = json!({"hookSpecificOutput": {"permissionDecision": "allow"}});
        assert_eq!(decision_of(&allow), PreDecision::Allow);
        let old = json!({"decision": "block", "reason": "old style"});
        assert_eq!(decision_of(&old), PreDecision::Deny("old style".into()));
        let rewrite = json!({"hookSpecificOutput": {"permissionDecision": "allow",
            "updatedInput": {"command": "ls"}}});
        assert_eq!(
            decision_of(&rewrite),
            PreDecision::Rewrite(json!({"command": "ls"}))
        );
        assert_eq!(decision_of(&json!({})), PreDecision::Continue);
        assert_eq!(
            decision_of(&json!({"continue": false, "stopReason": "stop"})),
            PreDecision::Deny("stop".into())
        );
    }

    #[test]
    fn only_tool_use_command_and_persistent_hooks_parse() {
        let ok = json!({"PreToolUse": [{"matcher": "bash|glob", "hooks": [
            {"type": "command", "command": "true"},
            {"type": "persistent", "command": "cat", "timeout": 2}]}],
            "PostToolUse": [{"matcher": "write_file", "hooks": [{"type": "command", "command": "true"}]}]});
        let hooks = ExternalHooks::from_json(&ok).unwrap();
        assert_eq!((hooks.pre.len(), hooks.post.len()), (2, 1));
        assert!(hooks.any_for("bash") && hooks.any_for("glob") && !hooks.any_for("bash2"));
        assert!(hooks.any_for("write_file") && !hooks.any_for("read_file"));
        for (bad, needle) in [
            (json!({"Stop": []}), "Stop"),
            (
                json!({"PreToolUse": [{"matcher": "(", "hooks": []}]}),
                "bad matcher",
            ),
            (
                json!({"PreToolUse": [{"hooks": [{"type": "http", "command": "x"}]}]}),
                "http",
            ),
            (
                json!({"PreToolUse": [{"hooks": [{"type": "command"}]}]}),
                "command",
            ),
        ] {
            let e = ExternalHooks::from_json(&bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
    }

    #[test]
    fn claude_code_matchers_match_the_built_in_tools_they_name() {
        let hooks = |m: &str| {
            ExternalHooks::from_json(&json!({"PreToolUse": [{"matcher": m,
                "hooks": [{"type": "command", "command": "true"}]}]}))
        };
        for (m, yes, no) in [
            ("Bash", &["bash"][..], &["read_file", "bash2"][..]),
            (
                "Write|Edit",
                &["write_file", "edit_file"],
                &["read_file", "bash"],
            ),
            ("MultiEdit", &["edit_file"], &["write_file"]),
            ("Read|Glob", &["read_file", "glob"], &["bash"]),
            (
                "mcp__.*",
                &["mcp__fs__read", "mcp__github__create_issue"],
                &["bash"],
            ),
            ("bash|write_file", &["bash", "write_file"], &["edit_file"]),
        ] {
            let h = hooks(m).unwrap();
            for tool in yes {
                assert!(h.any_for(tool), "{m} should match {tool}");
            }
            for tool in no {
                assert!(!h.any_for(tool), "{m} should not match {tool}");
            }
        }
        for m in ["Grep", "Grep|Glob", "WebFetch", "Task"] {
            let e = hooks(m).unwrap_err().to_string();
            assert!(
                e.contains("Switchboard does not have") && e.contains(m.split('|').next().unwrap()),
                "{e}"
            );
        }
    }

    #[test]
    fn post_actions_never_turn_a_failure_into_success() {
        let mut r = ToolDispatchResult::error(
            "t".into(),
            "x".into(),
            crate::ErrorCode::ExecutionError,
            "boom",
            Default::default(),
        );
        apply_post(&mut r, PostAction::Replace("all fine".into()));
        assert_eq!(r.content, "Error [execution_error]: all fine");
        assert_eq!(r.error, Some(crate::ErrorCode::ExecutionError));
        let mut ok =
            ToolDispatchResult::ok("t".into(), "x".into(), "hi".into(), Default::default());
        apply_post(&mut ok, PostAction::Annotate("(checked)".into()));
        assert_eq!(ok.content, "hi\n(checked)");
    }

    #[test]
    fn request_lines_put_the_id_first_and_end_with_a_newline() {
        let line = request_line(7, &json!({"tool_name": "x", "tool_input": {"a": [1]}}));
        assert_eq!(line.last(), Some(&b'\n'));
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            v,
            json!({"id": 7, "tool_name": "x", "tool_input": {"a": [1]}})
        );
        assert!(line.starts_with(b"{\"id\":7,"));
        assert_eq!(request_line(3, &json!({})), b"{\"id\":3}\n");
    }

    #[test]
    fn claude_code_post_tool_use_output_is_understood() {
        let label = "hook:lint";
        assert_eq!(post_actions(label, Reply::Silent), []);
        let block = json!({"decision": "block", "reason": "lint failed",
            "hookSpecificOutput": {"hookEventName": "PostToolUse", "additionalContext": "see docs"}});
        assert_eq!(
            post_actions(label, Reply::Json(block)),
            [
                PostAction::Annotate("hook:lint: lint failed".into()),
                PostAction::Annotate("see docs".into())
            ]
        );
        let replaced = json!({"hookSpecificOutput": {"updatedMCPToolOutput": "redacted"}});
        assert_eq!(
            post_actions(label, Reply::Json(replaced)),
            [PostAction::Replace("redacted".into())]
        );
        assert_eq!(
            post_actions(label, Reply::Blocked("from stderr".into())),
            [PostAction::Annotate("hook:lint: from stderr".into())]
        );
        assert_eq!(
            post_actions(label, Reply::Failed("exit code 1".into())),
            [PostAction::Annotate(
                "hook:lint failed: exit code 1 (the result above is kept)".into()
            )]
        );
        // A failed call stays failed whatever the hook does.
        let mut r = ToolDispatchResult::error(
            "t".into(),
            "x".into(),
            crate::ErrorCode::Timeout,
            "slow",
            Default::default(),
        );
        for a in post_actions(
            label,
            Reply::Json(json!({"hookSpecificOutput": {"updatedMCPToolOutput": "fine"}})),
        ) {
            apply_post(&mut r, a);
        }
        assert_eq!(r.content, "Error [timeout]: fine");
        assert_eq!(r.error, Some(crate::ErrorCode::Timeout));
    }

    #[test]
    fn post_actions_keep_images_and_blocks_consistent() {
        let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
        let output = crate::protocol::ToolOutput::blocks([
            crate::protocol::Block::text("shot"),
            crate::protocol::Block::image("image/png", png),
        ]);
        let mut r =
            ToolDispatchResult::from_output("t".into(), "x".into(), output, Default::default());
        apply_post(&mut r, PostAction::Annotate("(checked)".into()));
        assert!(r.content.ends_with("\n(checked)"), "{}", r.content);
        let blocks = r.blocks.as_deref().unwrap();
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[2], crate::protocol::Block::text("(checked)"));
        apply_post(&mut r, PostAction::Replace("gone".into()));
        assert_eq!((r.content.as_str(), r.blocks.is_none()), ("gone", true));
    }
}
