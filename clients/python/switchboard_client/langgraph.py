"""LangGraph adapter: a drop-in ``ToolNode``, and a middleware for LangChain's ``create_agent``,
that run a model turn's tool calls through Switchboard.

::

    from switchboard_client.langgraph import SwitchboardMiddleware, ToolNode, builtin_tools

    tools = [lookup_order, refund] + builtin_tools()      # LangChain tools + bash, read_file, ...
    graph = create_react_agent(model, tools=ToolNode(tools))
    agent = create_agent(model, tools=tools, middleware=[SwitchboardMiddleware()])

One AI message's ``tool_calls`` are ONE turn of a sidecar session, in the model's order, named
after the message's id: the engine validates every call against its schema, plans them
(conflicting calls run in call order, the rest overlap), runs the built-ins itself and hands each
LangChain tool's call back to this process, where the tool runs exactly as LangGraph's own
``ToolNode`` would run it (state, store and ``ToolRuntime`` injection, ``handle_tool_errors``,
``Command`` returns) — under the middleware, through ``create_agent``'s own tool execution. Every
call gets exactly one ``ToolMessage`` with its ``tool_call_id``; a failure is ``status="error"``.
A LangChain tool that declares nothing (no ``concurrency_safe`` or ``access``) overlaps with the
turn's other calls, as LangGraph runs it.

One sidecar session per conversation: keyed by ``config["configurable"]["thread_id"]`` when there
is one, else one session for the node. The sessions live on a private event-loop thread, so the
node works the same from ``invoke`` and ``ainvoke`` and from any number of event loops.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import dataclasses
import hashlib
import json
import threading
import uuid
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

try:
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.runnables import RunnableConfig
    from langchain_core.tools import BaseTool, StructuredTool
    from langchain_core.tools import tool as create_tool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.errors import GraphBubbleUp
    try:
        from langgraph._internal._constants import CONFIG_KEY_RESUMING
    except ImportError:  # pragma: no cover - older layouts
        CONFIG_KEY_RESUMING = "__pregel_resuming"
    from langgraph.prebuilt import ToolNode as _LangGraphToolNode
    from langgraph.prebuilt.tool_node import ToolCallRequest, ToolRuntime
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "switchboard_client.langgraph needs langgraph and langchain-core: "
        "pip install 'switchboard-client[langgraph]'") from e
try:
    from langchain.agents.middleware import AgentMiddleware
except ImportError:  # pragma: no cover - langchain (create_agent) is optional
    AgentMiddleware = object  # type: ignore[misc,assignment]
    _HAS_LANGCHAIN = False
else:
    _HAS_LANGCHAIN = True

from . import _bridge
from ._async import AsyncClient
from ._bridge import (BUILTIN_NAMES, DEFAULT_URL, URL_ENV, args_key, on_loop,  # noqa: F401
                      run_cancellable)
from ._common import SwitchboardError
from ._sync import Client

__all__ = ["SwitchboardMiddleware", "ToolNode", "builtin_tools", "BUILTIN_NAMES"]

#: What a LangChain tool that declares neither ``concurrency_safe`` nor ``access`` gets: the
#: concurrency LangGraph's own ``ToolNode`` gives it (a message's calls run at once). With the
#: engine's defaults otherwise: a 120 s deadline, effect ``side_effect``.
FRAMEWORK_DEFAULTS: Dict[str, Any] = {"concurrency_safe": True}


class _LoopThread(_bridge.LoopThread):
    """The private event loop every session of this module lives on (see
    :class:`_bridge.LoopThread`)."""

    thread_name = "switchboard-langgraph"
    caller = "switchboard ToolNode"


def check_client(client: Any) -> None:
    if client is not None and not isinstance(client, (Client, AsyncClient, str)):
        raise TypeError("client must be a Client, an AsyncClient or a base URL, not "
                        f"{type(client).__name__}")


# --------------------------------------------------------------------------------------------
# Built-ins as LangChain tools.
# --------------------------------------------------------------------------------------------

class SwitchboardBuiltinTool(StructuredTool):
    """A LangChain tool describing one of the engine's built-ins. Bind a model to it; the
    switchboard ``ToolNode`` runs it in the engine. Called any other way it raises."""


def _builtin_refusal(name: str) -> Callable[..., Any]:
    def refuse(**_: Any) -> Any:
        raise NotImplementedError(
            f"`{name}` is a Switchboard built-in: it runs through "
            "switchboard_client.langgraph.ToolNode, not on its own")
    return refuse


def builtin_tools(names: Optional[Iterable[str]] = None) -> List[BaseTool]:
    """LangChain tools describing the engine's built-ins (``bash``, ``read_file``,
    ``write_file``, ``edit_file``, ``glob``, or the ``names`` asked for), with the engine's own
    descriptions and JSON schemas, for ``model.bind_tools`` and for :class:`ToolNode`."""
    chosen = BUILTIN_NAMES if names is None else tuple(names)
    out: List[BaseTool] = []
    for name in chosen:
        spec = _bridge.builtin_spec(name)
        out.append(SwitchboardBuiltinTool(
            name=name, description=spec["description"], args_schema=spec["input_schema"],
            func=_builtin_refusal(name)))
    return out


# --------------------------------------------------------------------------------------------
# Per conversation and per turn state.
# --------------------------------------------------------------------------------------------

def ai_turn_id(ai_id: Optional[str]) -> Optional[str]:
    """The turn id of the calls of AI message ``ai_id`` (``lc-`` and a digest of the id: any
    message id becomes a valid turn id), or None — the client then names the turn after the
    message it sends."""
    if not ai_id:
        return None
    return "lc-" + hashlib.sha256(str(ai_id).encode()).hexdigest()[:32]


class _Send:
    """How one call's own invocation runs its tool under the middleware: ``create_agent``'s
    request and ``execute`` handler, and where (the caller's loop, or the caller's thread's
    context for a synchronous handler)."""

    def __init__(self, request: Any, handler: Callable[[Any], Any],
                 loop: Optional[asyncio.AbstractEventLoop],
                 context: Optional[contextvars.Context]) -> None:
        self.request, self.handler, self.loop, self.context = request, handler, loop, context


class _TurnContext:
    """What the client-tool runners of one turn need: the node's config, state and runtime,
    the caller's loop, which call id a (name, arguments) pair is, and what each tool returned.
    Under the middleware also each call's ``_Send`` (the first to arrive stands in for a call
    whose own has not)."""

    def __init__(self, calls: List[Dict[str, Any]], config: Any, state: Any, runtime: Any,
                 input_type: str, caller_loop: Optional[asyncio.AbstractEventLoop],
                 ai_id: Optional[str] = None) -> None:
        self.config, self.state, self.runtime = config, state, runtime
        # The id of the AI message the calls came in: it names the turn on the server, so a
        # model that reuses its call ids (`call_0` in every response) gets new calls per message.
        self.ai_id = ai_id
        self.input_type = input_type
        self.caller_loop = caller_loop
        self.ids: Dict[Tuple[str, str], collections.deque] = collections.defaultdict(
            collections.deque)
        for call in calls:
            self.ids[args_key(call["name"], call["args"])].append(call["id"])
        self.local: Dict[str, Any] = {}      # call id -> ToolMessage | Command | list | exception
        self.sends: Dict[str, _Send] = {}    # the middleware's: call id -> its invocation
        self.first: Optional[_Send] = None

    def claim(self, name: str, args: Any) -> Optional[str]:
        queue = self.ids.get(args_key(name, args))
        return queue.popleft() if queue else None


class _Conversation:
    def __init__(self, session: Any) -> None:
        self.session = session
        self.lock = asyncio.Lock()           # one turn at a time per conversation
        self.turn: Optional[_TurnContext] = None


class _Turn:
    """A turn shared by the ``Send`` invocations that each carry one of its calls."""

    def __init__(self, ids: Sequence[str], ctx: _TurnContext) -> None:
        self.future: asyncio.Future = asyncio.get_running_loop().create_future()
        self.remaining = set(ids)
        self.waiting = 0                      # Sends awaiting it; none left: it is cancelled
        self.task: Optional[asyncio.Task] = None
        self.ctx = ctx


_CAUGHT: "contextvars.ContextVar[Optional[List[BaseException]]]" = contextvars.ContextVar(
    "switchboard_caught", default=None)


def _progress_to(ctx: _TurnContext, ids: Dict[str, str]) -> Optional[Callable[[Any], None]]:
    """Where a turn's live progress goes: LangGraph's custom stream (``stream_mode="custom"``),
    each event as ``{"event": "progress", "tool_use_id", "seq", "kind", ...}`` under the call id
    LangGraph knows (``ids``: the id each call was sent under → its own); ``None`` when the node
    has no stream writer."""
    writer = getattr(ctx.runtime, "stream_writer", None)
    if writer is None:
        return None

    def write(event: Any) -> None:
        chunk = dict(event, event="progress")
        sent = event.get("tool_use_id")
        chunk["tool_use_id"] = ids.get(sent, sent)
        if ctx.caller_loop is not None:
            # An async graph's stream belongs to the caller's loop; a sync graph's is
            # thread-safe.
            ctx.caller_loop.call_soon_threadsafe(writer, chunk)
        else:
            writer(chunk)

    return write


def _catch_all(e: Exception) -> str:
    """``handle_tool_errors=True``: every exception is an error result. The exception itself
    goes to the engine (its answer reads ``Error [execution_error]: ValueError: ...``)."""
    caught = _CAUGHT.get()
    if caught is not None:
        caught.append(e)
    return f"Error: {e!r}\n Please fix your mistakes."


class ToolError(Exception):
    """A client tool's error result, raised so the engine records it as ``execution_error``.
    Not :class:`switchboard_client.ToolError`: the answer keeps its ``ToolError:`` prefix."""


def _text_of(content: Any) -> Any:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        if all(isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")
               for b in content):
            return "".join(b if isinstance(b, str) else b.get("text", "") for b in content)
        return content
    return json.dumps(content, default=str)


def _result_content(content: Any) -> Any:
    """The engine's tool_result content as a ToolMessage's content."""
    if isinstance(content, list):
        if all(isinstance(b, dict) and b.get("type") == "text" for b in content):
            return "".join(b.get("text", "") for b in content)
        return content
    return "" if content is None else content


# --------------------------------------------------------------------------------------------
# The node.
# --------------------------------------------------------------------------------------------

ToolOptions = Dict[str, Dict[str, Any]]


class ToolNode(_LangGraphToolNode):
    """LangGraph's ``ToolNode``, with the turn run by Switchboard.

    Args:
        tools: LangChain tools (``BaseTool``, ``@tool`` functions, plain callables) and any of
            :func:`builtin_tools`. The LangChain ones become the session's client tools (schema:
            the tool's ``tool_call_schema``, as the model sees it); the built-ins run in the
            engine.
        client: a :class:`~switchboard_client.Client` or
            :class:`~switchboard_client.AsyncClient` (``local()``, ``local_async()``), or a base
            URL; default ``$SWITCHBOARD_URL`` (else ``http://127.0.0.1:7420``) with
            ``$SWITCHBOARD_TOKEN``. The node opens its own connections to that client's server
            (its token, timeout and retries): the client stays yours, usable and closed as
            before.
        session: one session (from ``AsyncClient.session()``) for every conversation, instead
            of one per thread. Its server side must not exist yet (the node registers tools).
        builtins: ``True`` adds all five built-ins to the node (and so to a prebuilt agent's
            model binding); a list of names adds those; default: only the built-ins in
            ``tools``. A call to a built-in the node does not have is an error result, as an
            unknown tool is for LangGraph's ``ToolNode``.
        workspace: the session's workspace name, or a function ``thread_id -> name``; default a
            fresh directory per session.
        sandbox: a narrower sandbox for the sessions (``"read-only"``, ...).
        tool_options: per tool name, engine options: ``concurrency_safe``, ``access``,
            ``timeout_ms``, ``output_cap``, ``defer``, ``effect`` (also read from a tool's
            ``metadata["switchboard"]``). A tool declaring neither ``concurrency_safe`` nor
            ``access`` gets :data:`FRAMEWORK_DEFAULTS`: it overlaps with the turn's other calls,
            as in LangGraph's ``ToolNode``; ``concurrency_safe: False`` runs it alone, in call
            order. ``defer`` marks the tool in the session's catalog only: the model binding
            still carries every tool the node has.
        name, tags, handle_tool_errors, messages_key: as for LangGraph's ``ToolNode``.
    """

    def __init__(
        self,
        tools: Sequence[Union[BaseTool, Callable[..., Any]]],
        *,
        client: Union[Client, AsyncClient, str, None] = None,
        session: Any = None,
        builtins: Union[bool, Iterable[str], None] = None,
        workspace: Union[str, Callable[[Optional[str]], str], None] = None,
        sandbox: Any = None,
        tool_options: Optional[ToolOptions] = None,
        name: str = "tools",
        tags: Optional[List[str]] = None,
        handle_tool_errors: Any = True,
        messages_key: str = "messages",
        wrap_tool_call: Any = None,
        awrap_tool_call: Any = None,
    ) -> None:
        if wrap_tool_call is not None or awrap_tool_call is not None:
            raise TypeError("switchboard ToolNode: wrap_tool_call/awrap_tool_call are not "
                            "supported (the engine runs the turn); with langchain's "
                            "create_agent, use SwitchboardMiddleware")
        tools = list(tools)
        if builtins is True:
            wanted = list(BUILTIN_NAMES)
        elif builtins:
            wanted = list(builtins)
        else:
            wanted = []
        present = {t.name for t in tools if isinstance(t, BaseTool)}
        tools += [t for t in builtin_tools(wanted) if t.name not in present]
        super().__init__(tools, name=name, tags=tags,
                         handle_tool_errors=_catch_all if handle_tool_errors is True
                         else handle_tool_errors,
                         messages_key=messages_key)
        self._builtin_names = {n for n, t in self.tools_by_name.items()
                               if isinstance(t, SwitchboardBuiltinTool)}
        self._client_tools = {n: t for n, t in self.tools_by_name.items()
                              if n not in self._builtin_names}
        self._options: ToolOptions = {}
        for n, t in self._client_tools.items():
            opts = dict((t.metadata or {}).get("switchboard", {}))
            opts.update((tool_options or {}).get(n, {}))
            _bridge.check_options(n, opts)
            if "concurrency_safe" not in opts and "access" not in opts:
                opts.update(FRAMEWORK_DEFAULTS)
            self._options[n] = opts
        check_client(client)
        self._client_arg = client
        self._client: Optional[AsyncClient] = None
        # Under SwitchboardMiddleware: whether a tool's exception is an error result.
        self._catch_errors = bool(handle_tool_errors)
        self._fixed_session = session
        self._workspace = workspace
        self._sandbox = sandbox
        self._loop = _LoopThread.get()
        self._conversations: Dict[Any, _Conversation] = {}
        self._creating: Dict[Any, asyncio.Future] = {}
        self._turns: Dict[Any, _Turn] = {}
        # Calls an interrupt stopped: the session answers a tool_use_id it has seen from its
        # stored answers, so when LangGraph resumes one it is sent under a fresh id.
        self._interrupted: set = set()
        self._resumes = 0
        self._loop.close_at_exit(self, ToolNode._close)   # deletes its sessions at exit

    # ---- LangGraph entry points ------------------------------------------------------------

    def _func(self, input: Any, config: RunnableConfig, runtime: Any) -> Any:
        return self._loop.run(self._node(input, config, runtime, None))

    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Any) -> Any:
        return await self._loop.arun(
            self._node(input, config, runtime, asyncio.get_running_loop()))

    # ---- the turn --------------------------------------------------------------------------

    def _turn_of(self, calls: List[Dict[str, Any]], state: Any) -> Tuple[List[Dict[str, Any]], Any]:
        """The whole model turn a ``Send`` of one call belongs to, and its AI message's id: the
        calls of the AI message holding it that have no ToolMessage yet (``post_model_hook``
        sends only those)."""
        messages = state.get(self._messages_key) if isinstance(state, dict) else \
            getattr(state, self._messages_key, None) if state is not None else None
        if not messages or not isinstance(messages, list):
            return calls, None
        wanted = {c.get("id") for c in calls}
        answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
        for m in reversed(messages):
            if isinstance(m, AIMessage) and any(c.get("id") in wanted for c in m.tool_calls):
                turn = [dict(c) for c in m.tool_calls
                        if c.get("id") not in answered or c.get("id") in wanted]
                if all(c.get("id") for c in turn):
                    return turn, m.id
                break
        return calls, None

    def _with_ids(self, calls: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """The calls, each with an id. The engine needs one for every call, unique in the
        session: a session answers an id it has seen with its stored answer, so a per-turn
        counter would replay the last turn."""
        calls = [dict(c) for c in calls]
        fresh = uuid.uuid4().hex[:12]
        for i, call in enumerate(calls):
            if not call.get("id"):
                call["id"] = f"switchboard_call_{fresh}_{i}"
        return calls

    def _key(self, config: Any) -> Tuple[Any, Optional[str]]:
        """The conversation's key (None: the node's one session) and its thread id."""
        thread = ((config or {}).get("configurable") or {}).get("thread_id")
        return (None if self._fixed_session is not None else thread), thread

    async def _node(self, input: Any, config: Any, runtime: Any,
                    caller_loop: Optional[asyncio.AbstractEventLoop]) -> Any:
        tool_calls, input_type = self._parse_input(input)
        tool_calls = self._with_ids(tool_calls)
        state = self._extract_state(input, config)

        def context(turn: List[Dict[str, Any]], ai_id: Optional[str]) -> _TurnContext:
            return _TurnContext(turn, config, state, runtime, input_type, caller_loop, ai_id)

        if input_type != "tool_calls" or len(tool_calls) != 1:
            # The whole AI message (a hand-built graph, create_react_agent(version="v1")).
            key, thread = self._key(config)
            ctx = context(tool_calls, self._turn_of(tool_calls, state)[1])
            outcomes = await self._run_turn(key, thread, tool_calls, ctx)
        else:
            outcomes = await self._send(tool_calls[0], state, config, context)
        outputs = []
        for call in tool_calls:
            out = outcomes[call["id"]]
            if isinstance(out, BaseException):
                raise out
            outputs.append(out)
        return self._combine_tool_outputs(outputs, input_type)

    async def _send(self, call: Dict[str, Any], state: Any, config: Any,
                    context: Callable[[List[Dict[str, Any]], Optional[str]], _TurnContext],
                    send: Optional[_Send] = None) -> Dict[str, Any]:
        """One ``Send`` of one call (``create_react_agent``, ``create_agent``): the first of
        its turn's Sends dispatches the whole turn, the others wait for it; each takes its own
        call's outcome from the dict returned."""
        key, thread = self._key(config)
        turn, ai_id = self._turn_of([call], state)
        if ((config or {}).get("configurable") or {}).get(CONFIG_KEY_RESUMING):
            # Resuming (after an interrupt, or replaying from a checkpoint): only the Sends that
            # did not finish run again (the others' results are saved), so this call is a turn
            # of its own — still named after its message, so a call that had run is answered
            # from the engine's memory (an interrupted one is sent under a fresh id: it runs).
            turn = [call]
        ids = tuple(c["id"] for c in turn)
        turn_key = (key, ai_id, ids)
        shared = self._turns.get(turn_key)
        if shared is None:
            shared = self._turns[turn_key] = _Turn(ids, context(turn, ai_id))
            shared.ctx.first = send
            task = shared.task = asyncio.ensure_future(
                self._run_turn(key, thread, turn, shared.ctx))

            def settle(t: asyncio.Task, fut: asyncio.Future = shared.future) -> None:
                if fut.done():
                    return
                if t.cancelled():
                    fut.cancel()
                elif t.exception() is not None:
                    fut.set_exception(t.exception())
                else:
                    fut.set_result(t.result())
            task.add_done_callback(settle)
        if send is not None:
            shared.ctx.sends.setdefault(call["id"], send)
        shared.waiting += 1
        try:
            return await asyncio.shield(shared.future)
        except asyncio.CancelledError:
            if shared.waiting == 1 and shared.task is not None and not shared.task.done():
                shared.task.cancel()      # the graph run was cancelled: so is the turn
            raise
        finally:
            shared.waiting -= 1
            shared.remaining.discard(call["id"])
            if not shared.remaining and self._turns.get(turn_key) is shared:
                del self._turns[turn_key]

    async def _middleware_call(self, request: Any, handler: Callable[[Any], Any],
                               caller_loop: Optional[asyncio.AbstractEventLoop],
                               context: Optional[contextvars.Context]) -> Any:
        """``SwitchboardMiddleware``'s ``wrap_tool_call``: this call's outcome, its whole AI
        message dispatched as one turn by the first of its calls to get here."""
        call = self._with_ids([request.tool_call])[0]
        if call["id"] != request.tool_call.get("id"):
            request = request.override(tool_call=call)
        runtime = request.runtime
        config = getattr(runtime, "config", None) or {}
        send = _Send(request, handler, caller_loop, context)

        def turn_context(turn: List[Dict[str, Any]], ai_id: Optional[str]) -> _TurnContext:
            return _TurnContext(turn, config, request.state, runtime, "tool_calls", caller_loop,
                                ai_id)

        out = (await self._send(call, request.state, config, turn_context, send))[call["id"]]
        if isinstance(out, BaseException):
            raise out
        return out

    async def _run_handler(self, call: Dict[str, Any], ctx: _TurnContext
                           ) -> Tuple[Any, List[BaseException]]:
        """Runs one LangChain tool through ``create_agent``'s own execution (its ``execute``
        handler, with the middleware after this one): the call's own request when its Send has
        arrived, else the first Send's with this call and its tool. A raising tool is an error
        result unless ``handle_tool_errors=False``; an interrupt always propagates."""
        send = ctx.sends.get(call["id"]) or ctx.first
        assert send is not None
        request = send.request
        if request.tool_call.get("id") != call["id"]:
            runtime = request.runtime
            if dataclasses.is_dataclass(runtime) and not isinstance(runtime, type):
                runtime = dataclasses.replace(runtime, tool_call_id=call["id"])
            request = dataclasses.replace(request, tool_call=call, runtime=runtime,
                                          tool=self.tools_by_name[call["name"]])
        try:
            if send.context is not None:          # a synchronous handler: in a worker thread
                out = await asyncio.get_running_loop().run_in_executor(
                    None, send.context.copy().run, send.handler, request)
            else:
                loop = send.loop
                out = await on_loop(None if loop is None or loop.is_closed() else loop,
                                    send.handler(request))
        except GraphBubbleUp:
            raise
        except Exception as e:
            if not self._catch_errors:
                raise
            return ToolMessage(str(e), name=call["name"], tool_call_id=call["id"],
                               status="error"), [e]
        return out, []

    async def _run_here(self, call: Dict[str, Any], ctx: _TurnContext
                        ) -> Tuple[Any, List[BaseException]]:
        """Runs one LangChain tool as this node does, on the caller's loop (here when it has
        none — ``invoke`` — or it has closed)."""
        loop = ctx.caller_loop
        return await on_loop(None if loop is None or loop.is_closed() else loop,
                             self._run_tool(call, ctx))

    async def _run_turn(self, key: Any, thread: Optional[str], turn: List[Dict[str, Any]],
                        ctx: _TurnContext) -> Dict[str, Any]:
        outcomes: Dict[str, Any] = {}
        blocks = []
        for call in turn:
            name = call["name"]
            if name not in self.tools_by_name:
                # The session's catalog has every built-in (and the server's MCP tools); the
                # node runs only the tools it was given, and answers any other name as
                # LangGraph's ToolNode does: an error result naming the tools there are.
                outcomes[call["id"]] = self._validate_tool_call(call)
                continue
            blocks.append({"type": "tool_use", "id": call["id"], "name": name,
                           "input": call.get("args") or {}})
        wire = [dict(b, id=self._wire_id(b["id"])) for b in blocks]
        if blocks:
            for attempt in (1, 2):
                conv = await self._conversation(key, thread)
                async with conv.lock:
                    conv.turn = ctx
                    try:
                        answer = await run_cancellable(
                            conv.session, {"role": "assistant", "content": wire},
                            turn_id=ai_turn_id(ctx.ai_id),
                            on_progress=_progress_to(ctx, {s["id"]: b["id"]
                                                           for b, s in zip(blocks, wire)}))
                        break
                    except SwitchboardError as e:
                        # The server closed the session (idle timeout, restart): nothing of
                        # the turn ran; a new session runs it (a fresh workspace unless named).
                        if e.code != "unknown_session" or attempt == 2 \
                                or self._fixed_session is not None:
                            raise
                        if self._conversations.get(key) is conv:
                            del self._conversations[key]
                    finally:
                        conv.turn = None
            results = {r["tool_use_id"]: r for r in (answer or {}).get("content", [])
                       if isinstance(r, dict) and r.get("type") == "tool_result"}
            for block, sent in zip(blocks, wire):
                outcomes[block["id"]] = self._message_for(block, results.get(sent["id"]), ctx)
                if isinstance(ctx.local.get(block["id"]), GraphBubbleUp):
                    self._interrupted.add(block["id"])
        return outcomes

    def _wire_id(self, call_id: str) -> str:
        """The id a call is sent under: its own, or a fresh one when it resumes an interrupt."""
        if call_id not in self._interrupted:
            return call_id
        self._interrupted.discard(call_id)
        self._resumes += 1
        return f"{call_id}-resume{self._resumes}"

    def _message_for(self, block: Dict[str, Any], result: Optional[Dict[str, Any]],
                     ctx: _TurnContext) -> Any:
        call_id, name = block["id"], block["name"]
        local = ctx.local.get(call_id)
        if isinstance(local, BaseException):
            return local                          # re-raised by the node (interrupts, ...)
        if result is None:                        # cannot happen: one result per call
            return ToolMessage("switchboard: no result for this call", name=name,
                               tool_call_id=call_id, status="error")
        content = _result_content(result.get("content"))
        is_error = bool(result.get("is_error"))
        if isinstance(local, ToolMessage):
            return local.model_copy(update={"content": content,
                                            "status": "error" if is_error else local.status})
        if local is not None and not is_error:
            return local                          # a Command (or a list of them)
        return ToolMessage(content=content, name=name, tool_call_id=call_id,
                           status="error" if is_error else "success")

    # ---- sessions --------------------------------------------------------------------------

    def _get_client(self) -> AsyncClient:
        if self._client is None:
            self._client = _bridge.own_client(self._client_arg)
        return self._client

    async def _conversation(self, key: Any, thread: Optional[str]) -> _Conversation:
        conv = self._conversations.get(key)
        if conv is not None:
            return conv
        pending = self._creating.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut = self._creating[key] = asyncio.get_running_loop().create_future()
        try:
            if self._fixed_session is not None:
                session = self._fixed_session
            else:
                ws = self._workspace(thread) if callable(self._workspace) else self._workspace
                kwargs: Dict[str, Any] = {}
                if self._sandbox is not None:
                    kwargs["sandbox"] = self._sandbox
                session = self._get_client().session(ws, **kwargs)
            conv = _Conversation(session)
            for name, tool in self._client_tools.items():
                self._register(conv, name, tool)
            self._conversations[key] = conv
            fut.set_result(conv)
            return conv
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()                       # mark retrieved
            raise
        finally:
            del self._creating[key]

    def _register(self, conv: _Conversation, name: str, tool: BaseTool) -> None:
        fn = convert_to_openai_tool(tool)["function"]
        schema = fn.get("parameters") or {"type": "object", "properties": {}}
        node = self

        async def run(**args: Any) -> Any:
            ctx = conv.turn
            if ctx is None:
                raise ToolError(f"{name}: called outside a turn")
            call_id = ctx.claim(name, args)
            if call_id is None:
                raise ToolError(f"{name}: no call with these arguments in the turn")
            call = {"type": "tool_call", "id": call_id, "name": name, "args": args}
            run_tool = node._run_handler if ctx.first is not None else node._run_here
            try:
                out, caught = await run_tool(call, ctx)
            except GraphBubbleUp as e:            # an interrupt: the node re-raises it
                ctx.local[call_id] = e
                raise ToolError(f"{name}: interrupted") from None
            except Exception as e:                # handle_tool_errors=False: the node raises
                ctx.local[call_id] = e
                raise
            ctx.local[call_id] = out
            if isinstance(out, ToolMessage):
                if out.status == "error" and caught:
                    raise caught[-1]
                if out.status == "error":
                    raise ToolError(_text_of(out.content))
                return _text_of(out.content)
            return ""                             # a Command: its own messages say it

        conv.session.register(run, schema, name=name, description=fn.get("description") or "",
                              **self._options.get(name, {}))

    async def _run_tool(self, call: Dict[str, Any], ctx: _TurnContext
                        ) -> Tuple[Any, List[BaseException]]:
        """Runs one LangChain tool as LangGraph's ``ToolNode`` does (injection, validation,
        ``handle_tool_errors``, ``Command``), on the caller's event loop; with the exceptions
        ``handle_tool_errors=True`` caught."""
        caught: List[BaseException] = []
        _CAUGHT.set(caught)
        runtime = ctx.runtime
        tool_runtime = ToolRuntime(
            state=ctx.state, tool_call_id=call["id"], config=ctx.config,
            context=getattr(runtime, "context", None), store=getattr(runtime, "store", None),
            stream_writer=getattr(runtime, "stream_writer", None),
            tools=list(self.tools_by_name.values()),
            execution_info=getattr(runtime, "execution_info", None),
            server_info=getattr(runtime, "server_info", None))
        request = ToolCallRequest(tool_call=call, tool=self.tools_by_name[call["name"]],
                                  state=ctx.state, runtime=tool_runtime)
        return await self._execute_tool_async(request, ctx.input_type, ctx.config), caught

    # ---- lifecycle -------------------------------------------------------------------------

    async def _close(self) -> None:
        conversations, self._conversations = list(self._conversations.values()), {}
        for conv in conversations:
            if conv.session is not self._fixed_session:
                try:
                    await conv.session.close()
                except Exception:
                    pass
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    def close(self) -> None:
        """Deletes the node's sessions (their workspaces stay) and closes its own client."""
        self._loop.run(self._close())

    async def aclose(self) -> None:
        await self._loop.arun(self._close())


# --------------------------------------------------------------------------------------------
# The middleware, for LangChain's create_agent.
# --------------------------------------------------------------------------------------------

class SwitchboardMiddleware(AgentMiddleware):  # type: ignore[misc,valid-type]
    """``create_agent``'s tool calls through Switchboard: the calls of one AI message are one
    turn of the conversation's session, with the same guarantees as :class:`ToolNode`.

    ``create_agent`` builds its own tool node and sends it each call of a message separately;
    this middleware's ``wrap_tool_call`` finds the message the call belongs to, the first of
    its calls to arrive dispatches the whole message as one turn (named after the message's
    id), and each takes its own result. The built-ins run in the engine; a LangChain tool's
    call comes back and runs through ``create_agent``'s own execution (the ``handler``: the
    middleware listed after this one, then the tool node), on the caller's loop or thread.

    Args:
        tools: tools the middleware adds to the agent (``create_agent`` binds the model to
            them and gives them to its tool node), besides the agent's own ``tools=``.
        builtins: ``True`` adds the five built-ins to the agent; a list of names adds those;
            default: only the built-ins among the agent's tools (``builtin_tools()``).
        handle_tool_errors: ``True`` (default): a tool that raises is an error result
            (``Error [execution_error]: ValueError: ...``) and the agent goes on; ``False``:
            the exception propagates as ``create_agent`` propagates it, after the turn's other
            calls have their results.
        client, session, workspace, sandbox, tool_options: as for :class:`ToolNode`.

    Sessions, one per ``thread_id``, live as long as the middleware: ``close()`` (or
    ``await aclose()``) deletes them; open ones are deleted at exit. Middleware listed before
    this one wraps the whole call: a retry there gets the engine's stored answer (a call runs
    once per id); one listed after it wraps the tool itself.
    """

    def __init__(
        self,
        tools: Sequence[Union[BaseTool, Callable[..., Any]]] = (),
        *,
        client: Union[Client, AsyncClient, str, None] = None,
        session: Any = None,
        builtins: Union[bool, Iterable[str], None] = None,
        workspace: Union[str, Callable[[Optional[str]], str], None] = None,
        sandbox: Any = None,
        tool_options: Optional[ToolOptions] = None,
        handle_tool_errors: bool = True,
    ) -> None:
        if not _HAS_LANGCHAIN:  # pragma: no cover - exercised only without langchain
            raise ImportError("SwitchboardMiddleware needs langchain (create_agent): "
                              "pip install 'switchboard-client[langgraph]'")
        check_client(client)
        own = [t if isinstance(t, BaseTool) else create_tool(t) for t in tools]
        wanted = list(BUILTIN_NAMES) if builtins is True else list(builtins or [])
        present = {t.name for t in own}
        self.tools = own + [t for t in builtin_tools(wanted) if t.name not in present]
        self._settings: Dict[str, Any] = dict(
            client=client, session=session, workspace=workspace, sandbox=sandbox,
            tool_options=tool_options, handle_tool_errors=handle_tool_errors)
        self._nodes: Dict[Tuple[str, ...], ToolNode] = {}
        self._lock = threading.Lock()

    def _node_for(self, request: Any) -> ToolNode:
        """The node that runs the agent's turns: one per set of tools (the agent's tool node's,
        as its runtime lists them), made on the first call."""
        tools = list(getattr(request.runtime, "tools", None) or [])
        if not tools:                             # pragma: no cover - runtimes without `tools`
            tools = list(self.tools) + ([request.tool] if request.tool is not None else [])
        key = tuple(sorted(t.name for t in tools))
        with self._lock:
            node = self._nodes.get(key)
            if node is None:
                node = self._nodes[key] = ToolNode(tools, **self._settings)
            return node

    def wrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        node = self._node_for(request)
        return node._loop.run(node._middleware_call(request, handler, None,
                                                    contextvars.copy_context()))

    async def awrap_tool_call(self, request: Any, handler: Callable[[Any], Any]) -> Any:
        node = self._node_for(request)
        return await node._loop.arun(node._middleware_call(
            request, handler, asyncio.get_running_loop(), None))

    @property
    def sessions(self) -> List[Any]:
        """The sessions of the conversations so far."""
        return [conv.session for node in list(self._nodes.values())
                for conv in list(node._conversations.values())]

    def close(self) -> None:
        """Deletes the middleware's sessions (their workspaces stay) and closes its clients."""
        for node in list(self._nodes.values()):
            node.close()

    async def aclose(self) -> None:
        for node in list(self._nodes.values()):
            await node.aclose()
