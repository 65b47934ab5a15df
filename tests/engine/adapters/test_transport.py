"""The Streamable HTTP transport: replies, framing, caps, and every failure's engine error."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import http_kit
import pytest
from adapter_fakes import (
    T0,
    URL,
    FakeMcp,
    broken,
    error,
    options,
    raises,
    raw,
    result,
    sse,
)
from hypothesis import given
from hypothesis import strategies as st

from engine.adapters.transport import (
    AiohttpClient,
    HttpRequest,
    SseParser,
    StreamableHttp,
    headers_of,
    read_capped,
    retry_after,
)
from engine.errors import BackendRejected, BackendUnavailable, ConfigError, ProtocolViolation, SessionExpired

LIMIT = timedelta(seconds=5)


def transport(fake: FakeMcp, **opts: Any) -> StreamableHttp:
    return StreamableHttp(fake.client(), URL, token="tok", options=options(**opts))


async def test_a_json_reply_returns_its_result_and_sends_the_bearer_token():
    """A JSON reply is returned as the result, and every request carries the bearer token."""
    fake = FakeMcp().on("ping", result({"ok": True}))
    reply = await transport(fake).call("ping", {}, limit=LIMIT)
    assert reply.result == {"ok": True}
    assert fake.sent[0].request.headers["authorization"] == "Bearer tok"
    assert "text/event-stream" in fake.sent[0].request.headers["accept"]


async def test_an_event_stream_reply_collects_server_requests_and_skips_notifications():
    """SSE: notifications are skipped, server requests are kept, the reply ends the read."""
    note = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}
    ask = {"jsonrpc": "2.0", "id": 0, "method": "elicitation/create", "params": {"message": "?"}}
    fake = FakeMcp().on("tasks/result", sse(note, ask, final={"done": 1}))
    reply = await transport(fake).call("tasks/result", {}, limit=LIMIT)
    assert reply.result == {"done": 1}
    assert [r.id for r in reply.requests] == [0]
    assert reply.requests[0].key == "0"


async def test_reading_stops_at_the_first_server_request_the_caller_waits_for():
    """``until`` stops the stream read at the server request it matches, before any reply."""
    ask = {"jsonrpc": "2.0", "id": "r1", "method": "elicitation/create", "params": {}}
    fake = FakeMcp().on("tasks/result", broken(b"event: message\ndata: " + _dump(ask) + b"\n\n"))
    reply = await transport(fake).call("tasks/result", {}, limit=LIMIT, until=lambda r: r.id == "r1")
    assert reply.stopped
    assert reply.requests[0].method == "elicitation/create"


async def test_a_json_rpc_error_reply_is_returned_not_raised():
    """A JSON-RPC error is a reply: the adapter decides what it means."""
    fake = FakeMcp().on("tasks/get", error(-32602, "unknown task"))
    reply = await transport(fake).call("tasks/get", {}, limit=LIMIT)
    assert reply.error is not None
    assert (reply.error.code, reply.error.message) == (-32602, "unknown task")


async def test_a_json_rpc_error_with_http_400_is_still_a_reply():
    """2026-07-28 sends some JSON-RPC errors with HTTP 400; the error object is what counts."""
    fake = FakeMcp().on("tools/call", error(-32021, "missing capability", status=400))
    reply = await transport(fake).call("tools/call", {}, limit=LIMIT)
    assert reply.error is not None
    assert reply.error.code == -32021


@pytest.mark.parametrize(
    ("responder", "message"),
    [
        (raw(200, b"<html>oops</html>"), "not JSON"),
        (raw(200, b'{"jsonrpc": "2.0", "result": {}}'), "without an id"),
        (raw(200, b'{"jsonrpc": "2.0", "id": 999, "result": {}}'), "expected 1"),
        (raw(200, b'{"jsonrpc": "2.0", "id": "1", "result": {}}'), "expected 1"),
        (raw(200, b'{"id": 1, "result": {}}'), "jsonrpc"),
        (raw(200, b'{"jsonrpc": "2.0", "id": 1, "result": []}'), "malformed"),
        (raw(200, b'{"jsonrpc": "2.0", "id": 1}'), "neither"),
        (raw(200, b"[1, 2]"), "not an object"),
        (raw(200, b"\xff\xfe"), "not UTF-8"),
        (raw(200, b'{"jsonrpc": "2.0", "id": 1, "result": {}}', content_type="text/html"), "content type"),
        (raw(202, b""), "HTTP 202"),
        (sse({"jsonrpc": "2.0", "result": {}}), "without an id"),
        (raw(200, b"data: {nope\n\n", content_type="text/event-stream"), "not JSON"),
    ],
)
async def test_malformed_replies_are_protocol_violations(responder, message):
    """Non-JSON, id-less, foreign-id, wrong-type and wrong-content-type replies are violations."""
    fake = FakeMcp().on("ping", responder)
    with pytest.raises(ProtocolViolation, match=message):
        await transport(fake).call("ping", {}, limit=LIMIT)


async def test_a_429_with_retry_after_seconds_is_unavailable_with_that_delay():
    """429 + ``Retry-After: 7`` is retryable after 7 s."""
    fake = FakeMcp().on("tasks/get", raw(429, b"", **{"retry-after": "7"}))
    with pytest.raises(BackendUnavailable) as caught:
        await transport(fake).call("tasks/get", {}, limit=LIMIT)
    assert caught.value.retry_after == timedelta(seconds=7)


async def test_a_503_with_an_http_date_retry_after_counts_from_the_injected_clock():
    """An HTTP-date ``Retry-After`` becomes the delay from the adapter clock's now."""
    later = "Thu, 01 Jan 2026 00:01:30 GMT"
    fake = FakeMcp().on("tasks/get", raw(503, b"busy", "text/plain", **{"retry-after": later}))
    with pytest.raises(BackendUnavailable) as caught:
        await transport(fake).call("tasks/get", {}, limit=LIMIT)
    assert caught.value.retry_after == timedelta(seconds=90)


def test_retry_after_ignores_garbage_and_never_goes_negative():
    """A bad ``Retry-After`` means no hint; a date in the past means retry now."""
    assert retry_after(headers_of({"retry-after": "soon"}), T0) is None
    assert retry_after(headers_of({}), T0) is None
    past = headers_of({"Retry-After": "Wed, 31 Dec 2025 23:00:00 GMT"})
    assert retry_after(past, T0) == timedelta(0)


@pytest.mark.parametrize(
    "responder",
    [
        raises(http_kit.ConnectError("refused")),
        raises(http_kit.ReadTimeout("slow")),
        raises(http_kit.RemoteProtocolError("reset")),
        broken(b'event: message\ndata: {"jsonrpc"'),
        broken(b'{"jsonrpc": "2.0", "id": 1, "res', content_type="application/json"),
        sse(),
        raw(200, b'{"jsonrpc": "2.0", "id": 1, "result": {"a": "cut he'),
        raw(200, b""),
        raw(502, b"bad gateway", "text/html"),
        raw(500, b"<html>", "text/html"),
    ],
)
async def test_broken_connections_and_truncated_bodies_are_unavailable_never_a_cancel(responder):
    """Dropped, timed-out, truncated or gateway-lost exchanges are retryable ``BackendUnavailable``."""
    fake = FakeMcp().on("tasks/result", responder)
    with pytest.raises(BackendUnavailable):
        await transport(fake).call("tasks/result", {}, limit=LIMIT)


async def test_a_ten_megabyte_body_is_refused_once_it_passes_the_cap():
    """A body past ``max_body_bytes`` is a violation; the read stops there."""
    huge = b'{"jsonrpc": "2.0", "id": 1, "result": {"x": "' + b"a" * 10_000_000 + b'"}}'
    fake = FakeMcp().on("tasks/result", raw(200, huge))
    with pytest.raises(ProtocolViolation, match="byte limit"):
        await transport(fake).call("tasks/result", {}, limit=LIMIT)


async def test_a_stream_past_the_cap_is_refused_without_reading_it_all():
    """The SSE reader counts bytes as they come and stops past the cap."""
    chunk = b": " + b"x" * 1000 + b"\n"
    fake = FakeMcp().on("tasks/result", broken(*([chunk] * 100)))
    with pytest.raises(ProtocolViolation, match="byte limit"):
        await transport(fake, max_body_bytes=10_000).call("tasks/result", {}, limit=LIMIT)


async def test_a_trickling_stream_is_cut_off_by_the_overall_limit():
    """A server that never finishes its stream cannot hold the caller past the limit."""
    never = asyncio.Event()

    class Trickle(http_kit.AsyncByteStream):
        async def __aiter__(self):
            yield b": keep-alive\n"
            await never.wait()

    def respond(message, request):
        return http_kit.Response(200, stream=Trickle(), headers={"content-type": "text/event-stream"})

    fake = FakeMcp().on("tasks/result", respond)
    with pytest.raises(BackendUnavailable, match="no complete reply"):
        await transport(fake).call("tasks/result", {}, limit=timedelta(milliseconds=50))


async def test_http_404_on_a_session_means_the_session_expired():
    """404 while holding a session id is ``SessionExpired`` (retryable after re-initializing)."""
    fake = FakeMcp().on("tasks/get", raw(404, b"gone", "text/plain"))
    http = transport(fake)
    http.session_id = "s-1"
    with pytest.raises(SessionExpired):
        await http.call("tasks/get", {}, limit=LIMIT)


async def test_unauthorized_without_a_json_rpc_body_is_rejected_with_the_status():
    """401 without a JSON-RPC error body is ``BackendRejected`` with the HTTP status as code."""
    fake = FakeMcp().on("tasks/get", raw(401, b"no", "text/plain"))
    with pytest.raises(BackendRejected) as caught:
        await transport(fake).call("tasks/get", {}, limit=LIMIT)
    assert caught.value.code == 401


async def test_unauthorized_with_a_json_rpc_error_body_is_still_a_refusal():
    """401 is about credentials even when a JSON-RPC error rides along; never a protocol answer."""
    fake = FakeMcp().on("initialize", error(-32000, "bearer token required", status=401))
    with pytest.raises(BackendRejected) as caught:
        await transport(fake).call("initialize", {}, limit=LIMIT)
    assert caught.value.code == 401


async def test_the_session_id_from_initialize_is_sent_on_later_requests():
    """``Mcp-Session-Id`` from the initialize response is echoed on every later request."""
    fake = FakeMcp().on("initialize", result({}, headers={"mcp-session-id": "abc"})).on("ping", result({}))
    http = transport(fake)
    await http.call("initialize", {}, limit=LIMIT)
    await http.call("ping", {}, limit=LIMIT)
    assert fake.sent[1].request.headers["mcp-session-id"] == "abc"


async def test_notifications_and_answers_accept_202_and_refuse_server_errors():
    """One-way posts succeed on 2xx and fail with the engine error of any other status."""
    fake = FakeMcp()
    http = transport(fake)
    await http.notify("notifications/initialized", {})
    await http.respond(0, {"action": "accept"})
    assert fake.responses()[0].body == {"jsonrpc": "2.0", "id": 0, "result": {"action": "accept"}}

    def busy(request):
        return http_kit.Response(503, headers={"retry-after": "2"})

    http = StreamableHttp(http_kit.mock_client(busy), URL, token=None, options=options())
    with pytest.raises(BackendUnavailable) as caught:
        await http.respond(0, {})
    assert caught.value.retry_after == timedelta(seconds=2)


async def test_an_unsupported_url_scheme_is_a_configuration_error():
    """A URL the HTTP client cannot speak to is the operator's mistake, not the server's."""
    async with AiohttpClient(4) as client:
        http = StreamableHttp(client, "ftp://example.invalid/mcp", token=None, options=options())
        with pytest.raises(ConfigError):
            await http.call("ping", {}, limit=LIMIT)


async def test_a_refused_connection_is_unavailable_and_a_malformed_url_a_configuration_error():
    """Over real sockets: nothing listening is ``BackendUnavailable``; a URL that cannot be parsed
    is the operator's mistake (``ConfigError``), before any connection is tried."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with AiohttpClient(4) as client:
        closed = StreamableHttp(client, f"http://127.0.0.1:{port}/mcp", token=None, options=options())
        with pytest.raises(BackendUnavailable, match="connection failed"):
            await closed.call("ping", {}, limit=LIMIT)
        malformed = StreamableHttp(client, "http://[::1/mcp", token=None, options=options())
        with pytest.raises(ConfigError):
            await malformed.call("ping", {}, limit=LIMIT)


@given(
    messages=st.lists(
        st.dictionaries(st.text(max_size=5), st.integers(), max_size=3), min_size=1, max_size=5
    ),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_the_sse_parser_yields_the_same_events_however_the_bytes_are_split(messages, cuts):
    """Property: chunk boundaries never change the decoded events."""
    stream = b"".join(b"event: message\r\ndata: " + _dump(m) + b"\r\n\r\n" for m in messages)
    points = sorted({min(c, len(stream)) for c in cuts})
    parser = SseParser()
    events: list[str] = []
    start = 0
    for point in [*points, len(stream)]:
        events += parser.feed(stream[start:point])
        start = point
    assert [json.loads(e) for e in events] == messages


def test_the_sse_parser_joins_data_lines_and_drops_unfinished_events():
    """CRLF endings, comments, multi-line data, foreign event types and a cut-off tail are handled."""
    parser = SseParser()
    events = parser.feed(b': hello\r\nevent: message\r\ndata: {"a":\r\ndata: 1}\r\n\r\n')
    events += parser.feed(b"event: ping\ndata: ignored\n\n")
    events += parser.feed(b'data: {"b": 2}\n\ndata: {"cut')
    assert events == ['{"a":\n1}', '{"b": 2}']


def _dump(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode()


async def test_the_pooled_client_sends_no_cookie_back_follows_no_redirect_and_reads_each_reply_whole():
    """Over real HTTP: a server's Set-Cookie is never sent back (the protocols keep sessions in
    headers), a redirect is a reply like any other (never followed), and status, body and a
    streamed body arrive as sent, over one kept-alive connection pool."""
    from http_kit import aiohttp_web as web

    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Cookie"))
        if request.method == "GET":
            streamed = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await streamed.prepare(request)
            for part in (b"data: 1\n\n", b"data: 2\n\n"):
                await streamed.write(part)
            await streamed.write_eof()
            return streamed
        if await request.read() == b"go away":
            raise web.HTTPFound("/elsewhere")
        return web.json_response({"n": len(seen)}, headers={"Set-Cookie": "sticky=1; Path=/"})

    app = web.Application()
    app.router.add_route("*", "/mcp", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/mcp"
    client = AiohttpClient(4)

    async def exchange(method: str, body: bytes | None) -> tuple[int, str, bytes]:
        request = HttpRequest(method, url, {"Content-Type": "application/json"}, body, timeout=30)
        async with client.open(request) as response:
            return (
                response.status,
                response.headers.get("LOCATION", ""),
                await read_capped(response, 1000, "x"),
            )

    try:
        first = await exchange("POST", b'{"a": 1}')
        second = await exchange("POST", b'{"a": 2}')
        moved = await exchange("POST", b"go away")
        streamed = await exchange("GET", None)
        assert (first[0], json.loads(first[2]), json.loads(second[2])) == (200, {"n": 1}, {"n": 2})
        assert moved[:2] == (302, "/elsewhere")
        assert streamed == (200, "", b"data: 1\n\ndata: 2\n\n")
        assert seen == [None, None, None, None]
    finally:
        await client.aclose()
        await runner.cleanup()
