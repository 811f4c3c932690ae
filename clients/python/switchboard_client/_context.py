"""What a client tool's function knows about the call it runs: a :class:`ToolCallContext`,
handed to a parameter annotated with it or read with :func:`current_call`, through which it
also reports its progress (sent by a :class:`Reporter`); and :func:`idempotency_key`, the
server's derivation of a call's key, for computing it again."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import inspect
import json
import logging
import threading
import types
import typing
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Union

log = logging.getLogger("switchboard_client")

#: The most unsent output text one call's reports hold; more is left out (the server's cap of a
#: call's unsent progress is the same).
REPORT_PENDING = 64 * 1024
#: How long a call's answer waits for its progress reports still on their way, in seconds.
REPORTS_BEFORE_ANSWER = 1.0

_UnionType: Any = getattr(types, "UnionType", None)  # X | Y (3.10+)


@dataclasses.dataclass(frozen=True)
class ToolCallContext:
    """One client-tool call, as the server handed it over (``event: call``).

    ``idempotency_key`` is the same for every copy of the call — a turn sent again, a run after
    a restart of the server — and another for a new ``tool_use_id`` or another session: send it
    to the service behind the tool (an ``Idempotency-Key`` header) so that it can recognise a
    call it has already seen. It is ``None`` only from a server older than this client."""

    #: The server's id of this call (``POST .../calls/{call_id}`` answers it).
    call_id: str
    #: The model's id of the call (``tool_use.id`` / ``tool_call.id``).
    tool_use_id: str
    #: The tool's name.
    name: str
    #: Milliseconds left of the call's deadline when it was handed over.
    deadline_ms: int
    #: The call's idempotency key (``sb1-`` and 32 hex digits).
    idempotency_key: Optional[str]
    _reporter: Optional["Reporter"] = dataclasses.field(default=None, compare=False,
                                                        repr=False)

    @classmethod
    def from_event(cls, call: Mapping[str, Any],
                   reporter: Optional["Reporter"] = None) -> "ToolCallContext":
        return cls(call_id=call.get("call_id", ""), tool_use_id=call.get("tool_use_id", ""),
                   name=call.get("name", ""), deadline_ms=call.get("deadline_ms", 0),
                   idempotency_key=call.get("idempotency_key"), _reporter=reporter)

    def progress(self, progress: float, total: Optional[float] = None,
                 message: Optional[str] = None) -> None:
        """Reports how far the call is (``progress`` of ``total`` when known, with what it is
        doing): the turn's stream shows it as the call's live progress. Never blocks on the
        server and never raises; reports that come faster than they can be sent are joined
        (the newest value wins)."""
        if self._reporter is not None:
            body: Dict[str, Any] = {"progress": progress}
            if total is not None:
                body["total"] = total
            if message is not None:
                body["message"] = message
            self._reporter.value(body)

    def output(self, text: str, stream: str = "stdout") -> None:
        """Reports output the call produced (``stream``: ``stdout`` or ``stderr``), shown on
        the turn's stream as it comes; the call's result is still what the function returns.
        Text reported faster than it can be sent is joined, up to 64 KiB unsent."""
        if self._reporter is not None:
            self._reporter.text(text, "stderr" if stream == "stderr" else "stdout")


class Reporter:
    """Sends one client-tool call's progress reports (``POST .../calls/{id}/progress``), one
    at a time: what comes while one is on its way is joined — text appended (at most
    :data:`REPORT_PENDING` bytes unsent, the rest left out), a value replaced by the newest.
    ``start`` runs ``drain`` somewhere else (a thread, a task) when nothing is sending; a report
    the server refuses (the call answered meanwhile) is logged at debug and dropped."""

    def __init__(self, start: Callable[["Reporter"], None]) -> None:
        self._start = start
        self._lock = threading.Lock()
        self._text: Dict[str, str] = {"stdout": "", "stderr": ""}
        self._value: Optional[Dict[str, Any]] = None
        self._busy = False
        self._idle = threading.Event()
        self._idle.set()

    @property
    def busy(self) -> bool:
        """Whether reports are still on their way."""
        return not self._idle.is_set()

    def wait_idle(self, timeout: float) -> bool:
        """Waits (at most ``timeout`` seconds) until every report made so far was sent."""
        return self._idle.wait(timeout)

    def text(self, text: str, stream: str) -> None:
        with self._lock:
            room = REPORT_PENDING - len(self._text["stdout"]) - len(self._text["stderr"])
            self._text[stream] += text[:max(room, 0)]
            self._kick()

    def value(self, body: Dict[str, Any]) -> None:
        with self._lock:
            self._value = body
            self._kick()

    def _kick(self) -> None:
        if not self._busy:
            self._busy = True
            self._idle.clear()
            self._start(self)

    def take(self) -> List[bytes]:
        """The bodies to send now (empty: nothing more; the reporter is idle again)."""
        with self._lock:
            bodies = []
            if self._value is not None:
                bodies.append(json.dumps(self._value).encode())
            for stream in ("stdout", "stderr"):
                if self._text[stream]:
                    bodies.append(json.dumps({"text": self._text[stream],
                                              "stream": stream}).encode())
            self._value, self._text = None, {"stdout": "", "stderr": ""}
            if not bodies:
                self._busy = False
                self._idle.set()
            return bodies


_CURRENT: "contextvars.ContextVar[Optional[ToolCallContext]]" = contextvars.ContextVar(
    "switchboard_current_call", default=None)


def current_call() -> Optional[ToolCallContext]:
    """The call the running client tool serves (in its thread or task, and in what it calls),
    or ``None`` outside a client tool. For code that cannot take a context parameter: a
    helper deep down, a function whose signature you do not choose."""
    return _CURRENT.get()


@contextlib.contextmanager
def calling(context: ToolCallContext) -> Iterator[None]:
    """Makes ``context`` the :func:`current_call` while the block runs."""
    token = _CURRENT.set(context)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def idempotency_key(session_id: str, tool_use_id: str, turn_id: Optional[str] = None) -> str:
    """The idempotency key the server gives call ``tool_use_id`` of session ``session_id``:
    ``sb1-`` and the first 32 hex digits of the SHA-256 of ``switchboard-idempotency-v1``, NUL,
    the session id, NUL, the turn id (empty when none), NUL, the ``tool_use_id``. Pass the turn
    id the dispatch named (``turn_id_of(body)`` when its caller named none) to get the key the
    server sends."""
    data = b"\0".join(s.encode() for s in ("switchboard-idempotency-v1", session_id,
                                            turn_id or "", tool_use_id))
    return "sb1-" + hashlib.sha256(data).hexdigest()[:32]


def is_context_hint(hint: Any) -> bool:
    """Whether a parameter's type hint asks for the call's context (``ToolCallContext`` or
    ``Optional[ToolCallContext]``, also as a string under ``from __future__ import
    annotations`` that did not resolve)."""
    if hint is ToolCallContext or hint == "ToolCallContext":
        return True
    origin = typing.get_origin(hint)
    if origin is not Union and (_UnionType is None or origin is not _UnionType):
        return False
    args = typing.get_args(hint)
    return ToolCallContext in args and all(a is ToolCallContext or a is type(None) for a in args)


def context_parameter(fn: Any) -> Optional[str]:
    """The name of ``fn``'s parameter that takes the call's context, if it has one."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # unresolvable forward references: the raw annotations
        hints = {}
    for p in sig.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            continue
        if is_context_hint(hints.get(p.name, p.annotation)):
            return p.name
    return None
