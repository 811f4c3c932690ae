"""What the sync and async clients share: the error type, request bodies, SSE parsing."""

import json
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import httpx

TOKEN_ENV = "SWITCHBOARD_TOKEN"
DEFAULT_BASE_URL = "http://127.0.0.1:7420"
# Tool calls may run for minutes (bash: up to 600 s): no read timeout by default.
DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)
FORMATS = ("anthropic", "openai")


class SwitchboardError(Exception):
    """A request that failed. ``code`` is the server's error code (``unauthorized``,
    ``unknown_session``, ``bad_request``, ``payload_too_large``, ``too_many_sessions``,
    ``overloaded``, ``shutting_down``, ...), or ``connection_error`` when the server could
    not be reached; ``status`` is the HTTP status (None for connection errors);
    ``retry_after`` the seconds the server asked to wait (with ``overloaded``)."""

    def __init__(self, code: str, message: str, status: Optional[int] = None,
                 retry_after: Optional[float] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after


def headers(token: Optional[str]) -> Dict[str, str]:
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def error_from(response: httpx.Response, text: str) -> SwitchboardError:
    code, message = "http_error", text.strip() or response.reason_phrase
    try:
        err = json.loads(text)["error"]
        code, message = err["code"], err["message"]
    except (ValueError, KeyError, TypeError):
        pass
    retry_after = response.headers.get("retry-after")
    try:
        retry = float(retry_after) if retry_after is not None else None
    except ValueError:
        retry = None
    return SwitchboardError(code, message, response.status_code, retry)


def connection_error(e: Exception) -> SwitchboardError:
    return SwitchboardError("connection_error", str(e) or type(e).__name__)


def as_document(message: Any) -> Any:
    """A JSON-able document from a dict/list, a JSON string, or an SDK model."""
    if hasattr(message, "model_dump"):
        try:
            return message.model_dump(mode="json", exclude_none=True)
        except TypeError:
            return message.model_dump()
    if isinstance(message, (bytes, bytearray)):
        message = message.decode("utf-8")
    if isinstance(message, str):
        return json.loads(message)
    return message


def detect_format(document: Any, format: Optional[str]) -> str:
    """``format`` if given, else ``openai`` for an OpenAI message or completion, else
    ``anthropic``."""
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, not {format!r}")
        return format
    if isinstance(document, dict) and ("tool_calls" in document or "choices" in document):
        return "openai"
    if isinstance(document, list) and document and isinstance(document[0], dict) \
            and document[0].get("type") == "function":
        return "openai"
    return "anthropic"


def dispatch_request(message: Any, format: Optional[str]) -> Tuple[str, bytes]:
    document = as_document(message)
    fmt = detect_format(document, format)
    return fmt, json.dumps(document).encode("utf-8")


class SseParser:
    """Turns the lines of an SSE body into ``(event, data)`` pairs."""

    def __init__(self) -> None:
        self.event = ""
        self.data = []

    def feed(self, line: str) -> Optional[Tuple[str, str]]:
        if line == "":
            if not self.event and not self.data:
                return None
            out = (self.event or "message", "\n".join(self.data))
            self.event, self.data = "", []
            return out
        if line.startswith(":"):
            return None
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            self.event = value
        elif field == "data":
            self.data.append(value)
        return None


def parse_events(lines: Iterable[str]) -> Iterator[Tuple[str, str]]:
    parser = SseParser()
    for line in lines:
        item = parser.feed(line.rstrip("\r"))
        if item is not None:
            yield item


class StreamState:
    """Interprets the events of a streamed dispatch."""

    def __init__(self, answer_approval: Optional[Callable[[Any], Any]] = None) -> None:
        self.answer: Any = None
        self.answer_approval = answer_approval
        self.approvals: List[Any] = []

    def handle(self, event: str, data: str) -> Optional[Tuple[int, Any]]:
        if event == "approval_required":
            request = json.loads(data)
            self.approvals.append(request)
            if self.answer_approval is not None:
                self.answer_approval(request)
            return None
        if event == "result":
            item = json.loads(data)
            return item["index"], item["result"]
        if event == "done":
            self.answer = json.loads(data)
            return None
        if event == "error":
            err = json.loads(data).get("error", {})
            raise SwitchboardError(err.get("code", "internal"), err.get("message", data), 200)
        return None
