//! Client tools: tools a session declares when it is created (`POST /v1/sessions` `tools`) and
//! its client runs. The engine treats a call of one like any call — validation, planning by its
//! access declaration, policy, deadline, output cap, metrics — and its handler hands the call to
//! the client instead of running anything: an `event: call` on the turn's stream, answered by
//! `POST /v1/sessions/{id}/calls/{call_id}`. The event carries the call's idempotency key
//! (`idempotency_key`), which the clients hand to the tool's function.
//!
//! Exactly one answer per call, decided under one lock ([`Delegate`]): the client's answer, or
//! the engine's own when the call is given up first — its deadline passed (`timeout`), its turn
//! was cancelled, or the turn's stream went away (`cancelled`, at once, so nothing waits for a
//! client that left). An answer that loses that race is refused `409` and changes nothing; one
//! that wins takes the call's commit gate, so the engine reports it even if the deadline passes
//! a moment later.
//!
//! While a call waits for its answer the client may report its progress (`POST
//! /v1/sessions/{id}/calls/{call_id}/progress`, [`parse_progress`]): it goes to the call's live
//! progress ([`crate::tool::Progress`]), so to the turn's stream as `event: progress`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::locks::lock;
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::errors::ApiError;
use crate::protocol::{Block, ErrorCode};
use crate::tool::{
    Access, CommitGate, Defer, Effect, Handler, Mode, OutputStream, Progress, Resource,
    ToolContext, ToolError, ToolOutcome, ToolOutput, ToolSpec,
};
use crate::workspace::Workspace;

/// Default `--max-client-tools`: client tools one session may declare.
pub const DEFAULT_MAX_TOOLS: usize = 256;
/// Default `--max-client-schema-bytes`: the largest input schema of one client tool (as JSON).
pub const DEFAULT_MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Longest `timeout_ms` a client tool may ask for (one day).
const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;
/// How many answered or given-up calls a session remembers, to answer a late or second answer
/// `409` rather than `404`.
const CLOSED_REMEMBERED: usize = 4096;

/// The server's limits on client tools.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most client tools per session.
    pub max_tools: usize,
    /// Largest input schema, in bytes of JSON.
    pub max_schema_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tools: DEFAULT_MAX_TOOLS,
            max_schema_bytes: DEFAULT_MAX_SCHEMA_BYTES,
        }
    }
}

/// Keys a tool definition may carry (besides the shape's own).
const EXTRA_KEYS: [&str; 8] = [
    "concurrency_safe",
    "access",
    "timeout_ms",
    "output_cap",
    "defer",
    "defer_loading",
    "effect",
    "annotations",
];
/// The keys of an MCP-style `annotations` object: the two hints that say the tool's effect, and
/// the others MCP defines (accepted and ignored).
const ANNOTATION_KEYS: [&str; 5] = [
    "readOnlyHint",
    "idempotentHint",
    "destructiveHint",
    "openWorldHint",
    "title",
];
/// How a bad `effect` is refused.
const EFFECT_VALUES: &str = "`effect` must be \"read_only\", \"idempotent\" or \"side_effect\"";
/// Keys of the Anthropic shape that are accepted and ignored.
const IGNORED_KEYS: [&str; 2] = ["cache_control", "type"];

/// Parses the `tools` of a create-session body into specs whose handlers hand calls to
/// `delegate`. Every refusal is `bad_request` naming the tool (by name, or by position).
pub fn parse(
    tools: &Value,
    limits: Limits,
    delegate: &Arc<Delegate>,
) -> Result<Vec<ToolSpec>, ApiError> {
    let Value::Array(list) = tools else {
        return Err(ApiError::BadRequest("`tools` must be an array".into()));
    };
    if list.len() > limits.max_tools {
        return Err(ApiError::BadRequest(format!(
            "{} client tools: a session may declare at most {} (the server's --max-client-tools)",
            list.len(),
            limits.max_tools
        )));
    }
    list.iter()
        .enumerate()
        .map(|(i, def)| parse_one(i, def, limits, delegate))
        .collect()
}

fn parse_one(
    index: usize,
    def: &Value,
    limits: Limits,
    delegate: &Arc<Delegate>,
) -> Result<ToolSpec, ApiError> {
    let bad = |what: String| ApiError::BadRequest(format!("client tool {what}"));
    let Value::Object(fields) = def else {
        return Err(bad(format!("#{index}: must be a JSON object")));
    };
    let openai = fields.get("type").and_then(Value::as_str) == Some("function");
    let (shape, name_key, schema_key): (&Map<String, Value>, _, _) = if openai {
        let Some(Value::Object(function)) = fields.get("function") else {
            return Err(bad(format!(
                "#{index}: `type: function` needs a `function` object"
            )));
        };
        (function, "name", "parameters")
    } else {
        (fields, "name", "input_schema")
    };
    let name = match shape.get(name_key) {
        Some(Value::String(name)) => name.clone(),
        _ => return Err(bad(format!("#{index}: `name` must be a string"))),
    };
    let bad = |what: &str| ApiError::BadRequest(format!("client tool `{name}`: {what}"));
    if !crate::registry::valid_tool_name(&name) {
        return Err(bad("names must match ^[a-zA-Z0-9_-]{1,64}$"));
    }
    if name.starts_with("mcp__") {
        return Err(bad("names starting with mcp__ belong to MCP servers"));
    }
    if name == crate::registry::TOOL_SEARCH {
        return Err(bad(
            "the name is the engine's own search of deferred tools (mark tools with `defer` instead)",
        ));
    }
    let description = match shape.get("description") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(d)) => d.clone(),
        Some(_) => return Err(bad("`description` must be a string")),
    };
    let schema = match shape.get(schema_key) {
        Some(schema @ Value::Object(_)) => schema.clone(),
        None if openai => json!({"type": "object", "properties": {}}),
        _ => return Err(bad(&format!("`{schema_key}` must be a JSON Schema object"))),
    };
    let size = schema.to_string().len();
    if size > limits.max_schema_bytes {
        return Err(bad(&format!(
            "its schema is {size} bytes; the server takes at most {} (--max-client-schema-bytes)",
            limits.max_schema_bytes
        )));
    }
    for key in fields.keys() {
        let own = if openai {
            key == "function"
        } else {
            ["name", "description", "input_schema"].contains(&key.as_str())
        };
        if !own && !EXTRA_KEYS.contains(&key.as_str()) && !IGNORED_KEYS.contains(&key.as_str()) {
            return Err(bad(&format!(
                "unknown key `{key}` (accepted besides the tool's own: {})",
                EXTRA_KEYS.join(", ")
            )));
        }
    }
    let handler = {
        let delegate = Arc::clone(delegate);
        let name: Arc<str> = Arc::from(name.as_str());
        Handler::future(move |args, ctx| Arc::clone(&delegate).call(Arc::clone(&name), args, ctx))
    };
    let mut spec = ToolSpec::new(name.clone(), description, schema, handler);
    match fields.get("concurrency_safe") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(safe)) => spec = spec.concurrency_safe(*safe),
        Some(_) => return Err(bad("`concurrency_safe` must be true or false")),
    }
    if let Some(ms) = positive(fields, "timeout_ms").map_err(|e| bad(&e))? {
        if ms > MAX_TIMEOUT_MS {
            return Err(bad(&format!("`timeout_ms` is at most {MAX_TIMEOUT_MS}")));
        }
        spec = spec.timeout(Duration::from_millis(ms));
    }
    if let Some(cap) = positive(fields, "output_cap").map_err(|e| bad(&e))? {
        spec = spec.output_cap(usize::try_from(cap).unwrap_or(usize::MAX));
    }
    let defer = match fields.get("defer") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(
            Defer::parse(d)
                .ok_or_else(|| bad("`defer` must be \"never\", \"auto\" or \"always\""))?,
        ),
        Some(_) => return Err(bad("`defer` must be \"never\", \"auto\" or \"always\"")),
    };
    let defer_loading = match fields.get("defer_loading") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(true)) => Some(Defer::Always),
        Some(Value::Bool(false)) => Some(Defer::Never),
        Some(_) => return Err(bad("`defer_loading` must be true or false")),
    };
    match (defer, defer_loading) {
        (Some(a), Some(b)) if a != b => {
            return Err(bad(
                "`defer` and `defer_loading` disagree (give one: defer_loading true is defer \"always\")",
            ));
        }
        (Some(d), _) | (None, Some(d)) => spec = spec.defer(d),
        (None, None) => {}
    }
    let effect = match fields.get("effect") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_str()
                .and_then(Effect::parse)
                .ok_or_else(|| bad(&format!("{EFFECT_VALUES} (default side_effect), not {v}")))?,
        ),
    };
    let hinted = match fields.get("annotations") {
        None | Some(Value::Null) => None,
        Some(annotations) => {
            hinted_effect(annotations).map_err(|e| bad(&format!("`annotations`: {e}")))?
        }
    };
    if let Some(effect) = effect.or(hinted) {
        spec = spec.effect(effect);
    }
    match fields.get("access") {
        None | Some(Value::Null) => {}
        Some(access) => {
            let declared = Declared::parse(access).map_err(|e| bad(&format!("`access`: {e}")))?;
            spec = spec.access(move |args, ws| declared.eval(args, ws));
        }
    }
    Ok(spec)
}

/// The effect an MCP-style `annotations` object implies: `readOnlyHint: true` is
/// [`Effect::ReadOnly`], else `idempotentHint: true` is [`Effect::Idempotent`]; `None` when
/// neither hint is true (the default, [`Effect::SideEffect`], as MCP reads missing hints).
fn hinted_effect(annotations: &Value) -> Result<Option<Effect>, String> {
    let Value::Object(hints) = annotations else {
        return Err("must be an object such as {\"readOnlyHint\": true}".into());
    };
    let mut read_only = false;
    let mut idempotent = false;
    for (key, value) in hints {
        if !ANNOTATION_KEYS.contains(&key.as_str()) {
            return Err(format!(
                "unknown key `{key}` (MCP's {})",
                ANNOTATION_KEYS.join(", ")
            ));
        }
        match (key.as_str(), value) {
            (_, Value::Null) | ("title", Value::String(_)) => {}
            ("title", _) => return Err("`title` must be a string".into()),
            (hint, Value::Bool(b)) => match hint {
                "readOnlyHint" => read_only = *b,
                "idempotentHint" => idempotent = *b,
                _ => {}
            },
            (hint, _) => return Err(format!("`{hint}` must be true or false")),
        }
    }
    Ok(if read_only {
        Some(Effect::ReadOnly)
    } else if idempotent {
        Some(Effect::Idempotent)
    } else {
        None
    })
}

/// A positive integer field, if present.
fn positive(fields: &Map<String, Value>, key: &str) -> Result<Option<u64>, String> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!("`{key}` must be a positive integer")),
        },
    }
}

/// Where a declared resource comes from.
#[derive(Debug, Clone)]
enum Source {
    /// The argument at this JSON Pointer is a workspace path (or an array of them).
    Path(String),
    /// The argument at this JSON Pointer, after `prefix`, names a resource.
    Named { pointer: String, prefix: String },
    /// Always this named resource.
    Fixed(Arc<str>),
}

/// A client tool's `access`: what its calls read and write.
#[derive(Debug, Clone, Default)]
struct Declared {
    entries: Vec<(Source, Mode)>,
}

impl Declared {
    fn parse(v: &Value) -> Result<Declared, String> {
        let Value::Object(fields) = v else {
            return Err("must be an object {\"read\": [...], \"write\": [...]}".into());
        };
        let mut entries = Vec::new();
        for (key, value) in fields {
            let mode = match key.as_str() {
                "read" => Mode::Read,
                "write" => Mode::Write,
                other => return Err(format!("unknown key `{other}` (read, write)")),
            };
            let Value::Array(list) = value else {
                return Err(format!("`{key}` must be an array"));
            };
            for entry in list {
                entries.push((source(entry)?, mode));
            }
        }
        Ok(Declared { entries })
    }

    /// The access of one call. An argument that is not a string (or an array of strings), or a
    /// path outside the workspace, makes the call exclusive (the engine's rule for an `Err`).
    fn eval(&self, args: &Value, ws: Option<&Workspace>) -> Result<Access, ToolError> {
        let mut access = Access::none();
        for (source, mode) in &self.entries {
            match source {
                Source::Fixed(name) => {
                    access = access.and(Resource::named(Arc::clone(name)), *mode)
                }
                Source::Path(pointer) => {
                    for path in strings(args, pointer)? {
                        let ws = ws.ok_or_else(|| {
                            ToolError::execution("a path resource needs a workspace")
                        })?;
                        access = access.and(Resource::path(ws, path)?, *mode);
                    }
                }
                Source::Named { pointer, prefix } => {
                    for name in strings(args, pointer)? {
                        access = access.and(Resource::named(format!("{prefix}{name}")), *mode);
                    }
                }
            }
        }
        Ok(access)
    }
}

fn pointer(p: &str) -> String {
    if p.starts_with('/') || p.is_empty() {
        p.to_string()
    } else {
        format!("/{p}")
    }
}

fn source(entry: &Value) -> Result<Source, String> {
    match entry {
        Value::String(p) => Ok(Source::Path(pointer(p))),
        Value::Object(o) => match (o.get("name"), o.get("arg")) {
            (Some(Value::String(name)), None) if o.len() == 1 => {
                Ok(Source::Fixed(Arc::from(name.as_str())))
            }
            (None, Some(Value::String(arg))) => {
                let prefix = match o.get("prefix") {
                    None => String::new(),
                    Some(Value::String(p)) => p.clone(),
                    Some(_) => return Err("`prefix` must be a string".into()),
                };
                if o.keys().any(|k| k != "arg" && k != "prefix") {
                    return Err("an {\"arg\"} entry takes only `arg` and `prefix`".into());
                }
                Ok(Source::Named {
                    pointer: pointer(arg),
                    prefix,
                })
            }
            _ => Err(
                "an entry is a JSON Pointer string (a path argument), {\"name\": NAME} or {\"arg\": POINTER, \"prefix\": TEXT}"
                    .into(),
            ),
        },
        _ => Err("an entry must be a string or an object".into()),
    }
}

/// The strings at `pointer` in `args`: none if absent, one, or each of an array.
fn strings<'a>(args: &'a Value, pointer: &str) -> Result<Vec<&'a str>, ToolError> {
    let not_strings = || ToolError::invalid(format!("the argument at {pointer} is not a string"));
    match args.pointer(pointer) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.as_str()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_str().ok_or_else(not_strings))
            .collect(),
        Some(_) => Err(not_strings()),
    }
}

/// How a call ended without the client's answer, or that it was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    Answered,
    TimedOut,
    Cancelled,
}

/// A call handed to the client, not answered yet.
#[derive(Debug)]
struct Pending {
    answer: oneshot::Sender<ToolOutcome>,
    commit: CommitGate,
    cancel: CancellationToken,
    deadline: Instant,
    progress: Progress,
}

/// What a client reports of a call it runs: output text, or a progress value.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// Text the call printed, on `stream`.
    Output(OutputStream, String),
    /// `progress` so far, of `total`, with `message`.
    Value(f64, Option<f64>, Option<String>),
}

/// The stream of the turn running now: where `event: call`s go, and its end.
#[derive(Debug)]
struct Link {
    generation: u64,
    events: mpsc::UnboundedSender<Value>,
    gone: CancellationToken,
}

#[derive(Debug, Default)]
struct State {
    link: Option<Link>,
    pending: HashMap<Arc<str>, Pending>,
    closed: HashMap<Arc<str>, Closed>,
    closed_order: VecDeque<Arc<str>>,
}

impl State {
    fn close(&mut self, id: Arc<str>, how: Closed) {
        if self.closed.insert(Arc::clone(&id), how).is_none() {
            self.closed_order.push_back(id);
        }
        while self.closed_order.len() > CLOSED_REMEMBERED {
            if let Some(old) = self.closed_order.pop_front() {
                self.closed.remove(&old);
            }
        }
    }
}

/// One session's side of its client tools: the calls handed out and the stream they go to.
/// (Turns of a session run one at a time, so one stream at a time carries its calls.)
#[derive(Debug, Default)]
pub struct Delegate {
    state: Mutex<State>,
    next_call: AtomicU64,
    next_link: AtomicU64,
}

/// Why an answer was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The client answered this call already.
    AlreadyAnswered,
    /// The engine answered it itself; the text says how.
    Closed(&'static str),
    /// No such call in this session.
    Unknown,
}

impl Delegate {
    /// Routes the calls of the turn starting now to a stream: returns its events and a guard that,
    /// when dropped (the stream ended or its client went away), answers every call still waiting
    /// `cancelled`.
    pub fn attach(self: &Arc<Self>) -> (mpsc::UnboundedReceiver<Value>, Attached) {
        let (tx, rx) = mpsc::unbounded_channel();
        let generation = self.next_link.fetch_add(1, Ordering::Relaxed);
        let gone = CancellationToken::new();
        lock(&self.state).link = Some(Link {
            generation,
            events: tx,
            gone: gone.clone(),
        });
        let attached = Attached {
            delegate: Arc::clone(self),
            generation,
            gone,
        };
        (rx, attached)
    }

    /// The handler of every client tool of the session.
    async fn call(self: Arc<Self>, name: Arc<str>, input: Value, ctx: ToolContext) -> ToolOutcome {
        let (id, answer, gone) = {
            let mut state = lock(&self.state);
            let Some(link) = &state.link else {
                return Err(ToolError::new(
                    ErrorCode::Cancelled,
                    "no stream is open to hand the call to the client (client tools need a streamed dispatch)",
                ));
            };
            let id: Arc<str> = Arc::from(format!(
                "c{}",
                self.next_call.fetch_add(1, Ordering::Relaxed) + 1
            ));
            let left = ctx.deadline.saturating_duration_since(Instant::now());
            let event = json!({
                "call_id": &*id,
                "tool_use_id": &*ctx.call_id,
                "name": &*name,
                "input": input,
                "deadline_ms": u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                "idempotency_key": ctx.idempotency_key(),
            });
            if link.events.send(event).is_err() {
                return Err(ToolError::new(
                    ErrorCode::Cancelled,
                    "the client's stream closed before the call could be handed over",
                ));
            }
            let gone = link.gone.clone();
            let (tx, rx) = oneshot::channel();
            state.pending.insert(
                Arc::clone(&id),
                Pending {
                    answer: tx,
                    commit: ctx.commit.clone(),
                    cancel: ctx.cancel.clone(),
                    deadline: ctx.deadline,
                    progress: ctx.progress.clone(),
                },
            );
            (id, rx, gone)
        };
        // Given up (dropped by the deadline, or left by cancellation): the call is closed here,
        // so a late answer is refused rather than lost.
        let _closing = Closing {
            delegate: &self,
            id,
            deadline: ctx.deadline,
        };
        tokio::select! {
            biased;
            answered = answer => {
                if let Ok(outcome) = answered {
                    return outcome;
                }
                // Refused as too late (or after a cancel): the engine is giving the call up.
            }
            () = gone.cancelled() => return Err(ToolError::new(
                ErrorCode::Cancelled,
                "the client's stream closed before it answered",
            )),
            () = ctx.cancel.cancelled() => {}
        }
        // The engine stops a call it gives up (deadline passed, turn cancelled) and words the
        // result itself (`timed out after …`, `cancelled while running`): an empty detail is
        // never reported as partial output.
        ctx.cancel.cancelled().await;
        Err(ToolError::new(ErrorCode::Cancelled, ""))
    }

    /// The client's progress report of call `id`, while it waits for its answer: to the call's
    /// live progress (nothing when the turn has no listener).
    pub fn progress(&self, id: &str, report: Report) -> Result<(), Refused> {
        let state = lock(&self.state);
        let Some(pending) = state.pending.get(id) else {
            return Err(self.refusal(&state, id));
        };
        if pending.cancel.is_cancelled() {
            return Err(Refused::Closed(CANCELLED));
        }
        let progress = pending.progress.clone();
        drop(state);
        match report {
            Report::Output(stream, text) => progress.output(stream, text.as_bytes()),
            Report::Value(value, total, message) => {
                progress.report(value, total, message.as_deref());
            }
        }
        Ok(())
    }

    /// Why a call that is not pending takes no answer or report.
    fn refusal(&self, state: &State, id: &str) -> Refused {
        match state.closed.get(id) {
            Some(Closed::Answered) => Refused::AlreadyAnswered,
            Some(Closed::TimedOut) => Refused::Closed(TIMED_OUT),
            Some(Closed::Cancelled) => Refused::Closed(CANCELLED),
            None => Refused::Unknown,
        }
    }

    /// The client's answer to call `id`.
    pub fn answer(&self, id: &str, outcome: ToolOutcome) -> Result<(), Refused> {
        let mut state = lock(&self.state);
        let Some((id, pending)) = state.pending.remove_entry(id) else {
            return Err(self.refusal(&state, id));
        };
        // Taking the commit gate decides the race with the engine's deadline for good.
        let (how, refusal) = if pending.cancel.is_cancelled() {
            (Closed::Cancelled, Some(CANCELLED))
        } else if Instant::now() >= pending.deadline || !pending.commit.begin() {
            (Closed::TimedOut, Some(TIMED_OUT))
        } else {
            match pending.answer.send(outcome) {
                Ok(()) => (Closed::Answered, None),
                Err(_) => (Closed::Cancelled, Some(CANCELLED)),
            }
        };
        state.close(id, how);
        match refusal {
            None => Ok(()),
            Some(text) => Err(Refused::Closed(text)),
        }
    }
}

const TIMED_OUT: &str = "its deadline passed; the call was answered `timeout`";
const CANCELLED: &str = "it was cancelled (its turn was cancelled or its stream closed)";

/// Closes a call the engine gave up.
struct Closing<'a> {
    delegate: &'a Delegate,
    id: Arc<str>,
    deadline: Instant,
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        let mut state = lock(&self.delegate.state);
        if state.pending.remove(&self.id).is_some() {
            let how = if Instant::now() >= self.deadline {
                Closed::TimedOut
            } else {
                Closed::Cancelled
            };
            state.close(Arc::clone(&self.id), how);
        }
    }
}

/// A turn's stream, attached to the session's delegate until it drops.
#[derive(Debug)]
pub struct Attached {
    delegate: Arc<Delegate>,
    generation: u64,
    gone: CancellationToken,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.gone.cancel();
        let mut state = lock(&self.delegate.state);
        if state
            .link
            .as_ref()
            .is_some_and(|l| l.generation == self.generation)
        {
            state.link = None;
        }
    }
}

/// The body of `POST …/calls/{call_id}`: `{"content": string or blocks, "is_error": bool}`.
pub fn parse_answer(text: &str) -> Result<ToolOutcome, ApiError> {
    let shape = "the body must be {\"content\": string or content blocks, \"is_error\": bool}";
    let bad = |detail: String| ApiError::BadRequest(format!("{detail}: {shape}"));
    let doc: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
    let Value::Object(fields) = doc else {
        return Err(bad("not an object".into()));
    };
    if let Some(key) = fields.keys().find(|k| *k != "content" && *k != "is_error") {
        return Err(bad(format!("unknown key `{key}`")));
    }
    let is_error = match fields.get("is_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("`is_error` is not a bool".into())),
    };
    let output = match fields.get("content") {
        None | Some(Value::Null) => ToolOutput::text(""),
        Some(Value::String(text)) => ToolOutput::text(text.clone()),
        Some(Value::Array(blocks)) => ToolOutput::blocks(
            blocks
                .iter()
                .map(block)
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad)?,
        ),
        Some(_) => return Err(bad("`content` is neither a string nor an array".into())),
    };
    if is_error {
        return Ok(Err(ToolError::execution(output.into_text())));
    }
    Ok(Ok(output))
}

/// The body of `POST …/calls/{call_id}/progress`: `{"text": string, "stream": "stdout" or
/// "stderr"}` (output, stdout by default) or `{"progress": number, "total": number, "message":
/// string}` (a value; `total` and `message` optional).
pub fn parse_progress(text: &str) -> Result<Report, ApiError> {
    let shape = "the body must be {\"text\": string, \"stream\": \"stdout\" or \"stderr\"} or {\"progress\": number, \"total\": number, \"message\": string}";
    let bad = |detail: String| ApiError::BadRequest(format!("{detail}: {shape}"));
    let doc: Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON ({e})")))?;
    let Value::Object(fields) = doc else {
        return Err(bad("not an object".into()));
    };
    let known: &[&str] = if fields.contains_key("text") {
        &["text", "stream"]
    } else {
        &["progress", "total", "message"]
    };
    if let Some(key) = fields.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(bad(format!("unknown key `{key}`")));
    }
    if let Some(text) = fields.get("text") {
        let Value::String(text) = text else {
            return Err(bad("`text` is not a string".into()));
        };
        let stream = match fields.get("stream").and_then(Value::as_str) {
            None if fields.get("stream").is_none_or(Value::is_null) => OutputStream::Stdout,
            Some("stdout") => OutputStream::Stdout,
            Some("stderr") => OutputStream::Stderr,
            _ => return Err(bad("`stream` is neither \"stdout\" nor \"stderr\"".into())),
        };
        return Ok(Report::Output(stream, text.clone()));
    }
    let number = |key: &str| -> Result<Option<f64>, ApiError> {
        match fields.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|n| n.is_finite())
                .map(Some)
                .ok_or_else(|| bad(format!("`{key}` is not a number"))),
        }
    };
    let progress = number("progress")?.ok_or_else(|| bad("no `text` and no `progress`".into()))?;
    let total = number("total")?;
    let message = match fields.get("message") {
        None | Some(Value::Null) => None,
        Some(Value::String(m)) => Some(m.clone()),
        Some(_) => return Err(bad("`message` is not a string".into())),
    };
    Ok(Report::Value(progress, total, message))
}

/// One content block: `{"type":"text","text"}` or a base64 image.
fn block(v: &Value) -> Result<Block, String> {
    match v.get("type").and_then(Value::as_str) {
        Some("text") => v
            .get("text")
            .and_then(Value::as_str)
            .map(Block::text)
            .ok_or_else(|| "a text block needs a string `text`".into()),
        Some("image") => {
            let source = v.get("source");
            let field = |k: &str| source.and_then(|s| s.get(k)).and_then(Value::as_str);
            match (field("type"), field("media_type"), field("data")) {
                (Some("base64"), Some(media_type), Some(data)) => {
                    Ok(Block::image(media_type, data))
                }
                _ => Err(
                    "an image block needs source {\"type\": \"base64\", \"media_type\", \"data\"}"
                        .into(),
                ),
            }
        }
        _ => Err(format!("unsupported content block {v}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delegate() -> Arc<Delegate> {
        Arc::new(Delegate::default())
    }

    #[test]
    fn both_shapes_parse_and_extras_apply() {
        let tools = json!([
            {"name": "lookup", "description": "d", "input_schema": {"type": "object"},
             "concurrency_safe": true, "timeout_ms": 1500, "output_cap": 10},
            {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}},
        ]);
        let specs = parse(&tools, Limits::default(), &delegate()).unwrap();
        assert_eq!(specs[0].name, "lookup");
        assert!(specs[0].policy.concurrency_safe);
        assert_eq!(specs[0].policy.timeout, Duration::from_millis(1500));
        assert_eq!(specs[0].policy.output_cap, 10);
        assert_eq!(specs[1].name, "search");
        assert!(!specs[1].policy.concurrency_safe);
    }

    #[test]
    fn effect_is_declared_or_hinted_and_defaults_to_side_effect() {
        let schema = json!({"type": "object"});
        let tools = json!([
            {"name": "plain", "input_schema": schema},
            {"name": "look", "input_schema": schema, "effect": "read_only"},
            {"name": "put", "input_schema": schema, "effect": "idempotent"},
            {"name": "pay", "input_schema": schema, "effect": "side_effect"},
            {"name": "nul", "input_schema": schema, "effect": null},
            {"type": "function", "effect": "read_only",
             "function": {"name": "oa", "parameters": schema}},
            {"name": "mcp_ro", "input_schema": schema,
             "annotations": {"title": "Reads", "readOnlyHint": true, "openWorldHint": false}},
            {"name": "mcp_idem", "input_schema": schema,
             "annotations": {"readOnlyHint": false, "idempotentHint": true,
                             "destructiveHint": true}},
            // readOnlyHint wins over idempotentHint (MCP: idempotent only matters for writers).
            {"name": "mcp_both", "input_schema": schema,
             "annotations": {"readOnlyHint": true, "idempotentHint": true}},
            {"name": "mcp_none", "input_schema": schema,
             "annotations": {"readOnlyHint": false, "idempotentHint": null}},
            {"name": "mcp_empty", "input_schema": schema, "annotations": {}},
            // An explicit effect wins over the hints, both ways.
            {"name": "wins_down", "input_schema": schema, "effect": "side_effect",
             "annotations": {"readOnlyHint": true}},
            {"name": "wins_up", "input_schema": schema, "effect": "read_only",
             "annotations": {"idempotentHint": true}},
        ]);
        let specs = parse(&tools, Limits::default(), &delegate()).unwrap();
        let effects: Vec<(&str, Effect)> =
            specs.iter().map(|s| (s.name.as_str(), s.effect)).collect();
        assert_eq!(
            effects,
            [
                ("plain", Effect::SideEffect),
                ("look", Effect::ReadOnly),
                ("put", Effect::Idempotent),
                ("pay", Effect::SideEffect),
                ("nul", Effect::SideEffect),
                ("oa", Effect::ReadOnly),
                ("mcp_ro", Effect::ReadOnly),
                ("mcp_idem", Effect::Idempotent),
                ("mcp_both", Effect::ReadOnly),
                ("mcp_none", Effect::SideEffect),
                ("mcp_empty", Effect::SideEffect),
                ("wins_down", Effect::SideEffect),
                ("wins_up", Effect::ReadOnly),
            ]
        );
        // The effect class changes nothing else about the tool.
        assert!(specs.iter().all(|s| !s.policy.concurrency_safe));
    }

    #[test]
    fn a_bad_effect_is_refused_naming_the_tool_and_the_values() {
        let d = delegate();
        for bad in [
            json!("readonly"),
            json!("READ_ONLY"),
            json!(""),
            json!(true),
            json!(1),
            json!(["read_only"]),
        ] {
            let tools = json!([{"name": "lookup", "input_schema": {}, "effect": bad}]);
            let Err(ApiError::BadRequest(m)) = parse(&tools, Limits::default(), &d) else {
                panic!("effect {bad} was accepted");
            };
            assert!(
                m.starts_with("client tool `lookup`: `effect` must be"),
                "{m}"
            );
            for value in ["\"read_only\"", "\"idempotent\"", "\"side_effect\""] {
                assert!(m.contains(value), "{m} should list {value}");
            }
            assert!(m.ends_with(&format!("not {bad}")), "{m} should echo {bad}");
        }
        for (annotations, says) in [
            (json!(true), "must be an object"),
            (
                json!({"readOnlyHint": "yes"}),
                "`readOnlyHint` must be true or false",
            ),
            (
                json!({"idempotentHint": 1}),
                "`idempotentHint` must be true or false",
            ),
            (
                json!({"destructiveHint": "no"}),
                "`destructiveHint` must be true or false",
            ),
            (json!({"title": 3}), "`title` must be a string"),
            (json!({"readonlyHint": true}), "unknown key `readonlyHint`"),
        ] {
            let tools = json!([{"name": "hinted", "input_schema": {}, "annotations": annotations}]);
            let Err(ApiError::BadRequest(m)) = parse(&tools, Limits::default(), &d) else {
                panic!("annotations {annotations} were accepted");
            };
            assert!(
                m.starts_with("client tool `hinted`: `annotations`: "),
                "{m}"
            );
            assert!(m.contains(says), "{m} should say {says}");
        }
        // A bad hint is refused even when an explicit effect would win.
        let tools = json!([{"name": "both", "input_schema": {}, "effect": "read_only",
                            "annotations": {"readOnlyHint": "true"}}]);
        assert!(parse(&tools, Limits::default(), &d).is_err());
    }

    #[test]
    fn refusals_name_the_tool() {
        let d = delegate();
        let cases = [
            (
                json!([{"name": "bad name", "input_schema": {}}]),
                "bad name",
            ),
            (
                json!([{"name": "mcp__x__y", "input_schema": {}}]),
                "mcp__x__y",
            ),
            (json!([{"name": "t", "input_schema": 3}]), "`t`"),
            (
                json!([{"name": "t", "input_schema": {}, "concurrency-safe": true}]),
                "concurrency-safe",
            ),
            (
                json!([{"name": "t", "input_schema": {}, "timeout_ms": 0}]),
                "timeout_ms",
            ),
            (
                json!([{"name": "t", "input_schema": {}, "access": {"read": "/p"}}]),
                "access",
            ),
            (
                json!([{"name": "t", "input_schema": {}, "access": {"rw": []}}]),
                "rw",
            ),
            (json!([{"input_schema": {}}]), "#0"),
        ];
        for (tools, named) in cases {
            let Err(ApiError::BadRequest(message)) = parse(&tools, Limits::default(), &d) else {
                panic!("{tools} was accepted");
            };
            assert!(message.contains(named), "{message} should name {named}");
        }
        let limits = Limits {
            max_tools: 1,
            max_schema_bytes: 20,
        };
        let two = json!([{"name": "a", "input_schema": {}}, {"name": "b", "input_schema": {}}]);
        assert!(parse(&two, limits, &d).is_err());
        let big = json!([{"name": "big", "input_schema": {"description": "x".repeat(40)}}]);
        let Err(ApiError::BadRequest(m)) = parse(&big, limits, &d) else {
            panic!("a big schema was accepted")
        };
        assert!(
            m.contains("`big`") && m.contains("--max-client-schema-bytes"),
            "{m}"
        );
    }

    #[test]
    fn declared_access_reads_the_arguments() {
        let declared = Declared::parse(&json!({
            "read": ["src", {"name": "db:all"}],
            "write": [{"arg": "/table", "prefix": "db:"}],
        }))
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path()).unwrap();
        let a = declared
            .eval(&json!({"src": "a.txt", "table": "users"}), Some(&ws))
            .unwrap();
        let writes_users = Access::write(Resource::named("db:users"));
        let reads_a = Access::read(Resource::path(&ws, "a.txt").unwrap());
        let writes_a = Access::write(Resource::path(&ws, "a.txt").unwrap());
        assert!(a.conflicts(&writes_users));
        assert!(a.conflicts(&writes_a));
        assert!(!a.conflicts(&reads_a));
        // Not a string: the engine makes the call exclusive.
        assert!(declared.eval(&json!({"src": 3}), Some(&ws)).is_err());
        // Outside the workspace: refused the same way.
        assert!(declared.eval(&json!({"src": "../x"}), Some(&ws)).is_err());
    }

    #[test]
    fn answers_parse_text_blocks_and_errors() {
        assert_eq!(parse_answer(r#"{"content": "hi"}"#).unwrap().unwrap(), "hi");
        let blocks = parse_answer(
            r#"{"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}"#,
        )
        .unwrap()
        .unwrap();
        assert!(blocks.as_str().contains('a') && blocks.as_str().contains('b'));
        let err = parse_answer(r#"{"content": "boom", "is_error": true}"#)
            .unwrap()
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::ExecutionError);
        assert!(err.detail.contains("boom"));
        for bad in [
            "[]",
            "{\"content\": 1}",
            "{\"extra\": 1}",
            "{\"is_error\": \"yes\"}",
        ] {
            assert!(parse_answer(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn exactly_one_answer_wins() {
        let d = delegate();
        let (mut events, attached) = d.attach();
        let ctx = ToolContext::new(
            "toolu_1",
            "lookup",
            Arc::new(crate::tool::SessionScope::new("s", None)),
            Instant::now() + Duration::from_secs(30),
            CancellationToken::new(),
        );
        let call = tokio::spawn(Arc::clone(&d).call(Arc::from("lookup"), json!({"q": 1}), ctx));
        let event = events.recv().await.unwrap();
        assert_eq!(event["tool_use_id"], "toolu_1");
        assert_eq!(event["input"], json!({"q": 1}));
        assert_eq!(
            event["idempotency_key"],
            crate::tool::idempotency_key("s", None, "toolu_1")
        );
        let id = event["call_id"].as_str().unwrap().to_string();
        assert_eq!(d.answer(&id, Ok(ToolOutput::text("one"))), Ok(()));
        assert_eq!(
            d.answer(&id, Ok(ToolOutput::text("two"))),
            Err(Refused::AlreadyAnswered)
        );
        assert_eq!(call.await.unwrap().unwrap(), "one");
        assert_eq!(
            d.answer("c999", Ok(ToolOutput::text("x"))),
            Err(Refused::Unknown)
        );
        drop(attached);
    }

    #[tokio::test]
    async fn a_stream_that_goes_away_cancels_its_calls_and_late_answers_are_refused() {
        let d = delegate();
        let (mut events, attached) = d.attach();
        let ctx = ToolContext::new(
            "toolu_1",
            "lookup",
            Arc::new(crate::tool::SessionScope::new("s", None)),
            Instant::now() + Duration::from_secs(30),
            CancellationToken::new(),
        );
        let call = tokio::spawn(Arc::clone(&d).call(Arc::from("lookup"), json!({}), ctx));
        let id = events.recv().await.unwrap()["call_id"]
            .as_str()
            .unwrap()
            .to_string();
        drop(attached);
        let err = call.await.unwrap().unwrap_err();
        assert_eq!(err.code, ErrorCode::Cancelled);
        assert_eq!(
            d.answer(&id, Ok(ToolOutput::text("late"))),
            Err(Refused::Closed(CANCELLED))
        );
    }
}
