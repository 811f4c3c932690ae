//! A hook ported from Claude Code's settings (`"matcher": "Bash"`, `"Write|Edit"`) runs for the
//! built-in tools those names stand for, and a matcher naming a Claude Code tool Switchboard lacks
//! is refused when the policy is read, never accepted and left unused.

use crate::common;

use common::workspace::Confined;
use common::{call, run_turn};
use serde_json::json;
use switchboard::policy::Policy;
use switchboard::tools::builtin_tools;
use switchboard::{Engine, ErrorCode};

const DENY_ALL: &str = r#"echo '{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "ported deny-all"}}'"#;

#[tokio::test]
async fn a_ported_deny_all_hook_runs_for_the_tools_its_claude_code_names_mean() {
    let c = Confined::new(&[], &[("ws/a.txt", "one\n")]);
    let policy = json!({"hooks": {"PreToolUse": [
        {"matcher": "Bash", "hooks": [{"type": "command", "command": DENY_ALL}]},
        {"matcher": "Write|Edit", "hooks": [{"type": "command", "command": DENY_ALL}]}
    ]}});
    let engine = Engine::builder()
        .tools(builtin_tools())
        .workspace(c.ws.clone())
        .policy(Policy::from_json(&policy).unwrap())
        .build()
        .unwrap();
    let results = run_turn(
        &engine,
        vec![
            call("b", "bash", json!({"command": "touch made"})),
            call(
                "w",
                "write_file",
                json!({"path": "new.txt", "content": "x"}),
            ),
            call(
                "e",
                "edit_file",
                json!({"path": "a.txt", "old_text": "one", "new_text": "two"}),
            ),
            call("r", "read_file", json!({"path": "a.txt"})),
        ],
    )
    .await;
    for r in &results[..3] {
        assert_eq!(r.error, Some(ErrorCode::PermissionDenied), "{}", r.content);
        assert!(r.content.contains("ported deny-all"), "{}", r.content);
    }
    assert_eq!(
        results[3].error, None,
        "Read is not matched: {}",
        results[3].content
    );
    assert!(!c.ws_path("made").exists());
    assert!(!c.ws_path("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(c.ws_path("a.txt")).unwrap(),
        "one\n"
    );
}

#[test]
fn a_matcher_naming_a_claude_code_tool_switchboard_lacks_is_refused() {
    let policy = json!({"hooks": {"PreToolUse": [
        {"matcher": "Grep|Glob", "hooks": [{"type": "command", "command": "true"}]}
    ]}});
    let err = Policy::from_json(&policy).unwrap_err().to_string();
    assert!(
        err.contains("PreToolUse[0]") && err.contains("Grep") && err.contains("does not have"),
        "{err}"
    );
}
