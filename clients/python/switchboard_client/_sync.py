"""The synchronous client, on a urllib3 connection pool (thread-safe)."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, TypeVar, overload

import urllib3

from . import _common as c
from ._common import SwitchboardError
from ._tools import ToolEntry, ToolRegistry, no_function, tool_entry

log = logging.getLogger("switchboard_client")
F = TypeVar("F", bound=Callable[..., Any])

_JSON = {"Content-Type": "application/json"}


class Client:
    """A connection pool to one Switchboard server, safe to share between threads.

    ``token`` defaults to the ``SWITCHBOARD_TOKEN`` environment variable. ``timeout`` is the
    read timeout in seconds (None: none, since a call may run for minutes); connecting waits at
    most 10 s. A request refused ``overloaded`` is retried after its ``Retry-After``, at most
    ``max_retries`` times within ``retry_budget_s`` seconds."""

    def __init__(self, base_url: str = c.DEFAULT_BASE_URL, token: Optional[str] = None, *,
                 timeout: Optional[float] = None, max_retries: int = 5,
                 retry_budget_s: float = 30, max_connections: int = 64):
        self.base_url = base_url.rstrip("/")
        self._prefix = urllib3.util.parse_url(self.base_url).path or ""
        self._headers = c.base_headers(token)
        self._json_headers = {**self._headers, **_JSON}
        self._stream_headers = {**self._json_headers, "Accept": "text/event-stream"}
        connect = c.CONNECT_TIMEOUT if timeout is None else min(c.CONNECT_TIMEOUT, timeout)
        self._timeout = urllib3.Timeout(connect=connect, read=timeout)
        self._pool = urllib3.connection_from_url(
            self.base_url, maxsize=max_connections, block=False, timeout=self._timeout,
            retries=False)
        self.max_retries = max_retries
        self.retry_budget_s = retry_budget_s
        self._executor: Optional[ThreadPoolExecutor] = None
        self._executor_lock = threading.Lock()

    # --- transport ---

    def _urlopen(self, method: str, path: str, body: Optional[bytes], headers: Dict[str, str],
                 stream: bool) -> Any:
        """Sends one request, retrying ``overloaded``; returns the response (status < 400)."""
        attempt, started = 0, 0.0
        url = self._prefix + path
        while True:
            try:
                resp = self._pool.urlopen(method, url, body=body, headers=headers, retries=False,
                                          redirect=False, preload_content=not stream,
                                          assert_same_host=False)
            except urllib3.exceptions.HTTPError as e:
                raise c.connection_error(e) from e
            if resp.status < 400:
                return resp
            try:
                data = resp.data if not stream else resp.read()
            except urllib3.exceptions.HTTPError:
                data = b""
            finally:
                resp.release_conn()
            err = c.error_from(resp.status, resp.reason or "", resp.headers.get("retry-after"), data)
            if attempt == 0:
                started = time.monotonic()
            delay = c.retry_delay(err, attempt, time.monotonic() - started, self.max_retries,
                                  self.retry_budget_s)
            if delay is None:
                raise err
            attempt += 1
            time.sleep(delay)

    def _request(self, method: str, path: str, body: Optional[bytes] = None,
                 headers: Optional[Dict[str, str]] = None) -> Any:
        resp = self._urlopen(method, path, body,
                             headers or (self._json_headers if body is not None else self._headers),
                             False)
        data = resp.data
        return json.loads(data) if data else None

    def _tool_executor(self) -> ThreadPoolExecutor:
        if self._executor is None:
            with self._executor_lock:
                if self._executor is None:
                    self._executor = ThreadPoolExecutor(max_workers=32,
                                                        thread_name_prefix="switchboard-tool")
        return self._executor

    # --- API ---

    def session(self, workspace: Optional[str] = None, *, tools: Optional[List[Any]] = None,
                sandbox: Any = None) -> "Session":
        """A session whose file tools are confined to ``<workspace-root>/workspace`` (shared by
        every session naming it), or to a fresh directory when ``None``. ``tools`` are client
        tools: Python functions or tool dicts. The server session is created on first use."""
        return Session(self, workspace, tools=tools, sandbox=sandbox)

    def tools(self, format: str = "anthropic") -> List[Any]:
        """The server's catalog (``anthropic``, ``openai`` or ``mcp`` shape), e.g. for
        ``tools=``. A session with client tools has its own: ``session.tools()``."""
        return self._request("GET", f"/v1/tools?format={format}")

    def health(self) -> Any:
        return self._request("GET", "/healthz")

    def close(self) -> None:
        self._pool.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Session:
    """One conversation's session. Created on the server on first use (so client tools added
    before then are declared); as a context manager it is deleted on exit."""

    def __init__(self, client: Client, workspace: Optional[str] = None, *,
                 tools: Optional[List[Any]] = None, sandbox: Any = None):
        self._client = client
        self._workspace_name = workspace
        self._sandbox = sandbox
        self._registry = ToolRegistry()
        for t in tools or ():
            self._registry.add_any(t)
        self._id: Optional[str] = None
        self._workspace: Optional[str] = None
        self._created: Any = None
        self._closed = False
        self._lock = threading.Lock()

    # --- creation ---

    def create(self) -> "Session":
        """Creates the server session now (otherwise the first use does)."""
        self._ensure()
        return self

    def _ensure(self) -> str:
        if self._id is not None:
            return self._id
        with self._lock:
            if self._id is None:
                if self._closed:
                    raise SwitchboardError("unknown_session", "the session is closed", 404)
                body = c.session_body(self._workspace_name, self._registry.specs(), self._sandbox)
                created = self._client._request("POST", "/v1/sessions", body)
                self._created = created
                self._workspace = created["workspace"]
                self._base = f"/v1/sessions/{created['session_id']}"
                self._id = created["session_id"]
        return self._id

    @property
    def id(self) -> str:
        """The server's session id (creates the session if needed)."""
        return self._ensure()

    @property
    def workspace(self) -> str:
        """The session's workspace directory on the server (creates the session if needed)."""
        self._ensure()
        return self._workspace  # type: ignore[return-value]

    @property
    def created(self) -> bool:
        return self._id is not None

    # --- client tools ---

    def _check_open_for_tools(self) -> None:
        if self._id is not None or self._closed:
            raise RuntimeError(
                "client tools must be registered before the session is first used: the server "
                "fixes a session's client tools when it creates it (on the first dispatch, "
                "start, info or tools call). Register them first, or open a new session.")

    @overload
    def tool(self, fn: F) -> F: ...

    @overload
    def tool(self, fn: None = None, *, name: Optional[str] = None,
             description: Optional[str] = None, concurrency_safe: bool = False,
             access: Any = None, timeout_ms: Optional[int] = None,
             output_cap: Optional[int] = None) -> Callable[[F], F]: ...

    def tool(self, fn: Any = None, *, name: Optional[str] = None,
             description: Optional[str] = None, concurrency_safe: bool = False,
             access: Any = None, timeout_ms: Optional[int] = None,
             output_cap: Optional[int] = None) -> Any:
        """Decorator: ``@session.tool`` or ``@session.tool(name=..., ...)`` registers the
        function as a client tool and returns it unchanged."""
        def decorate(f: F) -> F:
            self.register(f, name=name, description=description,
                          concurrency_safe=concurrency_safe, access=access,
                          timeout_ms=timeout_ms, output_cap=output_cap)
            return f
        return decorate(fn) if fn is not None else decorate

    def register(self, fn: Optional[Callable[..., Any]], schema: Optional[Dict[str, Any]] = None,
                 *, name: Optional[str] = None, description: Optional[str] = None,
                 concurrency_safe: bool = False, access: Any = None,
                 timeout_ms: Optional[int] = None, output_cap: Optional[int] = None) -> Dict[str, Any]:
        """Registers a client tool: ``fn`` is called with the call's arguments as keywords
        (in a worker thread; a coroutine function on an event loop of its own thread).
        ``schema`` is its input schema or a whole tool dict; by default the schema comes from
        the type hints and the description from the docstring. Returns the declaration."""
        self._check_open_for_tools()
        entry = tool_entry(fn, schema, name=name, description=description,
                           concurrency_safe=concurrency_safe, access=access,
                           timeout_ms=timeout_ms, output_cap=output_cap)
        self._registry.add(entry)
        return entry.spec

    @property
    def client_tools(self) -> List[Dict[str, Any]]:
        """The declarations of this session's client tools."""
        return self._registry.specs()

    def _run_call(self, call: Dict[str, Any]) -> None:
        """Runs one client-tool call (in a worker thread) and posts its answer, once."""
        entry = self._registry.get(call.get("name", ""))
        if entry is None or entry.fn is None:
            body = c.error_body(no_function(call.get("name", "")))
        else:
            body = _call_body(entry, call.get("input"))
        self._answer(call["call_id"], body)

    def _answer(self, call_id: str, body: bytes) -> None:
        try:
            self._client._request("POST", f"{self._base}/calls/{call_id}", body)
        except SwitchboardError as e:
            if e.code not in ("call_closed", "already_answered", "unknown_call",
                              "unknown_session"):
                log.warning("switchboard: answering client call %s failed: %s", call_id, e)

    # --- dispatch ---

    def _prepare(self, message: Any, format: Optional[str]) -> Tuple[str, Optional[List[str]], bytes]:
        document = c.as_document(message)
        fmt = c.detect_format(document, format)
        return fmt, c.called_tools(document, fmt), c.dumps(document)

    def dispatch(self, message: Any, format: Optional[str] = None, *,
                 turn_id: Optional[str] = None) -> Any:
        """Runs the tool calls of one model answer and returns what to append to the
        conversation: the user message of ``tool_result`` blocks (Anthropic) or the list of tool
        messages to ``extend`` it with (OpenAI); ``None`` when the answer calls no tool.
        ``format`` is detected when not given; client-tool calls run here."""
        fmt, names, body = self._prepare(message, format)
        if names == []:
            return None
        self._ensure()
        tid = turn_id or c.new_turn_id()
        if self._registry and (names is None or any(n in self._registry for n in names)):
            stream = DispatchStream(self, fmt, body, tid, None)
            for _ in stream:
                pass
            return stream.answer
        headers = {**self._client._json_headers, c.TURN_HEADER: tid}
        return self._client._request("POST", f"{self._base}/dispatch?format={fmt}", body,
                                     headers)

    def start(self, message: Any, format: Optional[str] = None, *,
              turn_id: Optional[str] = None) -> "Turn":
        """Starts the dispatch of ``message`` in a background thread and returns its handle:
        ``turn.result()`` waits for the answer, ``turn.cancel()`` cancels it."""
        return Turn(self, message, format, turn_id or c.new_turn_id())

    def stream(self, message: Any, format: Optional[str] = None,
               on_approval: Optional[Callable[[Any], bool]] = None, *,
               turn_id: Optional[str] = None) -> "DispatchStream":
        """Like :meth:`dispatch`, yielding ``(index, result)`` as each call is answered; the
        complete answer is ``.answer`` once the iteration ends. Under ``serve --policy``, a call
        an ``ask`` rule holds is passed to ``on_approval(request)`` (``approval_id``,
        ``tool_use_id``, ``tool_name``, ``tool_input``, ``subject``, ``rule``), whose truth
        allows it; without ``on_approval`` it is denied at once. Client tools run as asked."""
        fmt, _names, body = self._prepare(message, format)
        return DispatchStream(self, fmt, body, turn_id or c.new_turn_id(), on_approval)

    def tools(self, format: str = "anthropic") -> List[Any]:
        """The session's catalog: the server's tools, then its client tools."""
        self._ensure()
        return self._client._request("GET", f"{self._base}/tools?format={format}")

    def approve(self, approval_id: str, allow: bool) -> Any:
        """Answers a call waiting for approval (``unknown_approval`` if none of that id)."""
        self._ensure()
        return self._client._request("POST", f"{self._base}/approvals/{approval_id}",
                                     c.dumps({"allow": bool(allow)}))

    def info(self) -> Any:
        """``{"session_id", "workspace", "turns", "calls", "in_flight"}``."""
        self._ensure()
        return self._client._request("GET", self._base)

    def cancel(self) -> Any:
        """Cancels the running and pending calls (they are answered ``cancelled``)."""
        if self._id is None:
            return None
        return self._client._request("POST", f"{self._base}/cancel")

    def cancel_turn(self, turn_id: str) -> Any:
        """Cancels the turn ``turn_id`` wherever it is: ``{"turn_id", "state"}`` with state
        ``running``, ``queued``, ``early`` (not arrived yet: it will run nothing) or
        ``finished``."""
        self._ensure()
        return self._client._request("POST", f"{self._base}/turns/{turn_id}/cancel")

    def close(self) -> None:
        """Cancels what runs and frees the session (its workspace stays). Idempotent."""
        with self._lock:
            self._closed = True
        if self._id is None:
            return
        try:
            self._client._request("DELETE", self._base)
        except SwitchboardError as e:
            if e.code != "unknown_session":
                raise

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _call_body(entry: ToolEntry, input: Any) -> bytes:
    try:
        args, kwargs = entry.arguments(input)
        if entry.is_async:
            import asyncio
            value = asyncio.run(entry.fn(*args, **kwargs))  # type: ignore[misc]
        else:
            value = entry.fn(*args, **kwargs)  # type: ignore[misc]
        return c.answer_body(value)
    except Exception as e:  # a failing tool is a result, never a crashed loop
        return c.answer_body(error=e)


class DispatchStream:
    """The results of a streamed dispatch, as they come; ``answer`` at the end."""

    def __init__(self, session: Session, fmt: str, body: bytes, turn_id: str,
                 on_approval: Optional[Callable[[Any], bool]]):
        self._session, self._fmt, self._body = session, fmt, body
        self.turn_id = turn_id
        self._on_approval = on_approval
        self._state = c.StreamState()
        self._iter: Optional[Iterator[Tuple[int, Any]]] = None

    @property
    def answer(self) -> Any:
        """The complete ordered answer (set once the stream has ended)."""
        return self._state.answer

    def _run(self) -> Iterator[Tuple[int, Any]]:
        session = self._session
        session._ensure()
        client = session._client
        headers = {**client._stream_headers, c.TURN_HEADER: self.turn_id}
        resp = client._urlopen("POST", f"{session._base}/dispatch?format={self._fmt}&stream=true",
                               self._body, headers, True)
        decoder = c.SseDecoder()
        state = self._state
        complete = False
        try:
            chunks = resp.read_chunked() if resp.chunked else iter(lambda: resp.read1(65536), b"")
            for chunk in chunks:
                for event, data in decoder.feed(chunk):
                    if event == "call":
                        call = json.loads(data)
                        client._tool_executor().submit(session._run_call, call)
                    elif event == "approval_required":
                        request = json.loads(data)
                        state.approvals.append(request)
                        allow = bool(self._on_approval and self._on_approval(request))
                        session.approve(request["approval_id"], allow)
                    else:
                        item = state.handle(event, data)
                        if item is not None:
                            yield item
            complete = True
        except urllib3.exceptions.HTTPError as e:
            raise c.connection_error(e) from e
        finally:
            if not complete:
                resp.close()  # stopped early: drop the connection rather than drain the turn
            resp.release_conn()
        if not state.done:
            raise SwitchboardError("connection_error", "the stream ended before `done`")

    def __iter__(self) -> Iterator[Tuple[int, Any]]:
        if self._iter is None:
            self._iter = self._run()
        return self._iter

    def __next__(self) -> Tuple[int, Any]:
        return next(iter(self))


class Turn:
    """A dispatch running in a background thread, under a turn id the client chose."""

    def __init__(self, session: Session, message: Any, format: Optional[str], turn_id: str):
        self._session = session
        self.turn_id = turn_id
        self._future: "Future[Any]" = Future()
        self._thread = threading.Thread(target=self._run, args=(message, format),
                                         name=f"switchboard-turn-{turn_id}", daemon=True)
        self._thread.start()

    def _run(self, message: Any, format: Optional[str]) -> None:
        if not self._future.set_running_or_notify_cancel():
            return
        try:
            self._future.set_result(self._session.dispatch(message, format,
                                                           turn_id=self.turn_id))
        except BaseException as e:
            self._future.set_exception(e)

    def result(self, timeout: Optional[float] = None) -> Any:
        """The dispatch's answer (what ``dispatch`` returns), waiting at most ``timeout``
        seconds (``TimeoutError`` then); raises what the dispatch raised."""
        return self._future.result(timeout)

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        return self._future.exception(timeout)

    def done(self) -> bool:
        return self._future.done()

    def cancel(self) -> Any:
        """Cancels the turn on the server, wherever it is (even before its dispatch arrived);
        returns ``{"turn_id", "state"}``. Safe from any thread. The turn's calls are answered
        ``cancelled`` and ``result()`` returns the answer."""
        return self._session.cancel_turn(self.turn_id)

    def add_done_callback(self, fn: Callable[["Future[Any]"], Any]) -> None:
        self._future.add_done_callback(fn)
