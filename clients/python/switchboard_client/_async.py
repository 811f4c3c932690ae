"""The asyncio client: the same API as the synchronous one, with ``await``."""

import json
from typing import Any, AsyncIterator, Awaitable, Callable, List, Optional, Tuple

import httpx

from ._common import (DEFAULT_BASE_URL, DEFAULT_TIMEOUT, SseParser, StreamState,
                      SwitchboardError, connection_error, dispatch_request, error_from, headers)


class AsyncClient:
    """A connection pool to one Switchboard server, for asyncio."""

    def __init__(self, base_url: str = DEFAULT_BASE_URL, token: Optional[str] = None,
                 timeout: Any = DEFAULT_TIMEOUT,
                 transport: Optional[httpx.AsyncBaseTransport] = None):
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers(token),
                                       timeout=timeout, transport=transport)

    async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise connection_error(e) from e
        if response.is_error:
            raise error_from(response, response.text)
        return response.json()

    async def session(self, workspace: Optional[str] = None) -> "AsyncSession":
        body = {} if workspace is None else {"workspace": workspace}
        created = await self._request("POST", "/v1/sessions", json=body)
        return AsyncSession(self, created["session_id"], created["workspace"])

    async def tools(self, format: str = "anthropic") -> List[Any]:
        return await self._request("GET", "/v1/tools", params={"format": format})

    async def health(self) -> Any:
        return await self._request("GET", "/healthz")

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSession:
    """One conversation's session; ``async with`` closes (deletes) it on exit."""

    def __init__(self, client: AsyncClient, session_id: str, workspace: str):
        self._client = client
        self.id = session_id
        self.workspace = workspace

    async def dispatch(self, message: Any, format: Optional[str] = None) -> Any:
        fmt, body = dispatch_request(message, format)
        return await self._client._request(
            "POST", f"/v1/sessions/{self.id}/dispatch", params={"format": fmt}, content=body,
            headers={"content-type": "application/json"})

    def stream(self, message: Any, format: Optional[str] = None,
               on_approval: Optional[Callable[[Any], bool]] = None) -> "AsyncDispatchStream":
        """See :meth:`Session.stream` (``on_approval`` is a plain function here too)."""
        fmt, body = dispatch_request(message, format)

        async def answer(request: Any) -> Any:
            allow = bool(on_approval and on_approval(request))
            return await self.approve(request["approval_id"], allow)

        return AsyncDispatchStream(self._client._http, f"/v1/sessions/{self.id}/dispatch",
                                   {"format": fmt, "stream": "true"}, body, answer)

    async def approve(self, approval_id: str, allow: bool) -> Any:
        return await self._client._request(
            "POST", f"/v1/sessions/{self.id}/approvals/{approval_id}", json={"allow": allow})

    async def info(self) -> Any:
        return await self._client._request("GET", f"/v1/sessions/{self.id}")

    async def cancel(self) -> Any:
        return await self._client._request("POST", f"/v1/sessions/{self.id}/cancel")

    async def close(self) -> None:
        try:
            await self._client._request("DELETE", f"/v1/sessions/{self.id}")
        except SwitchboardError as e:
            if e.code != "unknown_session":
                raise

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncDispatchStream:
    """``async for index, result in session.stream(msg)``; ``answer`` at the end."""

    def __init__(self, http: httpx.AsyncClient, path: str, params: dict, body: bytes,
                 answer_approval: Optional[Callable[[Any], Awaitable[Any]]] = None):
        self._http, self._path, self._params, self._body = http, path, params, body
        self._state = StreamState()
        self._answer_approval = answer_approval
        self._iter: Optional[AsyncIterator[Tuple[int, Any]]] = None

    @property
    def answer(self) -> Any:
        return self._state.answer

    async def _run(self) -> AsyncIterator[Tuple[int, Any]]:
        parser = SseParser()
        try:
            async with self._http.stream(
                    "POST", self._path, params=self._params, content=self._body,
                    headers={"content-type": "application/json",
                             "accept": "text/event-stream"}) as response:
                if response.is_error:
                    text = (await response.aread()).decode("utf-8", "replace")
                    raise error_from(response, text)
                async for line in response.aiter_lines():
                    event = parser.feed(line.rstrip("\r"))
                    if event is None:
                        continue
                    if event[0] == "approval_required" and self._answer_approval is not None:
                        await self._answer_approval(json.loads(event[1]))
                        continue
                    item = self._state.handle(*event)
                    if item is not None:
                        yield item
        except httpx.TransportError as e:
            raise connection_error(e) from e
        if self._state.answer is None:
            raise SwitchboardError("connection_error", "the stream ended before `done`")

    def __aiter__(self) -> AsyncIterator[Tuple[int, Any]]:
        if self._iter is None:
            self._iter = self._run()
        return self._iter
