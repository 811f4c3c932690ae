//! `ask` rules wait for an approver (approved, refused, timed out, cancelled) without holding a
//! concurrency place; PreToolUse hooks allow, deny, rewrite (re-validated, and never beyond what
//! the planned call touches) and fail closed; a persistent hook killed mid-turn denies what it
//! had not answered and is restarted. External PostToolUse hooks annotate or replace content
//! (never a failure's code) and, when they fail, keep the result with a note. Every turn keeps
//! one answer per call, in order.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{call, counting_tool, counting_tool_with_schema, ids, outcomes, text_schema};
use futures::FutureExt;
use serde_json::json;
use switchboard::policy::{ApprovalRequest, Approvals, Hook, Policy, PostAction, PreDecision};
use switchboard::{Engine, ErrorCode, Handler, ToolCall, ToolDispatchResult, ToolSpec};

const BOUND: Duration = Duration::from_secs(20);

async fn turn(engine: &Engine, calls: Vec<ToolCall>) -> Vec<ToolDispatchResult> {
    tokio::time::timeout(BOUND, engine.dispatch(calls))
        .await
        .expect("answered within the bound")
        .unwrap()
}

fn async_counting(name: &str, ran: &Arc<AtomicUsize>) -> ToolSpec {
    let ran = Arc::clone(ran);
    ToolSpec::new(
        name,
        "counts",
        json!({"type": "object"}),
        Handler::future(move |_, _| {
            let ran = Arc::clone(&ran);
            async move {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok("ran".to_string())
            }
        }),
    )
}

fn asking(approvals: &Approvals, timeout: Duration) -> Policy {
    Policy::from_json(&json!({"permissions": {"ask": ["guarded"], "default": "allow"}}))
        .unwrap()
        .approver(Arc::new(approvals.clone()))
        .approval_timeout(timeout)
}

#[tokio::test]
async fn ask_is_answered_by_the_approver_approved_or_refused() {
    let approvals = Approvals::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .tool(async_counting("guarded", &ran))
        .tool(counting_tool("free", Arc::clone(&ran)))
        .policy(asking(&approvals, Duration::from_secs(30)))
        .build()
        .unwrap();
    let mut requests = approvals.subscribe("engine");
    let answerer = {
        let approvals = approvals.clone();
        tokio::spawn(async move {
            let mut seen = Vec::new();
            while let Some(req) = requests.recv().await {
                let allow = req.tool_use_id == "yes";
                seen.push((req.tool_use_id.clone(), req.rule.clone()));
                assert!(approvals.answer("engine", &req.approval_id, allow));
                if seen.len() == 2 {
                    break;
                }
            }
            seen
        })
    };
    let results = turn(
        &engine,
        vec![
            call("yes", "guarded", json!({})),
            call("free", "free", json!({})),
            call("no", "guarded", json!({})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["yes", "free", "no"]);
    assert_eq!(outcomes(&results), ["ok", "ok", "permission_denied"]);
    assert_eq!(
        results[2].content,
        "Error [permission_denied]: rule \"guarded\" asks for approval: approval refused"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 2);
    let seen = answerer.await.unwrap();
    assert_eq!(seen[0], ("yes".to_string(), Some("guarded".to_string())));
    assert_eq!(approvals.pending(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_ask_is_denied_after_the_timeout() {
    let approvals = Approvals::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .tool(async_counting("guarded", &ran))
        .policy(asking(&approvals, Duration::from_secs(60)))
        .build()
        .unwrap();
    let _requests = approvals.subscribe("engine");
    let results = engine
        .dispatch(vec![call("t", "guarded", json!({}))])
        .await
        .unwrap();
    assert_eq!(
        results[0].content,
        "Error [permission_denied]: rule \"guarded\" asks for approval: no approval within 60 s"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(approvals.pending(), 0);
}

#[tokio::test]
async fn a_waiting_ask_is_answered_cancelled_when_the_turn_is_cancelled() {
    let approvals = Approvals::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .tool(async_counting("guarded", &ran))
        .tool(async_counting("free", &ran))
        .policy(asking(&approvals, Duration::from_secs(60)))
        .max_concurrency(1)
        .build()
        .unwrap();
    let mut requests = approvals.subscribe("engine");
    let token = engine.turn_token();
    let dispatch = engine.dispatch_with_cancel(
        vec![
            call("a", "guarded", json!({})),
            call("b", "guarded", json!({})),
        ],
        token.clone(),
    );
    let canceller = async {
        requests.recv().await.unwrap();
        // While it waits, other calls still get the engine's only place.
        let other = turn(&engine, vec![call("f", "free", json!({}))]).await;
        assert_eq!(outcomes(&other), ["ok"]);
        token.cancel();
    };
    let (results, ()) = tokio::time::timeout(BOUND, futures::future::join(dispatch, canceller))
        .await
        .unwrap();
    let results = results.unwrap();
    assert_eq!(ids(&results), ["a", "b"]);
    assert_eq!(outcomes(&results), ["cancelled", "cancelled"]);
    assert_eq!(ran.load(Ordering::SeqCst), 1, "only the free call ran");
}

#[tokio::test]
async fn non_interactive_ask_is_denied_and_says_so() {
    let ran = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .tool(counting_tool("guarded", Arc::clone(&ran)))
        .policy(Policy::from_json(&json!({"permissions": {"default": "ask"}})).unwrap())
        .build()
        .unwrap();
    let results = turn(&engine, vec![call("t", "guarded", json!({}))]).await;
    assert!(
        results[0]
            .content
            .contains("non-interactive: ask is treated as deny"),
        "{}",
        results[0].content
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn in_process_hooks_allow_deny_rewrite_and_annotate() {
    let ran = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .tool(common::echo_tool("echo"))
        .tool(counting_tool_with_schema(
            "strict",
            text_schema(),
            Arc::clone(&ran),
        ))
        .hook(Hook::pre("guard", |ev| {
            match ev.tool_input.get("text").and_then(|t| t.as_str()) {
                Some("forbidden") => PreDecision::Deny("no forbidden words".into()),
                Some("shout") => PreDecision::Rewrite(json!({"text": "SHOUT"})),
                Some("break") => PreDecision::Rewrite(json!({"text": 7})),
                _ => PreDecision::Continue,
            }
        }))
        .hook(Hook::post("stamp", |ev| {
            if ev.result.error.is_some() {
                PostAction::Replace("hidden".into())
            } else {
                PostAction::Annotate("(checked)".into())
            }
        }))
        .build()
        .unwrap();
    let results = turn(
        &engine,
        vec![
            call("a", "echo", json!({"text": "hi"})),
            call("b", "echo", json!({"text": "forbidden"})),
            call("c", "echo", json!({"text": "shout"})),
            call("d", "strict", json!({"text": "break"})),
        ],
    )
    .await;
    assert_eq!(results[0].content, "echo:hi\n(checked)");
    assert_eq!(
        results[1].content,
        "Error [permission_denied]: denied by hook:guard: no forbidden words"
    );
    assert_eq!(results[2].content, "echo:SHOUT\n(checked)");
    assert_eq!(results[3].error, Some(ErrorCode::InvalidArguments));
    assert!(
        results[3].content.contains("rewritten by hook:guard"),
        "{}",
        results[3].content
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_hook_allow_skips_the_ask_but_never_a_deny_rule() {
    let ran = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder()
        .tool(counting_tool("asked", Arc::clone(&ran)))
        .tool(counting_tool("banned", Arc::clone(&ran)))
        .policy(
            Policy::from_json(&json!({"permissions": {"ask": ["asked"], "deny": ["banned"]}}))
                .unwrap(),
        )
        .hook(Hook::pre("yes", |_| PreDecision::Allow))
        .build()
        .unwrap();
    let results = turn(
        &engine,
        vec![
            call("a", "asked", json!({})),
            call("b", "banned", json!({})),
        ],
    )
    .await;
    assert_eq!(outcomes(&results), ["ok", "permission_denied"]);
}

fn external(policy: serde_json::Value, tools: Vec<ToolSpec>) -> Engine {
    Engine::builder()
        .tools(tools)
        .policy(Policy::from_json(&policy).unwrap())
        .build()
        .unwrap()
}

/// Per-call hooks that fail (with a 0.5 s timeout), and what their failure message says.
const FAILING_HOOKS: [(&str, &str); 4] = [
    ("exit 1", "failed with exit code 1"),
    ("kill -9 $$", "crashed"),
    ("sleep 30", "did not answer within 0.5 s"),
    ("echo 'this is not json'", "not decision JSON"),
];

/// A persistent hook in Python: for each request line `req` (never answering one whose
/// `tool_input.text` is `hang`), runs `body` (Python lines that set `out`) and prints `out`.
/// Returns the command that starts it.
fn python_hook(dir: &tempfile::TempDir, body: &str) -> String {
    let script = dir.path().join("hook.py");
    let body: String = body
        .lines()
        .map(|l| format!("    {}\n", l.trim()))
        .collect();
    std::fs::write(
        &script,
        format!(
            "import json, sys\n\
             for line in sys.stdin:\n\
             \x20   req = json.loads(line)\n\
             \x20   if req['tool_input'].get('text') == 'hang':\n\
             \x20       continue\n\
             {body}\
             \x20   print(json.dumps(out), flush=True)\n"
        ),
    )
    .unwrap();
    format!("python3 {}", script.display())
}

/// Kills process `pid` after `delay`.
async fn kill_after(pid: u32, delay: Duration) {
    tokio::time::sleep(delay).await;
    let _ = std::process::Command::new("kill")
        .arg("-9")
        .arg(pid.to_string())
        .status();
}

fn command_hook(command: &str, timeout: f64) -> serde_json::Value {
    json!({"permissions": {"default": "allow"}, "hooks": {"PreToolUse": [
        {"matcher": "echo", "hooks": [{"type": "command", "command": command, "timeout": timeout}]}
    ]}})
}

#[tokio::test]
async fn external_command_hooks_see_claude_code_input_and_decide() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen.json");
    let script = format!(
        "input=$(cat); printf '%s' \"$input\" > {seen}; \
         case \"$input\" in *forbidden*) echo 'no forbidden words' >&2; exit 2;; esac; \
         case \"$input\" in *shout*) echo '{{\"hookSpecificOutput\":{{\"permissionDecision\":\"allow\",\"updatedInput\":{{\"text\":\"SHOUT\"}}}}}}';; esac",
        seen = seen.display()
    );
    let engine = external(command_hook(&script, 10.0), vec![common::echo_tool("echo")]);
    let results = turn(&engine, vec![call("a", "echo", json!({"text": "hi"}))]).await;
    assert_eq!(results[0].content, "echo:hi");
    let input: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&seen).unwrap()).unwrap();
    assert_eq!(input["hook_event_name"], "PreToolUse");
    assert_eq!(input["tool_name"], "echo");
    assert_eq!(input["tool_use_id"], "a");
    assert_eq!(input["tool_input"], json!({"text": "hi"}));
    assert_eq!(input["session_id"], "engine");
    let results = turn(
        &engine,
        vec![
            call("b", "echo", json!({"text": "forbidden"})),
            call("c", "echo", json!({"text": "shout"})),
        ],
    )
    .await;
    assert_eq!(
        results[0].content,
        "Error [permission_denied]: denied by hook:PreToolUse[0].hooks[0]: no forbidden words"
    );
    assert_eq!(results[1].content, "echo:SHOUT");
}

#[tokio::test]
async fn external_hooks_fail_closed() {
    let rewrite_to_invalid = (
        "echo '{\"hookSpecificOutput\":{\"updatedInput\":{\"text\":3}}}'",
        "rewritten by hook",
    );
    for (command, needle) in FAILING_HOOKS.into_iter().chain([rewrite_to_invalid]) {
        let engine = external(command_hook(command, 0.5), vec![common::echo_tool("echo")]);
        let results = turn(&engine, vec![call("a", "echo", json!({"text": "hi"}))]).await;
        assert!(
            results[0].error.is_some(),
            "{command}: {}",
            results[0].content
        );
        assert!(
            results[0].content.contains(needle),
            "{command}: {}",
            results[0].content
        );
    }
}

#[tokio::test]
async fn a_persistent_hook_answers_many_calls_and_is_restarted_after_being_killed() {
    let dir = tempfile::tempdir().unwrap();
    let command = python_hook(
        &dir,
        "deny = req['tool_input'].get('text') == 'no'\n\
         out = {'id': req['id'], 'hookSpecificOutput': {'permissionDecision': 'deny' if deny else 'allow', 'permissionDecisionReason': 'said no'}}",
    );
    let policy = json!({"hooks": {"PreToolUse": [{"matcher": "echo", "hooks": [
        {"type": "persistent", "command": command, "timeout": 10}
    ]}]}});
    let engine = external(policy, vec![common::echo_tool("echo")]);
    let calls: Vec<_> = (0..40)
        .map(|i| {
            let text = if i % 10 == 3 { "no" } else { "yes" };
            call(&format!("t{i}"), "echo", json!({"text": text}))
        })
        .collect();
    let results = turn(&engine, calls).await;
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.tool_use_id.as_ref(), format!("t{i}"));
        if i % 10 == 3 {
            assert!(r.content.ends_with("said no"), "{}", r.content);
        } else {
            assert_eq!(r.content, "echo:yes");
        }
    }
    let hook = &engine.policy().unwrap().external_hooks().pre[0];
    let pid = hook.persistent_pid().await.expect("the hook runs");
    // A call the hook never answers; the hook is killed while it waits.
    let killer = kill_after(pid, Duration::from_millis(300));
    let (results, ()) = futures::future::join(
        turn(
            &engine,
            vec![
                call("h", "echo", json!({"text": "hang"})),
                call("y", "echo", json!({"text": "yes"})),
            ],
        ),
        killer,
    )
    .await;
    assert_eq!(ids(&results), ["h", "y"]);
    assert!(
        results[0].content.contains("died"),
        "{}",
        results[0].content
    );
    let results = turn(&engine, vec![call("z", "echo", json!({"text": "yes"}))]).await;
    assert_eq!(results[0].content, "echo:yes");
    let new_pid = hook.persistent_pid().await.expect("restarted");
    assert_ne!(pid, new_pid);
}

#[tokio::test]
async fn a_closure_can_be_the_approver() {
    let engine = Engine::builder()
        .tool(counting_tool("guarded", Arc::new(AtomicUsize::new(0))))
        .policy(
            Policy::from_json(&json!({"permissions": {"default": "ask"}}))
                .unwrap()
                .approver(Arc::new(|req: ApprovalRequest| {
                    async move {
                        if req.tool_use_id == "ok" {
                            Ok(())
                        } else {
                            Err("nope".into())
                        }
                    }
                    .boxed()
                })),
        )
        .build()
        .unwrap();
    let results = turn(
        &engine,
        vec![
            call("ok", "guarded", json!({})),
            call("ko", "guarded", json!({})),
        ],
    )
    .await;
    assert_eq!(outcomes(&results), ["ok", "permission_denied"]);
    assert!(results[1].content.ends_with("nope"));
}

fn post_hook(kind: &str, command: &str, timeout: f64) -> serde_json::Value {
    json!({"hooks": {"PostToolUse": [
        {"matcher": "echo|fails", "hooks": [{"type": kind, "command": command, "timeout": timeout}]}
    ]}})
}

fn post_engine(policy: serde_json::Value) -> Engine {
    external(
        policy,
        vec![
            common::echo_tool("echo"),
            common::failing_tool("fails", ErrorCode::ExecutionError, "boom"),
            common::echo_tool("unhooked"),
        ],
    )
}

#[tokio::test]
async fn external_post_tool_use_hooks_see_the_result_and_annotate_or_replace_it() {
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen.jsonl");
    // Claude Code's PostToolUse outputs, chosen by the call's text.
    let script = format!(
        "input=$(cat); printf '%s\\n' \"$input\" >> {seen}; \
         case \"$input\" in \
           *context*) echo '{{\"hookSpecificOutput\":{{\"hookEventName\":\"PostToolUse\",\"additionalContext\":\"formatted by the hook\"}}}}';; \
           *block*) echo '{{\"decision\":\"block\",\"reason\":\"lint failed: line 3\"}}';; \
           *stderr*) echo 'fed back from stderr' >&2; exit 2;; \
           *) echo '{{\"hookSpecificOutput\":{{\"updatedMCPToolOutput\":\"[redacted]\"}}}}';; \
         esac",
        seen = seen.display()
    );
    let engine = post_engine(post_hook("command", &script, 10.0));
    let results = turn(
        &engine,
        vec![
            call("a", "echo", json!({"text": "context"})),
            call("b", "echo", json!({"text": "block"})),
            call("c", "echo", json!({"text": "stderr"})),
            call("d", "echo", json!({"text": "secret"})),
            call("e", "fails", json!({"text": "secret"})),
            call("f", "unhooked", json!({"text": "secret"})),
        ],
    )
    .await;
    assert_eq!(ids(&results), ["a", "b", "c", "d", "e", "f"]);
    let label = "hook:PostToolUse[0].hooks[0]";
    assert_eq!(results[0].content, "echo:context\nformatted by the hook");
    assert_eq!(
        results[1].content,
        format!("echo:block\n{label}: lint failed: line 3")
    );
    assert_eq!(
        results[2].content,
        format!("echo:stderr\n{label}: fed back from stderr")
    );
    assert_eq!(results[3].content, "[redacted]");
    // A failed call stays failed, whatever the hook answers.
    assert_eq!(results[4].error, Some(ErrorCode::ExecutionError));
    assert_eq!(results[4].content, "Error [execution_error]: [redacted]");
    assert_eq!(results[5].content, "echo:secret");
    assert_eq!(
        outcomes(&results),
        ["ok", "ok", "ok", "ok", "execution_error", "ok"]
    );
    // What the hook saw: Claude Code's PostToolUse input, one line per hooked call.
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&seen)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5, "the unmatched tool is not hooked");
    let a = lines.iter().find(|l| l["tool_use_id"] == "a").unwrap();
    assert_eq!(a["hook_event_name"], "PostToolUse");
    assert_eq!(a["session_id"], "engine");
    assert_eq!(a["tool_name"], "echo");
    assert_eq!(a["tool_input"], json!({"text": "context"}));
    assert_eq!(
        a["tool_response"],
        json!({"content": "echo:context", "is_error": false, "error_code": null})
    );
    let e = lines.iter().find(|l| l["tool_use_id"] == "e").unwrap();
    assert_eq!(
        e["tool_response"],
        json!({"content": "Error [execution_error]: boom", "is_error": true,
               "error_code": "execution_error"})
    );
}

#[tokio::test]
async fn a_failing_post_tool_use_hook_keeps_the_result_and_says_so() {
    for (command, needle) in FAILING_HOOKS {
        let engine = post_engine(post_hook("command", command, 0.5));
        let results = turn(
            &engine,
            vec![
                call("a", "echo", json!({"text": "hi"})),
                call("b", "fails", json!({})),
            ],
        )
        .await;
        // The call ran: its result and code are kept, with the hook's failure appended.
        assert_eq!(results[0].error, None, "{command}: {}", results[0].content);
        let note = "hook:PostToolUse[0].hooks[0] failed: ";
        let first = results[0].content.strip_prefix("echo:hi\n").unwrap_or("");
        assert!(
            first.starts_with(note)
                && first.contains(needle)
                && first.ends_with("(the result above is kept)"),
            "{command}: {}",
            results[0].content
        );
        assert_eq!(results[1].error, Some(ErrorCode::ExecutionError));
        assert!(
            results[1]
                .content
                .starts_with("Error [execution_error]: boom\n")
                && results[1].content.contains(needle),
            "{command}: {}",
            results[1].content
        );
    }
}

#[tokio::test]
async fn a_persistent_post_tool_use_hook_annotates_and_a_killed_one_keeps_results() {
    let dir = tempfile::tempdir().unwrap();
    let command = python_hook(
        &dir,
        "ctx = req['hook_event_name'] + ' saw ' + req['tool_response']['content']\n\
         out = {'id': req['id'], 'hookSpecificOutput': {'additionalContext': ctx}}",
    );
    let engine = post_engine(post_hook("persistent", &command, 10.0));
    let calls: Vec<_> = (0..20)
        .map(|i| call(&format!("t{i}"), "echo", json!({"text": format!("n{i}")})))
        .collect();
    let results = turn(&engine, calls).await;
    for (i, r) in results.iter().enumerate() {
        assert_eq!(
            r.content,
            format!("echo:n{i}\nPostToolUse saw echo:n{i}"),
            "answers are matched to their calls by id"
        );
    }
    let hook = &engine.policy().unwrap().external_hooks().post[0];
    let pid = hook.persistent_pid().await.expect("the hook runs");
    let killer = kill_after(pid, Duration::from_millis(300));
    let (results, ()) = futures::future::join(
        turn(&engine, vec![call("h", "echo", json!({"text": "hang"}))]),
        killer,
    )
    .await;
    assert_eq!(results[0].error, None);
    assert!(
        results[0].content.starts_with("echo:hang\n") && results[0].content.contains("died"),
        "{}",
        results[0].content
    );
    let results = turn(&engine, vec![call("z", "echo", json!({"text": "z"}))]).await;
    assert_eq!(results[0].content, "echo:z\nPostToolUse saw echo:z");
    assert_ne!(hook.persistent_pid().await.expect("restarted"), pid);
}

#[tokio::test]
async fn a_rewrite_that_changes_what_a_call_touches_is_refused() {
    let ws = tempfile::tempdir().unwrap();
    let workspace = switchboard::Workspace::open(ws.path()).unwrap();
    // Redirects call "c1" to the file call "c0" writes; upper-cases the content of "c2" (same
    // file: allowed).
    let engine = Engine::builder()
        .tools(switchboard::tools::builtin_tools())
        .workspace(workspace)
        .hook(Hook::pre("redirect", |ev| match ev.tool_use_id {
            "c1" => PreDecision::Rewrite(json!({"path": "a.txt", "content": "sneaky"})),
            "c2" => PreDecision::Rewrite(json!({"path": "c.txt", "content": "UPPER"})),
            _ => PreDecision::Continue,
        }))
        .build()
        .unwrap();
    let w = |id: &str, path: &str, content: &str| {
        call(id, "write_file", json!({"path": path, "content": content}))
    };
    let results = turn(
        &engine,
        vec![
            w("c0", "a.txt", "first"),
            w("c1", "b.txt", "second"),
            w("c2", "c.txt", "lower"),
        ],
    )
    .await;
    assert_eq!(outcomes(&results), ["ok", "permission_denied", "ok"]);
    assert_eq!(
        results[1].content,
        "Error [permission_denied]: arguments rewritten by hook:redirect would write \"a.txt\", \
         which the call as planned does not; a hook may not change what a call touches (the \
         turn's order was planned from the model's arguments)"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "first"
    );
    assert!(!ws.path().join("b.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.path().join("c.txt")).unwrap(),
        "UPPER"
    );

    // The same rule for an external hook's `updatedInput`.
    let redirect =
        "echo '{\"hookSpecificOutput\":{\"updatedInput\":{\"path\":\"a.txt\",\"content\":\"x\"}}}'";
    let engine = Engine::builder()
        .tools(switchboard::tools::builtin_tools())
        .workspace(switchboard::Workspace::open(ws.path()).unwrap())
        .policy(
            Policy::from_json(&json!({"hooks": {"PreToolUse": [{"matcher": "write_file",
                "hooks": [{"type": "command", "command": redirect}]}]}}))
            .unwrap(),
        )
        .build()
        .unwrap();
    let results = turn(&engine, vec![w("d0", "d.txt", "mine")]).await;
    assert_eq!(outcomes(&results), ["permission_denied"]);
    assert!(
        results[0].content.contains("would write \"a.txt\""),
        "{}",
        results[0].content
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "first"
    );
}

#[tokio::test]
async fn a_cancelled_turn_stops_waiting_for_a_post_tool_use_hook_and_keeps_the_result() {
    let engine = post_engine(post_hook("command", "sleep 30", 20.0));
    let token = engine.turn_token();
    let dispatch = engine.dispatch_with_cancel(
        vec![call("a", "echo", json!({"text": "hi"}))],
        token.clone(),
    );
    let canceller = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        token.cancel();
    };
    let begun = std::time::Instant::now();
    let (results, ()) = tokio::time::timeout(BOUND, async {
        futures::future::join(dispatch, canceller).await
    })
    .await
    .expect("answered within the bound");
    let results = results.unwrap();
    assert!(
        begun.elapsed() < Duration::from_secs(10),
        "the hook was not waited for"
    );
    assert_eq!(results[0].error, None, "{}", results[0].content);
    assert!(
        results[0].content.starts_with("echo:hi\n")
            && results[0]
                .content
                .contains("was stopped: the turn was cancelled"),
        "{}",
        results[0].content
    );
}
