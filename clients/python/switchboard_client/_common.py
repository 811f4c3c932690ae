"""What the sync and async clients share: the error types, headers and request bodies, format
detection, the incremental SSE decoder and the stream's events, client-tool answers, the retry
rule, and the I/O-free halves of a session and of a streamed dispatch. No I/O here."""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from ._tools import SessionTools

TOKEN_ENV = "SWITCHBOARD_TOKEN"
DEFAULT_BASE_URL = "http://127.0.0.1:7420"
#: Seconds to wait for a connection. There is no read timeout by default: a call may run for
#: minutes (``bash`` up to 600 s) and a client tool for up to a day.
CONNECT_TIMEOUT = 10.0
FORMATS = ("anthropic", "openai")
TURN_HEADER = "Switchboard-Turn-Id"
#: What the server answers a client-tool answer that came too late (the call is closed, already
#: answered, or its session is gone): nothing to report.
LATE_ANSWER_CODES = ("call_closed", "already_answered", "unknown_call", "unknown_session")


class SwitchboardError(Exception):
    """A request that failed. ``code`` is the server's error code (``unauthorized``,
    ``unknown_session``, ``bad_request``, ``payload_too_large``, ``too_many_sessions``,
    ``overloaded``, ``shutting_down``, ``session_moved``, ...), or ``connection_error`` when
    the server could not be reached; ``status`` is the HTTP status (None for connection errors);
    ``retry_after`` the seconds the server asked to wait (with ``overloaded``)."""

    def __init__(self, code: str, message: str, status: Optional[int] = None,
                 retry_after: Optional[float] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after


class ToolError(Exception):
    """Raised by a client tool to choose the error text the model sees: the call is answered
    ``{"content": message, "is_error": true}`` with ``message`` as it is (the engine shows it as
    ``Error [execution_error]: message``). Any other exception is answered
    ``"<ExceptionType>: <message>"``."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def base_headers(token: Optional[str]) -> Dict[str, str]:
    """The headers of every request: the bearer token (``SWITCHBOARD_TOKEN`` when not given)."""
    token = token if token is not None else os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def request_headers(token: Optional[str]) -> Tuple[Dict[str, str], Dict[str, str],
                                                   Dict[str, str]]:
    """The headers of a request without a body, with a JSON body, and of a streamed dispatch."""
    headers = base_headers(token)
    json_headers = {**headers, "Content-Type": "application/json"}
    return headers, json_headers, {**json_headers, "Accept": "text/event-stream"}


def tool_executor() -> ThreadPoolExecutor:
    """The worker threads of a client's plain-function client tools."""
    return ThreadPoolExecutor(max_workers=32, thread_name_prefix="switchboard-tool")


def connect_timeout(timeout: Optional[float]) -> float:
    return CONNECT_TIMEOUT if timeout is None else min(CONNECT_TIMEOUT, timeout)


def error_from(status: int, reason: str, retry_after: Optional[str], data: bytes) -> SwitchboardError:
    text = data.decode("utf-8", "replace")
    code, message = "http_error", text.strip() or reason or f"HTTP {status}"
    try:
        err = json.loads(text)["error"]
        code, message = err["code"], err["message"]
    except (ValueError, KeyError, TypeError):
        pass
    try:
        retry = float(retry_after) if retry_after is not None else None
    except ValueError:
        retry = None
    return SwitchboardError(code, message, status, retry)


def connection_error(e: BaseException) -> SwitchboardError:
    return SwitchboardError("connection_error", str(e) or type(e).__name__)


#: The refusals a request is retried after (see :func:`retry_delay`).
RETRIED = ("overloaded", "node_unreachable", "session_moved", "cluster_unavailable")


def retry_delay(err: SwitchboardError, attempt: int, elapsed: float, max_retries: int,
                budget: float) -> Optional[float]:
    """Seconds to wait before retrying a request refused with ``err``, or None to give up.
    Retried, after their ``Retry-After``, at most ``max_retries`` times within ``budget``
    seconds: ``overloaded`` (nothing ran, the body was not read), and a cluster's
    ``node_unreachable`` and ``session_moved`` (the session is moving to another node; the
    retry keeps the turn id, so calls that ran are answered from the journal, never run again)
    and ``cluster_unavailable`` (its NATS servers had no quorum or leader; nothing ran)."""
    if err.code not in RETRIED or attempt >= max_retries:
        return None
    delay = err.retry_after if err.retry_after is not None else 1.0
    delay = max(0.0, delay)
    if elapsed + delay > budget:
        return None
    return delay


class Retries:
    """The retries of one request: :meth:`delay` is the wait before the next attempt after the
    refusal ``err``, or None to raise it (see :func:`retry_delay`)."""

    __slots__ = ("max_retries", "budget", "attempt", "started")

    def __init__(self, max_retries: int, budget: float) -> None:
        self.max_retries, self.budget = max_retries, budget
        self.attempt, self.started = 0, 0.0

    def delay(self, err: SwitchboardError) -> Optional[float]:
        if self.attempt == 0:
            self.started = time.monotonic()
        delay = retry_delay(err, self.attempt, time.monotonic() - self.started,
                            self.max_retries, self.budget)
        if delay is not None:
            self.attempt += 1
        return delay


def new_turn_id() -> str:
    """A fresh random turn id (for a caller that wants one turn per call of ``dispatch``)."""
    return "py-" + os.urandom(8).hex()


def turn_id_of(body: bytes) -> str:
    """The turn id of a dispatch whose caller named none: ``m-`` and a digest of the message as
    sent. The turn id is part of each call's identity on the server, so the same model message
    sent again — a retry, a harness replaying it after a restart — names the same turn and its
    calls are answered from their first answers, while another model response (its own id, other
    calls) names another turn, even when its provider reuses the ``tool_use_id`` values."""
    return "m-" + hashlib.sha256(body).hexdigest()[:32]


# --- request bodies ------------------------------------------------------------------------

def _dump_model(obj: Any) -> Any:
    try:
        return obj.model_dump(mode="json", exclude_none=True)
    except TypeError:
        return obj.model_dump()


def json_default(obj: Any) -> Any:
    """``json.dumps`` hook: SDK (pydantic) objects anywhere inside a document are dumped."""
    if hasattr(obj, "model_dump"):
        return _dump_model(obj)
    if hasattr(obj, "dict") and callable(obj.dict):  # pydantic v1 models
        return obj.dict()
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


_dumps = json.JSONEncoder(default=json_default, separators=(",", ":"), ensure_ascii=False).encode


def dumps(document: Any) -> bytes:
    return _dumps(document).encode("utf-8")


def as_document(message: Any) -> Any:
    """The top level of a message as a dict or list: a JSON string is parsed, an SDK object
    dumped. Objects nested inside a dict are left for :func:`dumps`."""
    if hasattr(message, "model_dump"):
        return _dump_model(message)
    if isinstance(message, (bytes, bytearray)):
        message = message.decode("utf-8")
    if isinstance(message, str):
        return json.loads(message)
    return message


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def detect_format(document: Any, format: Optional[str]) -> str:
    """``format`` if given, else ``openai`` for an OpenAI message, completion or ``tool_calls``
    array, else ``anthropic``."""
    if format is not None:
        if format not in FORMATS:
            raise ValueError(f"format must be one of {FORMATS}, not {format!r}")
        return format
    if isinstance(document, dict):
        if "tool_calls" in document or "choices" in document:
            return "openai"
    elif isinstance(document, list) and document:
        first = document[0]
        if _get(first, "type") == "function" or _get(first, "function") is not None:
            return "openai"
    return "anthropic"


def called_tools(document: Any, fmt: str) -> Optional[List[str]]:
    """The names of the tools a model answer calls, in order: ``[]`` when it calls none, None
    when the shape is not one this function knows (the server then decides)."""
    if fmt == "anthropic":
        if isinstance(document, dict):
            if "content" not in document:
                return None
            content = document["content"]
        else:
            content = document
        if isinstance(content, str):
            return []
        if not isinstance(content, list):
            return None
        return [_get(b, "name") for b in content if _get(b, "type") == "tool_use"]
    # openai
    if isinstance(document, dict):
        if "choices" in document:
            choices = document["choices"]
            if not choices:
                return None
            message = _get(choices[0], "message")
            calls = _get(message, "tool_calls") if message is not None else None
        elif "tool_calls" in document:
            calls = document["tool_calls"]
        else:
            return None
    else:
        calls = document
    if not calls:
        return [] if calls is None or isinstance(calls, list) else None
    if not isinstance(calls, list):
        return None
    return [_get(_get(c, "function"), "name") for c in calls]


# --- server-sent events ----------------------------------------------------------------------

class SseDecoder:
    """Turns the bytes of an SSE body, as they arrive, into ``(event, data)`` pairs."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> List[Tuple[str, bytes]]:
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        out: List[Tuple[str, bytes]] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            event = _parse_block(buf[start:end])
            start = end + 2
            if event is not None:
                out.append(event)
        self._buf = buf[start:] if start else buf
        return out


def _parse_block(block: bytes) -> Optional[Tuple[str, bytes]]:
    event = "message"
    data: List[bytes] = []
    for line in block.split(b"\n"):
        if not line or line[:1] == b":":
            continue
        field, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if field == b"event":
            event = value.decode("utf-8", "replace")
        elif field == b"data":
            data.append(value)
    if not data and event == "message":
        return None
    return event, b"\n".join(data)


class StreamState:
    """Interprets the events of a streamed dispatch: ``result`` items are returned, ``done``
    sets ``answer``, ``error`` raises; ``call`` and ``approval_required`` go to the callbacks."""

    def __init__(self) -> None:
        self.answer: Any = None
        self.done = False
        self.approvals: List[Any] = []
        self._decoder = SseDecoder()

    def feed(self, chunk: bytes) -> Iterator[Tuple[str, Any]]:
        """The events of the next bytes of the body, for the client to act on one by one, in
        order: ``("call", call)`` (run the client tool), ``("approval", request)`` (answer it)
        and ``("result", (index, result))`` (yield it). Lazy: an ``error`` event raises only
        once the events before it have been acted on."""
        for event, data in self._decoder.feed(chunk):
            if event == "call":
                yield "call", json.loads(data)
            elif event == "approval_required":
                request = json.loads(data)
                self.approvals.append(request)
                yield "approval", request
            else:
                item = self.handle(event, data)
                if item is not None:
                    yield "result", item

    def handle(self, event: str, data: bytes) -> Optional[Tuple[int, Any]]:
        if event == "result":
            item = json.loads(data)
            return item["index"], item["result"]
        if event == "done":
            self.answer = json.loads(data)
            self.done = True
            return None
        if event == "error":
            try:
                err = json.loads(data).get("error", {})
            except ValueError:
                err = {}
            raise SwitchboardError(err.get("code", "internal"),
                                   err.get("message", data.decode("utf-8", "replace")), 200)
        return None


# --- client-tool answers ---------------------------------------------------------------------

_BLOCK_TYPES = ("text", "image")


def answer_content(value: Any) -> Any:
    """A tool function's return value as the ``content`` of a call's answer: a str as is, None
    as ``""``, a list of content blocks (text, image) as is, anything else as JSON text."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", "replace")
    if isinstance(value, list) and value:
        blocks = [_dump_model(b) if hasattr(b, "model_dump") else b for b in value]
        if all(isinstance(b, dict) and b.get("type") in _BLOCK_TYPES for b in blocks):
            return blocks
    if hasattr(value, "model_dump_json"):
        return value.model_dump_json()
    try:
        return _dumps(value)
    except (TypeError, ValueError):
        return str(value)


def answer_body(value: Any = None, error: Optional[BaseException] = None) -> bytes:
    if isinstance(error, ToolError):
        return error_body(str(error.message))
    if error is not None:
        text = str(error)
        name = type(error).__name__
        return dumps({"content": f"{name}: {text}" if text else name, "is_error": True})
    return dumps({"content": answer_content(value), "is_error": False})


def error_body(text: str) -> bytes:
    return dumps({"content": text, "is_error": True})


def prepare(message: Any, format: Optional[str]) -> Tuple[str, Optional[List[str]], bytes]:
    """A dispatch's format, the names of the tools it calls (``[]``: none, ``None``: unknown)
    and its body."""
    document = as_document(message)
    fmt = detect_format(document, format)
    return fmt, called_tools(document, fmt), dumps(document)


def format_query(fmt: str) -> str:
    return f"?format={fmt}"


def session_body(workspace: Optional[str], tools: Sequence[Mapping[str, Any]], sandbox: Any) -> bytes:
    body: Dict[str, Any] = {}
    if workspace is not None:
        body["workspace"] = workspace
    if tools:
        body["tools"] = list(tools)
    if sandbox is not None:
        body["sandbox"] = sandbox
    return dumps(body)


ApprovalCallback = Callable[[Any], Any]


# --- what a session and a streamed dispatch are, sync or async ---------------------------------

class SessionBase(SessionTools):
    """The state of a session (:class:`Session`, :class:`AsyncSession`) and what of it is not
    I/O: the body that creates it on the server, and what the server's answer sets."""

    _base: str          # the session's path on the server, once created

    def __init__(self, client: Any, workspace: Optional[str], tools: Optional[List[Any]],
                 sandbox: Any) -> None:
        super().__init__(tools)
        self._client = client
        self._workspace_name = workspace
        self._sandbox = sandbox
        self._id: Optional[str] = None
        self._workspace: Optional[str] = None
        self._closed = False

    def _create_body(self) -> bytes:
        return session_body(self._workspace_name, self._registry.specs(), self._sandbox)

    def _adopt(self, created: Dict[str, Any]) -> str:
        """Takes the server's answer to the creation; the id last (a set id means created)."""
        self._workspace = created["workspace"]
        self._base = f"/v1/sessions/{created['session_id']}"
        self._id = created["session_id"]
        return self._id

    @property
    def created(self) -> bool:
        return self._id is not None


class StreamBase:
    """A streamed dispatch (:class:`DispatchStream`, :class:`AsyncDispatchStream`) before its
    I/O: what it sends, where, and the state of its answer."""

    def __init__(self, session: Any, fmt: str, body: bytes, turn_id: str,
                 on_approval: Optional[Callable[[Any], Any]]):
        self._session, self._fmt, self._body = session, fmt, body
        self.turn_id = turn_id
        self._on_approval = on_approval
        self._state = StreamState()

    @property
    def answer(self) -> Any:
        """The complete ordered answer (set once the stream has ended)."""
        return self._state.answer

    def _request(self) -> Tuple[str, Dict[str, str]]:
        """The path and headers of the streamed dispatch (the session exists)."""
        session = self._session
        return (f"{session._base}/dispatch?format={self._fmt}&stream=true",
                {**session._client._stream_headers, TURN_HEADER: self.turn_id})
