"""What a client tool's function knows about the call it runs: a :class:`ToolCallContext`,
handed to a parameter annotated with it or read with :func:`current_call`; and
:func:`idempotency_key`, the server's derivation of a call's key, for computing it again."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import inspect
import types
import typing
from typing import Any, Iterator, Mapping, Optional, Union

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

    @classmethod
    def from_event(cls, call: Mapping[str, Any]) -> "ToolCallContext":
        return cls(call_id=call.get("call_id", ""), tool_use_id=call.get("tool_use_id", ""),
                   name=call.get("name", ""), deadline_ms=call.get("deadline_ms", 0),
                   idempotency_key=call.get("idempotency_key"))


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
