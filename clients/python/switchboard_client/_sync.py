"""The synchronous client, on a urllib3 connection pool (thread-safe)."""

from __future__ import annotations

import contextlib
import http.client
import logging
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import urllib3

from . import _common as c
from ._common import SwitchboardError
from ._context import REPORTS_BEFORE_ANSWER, Reporter, ToolCallContext, calling
from ._tools import ToolEntry

log = logging.getLogger("switchboard_client")


class Client:
    """A connection pool to one Switchboard server, safe to share between threads.

    ``token`` defaults to the ``SWITCHBOARD_TOKEN`` environment variable. ``timeout`` is the
    read timeout in seconds (None: none, since a call may run for minutes); connecting waits at
    most 10 s. A request refused ``overloaded`` (or a cluster's ``node_unreachable``,
    ``session_moved`` or ``cluster_unavailable``) is retried after its ``Retry-After``, and one
    whose connection failed before any answer is sent again (a session's creation only when it
    cannot have reached the server), at most ``max_retries`` times within ``retry_budget_s``
    seconds. ``close()`` is final: afterwards no client-tool call starts and no late answer is
    posted."""

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
        self._executor: Optional[c.ToolThreads] = None
        self._executor_lock = threading.Lock()
        self._closed = False
        self._sessions: "weakref.WeakSet[Session]" = weakref.WeakSet()  # created here

    # --- transport ---

    def _urlopen(self, method: str, path: str, body: Optional[bytes], headers: Dict[str, str],
                 resend: str = c.RESEND_ANY) -> Any:
        """Sends one request; returns the response (status < 400) with its body unread. Retries
        ``overloaded`` (and the cluster's refusals), and re-sends the request when its
        connection failed before any answer, if ``resend`` allows (see :data:`c.RESEND_ANY`)."""
        retries = c.Retries(self.max_retries, self.retry_budget_s)
        url = self._prefix + path
        while True:
            try:
                resp = self._pool.urlopen(method, url, body=body, headers=headers, retries=False,
                                          redirect=False, preload_content=False,
                                          assert_same_host=False)
            except urllib3.exceptions.HTTPError as e:
                failed = _failed_before_answer(e)
                if failed is None:
                    raise _transport_error(e) from e
                delay = retries.reconnect() \
                    if failed == c.RESEND_UNSENT or resend == c.RESEND_ANY else None
                if delay is None:
                    raise c.connection_error(e) from e
                time.sleep(delay)
                continue
            if resp.status < 400:
                return resp
            try:
                data = resp.read()
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
                 headers: Optional[Dict[str, str]] = None, resend: str = c.RESEND_ANY) -> Any:
        resp = self._urlopen(method, path, body,
                             headers or (self._json_headers if body is not None else self._headers),
                             resend)
        try:
            data = resp.read()
        except urllib3.exceptions.HTTPError as e:
            raise _transport_error(e) from e
        finally:
            resp.release_conn()
        return c.json_answer(data, resp.headers.get("content-type"), resp.status)

    def _tool_executor(self) -> c.ToolThreads:
        if self._executor is None:
            with self._executor_lock:
                if self._executor is None:
                    self._executor = c.tool_executor()
        return self._executor

    def _start_call(self, session: "Session", call: Dict[str, Any]) -> None:
        """Starts a client-tool call on a thread of its own (none once the client is closed:
        the server answers it ``cancelled`` or ``timeout``)."""
        try:
            if not self._closed:
                self._tool_executor().submit(session._run_call, call, time.monotonic())
                return
        except RuntimeError:  # closed meanwhile
            pass
        log.debug("switchboard: client closed; client call %s not started", call["call_id"])

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
        """Closes the connections. From now on no client-tool call starts, and the answers of
        calls still running are dropped without a word (the server has answered them itself,
        or will: ``cancelled`` when their turn's stream ends, else ``timeout``)."""
        self._closed = True
        with self._executor_lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False)
        self._pool.close()

    def _turns_in_flight(self) -> List["Session"]:
        """The open sessions of this client with a turn in flight."""
        return [s for s in list(self._sessions) if s._in_flight and not s._closed]

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
        self._in_flight = 0     # turns of this session running now (dispatch, stream)

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
                created = self._client._request("POST", "/v1/sessions", self._create_body(),
                                                resend=c.RESEND_UNSENT)
                self._created = created
                self._client._sessions.add(self)
                return self._adopt(created)
        return self._id

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """Counts a turn in flight while the block runs (``local()``'s close cancels them)."""
        with self._lock:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1

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

    def _run_call(self, call: Dict[str, Any], received: float) -> None:
        """Runs one client-tool call (on a thread of its own) and posts its answer, once —
        unless its deadline passed before the thread took it (the engine answered it
        ``timeout``: the function never starts) or the client closed. Never raises."""
        call_id = call["call_id"]
        try:
            if self._client._closed:
                return
            if c.call_expired(call, received):
                log.info("switchboard: client call %s (%s) not started: its deadline passed "
                         "before a thread took it", call_id, call.get("name"))
                return
            entry, missing = self._call_entry(call)
            reporter = self._reporter(call_id)
            context = ToolCallContext.from_event(call, reporter)
            body = _call_body(entry, call.get("input"), context) \
                if entry is not None else c.error_body(missing)
            # The call's last progress reports go before its answer (a moment at most).
            reporter.wait_idle(REPORTS_BEFORE_ANSWER)
            self._answer(call_id, body)
        except BaseException as e:  # noqa: BLE001 - a worker never dies with its call unanswered
            log.warning("switchboard: client call %s failed in the client: %s", call_id,
                        c.safe_text(e))
            self._answer(call_id, c.answer_body(error=e))

    def _reporter(self, call_id: str) -> Reporter:
        """The progress reports of call ``call_id``, sent from a thread of their own while
        there are any (the tool's own thread never waits for the server)."""
        path = f"{self._base}/calls/{call_id}/progress"

        def drain(reporter: Reporter) -> None:
            while True:
                bodies = reporter.take()
                if not bodies:
                    return
                for body in bodies:
                    if self._client._closed:
                        continue
                    try:
                        self._client._request("POST", path, body)
                    except Exception as e:  # noqa: BLE001 - a lost report never fails the call
                        log.debug("switchboard: a progress report of call %s was not taken: %s",
                                  call_id, e)

        def start(reporter: Reporter) -> None:
            threading.Thread(target=drain, args=(reporter,), daemon=True,
                             name=f"switchboard-progress-{call_id}").start()

        return Reporter(start)

    def _answer(self, call_id: str, body: bytes) -> None:
        """Posts a call's answer. An answer the server refuses (4xx: larger than its
        ``--max-body``, an image by URL, ...) is logged, and the call answered at once with an
        error naming why; a late one (the call already answered) is dropped, and so is any
        answer once the client is closed."""
        if self._client._closed:
            return
        try:
            self._client._request("POST", f"{self._base}/calls/{call_id}", body)
        except SwitchboardError as e:
            if e.code in c.LATE_ANSWER_CODES or self._client._closed:
                return
            log.warning("switchboard: the server refused the answer to client call %s: %s",
                        call_id, e)
            if e.status is None or not 400 <= e.status < 500:
                return
            try:
                self._client._request("POST", f"{self._base}/calls/{call_id}",
                                      c.refused_body(e))
            except SwitchboardError as again:
                if again.code not in c.LATE_ANSWER_CODES and not self._client._closed:
                    log.warning("switchboard: answering client call %s with an error failed "
                                "too: %s", call_id, again)

    # --- dispatch ---

    def dispatch(self, message: Any, format: Optional[str] = None, *,
                 turn_id: Optional[str] = None,
                 on_progress: Optional[Callable[[Any], Any]] = None) -> Any:
        """Runs the tool calls of one model answer and returns what to append to the
        conversation: the user message of ``tool_result`` blocks (Anthropic) or the list of tool
        messages to ``extend`` it with (OpenAI); ``None`` when the answer calls no tool.
        ``format`` is detected when not given; client-tool calls run here. With
        ``on_progress``, each running call's live progress (a command's output as it is written,
        an MCP server's progress) is passed to it as it comes: a dict with ``tool_use_id``,
        ``seq``, ``kind`` (``output``: ``stream``, ``text``; ``progress``: ``progress``,
        ``total``, ``message``), each call's before its result; the answer is the same."""
        fmt, names, body = c.prepare(message, format)
        if names == []:
            return None
        self._ensure()
        tid = turn_id or c.turn_id_of(body)
        if on_progress is not None or self._streams(names):
            stream = DispatchStream(self, fmt, body, tid, None, on_progress)
            for _ in stream:
                pass
            return stream.answer
        headers = {**self._client._json_headers, c.TURN_HEADER: tid}
        with self._turn():
            return self._client._request("POST", f"{self._base}/dispatch?format={fmt}", body,
                                         headers)

    def start(self, message: Any, format: Optional[str] = None, *,
              turn_id: Optional[str] = None,
              on_progress: Optional[Callable[[Any], Any]] = None) -> "Turn":
        """Starts the dispatch of ``message`` in a background thread and returns its handle:
        ``turn.result()`` waits for the answer, ``turn.cancel()`` cancels it; ``on_progress``
        as for :meth:`dispatch` (called on that thread)."""
        if turn_id is None:
            try:
                turn_id = c.turn_id_of(c.prepare(message, format)[2])
            except Exception:  # the dispatch itself says what is wrong with the message
                turn_id = c.new_turn_id()
        return Turn(self, message, format, turn_id, on_progress)

    def stream(self, message: Any, format: Optional[str] = None,
               on_approval: Optional[Callable[[Any], bool]] = None, *,
               turn_id: Optional[str] = None,
               on_progress: Optional[Callable[[Any], Any]] = None) -> "DispatchStream":
        """Like :meth:`dispatch`, yielding ``(index, result)`` as each call is answered; the
        complete answer is ``.answer`` once the iteration ends. Under ``serve --policy``, a call
        an ``ask`` rule holds is passed to ``on_approval(request)`` (``approval_id``,
        ``tool_use_id``, ``tool_name``, ``tool_input``, ``subject``, ``rule``), whose truth
        allows it; without ``on_approval`` it is denied at once. Client tools run as asked.
        ``on_progress`` is called with each live progress event (see :meth:`dispatch`);
        ``.events()`` iterates over results and progress together."""
        fmt, _names, body = c.prepare(message, format)
        return DispatchStream(self, fmt, body, turn_id or c.turn_id_of(body), on_approval,
                              on_progress)

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
    except BaseException as e:  # noqa: BLE001 - a failing tool is a result (SystemExit too)
        return c.answer_body(error=e)
    return c.answer_body(value)


def _failed_before_answer(e: urllib3.exceptions.HTTPError) -> Optional[str]:
    """What may be sent again after ``e``, raised before any answer arrived:
    :data:`c.RESEND_UNSENT` when the request cannot have reached the server (no connection was
    made), :data:`c.RESEND_ANY` when it may have (the connection was closed or reset without an
    answer: a keep-alive connection the server had just closed, a server that stopped), None
    when it must not be (a read timeout: the server is working on it; a closed client)."""
    if isinstance(e, urllib3.exceptions.ConnectTimeoutError):  # NewConnectionError too
        return c.RESEND_UNSENT
    if isinstance(e, urllib3.exceptions.ProtocolError) and e.args \
            and isinstance(e.args[-1], ConnectionError):
        return c.RESEND_ANY
    return None


def _transport_error(e: urllib3.exceptions.HTTPError) -> SwitchboardError:
    """A failure of the transport as the client's error: ``bad_response`` when what came back
    is not HTTP, else ``connection_error``."""
    cause = e.args[-1] if e.args else None
    if isinstance(e, urllib3.exceptions.ProtocolError) \
            and isinstance(cause, http.client.HTTPException) \
            and not isinstance(cause, ConnectionError):
        return c.bad_response("the server's answer is not HTTP", c.safe_text(cause))
    return c.connection_error(e)


class DispatchStream(c.StreamBase):
    """The results of a streamed dispatch, as they come; ``answer`` at the end."""

    _session: Session

    def __init__(self, session: Session, fmt: str, body: bytes, turn_id: str,
                 on_approval: Optional[Callable[[Any], bool]],
                 on_progress: Optional[Callable[[Any], Any]] = None):
        super().__init__(session, fmt, body, turn_id, on_approval, on_progress)
        self._iter: Optional[Iterator[Any]] = None

    def _run(self) -> Iterator[Tuple[str, Any]]:
        session = self._session
        session._ensure()
        with session._turn():
            yield from self._events()

    def _events(self) -> Iterator[Tuple[str, Any]]:
        session = self._session
        client = session._client
        path, headers = self._request()
        resp = client._urlopen("POST", path, self._body, headers)
        state = self._state
        complete = False
        try:
            c.check_event_stream(resp.headers.get("content-type"), resp.status)
            chunks = resp.read_chunked() if resp.chunked else iter(lambda: resp.read1(65536), b"")
            for chunk in chunks:
                for kind, value in state.feed(chunk):
                    if kind == "call":
                        client._start_call(session, value)
                    elif kind == "approval":
                        self._approve(value)
                    elif kind == "progress":
                        if self._on_progress is not None:
                            self._on_progress(value)
                        yield kind, value
                    else:
                        yield kind, value
            complete = True
        except urllib3.exceptions.HTTPError as e:
            raise _transport_error(e) from e
        finally:
            if not complete:
                resp.close()  # stopped early: drop the connection rather than drain the turn
            resp.release_conn()
        if not state.done:
            raise SwitchboardError("connection_error", "the stream ended before `done`")

    def _approve(self, request: Any) -> None:
        allow = bool(self._on_approval and self._on_approval(request))
        try:
            self._session.approve(request["approval_id"], allow)
        except SwitchboardError as e:
            if e.code != "unknown_approval":
                raise
            # Not waiting any more: answered (by this answer, when it was sent again after a
            # broken connection) or timed out; the call's result says which.
            log.info("switchboard: approval %s was no longer waiting", request["approval_id"])

    def __iter__(self) -> Iterator[Tuple[int, Any]]:
        if self._iter is None:
            self._iter = (value for kind, value in self._run() if kind == "result")
        return self._iter

    def __next__(self) -> Tuple[int, Any]:
        return next(iter(self))


class Turn:
    """A dispatch running in a background thread, under a turn id the client chose."""

    def __init__(self, session: Session, message: Any, format: Optional[str], turn_id: str,
                 on_progress: Optional[Callable[[Any], Any]] = None):
        self._session = session
        self.turn_id = turn_id
        self._on_progress = on_progress
        self._future: "Future[Any]" = Future()
        self._thread = threading.Thread(target=self._run, args=(message, format),
                                         name=f"switchboard-turn-{turn_id}", daemon=True)
        self._thread.start()

    def _run(self, message: Any, format: Optional[str]) -> None:
        if not self._future.set_running_or_notify_cancel():
            return
        try:
            self._future.set_result(self._session.dispatch(
                message, format, turn_id=self.turn_id, on_progress=self._on_progress))
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
