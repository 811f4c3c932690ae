"""What the sync and async clients share: the error types, headers and request bodies, format
detection, the incremental SSE decoder and the stream's events, client-tool answers, the retry
rule, the threads of plain-function client tools, and the I/O-free halves of a session and of a
streamed dispatch. No I/O here."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import queue
import threading
import time
from concurrent.futures import Executor, Future
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
#: How much of a malformed answer a ``bad_response`` error quotes.
_QUOTED = 200


class SwitchboardError(Exception):
    """A request that failed. ``code`` is the server's error code (``unauthorized``,
    ``unknown_session``, ``bad_request``, ``payload_too_large``, ``too_many_sessions``,
    ``overloaded``, ``shutting_down``, ``session_moved``, ...), ``connection_error`` when
    the server could not be reached (or the connection broke), or ``bad_response`` when what
    came back is not what the server sends (not JSON, cut short, a malformed event); ``status``
    is the HTTP status (None for connection errors); ``retry_after`` the seconds the server
    asked to wait (with ``overloaded``)."""

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


def tool_executor() -> "ToolThreads":
    """The worker threads of a client's plain-function client tools."""
    return ToolThreads()


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


def bad_response(what: str, data: Any = b"", status: Optional[int] = None) -> SwitchboardError:
    """``bad_response``: ``what`` is wrong with an answer (``data``, quoted in part)."""
    if isinstance(data, (bytes, bytearray)):
        data = bytes(data[:_QUOTED]).decode("utf-8", "replace")
    quoted = f": {str(data)[:_QUOTED]!r}" if data else ""
    return SwitchboardError("bad_response", f"{what}{quoted}", status)


def loads(data: bytes, what: str = "the server's answer is not JSON",
          status: Optional[int] = None) -> Any:
    """``json.loads``, raising :func:`bad_response` instead of a ``ValueError``."""
    try:
        return json.loads(data)
    except ValueError:
        raise bad_response(what, data, status) from None


def json_answer(data: bytes, content_type: Optional[str], status: int) -> Any:
    """The JSON document of a 2xx answer (None when empty); ``bad_response`` for anything else
    (an HTML page from a proxy, a body cut short)."""
    if not data:
        return None
    return loads(data, f"the server's {status} answer ({content_type or 'no content type'}) "
                       "is not JSON", status)


def check_event_stream(content_type: Optional[str], status: int) -> None:
    """Raises ``bad_response`` when a streamed dispatch was answered with something else than
    an event stream (an HTML page from a proxy, a JSON document)."""
    if content_type and not content_type.lower().startswith("text/event-stream"):
        raise bad_response(f"a streamed dispatch was answered {status} with {content_type}, "
                           "not text/event-stream", status=status)


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


#: The waits before the re-sends of a request whose connection failed before any answer: at
#: once (a keep-alive connection the server had just closed), then backing off while the server
#: restarts (connections refused), at most :data:`RECONNECT_MAX` seconds apart.
RECONNECT_FIRST, RECONNECT_NEXT, RECONNECT_MAX = 0.0, 0.25, 2.0


def reconnect_delay(reconnect: int) -> float:
    """The wait before the re-send that follows the ``reconnect``-th failed connection (0-based)."""
    if reconnect == 0:
        return RECONNECT_FIRST
    return min(RECONNECT_MAX, RECONNECT_NEXT * 2 ** (reconnect - 1))


class Retries:
    """The retries of one request, within one bound: at most ``max_retries`` of them, and no
    wait that would end past ``budget`` seconds from the first failure. :meth:`delay` is the
    wait before the next attempt after the refusal ``err`` (see :func:`retry_delay`),
    :meth:`reconnect` the wait before re-sending after a connection that failed before any
    answer (see :func:`reconnect_delay`); None from either: give up."""

    __slots__ = ("max_retries", "budget", "attempt", "reconnects", "started")

    def __init__(self, max_retries: int, budget: float) -> None:
        self.max_retries, self.budget = max_retries, budget
        self.attempt, self.reconnects, self.started = 0, 0, 0.0

    def _elapsed(self) -> float:
        if self.attempt == 0:
            self.started = time.monotonic()
        return time.monotonic() - self.started

    def delay(self, err: SwitchboardError) -> Optional[float]:
        delay = retry_delay(err, self.attempt, self._elapsed(), self.max_retries, self.budget)
        if delay is not None:
            self.attempt += 1
        return delay

    def reconnect(self) -> Optional[float]:
        elapsed = self._elapsed()
        delay = reconnect_delay(self.reconnects)
        if self.attempt >= self.max_retries or elapsed + delay > self.budget:
            return None
        self.attempt += 1
        self.reconnects += 1
        return delay


#: What may be re-sent after a connection that failed before any answer. ``ANY``: every request
#: the client makes but the creation of a session — a turn (its turn id makes the copy answered
#: from the first one's answers, never run twice), a client-tool answer (a second one is
#: ``already_answered``), an approval, a cancel, a delete, a read. ``UNSENT``: only when the
#: request cannot have reached the server (the connection was refused or never made): a second
#: ``POST /v1/sessions`` would make a second session.
RESEND_ANY, RESEND_UNSENT = "any", "unsent"


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
    sets ``answer``, ``error`` raises; ``call``, ``approval_required`` and ``progress`` go to the
    callbacks."""

    def __init__(self) -> None:
        self.answer: Any = None
        self.done = False
        self.approvals: List[Any] = []
        self._decoder = SseDecoder()

    def feed(self, chunk: bytes) -> Iterator[Tuple[str, Any]]:
        """The events of the next bytes of the body, for the client to act on one by one, in
        order: ``("call", call)`` (run the client tool), ``("approval", request)`` (answer it),
        ``("progress", event)`` (a running call's live progress) and ``("result", (index,
        result))`` (yield it). Lazy: an ``error`` event raises only once the events before it
        have been acted on."""
        for event, data in self._decoder.feed(chunk):
            if event == "call":
                call = _event(event, data)
                if not isinstance(call, dict) or not isinstance(call.get("call_id"), str):
                    raise bad_response("a malformed `call` event", data, 200)
                yield "call", call
            elif event == "approval_required":
                request = _event(event, data)
                if not isinstance(request, dict) or "approval_id" not in request:
                    raise bad_response("a malformed `approval_required` event", data, 200)
                self.approvals.append(request)
                yield "approval", request
            elif event == "progress":
                update = _event(event, data)
                if not isinstance(update, dict) or not isinstance(update.get("tool_use_id"), str):
                    raise bad_response("a malformed `progress` event", data, 200)
                yield "progress", update
            else:
                item = self.handle(event, data)
                if item is not None:
                    yield "result", item

    def handle(self, event: str, data: bytes) -> Optional[Tuple[int, Any]]:
        if event == "result":
            item = _event(event, data)
            try:
                return int(item["index"]), item["result"]
            except (KeyError, TypeError, ValueError):
                raise bad_response("a malformed `result` event", data, 200) from None
        if event == "done":
            self.answer = _event(event, data)
            self.done = True
            return None
        if event == "error":
            try:
                err = json.loads(data).get("error", {})
            except ValueError:
                err = {}
            if not isinstance(err, dict):
                err = {}
            raise SwitchboardError(err.get("code", "internal"),
                                   err.get("message", data.decode("utf-8", "replace")), 200)
        return None


def _event(event: str, data: bytes) -> Any:
    return loads(data, f"the data of an `{event}` event is not JSON", 200)


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
    """The body answering a call with the function's ``value``, or with the ``error`` it
    raised. Never raises: a value that cannot be sent (blocks holding an object JSON cannot
    carry, a ``str()`` that raises) is answered as an error naming why, and so is an
    exception whose ``str()`` raises; text that is not valid Unicode is sent replaced."""
    if error is None:
        try:
            return _answer_bytes({"content": answer_content(value), "is_error": False})
        except Exception as e:  # noqa: BLE001 - whatever the value does, the call is answered
            error = e
    if isinstance(error, ToolError):
        return error_body(safe_text(error.message))
    name = type(error).__name__
    text = safe_text(error)
    return error_body(f"{name}: {text}" if text else name)


def error_body(text: str) -> bytes:
    return _answer_bytes({"content": text, "is_error": True})


def refused_body(err: SwitchboardError) -> bytes:
    """The error answer of a call whose answer the server refused (``err``, a 4xx: larger
    than its ``--max-body``, an image by URL, ...), so the model learns why at once."""
    return error_body(f"SwitchboardError: the server refused this tool's answer ({err.code}): "
                      f"{safe_text(err.message)[:1000]}")


def safe_text(obj: Any) -> str:
    """``str(obj)``, or a description of ``obj`` when its ``str()`` raises."""
    try:
        return str(obj)
    except Exception as e:  # noqa: BLE001 - a broken __str__ is the object's, not ours
        return f"<{type(obj).__name__} object whose str() raised {type(e).__name__}>"


def _answer_bytes(document: Any) -> bytes:
    return _dumps(document).encode("utf-8", "replace")


def call_expired(call: Mapping[str, Any], received: float) -> bool:
    """Whether the deadline of a client-tool call, handed over at ``received``
    (``time.monotonic()``), has passed: the engine has answered it ``timeout`` itself, so its
    function must not start."""
    deadline_ms = call.get("deadline_ms")
    if isinstance(deadline_ms, bool) or not isinstance(deadline_ms, (int, float)):
        return False
    return time.monotonic() - received >= deadline_ms / 1000


class CallExpired(Exception):
    """A client-tool call's deadline passed before its function could start."""


def start_in_time(call: Mapping[str, Any], received: float, fn: Callable[..., Any], /,
                  *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, unless the call's deadline has passed (:class:`CallExpired`)."""
    if call_expired(call, received):
        raise CallExpired(call.get("call_id"))
    return fn(*args, **kwargs)


#: Seconds an idle tool thread waits for the next call before it ends, and how many may wait.
IDLE_S, KEEP_IDLE = 30.0, 32
_Job = Tuple["Future[Any]", Callable[..., Any], Tuple[Any, ...], Dict[str, Any]]


class ToolThreads(Executor):
    """The threads of a client's plain-function client tools. Every call starts at once on a
    thread of its own — one an earlier call left idle, else a new one — so a function that
    hangs holds its own thread only, never a place other calls (of this session or any other)
    wait for. The number of threads is not bounded here: the engine bounds the calls in flight
    (a turn's calls, ``--max-requests`` turns), and a hung function holds a thread whatever the
    pool. An idle thread ends after :data:`IDLE_S` seconds; at most :data:`KEEP_IDLE` wait.
    Daemon threads: the interpreter's exit does not wait for a hung function. After
    :meth:`shutdown` nothing starts (``submit`` raises ``RuntimeError``)."""

    def __init__(self, name: str = "switchboard-tool") -> None:
        self._lock = threading.Lock()
        self._jobs: "queue.SimpleQueue[Optional[_Job]]" = queue.SimpleQueue()
        self._idle = 0          # threads waiting on _jobs, less the jobs put there for them
        self._closed = False
        self._name = name
        self._numbers = itertools.count(1)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> "Future[Any]":
        future: "Future[Any]" = Future()
        job: _Job = (future, fn, args, kwargs)
        with self._lock:
            if self._closed:
                raise RuntimeError("the client is closed: no client-tool call starts")
            if self._idle:
                self._idle -= 1
                self._jobs.put(job)
                return future
        threading.Thread(target=self._work, args=(job,), daemon=True,
                         name=f"{self._name}-{next(self._numbers)}").start()
        return future

    def _work(self, job: Optional[_Job]) -> None:
        while job is not None:
            future, fn, args, kwargs = job
            job = None
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:  # noqa: BLE001 - handed to the future
                    future.set_exception(e)
            del future, fn, args, kwargs
            job = self._next()

    def _next(self) -> Optional[_Job]:
        """The next job for a thread that finished one, or None: it ends."""
        with self._lock:
            if self._closed or self._idle >= KEEP_IDLE:
                return None
            self._idle += 1
        try:
            return self._jobs.get(timeout=IDLE_S)
        except queue.Empty:
            with self._lock:  # a job put for this thread while it timed out is still its own
                try:
                    return self._jobs.get_nowait()
                except queue.Empty:
                    self._idle -= 1
                    return None

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stops starting calls and ends the idle threads; calls running go on (a thread
        cannot be stopped). Does not wait."""
        with self._lock:
            self._closed = True
            for _ in range(self._idle):
                self._jobs.put(None)
            self._idle = 0


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
        try:
            session_id, workspace = created["session_id"], created["workspace"]
        except (KeyError, TypeError):
            raise bad_response("the answer to a session's creation has no session_id and "
                               "workspace", safe_text(created), 201) from None
        if not isinstance(session_id, str) or not session_id:
            raise bad_response("the answer to a session's creation has no session id",
                               safe_text(created), 201)
        self._workspace = workspace
        self._base = f"/v1/sessions/{session_id}"
        self._id = session_id
        return self._id

    @property
    def created(self) -> bool:
        return self._id is not None


class StreamBase:
    """A streamed dispatch (:class:`DispatchStream`, :class:`AsyncDispatchStream`) before its
    I/O: what it sends, where, and the state of its answer."""

    def __init__(self, session: Any, fmt: str, body: bytes, turn_id: str,
                 on_approval: Optional[Callable[[Any], Any]],
                 on_progress: Optional[Callable[[Any], Any]] = None):
        self._session, self._fmt, self._body = session, fmt, body
        self.turn_id = turn_id
        self._on_approval = on_approval
        self._on_progress = on_progress
        # Whether the stream asks for progress: for ``on_progress`` or ``events()``.
        self._progress = on_progress is not None
        self._state = StreamState()

    @property
    def answer(self) -> Any:
        """The complete ordered answer (set once the stream has ended)."""
        return self._state.answer

    def events(self) -> Any:
        """The stream's results and live progress together, in the order they come:
        ``("progress", event)`` and ``("result", (index, result))``; ``answer`` at the end. An
        iterator (an async iterator for :class:`AsyncDispatchStream`); read a stream once,
        either this way or for its results alone."""
        if getattr(self, "_iter", None) is not None:
            raise RuntimeError("this stream is already being read")
        self._progress = True
        self._iter = self._run()  # type: ignore[attr-defined]
        return self._iter

    def _request(self) -> Tuple[str, Dict[str, str]]:
        """The path and headers of the streamed dispatch (the session exists)."""
        session = self._session
        progress = "" if self._progress else "&progress=false"
        return (f"{session._base}/dispatch?format={self._fmt}&stream=true{progress}",
                {**session._client._stream_headers, TURN_HEADER: self.turn_id})
