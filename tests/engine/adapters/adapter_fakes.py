"""Scripted HTTP peers for the adapter tests: handwritten wire payloads served through http_kit.MockClient.

A ``FakeMcp`` answers JSON-RPC by method with responders; a ``FakeHttp`` answers plain requests by
method and path. Both record every request so tests can assert on what was sent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import http_kit

from engine.adapters.config import AdapterOptions
from engine.model import (
    CallNodeId,
    CallRequest,
    Epoch,
    Operation,
    OperationId,
    Principal,
    Protocol,
    ServerStatus,
    TaskId,
    ToolRef,
    new_operation,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
CREATED_AT = "2026-01-01T00:00:00Z"
URL = "http://mcp.test/mcp"
AIP_URL = "http://aip.test"

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"tool": {"type": "string"}, "digest": {"type": "string"}},
    "required": ["tool", "digest"],
}


class FixedClock:
    def __init__(self, now: datetime = T0) -> None:
        self._now = now

    def now(self) -> datetime:
        return self._now

    async def sleep(self, delay: timedelta) -> None:
        raise AssertionError("adapters never sleep")


def options(**changes: Any) -> AdapterOptions:
    return AdapterOptions(clock=FixedClock(), **changes)


def operation(
    tool: str = "generate_report",
    *,
    protocol: Protocol = Protocol.MCP_2025_11_25,
    task_id: str | None = None,
    status: ServerStatus | None = None,
    epoch: int = 3,
) -> Operation:
    request = CallRequest(
        call_node_id=CallNodeId("node-1"),
        tool=ToolRef(name=tool, version="1", descriptor_version="1"),
        arguments={"report": "q3"},
        principal=Principal("alice"),
    )
    op = new_operation(
        request,
        operation_id=OperationId("op-1"),
        protocol=protocol,
        adapter_version="test",
        server=URL,
        epoch=Epoch(epoch),
        now=T0,
    )
    return replace(op, task_id=TaskId(task_id) if task_id else None, server_status=status)


# ----------------------------------------------------------------------------------------- wire


def task_json(task_id: str = "t-1", status: str = "working", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "taskId": task_id,
        "status": status,
        "createdAt": CREATED_AT,
        "lastUpdatedAt": CREATED_AT,
        "ttl": 60_000,
        "pollInterval": 500,
    }
    body.update(extra)
    return body


def tool_result(
    *, is_error: bool = False, related: str | None = None, epoch: int | None = None, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "content": [{"type": "text", "text": "done"}],
        "structuredContent": {"tool": "generate_report", "digest": "sha256:abc"},
        "isError": is_error,
    }
    meta: dict[str, Any] = {}
    if related is not None:
        meta["io.modelcontextprotocol/related-task"] = {"taskId": related}
    if epoch is not None:
        meta["dev.finality/epoch"] = epoch
    if meta:
        body["_meta"] = meta
    body.update(extra)
    return body


def tools_json(*specs: tuple[str, str | None]) -> list[dict[str, Any]]:
    out = []
    for name, support in specs:
        tool: dict[str, Any] = {
            "name": name,
            "inputSchema": {"type": "object"},
            "outputSchema": OUTPUT_SCHEMA,
        }
        if support is not None:
            tool["execution"] = {"taskSupport": support}
        out.append(tool)
    return out


def init_result(
    *, tasks: bool = True, idempotency: bool = False, version: str = "2025-11-25"
) -> dict[str, Any]:
    caps: dict[str, Any] = {"tools": {"listChanged": False}}
    if idempotency:
        caps["tools"]["idempotency"] = {}
    if tasks:
        caps["tasks"] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
    return {"protocolVersion": version, "capabilities": caps, "serverInfo": {"name": "fake", "version": "1"}}


def sse_event(message: dict[str, Any]) -> bytes:
    return b"event: message\ndata: " + json.dumps(message).encode() + b"\n\n"


# ------------------------------------------------------------------------------------ responders

Responder = Callable[[dict[str, Any], http_kit.Request], http_kit.Response]


def result(body: dict[str, Any], *, headers: dict[str, str] | None = None) -> Responder:
    def respond(message: dict[str, Any], request: http_kit.Request) -> http_kit.Response:
        return http_kit.Response(
            200, json={"jsonrpc": "2.0", "id": message["id"], "result": body}, headers=headers
        )

    return respond


def error(code: int, text: str = "error", data: Any = None, *, status: int = 200) -> Responder:
    def respond(message: dict[str, Any], request: http_kit.Request) -> http_kit.Response:
        err: dict[str, Any] = {"code": code, "message": text}
        if data is not None:
            err["data"] = data
        return http_kit.Response(status, json={"jsonrpc": "2.0", "id": message["id"], "error": err})

    return respond


def sse(
    *before: dict[str, Any], final: dict[str, Any] | None = None, final_error: dict[str, Any] | None = None
) -> Responder:
    """An event stream: ``before`` messages (requests, notifications), then the reply if given."""

    def respond(message: dict[str, Any], request: http_kit.Request) -> http_kit.Response:
        chunks = [sse_event(m) for m in before]
        if final is not None:
            chunks.append(sse_event({"jsonrpc": "2.0", "id": message["id"], "result": final}))
        if final_error is not None:
            chunks.append(sse_event({"jsonrpc": "2.0", "id": message["id"], "error": final_error}))
        return http_kit.Response(200, content=b"".join(chunks), headers={"content-type": "text/event-stream"})

    return respond


def raw(status: int, content: bytes, content_type: str = "application/json", **headers: str) -> Responder:
    def respond(message: dict[str, Any], request: http_kit.Request) -> http_kit.Response:
        return http_kit.Response(status, content=content, headers={"content-type": content_type, **headers})

    return respond


def raises(exc: Exception) -> Responder:
    def respond(message: dict[str, Any], request: http_kit.Request) -> http_kit.Response:
        raise exc

    return respond


class BrokenStream(http_kit.AsyncByteStream):
    """Yields ``parts``, then fails the way a dropped connection does."""

    def __init__(self, *parts: bytes) -> None:
        self._parts = parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            yield part
        raise http_kit.RemoteProtocolError("peer closed connection without sending complete message body")


def broken(*parts: bytes, content_type: str = "text/event-stream") -> Responder:
    def respond(message: dict[str, Any], request: http_kit.Request) -> http_kit.Response:
        return http_kit.Response(200, stream=BrokenStream(*parts), headers={"content-type": content_type})

    return respond


def sequence(*responders: Responder) -> Responder:
    """Answer the n-th call with the n-th responder (the last one repeats)."""
    remaining = list(responders)

    def respond(message: dict[str, Any], request: http_kit.Request) -> http_kit.Response:
        current = remaining.pop(0) if len(remaining) > 1 else remaining[0]
        return current(message, request)

    return respond


# ------------------------------------------------------------------------------------ fake peers


@dataclass
class Sent:
    request: http_kit.Request
    body: Any

    @property
    def method(self) -> str | None:
        return self.body.get("method") if isinstance(self.body, dict) else None

    @property
    def params(self) -> dict[str, Any]:
        return self.body.get("params", {}) if isinstance(self.body, dict) else {}


@dataclass
class FakeMcp:
    """A JSON-RPC endpoint answering by method; notifications and responses get 202."""

    routes: dict[str, Responder] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)

    def on(self, method: str, responder: Responder) -> FakeMcp:
        self.routes[method] = responder
        return self

    def handler(self, request: http_kit.Request) -> http_kit.Response:
        body: Any = json.loads(request.content) if request.content else None
        self.sent.append(Sent(request, body))
        if request.method != "POST":
            return http_kit.Response(200)
        if "method" not in body or "id" not in body:
            return http_kit.Response(202)
        responder = self.routes.get(body["method"])
        if responder is None:
            return http_kit.Response(
                200,
                json={
                    "jsonrpc": "2.0",
                    "id": body["id"],
                    "error": {"code": -32601, "message": "Method not found"},
                },
            )
        return responder(body, request)

    def client(self) -> http_kit.MockClient:
        return http_kit.mock_client(self.handler)

    def calls(self, method: str) -> list[Sent]:
        return [s for s in self.sent if s.method == method]

    def responses(self) -> list[Sent]:
        """JSON-RPC responses we posted (answers to server requests)."""
        return [
            s for s in self.sent if isinstance(s.body, dict) and "method" not in s.body and "id" in s.body
        ]


def mcp_2025(
    *, tasks: bool = True, idempotency: bool = False, tools: list[dict[str, Any]] | None = None
) -> FakeMcp:
    """A fake 2025-11-25 server that has completed the handshake routes."""
    fake = FakeMcp()
    fake.on(
        "initialize",
        result(init_result(tasks=tasks, idempotency=idempotency), headers={"mcp-session-id": "s-1"}),
    )
    fake.on(
        "tools/list",
        result(
            {
                "tools": tools
                if tools is not None
                else tools_json(
                    ("generate_report", "optional"), ("quick_lookup", None), ("analyze_upload", "required")
                )
            }
        ),
    )
    return fake


HttpResponder = Callable[[http_kit.Request], http_kit.Response]


@dataclass
class FakeHttp:
    """A REST endpoint answering by (method, path)."""

    routes: dict[tuple[str, str], HttpResponder] = field(default_factory=dict)
    sent: list[http_kit.Request] = field(default_factory=list)

    def on(self, method: str, path: str, responder: HttpResponder) -> FakeHttp:
        self.routes[(method, path)] = responder
        return self

    def handler(self, request: http_kit.Request) -> http_kit.Response:
        self.sent.append(request)
        responder = self.routes.get((request.method, request.url.path))
        if responder is None:
            return http_kit.Response(
                404, json={"error": {"code": 404, "message": "no route", "status": "NOT_FOUND"}}
            )
        return responder(request)

    def client(self) -> http_kit.MockClient:
        return http_kit.mock_client(self.handler)


def reply_json(body: Any, status: int = 200, **headers: str) -> HttpResponder:
    def respond(request: http_kit.Request) -> http_kit.Response:
        return http_kit.Response(status, json=body, headers=headers)

    return respond
