"""httpx (and aiohttp's test server) for the test suite: the one test module that imports them (TID251).

Tests that speak raw HTTP (to the reference servers, the service's API, the console) or that put a
fake tool server behind the adapters' ``HttpClient`` (``MockClient``: an httpx-style handler, a
``Request`` in and a ``Response`` out) take these names from here, so what of the HTTP
libraries the suite depends on is listed in one place. The product's own owners are
``engine.adapters.transport`` (tool servers) and ``service.client`` (the service's API). It must not
hold fixtures, assertions or waits.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from aiohttp import web as aiohttp_web
from httpx import (
    AsyncByteStream,
    AsyncClient,
    Client,
    ConnectError,
    Headers,
    HTTPError,
    MockTransport,
    ReadTimeout,
    RemoteProtocolError,
    Request,
    Response,
    ResponseNotRead,
    TimeoutException,
    TransportError,
    get,
    post,
)

from engine.adapters.transport import (
    ExchangeFailed,
    ExchangeTimedOut,
    HttpClient,
    HttpRequest,
    HttpResponse,
    headers_of,
)

Handler = Callable[[Request], Response | Awaitable[Response]]


class _MockReply:
    def __init__(self, response: Response) -> None:
        self._response = response
        self.status = response.status_code
        self.headers = headers_of(response.headers.multi_items())

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            # A body given whole is read already (and a responder may hand out one Response twice).
            yield self._response.content
            return
        except ResponseNotRead:
            pass
        try:
            async for chunk in self._response.aiter_raw():
                yield chunk
        except TimeoutException as exc:
            raise ExchangeTimedOut(str(exc)) from exc
        except TransportError as exc:
            raise ExchangeFailed(str(exc)) from exc


class MockClient(HttpClient):
    """The adapters' ``HttpClient`` answered in process by ``handler``, as httpx's MockTransport
    would: httpx's transport errors raised by the handler (or by its response's stream) become
    the interface's ``ExchangeTimedOut`` / ``ExchangeFailed``."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler

    def open(self, request: HttpRequest) -> AbstractAsyncContextManager[HttpResponse]:
        return self._exchange(request)

    @asynccontextmanager
    async def _exchange(self, request: HttpRequest) -> AsyncIterator[HttpResponse]:
        sent = Request(
            request.method, request.url, headers=dict(request.headers), content=request.body or b""
        )
        try:
            answer = self._handler(sent)
            response = await answer if inspect.isawaitable(answer) else answer
        except TimeoutException as exc:
            raise ExchangeTimedOut(str(exc)) from exc
        except TransportError as exc:
            raise ExchangeFailed(str(exc)) from exc
        yield _MockReply(response)


def mock_client(handler: Handler) -> MockClient:
    return MockClient(handler)


__all__ = [
    "AsyncByteStream",
    "AsyncClient",
    "Client",
    "ConnectError",
    "HTTPError",
    "Headers",
    "MockClient",
    "MockTransport",
    "ReadTimeout",
    "RemoteProtocolError",
    "Request",
    "Response",
    "aiohttp_web",
    "get",
    "mock_client",
    "post",
]
