//! The two HTTP providers described by their wire shapes, so the provider suite writes each test
//! once and runs it for both: how a scripted turn and an error reply look on each wire, how each
//! provider is built against the mock server, and what each must send back (its request path
//! and headers, where the system prompt goes, how the assistant's calls and the tool results are
//! echoed into the history). The expected request shapes are written out here from each API's
//! documentation, not computed by the library under test; results are compared with the
//! library's encoders (`encode_anthropic`, `encode_openai`), which have tests of their own.

use std::sync::Arc;

use serde_json::{Value, json};
use switchboard::CatalogFormat;
use switchboard::ToolDispatchResult;
use switchboard::agent::{
    ANTHROPIC_BASE_URL, AnthropicProvider, HttpConfig, OPENAI_BASE_URL, OpenAiProvider, RetryPolicy,
};
use switchboard::agent::{Provider, ProviderError};
use switchboard::protocol::{encode_anthropic, encode_openai};

use super::mock_server::{MockServer, MockTurn, Recorded};
use super::model::{completion, fast_retry, http_config, message, text, tool_use};

/// One of the two HTTP providers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// Anthropic Messages (`POST /v1/messages`).
    Anthropic,
    /// OpenAI Chat Completions and compatible servers (`POST /v1/chat/completions`).
    OpenAi,
}

/// Why the model stopped, in neutral terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// It asked for tools (`tool_use` / `tool_calls`).
    ToolUse,
    /// It finished (`end_turn` / `stop`).
    EndTurn,
    /// It ran out of tokens (`max_tokens` / `length`).
    MaxTokens,
}

/// A call as the model wrote it: id, tool name and argument text (which may not be JSON).
pub type Call<'a> = (&'a str, &'a str, &'a str);

impl Wire {
    /// The name the provider gives itself in errors.
    pub fn name(self) -> &'static str {
        match self {
            Wire::Anthropic => "anthropic",
            Wire::OpenAi => "openai",
        }
    }

    /// The variable holding the provider's key.
    pub fn key_variable(self) -> &'static str {
        match self {
            Wire::Anthropic => "ANTHROPIC_API_KEY",
            Wire::OpenAi => "OPENAI_API_KEY",
        }
    }

    /// The provider's public endpoint.
    pub fn public_url(self) -> &'static str {
        match self {
            Wire::Anthropic => ANTHROPIC_BASE_URL,
            Wire::OpenAi => OPENAI_BASE_URL,
        }
    }

    /// Whether a custom (local) base URL still needs a key: Anthropic's does, an
    /// OpenAI-compatible local server does not.
    pub fn local_server_needs_a_key(self) -> bool {
        self == Wire::Anthropic
    }

    /// Whether a turn can carry argument text that is not JSON: always on OpenAI (arguments are
    /// a string), only streamed on Anthropic (a whole Messages response carries parsed `input`).
    pub fn can_send_unparsable_arguments(self, stream: bool) -> bool {
        stream || self == Wire::OpenAi
    }

    /// The base URL of a server at `origin` (`http://host:port`) for this provider.
    pub fn base_url(self, origin: &str) -> String {
        match self {
            Wire::Anthropic => origin.to_string(),
            Wire::OpenAi => format!("{origin}/v1"),
        }
    }

    /// The base URL of `server` for this provider.
    pub fn url(self, server: &MockServer) -> String {
        match self {
            Wire::Anthropic => server.anthropic_url(),
            Wire::OpenAi => server.openai_url(),
        }
    }

    /// The provider for `config`.
    pub fn provider_for(self, config: HttpConfig) -> Result<Arc<dyn Provider>, ProviderError> {
        Ok(match self {
            Wire::Anthropic => Arc::new(AnthropicProvider::new(config)?),
            Wire::OpenAi => Arc::new(OpenAiProvider::new(config)?),
        })
    }

    /// The provider at `url` with the key `test-key` and `retry`.
    pub fn provider_at(self, url: String, retry: RetryPolicy) -> Arc<dyn Provider> {
        self.provider_for(http_config(url, retry)).unwrap()
    }

    /// The provider talking to `server`, with fast retries.
    pub fn provider(self, server: &MockServer) -> Arc<dyn Provider> {
        self.provider_at(self.url(server), fast_retry())
    }

    /// The catalog shape the provider sends as `tools`.
    pub fn catalog_format(self) -> CatalogFormat {
        match self {
            Wire::Anthropic => CatalogFormat::Anthropic,
            Wire::OpenAi => CatalogFormat::OpenAi,
        }
    }

    /// A scripted answer: optional text, then `calls`, then `stop`. On Anthropic, argument text
    /// that is not JSON is streamed as is (`raw_input`).
    pub fn turn(self, text_part: Option<&str>, calls: &[Call], stop: Stop) -> MockTurn {
        match self {
            Wire::Anthropic => {
                let mut content: Vec<Value> = text_part.map(text).into_iter().collect();
                for (id, name, args) in calls {
                    content.push(match serde_json::from_str::<Value>(args) {
                        Ok(input) => tool_use(id, name, input),
                        Err(_) => {
                            let mut block = tool_use(id, name, json!({}));
                            block["raw_input"] = (*args).into();
                            block
                        }
                    });
                }
                let stop = match stop {
                    Stop::ToolUse => "tool_use",
                    Stop::EndTurn => "end_turn",
                    Stop::MaxTokens => "max_tokens",
                };
                MockTurn::anthropic(message(content, stop))
            }
            Wire::OpenAi => {
                let finish = match stop {
                    Stop::ToolUse => "tool_calls",
                    Stop::EndTurn => "stop",
                    Stop::MaxTokens => "length",
                };
                MockTurn::openai(completion(text_part, calls, finish))
            }
        }
    }

    /// A final answer of `text_part`.
    pub fn final_answer(self, text_part: &str) -> MockTurn {
        self.turn(Some(text_part), &[], Stop::EndTurn)
    }

    /// An error status whose body is the provider's error document of `kind` and `message`.
    pub fn error(self, status: u16, headers: &[(&str, &str)], kind: &str, msg: &str) -> MockTurn {
        let body = match self {
            Wire::Anthropic => json!({"type":"error","error":{"type":kind,"message":msg}}),
            Wire::OpenAi => json!({"error":{"message":msg,"type":kind,"code":null}}),
        };
        MockTurn::status(status, headers, body)
    }

    /// Asserts the request went to the provider's path with its key and version headers.
    pub fn assert_endpoint_and_key(self, req: &Recorded) {
        match self {
            Wire::Anthropic => {
                assert_eq!(req.path, "/v1/messages");
                assert_eq!(req.headers["x-api-key"], "test-key");
                assert_eq!(req.headers["anthropic-version"], "2023-06-01");
            }
            Wire::OpenAi => {
                assert_eq!(req.path, "/v1/chat/completions");
                assert_eq!(req.headers["authorization"], "Bearer test-key");
            }
        }
    }

    /// The system prompt of a request body (Anthropic: `system`; OpenAI: a first message of role
    /// `system`, asserted to be there).
    pub fn system_prompt(self, body: &Value) -> Value {
        match self {
            Wire::Anthropic => body["system"].clone(),
            Wire::OpenAi => {
                assert_eq!(body["messages"][0]["role"], "system", "{body}");
                body["messages"][0]["content"].clone()
            }
        }
    }

    /// The conversation of a request body, without the OpenAI system message: the user's
    /// prompt, then per turn the assistant's message and its results.
    pub fn conversation(self, body: &Value) -> Vec<Value> {
        let messages = body["messages"].as_array().unwrap();
        match self {
            Wire::Anthropic => messages.clone(),
            Wire::OpenAi => messages[1..].to_vec(),
        }
    }

    /// The user's prompt as the first message of the conversation.
    pub fn prompt_message(self, prompt: &str) -> Value {
        json!({"role": "user", "content": prompt})
    }

    /// The assistant's message as it must come back in the history: its text and its calls, with
    /// arguments that are not JSON sent back as an empty object.
    pub fn assistant_message(self, text_part: Option<&str>, calls: &[Call]) -> Value {
        let input = |args: &str| serde_json::from_str::<Value>(args).unwrap_or_else(|_| json!({}));
        match self {
            Wire::Anthropic => {
                let mut content: Vec<Value> = text_part.map(text).into_iter().collect();
                content.extend(
                    calls
                        .iter()
                        .map(|(id, name, args)| tool_use(id, name, input(args))),
                );
                json!({"role": "assistant", "content": content})
            }
            Wire::OpenAi => {
                let tool_calls: Vec<Value> = calls
                    .iter()
                    .map(|(id, name, args)| {
                        json!({"id": id, "type": "function",
                               "function": {"name": name, "arguments": input(args).to_string()}})
                    })
                    .collect();
                json!({"role": "assistant", "content": text_part, "tool_calls": tool_calls})
            }
        }
    }

    /// The messages that carry a turn's results back: one user message of `tool_result` blocks
    /// (Anthropic), one `role: tool` message per call (OpenAI).
    pub fn result_messages(self, results: &[ToolDispatchResult]) -> Vec<Value> {
        match self {
            Wire::Anthropic => vec![encode_anthropic(results)],
            Wire::OpenAi => encode_openai(results).as_array().unwrap().clone(),
        }
    }
}
