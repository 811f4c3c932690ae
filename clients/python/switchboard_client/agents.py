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
``on_llm_end`` tells the collector which calls the response holds (and the response's id, which
names the turn), and once they have all arrived (or, for calls the SDK does not invoke — a
pending approval, a rejecting guardrail — after a 5 ms quiet window) they go to the sidecar as
one turn, in the model's order. The engine validates and plans them — conflicting calls run in
call order, the rest overlap; a tool declaring neither ``concurrency_safe`` nor ``access``
overlaps, as the SDK runs it — runs the built-ins itself and hands each Python tool's call back,
where the original tool runs on the run's event loop with the SDK's own ``ToolContext``. Each
invocation returns its own call's result: exactly one per call; a failure is the engine's error
text. Without the hooks the collector still works, in arrival order, after the quiet window.

One ``switchboard_tools(...)`` bundle is one sidecar session: make one per conversation.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

try:
    from agents import FunctionTool, RunHooks, function_tool
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("switchboard_client.agents needs the OpenAI Agents SDK: "
                      "pip install 'switchboard-client[agents]'") from e

from . import _bridge
from ._async import AsyncClient
from ._bridge import (BUILTIN_NAMES, DEFAULT_URL, URL_ENV, args_key, on_loop,  # noqa: F401
                      run_cancellable)
from ._common import SwitchboardError, ToolError
from ._sync import Client

__all__ = ["switchboard_tools", "SwitchboardHooks", "BUILTIN_NAMES"]

GATHER_WINDOW_S = 0.005        # quiet time after the last arrival before a partial turn goes
_DEFAULT_FAILURE_ATTR = "_function_tool_default_failure_handled"
_FAKE_ID = "__fake_id__"       # the SDK's item id for a model that gives none (Chat Completions)
#: What a function tool that declares neither ``concurrency_safe`` nor ``access`` gets: the
#: concurrency the SDK gives it (a response's calls run at once). With the engine's defaults
#: otherwise: a 120 s deadline, effect ``side_effect``.
FRAMEWORK_DEFAULTS: Dict[str, Any] = {"concurrency_safe": True}


class _LoopThread(_bridge.LoopThread):
    """The private event loop of this module's sessions (see :class:`_bridge.LoopThread`)."""

    thread_name = "switchboard-agents"
    caller = "switchboard_tools"


def response_turn_id(response_id: Optional[str], batch: Sequence["_Invocation"]
                     ) -> Optional[str]:
    """The turn id of a batch of one model response's calls: ``oa-`` and a digest of the
    response's id, or of its items' own ids, with each call's id, name and arguments — the same
    response run again is the same turn (answered from the engine's memory), a new response
    that reuses call ids a new one. None when the model gives neither id (Chat Completions):
    the client then names the turn after the message it sends."""
    items = [getattr(getattr(inv.ctx, "tool_call", None), "id", None) for inv in batch]
    items = [i if i not in (None, _FAKE_ID, inv.call_id) else None
             for i, inv in zip(items, batch)]
    if not response_id and not any(items):
        return None
    key = json.dumps([response_id, [[inv.call_id, item, inv.name, inv.arguments]
                                    for inv, item in zip(batch, items)]])
    return "oa-" + hashlib.sha256(key.encode()).hexdigest()[:32]


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
                 schemas: Dict[str, Tuple[str, Dict[str, Any]]],
                 on_progress: Optional[Callable[[Any], Any]] = None) -> None:
        self.tools = tools                    # name -> original tool (None for a built-in)
        self.on_progress = on_progress
        self.client_arg, self.client = client, None
        self.session = session
        self.owns_session = session is None
        self.workspace, self.sandbox = workspace, sandbox
        self.options, self.schemas = options, schemas
        self.expected: List[str] = []         # the call ids of the last response, in order
        self.response_ids: Dict[str, str] = {}   # call id -> its response's id (last response)
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
                self.client = _bridge.own_client(self.client_arg)
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
            queue = bridge.claims.get(args_key(name, args))
            inv = bridge.running.get(queue.popleft()) if queue else None
            if inv is None:
                raise ToolError(f"{name}: no call with these arguments in the turn")
            tool = inv.tool
            assert tool is not None
            setattr(inv.ctx, _DEFAULT_FAILURE_ATTR, False)
            output = await on_loop(inv.loop, tool.on_invoke_tool(inv.ctx, inv.arguments))
            if getattr(inv.ctx, _DEFAULT_FAILURE_ATTR, False):
                # The SDK's failure function answered for a raising tool: its text is the
                # call's error, as the SDK wrote it (no exception type in front).
                setattr(inv.ctx, _DEFAULT_FAILURE_ATTR, False)
                raise ToolError(_output_text(output))
            return _output_text(output)

        self.session.register(run, schema, name=name, description=description,
                              **self.options.get(name, {}))

    # ---- the collector ---------------------------------------------------------------------

    async def expect(self, call_ids: List[str], response_id: Optional[str] = None) -> None:
        self.expected = list(call_ids)
        self.response_ids = {c: response_id for c in call_ids} if response_id else {}

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
                    self.claims[args_key(inv.name, args)].append(inv.call_id)
            self.turns += 1
            response_ids = {self.response_ids.get(inv.call_id) for inv in batch}
            turn_id = response_turn_id(
                response_ids.pop() if len(response_ids) == 1 else None, batch)
            for attempt in (1, 2):
                try:
                    answer = await run_cancellable(session, {"role": "assistant",
                                                             "content": blocks},
                                                   turn_id=turn_id,
                                                   on_progress=self._progress_to(batch))
                    break
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

    def _progress_to(self, batch: List[_Invocation]) -> Optional[Callable[[Any], Any]]:
        """The turn's live progress to ``on_progress``, on the loop of the run whose call it
        is (the SDK's stream events have no kind for a tool's progress)."""
        callback = self.on_progress
        if callback is None:
            return None
        loops = {inv.call_id: inv.loop for inv in batch}

        def deliver(event: Any) -> None:
            loop = loops.get(event.get("tool_use_id"))
            if loop is None:
                return

            def call() -> None:
                done = callback(event)
                if asyncio.iscoroutine(done):
                    asyncio.ensure_future(done)
            loop.call_soon_threadsafe(call)

        return deliver

    async def close(self) -> None:
        if self.session is not None and self.owns_session:
            session, self.session = self.session, None
            try:
                await session.close()
            except Exception:
                pass
        if self.client is not None:
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
        await self._loop.arun(self._bridge.expect(ids, getattr(response, "response_id", None)))

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
    client: Union[Client, AsyncClient, str, None] = None,
    session: Any = None,
    builtins: Union[bool, Iterable[str]] = True,
    workspace: Optional[str] = None,
    sandbox: Any = None,
    tool_options: Optional[Dict[str, Dict[str, Any]]] = None,
    on_progress: Optional[Callable[[Any], Any]] = None,
) -> Tuple[List[FunctionTool], SwitchboardHooks]:
    """Function tools for an ``Agent`` whose calls of one model response run as one turn.

    Args:
        tools: ``FunctionTool`` objects (``@function_tool``) or plain functions (wrapped with
            ``function_tool``). Each keeps its name, description, schema, guardrails, approval
            and timeout settings; the engine calls the original with the SDK's ``ToolContext``.
        client: a :class:`~switchboard_client.Client` or
            :class:`~switchboard_client.AsyncClient` (``local()``, ``local_async()``), or a base
            URL; default ``$SWITCHBOARD_URL`` (else ``http://127.0.0.1:7420``) and
            ``$SWITCHBOARD_TOKEN``. The bundle opens its own connections to that client's
            server (its token, timeout and retries): the client stays yours.
        session: an ``AsyncClient.session()`` not yet created on the server, instead of a new one.
        builtins: ``True`` (default) adds ``bash``, ``read_file``, ``write_file``, ``edit_file``
            and ``glob`` as function tools the engine runs itself; a list of names adds those;
            ``False`` none.
        workspace, sandbox: for the new session (a named workspace, a narrower sandbox).
        tool_options: per tool name: ``concurrency_safe``, ``access``, ``timeout_ms``,
            ``output_cap`` (a tool declaring neither ``concurrency_safe`` nor ``access`` gets
            :data:`FRAMEWORK_DEFAULTS`: it overlaps with the response's other calls, as the SDK
            runs it; ``concurrency_safe: False`` runs it alone, in call order), ``defer``
            (marks the tool in the session's catalog only: the ``Agent`` still sends every tool
            it has),
            ``effect`` (``read_only``, ``idempotent`` or ``side_effect``: what a retry after
            a crash gets).
        on_progress: called with each live progress event of a running call (a command's
            output as it is written, an MCP server's progress: ``{"tool_use_id", "seq",
            "kind", ...}``, the call id the SDK gave), on the run's event loop, before the
            call's result; a coroutine function's coroutine is scheduled there. The SDK's
            stream events (``Runner.run_streamed``) have no kind for a tool's progress, so it
            comes here instead.

    Returns ``(function_tools, hooks)``: give the tools to the ``Agent`` and the hooks to
    ``Runner.run(..., hooks=hooks)``.
    """
    if client is not None and not isinstance(client, (Client, AsyncClient, str)):
        raise TypeError("client must be a Client, an AsyncClient or a base URL, not "
                        f"{type(client).__name__}")
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
        _bridge.check_options(n, o)
        if "concurrency_safe" not in o and "access" not in o:
            o.update(FRAMEWORK_DEFAULTS)
    wanted = list(BUILTIN_NAMES) if builtins is True else list(builtins or [])
    for name in wanted:
        if name in originals:
            raise ValueError(f"{name!r} is a built-in; rename the tool or pass builtins=False")
        originals[name] = None
        spec = _bridge.builtin_spec(name)
        schemas[name] = (spec["description"], spec["input_schema"])

    loop = _LoopThread.get()
    bridge = _Bridge(originals, client, session, workspace, sandbox, options, schemas,
                     on_progress)
    loop.close_at_exit(bridge, _Bridge.close)   # deletes its session if still open at exit

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

