"""The synchronous client, on a urllib3 connection pool (thread-safe)."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import urllib3

from . import _common as c
from ._common import SwitchboardError
from ._context import ToolCallContext, calling
from ._tools import ToolEntry

log = logging.getLogger("switchboard_client")


class Client:
    """A connection pool to one Switchboard server, safe to share between threads.

    ``token`` defaults to the ``SWITCHBOARD_TOKEN`` environment variable. ``timeout`` is the
    read timeout in seconds (None: none, since a call may run for minutes); connecting waits at
    most 10 s. A request refused ``overloaded`` (or a cluster's ``node_unreachable``,
    ``session_moved`` or ``cluster_unavailable``) is retried after its ``Retry-After``, at most ``max_retries`` times within
    ``retry_budget_s`` seconds."""

    def __init__(self, base_url: str = c.DEFAULT_BASE_URL, token: Optional[str] = None, *,
                 timeout: Optional[float] = None, max_retries: int = 5,
                 retry_budget_s: float = 30, max_connections: int = 64):
        self.base_url = base_url.rstrip("/")
        self._prefix = urllib3.util.parse_url(self.base_url).path or ""
        self._headers, self._json_headers, self._stream_headers = c.request_headers(token)
        self._timeout = urllib3.Timeout(connect=c.connect_timeout(timeout), read=timeout)
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
        retries = c.Retries(self.max_retries, self.retry_budget_s)
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
            delay = retries.delay(err)
            if delay is None:
                raise err
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
                    self._executor = c.tool_executor()
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


class Session(c.SessionBase):
    """One conversation's session. Created on the server on first use (so client tools added
    before then are declared); as a context manager it is deleted on exit. Client tools:
    ``tool``, ``register``, ``client_tools``."""

    def __init__(self, client: Client, workspace: Optional[str] = None, *,
                 tools: Optional[List[Any]] = None, sandbox: Any = None):
        super().__init__(client, workspace, tools, sandbox)
        self._client: Client = client
        self._created: Any = None
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
                created = self._client._request("POST", "/v1/sessions", self._create_body())
                self._created = created
                return self._adopt(created)
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

    # --- client tools ---

    def _tools_fixed(self) -> bool:
        return self._id is not None or self._closed

    def _run_call(self, call: Dict[str, Any]) -> None:
        """Runs one client-tool call (in a worker thread) and posts its answer, once."""
        entry, missing = self._call_entry(call)
        body = _call_body(entry, call.get("input"), ToolCallContext.from_event(call)) \
            if entry is not None else c.error_body(missing)
        self._answer(call["call_id"], body)

    def _answer(self, call_id: str, body: bytes) -> None:
        try:
            self._client._request("POST", f"{self._base}/calls/{call_id}", body)
        except SwitchboardError as e:
            if e.code not in c.LATE_ANSWER_CODES:
                log.warning("switchboard: answering client call %s failed: %s", call_id, e)

    # --- dispatch ---

    def dispatch(self, message: Any, format: Optional[str] = None, *,
                 turn_id: Optional[str] = None) -> Any:
        """Runs the tool calls of one model answer and returns what to append to the
        conversation: the user message of ``tool_result`` blocks (Anthropic) or the list of tool
        messages to ``extend`` it with (OpenAI); ``None`` when the answer calls no tool.
        ``format`` is detected when not given; client-tool calls run here."""
        fmt, names, body = c.prepare(message, format)
        if names == []:
            return None
        self._ensure()
        tid = turn_id or c.turn_id_of(body)
        if self._streams(names):
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
        if turn_id is None:
            try:
                turn_id = c.turn_id_of(c.prepare(message, format)[2])
            except Exception:  # the dispatch itself says what is wrong with the message
                turn_id = c.new_turn_id()
        return Turn(self, message, format, turn_id)

    def stream(self, message: Any, format: Optional[str] = None,
               on_approval: Optional[Callable[[Any], bool]] = None, *,
               turn_id: Optional[str] = None) -> "DispatchStream":
        """Like :meth:`dispatch`, yielding ``(index, result)`` as each call is answered; the
        complete answer is ``.answer`` once the iteration ends. Under ``serve --policy``, a call
        an ``ask`` rule holds is passed to ``on_approval(request)`` (``approval_id``,
        ``tool_use_id``, ``tool_name``, ``tool_input``, ``subject``, ``rule``), whose truth
        allows it; without ``on_approval`` it is denied at once. Client tools run as asked."""
        fmt, _names, body = c.prepare(message, format)
        return DispatchStream(self, fmt, body, turn_id or c.turn_id_of(body), on_approval)

    def tools(self, format: str = "anthropic") -> List[Any]:
        """The session's catalog: the server's tools, then its client tools, for ``tools=``.
        While tools are deferred, the Anthropic shape starts with ``tool_search`` and marks
        each deferred tool ``"defer_loading": true``; the OpenAI shape lists ``tool_search``,
        the tools not deferred, then the deferred ones the session has been shown. Ask again
        before each model request: the OpenAI list grows as tools are found."""
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


def _call_body(entry: ToolEntry, input: Any, context: ToolCallContext) -> bytes:
    try:
        args, kwargs = entry.arguments(input, context)
        with calling(context):
            if entry.is_async:
                import asyncio
                value = asyncio.run(entry.fn(*args, **kwargs))  # type: ignore[misc]
            else:
                value = entry.fn(*args, **kwargs)  # type: ignore[misc]
        return c.answer_body(value)
    except Exception as e:  # a failing tool is a result, never a crashed loop
        return c.answer_body(error=e)


class DispatchStream(c.StreamBase):
    """The results of a streamed dispatch, as they come; ``answer`` at the end."""

    _session: Session

    def __init__(self, session: Session, fmt: str, body: bytes, turn_id: str,
                 on_approval: Optional[Callable[[Any], bool]]):
        super().__init__(session, fmt, body, turn_id, on_approval)
        self._iter: Optional[Iterator[Tuple[int, Any]]] = None

    def _run(self) -> Iterator[Tuple[int, Any]]:
        session = self._session
        session._ensure()
        client = session._client
        path, headers = self._request()
        resp = client._urlopen("POST", path, self._body, headers, True)
        state = self._state
        complete = False
        try:
            chunks = resp.read_chunked() if resp.chunked else iter(lambda: resp.read1(65536), b"")
            for chunk in chunks:
                for kind, value in state.feed(chunk):
                    if kind == "call":
                        client._tool_executor().submit(session._run_call, value)
                    elif kind == "approval":
                        allow = bool(self._on_approval and self._on_approval(value))
                        session.approve(value["approval_id"], allow)
                    else:
                        yield value
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
