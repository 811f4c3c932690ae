"""The asyncio client, on one aiohttp ``ClientSession`` per client (keep-alive)."""

from __future__ import annotations

import asyncio
import contextvars
import errno
import functools
import inspect
import logging
import time
import weakref
from typing import Any, AsyncIterator, Callable, Dict, Generator, List, Optional, Set, Tuple

import aiohttp

from . import _common as c
from ._common import SwitchboardError
from ._context import REPORTS_BEFORE_ANSWER, Reporter, ToolCallContext, calling

log = logging.getLogger("switchboard_client")

_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
_RESET = (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED)


class AsyncClient:
    """A connection pool to one Switchboard server, for asyncio: the same API as
    :class:`Client`, with ``await``. The aiohttp session is opened on first use, inside the
    running loop; ``async with`` (or ``await client.close()``) closes it."""

    def __init__(self, base_url: str = c.DEFAULT_BASE_URL, token: Optional[str] = None, *,
                 timeout: Optional[float] = None, max_retries: int = 5,
                 retry_budget_s: float = 30):
        self.base_url = base_url.rstrip("/")
        self._headers, self._json_headers, self._stream_headers = c.request_headers(token)
        self._timeout = aiohttp.ClientTimeout(total=None, connect=None,
                                              sock_connect=c.connect_timeout(timeout),
                                              sock_read=timeout)
        self.max_retries = max_retries
        self.retry_budget_s = retry_budget_s
        self._http: Optional[aiohttp.ClientSession] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._executor: Optional[c.ToolThreads] = None
        self._sessions: "weakref.WeakSet[AsyncSession]" = weakref.WeakSet()  # created here

    # --- transport ---

    def _session(self) -> aiohttp.ClientSession:
        http = self._http
        loop = asyncio.get_running_loop()
        if http is None or http.closed or loop is not self._loop:
            # (A client used from a new event loop, e.g. a second asyncio.run, opens a new
            # aiohttp session: the old one belongs to the closed loop.)
            self._loop = loop
            # No connection limit: a streamed turn holds its connection while its client-tool
            # answers need others.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
            http = self._http = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=False,
                skip_auto_headers=("User-Agent",))
        return http

    async def _open(self, method: str, path: str, body: Optional[bytes],
                    headers: Dict[str, str], resend: str = c.RESEND_ANY
                    ) -> aiohttp.ClientResponse:
        """Sends one request; returns the response (status < 400). Retries ``overloaded`` (and
        the cluster's refusals), and re-sends the request when its connection failed before any
        answer, if ``resend`` allows (see :data:`c.RESEND_ANY`)."""
        http = self._session()
        url = self.base_url + path
        retries = c.Retries(self.max_retries, self.retry_budget_s)
        while True:
            try:
                resp = await http.request(method, url, data=body, headers=headers)
            except _TRANSPORT_ERRORS as e:
                failed = _failed_before_answer(e)
                if failed is None:
                    raise _transport_error(e) from e
                delay = retries.reconnect() \
                    if failed == c.RESEND_UNSENT or resend == c.RESEND_ANY else None
                if delay is None:
                    raise c.connection_error(e) from e
                await asyncio.sleep(delay)
                continue
            if resp.status < 400:
                return resp
            try:
                data = await resp.read()
            except _TRANSPORT_ERRORS:
                data = b""
            finally:
                resp.release()
            err = c.error_from(resp.status, resp.reason or "", resp.headers.get("Retry-After"),
                               data)
            delay = retries.delay(err)
            if delay is None:
                raise err
            await asyncio.sleep(delay)

    async def _request(self, method: str, path: str, body: Optional[bytes] = None,
                       headers: Optional[Dict[str, str]] = None,
                       resend: str = c.RESEND_ANY) -> Any:
        resp = await self._open(method, path, body,
                                headers or (self._json_headers if body is not None
                                            else self._headers), resend)
        try:
            data = await resp.read()
        except _TRANSPORT_ERRORS as e:
            raise c.connection_error(e) from e
        finally:
            resp.release()
        return c.json_answer(data, resp.headers.get("Content-Type"), resp.status)

    def _turns_in_flight(self) -> List["AsyncSession"]:
        """The open sessions of this client with a turn in flight."""
        return [s for s in list(self._sessions) if s._in_flight and not s._closed]

    def _tool_executor(self) -> c.ToolThreads:
        if self._executor is None:
            self._executor = c.tool_executor()
        return self._executor

    # --- API ---

    def session(self, workspace: Optional[str] = None, *, tools: Optional[List[Any]] = None,
                sandbox: Any = None) -> "AsyncSession":
        """See :meth:`Client.session`. ``async with client.session() as s`` deletes it on exit;
        ``await client.session()`` creates it at once."""
        return AsyncSession(self, workspace, tools=tools, sandbox=sandbox)

    async def tools(self, format: str = "anthropic") -> List[Any]:
        return await self._request("GET", f"/v1/tools?format={format}")

    async def health(self) -> Any:
        return await self._request("GET", "/healthz")

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSession(c.SessionBase):
    """One conversation's session, for asyncio; see :class:`Session`. Created on the server on
    first use; ``id`` and ``workspace`` are known once it is (``await session.create()``)."""

    def __init__(self, client: AsyncClient, workspace: Optional[str] = None, *,
                 tools: Optional[List[Any]] = None, sandbox: Any = None):
        super().__init__(client, workspace, tools, sandbox)
        self._client: AsyncClient = client
        self._creating: Optional["asyncio.Future[str]"] = None
        self._in_flight = 0     # turns of this session running now (dispatch, stream)
        self._reports: Set["asyncio.Task[None]"] = set()   # progress reports on their way

    # --- creation ---

    async def create(self) -> "AsyncSession":
        """Creates the server session now (otherwise the first use does)."""
        await self._ensure()
        return self

    def __await__(self) -> Generator[Any, None, "AsyncSession"]:
        return self.create().__await__()

    async def _ensure(self) -> str:
        if self._id is not None:
            return self._id
        if self._closed:
            raise SwitchboardError("unknown_session", "the session is closed", 404)
        if self._creating is None:
            self._creating = asyncio.ensure_future(self._create())
        try:
            return await asyncio.shield(self._creating)
        except BaseException:
            if self._creating is not None and self._creating.done() \
                    and self._creating.exception() is not None:
                self._creating = None  # a failed creation is tried again by the next use
            raise

    async def _create(self) -> str:
        created = await self._client._request("POST", "/v1/sessions", self._create_body(),
                                              resend=c.RESEND_UNSENT)
        self._client._sessions.add(self)
        return self._adopt(created)

    def _need_created(self) -> None:
        if self._id is None:
            raise RuntimeError("the session is created on first use: `await session.create()` "
                               "(or dispatch, info, tools) first")

    @property
    def id(self) -> str:
        self._need_created()
        return self._id  # type: ignore[return-value]

    @property
    def workspace(self) -> str:
        self._need_created()
        return self._workspace  # type: ignore[return-value]

    # --- client tools ---

    def _tools_fixed(self) -> bool:
        return self._id is not None or self._creating is not None or self._closed

    async def _run_call(self, call: Dict[str, Any], received: float) -> None:
        """Runs one client-tool call (a coroutine function as this task, a plain one on a
        thread of its own) and posts its answer, once — unless its deadline passed before the
        function could start (the engine answered it ``timeout``). Whatever the function
        raises or returns is an answer; only the task's cancellation propagates."""
        call_id = call["call_id"]
        reporter = self._reporter(call_id)
        try:
            body = await self._call_body(call, received, reporter)
        except asyncio.CancelledError:
            raise
        except c.CallExpired:
            log.info("switchboard: client call %s (%s) not started: its deadline passed "
                     "before it could start", call_id, call.get("name"))
            return
        except BaseException as e:  # noqa: BLE001 - a failing tool is a result, never a crash
            body = c.answer_body(error=e)
        # The call's last progress reports go before its answer (a moment at most).
        deadline = time.monotonic() + REPORTS_BEFORE_ANSWER
        while reporter.busy and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        await self._answer(call_id, body)

    async def _call_body(self, call: Dict[str, Any], received: float,
                         reporter: Optional[Reporter] = None) -> bytes:
        if c.call_expired(call, received):
            raise c.CallExpired(call["call_id"])
        entry, missing = self._call_entry(call)
        if entry is None or entry.fn is None:
            return c.error_body(missing)
        context = ToolCallContext.from_event(call, reporter)
        args, kwargs = entry.arguments(call.get("input"), context)
        with calling(context):  # this task's context, copied to a worker thread
            if entry.is_async:
                value = await entry.fn(*args, **kwargs)
            else:
                loop = asyncio.get_running_loop()
                ctx = contextvars.copy_context()
                value = await loop.run_in_executor(
                    self._client._tool_executor(),
                    functools.partial(ctx.run, c.start_in_time, call, received, entry.fn,
                                      *args, **kwargs))
        return c.answer_body(value)

    def _reporter(self, call_id: str) -> Reporter:
        """The progress reports of call ``call_id``, sent by a task on this loop while there
        are any (a tool on a worker thread reports through the loop, never waiting)."""
        path = f"{self._base}/calls/{call_id}/progress"
        loop = asyncio.get_running_loop()

        async def drain(reporter: Reporter) -> None:
            while True:
                bodies = reporter.take()
                if not bodies:
                    return
                for body in bodies:
                    try:
                        await self._client._request("POST", path, body)
                    except asyncio.CancelledError:
                        raise
                    except Exception as e:  # noqa: BLE001 - a lost report never fails the call
                        log.debug("switchboard: a progress report of call %s was not taken: %s",
                                  call_id, e)

        def start(reporter: Reporter) -> None:
            def spawn() -> None:
                task = loop.create_task(drain(reporter))
                self._reports.add(task)
                task.add_done_callback(self._reports.discard)
            try:
                if asyncio.get_running_loop() is loop:
                    spawn()
                    return
            except RuntimeError:
                pass
            loop.call_soon_threadsafe(spawn)

        return Reporter(start)

    async def _answer(self, call_id: str, body: bytes) -> None:
        """Posts a call's answer; see :meth:`Session._answer` (a refused answer is logged and
        replaced at once by an error naming why; a late one is dropped)."""
        try:
            await self._client._request("POST", f"{self._base}/calls/{call_id}", body)
        except SwitchboardError as e:
            if e.code in c.LATE_ANSWER_CODES:
                return
            log.warning("switchboard: the server refused the answer to client call %s: %s",
                        call_id, e)
            if e.status is None or not 400 <= e.status < 500:
                return
            try:
                await self._client._request("POST", f"{self._base}/calls/{call_id}",
                                            c.refused_body(e))
            except SwitchboardError as again:
                if again.code not in c.LATE_ANSWER_CODES:
                    log.warning("switchboard: answering client call %s with an error failed "
                                "too: %s", call_id, again)

    # --- dispatch ---

    async def dispatch(self, message: Any, format: Optional[str] = None, *,
                       turn_id: Optional[str] = None,
                       on_progress: Optional[Callable[[Any], Any]] = None) -> Any:
        """See :meth:`Session.dispatch` (``None`` when the answer calls no tool);
        ``on_progress`` may be a plain or a coroutine function."""
        fmt, names, body = c.prepare(message, format)
        if names == []:
            return None
        if self._id is None:
            await self._ensure()
        tid = turn_id or c.turn_id_of(body)
        if on_progress is not None or self._streams(names):
            stream = AsyncDispatchStream(self, fmt, body, tid, None, on_progress)
            async for _ in stream:
                pass
            return stream.answer
        headers = {**self._client._json_headers, c.TURN_HEADER: tid}
        self._in_flight += 1
        try:
            return await self._client._request("POST", f"{self._base}/dispatch?format={fmt}",
                                               body, headers)
        finally:
            self._in_flight -= 1

    def start(self, message: Any, format: Optional[str] = None, *,
              turn_id: Optional[str] = None,
              on_progress: Optional[Callable[[Any], Any]] = None) -> "AsyncTurn":
        """Starts the dispatch as a task and returns its handle: ``await turn`` is the answer,
        ``await turn.cancel()`` cancels it. Needs a running loop."""
        if turn_id is None:
            try:
                turn_id = c.turn_id_of(c.prepare(message, format)[2])
            except Exception:  # the dispatch itself says what is wrong with the message
                turn_id = c.new_turn_id()
        return AsyncTurn(self, message, format, turn_id, on_progress)

    def stream(self, message: Any, format: Optional[str] = None,
               on_approval: Optional[Callable[[Any], Any]] = None, *,
               turn_id: Optional[str] = None,
               on_progress: Optional[Callable[[Any], Any]] = None) -> "AsyncDispatchStream":
        """See :meth:`Session.stream`; ``on_approval`` and ``on_progress`` may be plain or
        coroutine functions."""
        fmt, _names, body = c.prepare(message, format)
        return AsyncDispatchStream(self, fmt, body, turn_id or c.turn_id_of(body), on_approval,
                                   on_progress)

    async def tools(self, format: str = "anthropic") -> List[Any]:
        await self._ensure()
        return await self._client._request("GET", f"{self._base}/tools?format={format}")

    async def approve(self, approval_id: str, allow: bool) -> Any:
        await self._ensure()
        return await self._client._request("POST", f"{self._base}/approvals/{approval_id}",
                                           c.dumps({"allow": bool(allow)}))

    async def info(self) -> Any:
        await self._ensure()
        return await self._client._request("GET", self._base)

    async def cancel(self) -> Any:
        if self._id is None:
            return None
        return await self._client._request("POST", f"{self._base}/cancel")

    async def cancel_turn(self, turn_id: str) -> Any:
        """See :meth:`Session.cancel_turn`."""
        await self._ensure()
        return await self._client._request("POST", f"{self._base}/turns/{turn_id}/cancel")

    async def close(self) -> None:
        self._closed = True
        if self._id is None and self._creating is not None:
            try:
                await self._creating
            except Exception:
                pass
        if self._id is None:
            return
        try:
            await self._client._request("DELETE", self._base)
        except SwitchboardError as e:
            if e.code != "unknown_session":
                raise

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncDispatchStream(c.StreamBase):
    """``async for index, result in session.stream(msg)``; ``answer`` at the end;
    ``async for kind, value in stream.events()`` for results and live progress together."""

    _session: AsyncSession

    def __init__(self, session: AsyncSession, fmt: str, body: bytes, turn_id: str,
                 on_approval: Optional[Callable[[Any], Any]],
                 on_progress: Optional[Callable[[Any], Any]] = None):
        super().__init__(session, fmt, body, turn_id, on_approval, on_progress)
        self._iter: Optional[AsyncIterator[Any]] = None

    async def _approve(self, request: Any) -> None:
        allow = False
        if self._on_approval is not None:
            allow = self._on_approval(request)
            if inspect.isawaitable(allow):
                allow = await allow
        try:
            await self._session.approve(request["approval_id"], bool(allow))
        except SwitchboardError as e:
            if e.code != "unknown_approval":
                raise
            # Not waiting any more: answered (by this answer, when it was sent again after a
            # broken connection) or timed out; the call's result says which.
            log.info("switchboard: approval %s was no longer waiting", request["approval_id"])

    async def _run(self) -> AsyncIterator[Tuple[str, Any]]:
        session = self._session
        await session._ensure()
        session._in_flight += 1
        try:
            async for item in self._events():
                yield item
        finally:
            session._in_flight -= 1

    async def _results(self) -> AsyncIterator[Tuple[int, Any]]:
        async for kind, value in self._run():
            if kind == "result":
                yield value

    async def _events(self) -> AsyncIterator[Tuple[str, Any]]:
        session = self._session
        client = session._client
        path, headers = self._request()
        resp = await client._open("POST", path, self._body, headers)
        state = self._state
        tasks: Set["asyncio.Task[None]"] = set()
        try:
            c.check_event_stream(resp.headers.get("Content-Type"), resp.status)
            async for chunk in resp.content.iter_any():
                for kind, value in state.feed(chunk):
                    if kind == "call":
                        task = asyncio.ensure_future(session._run_call(value, time.monotonic()))
                        tasks.add(task)
                        task.add_done_callback(tasks.discard)
                    elif kind == "approval":
                        await self._approve(value)
                    elif kind == "progress":
                        if self._on_progress is not None:
                            done = self._on_progress(value)
                            if inspect.isawaitable(done):
                                await done
                        yield kind, value
                    else:
                        yield kind, value
        except _TRANSPORT_ERRORS as e:
            raise c.connection_error(e) from e
        finally:
            resp.release() if state.done else resp.close()
            # Every call is answered once the stream has ended (by us, or by the server:
            # `cancelled`); a tool still running has nothing left to answer.
            if tasks:
                pending = list(tasks)
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        if not state.done:
            raise SwitchboardError("connection_error", "the stream ended before `done`")

    def __aiter__(self) -> AsyncIterator[Tuple[int, Any]]:
        if self._iter is None:
            self._iter = self._results()
        return self._iter


def _failed_before_answer(e: BaseException) -> Optional[str]:
    """What may be sent again after ``e``, raised before any answer arrived (see the sync
    client's): :data:`c.RESEND_UNSENT` when no connection was made, :data:`c.RESEND_ANY` when
    the connection was closed or reset without an answer, None otherwise (a timeout: the
    server is working on it)."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return c.RESEND_UNSENT
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return c.RESEND_ANY
    if isinstance(e, ConnectionError) or (isinstance(e, aiohttp.ClientOSError)
                                          and e.errno in _RESET):
        return c.RESEND_ANY
    return None


def _transport_error(e: BaseException) -> SwitchboardError:
    """A failure of the transport as the client's error: ``bad_response`` when what came back
    is not HTTP, else ``connection_error``."""
    if isinstance(e, aiohttp.ClientResponseError):
        return c.bad_response("the server's answer is not HTTP", c.safe_text(e))
    return c.connection_error(e)


class AsyncTurn:
    """A dispatch running as a task, under a turn id the client chose. ``await turn`` is its
    answer; ``await turn.cancel()`` cancels it on the server."""

    def __init__(self, session: AsyncSession, message: Any, format: Optional[str],
                 turn_id: str, on_progress: Optional[Callable[[Any], Any]] = None):
        self._session = session
        self.turn_id = turn_id
        self._task: "asyncio.Task[Any]" = asyncio.ensure_future(
            session.dispatch(message, format, turn_id=turn_id, on_progress=on_progress))

    def __await__(self) -> Generator[Any, None, Any]:
        return self._task.__await__()

    async def result(self, timeout: Optional[float] = None) -> Any:
        """The answer, waiting at most ``timeout`` seconds (``asyncio.TimeoutError``)."""
        return await asyncio.wait_for(asyncio.shield(self._task), timeout)

    def done(self) -> bool:
        return self._task.done()

    @property
    def task(self) -> "asyncio.Task[Any]":
        return self._task

    async def cancel(self) -> Any:
        """Cancels the turn on the server wherever it is (even before its dispatch arrived);
        returns ``{"turn_id", "state"}``. The turn's calls are answered ``cancelled`` and
        ``await turn`` returns the answer. From another thread:
        ``asyncio.run_coroutine_threadsafe(turn.cancel(), loop)``."""
        return await self._session.cancel_turn(self.turn_id)
