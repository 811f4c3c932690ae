"""The synchronous client."""

from typing import Any, Callable, Iterator, List, Optional, Tuple

import httpx

from ._common import (DEFAULT_BASE_URL, DEFAULT_TIMEOUT, StreamState, SwitchboardError,
                      connection_error, dispatch_request, error_from, headers, parse_events)


class Client:
    """A connection pool to one Switchboard server. ``token`` defaults to the
    ``SWITCHBOARD_TOKEN`` environment variable."""

    def __init__(self, base_url: str = DEFAULT_BASE_URL, token: Optional[str] = None,
                 timeout: Any = DEFAULT_TIMEOUT, transport: Optional[httpx.BaseTransport] = None):
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers(token),
                                  timeout=timeout, transport=transport)

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise connection_error(e) from e
        if response.is_error:
            raise error_from(response, response.text)
        return response.json()

    def session(self, workspace: Optional[str] = None) -> "Session":
        """Opens a session whose file tools are confined to ``<workspace-root>/workspace``
        (shared by every session naming it), or to a fresh directory when ``None``."""
        body = {} if workspace is None else {"workspace": workspace}
        created = self._request("POST", "/v1/sessions", json=body)
        return Session(self, created["session_id"], created["workspace"])

    def tools(self, format: str = "anthropic") -> List[Any]:
        """The tool catalog (``anthropic``, ``openai`` or ``mcp`` shape), e.g. for ``tools=``."""
        return self._request("GET", "/v1/tools", params={"format": format})

    def health(self) -> Any:
        return self._request("GET", "/healthz")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Session:
    """One conversation's session. As a context manager it is closed (deleted) on exit."""

    def __init__(self, client: Client, session_id: str, workspace: str):
        self._client = client
        self.id = session_id
        self.workspace = workspace

    def dispatch(self, message: Any, format: Optional[str] = None) -> Any:
        """Runs the tool calls of one model answer and returns what to append to the
        conversation: the user message of ``tool_result`` blocks (Anthropic) or the list of
        tool messages (OpenAI). ``format`` is detected when not given."""
        fmt, body = dispatch_request(message, format)
        return self._client._request(
            "POST", f"/v1/sessions/{self.id}/dispatch", params={"format": fmt}, content=body,
            headers={"content-type": "application/json"})

    def stream(self, message: Any, format: Optional[str] = None,
               on_approval: Optional[Callable[[Any], bool]] = None) -> "DispatchStream":
        """Like :meth:`dispatch`, yielding ``(index, result)`` as each call is answered; the
        complete answer is ``.answer`` once the iteration ends. Under ``serve --policy``, a call
        an ``ask`` rule holds is passed to ``on_approval(request)`` (``approval_id``,
        ``tool_use_id``, ``tool_name``, ``tool_input``, ``subject``, ``rule``), whose truth
        allows it; without ``on_approval`` it is denied at once."""
        fmt, body = dispatch_request(message, format)
        return DispatchStream(self._client._http, f"/v1/sessions/{self.id}/dispatch",
                              {"format": fmt, "stream": "true"}, body,
                              lambda request: self.approve(
                                  request["approval_id"],
                                  bool(on_approval and on_approval(request))))

    def approve(self, approval_id: str, allow: bool) -> Any:
        """Answers a call waiting for approval (``unknown_approval`` if none of that id)."""
        return self._client._request(
            "POST", f"/v1/sessions/{self.id}/approvals/{approval_id}", json={"allow": allow})

    def info(self) -> Any:
        """``{"session_id", "workspace", "turns", "calls", "in_flight"}``."""
        return self._client._request("GET", f"/v1/sessions/{self.id}")

    def cancel(self) -> Any:
        """Cancels the running and pending calls (they are answered ``cancelled``)."""
        return self._client._request("POST", f"/v1/sessions/{self.id}/cancel")

    def close(self) -> None:
        """Cancels what runs and frees the session (its workspace stays)."""
        try:
            self._client._request("DELETE", f"/v1/sessions/{self.id}")
        except SwitchboardError as e:
            if e.code != "unknown_session":
                raise

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class DispatchStream:
    """The results of a streamed dispatch, as they come; ``answer`` at the end."""

    def __init__(self, http: httpx.Client, path: str, params: dict, body: bytes,
                 answer_approval: Optional[Callable[[Any], Any]] = None):
        self._http, self._path, self._params, self._body = http, path, params, body
        self._state = StreamState(answer_approval)
        self._iter: Optional[Iterator[Tuple[int, Any]]] = None

    @property
    def answer(self) -> Any:
        """The complete ordered answer (set once the stream has ended)."""
        return self._state.answer

    def _run(self) -> Iterator[Tuple[int, Any]]:
        try:
            with self._http.stream("POST", self._path, params=self._params, content=self._body,
                                   headers={"content-type": "application/json",
                                            "accept": "text/event-stream"}) as response:
                if response.is_error:
                    raise error_from(response, response.read().decode("utf-8", "replace"))
                for event, data in parse_events(response.iter_lines()):
                    item = self._state.handle(event, data)
                    if item is not None:
                        yield item
        except httpx.TransportError as e:
            raise connection_error(e) from e
        if self._state.answer is None:
            raise SwitchboardError("connection_error", "the stream ended before `done`")

    def __iter__(self) -> Iterator[Tuple[int, Any]]:
        if self._iter is None:
            self._iter = self._run()
        return self._iter

    def __next__(self) -> Tuple[int, Any]:
        return next(iter(self))
