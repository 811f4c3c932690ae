"""What dispatch accepts and returns: SDK objects nested in dicts, None for a message without
tool calls, and the OpenAI loop that extends the history."""

import asyncio
import json

import pytest

from switchboard_client import AsyncClient, Client

from _helpers import anthropic_message


def test_anthropic_sdk_blocks_nested_in_a_dict(server, token):
    anthropic = pytest.importorskip("anthropic")
    response = anthropic_message(anthropic, "msg_1", [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "echo n"}},
        {"type": "tool_use", "id": "toolu_2", "name": "glob", "input": {"pattern": "*"}},
    ], "tool_use")
    assert isinstance(response.content[1], anthropic.types.ToolUseBlock)
    with Client(server.base_url, token=token) as client, client.session() as session:
        message = {"role": "assistant", "content": response.content}
        answer = session.dispatch(message)
        assert [b["tool_use_id"] for b in answer["content"]] == ["toolu_1", "toolu_2"]
        assert answer["content"][0]["content"] == "n"
        # A bare list of SDK blocks, and a block list nested deeper in a dict.
        assert session.dispatch(list(response.content))["content"][1]["content"] == "(no matches)"


def test_no_tool_use_returns_none(server, token):
    anthropic = pytest.importorskip("anthropic")
    final = anthropic_message(anthropic, "msg_2", [{"type": "text", "text": "Done."}],
                              "end_turn")
    with Client(server.base_url, token=token) as client, client.session() as session:
        assert session.dispatch(final) is None
        assert session.dispatch({"role": "assistant", "content": final.content}) is None
        assert session.dispatch({"role": "assistant", "content": "just text"}) is None
        assert session.dispatch({"role": "assistant", "content": "hi", "tool_calls": None}) is None
        assert session.dispatch({"role": "assistant", "content": "hi", "tool_calls": []},
                                format="openai") is None
        assert not session.created  # nothing was sent

    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with client.session() as session:
                assert await session.dispatch(final) is None

    asyncio.run(main())


def test_openai_sdk_objects_nested_and_the_extend_loop(server, token):
    openai = pytest.importorskip("openai")
    from openai.types.chat import ChatCompletion, ChatCompletionMessageToolCall

    call = ChatCompletionMessageToolCall.model_validate(
        {"id": "call_1", "type": "function",
         "function": {"name": "bash", "arguments": json.dumps({"command": "echo o"})}})
    completion = ChatCompletion.model_validate({
        "id": "c", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": None, "tool_calls": [
                {"id": "call_2", "type": "function",
                 "function": {"name": "glob", "arguments": "{\"pattern\": \"*\"}"}}]}}],
    })
    with Client(server.base_url, token=token) as client, client.session() as session:
        messages = [{"role": "user", "content": "go"}]
        nested = {"role": "assistant", "content": None, "tool_calls": [call]}
        messages.append(nested)
        messages.extend(session.dispatch(nested))
        assert messages[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "o"}
        # The completion itself, and its message object.
        messages.append(completion.choices[0].message)
        messages.extend(session.dispatch(completion.choices[0].message))
        assert messages[-1]["tool_call_id"] == "call_2"
        assert session.dispatch(completion)[0]["tool_call_id"] == "call_2"
        # A final answer without tool calls: None, and the loop stops.
        done = openai.types.chat.ChatCompletionMessage.model_validate(
            {"role": "assistant", "content": "finished"})
        assert session.dispatch(done) is None
