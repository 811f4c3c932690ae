//! The agent loop advertises exactly the registry catalog, executes through the same registry,
//! appends each turn's results as one user message, and stops for the right reason.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::model::{MODEL, answer, config, text, tool_use};
use common::*;
use kameo::prelude::*;
use serde_json::json;
use switchboard::CatalogFormat;
use switchboard::agent::ScriptedProvider;
use switchboard::agent::{AgentError, AgentLoop, RunPrompt, StopReason};
use switchboard::protocol::encode_anthropic;
use switchboard::{Engine, ErrorCode};

fn test_engine(counter: Arc<AtomicUsize>) -> Engine {
    engine(vec![
        echo_tool("echo"),
        counting_tool("count", counter),
        failing_tool("fail", ErrorCode::ExecutionError, "it broke"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_advertises_the_registry_catalog_and_appends_results_as_one_user_message() {
    let counter = Arc::new(AtomicUsize::new(0));
    let engine = test_engine(Arc::clone(&counter));
    let provider = Arc::new(ScriptedProvider::new([
        answer(
            vec![
                text("Let me look."),
                tool_use("t1", "echo", json!({"text": "hello"})),
                tool_use("t2", "nope", json!({})),
                tool_use("t3", "count", json!({})),
                tool_use("t4", "fail", json!({})),
                tool_use("t5", "echo", json!({"text": 5})),
            ],
            "tool_use",
        ),
        answer(vec![text("All done."), text("Bye.")], "end_turn"),
    ]));
    let mut agent = AgentLoop::new(engine.session(), provider.clone(), config(8)).unwrap();
    let result = tokio::time::timeout(TURN_BOUND, agent.run("do the thing"))
        .await
        .unwrap()
        .unwrap();

    assert_eq!(result.stop_reason, StopReason::FinalAnswer);
    assert_eq!(result.stop_reason.as_str(), "final_answer");
    assert_eq!(result.turns, 2);
    assert_eq!(result.tool_calls, 5);
    assert_eq!(result.final_text, "All done.\nBye.");
    assert_eq!(result.provider_stop_reason.as_deref(), Some("end_turn"));
    assert_eq!(result.dispatches.len(), 1);
    let results = &result.dispatches[0];
    assert_eq!(ids(results), ["t1", "t2", "t3", "t4", "t5"]);
    assert_eq!(
        outcomes(results),
        [
            "ok",
            "unknown_tool",
            "ok",
            "execution_error",
            "invalid_arguments"
        ]
    );
    assert_eq!(
        counter.load(Ordering::SeqCst),
        1,
        "executed through the registry"
    );

    let requests = provider.requests();
    assert_eq!(requests.len(), 2);
    let catalog = engine.catalog(CatalogFormat::Anthropic).await.unwrap();
    for request in &requests {
        assert_eq!(request.tools, catalog);
        assert_eq!(request.model, MODEL);
        assert_eq!(request.system, "be brief");
        assert_eq!(request.max_tokens, 1000);
    }
    assert_eq!(
        requests[0].messages,
        [json!({"role": "user", "content": "do the thing"})]
    );

    let second = &requests[1].messages;
    assert_eq!(second.len(), 3);
    assert_eq!(second[1]["role"], "assistant");
    let last = second.last().unwrap();
    assert_eq!(*last, encode_anthropic(results));
    assert_eq!(last["role"], "user");
    let blocks = last["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 5);
    for (block, result) in blocks.iter().zip(results) {
        assert_eq!(block["type"], "tool_result");
        assert_eq!(block["tool_use_id"], *result.tool_use_id);
        assert_eq!(block["content"], result.content);
        if result.is_ok() {
            assert!(block.get("is_error").is_none(), "{block}");
        } else {
            assert_eq!(block["is_error"], true, "{block}");
        }
    }
    assert_eq!(blocks[0]["content"], "echo:hello");

    // The history the agent keeps is the one it sent, plus the final answer.
    assert_eq!(agent.history().len(), 4);
    assert_eq!(&agent.history()[..3], &second[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_registered_at_runtime_is_advertised_on_the_next_model_call() {
    let counter = Arc::new(AtomicUsize::new(0));
    let engine = test_engine(Arc::clone(&counter));
    let provider = Arc::new(ScriptedProvider::new([answer(
        vec![text("nothing to do")],
        "end_turn",
    )]));
    engine.register(echo_tool("late_echo")).await.unwrap();
    let mut agent = AgentLoop::new(engine.session(), provider.clone(), config(3)).unwrap();
    agent.run("hi").await.unwrap();
    let tools = &provider.requests()[0].tools;
    assert_eq!(tools.len(), 4);
    assert_eq!(tools[3]["name"], "late_echo");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_tokens_without_tool_calls_stops_the_loop_as_max_tokens() {
    let engine = test_engine(Arc::default());
    let provider = Arc::new(ScriptedProvider::new([answer(
        vec![text("I was cut o")],
        "max_tokens",
    )]));
    let mut agent = AgentLoop::new(engine.session(), provider, config(8)).unwrap();
    let result = agent.run("write a novel").await.unwrap();
    assert_eq!(result.stop_reason, StopReason::MaxTokens);
    assert_eq!(result.stop_reason.as_str(), "max_tokens");
    assert_eq!(result.turns, 1);
    assert_eq!(result.tool_calls, 0);
    assert_eq!(result.final_text, "I was cut o");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_keeps_calling_tools_is_stopped_at_max_turns() {
    let counter = Arc::new(AtomicUsize::new(0));
    let engine = test_engine(Arc::clone(&counter));
    let provider = Arc::new(ScriptedProvider::new((0..5).map(|i| {
        answer(
            vec![
                text(&format!("turn {i}")),
                tool_use(&format!("a{i}"), "count", json!({})),
                tool_use(&format!("b{i}"), "count", json!({})),
            ],
            "tool_use",
        )
    })));
    let mut agent = AgentLoop::new(engine.session(), provider.clone(), config(2)).unwrap();
    let result = agent.run("loop forever").await.unwrap();
    assert_eq!(result.stop_reason, StopReason::MaxTurns);
    assert_eq!(result.stop_reason.as_str(), "max_turns");
    assert_eq!(result.turns, 2);
    assert_eq!(result.tool_calls, 4);
    assert_eq!(result.dispatches.len(), 2);
    assert_eq!(ids(&result.dispatches[1]), ["a1", "b1"]);
    assert_eq!(counter.load(Ordering::SeqCst), 4);
    assert_eq!(provider.requests().len(), 2, "no third model call");
    assert_eq!(result.final_text, "turn 1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_turns_of_zero_is_refused() {
    let engine = test_engine(Arc::default());
    let provider = Arc::new(ScriptedProvider::new([]));
    let refused = AgentLoop::new(engine.session(), provider, config(0));
    assert_eq!(refused.err(), Some(AgentError::InvalidMaxTurns));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loop_runs_as_an_actor_answering_run_prompt() {
    let counter = Arc::new(AtomicUsize::new(0));
    let engine = test_engine(Arc::clone(&counter));
    let provider = Arc::new(ScriptedProvider::new([
        answer(
            vec![tool_use("x1", "echo", json!({"text": "via actor"}))],
            "tool_use",
        ),
        answer(vec![text("done via actor")], "end_turn"),
        answer(vec![tool_use("y1", "count", json!({}))], "tool_use"),
        answer(vec![text("second prompt done")], "end_turn"),
    ]));
    let agent = AgentLoop::new(engine.session(), provider.clone(), config(4)).unwrap();
    let actor = AgentLoop::spawn(agent);

    let first = tokio::time::timeout(TURN_BOUND, actor.ask(RunPrompt("first".into())))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.stop_reason, StopReason::FinalAnswer);
    assert_eq!(first.turns, 2);
    assert_eq!(first.tool_calls, 1);
    assert_eq!(first.final_text, "done via actor");
    assert_eq!(first.dispatches[0][0].content, "echo:via actor");

    let second = tokio::time::timeout(TURN_BOUND, actor.ask(RunPrompt("second".into())))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.final_text, "second prompt done");
    assert_eq!(second.tool_calls, 1);
    assert_eq!(counter.load(Ordering::SeqCst), 1);

    // The actor kept one history across both prompts.
    let requests = provider.requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[2].messages.len(), 5);
    assert_eq!(
        requests[2].messages[4],
        json!({"role": "user", "content": "second"})
    );
    let _ = actor.stop_gracefully().await;
}
