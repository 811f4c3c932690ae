"""Turn handles and turn-addressed cancel: a turn started in the background under a client
turn id is cancelled from another thread or task, or before its dispatch reached the server."""

import asyncio
import os
import threading
import time

import pytest

from switchboard_client import AsyncClient, Client, SwitchboardError


def tool_use(id, name, input):
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


def wait_for(path, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.path.exists(path)


def sleeper(marker="started"):
    # A session answers a tool_use_id it has seen from its answers: each marker, a fresh id.
    return assistant(tool_use(f"s-{marker}", "bash",
                              {"command": f"touch {marker}; sleep 5; echo done"}))


def assert_cancelled(answer):
    for block in answer["content"]:
        assert block["is_error"] is True
        assert block["content"].startswith("Error [cancelled]"), block


def test_turn_cancel_from_another_thread(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        turn = session.start(sleeper())
        assert turn.turn_id.startswith("m-")
        assert wait_for(os.path.join(session.workspace, "started"))
        states = []
        canceller = threading.Thread(target=lambda: states.append(turn.cancel()))
        canceller.start()
        canceller.join(20)
        answer = turn.result(timeout=20)
        assert_cancelled(answer)
        assert states == [{"turn_id": turn.turn_id, "state": "running"}]
        assert turn.done()
        # The session stays usable, and the turn is now finished.
        assert session.cancel_turn(turn.turn_id)["state"] == "finished"
        ok = session.dispatch(assistant(tool_use("e", "bash", {"command": "echo ok"})))
        assert ok["content"][0]["content"] == "ok"


def test_turn_cancel_from_another_task(server, token):
    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with client.session() as session:
                turn = session.start(sleeper(), turn_id="async-turn-1")
                await session.create()
                marker = os.path.join(session.workspace, "started")
                while not os.path.exists(marker):
                    await asyncio.sleep(0.01)

                async def canceller():
                    return await turn.cancel()

                state = await asyncio.create_task(canceller())
                assert state == {"turn_id": "async-turn-1", "state": "running"}
                answer = await asyncio.wait_for(turn.result(), 20)
                assert_cancelled(answer)
                assert (await turn) == answer

    asyncio.run(main())


def test_cancel_before_the_dispatch_arrives(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        assert session.cancel_turn("early-1") == {"turn_id": "early-1", "state": "early"}
        answer = session.dispatch(assistant(
            tool_use("a", "bash", {"command": "touch ran"}),
            tool_use("b", "write_file", {"path": "w.txt", "content": "x"})), turn_id="early-1")
        assert_cancelled(answer)
        assert not os.path.exists(os.path.join(session.workspace, "ran"))
        assert not os.path.exists(os.path.join(session.workspace, "w.txt"))


def test_a_started_turn_cancelled_at_once_runs_nothing(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        session.create()
        results = []
        for i in range(5):
            turn = session.start(sleeper(f"m{i}"))
            state = turn.cancel()["state"]
            assert state in ("early", "queued", "running")
            results.append((state, turn.result(timeout=20)))
        for state, answer in results:
            assert_cancelled(answer)


def test_async_early_cancel_and_a_copy_of_a_turn_in_progress(server, token):
    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            session = await client.session()
            assert (await session.cancel_turn("t-early"))["state"] == "early"
            answer = await session.dispatch(sleeper(), turn_id="t-early")
            assert_cancelled(answer)
            turn = session.start(sleeper("busy"), turn_id="busy-1")
            while not os.path.exists(os.path.join(session.workspace, "busy")):
                await asyncio.sleep(0.01)
            # The same turn id again while it runs: a copy of that turn, which waits for it and
            # which a cancel of the id reaches too — nothing of it runs.
            copy = asyncio.ensure_future(session.dispatch(sleeper("again"), turn_id="busy-1"))
            await asyncio.sleep(0.2)
            assert not copy.done()
            await turn.cancel()
            assert_cancelled(await turn)
            assert_cancelled(await copy)
            assert not os.path.exists(os.path.join(session.workspace, "again"))
            await session.close()

    asyncio.run(main())


def test_turn_with_client_tool_cancelled_while_the_tool_runs(server, token):
    release = threading.Event()
    entered = threading.Event()
    with Client(server.base_url, token=token) as client, client.session() as session:
        @session.tool
        def slow() -> str:
            """Blocks until released."""
            entered.set()
            release.wait(20)
            return "late"

        turn = session.start(assistant(tool_use("x", "slow", {})))
        assert entered.wait(20)
        assert turn.cancel()["state"] == "running"
        answer = turn.result(timeout=20)
        assert_cancelled(answer)
        release.set()  # its late answer is refused (call_closed) and ignored
        time.sleep(0.2)
        assert session.info()["in_flight"] == 0
