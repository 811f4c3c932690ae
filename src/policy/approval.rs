//! Approvals: what answers a call that a rule sends to `ask`.
//!
//! The policy layer asks an [`Approver`] and waits — holding no worker and no concurrency place —
//! for its answer, the approval timeout (then the call is denied) or the turn's cancellation (then
//! it is answered `cancelled`). `chat` asks on the terminal ([`TerminalApprover`]), `serve` through
//! its SSE stream and approval route ([`Approvals`]), and the non-interactive commands refuse
//! ([`RefuseAll`]).

use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// One approval request.
#[derive(Debug, Clone, Serialize)]
pub struct ApprovalRequest {
    /// Unique within the process (`a1`, `a2`, …).
    pub approval_id: String,
    /// The session's id.
    pub session_id: String,
    /// The call's `tool_use_id`.
    pub tool_use_id: String,
    /// The tool.
    pub tool_name: String,
    /// The arguments the call would run with.
    pub tool_input: Value,
    /// Path or command, if the tool declares one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The rule that asked (`None`: the default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
}

/// `Ok(())`: run the call. `Err(reason)`: deny it, saying why.
pub type Approval = Result<(), String>;

/// Answers approval requests. Implemented for any `Fn(ApprovalRequest) -> BoxFuture<Approval>`.
pub trait Approver: Send + Sync {
    /// Decides one request (the policy layer bounds the wait and handles cancellation).
    fn approve(&self, request: ApprovalRequest) -> BoxFuture<'static, Approval>;
}

impl<F> Approver for F
where
    F: Fn(ApprovalRequest) -> BoxFuture<'static, Approval> + Send + Sync,
{
    fn approve(&self, request: ApprovalRequest) -> BoxFuture<'static, Approval> {
        self(request)
    }
}

/// The approver of non-interactive commands (`dispatch`, `run`, `demo`, `load`, `mcp-serve`):
/// every `ask` is denied, and the denial says so.
#[derive(Debug, Default, Clone, Copy)]
pub struct RefuseAll;

impl Approver for RefuseAll {
    fn approve(&self, _request: ApprovalRequest) -> BoxFuture<'static, Approval> {
        futures::future::ready(Err(
            "needs approval, and nobody can approve here (non-interactive: ask is treated as deny)"
                .to_string(),
        ))
        .boxed()
    }
}

/// `chat`'s approver: asks on the terminal (stderr), one question at a time, reading `y`/`n`
/// from stdin.
#[derive(Debug, Default)]
pub struct TerminalApprover {
    one_at_a_time: Arc<tokio::sync::Mutex<()>>,
}

impl Approver for TerminalApprover {
    fn approve(&self, request: ApprovalRequest) -> BoxFuture<'static, Approval> {
        let lock = Arc::clone(&self.one_at_a_time);
        async move {
            let _turn = lock.lock().await;
            let asked = tokio::task::spawn_blocking(move || {
                let what = request.subject.as_deref().unwrap_or("");
                let mut err = std::io::stderr().lock();
                let _ = write!(
                    err,
                    "\nallow {} {}? {}[y/N] ",
                    request.tool_name,
                    what,
                    request
                        .rule
                        .as_deref()
                        .map(|r| format!("(rule \"{r}\") "))
                        .unwrap_or_default()
                );
                let _ = err.flush();
                let mut line = String::new();
                std::io::stdin().lock().read_line(&mut line).map(|_| line)
            })
            .await;
            match asked {
                Ok(Ok(line)) if matches!(line.trim(), "y" | "Y" | "yes") => Ok(()),
                _ => Err("not approved at the terminal".to_string()),
            }
        }
        .boxed()
    }
}

/// Approvals answered from elsewhere (`serve`'s approval route, tests): each request is
/// published to its session's subscriber and waits for [`Approvals::answer`].
#[derive(Clone, Default)]
pub struct Approvals {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    next: AtomicU64,
    pending: Mutex<HashMap<String, (String, oneshot::Sender<bool>)>>,
    subscribers: Mutex<HashMap<String, mpsc::UnboundedSender<ApprovalRequest>>>,
}

impl fmt::Debug for Approvals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Approvals").finish_non_exhaustive()
    }
}

impl Approvals {
    /// A new, empty set.
    pub fn new() -> Self {
        Approvals::default()
    }

    /// Requests of session `session_id` from now on go to the returned receiver (replacing an
    /// earlier subscriber). A request made while a session has no subscriber is refused.
    pub fn subscribe(&self, session_id: &str) -> mpsc::UnboundedReceiver<ApprovalRequest> {
        let (tx, rx) = mpsc::unbounded_channel();
        if let Ok(mut subs) = self.inner.subscribers.lock() {
            subs.insert(session_id.to_string(), tx);
        }
        rx
    }

    /// Stops publishing the session's requests.
    pub fn unsubscribe(&self, session_id: &str) {
        if let Ok(mut subs) = self.inner.subscribers.lock() {
            subs.remove(session_id);
        }
    }

    /// Answers a pending request of `session_id`; false if there is none of that id (already
    /// answered, timed out, or another session's).
    pub fn answer(&self, session_id: &str, approval_id: &str, allow: bool) -> bool {
        let Ok(mut pending) = self.inner.pending.lock() else {
            return false;
        };
        match pending.get(approval_id) {
            Some((owner, _)) if owner == session_id => {}
            _ => return false,
        }
        pending
            .remove(approval_id)
            .is_some_and(|(_, tx)| tx.send(allow).is_ok())
    }

    /// Requests waiting for an answer now.
    pub fn pending(&self) -> usize {
        self.inner.pending.lock().map_or(0, |p| p.len())
    }
}

impl Approver for Approvals {
    fn approve(&self, mut request: ApprovalRequest) -> BoxFuture<'static, Approval> {
        let inner = Arc::clone(&self.inner);
        async move {
            let n = inner.next.fetch_add(1, Ordering::Relaxed) + 1;
            request.approval_id = format!("a{n}");
            let id = request.approval_id.clone();
            let (tx, rx) = oneshot::channel();
            let subscriber = inner
                .subscribers
                .lock()
                .ok()
                .and_then(|s| s.get(&request.session_id).cloned());
            let Some(subscriber) = subscriber else {
                return Err("needs approval, and no client is listening for approvals".into());
            };
            if let Ok(mut pending) = inner.pending.lock() {
                pending.insert(id.clone(), (request.session_id.clone(), tx));
            }
            // Removed however the wait ends (answer, timeout, cancellation drops this future).
            let _forget = Forget(Arc::clone(&inner), id);
            if subscriber.send(request).is_err() {
                return Err("needs approval, and no client is listening for approvals".into());
            }
            match rx.await {
                Ok(true) => Ok(()),
                Ok(false) => Err("approval refused".into()),
                Err(_) => Err("approval abandoned".into()),
            }
        }
        .boxed()
    }
}

struct Forget(Arc<Inner>, String);

impl Drop for Forget {
    fn drop(&mut self) {
        if let Ok(mut pending) = self.0.pending.lock() {
            pending.remove(&self.1);
        }
    }
}
