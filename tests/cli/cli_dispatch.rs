//! The `switchboard` binary end to end: `dispatch` (both wire formats, `--lines`, bad input),
//! `tools` and `demo`.

use crate::common;

use common::cli::{describe, dispatch, run, stdout_json};
use serde_json::{Value, json};

#[test]
fn an_anthropic_turn_is_answered_with_one_user_message_of_ordered_tool_results() {
    let ws = tempfile::tempdir().unwrap();
    let turn = json!({"role": "assistant", "content": [
        {"type": "text", "text": "Writing then reading."},
        {"type": "tool_use", "id": "toolu_1", "name": "write_file",
         "input": {"path": "hello.txt", "content": "hello from the cli\n"}},
        {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "hello.txt"}},
        {"type": "tool_use", "id": "toolu_3", "name": "deploy", "input": {"target": "prod"}}
    ]});
    let out = dispatch(ws.path(), &[], &turn.to_string());
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));

    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert_eq!(
        stdout.trim().lines().count(),
        1,
        "one JSON document: {stdout}"
    );
    let message = stdout_json(&out);
    assert_eq!(message["role"], "user");
    let blocks = message["content"].as_array().expect("content is an array");
    assert_eq!(blocks.len(), 3, "{message}");
    let ids: Vec<_> = blocks.iter().map(|b| b["tool_use_id"].clone()).collect();
    assert_eq!(ids, [json!("toolu_1"), json!("toolu_2"), json!("toolu_3")]);
    for b in blocks {
        assert_eq!(b["type"], "tool_result");
    }
    assert!(blocks[0].get("is_error").is_none(), "{}", blocks[0]);
    assert!(blocks[1].get("is_error").is_none(), "{}", blocks[1]);
    assert!(
        blocks[1]["content"]
            .as_str()
            .unwrap()
            .contains("hello from the cli"),
        "{}",
        blocks[1]
    );
    assert_eq!(blocks[2]["is_error"], true);
    assert_eq!(
        blocks[2]["content"],
        "Error [unknown_tool]: tool is not registered: deploy"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("hello.txt")).unwrap(),
        "hello from the cli\n"
    );
}

#[test]
fn an_openai_turn_with_one_undecodable_argument_string_gets_one_tool_message_per_call() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    let turn = json!({"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_a", "type": "function",
         "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}},
        {"id": "call_b", "type": "function",
         "function": {"name": "read_file", "arguments": "{\"path\": \"a.txt\""}},
        {"id": "call_c", "type": "function",
         "function": {"name": "glob", "arguments": "{\"pattern\":\"*.txt\"}"}}
    ]});
    let out = dispatch(ws.path(), &["--format", "openai"], &turn.to_string());
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let messages = stdout_json(&out);
    let messages = messages.as_array().expect("a JSON array of messages");
    assert_eq!(messages.len(), 3);
    for (m, id) in messages.iter().zip(["call_a", "call_b", "call_c"]) {
        assert_eq!(m["role"], "tool");
        assert_eq!(m["tool_call_id"], id);
    }
    assert!(messages[0]["content"].as_str().unwrap().contains("alpha"));
    assert!(
        messages[1]["content"]
            .as_str()
            .unwrap()
            .starts_with("Error [invalid_arguments]: "),
        "{}",
        messages[1]
    );
    assert!(
        messages[2]["content"].as_str().unwrap().contains("a.txt"),
        "{}",
        messages[2]
    );
}

#[test]
fn lines_mode_answers_each_document_on_its_own_line() {
    let ws = tempfile::tempdir().unwrap();
    let docs: Vec<String> = (1..=3)
        .map(|i| {
            json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": format!("t{i}"), "name": "write_file",
                 "input": {"path": format!("f{i}.txt"), "content": format!("{i}")}}
            ]})
            .to_string()
        })
        .collect();
    let out = dispatch(ws.path(), &["--lines"], &(docs.join("\n") + "\n"));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (i, line) in lines.iter().enumerate() {
        let message: Value = serde_json::from_str(line).unwrap();
        assert_eq!(message["role"], "user");
        assert_eq!(message["content"][0]["tool_use_id"], format!("t{}", i + 1));
    }
    for i in 1..=3 {
        assert!(ws.path().join(format!("f{i}.txt")).exists());
    }
}

/// `--lines --progress`: a running command's output as `"event": "progress"` lines, in order,
/// each turn's before its answer line; the answer is the same as without them.
#[test]
fn lines_mode_with_progress_prints_each_call_s_output_before_the_turn_s_answer() {
    let ws = tempfile::tempdir().unwrap();
    let turn = |id: &str, command: &str| {
        json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": id, "name": "bash", "input": {"command": command}}
        ]})
        .to_string()
    };
    let input = [
        turn("t1", "echo first; sleep 0.2; echo second; echo oops >&2"),
        turn("t2", "echo third"),
        // A retry of t1 (the same call again).
        turn("t1", "echo first; sleep 0.2; echo second; echo oops >&2"),
    ]
    .join("\n")
        + "\n";
    let out = dispatch(ws.path(), &["--lines", "--progress"], &input);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let answers: Vec<usize> = (0..lines.len())
        .filter(|&i| lines[i]["role"] == "user")
        .collect();
    assert_eq!(answers.len(), 3, "{stdout}");
    let progress_of = |from: usize, to: usize, stream: &str| -> String {
        lines[from..to]
            .iter()
            .filter(|l| l["event"] == "progress" && l["stream"] == stream)
            .map(|l| l["text"].as_str().unwrap())
            .collect()
    };
    assert_eq!(progress_of(0, answers[0], "stdout"), "first\nsecond\n");
    assert_eq!(progress_of(0, answers[0], "stderr"), "oops\n");
    assert!(lines[..answers[0]].iter().all(|l| l["tool_use_id"] == "t1"));
    assert_eq!(progress_of(answers[0], answers[1], "stdout"), "third\n");
    // The re-sent t1 is answered from the session's memory: nothing runs, no progress.
    assert_eq!(answers[2], answers[1] + 1, "{stdout}");
    assert_eq!(lines[answers[2]], lines[answers[0]]);
    assert_eq!(
        lines[answers[0]]["content"][0]["content"],
        "first\nsecond\noops"
    );
    // --progress alone names the flag it needs.
    let out = dispatch(ws.path(), &["--progress"], &input);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--lines"));
}

#[test]
fn input_that_is_not_json_exits_2_with_one_line_on_stderr_and_nothing_on_stdout() {
    let ws = tempfile::tempdir().unwrap();
    let out = dispatch(ws.path(), &[], "this is {not json");
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
    assert!(out.stdout.is_empty(), "{}", describe(&out));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(!stderr.trim().is_empty());
}

#[test]
fn input_of_the_wrong_shape_exits_2() {
    let ws = tempfile::tempdir().unwrap();
    for doc in ["42", "\"text\"", "{\"role\":\"assistant\"}"] {
        let out = dispatch(ws.path(), &[], doc);
        assert_eq!(out.status.code(), Some(2), "{doc}: {}", describe(&out));
        assert!(out.stdout.is_empty(), "{doc}: {}", describe(&out));
    }
    let out = dispatch(ws.path(), &["--format", "openai"], "42");
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[test]
fn the_tools_command_prints_the_five_builtin_tools_in_mcp_shape() {
    let cwd = tempfile::tempdir().unwrap();
    let out = run(cwd.path(), &["tools", "--format", "mcp"], "");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let catalog = stdout_json(&out);
    let tools = catalog.as_array().expect("an array of tools");
    let names: Vec<_> = tools.iter().map(|t| t["name"].clone()).collect();
    assert_eq!(
        names,
        [
            json!("bash"),
            json!("read_file"),
            json!("write_file"),
            json!("edit_file"),
            json!("glob")
        ]
    );
    for t in tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        assert!(t["description"].as_str().is_some_and(|d| !d.is_empty()));
        assert!(t.get("input_schema").is_none());
    }
}

#[test]
fn the_demo_runs_two_sessions_to_completion() {
    let cwd = tempfile::tempdir().unwrap();
    let out = run(cwd.path(), &["demo", "--sessions", "2"], "");
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let stdout = String::from_utf8(out.stdout.clone()).unwrap();
    assert!(
        stdout.contains("2 of 2 sessions finished"),
        "{}",
        describe(&out)
    );
}

#[test]
fn version_names_the_commit_the_features_and_the_default_sandbox_here() {
    let dir = tempfile::tempdir().unwrap();
    for flag in ["--version", "-V"] {
        let out = run(dir.path(), &[flag], "");
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let text = String::from_utf8(out.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            format!("switchboard {}", env!("CARGO_PKG_VERSION")),
            "{text}"
        );
        let commit = lines[1].strip_prefix("commit: ").expect("a commit line");
        assert!(
            commit == "unknown" || commit.chars().all(|c| c.is_ascii_hexdigit()),
            "{text}"
        );
        assert!(
            lines[2].starts_with("features: ") && lines[2].contains("cli"),
            "{text}"
        );
        let sandbox = lines[3]
            .strip_prefix("sandbox: workspace-write ")
            .expect("a sandbox line");
        assert!(
            sandbox.starts_with("can be enforced here (Landlock ABI ")
                || sandbox.starts_with("cannot be enforced here: missing "),
            "{text}"
        );
    }
}
