"""``overloaded`` (503 + Retry-After: nothing ran) is retried after Retry-After, bounded by
``max_retries`` and ``retry_budget_s``, with the same turn id; other errors are raised."""

import asyncio
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import Server
from switchboard_client import AsyncClient, Client, SwitchboardError

ANSWER = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "x"}]}
CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "bash",
                                          "input": {"command": "echo x"}}]}


class Overloaded(BaseHTTPRequestHandler):
    """Answers the first ``refusals`` dispatches 503 overloaded, then 200."""
    protocol_version = "HTTP/1.1"
    refusals = 2
    retry_after = "0.05"
    code = "overloaded"
    seen = []

    def log_message(self, *args):
        pass

    def reply(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_DELETE(self):
        self.reply(200, {})

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        if self.path == "/v1/sessions":
            return self.reply(201, {"session_id": "s1", "workspace": "/tmp/s1", "tools": []})
        cls = type(self)
        cls.seen.append((self.path, self.headers.get("switchboard-turn-id"), body))
        if len(cls.seen) <= cls.refusals:
            return self.reply(503, {"error": {"code": cls.code, "message": "busy"}},
                              [("Retry-After", cls.retry_after)])
        self.reply(200, ANSWER, [("Switchboard-Turn-Id", self.headers.get("switchboard-turn-id"))])


@pytest.fixture()
def fake():
    Overloaded.seen = []
    Overloaded.refusals = 2
    Overloaded.retry_after = "0.05"
    Overloaded.code = "overloaded"
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Overloaded)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def test_sync_retries_overloaded_with_the_same_turn_id(fake):
    with Client(fake, token="t") as client, client.session() as session:
        assert session.dispatch(CALL, turn_id="retry-me") == ANSWER
    assert len(Overloaded.seen) == 3
    assert {tid for _, tid, _ in Overloaded.seen} == {"retry-me"}
    assert len({body for _, _, body in Overloaded.seen}) == 1


@pytest.mark.parametrize("code", ["node_unreachable", "session_moved", "cluster_unavailable"])
def test_a_moving_cluster_session_is_retried_with_the_same_turn_id(fake, code):
    Overloaded.code = code
    with Client(fake, token="t") as client, client.session() as session:
        assert session.dispatch(CALL, turn_id="moving") == ANSWER
    assert len(Overloaded.seen) == 3
    assert {tid for _, tid, _ in Overloaded.seen} == {"moving"}


def test_other_refusals_are_not_retried(fake):
    Overloaded.code = "turn_in_progress"
    with Client(fake, token="t") as client:
        with pytest.raises(SwitchboardError) as e:
            client.session().dispatch(CALL)
    assert e.value.code == "turn_in_progress" and len(Overloaded.seen) == 1


def test_generated_turn_ids_are_kept_across_retries_too(fake):
    with Client(fake, token="t") as client:
        session = client.session()
        session.dispatch(CALL)
    ids = {tid for _, tid, _ in Overloaded.seen}
    assert len(ids) == 1 and ids.pop().startswith("m-")


def test_retries_are_bounded(fake):
    Overloaded.refusals = 100
    with Client(fake, token="t", max_retries=3) as client:
        with pytest.raises(SwitchboardError) as e:
            client.session().dispatch(CALL)
    assert (e.value.code, e.value.status, e.value.retry_after) == ("overloaded", 503, 0.05)
    assert len(Overloaded.seen) == 4  # the first try and three retries

    Overloaded.seen = []
    Overloaded.retry_after = "5"
    with Client(fake, token="t", retry_budget_s=1) as client:
        with pytest.raises(SwitchboardError) as e:
            client.session().dispatch(CALL)
    assert e.value.code == "overloaded" and len(Overloaded.seen) == 1  # 5 s is over the budget


def test_async_retries_overloaded(fake):
    async def main():
        async with AsyncClient(fake, token="t") as client:
            async with client.session() as session:
                return await session.dispatch(CALL, turn_id="async-retry")

    assert asyncio.run(main()) == ANSWER
    assert [tid for _, tid, _ in Overloaded.seen] == ["async-retry"] * 3

    Overloaded.seen = []
    Overloaded.refusals = 100

    async def bounded():
        async with AsyncClient(fake, token="t", max_retries=1) as client:
            await client.session().dispatch(CALL)

    with pytest.raises(SwitchboardError) as e:
        asyncio.run(bounded())
    assert e.value.code == "overloaded" and len(Overloaded.seen) == 2


@pytest.fixture(scope="module")
def tiny_server():
    s = Server(extra=("--max-requests", "1"))
    yield s
    assert s.stop() == 0


def test_the_real_server_overloaded_then_served(tiny_server, token):
    """With --max-requests 1, a second dispatch while one runs is refused overloaded
    (Retry-After: 1) and succeeds on retry."""
    with Client(tiny_server.base_url, token=token) as client, \
            client.session() as a, client.session() as b:
        busy = a.start({"role": "assistant", "content": [
            {"type": "tool_use", "id": "s", "name": "bash",
             "input": {"command": "touch started; sleep 1.5; echo slow"}}]})
        deadline = 200
        while not os.path.exists(os.path.join(a.workspace, "started")) and deadline:
            threading.Event().wait(0.05)
            deadline -= 1
        with Client(tiny_server.base_url, token=token, max_retries=0) as impatient:
            s = impatient.session()
            with pytest.raises(SwitchboardError) as e:
                s.dispatch(CALL)
            assert (e.value.code, e.value.status, e.value.retry_after) == ("overloaded", 503, 1.0)
        assert b.dispatch(CALL)["content"][0]["content"] == "x"  # retried after 1 s
        assert busy.result(timeout=20)["content"][0]["content"] == "slow"
