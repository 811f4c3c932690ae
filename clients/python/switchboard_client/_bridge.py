"""What the framework adapters (``switchboard_client.langgraph``, ``switchboard_client.agents``)
share: the private event-loop thread their sessions live on, the engine's built-in catalog, and
the small helpers of a turn. Private: not part of the package's API."""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import threading
import weakref
from typing import Any, Callable, Coroutine, Dict, List, Optional, Tuple, Union

from ._async import AsyncClient
from ._tools import _OPTION_KEYS, check_defer, check_effect

URL_ENV = "SWITCHBOARD_URL"
DEFAULT_URL = "http://127.0.0.1:7420"
BUILTIN_NAMES = ("bash", "read_file", "write_file", "edit_file", "glob")
#: The engine options a tool may carry (``tool_options=``, a LangChain tool's
#: ``metadata["switchboard"]``), passed on to ``session.register``.
OPTION_KEYS = _OPTION_KEYS


# --------------------------------------------------------------------------------------------
# The private event loop an adapter's sessions live on.
# --------------------------------------------------------------------------------------------

class LoopThread:
    """One daemon thread running an event loop; an adapter's sessions (and their HTTP pools)
    live there, so they never depend on the loop — or the lack of one — of whoever calls the
    adapter (``Runner.run_sync`` makes a new loop per run, ``invoke`` has none).

    Each adapter has its own: a subclass naming its thread and the caller in errors, with its
    own ``_instance``. ``get()`` makes it on first use."""

    thread_name = "switchboard"
    caller = "switchboard adapter"
    _lock = threading.Lock()
    _instance: Optional["LoopThread"] = None

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever,
                                       name=self.thread_name, daemon=True)
        self.thread.start()
        # The adapter objects whose sessions are deleted at exit: object -> its async close.
        self.live: "weakref.WeakKeyDictionary[Any, Callable[[Any], Coroutine[Any, Any, Any]]]" = \
            weakref.WeakKeyDictionary()

    @classmethod
    def get(cls) -> Any:
        with LoopThread._lock:
            instance = cls.__dict__.get("_instance")
            if instance is None:
                instance = cls._instance = cls()
                _THREADS.append(instance)
            return instance

    def run(self, coro: Any) -> Any:
        """Runs ``coro`` on the loop and blocks the calling thread for its result."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError(f"{self.caller} called from its own event-loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def arun(self, coro: Any) -> Any:
        """Runs ``coro`` on the loop; cancelling the caller cancels it."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def close_at_exit(self, obj: Any, close: Callable[[Any], Coroutine[Any, Any, Any]]) -> None:
        """Runs ``close(obj)`` on the loop at interpreter exit if ``obj`` is still alive."""
        self.live[obj] = close


_THREADS: List[LoopThread] = []


@atexit.register
def _close_live() -> None:
    """Deletes the sessions of adapters still open at exit (best effort, a few seconds each)."""
    for thread in list(_THREADS):
        for obj, close in list(thread.live.items()):
            try:
                asyncio.run_coroutine_threadsafe(close(obj), thread.loop).result(timeout=5)
            except Exception:
                pass


async def on_loop(loop: Optional[asyncio.AbstractEventLoop], coro: Any) -> Any:
    """Awaits ``coro`` on ``loop`` (the caller's loop) from the private loop, or right here
    when ``loop`` is ``None`` (the caller had no loop) or is this loop."""
    if loop is None or loop is asyncio.get_running_loop():
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


# --------------------------------------------------------------------------------------------
# Clients, options and turns.
# --------------------------------------------------------------------------------------------

def check_client(client: Any) -> None:
    if client is not None and not isinstance(client, (AsyncClient, str)):
        raise TypeError("client must be an AsyncClient or a base URL (the adapter drives it "
                        f"from its own event loop), not {type(client).__name__}")


def make_client(client: Union[AsyncClient, str, None]) -> AsyncClient:
    """The ``AsyncClient`` given, or a new one for the URL given (default ``$SWITCHBOARD_URL``,
    else ``http://127.0.0.1:7420``)."""
    if isinstance(client, AsyncClient):
        return client
    return AsyncClient(client or os.environ.get(URL_ENV) or DEFAULT_URL)


def own_client(client: Union["Client", AsyncClient, str, None]) -> AsyncClient:
    """An adapter's own ``AsyncClient``, used on its private loop only. For a ``Client`` or an
    ``AsyncClient`` (``local()``'s and ``local_async()``'s too): a new one to the same server,
    with its token, read timeout and retries — the one given is never used, so it stays the
    caller's, on the caller's loop (closing a ``local()`` client stops its server). For a URL or
    None: one to it (default ``$SWITCHBOARD_URL``, else ``http://127.0.0.1:7420``)."""
    from ._sync import Client
    if not isinstance(client, (Client, AsyncClient)):
        check_client(client)
        return make_client(client)
    timeout = client._timeout
    read = timeout.sock_read if isinstance(client, AsyncClient) else timeout.read_timeout
    own = AsyncClient(client.base_url, timeout=read, max_retries=client.max_retries,
                      retry_budget_s=client.retry_budget_s)
    own._headers, own._json_headers, own._stream_headers = (
        client._headers, client._json_headers, client._stream_headers)
    return own


def check_options(name: str, options: Dict[str, Any]) -> None:
    unknown = set(options) - set(OPTION_KEYS)
    if unknown:
        raise ValueError(f"tool {name!r}: unknown switchboard options {sorted(unknown)}")
    try:
        check_defer(options.get("defer"))
        check_effect(options.get("effect"))
    except ValueError as e:
        raise ValueError(f"tool {name!r}: {e}") from None


def args_key(name: str, args: Any) -> Tuple[str, str]:
    """What identifies a call within a turn when its client tool runs: name and arguments."""
    return name, json.dumps(args, sort_keys=True, default=str)


async def run_cancellable(session: Any, message: Any, turn_id: Optional[str] = None,
                          on_progress: Optional[Callable[[Any], Any]] = None) -> Any:
    """Dispatches ``message`` as a turn (named ``turn_id``, else after the message); cancelling
    this cancels the turn on the server (its calls answered ``cancelled``, its processes
    killed). ``on_progress`` gets the turn's live progress events."""
    turn = session.start(message, format="anthropic", turn_id=turn_id, on_progress=on_progress)
    try:
        return await asyncio.shield(turn.task)
    except asyncio.CancelledError:
        if not turn.done():
            try:
                await turn.cancel()
            except Exception:
                pass
        raise


# --------------------------------------------------------------------------------------------
# The engine's built-ins.
# --------------------------------------------------------------------------------------------

def builtin_spec(name: str) -> Dict[str, Any]:
    """The catalog entry (``description``, ``input_schema``) of the built-in ``name``."""
    if name not in BUILTIN_CATALOG:
        raise ValueError(f"no built-in named {name!r}; the built-ins are {BUILTIN_NAMES}")
    return BUILTIN_CATALOG[name]


# The engine's catalog entries for its five built-ins, as `GET /v1/tools` serves them (a test
# of each adapter compares them with the running server, so a change of the engine's schemas
# fails the tests, not the user).
_CATALOG_JSON = r"""{
 "bash": {
  "description": "Run a shell command in the workspace with `bash -c` (stdin is empty; output is stdout then stderr, capped keeping head and tail). Every process it starts is stopped when the call ends: background jobs do not survive. `timeout_ms` bounds the call (default 120000, at most 600000).",
  "input_schema": {
   "additionalProperties": false,
   "properties": {
    "command": {
     "description": "The command, run with `bash -c`.",
     "type": "string"
    },
    "timeout_ms": {
     "description": "Time limit of this call in milliseconds (default 120000, at most 600000).",
     "maximum": 600000,
     "minimum": 1,
     "type": "integer"
    }
   },
   "required": [
    "command"
   ],
   "type": "object"
  }
 },
 "read_file": {
  "description": "Read a UTF-8 text file from the workspace. `limit` returns only the first N lines.",
  "input_schema": {
   "additionalProperties": false,
   "properties": {
    "limit": {
     "description": "Return at most this many lines.",
     "minimum": 1,
     "type": "integer"
    },
    "path": {
     "description": "File path, relative to the workspace.",
     "type": "string"
    }
   },
   "required": [
    "path"
   ],
   "type": "object"
  }
 },
 "write_file": {
  "description": "Write a UTF-8 text file in the workspace, replacing it if it exists and creating parent directories.",
  "input_schema": {
   "additionalProperties": false,
   "properties": {
    "content": {
     "description": "The complete new file content.",
     "type": "string"
    },
    "path": {
     "description": "File path, relative to the workspace.",
     "type": "string"
    }
   },
   "required": [
    "path",
    "content"
   ],
   "type": "object"
  }
 },
 "edit_file": {
  "description": "Replace the FIRST exact occurrence of old_text with new_text in a workspace file. Only that first match changes, even when old_text occurs several times: include enough surrounding text to pick the one you mean. Every other byte (line endings, a BOM, a missing final newline) is kept; the file is replaced atomically.",
  "input_schema": {
   "additionalProperties": false,
   "properties": {
    "new_text": {
     "description": "Replacement text.",
     "type": "string"
    },
    "old_text": {
     "description": "Exact text to find (first occurrence is replaced).",
     "type": "string"
    },
    "path": {
     "description": "File path, relative to the workspace.",
     "type": "string"
    }
   },
   "required": [
    "path",
    "old_text",
    "new_text"
   ],
   "type": "object"
  }
 },
 "glob": {
  "description": "Find workspace paths matching a glob pattern (`**` recurses), e.g. `src/**/*.rs`.",
  "input_schema": {
   "additionalProperties": false,
   "properties": {
    "pattern": {
     "description": "Glob pattern, relative to the workspace.",
     "type": "string"
    }
   },
   "required": [
    "pattern"
   ],
   "type": "object"
  }
 }
}"""
BUILTIN_CATALOG: Dict[str, Dict[str, Any]] = json.loads(_CATALOG_JSON)
