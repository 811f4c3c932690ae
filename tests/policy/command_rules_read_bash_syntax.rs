//! A command rule reads the command with a bash grammar: `deny bash(rm:*)` holds through
//! compound commands, wrappers, `eval` and `sh -c`, and what no rule can read before it runs
//! (`rm${IFS}v`, `$c v`, `source`) is refused, never allowed. Each form is first shown to delete
//! the file when no rule stands in the way, so the test fails if a form slips through.

use crate::common;

use common::workspace::Confined;
use common::{call, run_turn};
use serde_json::json;
use switchboard::policy::Policy;
use switchboard::tools::builtin_tools;
use switchboard::{Engine, ErrorCode};

/// Every way of running `rm v` that a text rule missed, and a few more.
const FORMS: &[&str] = &[
    "{ rm v; }",
    "if true; then rm v; fi",
    "for i in 1; do rm v; done",
    "while rm v; do break; done",
    "! rm v",
    "time rm v",
    "rm${IFS}v",
    "<<<x rm v",
    "f() { rm v; }; f",
    "c=rm; $c v",
    "eval \"$(echo rm) v\"",
    "eval 'rm v'",
    "bash -c 'rm v'",
    "sh -c \"$(printf 'rm v')\"",
    "command rm v",
    "env rm v",
    "/bin/rm v",
    "\\rm v",
    "echo v | xargs rm",
    "echo 'rm v' > s.sh; source s.sh",
    "echo 'rm v' | bash",
];

fn engine(c: &Confined, policy: serde_json::Value) -> Engine {
    Engine::builder()
        .tools(builtin_tools())
        .workspace(c.ws.clone())
        .policy(Policy::from_json(&policy).unwrap())
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_deny_rule_on_rm_holds_for_every_form_of_running_rm() {
    let c = Confined::new(&[], &[]);
    let open = engine(&c, json!({"permissions": {"default": "allow"}}));
    let guarded = engine(
        &c,
        json!({"permissions": {"deny": ["bash(rm:*)"], "default": "allow"}}),
    );
    let file = c.ws_path("v");
    for form in FORMS {
        // Without the rule, the form really deletes the file.
        std::fs::write(&file, "keep").unwrap();
        let r = run_turn(&open, vec![call("t", "bash", json!({"command": form}))]).await;
        assert!(
            !file.exists(),
            "{form} should delete v without a rule: {}",
            r[0].content
        );

        std::fs::write(&file, "keep").unwrap();
        let r = run_turn(&guarded, vec![call("t", "bash", json!({"command": form}))]).await;
        assert_eq!(
            r[0].error,
            Some(ErrorCode::PermissionDenied),
            "{form}: {}",
            r[0].content
        );
        assert!(
            r[0].content.contains("bash(rm:*)"),
            "{form}: the answer names the rule: {}",
            r[0].content
        );
        assert!(file.exists(), "{form} deleted v past the deny rule");
    }
}

#[tokio::test]
async fn what_a_rule_cannot_read_is_asked_about_and_the_answer_says_why() {
    let c = Confined::new(&[], &[("ws/v", "keep")]);
    let guarded = engine(
        &c,
        json!({"permissions": {"deny": ["bash(rm:*)"], "default": "allow"}}),
    );
    let r = run_turn(
        &guarded,
        vec![call("t", "bash", json!({"command": "$X v"}))],
    )
    .await;
    // Non-interactive: the ask is refused, and the answer says what could not be read.
    assert_eq!(r[0].error, Some(ErrorCode::PermissionDenied));
    assert!(
        r[0].content
            .contains("rule \"bash(rm:*)\" cannot read all of this command")
            && r[0].content.contains("known only when it runs"),
        "{}",
        r[0].content
    );
}

#[tokio::test]
async fn allowed_commands_and_pipelines_of_them_still_run() {
    let c = Confined::new(&[], &[("ws/v", "keep"), ("ws/notes.txt", "a b c\n")]);
    let e = engine(
        &c,
        json!({"permissions": {
            "allow": ["bash(git status)", "bash(echo:*)", "bash(wc:*)", "bash(cat:*)"],
            "deny": ["bash(rm:*)"],
            "default": "deny"
        }}),
    );
    let results = run_turn(
        &e,
        vec![
            call("a", "bash", json!({"command": "echo one two | wc -w"})),
            call(
                "b",
                "bash",
                json!({"command": "cat notes.txt | wc -c && echo done"}),
            ),
            call(
                "c",
                "bash",
                json!({"command": "wc -l < notes.txt 2>/dev/null"}),
            ),
            call("d", "bash", json!({"command": "git status"})),
            call("e", "bash", json!({"command": "echo a; ls"})),
            call("f", "bash", json!({"command": "echo a > out.txt"})),
        ],
    )
    .await;
    assert_eq!(results[0].content.trim(), "2");
    assert_eq!(results[1].content.trim(), "6\ndone");
    assert_eq!(results[2].content.trim(), "1");
    // Not a repository: git answers with its exit code, but the rule let it run.
    assert_eq!(results[3].error, None, "{}", results[3].content);
    for r in &results[4..] {
        assert_eq!(
            r.content,
            "Error [permission_denied]: denied by the policy's default"
        );
    }
    assert!(!c.ws_path("out.txt").exists());
}
