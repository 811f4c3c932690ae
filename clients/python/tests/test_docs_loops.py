"""The complete loops of docs/python.md, run as written against the real server and the real
``anthropic`` and ``openai`` SDKs, with a scripted model on loopback: it calls the client tool
``ticket`` and the built-in ``glob``, then answers with text."""

import contextlib
import io
import json
import pathlib
import threading
from http.server import ThreadingHTTPServer

import pytest

from _helpers import JsonHandler, anthropic_wire, python_snippet

DOC = pathlib.Path(__file__).resolve().parents[3] / "docs" / "python.md"


def snippet(heading: str) -> str:
    return python_snippet(DOC, heading)


class Scripted(JsonHandler):
    requests = []

    def do_POST(self):
        body = self.read_json()
        Scripted.requests.append(body)
        first = len(Scripted.requests) == 1
        if self.path.endswith("/chat/completions"):
            if first:
                message = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_t", "type": "function",
                     "function": {"name": "ticket", "arguments": json.dumps({"ticket_id": "T-42"})}},
                    {"id": "call_g", "type": "function",
                     "function": {"name": "glob", "arguments": json.dumps({"pattern": "*"})}}]}
                finish = "tool_calls"
            else:
                message = {"role": "assistant", "content": "Ticket T-42 is open."}
                finish = "stop"
            answer = {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                      "choices": [{"index": 0, "message": message, "finish_reason": finish}]}
        else:
            if first:
                content = [{"type": "tool_use", "id": "toolu_t", "name": "ticket",
                            "input": {"ticket_id": "T-42"}},
                           {"type": "tool_use", "id": "toolu_g", "name": "glob",
                            "input": {"pattern": "*"}}]
                stop = "tool_use"
            else:
                content = [{"type": "text", "text": "Ticket T-42 is open."}]
                stop = "end_turn"
            answer = anthropic_wire("msg", body["model"], content, stop)
        self.send_json(answer)


@pytest.fixture()
def model(monkeypatch, token):
    Scripted.requests = []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_port}"
    monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("OPENAI_BASE_URL", url + "/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    monkeypatch.setenv("MODEL_ID", "scripted-model")
    monkeypatch.setenv("SWITCHBOARD_TOKEN", token)
    for proxy in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    yield
    httpd.shutdown()
    httpd.server_close()


def run(heading, server):
    code = snippet(heading).replace("http://127.0.0.1:7420", server.base_url)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/python.md", "exec"), {"__name__": "__docs__"})
    return out.getvalue().strip()


@pytest.mark.parametrize("heading", ["### The Anthropic SDK", "### The async client"])
def test_the_anthropic_loops_run_as_written(heading, server, model):
    pytest.importorskip("anthropic")
    printed = run(heading, server)
    second = Scripted.requests[1]
    assert {"bash", "glob", "ticket"} <= {t["name"] for t in second["tools"]}
    results = second["messages"][-1]
    assert [b["tool_use_id"] for b in results["content"]] == ["toolu_t", "toolu_g"]
    assert json.loads(results["content"][0]["content"])["status"] == "open"
    assert len(Scripted.requests) == 2
    if "async" not in heading:
        assert printed == "Ticket T-42 is open."


def test_the_openai_loop_runs_as_written(server, model):
    pytest.importorskip("openai")
    assert run("### The OpenAI SDK", server) == "Ticket T-42 is open."
    second = Scripted.requests[1]
    assert {"bash", "ticket"} <= {t["function"]["name"] for t in second["tools"]}
    tool_messages = second["messages"][-2:]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_t", "call_g"]
    assert json.loads(tool_messages[0]["content"])["id"] == "T-42"
    assert len(Scripted.requests) == 2
