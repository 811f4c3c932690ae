//! One test per layer of the stack, plus the stack end to end.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};

use super::*;
use crate::plan::Planned;
use crate::registry::Snapshot;
use crate::tool::ToolSpec;

fn tool(spec: ToolSpec) -> Arc<RegisteredTool> {
    let name = spec.name.clone();
    let snapshot = Snapshot::from_specs([spec]).unwrap();
    Arc::clone(snapshot.get(&name).unwrap())
}

fn spec(name: &str, handler: Handler) -> ToolSpec {
    ToolSpec::new(name, "test", json!({"type": "object"}), handler)
}

fn planned(tool: &Arc<RegisteredTool>) -> Planned {
    Planned {
        index: 0,
        call: ToolCall::new("c1", Arc::clone(&tool.name), json!({})),
        tool: Arc::clone(tool),
        gated: false,
    }
}

struct Env {
    cancel: CancellationToken,
    limiter: Limiter,
    metrics: EngineMetrics,
    span: Span,
    scope: Arc<SessionScope>,
    policy: Option<Policy>,
}

impl Env {
    fn new() -> Self {
        Env {
            cancel: CancellationToken::new(),
            limiter: Limiter::new(4, 4),
            metrics: EngineMetrics::new(),
            span: Span::none(),
            scope: Arc::new(SessionScope::new("s-test", None)),
            policy: None,
        }
    }
    fn env(&self) -> CallEnv<'_> {
        CallEnv {
            arrived: Instant::now(),
            cancel: &self.cancel,
            limiter: &self.limiter,
            metrics: &self.metrics,
            span: &self.span,
            scope: &self.scope,
            policy: self.policy.as_ref(),
            gate: None,
            listener: None,
        }
    }
}

#[tokio::test]
async fn caps_refuse_with_overloaded_when_the_waiting_line_is_full() {
    let t = tool(
        spec(
            "capped",
            Handler::future(|_, _| async { Ok(String::new()) }),
        )
        .max_concurrency(1),
    );
    let global = Limiter::new(8, 8);
    let cancel = CancellationToken::new();
    let held = acquire_places(&t, &global, &cancel).await.unwrap();
    // The tool's line holds 1,024; fill it with waiters that never get a place.
    let mut waiters = Vec::new();
    for _ in 0..crate::registry::TOOL_QUEUE_LIMIT {
        waiters.push(Box::pin(acquire_places(&t, &global, &cancel)));
        let poll = futures::poll!(waiters.last_mut().unwrap());
        assert!(poll.is_pending());
    }
    let refused = acquire_places(&t, &global, &cancel).await.unwrap_err();
    assert_eq!(refused.0, ErrorCode::Overloaded);
    assert!(refused.1.contains("tool capped"), "{}", refused.1);
    cancel.cancel();
    for w in waiters {
        assert_eq!(w.await.unwrap_err().0, ErrorCode::Cancelled);
    }
    drop(held);
}

#[test]
fn the_policy_layer_denies_by_rule_and_lets_the_rest_through() {
    let policy = crate::policy::Policy::from_json(&json!({
        "permissions": {"deny": ["any"], "default": "allow"}
    }))
    .unwrap();
    let mut env = Env::new();
    env.policy = Some(policy);
    let denied = tool(spec("any", Handler::inline(|_, _| Ok("ran".to_string()))));
    let other = tool(spec("other", Handler::inline(|_, _| Ok("ran".to_string()))));
    let (_, result, _) = run_in_place(planned(&denied), env.env());
    assert_eq!(result.error, Some(ErrorCode::PermissionDenied));
    assert_eq!(
        result.content,
        "Error [permission_denied]: denied by rule \"any\""
    );
    let (_, result, _) = run_in_place(planned(&other), env.env());
    assert_eq!(result.content, "ran");
}

#[tokio::test]
async fn a_call_waiting_for_approval_holds_no_concurrency_place() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<crate::policy::ApprovalRequest>();
    let approver = move |req: crate::policy::ApprovalRequest| {
        let tx = tx.clone();
        async move {
            let _ = tx.send(req);
            futures::future::pending::<crate::policy::Approval>().await
        }
        .boxed()
    };
    let policy = crate::policy::Policy::from_json(&json!({
        "permissions": {"ask": ["asked"], "default": "allow"}
    }))
    .unwrap()
    .approver(Arc::new(approver));
    let mut env = Env::new();
    env.limiter = Limiter::new(1, 0); // one place, nobody may wait for it
    env.policy = Some(policy);
    let asked = tool(spec(
        "asked",
        Handler::future(|_, _| async { Ok("asked ran".to_string()) }),
    ));
    let free = tool(spec(
        "free",
        Handler::future(|_, _| async { Ok("free ran".to_string()) }),
    ));
    let waiting = run(planned(&asked), env.env());
    tokio::pin!(waiting);
    // The asked call is parked at the approver…
    tokio::select! {
        _ = &mut waiting => panic!("answered without an approval"),
        req = rx.recv() => assert_eq!(req.unwrap().tool_name, "asked"),
    }
    // …and the only place is still free for another call.
    let (_, result, _) = run(planned(&free), env.env()).await;
    assert_eq!(result.content, "free ran");
    env.cancel.cancel();
    let (_, result, _) = waiting.await;
    assert_eq!(result.error, Some(ErrorCode::Cancelled));
}

#[tokio::test]
async fn the_handler_layer_runs_each_kind_and_catches_panics() {
    let ctx = || {
        ToolContext::new(
            "c",
            "t",
            Arc::new(SessionScope::new("s", None)),
            Instant::now() + Duration::from_secs(5),
            CancellationToken::new(),
        )
    };
    let places = || async {
        let l = Limiter::new(1, 1);
        (None, l.acquire(&CancellationToken::new()).await.unwrap())
    };
    let kinds = [
        Handler::inline(|_, _| Ok("inline")),
        Handler::future(|_, _| async { Ok("async") }),
        Handler::blocking(|_, _| Ok("blocking")),
    ];
    for h in &kinds {
        let out = start_handler(h, Value::Null, ctx(), places().await, &Span::none()).await;
        assert_eq!(out.unwrap().unwrap(), h.kind_name());
    }
    let boom = Handler::blocking::<_, String>(|_, _| panic!("boom"));
    let joined = start_handler(&boom, Value::Null, ctx(), places().await, &Span::none()).await;
    assert_eq!(
        panicked(&*joined.unwrap_err()).detail,
        "handler panicked: boom"
    );
}

fn stopping<'a>(
    deadline: Instant,
    cancel: &'a CancellationToken,
    stop: &'a CancellationToken,
    gate: &'a CommitGate,
) -> Stopping<'a> {
    Stopping {
        deadline,
        timeout: Duration::from_secs(1),
        cancel,
        stop,
        gate,
    }
}

#[tokio::test(start_paused = true)]
async fn the_deadline_layer_answers_timeout_with_partial_output_within_the_grace() {
    let (cancel, stop, gate) = (
        CancellationToken::new(),
        CancellationToken::new(),
        CommitGate::guarded(),
    );
    let told = stop.clone();
    let handler = async move {
        told.cancelled().await;
        Ok("half done".into())
    };
    let deadline = Instant::now() + Duration::from_secs(1);
    let out = supervise(
        std::pin::pin!(handler),
        stopping(deadline, &cancel, &stop, &gate),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.code, ErrorCode::Timeout);
    assert_eq!(err.detail, "timed out after 1s; partial output:\nhalf done");
}

#[tokio::test(start_paused = true)]
async fn the_deadline_layer_drops_a_handler_that_ignores_the_stop() {
    let (cancel, stop, gate) = (
        CancellationToken::new(),
        CancellationToken::new(),
        CommitGate::guarded(),
    );
    let handler = futures::future::pending::<ToolOutcome>();
    cancel.cancel();
    let out = supervise(
        std::pin::pin!(handler),
        stopping(
            Instant::now() + Duration::from_secs(60),
            &cancel,
            &stop,
            &gate,
        ),
    )
    .await;
    assert_eq!(out.unwrap_err().code, ErrorCode::Cancelled);
    assert!(stop.is_cancelled(), "the handler was told to stop");
}

#[tokio::test(start_paused = true)]
async fn a_handler_that_began_committing_keeps_its_own_answer() {
    let (cancel, stop, gate) = (
        CancellationToken::new(),
        CancellationToken::new(),
        CommitGate::guarded(),
    );
    let handler_gate = gate.clone();
    let handler = async move {
        assert!(handler_gate.begin());
        // The commit outlasts the stop grace: it is still waited for.
        tokio::time::sleep(STOP_GRACE * 4).await;
        Ok("Wrote 2 bytes".into())
    };
    let later = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(10)).await;
        later.cancel();
    });
    let out = supervise(
        std::pin::pin!(handler),
        stopping(
            Instant::now() + Duration::from_secs(60),
            &cancel,
            &stop,
            &gate,
        ),
    )
    .await;
    assert!(cancel.is_cancelled());
    assert_eq!(out.unwrap(), "Wrote 2 bytes");
}

#[test]
fn a_closed_gate_refuses_a_late_commit() {
    let gate = CommitGate::guarded();
    assert!(gate.close());
    assert!(!gate.begin());
    let committing = CommitGate::guarded();
    assert!(committing.begin() && committing.begin());
    assert!(!committing.close());
    assert!(CommitGate::default().begin());
}

#[test]
fn the_output_cap_applies_to_content_and_error_details() {
    let call = || ToolCall::new("c", "t", json!({}));
    let ok = to_result(call(), 100, Ok("x".repeat(1_000).into()), Timing::default());
    assert!(ok.content.len() <= 100 && ok.error.is_none());
    let err = to_result(
        call(),
        100,
        Err(ToolError::execution("y".repeat(1_000))),
        Timing::default(),
    );
    assert_eq!(err.error, Some(ErrorCode::ExecutionError));
    assert!(err.content.len() <= 100 + "Error [execution_error]: ".len());
}

#[tokio::test]
async fn the_stack_runs_a_call_end_to_end_and_releases_its_places() {
    let env = Env::new();
    let ran = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&ran);
    let t = tool(spec(
        "work",
        Handler::future(move |_, ctx| {
            let seen = Arc::clone(&seen);
            async move {
                seen.store(true, Ordering::SeqCst);
                Ok(format!("{} in {}", ctx.tool_name, ctx.session_id()))
            }
        }),
    ));
    let (_, result, _) = run(planned(&t), env.env()).await;
    assert_eq!(result.content, "work in s-test");
    assert!(ran.load(Ordering::SeqCst) && result.timing.ran);
    assert_eq!(env.limiter.available(), 4);
}

#[tokio::test]
async fn a_cancelled_turn_answers_inline_calls_without_running_them() {
    let env = Env::new();
    env.cancel.cancel();
    let t = tool(spec(
        "inl",
        Handler::inline::<_, String>(|_, _| panic!("must not run")),
    ));
    let (_, result, _) = run_in_place(planned(&t), env.env());
    assert_eq!(result.error, Some(ErrorCode::Cancelled));
}

/// A start gate that records the order of events and refuses calls whose id starts with `no`.
#[derive(Debug, Default)]
struct Recording(std::sync::Mutex<Vec<String>>);

impl StartGate for Recording {
    fn guards(&self, _call: &ToolCall) -> bool {
        true
    }
    fn open<'a>(&'a self, call: &'a ToolCall) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            self.0.lock().unwrap().push(format!("gate {}", call.id));
            if call.id.starts_with("no") {
                Err("the journal cannot record the call".to_string())
            } else {
                Ok(())
            }
        })
    }
}

#[tokio::test]
async fn a_gated_call_passes_its_gate_right_before_its_handler_and_a_refusal_runs_nothing() {
    let gate = Arc::new(Recording::default());
    let mut env = Env::new();
    env.policy = None;
    let events = Arc::clone(&gate);
    let ran = Arc::new(AtomicBool::new(false));
    let ran_in = Arc::clone(&ran);
    // An inline handler too: gated, it no longer runs in place, and still passes the gate first.
    let inline = tool(spec(
        "inline",
        Handler::inline(move |_, ctx| {
            events
                .0
                .lock()
                .unwrap()
                .push(format!("ran {}", ctx.call_id));
            ran_in.store(true, Ordering::SeqCst);
            Ok("ran".to_string())
        }),
    ));
    let asynchronous = tool(spec(
        "async",
        Handler::future(|_, _| async { Ok("ran".to_string()) }),
    ));
    let mut call_env = env.env();
    call_env.gate = Some(&*gate);
    let mut p = planned(&inline);
    p.gated = true;
    assert!(!runs_in_place(&p, None));
    let (_, result, _) = run(p, call_env).await;
    assert_eq!(result.content, "ran");
    assert_eq!(*gate.0.lock().unwrap(), ["gate c1", "ran c1"]);
    // Refused by the gate: answered "not run", the handler never called.
    for t in [&inline, &asynchronous] {
        ran.store(false, Ordering::SeqCst);
        let mut p = planned(t);
        p.call = ToolCall::new("no1", Arc::clone(&t.name), json!({}));
        p.gated = true;
        let (_, result, _) = run(p, call_env).await;
        assert_eq!(result.error, Some(ErrorCode::ExecutionError));
        assert_eq!(
            result.content,
            "Error [execution_error]: not run: the journal cannot record the call"
        );
        assert!(!result.timing.ran);
        assert!(!ran.load(Ordering::SeqCst));
    }
    // Not gated: the gate is never asked.
    let before = gate.0.lock().unwrap().len();
    let (_, result, _) = run(planned(&asynchronous), call_env).await;
    assert_eq!(result.content, "ran");
    assert_eq!(gate.0.lock().unwrap().len(), before);
}

#[tokio::test]
async fn a_call_cancelled_before_its_gate_is_answered_cancelled_without_passing_it() {
    let gate = Recording::default();
    let env = Env::new();
    let t = tool(spec(
        "async",
        Handler::future(|_, _| async { Ok("ran".to_string()) }),
    ));
    let mut call_env = env.env();
    call_env.gate = Some(&gate);
    env.cancel.cancel();
    let mut p = planned(&t);
    p.gated = true;
    let (_, result, _) = run(p, call_env).await;
    assert_eq!(result.error, Some(ErrorCode::Cancelled));
    assert!(gate.0.lock().unwrap().is_empty());
}
