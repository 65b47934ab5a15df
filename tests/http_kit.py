"""httpx (and aiohttp's test server) for the test suite: the one test module that imports them (TID251).

Tests that speak raw HTTP (to the reference servers, the service's API, the console) or that put a
fake tool server behind an httpx transport take these names from here, so what of the HTTP
libraries the suite depends on is listed in one place. The product's own owners are
``engine.adapters.transport`` (tool servers) and ``service.client`` (the service's API). It must not
hold fixtures, assertions or waits.
"""

from __future__ import annotations

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
    get,
    post,
)

__all__ = [
    "AsyncByteStream",
    "AsyncClient",
    "Client",
    "ConnectError",
    "HTTPError",
    "Headers",
    "MockTransport",
    "ReadTimeout",
    "RemoteProtocolError",
    "Request",
    "Response",
    "aiohttp_web",
    "get",
    "post",
]
