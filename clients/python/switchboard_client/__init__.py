"""Client for ``switchboard serve``, the Switchboard tool-dispatch engine as an HTTP sidecar.

A harness opens a session (one per conversation), hands each model answer to
``session.dispatch`` and appends what comes back::

    from switchboard_client import Client

    with Client("http://127.0.0.1:7420", token="...") as client, client.session() as session:
        @session.tool
        def lookup(key: str) -> str:
            "Looks a key up in the platform's store."
            return store[key]

        messages.append(session.dispatch(response))   # the tool_result user message, or None

``dispatch`` accepts a dict (SDK objects may be nested anywhere inside), a JSON string, or any
object with ``model_dump()`` (the ``anthropic`` SDK's ``Message``, the ``openai`` SDK's
``ChatCompletionMessage`` or ``ChatCompletion``), and runs the session's client tools (the
platform's own functions) as the server hands their calls over. ``session.start`` runs a turn
in the background with a handle to cancel it. ``AsyncClient`` is the same with
``async``/``await``. Every failure raises :class:`SwitchboardError`, whose ``code`` is the
server's stable error code. A client tool raises :class:`ToolError` to choose the error text the
model sees; a parameter annotated :class:`ToolCallContext` (or :func:`current_call`) gives it
its call's ids and idempotency key. ``local()`` starts the ``switchboard`` binary installed with the
``switchboard-sidecar`` wheel as a private sidecar and returns a ``Client`` connected to it (closing
it stops the server). The guide is ``docs/python.md``.
"""

from ._async import AsyncClient, AsyncDispatchStream, AsyncSession, AsyncTurn
from ._common import SwitchboardError, ToolError
from ._context import ToolCallContext, current_call, idempotency_key
from ._local import (AsyncLocalClient, LocalClient, LocalServer, LocalServerError, find_binary, local,
                     local_async)
from ._sync import Client, DispatchStream, Session, Turn
from ._tools import function_schema, tool_spec, type_schema

__all__ = [
    "AsyncClient",
    "AsyncDispatchStream",
    "AsyncLocalClient",
    "AsyncSession",
    "AsyncTurn",
    "Client",
    "DispatchStream",
    "LocalClient",
    "LocalServer",
    "LocalServerError",
    "Session",
    "SwitchboardError",
    "ToolCallContext",
    "ToolError",
    "Turn",
    "current_call",
    "find_binary",
    "function_schema",
    "idempotency_key",
    "local",
    "local_async",
    "tool_spec",
    "type_schema",
]
