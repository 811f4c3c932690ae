"""The Python client against the real server: dispatch in both formats and from SDK objects,
streaming, cancellation, sessions as context managers, errors, and the asyncio client."""

import asyncio
import json
import os
import threading
import time

import pytest

from switchboard_client import AsyncClient, Client, SwitchboardError

from _helpers import anthropic_message


def tool_use(id, name, input):
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


def test_dispatch_returns_the_user_message_to_append(server, token):
    with Client(server.base_url, token=token) as client, client.session("proj") as session:
        assert session.workspace.endswith("/ws/proj")
        answer = session.dispatch(assistant(
            tool_use("a", "write_file", {"path": "x.txt", "content": "hi"}),
            tool_use("b", "read_file", {"path": "x.txt"}),
            tool_use("c", "nope", {}),
        ))
        assert answer["role"] == "user"
        blocks = answer["content"]
        assert [b["tool_use_id"] for b in blocks] == ["a", "b", "c"]
        assert blocks[1]["content"] == "hi"
        assert blocks[2]["is_error"] is True
        assert blocks[2]["content"].startswith("Error [unknown_tool]")
        info = session.info()
        assert (info["turns"], info["calls"], info["in_flight"]) == (1, 3, 0)


def test_openai_messages_in_and_tool_messages_out(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "write_file", "arguments": json.dumps({"path": "o.txt", "content": "o"})}},
            {"id": "call_2", "type": "function",
             "function": {"name": "read_file", "arguments": "{broken"}},
        ]}
        out = session.dispatch(message)  # the format is detected
        assert out[0] == {"role": "tool", "tool_call_id": "call_1", "content": "Wrote 1 bytes to o.txt"}
        assert out[1]["content"].startswith("Error [invalid_arguments]")
        assert session.dispatch(json.dumps(message), format="openai")[0]["tool_call_id"] == "call_1"


def test_the_anthropic_sdk_message_object_is_accepted(server, token):
    anthropic = pytest.importorskip("anthropic")
    response = anthropic_message(anthropic, "msg_1", [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "glob", "input": {"pattern": "*"}},
    ], "tool_use")
    with Client(server.base_url, token=token) as client, client.session() as session:
        messages = [{"role": "assistant", "content": response.content}]
        messages.append(session.dispatch(response))
        assert messages[-1]["content"][0]["tool_use_id"] == "toolu_1"
        assert messages[-1]["content"][0]["content"] == "(no matches)"


def test_the_openai_sdk_message_object_is_accepted(server, token):
    openai = pytest.importorskip("openai")
    message = openai.types.chat.ChatCompletionMessage.model_validate({
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_9", "type": "function",
                        "function": {"name": "glob", "arguments": "{\"pattern\": \"*\"}"}}],
    })
    with Client(server.base_url, token=token) as client, client.session() as session:
        out = session.dispatch(message)
        assert out == [{"role": "tool", "tool_call_id": "call_9", "content": "(no matches)"}]


def test_stream_yields_each_result_as_it_finishes_then_the_answer(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        msg = assistant(
            tool_use("slow", "bash", {"command": "sleep 0.3; echo slow"}),
            tool_use("bad", "no_such_tool", {}),
            tool_use("fast", "glob", {"pattern": "*"}),
        )
        stream = session.stream(msg)
        seen = [(i, r["tool_use_id"]) for i, r in stream]
        # The refused call is answered before the bash call finishes.
        assert seen == [(1, "bad"), (0, "slow"), (2, "fast")]
        assert stream.answer["content"][0]["content"] == "slow"
        assert stream.answer == session.dispatch(msg)


def test_cancel_answers_a_long_command_cancelled(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        result = {}

        def run():
            result["answer"] = session.dispatch(assistant(
                tool_use("s", "bash", {"command": "touch started; sleep 30"})))

        worker = threading.Thread(target=run)
        worker.start()
        started = os.path.join(session.workspace, "started")
        deadline = time.monotonic() + 20
        while not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.path.exists(started)
        session.cancel()
        worker.join(timeout=20)
        assert not worker.is_alive()
        block = result["answer"]["content"][0]
        assert block["is_error"] is True and block["content"].startswith("Error [cancelled]")


def test_a_closed_session_is_gone(server, token):
    with Client(server.base_url, token=token) as client:
        with client.session() as session:
            session.dispatch(assistant(tool_use("g", "glob", {"pattern": "*"})))
        with pytest.raises(SwitchboardError) as e:
            session.dispatch(assistant(tool_use("g", "glob", {"pattern": "*"})))
        assert (e.value.code, e.value.status) == ("unknown_session", 404)
        session.close()  # closing twice is fine


def test_errors_carry_the_server_code(server, token):
    with Client(server.base_url, token="wrong") as bad:
        with pytest.raises(SwitchboardError) as e:
            bad.session().create()  # sessions are created on first use
        assert (e.value.code, e.value.status) == ("unauthorized", 401)
    with Client(server.base_url, token=token) as client:
        with pytest.raises(SwitchboardError) as e:
            client.session("../escape").create()
        assert e.value.code == "bad_request"
        with client.session() as session:
            with pytest.raises(SwitchboardError) as e:
                session.dispatch({"not": "a turn"})
            assert e.value.code == "bad_request"
        health = client.health()
        assert health["status"] == "ok"
        assert health["sandbox"]["mode"] in ("workspace-write", "read-only", "best-effort", "off")
        assert {t["name"] for t in client.tools()} >= {"bash", "read_file"}
    with Client("http://127.0.0.1:9", token=token) as nowhere:
        with pytest.raises(SwitchboardError) as e:
            nowhere.health()
        assert e.value.code == "connection_error"


def test_the_async_client_does_the_same(server, token):
    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with await client.session() as session:
                answer = await session.dispatch(assistant(
                    tool_use("w", "write_file", {"path": "a.txt", "content": "async"}),
                    tool_use("r", "read_file", {"path": "a.txt"})))
                assert answer["content"][1]["content"] == "async"
                # A new call, a new id (a session answers an id it has seen from its answers).
                stream = session.stream(assistant(tool_use("r2", "read_file", {"path": "a.txt"})))
                seen = [(i, r["content"]) async for i, r in stream]
                assert seen == [(0, "async")]
                assert stream.answer["content"][0]["content"] == "async"
                others = await asyncio.gather(*[
                    session.dispatch(assistant(tool_use(f"g{i}", "glob", {"pattern": "*.txt"})))
                    for i in range(8)])
                assert all(o["content"][0]["content"] == "a.txt" for o in others)
            with pytest.raises(SwitchboardError) as e:
                await session.info()
            assert e.value.code == "unknown_session"

    asyncio.run(main())
