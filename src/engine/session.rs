//! A [`Session`]: one agent conversation's handle on the engine — its own cancellation and its
//! [`SessionScope`] (id and workspace) that every call of the session sees in its
//! [`crate::ToolContext`]. It has no actor of its own, which keeps an idle session to a few hundred
//! bytes: a turn is planned on the task that dispatches it, runs there when every handler is
//! inline, and otherwise goes to one of the engine's shared schedulers — the same one for the
//! session's whole life (picked round robin when it opens).
//!
//! Turns of one session are planned in the order they are dispatched; a turn that must wait runs
//! on its own task, so other turns (of this session or others on the same scheduler) do not wait
//! for it. Cancelling a session cancels only its own turns.
//!
//! Sessions are opened here too ([`Engine::session`], [`Engine::session_in`]): this file, a child
//! of `engine`, reads the engine's state, so `engine.rs` never imports the session back.

use std::sync::Arc;

use kameo::prelude::*;
use tokio_util::sync::CancellationToken;

use crate::collector::ResultSink;
use std::sync::atomic::Ordering;

use super::{Engine, EngineError};
use crate::protocol::{ToolCall, ToolDispatchResult};
use crate::scheduler::Scheduler;
use crate::tool::SessionScope;
use crate::workspace::Workspace;

/// One agent session's handle. Clones share the session.
#[derive(Debug, Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

#[derive(Debug)]
struct SessionInner {
    engine: Engine,
    scheduler: ActorRef<Scheduler>,
    scope: Arc<SessionScope>,
    cancel: CancellationToken,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        self.engine.session_closed();
    }
}

impl Session {
    pub(crate) fn new(
        engine: Engine,
        scheduler: ActorRef<Scheduler>,
        scope: Arc<SessionScope>,
        cancel: CancellationToken,
    ) -> Self {
        Session {
            inner: Arc::new(SessionInner {
                engine,
                scheduler,
                scope,
                cancel,
            }),
        }
    }

    /// Dispatches one turn of this session: one result per call, in call order. `Err` only for an
    /// engine fault ([`EngineError`]), when nothing of the turn ran.
    pub async fn dispatch(
        &self,
        calls: Vec<ToolCall>,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        self.dispatch_with_cancel(calls, self.inner.cancel.clone())
            .await
    }

    /// Like [`Session::dispatch`], cancellable on its own. Make `cancel` with
    /// [`Session::turn_token`] so that cancelling the session (or the engine) cancels it too.
    pub async fn dispatch_with_cancel(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        self.inner
            .engine
            .dispatch_on(
                &self.inner.scheduler,
                &self.inner.scope,
                calls,
                cancel,
                None,
            )
            .await
    }

    /// Like [`Session::dispatch_with_cancel`], also sending each result to `sink` with its index
    /// in the turn as soon as it is answered (refused calls first, then each call as it
    /// finishes, also within a concurrent stage). The returned answer is the same ordered one.
    pub async fn dispatch_streaming(
        &self,
        calls: Vec<ToolCall>,
        cancel: CancellationToken,
        sink: ResultSink,
    ) -> Result<Vec<ToolDispatchResult>, EngineError> {
        self.inner
            .engine
            .dispatch_on(
                &self.inner.scheduler,
                &self.inner.scope,
                calls,
                cancel,
                Some(sink),
            )
            .await
    }

    /// A cancellation token for one turn of this session (a child of the session's).
    pub fn turn_token(&self) -> CancellationToken {
        self.inner.cancel.child_token()
    }

    /// Cancels the session: calls running now are answered `cancelled` (their processes are
    /// stopped), calls not started are answered `cancelled` without running, and so is every later
    /// turn of this session.
    pub fn cancel(&self) {
        self.inner.cancel.cancel();
    }

    /// True once [`Session::cancel`] (or engine shutdown) happened.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancel.is_cancelled()
    }

    /// The session id (unique within its engine: `s1`, `s2`, …).
    pub fn id(&self) -> &str {
        self.inner.scope.id()
    }

    /// The workspace the session's built-in tools are confined to, if any.
    pub fn workspace(&self) -> Option<&Workspace> {
        self.inner.scope.workspace()
    }

    /// The engine this session belongs to.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }
}

impl Engine {
    /// A new session in the engine's workspace ([`EngineBuilder::workspace`](super::EngineBuilder::workspace)): its own
    /// cancellation, and one of the engine's shared schedulers for all its turns (no actor of
    /// its own).
    pub fn session(&self) -> Session {
        self.open_session(self.inner.workspace.clone())
    }

    /// A new session whose built-in tools are confined to `workspace`: one engine serves
    /// sessions in different directories.
    pub fn session_in(&self, workspace: Workspace) -> Session {
        self.open_session(Some(workspace))
    }

    fn open_session(&self, workspace: Option<Workspace>) -> Session {
        let n = self.inner.sessions_opened.fetch_add(1, Ordering::Relaxed) + 1;
        let scope = Arc::new(
            SessionScope::new(format!("s{n}"), workspace)
                .with_sandbox(Arc::clone(&self.inner.sandbox)),
        );
        // The session's turns all go through one of the engine's schedulers (the same one for the
        // session's whole life, so they are planned in the order they are dispatched); no actor
        // per session.
        let i = (n as usize) % self.inner.schedulers.len();
        let scheduler = self.inner.schedulers[i].clone();
        self.inner.metrics.sessions(1.0);
        Session::new(
            self.clone(),
            scheduler,
            scope,
            self.inner.root.child_token(),
        )
    }

    /// A session closed (called once per session, when its last handle is dropped).
    pub(crate) fn session_closed(&self) {
        self.inner.metrics.sessions(-1.0);
    }
}
