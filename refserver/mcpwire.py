"""MCP wire pieces common to 2025-11-25 and 2026-07-28: tool listing, ``tools/call`` params, results.

Only shapes live here; which version says what (task or not, which error code) is decided by the
version modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from refserver.context import EPOCH_META_KEY
from refserver.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, RpcFault, epoch_of, meta_of, require_str
from refserver.sim import SimError, SimSpec, parse_sim, split_arguments
from refserver.task import ELICITATION_SCHEMA, InputRound
from refserver.tool import CATALOG, TaskSupport, ToolFailure, ToolOutput, ToolSpec

RELATED_TASK_KEY: Final = "io.modelcontextprotocol/related-task"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A validated ``tools/call``."""

    spec: ToolSpec
    arguments: Mapping[str, Any]
    echo: Mapping[str, Any]
    sim: SimSpec
    epoch: int | None
    key: str | None
    meta: Mapping[str, Any]


def parse_tool_call(params: Mapping[str, Any], *, time_scale: float, idempotency: bool) -> ToolCall:
    """Validate name, arguments, ``_sim``, the epoch and (when enabled) ``idempotencyKey``.

    Raises:
        RpcFault: -32602 for an unknown tool or malformed params.
    """
    name = require_str(params, "name")
    spec = CATALOG.get(name)
    if spec is None:
        raise RpcFault(INVALID_PARAMS, f"Unknown tool: {name}")
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise RpcFault(INVALID_PARAMS, "Invalid params: 'arguments' must be an object")
    echo, sim_raw = split_arguments(arguments)
    try:
        sim = parse_sim(sim_raw, default_duration_ms=spec.default_duration_ms, time_scale=time_scale)
    except SimError as exc:
        raise RpcFault(INVALID_PARAMS, f"Invalid params: {exc}") from exc
    meta = meta_of(params)
    key: str | None = None
    if idempotency and params.get("idempotencyKey") is not None:
        key = require_str(params, "idempotencyKey")
    return ToolCall(spec, arguments, echo, sim, epoch_of(meta, EPOCH_META_KEY), key, meta)


def tool_json(spec: ToolSpec, *, with_execution: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": spec.name,
        "title": spec.title,
        "description": spec.description,
        "inputSchema": spec.input_schema(),
        "outputSchema": spec.output_schema(),
        "annotations": {
            "readOnlyHint": not spec.side_effecting,
            "destructiveHint": spec.side_effecting,
            "idempotentHint": not spec.side_effecting,
            "openWorldHint": False,
        },
    }
    # "forbidden" is published by leaving the field out, as the spec's default.
    if with_execution and spec.task_support is not TaskSupport.FORBIDDEN:
        out["execution"] = {"taskSupport": spec.task_support.value}
    return out


def call_tool_result(output: ToolOutput, epoch: int | None, related_task_id: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": output.text}],
        "structuredContent": dict(output.structured),
        "isError": output.is_error,
    }
    meta: dict[str, Any] = {}
    if related_task_id is not None:
        meta[RELATED_TASK_KEY] = {"taskId": related_task_id}
    if epoch is not None:
        meta[EPOCH_META_KEY] = epoch
    if meta:
        result["_meta"] = meta
    return result


def failure_fault(failure: ToolFailure, epoch: int | None, related_task_id: str | None) -> RpcFault:
    """A tool failure as the JSON-RPC error the original call answers with (-32603)."""
    meta: dict[str, Any] = {}
    if related_task_id is not None:
        meta[RELATED_TASK_KEY] = {"taskId": related_task_id}
    if epoch is not None:
        meta[EPOCH_META_KEY] = epoch
    data: dict[str, Any] = {"reason": failure.reason}
    if meta:
        data["_meta"] = meta
    return RpcFault(INTERNAL_ERROR, failure.message, data)


def elicitation_params(round_: InputRound, related_task_id: str | None) -> dict[str, Any]:
    params: dict[str, Any] = {
        "mode": "form",
        "message": round_.message,
        "requestedSchema": dict(ELICITATION_SCHEMA),
    }
    if related_task_id is not None:
        params["_meta"] = {RELATED_TASK_KEY: {"taskId": related_task_id}}
    return params


def valid_elicit_result(value: object) -> Mapping[str, Any] | None:
    """The elicitation result if it has the required shape, else ``None``."""
    if not isinstance(value, Mapping) or value.get("action") not in ("accept", "decline", "cancel"):
        return None
    content = value.get("content")
    if content is not None and not isinstance(content, Mapping):
        return None
    return value


__all__ = [
    "RELATED_TASK_KEY",
    "ToolCall",
    "call_tool_result",
    "elicitation_params",
    "failure_fault",
    "parse_tool_call",
    "tool_json",
    "valid_elicit_result",
]
