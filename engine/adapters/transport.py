"""HTTP plumbing shared by the adapters, and the MCP Streamable HTTP JSON-RPC transport.

Owns the adapters' HTTP interface (``HttpClient``: request in, status, headers and body chunks out)
and its one network implementation over aiohttp (``AiohttpClient``). Turns every HTTP-level failure into an engine error (a dropped connection or timeout is
``BackendUnavailable``, never a cancel) and every malformed reply into ``ProtocolViolation``. It knows
JSON-RPC envelopes and SSE framing but no MCP method's meaning; it never decides an operation's state.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Protocol, Self
from urllib.parse import urlsplit

import aiohttp
import orjson
from mcp_types.jsonrpc import ErrorData, JSONRPCError, JSONRPCRequest, JSONRPCResponse
from multidict import CIMultiDict, CIMultiDictProxy
from pydantic import ValidationError

from engine.adapters.base import Json
from engine.adapters.config import AdapterOptions
from engine.errors import BackendRejected, BackendUnavailable, ConfigError, ProtocolViolation, SessionExpired

SESSION_HEADER = "Mcp-Session-Id"
PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"
RequestId = int | str


# ------------------------------------------------------------------- the adapters' HTTP interface
#
# What the adapters need of HTTP and nothing more: a request is a method, a URL, headers, body
# bytes and a time bound; a response is a status, case-insensitive headers and the body's chunks as
# they arrive (an SSE stream is read chunk by chunk). ``AiohttpClient`` is the one implementation
# over a real network (this module is the one that imports aiohttp, TID251); the explorer's
# in-process wire and the adapter tests' scripted peers implement the same ``HttpClient``. A broken
# exchange raises ``ExchangeFailed`` (or aiohttp's own errors, which ``guarded`` maps the same way).


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One HTTP request as the adapters build it."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes | None = None
    timeout: float | None = None
    """Bound on the whole exchange in seconds (``guarded`` bounds it too, on the caller's side)."""
    connect_timeout: float | None = None

    @property
    def path(self) -> str:
        """The URL's path (the explorer and the tests' fakes route by it)."""
        return urlsplit(self.url).path


class HttpResponse(Protocol):
    """A response whose status and headers have arrived; its body is read through ``chunks``."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]:
        """Case-insensitive (``headers_of`` builds such a mapping for an implementation)."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive; ``ExchangeFailed`` if the peer breaks off."""
        ...


class HttpClient(ABC):
    """The pooled HTTP client every adapter talks through (the caller owns and closes it)."""

    @abstractmethod
    def open(self, request: HttpRequest) -> AbstractAsyncContextManager[HttpResponse]:
        """Send ``request``; the context yields the response once its head arrived and releases
        the connection (or drops it, if the body was not read to its end) on exit."""

    async def aclose(self) -> None:  # noqa: B027 (a client without a pool has nothing to release)
        """Release the pool (idempotent)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class ExchangeFailed(BackendUnavailable):
    """The connection could not be made, or broke before the reply was complete (an ``HttpClient``
    raises it; ``guarded`` reports it as ``BackendUnavailable`` naming the exchange)."""


class ExchangeTimedOut(ExchangeFailed):
    """No (complete) reply in time."""


def headers_of(pairs: Iterable[tuple[str, str]] | Mapping[str, str]) -> Mapping[str, str]:
    """A case-insensitive header mapping, as ``HttpResponse.headers`` must be."""
    return CIMultiDictProxy(CIMultiDict(pairs))


def encode_json(body: object) -> bytes:
    """A request body as compact UTF-8 JSON.

    orjson (already the ledger's JSON library) writes it in one pass; what it refuses (integers
    past 64 bits, non-string keys) is written by json with the settings httpx used before, so a
    request means what it meant then.
    """
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class _AiohttpReply:
    """``HttpResponse`` over an aiohttp response."""

    __slots__ = ("_raw", "headers", "status")

    def __init__(self, raw: aiohttp.ClientResponse) -> None:
        self._raw = raw
        self.status: int = raw.status
        self.headers: Mapping[str, str] = raw.headers

    def chunks(self) -> AsyncIterator[bytes]:
        return self._raw.content.iter_any()


class _AiohttpExchange:
    """``AiohttpClient.open``'s context: one request, its response released on exit."""

    __slots__ = ("_pending", "_raw")

    def __init__(self, pending: Any) -> None:
        self._pending = pending
        self._raw: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> HttpResponse:
        self._raw = await self._pending
        return _AiohttpReply(self._raw)

    async def __aexit__(self, *exc: object) -> None:
        if self._raw is not None:
            # A body not read to its end closes the connection instead of returning it to the pool.
            self._raw.release()


class AiohttpClient(HttpClient):
    """``HttpClient`` on aiohttp's connection pool: HTTP/1.1 parsed in C, idle connections in a
    per-host queue.

    Session 7's profiles put httpx's API on top of this pool (through httpx-aiohttp) at about a
    quarter of the executor's CPU per request: an httpx Request, Headers and Response built and
    converted for every exchange. The adapters need none of it. What the client must not do: follow
    a redirect (a redirect is a reply like any other), keep cookies (the protocols keep a session in
    ``Mcp-Session-Id``, never in a cookie), or read the environment's proxy settings.
    """

    def __init__(self, connections: int = 100) -> None:
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[tuple[float | None, float | None], aiohttp.ClientTimeout] = {}

    def _open_session(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running event loop aiohttp binds it to.
        # Idle connections are dropped after 2 s, well before common servers' keep-alive timeouts
        # (uvicorn's is 5 s). aiohttp does not probe a pooled socket before reusing it, so a
        # connection the server closes just as a POST reuses it would lose that request's reply;
        # aiohttp retries only idempotent methods on its own.
        connector = aiohttp.TCPConnector(limit=self._connections, keepalive_timeout=2.0)
        self._session = aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
        )
        return self._session

    def _timeout(self, request: HttpRequest) -> aiohttp.ClientTimeout:
        key = (request.timeout, request.connect_timeout)
        found = self._timeouts.get(key)
        if found is None:
            found = self._timeouts[key] = aiohttp.ClientTimeout(
                total=request.timeout, sock_connect=request.connect_timeout
            )
        return found

    def open(self, request: HttpRequest) -> AbstractAsyncContextManager[HttpResponse]:
        session = self._session or self._open_session()
        pending = session.request(
            request.method,
            request.url,
            data=request.body,
            headers=request.headers,
            allow_redirects=False,
            timeout=self._timeout(request),
        )
        return _AiohttpExchange(pending)

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


# ------------------------------------------------------------------------------ plain HTTP helpers


def retry_after(headers: Mapping[str, str], now: datetime) -> timedelta | None:
    """The server's ``Retry-After`` as a delay: delta-seconds or an HTTP date; ``None`` if absent or bad."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    if raw.isdigit():
        return timedelta(seconds=int(raw))
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        # RFC 9110 dates are always GMT; email.utils drops the zone for "-0000".
        when = when.replace(tzinfo=now.tzinfo)
    return max(timedelta(0), when - now)


def unavailable_for_status(response: HttpResponse, what: str, now: datetime) -> BackendUnavailable | None:
    """``BackendUnavailable`` for the statuses that mean "try again later", else ``None``."""
    status = response.status
    if status in (429, 503):
        return BackendUnavailable(
            f"{what}: HTTP {status} (server busy)", retry_after=retry_after(response.headers, now)
        )
    if status in (502, 504):
        # A gateway lost or timed out the exchange: the request may or may not have been processed.
        return BackendUnavailable(f"{what}: HTTP {status} from a gateway")
    return None


def parse_json(body: bytes, what: str) -> object:
    """Decode a JSON body. A body cut off mid-value is a broken transfer, anything else malformed a violation."""
    try:
        # orjson (already the ledger's JSON library) parses UTF-8 bytes in one pass, several times
        # faster than decoding to text and json.loads. Whatever it refuses (and it refuses more:
        # NaN, integers past 64 bits, lone surrogates) is read again by json below, so a body
        # means exactly what it meant before and a refusal is classified the same way.
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolViolation(f"{what}: body is not UTF-8 text") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if _cut_short(text, exc):
            # Valid JSON up to where the bytes stopped: the transfer broke, the peer did not lie.
            raise BackendUnavailable(f"{what}: body ended mid-JSON after {len(body)} bytes") from exc
        raise ProtocolViolation(f"{what}: body is not JSON ({exc.msg} at {exc.pos})") from exc


_PARTIAL_NUMBER = re.compile(r"-?\d*(\.\d*)?([eE][+-]?\d*)?")


def _cut_short(text: str, exc: json.JSONDecodeError) -> bool:
    """True when ``text`` is a prefix of some JSON document: it ran out rather than went wrong."""
    if exc.msg.startswith("Unterminated string"):
        return True
    tail = text[exc.pos :].strip()
    if not tail:
        return True
    # Cut inside a literal or a number: what is left is the start of one.
    return any(word.startswith(tail) for word in ("true", "false", "null")) or bool(
        _PARTIAL_NUMBER.fullmatch(tail)
    )


def media_type(response: HttpResponse) -> str:
    raw = response.headers.get("content-type", "")
    return raw.split(";")[0].strip().lower()


async def read_capped(response: HttpResponse, limit: int, what: str) -> bytes:
    """The whole body, or ``ProtocolViolation`` as soon as it passes ``limit`` bytes (never buffers more)."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolViolation(f"{what}: body of {declared} bytes exceeds the {limit} byte limit")
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.chunks():
        total += len(chunk)
        if total > limit:
            raise ProtocolViolation(f"{what}: body exceeds the {limit} byte limit")
        chunks.append(chunk)
    return b"".join(chunks)


@asynccontextmanager
async def guarded(what: str, limit: timedelta) -> AsyncIterator[None]:
    """Bound one exchange by ``limit`` overall and translate transport failures into engine errors."""
    try:
        async with asyncio.timeout(limit.total_seconds()):
            yield
    except (TimeoutError, ExchangeTimedOut) as exc:
        # aiohttp's own timeouts are TimeoutErrors too.
        raise BackendUnavailable(f"{what}: no complete reply within {limit}") from exc
    except aiohttp.NonHttpUrlClientError as exc:
        raise ConfigError("url", f"unsupported URL scheme: {exc}") from exc
    except aiohttp.InvalidURL as exc:
        raise ConfigError("url", f"invalid URL: {exc}") from exc
    except (ExchangeFailed, aiohttp.ClientError) as exc:
        # Connect, read and write errors, a peer closing mid-body, a malformed status line,
        # undecodable content-encoding: the exchange broke, which says nothing about the
        # operation's fate.
        raise BackendUnavailable(f"{what}: connection failed ({type(exc).__name__}: {exc})") from exc


def request_of(
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: bytes | None,
    options: AdapterOptions,
    limit: timedelta,
) -> HttpRequest:
    """An ``HttpRequest`` bounded by ``limit`` overall and the options' connect timeout."""
    return HttpRequest(
        method,
        url,
        headers,
        body,
        timeout=limit.total_seconds(),
        connect_timeout=options.timeouts.connect.total_seconds(),
    )


def bearer(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


# -------------------------------------------------------------------------------- JSON-RPC values


@dataclass(frozen=True, slots=True)
class RpcError:
    """A JSON-RPC error object as the server sent it."""

    code: int
    message: str
    data: object | None = None

    def payload(self) -> Json:
        out: Json = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out

    def __str__(self) -> str:
        return f"JSON-RPC error {self.code}: {self.message}"


@dataclass(frozen=True, slots=True)
class ServerRequest:
    """A request the server sent to us on a response stream (``elicitation/create``, ...)."""

    id: RequestId
    method: str
    params: Json

    @property
    def key(self) -> str:
        """The request id as a string: the key an answer is bound to."""
        return str(self.id)


@dataclass(frozen=True, slots=True)
class Reply:
    """What one JSON-RPC exchange produced.

    Exactly one of ``result`` and ``error`` is set, unless the caller stopped reading early on a
    server request (``stopped``); ``requests`` lists the server requests seen before that point.
    """

    result: Json | None = None
    error: RpcError | None = None
    requests: tuple[ServerRequest, ...] = ()

    @property
    def stopped(self) -> bool:
        return self.result is None and self.error is None


@dataclass(frozen=True, slots=True)
class _Response:
    id: RequestId | None
    result: Json | None
    error: RpcError | None


def _error_of(data: ErrorData) -> RpcError:
    return RpcError(code=data.code, message=data.message, data=data.data)


def classify(message: object, what: str) -> _Response | ServerRequest | None:
    """One decoded JSON-RPC message: a response, a server request, or ``None`` for a notification."""
    if not isinstance(message, dict):
        raise ProtocolViolation(f"{what}: JSON-RPC message is not an object")
    if message.get("jsonrpc") != "2.0":
        raise ProtocolViolation(f'{what}: message lacks jsonrpc: "2.0"')
    try:
        if "method" in message:
            if "id" not in message:
                return None
            request = JSONRPCRequest.model_validate(message)
            return ServerRequest(id=request.id, method=request.method, params=dict(request.params or {}))
        if "error" in message:
            if "result" in message:
                raise ProtocolViolation(f"{what}: response carries both result and error")
            failure = JSONRPCError.model_validate({"id": None, **message})
            return _Response(id=failure.id, result=None, error=_error_of(failure.error))
        if "result" in message:
            if message.get("id") is None:
                raise ProtocolViolation(f"{what}: JSON-RPC result without an id")
            success = JSONRPCResponse.model_validate(message)
            return _Response(id=success.id, result=dict(success.result), error=None)
    except ValidationError as exc:
        raise ProtocolViolation(f"{what}: malformed JSON-RPC message: {_first_error(exc)}") from exc
    raise ProtocolViolation(f"{what}: JSON-RPC message is neither request, notification nor response")


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(root)"
    return f"{where}: {err['msg']}"


def check_reply_id(response: _Response, expected: RequestId, what: str, *, single: bool) -> None:
    """A reply must answer our request id; only a lone error reply may carry ``id: null``."""
    if response.id is None and response.error is not None and single:
        # JSON-RPC 2.0 uses a null id when the server could not read ours; as the direct answer to
        # our POST it can only be about our request.
        return
    if response.id is None:
        raise ProtocolViolation(f"{what}: JSON-RPC reply without an id")
    if type(response.id) is not type(expected) or response.id != expected:
        raise ProtocolViolation(f"{what}: reply for request id {response.id!r}, expected {expected!r}")


class SseParser:
    """Incremental ``text/event-stream`` framing: bytes in, complete ``message`` event data out. No I/O."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[str] = []
        self._event = ""

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer.extend(chunk)
        events: list[str] = []
        while (end := self._buffer.find(b"\n")) >= 0:
            raw = bytes(self._buffer[:end]).rstrip(b"\r")
            del self._buffer[: end + 1]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ProtocolViolation("event stream line is not UTF-8") from exc
            if line == "":
                if self._data and self._event in ("", "message"):
                    events.append("\n".join(self._data))
                self._data = []
                self._event = ""
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
        # An event without its terminating blank line at end of stream is discarded (SSE rules), so
        # a stream cut mid-event never yields half a message.
        return events


# -------------------------------------------------------------------- MCP Streamable HTTP transport


class StreamableHttp:
    """JSON-RPC over MCP Streamable HTTP against one endpoint, through the caller's pooled client.

    Safe for concurrent use by many operations: each call is its own POST and its own stream.
    """

    def __init__(
        self,
        client: HttpClient,
        url: str,
        *,
        token: str | None,
        options: AdapterOptions,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._client = client
        self._url = url
        self._token = token
        self._options = options
        self._headers = dict(headers or {})
        self._ids = itertools.count(1)
        self.session_id: str | None = None

    def set_header(self, name: str, value: str) -> None:
        self._headers[name] = value

    def _request_headers(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        out = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            **bearer(self._token),
            **self._headers,
        }
        if self.session_id is not None:
            out[SESSION_HEADER] = self.session_id
        if extra:
            out.update(extra)
        return out

    def _now(self) -> datetime:
        return self._options.clock.now()

    async def call(
        self,
        method: str,
        params: Json,
        *,
        limit: timedelta,
        headers: Mapping[str, str] | None = None,
        until: Callable[[ServerRequest], bool] | None = None,
    ) -> Reply:
        """Send one request and read its reply (JSON or SSE).

        Args:
            method: the JSON-RPC method.
            params: its params object.
            limit: bound on the whole exchange.
            headers: extra HTTP headers for this request.
            until: stop reading (and return a ``stopped`` reply) at the first server request for
                which this returns True.

        Raises:
            BackendUnavailable: connection lost, timeout, 429/503 (with ``retry_after``), a stream
                that ended before the reply. ``SessionExpired`` when the session is gone.
            BackendRejected: an HTTP 4xx without a JSON-RPC error body.
            ProtocolViolation: anything malformed, oversized or answering another request.
        """
        request_id = next(self._ids)
        body: Json = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        what = method
        request = request_of(
            "POST", self._url, self._request_headers(headers), encode_json(body), self._options, limit
        )
        async with guarded(what, limit), self._client.open(request) as response:
            if response.status >= 400:
                return await self._failed(response, request_id, method)
            if response.status != 200:
                raise ProtocolViolation(f"{what}: unexpected HTTP {response.status} for a request")
            if method == "initialize" and SESSION_HEADER in response.headers:
                self.session_id = response.headers[SESSION_HEADER]
            kind = media_type(response)
            if kind == "application/json":
                raw = await read_capped(response, self._options.max_body_bytes, what)
                found = classify(parse_json(raw, what), what)
                if not isinstance(found, _Response):
                    raise ProtocolViolation(f"{what}: JSON body is not a response to the request")
                check_reply_id(found, request_id, what, single=True)
                return Reply(result=found.result, error=found.error)
            if kind == "text/event-stream":
                return await self._read_stream(response, request_id, what, until)
            raise ProtocolViolation(f"{what}: unexpected content type {kind or '(none)'!r}")

    async def _failed(self, response: HttpResponse, request_id: int, method: str) -> Reply:
        busy = unavailable_for_status(response, method, self._now())
        if busy is not None:
            raise busy
        status = response.status
        if status in (401, 403):
            # Credentials, not the call: whatever JSON-RPC error rides along, this is a refusal.
            raise BackendRejected(f"{method}: HTTP {status} (not authorized)", code=status)
        if status == 404 and self.session_id is not None and method != "initialize":
            raise SessionExpired(f"{method}: HTTP 404 for session {self.session_id}; the session expired")
        if media_type(response) == "application/json":
            raw = await read_capped(response, self._options.max_body_bytes, method)
            try:
                found = classify(parse_json(raw, method), method)
            except (ProtocolViolation, BackendUnavailable):
                found = None
            if isinstance(found, _Response) and found.error is not None:
                check_reply_id(found, request_id, method, single=True)
                return Reply(error=found.error)
        if status >= 500:
            raise BackendUnavailable(f"{method}: HTTP {status}")
        raise BackendRejected(f"{method}: HTTP {status}", code=status)

    async def _read_stream(
        self,
        response: HttpResponse,
        request_id: int,
        what: str,
        until: Callable[[ServerRequest], bool] | None,
    ) -> Reply:
        parser = SseParser()
        seen: list[ServerRequest] = []
        total = 0
        limit = self._options.max_body_bytes
        async for chunk in response.chunks():
            total += len(chunk)
            if total > limit:
                raise ProtocolViolation(f"{what}: event stream exceeds the {limit} byte limit")
            for data in parser.feed(chunk):
                found = classify(parse_json(data.encode(), what), what)
                if found is None:
                    continue
                if isinstance(found, ServerRequest):
                    seen.append(found)
                    if until is not None and until(found):
                        return Reply(requests=tuple(seen))
                    continue
                check_reply_id(found, request_id, what, single=False)
                return Reply(result=found.result, error=found.error, requests=tuple(seen))
        raise BackendUnavailable(f"{what}: event stream ended before the reply")

    async def notify(self, method: str, params: Json, *, headers: Mapping[str, str] | None = None) -> None:
        """Send a notification; the server answers 202 (any 2xx is accepted)."""
        await self._post_one_way({"jsonrpc": "2.0", "method": method, "params": params}, method, headers)

    async def respond(
        self, request_id: RequestId, result: Json, *, headers: Mapping[str, str] | None = None
    ) -> None:
        """Answer a server request (e.g. an elicitation) with a JSON-RPC result."""
        body: Json = {"jsonrpc": "2.0", "id": request_id, "result": result}
        await self._post_one_way(body, f"response to server request {request_id!r}", headers)

    async def _post_one_way(self, body: Json, what: str, headers: Mapping[str, str] | None) -> None:
        limit = self._options.timeouts.request
        request = request_of(
            "POST", self._url, self._request_headers(headers), encode_json(body), self._options, limit
        )
        async with guarded(what, limit), self._client.open(request) as response:
            status = response.status
            if status < 300:
                return
            busy = unavailable_for_status(response, what, self._now())
        if busy is not None:
            raise busy
        if status == 404 and self.session_id is not None:
            raise SessionExpired(f"{what}: HTTP 404; the session expired")
        if status >= 500:
            raise BackendUnavailable(f"{what}: HTTP {status}")
        raise BackendRejected(f"{what}: HTTP {status}", code=status)

    async def close_session(self) -> None:
        """Tell the server the session is over (best effort: a failure here changes nothing)."""
        if self.session_id is None:
            return
        limit = self._options.timeouts.request
        try:
            request = request_of("DELETE", self._url, self._request_headers(None), None, self._options, limit)
            async with guarded("session close", limit), self._client.open(request):
                pass
        except (BackendUnavailable, ConfigError):
            pass
        self.session_id = None


__all__ = [
    "PROTOCOL_VERSION_HEADER",
    "SESSION_HEADER",
    "AiohttpClient",
    "ExchangeFailed",
    "ExchangeTimedOut",
    "HttpClient",
    "HttpRequest",
    "HttpResponse",
    "Reply",
    "RequestId",
    "RpcError",
    "ServerRequest",
    "SseParser",
    "StreamableHttp",
    "bearer",
    "check_reply_id",
    "classify",
    "encode_json",
    "guarded",
    "headers_of",
    "media_type",
    "parse_json",
    "read_capped",
    "request_of",
    "retry_after",
    "unavailable_for_status",
]
