"""Every client-tool call carries its idempotency key: the function gets it in a parameter
annotated ``ToolCallContext`` (left out of the schema) or from ``current_call()``, with the sync
and the async client; it is the key of the session and the ``tool_use_id``, the one bash sees
in ``SWITCHBOARD_IDEMPOTENCY_KEY``, and another for another id or another session."""

import asyncio
import threading
from typing import Optional

from switchboard_client import (AsyncClient, Client, ToolCallContext, current_call,
                                idempotency_key, tool_spec)


def tool_use(id, name, input):
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


def test_the_key_is_the_servers_derivation():
    # The values the engine's own unit test pins (src/tool/idempotency.rs).
    assert idempotency_key("s1", "toolu_01") == "sb1-5101c8b18443bad9a910fa8df6d0bf15"
    assert idempotency_key("s1", "toolu_01", "turn-7") == "sb1-a3ae66e59b6a98861d3c286fc5657a5b"
    assert idempotency_key("a", "") == "sb1-581994b12e108d90279611240e90f9fa"


def test_a_context_parameter_is_not_part_of_the_schema():
    def charge(order_id: str, amount_cents: int, ctx: ToolCallContext) -> str:
        """Charges an order."""
        return ""

    def maybe(order_id: str, call: Optional[ToolCallContext] = None) -> str:
        """Looks an order up."""
        return ""

    schema = tool_spec(charge)["input_schema"]
    assert schema["properties"].keys() == {"order_id", "amount_cents"}
    assert schema["required"] == ["order_id", "amount_cents"]
    assert tool_spec(maybe)["input_schema"]["properties"].keys() == {"order_id"}


def test_sync_tools_get_the_key_in_their_context_and_from_current_call(server, token):
    seen = {}
    runs = []
    lock = threading.Lock()
    with Client(server.base_url, token=token) as client, \
            client.session() as one, client.session() as two:
        for session in (one, two):
            @session.tool
            def charge(order_id: str, ctx: ToolCallContext) -> str:
                """Charges an order."""
                with lock:
                    seen[(ctx.tool_use_id, order_id)] = ctx
                    runs.append(ctx.tool_use_id)
                return ctx.idempotency_key

            @session.tool
            def plain(order_id: str) -> str:
                """Reads the key without a context parameter."""
                call = current_call()
                return call.idempotency_key if call else "none"

        msg = assistant(tool_use("t1", "charge", {"order_id": "A-1"}),
                        tool_use("t2", "charge", {"order_id": "A-2"}),
                        tool_use("t3", "plain", {"order_id": "A-3"}),
                        tool_use("t4", "bash", {"command": 'printf %s "$SWITCHBOARD_IDEMPOTENCY_KEY"'}))
        answer = one.dispatch(msg, turn_id="turn-1")
        keys = [b["content"] for b in answer["content"]]
        assert keys == [idempotency_key(one.id, f"t{i}", "turn-1") for i in range(1, 5)]
        assert len(set(keys)) == 4
        ctx = seen[("t1", "A-1")]
        assert ctx.name == "charge" and ctx.call_id and ctx.deadline_ms > 0
        assert current_call() is None  # only while a tool runs

        # The same ids in another session: other keys.
        other = two.dispatch(assistant(tool_use("t1", "charge", {"order_id": "A-1"})),
                             turn_id="turn-1")
        assert other["content"][0]["content"] == idempotency_key(two.id, "t1", "turn-1")
        assert other["content"][0]["content"] != keys[0]

        # The turn sent again: the stored answer, the function not called again.
        calls = len(seen)
        assert one.dispatch(msg, turn_id="turn-1") == answer
        assert len(seen) == calls
        # Without a turn id the client names the turn after the message: sent twice, one turn.
        first = one.dispatch(assistant(tool_use("t9", "charge", {"order_id": "A-9"})))
        again = one.dispatch(assistant(tool_use("t9", "charge", {"order_id": "A-9"})))
        assert first == again and runs.count("t9") == 1


def test_async_tools_get_the_key_in_coroutines_and_worker_threads(server, token):
    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with client.session() as session:
                @session.tool
                async def coro(x: int, ctx: ToolCallContext) -> str:
                    """A coroutine tool."""
                    await asyncio.sleep(0)
                    call = current_call()
                    assert call is ctx
                    return ctx.idempotency_key

                @session.tool
                def threaded(x: int) -> str:
                    """A plain tool, run in a worker thread."""
                    return current_call().idempotency_key

                answer = await session.dispatch(assistant(
                    tool_use("a1", "coro", {"x": 1}), tool_use("a2", "threaded", {"x": 2})),
                    turn_id="turn-a")
                return session.id, [b["content"] for b in answer["content"]]

    session_id, keys = asyncio.run(main())
    assert keys == [idempotency_key(session_id, "a1", "turn-a"),
                    idempotency_key(session_id, "a2", "turn-a")]
