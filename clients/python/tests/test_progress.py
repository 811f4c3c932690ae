"""Live progress through the Python client against the real server: a 4-second command that
prints a line every 200 ms reaches ``on_progress`` (sync and asyncio, plain and coroutine
callbacks) and ``stream.events()`` line by line before its result, with the answer unchanged;
a retry answered from the session's memory reports none."""

import asyncio
import time

import pytest

from switchboard_client import AsyncClient, Client

LOOP = "for i in $(seq 1 20); do echo line $i; sleep 0.2; done"


def tool_use(id, name, input):
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


def output(events, stream="stdout"):
    return "".join(e["text"] for e in events if e["kind"] == "output" and e["stream"] == stream)


def test_on_progress_gets_a_running_command_s_lines_before_the_answer(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        msg = assistant(tool_use("loop", "bash", {"command": LOOP + "; echo warn >&2"}))
        events = []
        answer = session.dispatch(msg, on_progress=events.append)
        assert len(events) >= 15, events
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert all(e["tool_use_id"] == "loop" for e in events)
        assert output(events) == "".join(f"line {i}\n" for i in range(1, 21))
        assert output(events, "stderr") == "warn\n"
        block = answer["content"][0]
        assert block["content"].startswith("line 1\n") and block["content"].endswith("warn")
        # The same turn again: answered from the session's memory, nothing ran, no progress.
        again = []
        assert session.dispatch(msg, on_progress=again.append) == answer
        assert again == []
        # Without on_progress the dispatch is a plain request, with the same answer.
        assert session.dispatch(msg) == answer


def test_stream_events_interleave_progress_and_results_in_order(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        msg = assistant(
            tool_use("quick", "glob", {"pattern": "*"}),
            tool_use("loop", "bash", {"command": "echo one; sleep 0.3; echo two"}),
        )
        stream = session.stream(msg)
        kinds = list(stream.events())
        loop_result = next(i for i, (k, v) in enumerate(kinds) if k == "result" and v[0] == 1)
        progress = [i for i, (k, _) in enumerate(kinds) if k == "progress"]
        assert progress and max(progress) < loop_result, kinds
        assert output([v for k, v in kinds if k == "progress"]) == "one\ntwo\n"
        assert stream.answer["content"][1]["content"] == "one\ntwo"
        with pytest.raises(RuntimeError):
            stream.events()
        # Iterating a stream for its results alone asks for no progress, and sees none.
        plain = session.stream(assistant(tool_use("p", "bash", {"command": "echo p"})))
        assert [r["tool_use_id"] for _, r in plain] == ["p"]


def test_asyncio_on_progress_may_be_a_coroutine_and_events_iterate(server, token):
    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with client.session() as session:
                seen = []

                async def on_progress(event):
                    await asyncio.sleep(0)
                    seen.append(event)

                msg = assistant(tool_use("loop", "bash", {"command": LOOP}))
                answer = await session.dispatch(msg, on_progress=on_progress)
                assert len(seen) >= 15, seen
                assert output(seen) == "".join(f"line {i}\n" for i in range(1, 21))
                assert answer["content"][0]["content"].endswith("line 20")
                stream = session.stream(assistant(
                    tool_use("two", "bash", {"command": "echo a; sleep 0.2; echo b"})))
                kinds = [k async for k, _ in stream.events()]
                assert kinds.count("progress") >= 2 and kinds[-1] == "result", kinds
                turn = session.start(assistant(
                    tool_use("t", "bash", {"command": "echo started; sleep 0.2"})),
                    on_progress=seen.append)
                await turn
                assert seen[-1]["tool_use_id"] == "t" and seen[-1]["text"] == "started\n"

    asyncio.run(main())


def test_a_client_tool_reports_its_progress_through_its_context(server, token):
    """A Python client tool reports output and values through its ``ToolCallContext``; they
    reach ``on_progress`` under the call's id, before its result, and the answer is what the
    function returned."""
    from switchboard_client import ToolCallContext

    with Client(server.base_url, token=token) as client, client.session() as session:
        @session.tool
        def build(target: str, ctx: ToolCallContext) -> str:
            """Builds a target."""
            for i in range(1, 4):
                ctx.output(f"step {i} of {target}\n")
                ctx.progress(i, 3, f"step {i}")
                time.sleep(0.1)
            ctx.output("a warning\n", stream="stderr")
            return f"built {target}"

        events = []
        answer = session.dispatch(assistant(tool_use("b", "build", {"target": "app"})),
                                  on_progress=events.append)
        assert answer["content"][0]["content"] == "built app"
        assert {e["tool_use_id"] for e in events} == {"b"}
        assert output(events) == "".join(f"step {i} of app\n" for i in (1, 2, 3))
        assert output(events, "stderr") == "a warning\n"
        values = [e["progress"] for e in events if e["kind"] == "progress"]
        assert values and values[-1] == 3, events
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


def test_an_async_client_tool_reports_its_progress_too(server, token):
    from switchboard_client import ToolCallContext

    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with client.session() as session:
                @session.tool
                async def fetch(url: str, ctx: ToolCallContext) -> str:
                    """Fetches a URL."""
                    for i in range(1, 4):
                        ctx.progress(i * 10, 30, "downloading")
                        await asyncio.sleep(0.1)
                    ctx.output("fetched\n")
                    return f"got {url}"

                events = []
                answer = await session.dispatch(
                    assistant(tool_use("f", "fetch", {"url": "x"})), on_progress=events.append)
                assert answer["content"][0]["content"] == "got x"
                values = [e["progress"] for e in events if e["kind"] == "progress"]
                assert values and values[-1] == 30, events
                assert output(events) == "fetched\n"

    asyncio.run(main())
