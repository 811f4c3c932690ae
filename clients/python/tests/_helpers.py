"""Small helpers the client's tests share: an Anthropic ``Message`` (the SDK's object, or its
wire form) and a scripted model server's plumbing, and a snippet of a Markdown document."""

import json
import pathlib
import re
from http.server import BaseHTTPRequestHandler
from typing import Any, Dict, List


def anthropic_wire(id: str, model: str, content: List[Dict[str, Any]], stop: str) -> dict:
    """An Anthropic Messages API response body."""
    return {"id": id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1}}


def anthropic_message(anthropic: Any, id: str, content: List[Dict[str, Any]], stop: str) -> Any:
    """The ``anthropic`` SDK's ``Message`` for ``content``."""
    return anthropic.types.Message.model_validate(anthropic_wire(id, "m", content, stop))


def python_snippet(path: pathlib.Path, heading: str) -> str:
    """The first Python code block after ``heading`` in the Markdown file ``path``."""
    text = path.read_text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


class JsonHandler(BaseHTTPRequestHandler):
    """A quiet request handler that reads a JSON body and answers JSON."""

    def log_message(self, *args: Any) -> None:
        pass

    def read_json(self) -> Any:
        return json.loads(self.rfile.read(int(self.headers["content-length"])))

    def send_json(self, answer: Any) -> None:
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
