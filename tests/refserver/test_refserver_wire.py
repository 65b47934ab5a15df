"""Pure protocol helpers: JSON-RPC framing, the 2026 envelope ladder, AIP filters, Accept parsing."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from refserver.aip151 import AipError, parse_filter
from refserver.jsonrpc import RpcFault, RpcNotification, RpcRequest, RpcResponse, parse_message
from refserver.mcp2026 import check_envelope
from refserver.wire import accepts_sse, prefers_sse

META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
}
HEADERS = {"mcp-protocol-version": "2026-07-28", "mcp-method": "tasks/get", "mcp-name": "t1"}


def test_messages_are_classified_as_request_notification_or_response():
    """id+method is a request, method alone a notification, id+result a response."""
    assert isinstance(parse_message(b'{"jsonrpc":"2.0","id":1,"method":"ping"}'), RpcRequest)
    assert isinstance(parse_message(b'{"jsonrpc":"2.0","method":"notifications/x"}'), RpcNotification)
    assert isinstance(parse_message(b'{"jsonrpc":"2.0","id":"r","result":{}}'), RpcResponse)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),
        (b"\xff\xfe", -32700),
        (b"[]", -32600),
        (b'{"jsonrpc":"1.0","id":1,"method":"x"}', -32600),
        (b'{"jsonrpc":"2.0","id":true,"method":"x"}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}', -32600),
        (b'{"jsonrpc":"2.0","id":1}', -32600),
    ],
)
def test_malformed_messages_get_the_matching_json_rpc_code(body, code):
    """Parse errors are -32700, structurally wrong messages -32600, both with HTTP 400."""
    with pytest.raises(RpcFault) as caught:
        parse_message(body)
    assert caught.value.code == code
    assert caught.value.http_status == 400


def test_envelope_with_matching_headers_reports_the_tasks_opt_in():
    """A well-formed request passes the ladder and exposes whether tasks were opted into."""
    envelope = check_envelope(RpcRequest(1, "tasks/get", {"taskId": "t1", "_meta": META}), HEADERS)
    assert envelope.tasks_opt_in
    no_opt_in = {**META, "io.modelcontextprotocol/clientCapabilities": {}}
    assert not check_envelope(
        RpcRequest(1, "tasks/get", {"taskId": "t1", "_meta": no_opt_in}), HEADERS
    ).tasks_opt_in


@pytest.mark.parametrize(
    ("params", "headers", "code"),
    [
        ({"taskId": "t1"}, HEADERS, -32602),
        (
            {"taskId": "t1", "_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}},
            HEADERS,
            -32602,
        ),
        ({"taskId": "t1", "_meta": META}, {**HEADERS, "mcp-method": "tasks/cancel"}, -32020),
        ({"taskId": "t1", "_meta": META}, {**HEADERS, "mcp-name": "t2"}, -32020),
        ({"taskId": "t1", "_meta": META}, {k: v for k, v in HEADERS.items() if k != "mcp-name"}, -32020),
        ({"taskId": "t1", "_meta": META}, {**HEADERS, "mcp-protocol-version": "2025-11-25"}, -32020),
        (
            {"taskId": "t1", "_meta": {**META, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}},
            {**HEADERS, "mcp-protocol-version": "2099-01-01"},
            -32022,
        ),
    ],
)
def test_envelope_ladder_rejects_with_http_400(params, headers, code):
    """Missing envelope -32602, header mismatch -32020, unsupported version -32022; all HTTP 400."""
    with pytest.raises(RpcFault) as caught:
        check_envelope(RpcRequest(1, "tasks/get", params), headers)
    assert caught.value.code == code
    assert caught.value.http_status == 400


def test_base64_wrapped_mcp_name_is_decoded():
    """``=?base64?...?=`` header values are compared after decoding."""
    headers = {**HEADERS, "mcp-name": "=?base64?dDE=?="}
    assert check_envelope(RpcRequest(1, "tasks/get", {"taskId": "t1", "_meta": META}), headers)


def test_aip_filter_parses_and_terms():
    """``request_id = "a" AND done = true`` parses to two normalised terms."""
    assert parse_filter('request_id = "a b" AND done=true') == [("request_id", "a b"), ("done", "true")]
    assert parse_filter("metadata.tool=generate_report") == [("tool", "generate_report")]
    assert parse_filter("  ") == []


@pytest.mark.parametrize("text", ["owner = me", "request_id", "request_id > 3"])
def test_aip_filter_refuses_unknown_terms(text):
    """Unsupported fields or operators are an INVALID_ARGUMENT error."""
    with pytest.raises(AipError) as caught:
        parse_filter(text)
    assert caught.value.http_status == 400


def _request(accept: str | None) -> Request:
    headers = [] if accept is None else [(b"accept", accept.encode())]
    return Request({"type": "http", "method": "POST", "path": "/mcp", "headers": headers})


@pytest.mark.parametrize(
    ("accept", "accepts", "prefers"),
    [
        (None, False, False),
        ("application/json, text/event-stream", True, False),
        ("text/event-stream", True, True),
        ("application/json;q=0.5, text/event-stream", True, True),
        ("application/json", False, False),
    ],
)
def test_accept_header_decides_between_json_and_sse(accept, accepts, prefers):
    """SSE is used when the client ranks it strictly above JSON; missing Accept means JSON."""
    assert accepts_sse(_request(accept)) is accepts
    assert prefers_sse(_request(accept)) is prefers
