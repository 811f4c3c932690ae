//! Deferred client tools over HTTP: a session's catalog in both shapes, `tool_search` answered
//! as `tool_reference` blocks (Anthropic) or definitions as text (OpenAI), and the OpenAI
//! catalog growing by what was found.

use crate::serve_common;

use serde_json::{Value, json};
use serve_common::*;

fn client_tool(name: &str, description: &str, defer: Value) -> Value {
    json!({
        "name": name,
        "description": description,
        "input_schema": {"type": "object", "properties": {"id": {"type": "string"}}},
        "defer": defer,
    })
}

fn names(catalog: &Value) -> Vec<String> {
    catalog
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t.get("name")
                .or_else(|| t.pointer("/function/name"))
                .and_then(Value::as_str)
                .unwrap()
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deferred_client_tools_are_found_by_search_and_join_the_openai_catalog() {
    let s = start(|_| {}).await;
    let c = client();
    let tools = json!([
        client_tool(
            "crm_lookup",
            "Look up a customer record in the CRM.",
            json!("always")
        ),
        client_tool(
            "billing_refund",
            "Refund an invoice to the customer.",
            json!("always")
        ),
        client_tool("ping", "Answer pong.", json!("never")),
    ]);
    let a = post(
        &c,
        &s.url("/v1/sessions"),
        &json!({"tools": tools}).to_string(),
    )
    .await;
    assert_eq!(a.status, 201, "{}", a.text);
    let id = a.json()["session_id"].as_str().unwrap().to_string();

    let anthropic = get(&c, &s.url(&format!("/v1/sessions/{id}/tools")))
        .await
        .json();
    assert_eq!(names(&anthropic)[0], "tool_search");
    let deferred: Vec<&str> = anthropic
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["defer_loading"] == json!(true))
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(deferred, ["crm_lookup", "billing_refund"]);
    let openai_url = s.url(&format!("/v1/sessions/{id}/tools?format=openai"));
    let before = names(&get(&c, &openai_url).await.json());
    assert!(!before.contains(&"crm_lookup".to_string()), "{before:?}");
    assert!(before.contains(&"ping".to_string()));

    // Anthropic shape: the search's result carries tool_reference blocks.
    let a = dispatch(
        &c,
        &s,
        &id,
        &turn(&[(
            "s1",
            "tool_search",
            json!({"query": "refund an invoice", "max_results": 1}),
        )]),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let content = &a.json()["content"][0]["content"];
    assert_eq!(
        content[1],
        json!({"type": "tool_reference", "tool_name": "billing_refund"}),
        "{content}"
    );
    // OpenAI shape: the definition as text.
    let openai = json!({"role": "assistant", "tool_calls": [{"id": "o1", "type": "function",
        "function": {"name": "tool_search", "arguments": "{\"query\":\"select:crm_lookup\"}"}}]});
    let a = post(
        &c,
        &s.url(&format!("/v1/sessions/{id}/dispatch?format=openai")),
        &openai.to_string(),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let text = a.json()[0]["content"].as_str().unwrap().to_string();
    assert!(text.contains(r#""name":"crm_lookup""#), "{text}");
    assert!(text.contains("Look up a customer record"), "{text}");

    // Both found tools now appended to the OpenAI catalog, in the order found.
    let after = names(&get(&c, &openai_url).await.json());
    let mut want = before.clone();
    want.extend(["billing_refund".to_string(), "crm_lookup".to_string()]);
    assert_eq!(after, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_defer_mark_or_a_tool_named_tool_search_is_refused() {
    let s = start(|_| {}).await;
    let c = client();
    for (tools, want) in [
        (
            json!([client_tool("a", "d", json!("later"))]),
            "client tool `a`: `defer` must be \"never\", \"auto\" or \"always\"",
        ),
        (
            json!([{"name": "a", "input_schema": {"type": "object"}, "defer": "never",
                    "defer_loading": true}]),
            "client tool `a`: `defer` and `defer_loading` disagree",
        ),
        (
            json!([{"name": "tool_search", "input_schema": {"type": "object"}}]),
            "client tool `tool_search`: the name is the engine's own search",
        ),
    ] {
        let a = post(
            &c,
            &s.url("/v1/sessions"),
            &json!({"tools": tools}).to_string(),
        )
        .await;
        assert_eq!(a.status, 400, "{}", a.text);
        let message = a.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(message.starts_with(want), "{message}");
    }
}
