"""Approvals through the client: a server started with ``--policy`` asks before ``write_file``
under ``notes/``; ``stream(..., on_approval=...)`` answers, and without it the call is denied."""

import asyncio
import json
import os
import tempfile

import pytest

from conftest import Server
from switchboard_client import AsyncClient, Client, SwitchboardError


@pytest.fixture(scope="module")
def policy_server():
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"permissions": {"ask": ["write_file(notes/**)"], "default": "allow"}}, f)
    s = Server(extra=("--policy", f.name))
    yield s
    assert s.stop() == 0
    os.unlink(f.name)


def write(path, id):
    # Each call a fresh tool_use_id: a session answers an id it has seen from its answers.
    return {"role": "assistant", "content": [
        {"type": "tool_use", "id": id, "name": "write_file",
         "input": {"path": path, "content": "hi"}}]}


def test_on_approval_decides_each_asked_call(policy_server, token):
    with Client(policy_server.base_url, token=token) as client, client.session() as session:
        seen = []
        stream = session.stream(write("notes/a.md", "w1"),
                                on_approval=lambda req: seen.append(req) or True)
        list(stream)
        assert [r["tool_use_id"] for r in seen] == ["w1"]
        assert seen[0]["rule"] == "write_file(notes/**)"
        assert "is_error" not in stream.answer["content"][0]
        assert os.path.exists(os.path.join(session.workspace, "notes", "a.md"))

        refused = session.stream(write("notes/b.md", "w2"), on_approval=lambda req: False)
        list(refused)
        assert refused.answer["content"][0]["content"].startswith("Error [permission_denied]")
        assert not os.path.exists(os.path.join(session.workspace, "notes", "b.md"))

        # Not asked: runs; and an answer to nothing is unknown_approval.
        assert "is_error" not in session.dispatch(write("free.md", "w3"))["content"][0]
        with pytest.raises(SwitchboardError) as e:
            session.approve("a999999", True)
        assert e.value.code == "unknown_approval"


def test_the_async_client_answers_approvals_too(policy_server, token):
    async def main():
        async with AsyncClient(policy_server.base_url, token=token) as client:
            session = await client.session()
            stream = session.stream(write("notes/c.md", "w1"), on_approval=lambda req: True)
            async for _ in stream:
                pass
            await session.close()
            return stream.answer

    answer = asyncio.run(main())
    assert "is_error" not in answer["content"][0]
