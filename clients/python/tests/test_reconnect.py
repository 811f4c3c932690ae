"""A request whose connection failed before any answer — a keep-alive connection the server had
just closed, a reset, a connection refused while the server restarts — is sent again, bounded
by ``max_retries`` and ``retry_budget_s``: a turn with the same turn id and body (the engine
answers a copy from its first answers, never runs it twice), and every other request but a
session's creation, which is sent again only when it cannot have reached the server."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import urllib3

from conftest import TOKEN, binary
from switchboard_client import AsyncClient, Client, SwitchboardError

ANSWER = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "x"}]}
CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "bash",
                                          "input": {"command": "echo x"}}]}


class Hangup(BaseHTTPRequestHandler):
    """Closes the connection without a word the first ``hangups`` times a path is asked
    (``/dispatch`` or ``/v1/sessions``), then answers; records every attempt."""
    protocol_version = "HTTP/1.1"
    hangups = 2
    hang_on = "/dispatch"
    seen = []

    def log_message(self, *args):
        pass

    def reply(self, status, body, content_type="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_DELETE(self):
        self.reply(200, {})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        cls = type(self)
        if cls.hang_on in self.path.split("?")[0]:
            cls.seen.append((self.path, self.headers.get("switchboard-turn-id"), body))
            if len(cls.seen) <= cls.hangups:
                self.close_connection = True  # no status line: the connection just ends
                return
        if self.path == "/v1/sessions":
            return self.reply(201, {"session_id": "s1", "workspace": "/tmp/s1", "tools": []})
        if "stream=true" in self.path:
            done = b"event: done\ndata: " + json.dumps(ANSWER).encode() + b"\n\n"
            return self.reply(200, done, "text/event-stream")
        self.reply(200, ANSWER)


@pytest.fixture()
def hangup():
    Hangup.seen, Hangup.hangups, Hangup.hang_on = [], 2, "/dispatch"
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hangup)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


def one_turn_id_and_body():
    assert len({tid for _, tid, _ in Hangup.seen}) == 1
    assert len({body for _, _, body in Hangup.seen}) == 1


@pytest.mark.parametrize("streamed", [False, True])
def test_a_turn_cut_off_before_any_answer_is_sent_again_with_its_turn_id(hangup, streamed):
    with Client(hangup, token="t") as client, client.session() as session:
        if streamed:
            stream = session.stream(CALL, turn_id="again")
            assert list(stream) == [] and stream.answer == ANSWER
        else:
            assert session.dispatch(CALL, turn_id="again") == ANSWER
    assert len(Hangup.seen) == 3, "two connections closed without an answer, then served"
    assert {tid for _, tid, _ in Hangup.seen} == {"again"}
    one_turn_id_and_body()


@pytest.mark.parametrize("streamed", [False, True])
def test_the_async_client_sends_a_cut_off_turn_again_too(hangup, streamed):
    async def main():
        async with AsyncClient(hangup, token="t") as client:
            async with client.session() as session:
                if streamed:
                    stream = session.stream(CALL)
                    assert [x async for x in stream] == []
                    return stream.answer
                return await session.dispatch(CALL)

    assert asyncio.run(main()) == ANSWER
    assert len(Hangup.seen) == 3
    assert next(iter({tid for _, tid, _ in Hangup.seen})).startswith("m-")
    one_turn_id_and_body()


def test_resending_is_bounded(hangup):
    Hangup.hangups = 100
    with Client(hangup, token="t", max_retries=2) as client:
        with pytest.raises(SwitchboardError) as e:
            client.session().dispatch(CALL)
    assert e.value.code == "connection_error" and e.value.status is None
    assert len(Hangup.seen) == 3  # the first try and two re-sends

    Hangup.seen = []

    async def bounded():
        async with AsyncClient(hangup, token="t", max_retries=1) as client:
            await client.session().dispatch(CALL)

    with pytest.raises(SwitchboardError) as e:
        asyncio.run(bounded())
    assert e.value.code == "connection_error" and len(Hangup.seen) == 2


def test_a_session_is_not_created_twice_after_a_connection_that_may_have_reached_the_server(
        hangup):
    Hangup.hang_on, Hangup.hangups = "/v1/sessions", 1
    with Client(hangup, token="t") as client:
        with pytest.raises(SwitchboardError) as e:
            client.session().create()
    assert e.value.code == "connection_error" and len(Hangup.seen) == 1

    Hangup.seen = []

    async def create():
        async with AsyncClient(hangup, token="t") as client:
            await client.session().create()

    with pytest.raises(SwitchboardError) as e:
        asyncio.run(create())
    assert e.value.code == "connection_error" and len(Hangup.seen) == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_connection_is_tried_again_while_the_server_comes_up():
    """Nothing reached the server: even a session's creation is sent again."""
    port = free_port()
    Hangup.seen, Hangup.hangups, Hangup.hang_on = [], 0, "/v1/sessions"
    servers = []

    def start_late():
        time.sleep(0.4)
        httpd = ThreadingHTTPServer(("127.0.0.1", port), Hangup)
        servers.append(httpd)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()

    threading.Thread(target=start_late).start()
    started = time.monotonic()
    try:
        with Client(f"http://127.0.0.1:{port}", token="t") as client:
            session = client.session().create()
            assert session.id == "s1" and len(Hangup.seen) == 1
            assert time.monotonic() - started >= 0.4
    finally:
        for httpd in servers:
            httpd.shutdown()
            httpd.server_close()


def test_a_read_timeout_is_not_sent_again(hangup):
    class Slow(Hangup):
        def do_GET(self):
            type(self).seen.append(self.path)
            time.sleep(1)
            self.reply(200, {"status": "ok"})

    Slow.seen = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with Client(f"http://127.0.0.1:{httpd.server_port}", token="t", timeout=0.2) as client:
            with pytest.raises(SwitchboardError) as e:
                client.health()  # the server is working on it: no second request
        assert e.value.code == "connection_error" and Slow.seen == ["/healthz"]
    finally:
        httpd.shutdown()
        httpd.server_close()


# --- against the real server -----------------------------------------------------------------

class Serve:
    """``switchboard serve`` on a given port, root and journal (to restart it in place)."""

    def __init__(self, port, root, *extra):
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [binary(), "serve", "--listen", f"127.0.0.1:{port}", "--workspace-root",
             os.path.join(root, "ws"), *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=dict(os.environ, SWITCHBOARD_TOKEN=TOKEN), text=True)
        for line in self.proc.stderr:
            if "listening on " in line:
                break
        else:
            raise RuntimeError("switchboard serve did not start")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0


def bash(id, command):
    return {"role": "assistant", "content": [
        {"type": "tool_use", "id": id, "name": "bash", "input": {"command": command}}]}


def test_a_turn_sent_on_a_keep_alive_connection_the_server_closed_is_sent_again(monkeypatch):
    """The server closes a connection idle for --read-timeout; a request that leaves on it at
    that moment (here: always, the client's check for a dropped connection turned off) gets no
    answer, and is sent again on a new connection."""
    with tempfile.TemporaryDirectory() as root:
        server = Serve(free_port(), root, "--read-timeout", "300ms")
        try:
            with Client(server.url, token=TOKEN) as client, client.session() as session:
                assert session.dispatch(bash("a", "echo one"))["content"][0]["content"] == "one"
                monkeypatch.setattr(urllib3.connectionpool, "is_connection_dropped",
                                    lambda conn: False)
                time.sleep(0.8)  # the server closes the idle connection
                answer = session.dispatch(bash("b", "echo two"))
                assert answer["content"][0]["content"] == "two"
                assert session.info()["turns"] == 2, "the turn ran once"
        finally:
            server.stop()


def test_a_turn_sent_while_the_server_restarts_is_served_by_the_new_one():
    with tempfile.TemporaryDirectory() as root:
        port = free_port()
        args = (port, root, "--journal", os.path.join(root, "journal"))
        server = Serve(*args)
        with Client(server.url, token=TOKEN) as client:
            session = client.session("kept")
            assert session.dispatch(bash("a", "echo before"))["content"][0]["content"] == "before"
            server.stop()
            restarted = []
            threading.Thread(target=lambda: (time.sleep(0.5),
                                             restarted.append(Serve(*args)))).start()
            try:
                answer = session.dispatch(bash("b", "echo after"))  # refused, then served
                assert answer["content"][0]["content"] == "after"
            finally:
                for _ in range(100):
                    if restarted:
                        break
                    time.sleep(0.1)
                for s in restarted:
                    s.stop()
