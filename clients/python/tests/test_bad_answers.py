"""Every refusal is immediate and clear. An answer the server refuses (larger than its
``--max-body``, an image by URL) is replaced at once by an error naming why, and logged; a
malformed answer of the server (an HTML page, JSON cut short, a bad event) is the client's
``bad_response``, never a ``JSONDecodeError``; and whatever a tool function raises or returns
becomes a result."""

import asyncio
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from conftest import Server
from switchboard_client import AsyncClient, Client, SwitchboardError


def tool_use(id, name, input=None):
    return {"type": "tool_use", "id": id, "name": name, "input": input or {}}


def assistant(*blocks):
    return {"role": "assistant", "content": list(blocks)}


# --- answers the server refuses --------------------------------------------------------------

@pytest.fixture(scope="module")
def small_server():
    s = Server(extra=("--max-body", "100000"))
    yield s
    assert s.stop() == 0


def big() -> str:
    """Returns 5 MB of text."""
    return "x" * 5_000_000


def picture() -> list:
    """Returns an image by URL (the server takes base64 images only)."""
    return [{"type": "image", "source": {"type": "url", "url": "https://example.test/a.png"}}]


def assert_refused_at_once(answer, elapsed, caplog):
    too_large, by_url = (b["content"] for b in answer["content"])
    assert too_large.startswith("Error [execution_error]: SwitchboardError: the server refused "
                                "this tool's answer (payload_too_large)"), too_large
    assert "--max-body" in too_large
    assert "(bad_request)" in by_url and "base64" in by_url, by_url
    assert elapsed < 10, "answered at once, not after the calls' 20 s deadline"
    refusals = [r for r in caplog.records if r.levelno == logging.WARNING
                and "refused the answer" in r.getMessage()]
    assert len(refusals) == 2, caplog.text


def test_a_refused_answer_is_replaced_at_once_by_an_error_naming_why(small_server, token,
                                                                    caplog):
    caplog.set_level(logging.WARNING, logger="switchboard_client")
    with Client(small_server.base_url, token=token) as client, client.session() as session:
        session.register(big, timeout_ms=20_000, concurrency_safe=True)
        session.register(picture, timeout_ms=20_000, concurrency_safe=True)
        began = time.monotonic()
        answer = session.dispatch(assistant(tool_use("a", "big"), tool_use("b", "picture")))
        assert_refused_at_once(answer, time.monotonic() - began, caplog)


def test_the_async_client_replaces_a_refused_answer_too(small_server, token, caplog):
    caplog.set_level(logging.WARNING, logger="switchboard_client")

    async def abig() -> str:
        """Returns 5 MB of text, asynchronously."""
        return big()

    async def main():
        async with AsyncClient(small_server.base_url, token=token) as client:
            async with client.session() as session:
                session.register(abig, name="big", timeout_ms=20_000, concurrency_safe=True)
                session.register(picture, timeout_ms=20_000, concurrency_safe=True)
                began = time.monotonic()
                answer = await session.dispatch(assistant(tool_use("a", "big"),
                                                          tool_use("b", "picture")))
                return answer, time.monotonic() - began

    answer, elapsed = asyncio.run(main())
    assert_refused_at_once(answer, elapsed, caplog)


# --- whatever a tool function raises or returns ----------------------------------------------

class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")


class Opaque:
    """Neither JSON nor printable."""

    def __str__(self):
        raise ValueError("opaque")


def raises_unprintable() -> str:
    """Raises an exception whose str() raises."""
    raise Unprintable()


def returns_opaque():
    """Returns an object JSON cannot carry, whose str() raises."""
    return Opaque()


def returns_bad_blocks() -> list:
    """Returns content blocks holding an object JSON cannot carry."""
    return [{"type": "text", "text": object()}]


def exits() -> str:
    """Calls sys.exit."""
    raise SystemExit(3)


def surrogate() -> str:
    """Returns text that is not valid Unicode (a lone surrogate, as from a bad file name)."""
    return "name-\udcff"


TOOLS = [raises_unprintable, returns_opaque, returns_bad_blocks, exits, surrogate]
CALLS = assistant(*[tool_use(f"t{i}", f.__name__) for i, f in enumerate(TOOLS)])


def assert_every_call_answered(answer, elapsed):
    got = [b["content"] for b in answer["content"]]
    assert got[0] == ("Error [execution_error]: Unprintable: <Unprintable object whose str() "
                      "raised RuntimeError>"), got[0]
    assert got[1] == ("Error [execution_error]: ValueError: opaque"), got[1]
    assert got[2].startswith("Error [execution_error]: TypeError: Object of type object is "
                             "not JSON serializable"), got[2]
    assert got[3] == "Error [execution_error]: SystemExit: 3", got[3]
    assert got[4] == "name-?", got[4]
    assert elapsed < 5, "every call answered at once, none left to its deadline"


def test_whatever_a_function_raises_or_returns_is_a_result(server, token):
    with Client(server.base_url, token=token) as client, client.session() as session:
        for f in TOOLS:
            session.register(f, timeout_ms=10_000, concurrency_safe=True)
        began = time.monotonic()
        answer = session.dispatch(CALLS)
        assert_every_call_answered(answer, time.monotonic() - began)
        assert session.dispatch(assistant(tool_use("after", "surrogate"))) is not None


def test_whatever_an_async_function_raises_or_returns_is_a_result(server, token):
    def coroutine(f):
        async def run():
            return f()
        run.__name__, run.__doc__ = f.__name__, f.__doc__
        return run

    async def main():
        async with AsyncClient(server.base_url, token=token) as client:
            async with client.session() as session:
                for i, f in enumerate(TOOLS):  # coroutines and plain functions, alternately
                    session.register(coroutine(f) if i % 2 else f, name=f.__name__,
                                     timeout_ms=10_000, concurrency_safe=True)
                began = time.monotonic()
                answer = await session.dispatch(CALLS)
                return answer, time.monotonic() - began

    assert_every_call_answered(*asyncio.run(main()))


# --- malformed answers of the server ---------------------------------------------------------

class Broken(BaseHTTPRequestHandler):
    """A server whose dispatch answers are ``mode``: an HTML page, JSON cut short, an event
    stream with a bad event, or an HTML page for a streamed dispatch."""
    protocol_version = "HTTP/1.1"
    mode = "html"

    def log_message(self, *args):
        pass

    def reply(self, status, data, content_type):
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        mode = type(self).mode
        if self.path == "/v1/sessions":
            if mode == "html-session":
                return self.reply(201, b"<html>Welcome to the portal</html>", "text/html")
            return self.reply(201, b'{"session_id":"s1","workspace":"/w","tools":[]}',
                              "application/json")
        streamed = "stream=true" in self.path
        if mode == "html" or (mode == "html-stream" and streamed):
            return self.reply(200, b"<html><body>Proxy login</body></html>", "text/html")
        if mode == "truncated":
            return self.reply(200, b'{"role":"user","content":[{"type":"tool_res',
                              "application/json")
        if mode == "bad-event":
            return self.reply(200, b"event: result\ndata: {not json\n\n", "text/event-stream")
        if mode == "bad-result":
            return self.reply(200, b'event: result\ndata: {"no_index":1}\n\n',
                              "text/event-stream")
        self.reply(200, b"{}", "application/json")


@pytest.fixture()
def broken():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()
    httpd.server_close()


MALFORMED = [("html", False), ("truncated", False), ("html-stream", True), ("bad-event", True),
             ("bad-result", True), ("html-session", False)]


@pytest.mark.parametrize("mode,streamed", MALFORMED)
def test_a_malformed_answer_is_bad_response(broken, mode, streamed):
    Broken.mode = mode
    call = assistant(tool_use("a", "bash", {"command": "true"}))
    with Client(broken, token="t") as client:
        session = client.session()
        with pytest.raises(SwitchboardError) as e:
            list(session.stream(call)) if streamed else session.dispatch(call)
    assert e.value.code == "bad_response", e.value
    assert not isinstance(e.value.__cause__, json.JSONDecodeError)


@pytest.mark.parametrize("mode,streamed", MALFORMED)
def test_the_async_client_says_bad_response_too(broken, mode, streamed):
    Broken.mode = mode
    call = assistant(tool_use("a", "bash", {"command": "true"}))

    async def main():
        async with AsyncClient(broken, token="t") as client:
            session = client.session()
            if streamed:
                return [x async for x in session.stream(call)]
            return await session.dispatch(call)

    with pytest.raises(SwitchboardError) as e:
        asyncio.run(main())
    assert e.value.code == "bad_response", e.value
