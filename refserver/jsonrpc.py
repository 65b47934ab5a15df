"""JSON-RPC 2.0 framing shared by both MCP versions: parse one message, build replies. No task logic.

Malformed input never raises past this module as anything but ``RpcFault``, which carries the
JSON-RPC code and the HTTP status the transport should answer with.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import Response

from refserver.clock import pause
from refserver.wire import ABORT, GARBAGE_BODY, Abort, Delivery, EventStream, Reply, dumps, prefers_sse

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
# Server-defined range: used for the HTTP-level refusals (401, 429, 503) that still carry a JSON body.
SERVER_ERROR: Final = -32000

RequestId = str | int


class RpcFault(Exception):
    """A JSON-RPC error to send back; ``http_status`` is 200 unless the transport itself refuses."""

    def __init__(
        self,
        code: int,
        message: str,
        data: object = None,
        *,
        http_status: int = 200,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.http_status = http_status
        self.headers = dict(headers or {})

    def error(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out


@dataclass(frozen=True, slots=True)
class RpcRequest:
    id: RequestId
    method: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RpcNotification:
    method: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RpcResponse:
    """A client's answer to a request the server sent (an elicitation, here)."""

    id: RequestId
    result: object = None
    error: object = None


Message = RpcRequest | RpcNotification | RpcResponse


def _valid_id(value: object) -> bool:
    return isinstance(value, str | int) and not isinstance(value, bool)


def parse_message(body: bytes) -> Message:
    """Decode one JSON-RPC message.

    Raises:
        RpcFault: -32700 for bytes that are not JSON, -32600 for JSON that is not one valid message
            (batches included: Streamable HTTP since 2025-06-18 sends one message per POST).
    """
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RpcFault(PARSE_ERROR, f"Parse error: {exc}", http_status=400) from exc
    if isinstance(raw, list):
        raise RpcFault(
            INVALID_REQUEST, "Invalid Request: JSON-RPC batches are not supported", http_status=400
        )
    if not isinstance(raw, dict) or raw.get("jsonrpc") != "2.0":
        raise RpcFault(
            INVALID_REQUEST, "Invalid Request: expected an object with jsonrpc '2.0'", http_status=400
        )
    if "method" in raw:
        method = raw["method"]
        if not isinstance(method, str) or not method:
            raise RpcFault(
                INVALID_REQUEST, "Invalid Request: 'method' must be a non-empty string", http_status=400
            )
        params = raw.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            raise RpcFault(INVALID_REQUEST, "Invalid Request: 'params' must be an object", http_status=400)
        if "id" not in raw:
            return RpcNotification(method, params)
        if not _valid_id(raw["id"]):
            raise RpcFault(
                INVALID_REQUEST, "Invalid Request: 'id' must be a string or an integer", http_status=400
            )
        return RpcRequest(raw["id"], method, params)
    if "id" in raw and ("result" in raw or "error" in raw):
        if not _valid_id(raw["id"]):
            raise RpcFault(
                INVALID_REQUEST, "Invalid Request: 'id' must be a string or an integer", http_status=400
            )
        return RpcResponse(raw["id"], raw.get("result"), raw.get("error"))
    raise RpcFault(
        INVALID_REQUEST, "Invalid Request: neither a request, a notification nor a response", http_status=400
    )


def result_message(request_id: RequestId | None, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": dict(result)}


def error_message(request_id: RequestId | None, fault: RpcFault) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": fault.error()}


def fault_reply(request_id: RequestId | None, fault: RpcFault) -> Reply:
    return Reply(error_message(request_id, fault), fault.http_status, fault.headers or None)


def require_str(params: Mapping[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str) or not value:
        raise RpcFault(INVALID_PARAMS, f"Invalid params: '{name}' must be a non-empty string")
    return value


def optional_int(params: Mapping[str, Any], name: str, minimum: int = 0) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RpcFault(INVALID_PARAMS, f"Invalid params: '{name}' must be an integer >= {minimum}")
    return value


def meta_of(params: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = params.get("_meta", {})
    if meta is None:
        return {}
    if not isinstance(meta, Mapping):
        raise RpcFault(INVALID_PARAMS, "Invalid params: '_meta' must be an object")
    return meta


def epoch_of(meta: Mapping[str, Any], key: str) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RpcFault(INVALID_PARAMS, f"Invalid params: _meta[{key!r}] must be an integer")
    return value


def sse_chunks(message: Mapping[str, Any], delivery: Delivery) -> list[bytes | Abort]:
    """One SSE event carrying ``message``, delivered as ``delivery`` asks."""
    data = dumps(message)
    if delivery is Delivery.BROKEN:
        event = b"event: message\ndata: " + data + b"\n\n"
        return [event[: len(event) // 2], ABORT]
    if delivery is Delivery.TRUNCATED:
        data = data[: max(1, len(data) // 2)]
    elif delivery is Delivery.GARBAGE:
        data = GARBAGE_BODY
    return [b"event: message\ndata: " + data + b"\n\n"]


async def _stream(chunks: list[bytes | Abort], delay_s: float) -> AsyncIterator[bytes | Abort]:
    if delay_s > 0:
        await pause(delay_s)
    for chunk in chunks:
        yield chunk


def reply(
    request: Request,
    message: Mapping[str, Any],
    *,
    delivery: Delivery = Delivery.NORMAL,
    delay_s: float = 0.0,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """Answer with JSON, or with a one-event SSE stream when the client ranks SSE above JSON."""
    if prefers_sse(request):
        return EventStream(_stream(sse_chunks(message, delivery), delay_s), headers)
    return Reply(message, 200, headers, delivery=delivery, delay_s=delay_s)


__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "SERVER_ERROR",
    "Message",
    "RequestId",
    "RpcFault",
    "RpcNotification",
    "RpcRequest",
    "RpcResponse",
    "epoch_of",
    "error_message",
    "fault_reply",
    "meta_of",
    "optional_int",
    "parse_message",
    "reply",
    "require_str",
    "result_message",
    "sse_chunks",
]
