"""Client for ``switchboard serve``, the Switchboard tool-dispatch engine as an HTTP sidecar.

A harness opens a session (one per conversation), hands each model answer to
``session.dispatch`` and appends what comes back::

    from switchboard_client import Client

    with Client("http://127.0.0.1:7420", token="...") as client, client.session() as session:
        messages.append(session.dispatch(response))   # the tool_result user message

``dispatch`` accepts a dict, a JSON string, or any object with ``model_dump()`` (the
``anthropic`` SDK's ``Message``, the ``openai`` SDK's ``ChatCompletionMessage`` or
``ChatCompletion``). ``AsyncClient`` is the same with ``async``/``await``. Every failure raises
:class:`SwitchboardError`, whose ``code`` is the server's stable error code.
"""

from ._async import AsyncClient, AsyncDispatchStream, AsyncSession
from ._common import SwitchboardError
from ._sync import Client, DispatchStream, Session

__all__ = [
    "AsyncClient",
    "AsyncDispatchStream",
    "AsyncSession",
    "Client",
    "DispatchStream",
    "Session",
    "SwitchboardError",
]
