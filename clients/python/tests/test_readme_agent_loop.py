"""The README's agent loop, run as written against the real server and the real ``anthropic``
SDK, with a scripted Messages API on loopback standing in for the model: it asks for two built-in
calls and one of the snippet's own tool, then checks it got one tool_result per call, in order, and
answers with text."""

import contextlib
import io
import pathlib
import threading
from http.server import ThreadingHTTPServer

import pytest

from _helpers import JsonHandler, anthropic_wire, python_snippet

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def readme_snippet() -> str:
    return python_snippet(README, "### Python client")


class ScriptedModel(JsonHandler):
    requests = []

    def do_POST(self):
        body = self.read_json()
        ScriptedModel.requests.append(body)
        if len(ScriptedModel.requests) == 1:
            content = [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_w", "name": "write_file",
                 "input": {"path": "src/a.rs", "content": "fn main() {}\n"}},
                {"type": "tool_use", "id": "toolu_g", "name": "glob", "input": {"pattern": "**/*.rs"}},
                {"type": "tool_use", "id": "toolu_c", "name": "word_count", "input": {"text": "fn main() {}"}},
            ]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": "There is one Rust file: src/a.rs."}]
            stop = "end_turn"
        self.send_json(anthropic_wire(f"msg_{len(ScriptedModel.requests)}", body["model"],
                                      content, stop))


def test_the_readme_agent_loop_runs_as_written(server, token, monkeypatch):
    pytest.importorskip("anthropic")
    model = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedModel)
    threading.Thread(target=model.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://127.0.0.1:{model.server_port}")
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("MODEL_ID", "scripted-model")
        monkeypatch.setenv("SWITCHBOARD_TOKEN", token)
        for proxy in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(proxy, raising=False)
        code = readme_snippet().replace("http://127.0.0.1:7420", server.base_url)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(code, "README.md", "exec"), {})
        assert out.getvalue().strip() == "There is one Rust file: src/a.rs."
        second = ScriptedModel.requests[1]
        assert second["tools"] and {t["name"] for t in second["tools"]} >= {"bash", "glob", "word_count"}
        results = second["messages"][-1]
        assert results["role"] == "user"
        assert [b["tool_use_id"] for b in results["content"]] == ["toolu_w", "toolu_g", "toolu_c"]
        assert results["content"][1]["content"] == "src/a.rs"
        assert results["content"][2]["content"] == "3"  # the client tool ran here, in call order
        assert "my-repo" in second["system"]
    finally:
        model.shutdown()
