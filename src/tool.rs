//! `ToolSpec`: the single source of a tool — name, description, input schema, handler and policy.
//!
//! The model catalog and the executor both come from a `ToolSpec`; nothing keeps a second list. A
//! handler is one of three kinds, and the kind decides where it runs:
//!
//! * [`Handler::Inline`] — synchronous and cheap (microseconds). Runs where the call lands (in the
//!   scheduler or worker), with no task spawned. It cannot be interrupted, so its timeout is not
//!   enforced: use it only for work that never blocks.
//! * [`Handler::Async`] — a future. Runs on its stage's task (the stage's async calls are polled
//!   together), under its deadline and cancellation.
//! * [`Handler::Blocking`] — synchronous work that may block (file I/O). Runs on tokio's blocking
//!   pool so it never stalls the async runtime. On timeout the call is answered at once; the thread
//!   finishes in the background and its result is dropped.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use futures::TryFutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use crate::file_state::{FileStamps, Stamp};
use crate::sandbox::Sandbox;
use crate::workspace::Workspace;

pub use crate::protocol::{Block, Image, ToolError, ToolOutput, ToolReference, cap_output};

/// What a handler returns: the content the model reads — text, or text and images
/// ([`ToolOutput::blocks`]) — or a typed error (always text). The [`Handler`] constructors also
/// take closures answering `Ok(String)`.
pub type ToolOutcome = Result<ToolOutput, ToolError>;

mod access;
mod idempotency;
mod progress;
mod subject;
pub use access::{Access, AccessFn, AccessFnSig, Mode, Resource, access_of};
pub use idempotency::idempotency_key;
pub use progress::{OutputStream, Progress, ProgressEvent, ProgressSink, ProgressUpdate};
pub use subject::{Subject, SubjectFn, SubjectOf};

/// What a handler knows about the call it serves: which call, of which tool, in which session
/// (and so in which workspace), by when, and whether it should stop.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The call's `tool_use_id`.
    pub call_id: Arc<str>,
    /// The registry name of the tool being called.
    pub tool_name: Arc<str>,
    /// The session the call belongs to: its id and its workspace.
    pub session: Arc<SessionScope>,
    /// When the call must be answered by (its policy timeout from the moment it started).
    pub deadline: Instant,
    /// Cancelled when the turn, the session or the engine is cancelled. Long-running handlers should
    /// watch it (`select!`) and stop promptly; the engine answers the call `cancelled` either way.
    pub cancel: CancellationToken,
    /// The call's point of no return (see [`ToolContext::begin_commit`]).
    pub commit: CommitGate,
    /// The turn the client named the call's turn, if it named one ([`crate::ToolCall::turn`]):
    /// part of the call's identity and of its idempotency key.
    pub turn_id: Option<Arc<str>>,
    /// Where the call reports live progress (a command's output as it comes, a progress value):
    /// inert unless the turn was dispatched with a listener ([`Progress`]). Never changes the
    /// call's result.
    pub progress: Progress,
}

impl ToolContext {
    /// A context for call `call_id` of `tool_name` in `session`.
    pub fn new(
        call_id: impl Into<Arc<str>>,
        tool_name: impl Into<Arc<str>>,
        session: Arc<SessionScope>,
        deadline: Instant,
        cancel: CancellationToken,
    ) -> Self {
        ToolContext {
            call_id: call_id.into(),
            tool_name: tool_name.into(),
            session,
            deadline,
            cancel,
            commit: CommitGate::default(),
            turn_id: None,
            progress: Progress::default(),
        }
    }

    /// Called by a handler right before the step that makes its effect visible (the rename of an
    /// atomic write). `true`: go ahead — the engine now waits for this call's own answer and
    /// reports it as it is, even if the deadline passes or the turn is cancelled meanwhile, so a
    /// committed effect is never answered `timeout` or `cancelled`. `false`: the call has already
    /// been given up (cancelled, or past its deadline); do not commit, answer `cancelled`.
    pub fn begin_commit(&self) -> bool {
        !self.cancel.is_cancelled() && self.commit.begin()
    }

    /// The id of the session the call belongs to.
    pub fn session_id(&self) -> &str {
        self.session.id()
    }

    /// The call's idempotency key ([`idempotency_key`]): the same for every copy of this call —
    /// a retried turn, a run after a restart of the engine — and another for a new
    /// `tool_use_id` or another session. Send it to the service behind the tool (an
    /// `Idempotency-Key` header) so that it can recognise a call it has already seen. Computed
    /// when asked, never stored (see `docs/idempotency.md`).
    ///
    /// Derived from the session id, the turn id when the client named the turn
    /// ([`ToolContext::turn_id`]) and the `tool_use_id`.
    ///
    /// ```
    /// use switchboard::{Handler, ToolSpec};
    /// let charge = ToolSpec::new("charge", "Charges a card.", serde_json::json!({"type": "object"}),
    ///     Handler::future(|args, ctx| async move {
    ///         let key = ctx.idempotency_key(); // "sb1-…": the payment API's Idempotency-Key
    ///         # let _ = args;
    ///         Ok(format!("charged with key {key}"))
    ///     }));
    /// # let _ = charge;
    /// ```
    pub fn idempotency_key(&self) -> String {
        idempotency_key(self.session.id(), self.turn_id.as_deref(), &self.call_id)
    }

    /// The session's workspace, or an `execution_error` saying that the session has none (the
    /// engine was built without [`crate::EngineBuilder::workspace`] and the session was not opened
    /// with [`crate::Engine::session_in`]).
    pub fn workspace(&self) -> Result<&Workspace, ToolError> {
        self.session.workspace().ok_or_else(|| {
            ToolError::execution(format!(
                "tool {} needs a workspace, and session {} has none",
                self.tool_name,
                self.session.id()
            ))
        })
    }
}

/// What every call of one session shares: the session's id, the workspace its built-in tools
/// are confined to, and the engine's OS sandbox (how process-running tools start their
/// processes; see [`crate::sandbox`]). Made once per session (and once for the engine's
/// session-less dispatch); handed to each call's [`ToolContext`] as an `Arc`, so a call costs one
/// reference count.
#[derive(Debug)]
pub struct SessionScope {
    id: Arc<str>,
    workspace: Option<Workspace>,
    files: FileStamps,
    sandbox: Option<Arc<Sandbox>>,
    revealed: std::sync::Mutex<Option<Box<Revealed>>>,
}

/// The deferred tools a session has seen: found by `tool_search` or called by name. The set
/// only grows; its order is the order they were first revealed (an OpenAI catalog appends them
/// in this order, so a prompt cache survives).
#[derive(Debug, Default)]
struct Revealed {
    order: Vec<Arc<str>>,
    seen: std::collections::HashSet<Arc<str>>,
    /// Found by a search and not called since (a later call is a search hit).
    found: std::collections::HashSet<Arc<str>>,
}

impl Revealed {
    /// Adds `name` if new; true if it was.
    fn add(&mut self, name: &Arc<str>) -> bool {
        let new = self.seen.insert(Arc::clone(name));
        if new {
            self.order.push(Arc::clone(name));
        }
        new
    }
}

/// What a call of a deferred tool tells about the session ([`SessionScope::note_deferred_call`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeferredCall {
    /// The tool had not been revealed to the session (called by name, unsearched).
    pub unrevealed: bool,
    /// The first call of the tool since a search returned it.
    pub search_hit: bool,
}

impl SessionScope {
    /// A scope named `id`, confined to `workspace` (if any).
    pub fn new(id: impl Into<Arc<str>>, workspace: Option<Workspace>) -> Self {
        SessionScope {
            id: id.into(),
            workspace,
            files: FileStamps::default(),
            sandbox: None,
            revealed: std::sync::Mutex::new(None),
        }
    }

    fn with_revealed<T>(&self, f: impl FnOnce(&mut Revealed) -> T) -> T {
        let mut guard = self
            .revealed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(guard.get_or_insert_with(Box::default))
    }

    /// Records the deferred tools a search returned: they join the revealed set (in this order,
    /// after those already in it).
    pub fn reveal_found(&self, names: &[Arc<str>]) {
        self.with_revealed(|r| {
            for name in names {
                r.add(name);
                r.found.insert(Arc::clone(name));
            }
        });
    }

    /// Adds `names` to the revealed set (in this order, after those already in it), as shown
    /// earlier (not as search results).
    pub fn reveal(&self, names: &[Arc<str>]) {
        self.with_revealed(|r| {
            for name in names {
                r.add(name);
            }
        });
    }

    /// Records a call of the deferred tool `name`: it joins the revealed set if it was not in
    /// it (a model may call a deferred tool by its exact name without searching).
    pub fn note_deferred_call(&self, name: &Arc<str>) -> DeferredCall {
        self.with_revealed(|r| {
            let unrevealed = r.add(name);
            DeferredCall {
                unrevealed,
                search_hit: r.found.remove(name),
            }
        })
    }

    /// The deferred tools revealed to the session, in the order they were first revealed.
    pub fn revealed(&self) -> Vec<Arc<str>> {
        match &*self
            .revealed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            None => Vec::new(),
            Some(r) => r.order.clone(),
        }
    }

    /// The same scope with the engine's `sandbox` (the engine sets it on every scope it makes).
    pub fn with_sandbox(mut self, sandbox: Arc<Sandbox>) -> Self {
        self.sandbox = Some(sandbox);
        self
    }

    /// The engine's sandbox; `None` for a scope made outside an engine (its commands then run
    /// unconfined).
    pub fn sandbox(&self) -> Option<&Sandbox> {
        self.sandbox.as_deref()
    }

    /// The session id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The session's id, shared.
    pub(crate) fn shared_id(&self) -> &Arc<str> {
        &self.id
    }

    /// The workspace, if the session has one.
    pub fn workspace(&self) -> Option<&Workspace> {
        self.workspace.as_ref()
    }

    /// What the session saw of the files it read or wrote (for the modified-since-read check).
    pub fn files(&self) -> &FileStamps {
        &self.files
    }
}

/// The race between a handler committing its effect and the engine giving the call up, decided
/// once: whichever comes first wins. Cheap to clone; the default (unguarded) gate always lets a
/// handler commit (inline handlers, handlers called directly in tests).
#[derive(Debug, Clone, Default)]
pub struct CommitGate(Option<Arc<AtomicU8>>);

const GATE_OPEN: u8 = 0;
const GATE_COMMITTING: u8 = 1;
const GATE_CLOSED: u8 = 2;

impl CommitGate {
    /// A gate the engine can close (one per async or blocking call).
    pub(crate) fn guarded() -> Self {
        CommitGate(Some(Arc::new(AtomicU8::new(GATE_OPEN))))
    }

    /// The handler's side: true if it may commit (and from now on the engine waits for it).
    pub fn begin(&self) -> bool {
        match &self.0 {
            None => true,
            Some(state) => match state.compare_exchange(
                GATE_OPEN,
                GATE_COMMITTING,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => true,
                Err(now) => now == GATE_COMMITTING,
            },
        }
    }

    /// The engine's side: gives the call up. True if the handler had not begun committing (and
    /// now never will); false if it is committing, so its own answer must be awaited.
    pub(crate) fn close(&self) -> bool {
        match &self.0 {
            None => true,
            Some(state) => !matches!(
                state.compare_exchange(GATE_OPEN, GATE_CLOSED, Ordering::AcqRel, Ordering::Acquire),
                Err(GATE_COMMITTING)
            ),
        }
    }
}

/// Synchronous handler signature (inline and blocking kinds).
pub type SyncHandlerFn = dyn Fn(&Value, &ToolContext) -> ToolOutcome + Send + Sync;
/// Async handler signature: owns its arguments (moved out of the call, never cloned).
pub type AsyncHandlerFn =
    dyn Fn(Value, ToolContext) -> BoxFuture<'static, ToolOutcome> + Send + Sync;

/// How a tool runs. See the module docs for where each kind executes.
#[derive(Clone)]
pub enum Handler {
    /// Cheap synchronous work, run in place.
    Inline(Arc<SyncHandlerFn>),
    /// A future, run on its stage's task with a deadline and cancellation.
    Async(Arc<AsyncHandlerFn>),
    /// Blocking synchronous work, run on the blocking pool.
    Blocking(Arc<SyncHandlerFn>),
}

impl Handler {
    /// The kind's name, for logs: `inline`, `async` or `blocking`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Handler::Inline(_) => "inline",
            Handler::Async(_) => "async",
            Handler::Blocking(_) => "blocking",
        }
    }

    /// Wraps a cheap synchronous function. It may answer `Ok` with a `String` (text) or a
    /// [`ToolOutput`] (text and images); anything `Into<ToolOutput>`.
    pub fn inline<F, O>(f: F) -> Self
    where
        F: Fn(&Value, &ToolContext) -> Result<O, ToolError> + Send + Sync + 'static,
        O: Into<ToolOutput>,
    {
        Handler::Inline(Arc::new(move |args, ctx| f(args, ctx).map(Into::into)))
    }

    /// Wraps an async function (answering as [`Handler::inline`]'s does).
    pub fn future<F, Fut, O>(f: F) -> Self
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, ToolError>> + Send + 'static,
        O: Into<ToolOutput> + 'static,
    {
        Handler::Async(Arc::new(move |args, ctx| {
            Box::pin(f(args, ctx).map_ok(Into::into))
        }))
    }

    /// Wraps a synchronous function that may block (answering as [`Handler::inline`]'s does).
    pub fn blocking<F, O>(f: F) -> Self
    where
        F: Fn(&Value, &ToolContext) -> Result<O, ToolError> + Send + Sync + 'static,
        O: Into<ToolOutput>,
    {
        Handler::Blocking(Arc::new(move |args, ctx| f(args, ctx).map(Into::into)))
    }
}

impl fmt::Debug for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Handler::{}", self.kind_name())
    }
}

/// Execution policy of a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolPolicy {
    /// May run at the same time as neighbouring concurrency-safe calls of the same turn.
    pub concurrency_safe: bool,
    /// Deadline from the moment the handler starts (async and blocking handlers).
    pub timeout: Duration,
    /// Largest `content` handed back, in bytes; longer output keeps head and tail around a
    /// `… N bytes truncated …` marker.
    pub output_cap: usize,
    /// At most this many calls of this tool run at once (async and blocking handlers); `None`:
    /// only the engine's global cap applies. Calls beyond it wait in a bounded line, then are
    /// answered `overloaded`.
    pub max_concurrency: Option<usize>,
}

impl Default for ToolPolicy {
    /// Not concurrency-safe (the conservative choice), 120 s timeout, 50,000-byte output cap,
    /// no per-tool concurrency cap.
    fn default() -> Self {
        ToolPolicy {
            concurrency_safe: false,
            timeout: Duration::from_secs(120),
            output_cap: 50_000,
            max_concurrency: None,
        }
    }
}

/// One tool: the single source of its catalog entry and its execution.
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// `^[a-zA-Z0-9_-]{1,64}$`.
    pub name: String,
    /// What the model reads about the tool.
    pub description: String,
    /// A JSON Schema object schema for the arguments.
    pub input_schema: Value,
    /// The implementation.
    pub handler: Handler,
    /// Concurrency safety, timeout, output cap.
    pub policy: ToolPolicy,
    /// What a call touches (a path or a command), for permission rules' `TOOL(PATTERN)` form;
    /// `None`: only bare `TOOL` rules apply to it.
    pub subject: Option<SubjectOf>,
    /// What a call reads and writes ([`ToolSpec::access`]); `None`: the policy's
    /// `concurrency_safe` decides (safe → conflicts only with exclusive calls, else exclusive).
    pub access: Option<AccessFn>,
    /// Whether the catalog may leave the tool's definition out of the model's context until a
    /// search finds it ([`Defer`]; default [`Defer::Auto`]).
    pub defer: Defer,
    /// What running a call twice would do ([`Effect`]; default [`Effect::SideEffect`]): decides
    /// what the journal records before a call starts and what a retry after a crash gets.
    pub effect: Effect,
}

/// What running a call of a tool twice would do — how the engine may answer a retried call
/// whose first run was interrupted by a crash (see `docs/retries.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Effect {
    /// Changes nothing (`read_file`, `glob`, `tool_search`): run again freely. The journal
    /// records only its result.
    ReadOnly,
    /// Running it again leaves the same state as running it once (`write_file` of the same
    /// content): after a crash during its run, a retry runs it again.
    Idempotent,
    /// Anything else (`bash`, `edit_file`, a payment): after a crash during its run, a retry is
    /// answered `outcome_unknown` instead of a second run.
    #[default]
    SideEffect,
}

impl Effect {
    /// `read_only`, `idempotent` or `side_effect` (how configuration files and the sidecar
    /// spell it).
    pub fn parse(text: &str) -> Option<Effect> {
        match text {
            "read_only" => Some(Effect::ReadOnly),
            "idempotent" => Some(Effect::Idempotent),
            "side_effect" => Some(Effect::SideEffect),
            _ => None,
        }
    }

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::ReadOnly => "read_only",
            Effect::Idempotent => "idempotent",
            Effect::SideEffect => "side_effect",
        }
    }
}

/// Whether a tool's definition may be deferred: sent with `defer_loading: true` on the Anthropic
/// wire (the model loads it when `tool_search` finds it), left out of an OpenAI catalog until
/// then. A deferred tool is still called, validated and run like any other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Defer {
    /// Always in the model's context (the built-in tools).
    Never,
    /// Deferred when the session's catalog is large (more tools, or more estimated tokens, than
    /// the engine's deferral thresholds allow).
    #[default]
    Auto,
    /// Always deferred: found through `tool_search`.
    Always,
}

impl Defer {
    /// `never`, `auto` or `always` (how configuration files and the sidecar spell it).
    pub fn parse(text: &str) -> Option<Defer> {
        match text {
            "never" => Some(Defer::Never),
            "auto" => Some(Defer::Auto),
            "always" => Some(Defer::Always),
            _ => None,
        }
    }

    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Defer::Never => "never",
            Defer::Auto => "auto",
            Defer::Always => "always",
        }
    }
}

impl ToolSpec {
    /// A spec with the default policy (serial, 120 s, 50,000 bytes).
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        handler: Handler,
    ) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema,
            handler,
            policy: ToolPolicy::default(),
            subject: None,
            access: None,
            defer: Defer::Auto,
            effect: Effect::SideEffect,
        }
    }

    /// Declares what running a call twice would do ([`Effect`]).
    pub fn effect(mut self, effect: Effect) -> Self {
        self.effect = effect;
        self
    }

    /// Sets whether the tool's definition may be deferred ([`Defer`]).
    pub fn defer(mut self, defer: Defer) -> Self {
        self.defer = defer;
        self
    }

    /// Declares what a call touches, for permission rules (`TOOL(PATTERN)`): a path inside the
    /// workspace (matched as a gitignore-style glob after confinement) or a command.
    pub fn subject<F>(mut self, f: F) -> Self
    where
        F: Fn(&Value) -> Option<Subject> + Send + Sync + 'static,
    {
        self.subject = Some(SubjectOf(Arc::new(f)));
        self
    }

    /// The subject is the string argument `field`, as a path.
    pub fn path_subject(self, field: &'static str) -> Self {
        self.subject(move |args| {
            args.get(field)
                .and_then(Value::as_str)
                .map(|p| Subject::Path(p.to_string()))
        })
    }

    /// Marks the tool concurrency-safe (read-only, no shared effects).
    pub fn concurrency_safe(mut self, safe: bool) -> Self {
        self.policy.concurrency_safe = safe;
        self
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.policy.timeout = timeout;
        self
    }

    /// Sets the output cap in bytes.
    pub fn output_cap(mut self, bytes: usize) -> Self {
        self.policy.output_cap = bytes;
        self
    }

    /// Declares what a call reads and writes: `f` maps the call's validated arguments (and the
    /// session's workspace, if any) to an [`Access`]. Calls of a turn that do not conflict run at
    /// the same time; a call starts once every earlier call it conflicts with has finished. An
    /// `Err` or a panic makes the call [`Access::Exclusive`]. Overrides `concurrency_safe` for
    /// planning.
    ///
    /// ```
    /// use switchboard::{Access, Handler, Mode, Resource, ToolSpec};
    /// let spec = ToolSpec::new("add_user", "d", serde_json::json!({"type": "object"}),
    ///                          Handler::inline(|_, _| Ok("ok".to_string())))
    ///     .access(|_args, _ws| Ok(Access::write(Resource::named("db:users"))
    ///         .and(Resource::named("db:audit"), Mode::Write)));
    /// # let _ = spec;
    /// ```
    pub fn access<F>(mut self, f: F) -> Self
    where
        F: Fn(&Value, Option<&Workspace>) -> Result<Access, ToolError> + Send + Sync + 'static,
    {
        self.access = Some(AccessFn::new(f));
        self
    }

    /// Caps how many calls of this tool run at once.
    pub fn max_concurrency(mut self, n: usize) -> Self {
        self.policy.max_concurrency = Some(n.max(1));
        self
    }
}
