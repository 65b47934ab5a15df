"""HTTP plumbing shared by the adapters, and the MCP Streamable HTTP JSON-RPC transport.

Turns every HTTP-level failure into an engine error (a dropped connection or timeout is
``BackendUnavailable``, never a cancel) and every malformed reply into ``ProtocolViolation``. It knows
JSON-RPC envelopes and SSE framing but no MCP method's meaning; it never decides an operation's state.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

import aiohttp
import httpx
import orjson
from httpx import USE_CLIENT_DEFAULT
from httpx._client import UseClientDefault
from httpx._types import AuthTypes
from httpx_aiohttp import AiohttpTransport
from mcp_types.jsonrpc import ErrorData, JSONRPCError, JSONRPCRequest, JSONRPCResponse
from pydantic import ValidationError

from engine.adapters.base import Json
from engine.adapters.config import AdapterOptions
from engine.errors import BackendRejected, BackendUnavailable, ConfigError, ProtocolViolation, SessionExpired

# httpx's names for the rest of the engine: this module is the one that imports httpx (TID251), so
# the adapters and the explorer's in-process wire name HTTP through it.
HttpClient = httpx.AsyncClient
"""The pooled HTTP client every adapter talks through (one per process; the caller closes it)."""
HttpRequest = httpx.Request
HttpResponse = httpx.Response
HttpTransport = httpx.AsyncBaseTransport
HttpByteStream = httpx.AsyncByteStream
ReadTimeout = httpx.ReadTimeout
RemoteProtocolError = httpx.RemoteProtocolError

SESSION_HEADER = "Mcp-Session-Id"
PROTOCOL_VERSION_HEADER = "MCP-Protocol-Version"
RequestId = int | str


# ------------------------------------------------------------------------------ plain HTTP helpers


def pooled_client(connections: int) -> httpx.AsyncClient:
    """The HTTP client the service shares across every server it drives: httpx's API on aiohttp's pool.

    httpx's own pool (httpcore) walks every pooled connection, and polls each idle socket for
    readability, at every request's start and end: about 5.8 ms of CPU per request with 48 in
    flight, measured side by side against a reference server. aiohttp's connector keeps idle
    connections in a per-host queue and parses HTTP/1.1 in C; through httpx-aiohttp's transport
    the adapters keep speaking httpx, at about 1 ms per request on the same load.
    """
    # Idle connections are dropped after 2 s, well before common servers' keep-alive timeouts
    # (uvicorn's is 5 s). aiohttp does not probe a pooled socket before reusing it (httpcore does, at
    # the price above), so a connection the server closes just as a POST reuses it would lose that
    # request's reply; aiohttp retries only idempotent methods on its own.
    limits = httpx.Limits(
        max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=2.0
    )
    return PooledClient(AiohttpTransport(limits=limits), limits)


class PooledClient(httpx.AsyncClient):
    """httpx's API on one transport, each request handed straight to it.

    ``send`` skips what httpx wraps around a transport and the adapters never use, about 5 % of
    the executor's CPU in bench/scale.py (bench/results/profiles/scale-s5-before.md): the auth
    flow (the adapters set ``Authorization`` themselves), redirects (never followed: a redirect
    is a reply like any other) and the cookie jar (the protocols keep a session in
    ``Mcp-Session-Id``, never in a cookie; httpx built a ``urllib`` request for every reply to look
    for one). A caller that asks for auth or for redirects gets httpx's own ``send``.
    """

    def __init__(self, transport: httpx.AsyncBaseTransport, limits: httpx.Limits) -> None:
        super().__init__(transport=transport, limits=limits)
        self._wire = transport

    async def send(
        self,
        request: httpx.Request,
        *,
        stream: bool = False,
        auth: AuthTypes | UseClientDefault | None = USE_CLIENT_DEFAULT,
        follow_redirects: bool | UseClientDefault = USE_CLIENT_DEFAULT,
    ) -> httpx.Response:
        if not isinstance(auth, UseClientDefault) or follow_redirects is True or self.is_closed:
            return await super().send(request, stream=stream, auth=auth, follow_redirects=follow_redirects)
        response = await self._wire.handle_async_request(request)
        response.request = request
        if not stream:
            try:
                await response.aread()
            except BaseException:
                await response.aclose()
                raise
        return response


def retry_after(headers: httpx.Headers, now: datetime) -> timedelta | None:
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


def unavailable_for_status(response: httpx.Response, what: str, now: datetime) -> BackendUnavailable | None:
    """``BackendUnavailable`` for the statuses that mean "try again later", else ``None``."""
    status = response.status_code
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


def media_type(response: httpx.Response) -> str:
    raw: str = response.headers.get("content-type", "")
    return raw.split(";")[0].strip().lower()


async def read_capped(response: httpx.Response, limit: int, what: str) -> bytes:
    """The whole body, or ``ProtocolViolation`` as soon as it passes ``limit`` bytes (never buffers more)."""
    declared = response.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProtocolViolation(f"{what}: body of {declared} bytes exceeds the {limit} byte limit")
    chunks: list[bytes] = []
    total = 0
    async for chunk in response.aiter_bytes():
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
    except TimeoutError as exc:
        raise BackendUnavailable(f"{what}: no complete reply within {limit}") from exc
    except httpx.TimeoutException as exc:
        raise BackendUnavailable(f"{what}: timed out ({type(exc).__name__})") from exc
    except httpx.UnsupportedProtocol as exc:
        raise ConfigError("url", f"unsupported URL scheme: {exc}") from exc
    except httpx.InvalidURL as exc:
        raise ConfigError("url", f"invalid URL: {exc}") from exc
    except (httpx.RequestError, aiohttp.ClientError) as exc:
        # Connect, read and write errors, a peer closing mid-body, undecodable content-encoding
        # (aiohttp's own when ``pooled_client``'s transport passes one through unmapped, such as a
        # malformed status line): the exchange broke, which says nothing about the operation's fate.
        raise BackendUnavailable(f"{what}: connection failed ({type(exc).__name__}: {exc})") from exc


def httpx_timeout(options: AdapterOptions, limit: timedelta) -> httpx.Timeout:
    return httpx.Timeout(limit.total_seconds(), connect=options.timeouts.connect.total_seconds())


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
        client: httpx.AsyncClient,
        url: str,
        *,
        token: str | None,
        options: AdapterOptions,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._client = client
        self._url = url
        self._parsed: httpx.URL | None = None
        self._token = token
        self._options = options
        self._headers = dict(headers or {})
        self._ids = itertools.count(1)
        self.session_id: str | None = None

    def _target(self) -> httpx.URL:
        """The endpoint, parsed once (httpx parsed the string again for every request: 2 % of the
        executor's CPU). Called inside ``guarded``, so a bad URL still becomes ``ConfigError``."""
        if self._parsed is None:
            self._parsed = httpx.URL(self._url)
        return self._parsed

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
        async with (
            guarded(what, limit),
            self._client.stream(
                "POST",
                self._target(),
                json=body,
                headers=self._request_headers(headers),
                timeout=httpx_timeout(self._options, limit),
            ) as response,
        ):
            if response.status_code >= 400:
                return await self._failed(response, request_id, method)
            if response.status_code != 200:
                raise ProtocolViolation(f"{what}: unexpected HTTP {response.status_code} for a request")
            if method == "initialize" and SESSION_HEADER.lower() in response.headers:
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

    async def _failed(self, response: httpx.Response, request_id: int, method: str) -> Reply:
        busy = unavailable_for_status(response, method, self._now())
        if busy is not None:
            raise busy
        status = response.status_code
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
        response: httpx.Response,
        request_id: int,
        what: str,
        until: Callable[[ServerRequest], bool] | None,
    ) -> Reply:
        parser = SseParser()
        seen: list[ServerRequest] = []
        total = 0
        limit = self._options.max_body_bytes
        async for chunk in response.aiter_bytes():
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
        async with guarded(what, limit):
            response = await self._client.post(
                self._target(),
                json=body,
                headers=self._request_headers(headers),
                timeout=httpx_timeout(self._options, limit),
            )
        if response.status_code < 300:
            return
        busy = unavailable_for_status(response, what, self._now())
        if busy is not None:
            raise busy
        if response.status_code == 404 and self.session_id is not None:
            raise SessionExpired(f"{what}: HTTP 404; the session expired")
        if response.status_code >= 500:
            raise BackendUnavailable(f"{what}: HTTP {response.status_code}")
        raise BackendRejected(f"{what}: HTTP {response.status_code}", code=response.status_code)

    async def close_session(self) -> None:
        """Tell the server the session is over (best effort: a failure here changes nothing)."""
        if self.session_id is None:
            return
        limit = self._options.timeouts.request
        try:
            async with guarded("session close", limit):
                await self._client.delete(
                    self._target(),
                    headers=self._request_headers(None),
                    timeout=httpx_timeout(self._options, limit),
                )
        except (BackendUnavailable, ConfigError):
            pass
        self.session_id = None


__all__ = [
    "PROTOCOL_VERSION_HEADER",
    "SESSION_HEADER",
    "HttpByteStream",
    "HttpClient",
    "HttpRequest",
    "HttpResponse",
    "HttpTransport",
    "ReadTimeout",
    "RemoteProtocolError",
    "Reply",
    "RequestId",
    "RpcError",
    "ServerRequest",
    "SseParser",
    "StreamableHttp",
    "bearer",
    "check_reply_id",
    "classify",
    "guarded",
    "httpx_timeout",
    "media_type",
    "parse_json",
    "read_capped",
    "retry_after",
    "unavailable_for_status",
]
