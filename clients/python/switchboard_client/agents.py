"""OpenAI Agents SDK adapter: one model turn's function tools run as ONE Switchboard turn.

::

    from agents import Agent, Runner
    from switchboard_client.agents import switchboard_tools

    tools, hooks = switchboard_tools([lookup_order, refund])     # + the engine's built-ins
    agent = Agent(name="support", model=..., tools=tools)
    result = await Runner.run(agent, "…", hooks=hooks)
    await hooks.aclose()

The SDK runs the function calls of one model response concurrently (one task per call). Here each
returned ``FunctionTool`` hands its call to a shared collector instead of running it: the hook's
``on_llm_end`` tells the collector which calls the response holds, and once they have all arrived
(or, for calls the SDK does not invoke — a pending approval, a rejecting guardrail — after a 5 ms
quiet window) they go to the sidecar as one turn, in the model's order. The engine validates and
plans them — conflicting calls run in call order, the rest overlap — runs the built-ins itself
and hands each Python tool's call back, where the original tool runs on the run's event loop with
the SDK's own ``ToolContext``. Each invocation returns its own call's result: exactly one per
call; a failure is the engine's error text. Without the hooks the collector still works, in
arrival order, after the quiet window.

One ``switchboard_tools(...)`` bundle is one sidecar session: make one per conversation.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import dataclasses
import json
import os
import threading
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

try:
    from agents import FunctionTool, RunHooks, function_tool
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("switchboard_client.agents needs the OpenAI Agents SDK: "
                      "pip install 'switchboard-client[agents]'") from e

from ._async import AsyncClient
from ._common import SwitchboardError

__all__ = ["switchboard_tools", "SwitchboardHooks", "BUILTIN_NAMES"]

URL_ENV = "SWITCHBOARD_URL"
DEFAULT_URL = "http://127.0.0.1:7420"
BUILTIN_NAMES = ("bash", "read_file", "write_file", "edit_file", "glob")
GATHER_WINDOW_S = 0.005        # quiet time after the last arrival before a partial turn goes
_OPTION_KEYS = ("concurrency_safe", "access", "timeout_ms", "output_cap")
_DEFAULT_FAILURE_ATTR = "_function_tool_default_failure_handled"


class _LoopThread:
    """One daemon thread running an event loop: the session and its HTTP pool live there, so
    they do not depend on the loop of a run (``Runner.run_sync`` makes a new one per run)."""

    _lock = threading.Lock()
    _instance: Optional["_LoopThread"] = None

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever,
                                       name="switchboard-agents", daemon=True)
        self.thread.start()

    @classmethod
    def get(cls) -> "_LoopThread":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls()
            return cls._instance

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    async def arun(self, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))


async def _on_loop(loop: asyncio.AbstractEventLoop, coro: Any) -> Any:
    if loop is asyncio.get_running_loop():
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def _args_key(name: str, args: Any) -> Tuple[str, str]:
    return name, json.dumps(args, sort_keys=True, default=str)


class ToolError(Exception):
    """A tool's error output, raised so the engine records an ``execution_error``."""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        if all(isinstance(b, dict) and b.get("type") == "text" for b in content):
            return "".join(b.get("text", "") for b in content)
    return json.dumps(content, default=str)


def _output_text(output: Any) -> Any:
    """A FunctionTool's output as an answer for the engine."""
    if isinstance(output, str):
        return output
    text = getattr(output, "text", None)
    if isinstance(text, str):
        return text
    if isinstance(output, list):
        return "".join(_output_text(o) for o in output)
    if hasattr(output, "model_dump_json"):
        return output.model_dump_json()
    return str(output)


class _Invocation:
    def __init__(self, call_id: str, name: str, arguments: str, ctx: Any,
                 loop: asyncio.AbstractEventLoop, tool: Optional[FunctionTool]) -> None:
        self.call_id, self.name, self.arguments = call_id, name, arguments
        self.ctx, self.loop, self.tool = ctx, loop, tool
        self.result: asyncio.Future = asyncio.get_running_loop().create_future()
        self.batch: Optional[List["_Invocation"]] = None
        self.batch_task: Optional[asyncio.Task] = None
        self.abandoned = False


class _Bridge:
    """The session and the collector; every method runs on the private loop."""

    def __init__(self, tools: Dict[str, Optional[FunctionTool]], client: Any, session: Any,
                 workspace: Optional[str], sandbox: Any, options: Dict[str, Dict[str, Any]],
                 schemas: Dict[str, Tuple[str, Dict[str, Any]]]) -> None:
        self.tools = tools                    # name -> original tool (None for a built-in)
        self.client_arg, self.client = client, None
        self.session = session
        self.owns_session = session is None
        self.workspace, self.sandbox = workspace, sandbox
        self.options, self.schemas = options, schemas
        self.expected: List[str] = []         # the call ids of the last response, in order
        self.arrived: Dict[str, _Invocation] = {}
        self.wake: Optional[asyncio.Event] = None
        self.collector: Optional[asyncio.Task] = None
        self.turn_lock: Optional[asyncio.Lock] = None
        self.claims: Dict[Tuple[str, str], collections.deque] = collections.defaultdict(
            collections.deque)
        self.running: Dict[str, _Invocation] = {}
        self.turns = 0
        self._registered = False

    # ---- the session -----------------------------------------------------------------------

    def _ensure_session(self) -> Any:
        if self.session is None:
            if self.client is None:
                self.client = self.client_arg if isinstance(self.client_arg, AsyncClient) \
                    else AsyncClient(self.client_arg or os.environ.get(URL_ENV) or DEFAULT_URL)
            kwargs: Dict[str, Any] = {}
            if self.sandbox is not None:
                kwargs["sandbox"] = self.sandbox
            self.session = self.client.session(self.workspace, **kwargs)
        if not self._registered:
            for name, tool in self.tools.items():
                if tool is not None:
                    self._register(name)
            self._registered = True
        return self.session

    def _register(self, name: str) -> None:
        description, schema = self.schemas[name]
        bridge = self

        async def run(**args: Any) -> Any:
            queue = bridge.claims.get(_args_key(name, args))
            inv = bridge.running.get(queue.popleft()) if queue else None
            if inv is None:
                raise ToolError(f"{name}: no call with these arguments in the turn")
            tool = inv.tool
            assert tool is not None
            setattr(inv.ctx, _DEFAULT_FAILURE_ATTR, False)
            output = await _on_loop(inv.loop, tool.on_invoke_tool(inv.ctx, inv.arguments))
            if getattr(inv.ctx, _DEFAULT_FAILURE_ATTR, False):
                setattr(inv.ctx, _DEFAULT_FAILURE_ATTR, False)
                raise ToolError(_output_text(output))
            return _output_text(output)

        self.session.register(run, schema, name=name, description=description,
                              **self.options.get(name, {}))

    # ---- the collector ---------------------------------------------------------------------

    async def expect(self, call_ids: List[str]) -> None:
        self.expected = list(call_ids)

    async def submit(self, inv: _Invocation) -> Any:
        self.arrived[inv.call_id] = inv
        if self.wake is None:
            self.wake, self.turn_lock = asyncio.Event(), asyncio.Lock()
        self.wake.set()
        if self.collector is None or self.collector.done():
            self.collector = asyncio.ensure_future(self._collect())
        try:
            return await asyncio.shield(inv.result)
        except asyncio.CancelledError:
            # The run was cancelled (the SDK cancels its tool tasks): once every invocation of
            # the turn is gone, the turn is cancelled on the server, its processes killed.
            inv.abandoned = True
            if self.arrived.get(inv.call_id) is inv:
                del self.arrived[inv.call_id]
            elif inv.batch is not None and inv.batch_task is not None \
                    and all(i.abandoned for i in inv.batch) and not inv.batch_task.done():
                inv.batch_task.cancel()
            raise

    def _complete(self) -> bool:
        pending = [c for c in self.expected if c not in self.arrived]
        return bool(self.expected) and not pending and \
            all(c in self.expected for c in self.arrived)

    async def _collect(self) -> None:
        assert self.wake is not None and self.turn_lock is not None
        while self.arrived:
            # Wait until every call of the response has arrived, or nothing new came for the
            # window (a call the SDK does not invoke, or no on_llm_end to say what to expect).
            while not self._complete():
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), GATHER_WINDOW_S)
                except asyncio.TimeoutError:
                    break
            order = {c: i for i, c in enumerate(self.expected)}
            batch = sorted(self.arrived.values(),
                           key=lambda v: order.get(v.call_id, len(order)))
            self.arrived = {}
            self.expected = [c for c in self.expected if c not in {v.call_id for v in batch}]
            if not batch:
                continue                    # every invocation was cancelled before its turn
            async with self.turn_lock:
                task = asyncio.ensure_future(self._turn(batch))
                for inv in batch:
                    inv.batch, inv.batch_task = batch, task
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    if task.cancelled():
                        continue            # that turn was cancelled; collect the next one
                    raise

    async def _turn(self, batch: List[_Invocation]) -> None:
        try:
            session = self._ensure_session()
            blocks = []
            for inv in batch:
                try:
                    args = json.loads(inv.arguments or "{}")
                except ValueError:
                    args = inv.arguments           # the engine answers invalid_arguments
                blocks.append({"type": "tool_use", "id": inv.call_id, "name": inv.name,
                               "input": args})
                self.running[inv.call_id] = inv
                if isinstance(args, dict):
                    self.claims[_args_key(inv.name, args)].append(inv.call_id)
            self.turns += 1
            for attempt in (1, 2):
                turn = session.start({"role": "assistant", "content": blocks},
                                     format="anthropic")
                try:
                    answer = await asyncio.shield(turn.task)
                    break
                except asyncio.CancelledError:
                    if not turn.done():
                        try:
                            await turn.cancel()
                        except Exception:
                            pass
                    raise
                except SwitchboardError as e:
                    # The server closed the session (idle timeout, restart): nothing of the
                    # turn ran; a new session runs it (a fresh workspace unless named).
                    if e.code != "unknown_session" or attempt == 2 or not self.owns_session:
                        raise
                    self.session, self._registered = None, False
                    session = self._ensure_session()
            results = {r.get("tool_use_id"): r for r in (answer or {}).get("content", [])
                       if isinstance(r, dict)}
            for inv in batch:
                r = results.get(inv.call_id)
                text = _text(r.get("content")) if r else "switchboard: no result for this call"
                if not inv.result.done():
                    inv.result.set_result(text)
        except BaseException as e:
            for inv in batch:
                if not inv.result.done():
                    if isinstance(e, asyncio.CancelledError):
                        inv.result.cancel()
                    else:
                        inv.result.set_exception(e)
            if not isinstance(e, Exception):
                raise
        finally:
            for inv in batch:
                self.running.pop(inv.call_id, None)
            self.claims.clear()

    async def close(self) -> None:
        if self.session is not None and self.owns_session:
            session, self.session = self.session, None
            try:
                await session.close()
            except Exception:
                pass
        if self.client is not None and self.client is not self.client_arg:
            client, self.client = self.client, None
            await client.close()


class SwitchboardHooks(RunHooks):
    """Run hooks that tell the bundle's collector which calls a model response holds, so the
    turn goes as soon as they have all arrived, in the model's order. Pass to ``Runner.run``
    (``hooks=``); subclass it to add hooks of your own (call ``super().on_llm_end``)."""

    def __init__(self, bridge: _Bridge, loop: _LoopThread) -> None:
        self._bridge, self._loop = bridge, loop

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        ids = [item.call_id for item in getattr(response, "output", [])
               if getattr(item, "type", None) == "function_call"
               and getattr(item, "name", None) in self._bridge.tools]
        await self._loop.arun(self._bridge.expect(ids))

    @property
    def session(self) -> Any:
        """The sidecar session (created on the first turn)."""
        return self._bridge.session

    @property
    def turns(self) -> int:
        """How many turns the bundle has dispatched."""
        return self._bridge.turns

    async def aclose(self) -> None:
        """Deletes the session (its workspace stays) and closes the bundle's own client."""
        await self._loop.arun(self._bridge.close())

    def close(self) -> None:
        self._loop.run(self._bridge.close())


def switchboard_tools(
    tools: Sequence[Union[FunctionTool, Callable[..., Any]]],
    *,
    client: Union[AsyncClient, str, None] = None,
    session: Any = None,
    builtins: Union[bool, Iterable[str]] = True,
    workspace: Optional[str] = None,
    sandbox: Any = None,
    tool_options: Optional[Dict[str, Dict[str, Any]]] = None,
) -> Tuple[List[FunctionTool], SwitchboardHooks]:
    """Function tools for an ``Agent`` whose calls of one model response run as one turn.

    Args:
        tools: ``FunctionTool`` objects (``@function_tool``) or plain functions (wrapped with
            ``function_tool``). Each keeps its name, description, schema, guardrails, approval
            and timeout settings; the engine calls the original with the SDK's ``ToolContext``.
        client: an :class:`~switchboard_client.AsyncClient` or a base URL; default
            ``$SWITCHBOARD_URL`` (else ``http://127.0.0.1:7420``) and ``$SWITCHBOARD_TOKEN``.
            It is driven from a private event-loop thread: do not share it.
        session: an ``AsyncClient.session()`` not yet created on the server, instead of a new one.
        builtins: ``True`` (default) adds ``bash``, ``read_file``, ``write_file``, ``edit_file``
            and ``glob`` as function tools the engine runs itself; a list of names adds those;
            ``False`` none.
        workspace, sandbox: for the new session (a named workspace, a narrower sandbox).
        tool_options: per tool name: ``concurrency_safe``, ``access``, ``timeout_ms``,
            ``output_cap`` (a tool without them runs alone in its turn).

    Returns ``(function_tools, hooks)``: give the tools to the ``Agent`` and the hooks to
    ``Runner.run(..., hooks=hooks)``.
    """
    if client is not None and not isinstance(client, (AsyncClient, str)):
        raise TypeError("client must be an AsyncClient or a base URL (the adapter drives it "
                        f"from its own event loop), not {type(client).__name__}")
    originals: Dict[str, Optional[FunctionTool]] = {}
    schemas: Dict[str, Tuple[str, Dict[str, Any]]] = {}
    for t in tools:
        ft = t if isinstance(t, FunctionTool) else function_tool(t)
        if ft.name in originals:
            raise ValueError(f"two tools named {ft.name!r}")
        originals[ft.name] = ft
        schemas[ft.name] = (ft.description or "", ft.params_json_schema)
    options = {n: dict((tool_options or {}).get(n, {})) for n in originals}
    for n, o in options.items():
        if set(o) - set(_OPTION_KEYS):
            raise ValueError(f"tool {n!r}: unknown switchboard options {sorted(set(o) - set(_OPTION_KEYS))}")
    wanted = list(BUILTIN_NAMES) if builtins is True else list(builtins or [])
    for name in wanted:
        if name in originals:
            raise ValueError(f"{name!r} is a built-in; rename the tool or pass builtins=False")
        originals[name] = None
        if name not in _BUILTIN_CATALOG:
            raise ValueError(f"no built-in named {name!r}; the built-ins are {BUILTIN_NAMES}")
        schemas[name] = (_BUILTIN_CATALOG[name]["description"],
                         _BUILTIN_CATALOG[name]["input_schema"])

    loop = _LoopThread.get()
    bridge = _Bridge(originals, client, session, workspace, sandbox, options, schemas)
    _LIVE.add(bridge)

    def make(name: str, original: Optional[FunctionTool]) -> FunctionTool:
        async def on_invoke(ctx: Any, arguments: str) -> Any:
            call_id = getattr(ctx, "tool_call_id", None) or f"switchboard_{id(ctx)}"
            inv_loop = asyncio.get_running_loop()

            async def submit() -> Any:
                inv = _Invocation(call_id, name, arguments, ctx, inv_loop, original)
                return await bridge.submit(inv)
            return await loop.arun(submit())

        if original is not None:
            return dataclasses.replace(original, on_invoke_tool=on_invoke)
        description, schema = schemas[name]
        return FunctionTool(name=name, description=description, params_json_schema=schema,
                            on_invoke_tool=on_invoke, strict_json_schema=False)

    return [make(n, o) for n, o in originals.items()], SwitchboardHooks(bridge, loop)


_LIVE: "weakref.WeakSet[_Bridge]" = weakref.WeakSet()


@atexit.register
def _close_live_bridges() -> None:
    """Deletes the sessions of bundles still open at exit (best effort, a few seconds at most)."""
    if _LoopThread._instance is None:
        return
    for bridge in list(_LIVE):
        try:
            asyncio.run_coroutine_threadsafe(bridge.close(), _LoopThread._instance.loop
                                             ).result(timeout=5)
        except Exception:
            pass


# The engine's catalog entries for its five built-ins, as `GET /v1/tools` serves them (the same
# snapshot as switchboard_client.langgraph's; a test compares it with the running server).
_BUILTIN_CATALOG_JSON = r"""{
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
_BUILTIN_CATALOG: Dict[str, Dict[str, Any]] = json.loads(_BUILTIN_CATALOG_JSON)
