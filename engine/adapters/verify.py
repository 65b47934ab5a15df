"""Result verification: the checks a terminal outcome must pass before an adapter hands it over.

Pure: no I/O, no clock. Parses the payload with the wire model of its protocol version, binds it to
the operation's task, caps its size and validates ``structuredContent`` against the tool's
``outputSchema``. Failure is ``ProtocolViolation`` with the reason; it never repairs a payload.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from enum import StrEnum

import jsonschema
from jsonschema.exceptions import SchemaError
from jsonschema.exceptions import ValidationError as SchemaValidationError
from mcp_types import _v2025_11_25 as v2025
from mcp_types import _v2026_07_28 as v2026
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.adapters.base import Json, Outcome
from engine.errors import ProtocolViolation
from engine.model import ServerStatus, TaskId, canonical_json, digest_of

RELATED_TASK_META = "io.modelcontextprotocol/related-task"
EPOCH_META = "dev.finality/epoch"


class PayloadKind(StrEnum):
    """What a terminal payload is, which decides the model it must parse with."""

    MCP_2025_TOOL_RESULT = "mcp-2025-11-25/CallToolResult"
    MCP_2026_TOOL_RESULT = "mcp-2026-07-28/CallToolResult"
    JSONRPC_ERROR = "jsonrpc/error"
    TASK_RECORD = "task-record"
    """A cancelled task's own record: the only outcome a cancel leaves when no result was stored."""
    AIP_RESPONSE = "aip-151/response"
    AIP_STATUS = "aip-151/google.rpc.Status"


class RpcStatus(BaseModel):
    """``google.rpc.Status`` as JSON (AIP-193)."""

    model_config = ConfigDict(extra="allow", strict=True)
    code: int = 0
    message: str = ""
    details: list[dict[str, object]] = Field(default_factory=list)


class _ErrorObject(BaseModel):
    model_config = ConfigDict(extra="allow")
    code: int
    message: str


class _TaskRecord(BaseModel):
    model_config = ConfigDict(extra="allow")
    task_id: str = Field(alias="taskId")
    status: str


_MODELS: dict[PayloadKind, type[BaseModel]] = {
    PayloadKind.MCP_2025_TOOL_RESULT: v2025.CallToolResult,
    PayloadKind.MCP_2026_TOOL_RESULT: v2026.CallToolResult,
    PayloadKind.JSONRPC_ERROR: _ErrorObject,
    PayloadKind.TASK_RECORD: _TaskRecord,
    PayloadKind.AIP_STATUS: RpcStatus,
}

_TOOL_RESULTS = frozenset({PayloadKind.MCP_2025_TOOL_RESULT, PayloadKind.MCP_2026_TOOL_RESULT})


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the fetched outcome must belong to and fit."""

    task_id: TaskId | None
    """The operation's task id; ``None`` when the call ran without a task."""
    max_result_bytes: int
    output_schema: Json | None = None
    """The tool's declared ``outputSchema``; a completed tool result must match it."""


def summarize(exc: ValidationError) -> str:
    """The first validation problem, as ``field.path: message``."""
    err = exc.errors()[0]
    where = ".".join(str(part) for part in err["loc"]) or "(root)"
    return f"{where}: {err['msg']}"


def _meta_of(payload: Json) -> dict[str, object] | None:
    """The payload's ``_meta``; for a JSON-RPC error object, the one inside ``data``."""
    meta = payload.get("_meta")
    if isinstance(meta, dict):
        return meta
    data = payload.get("data")
    inner = data.get("_meta") if isinstance(data, dict) else None
    return inner if isinstance(inner, dict) else None


def related_task_of(payload: Json) -> str | None:
    """``_meta["io.modelcontextprotocol/related-task"].taskId`` when the payload carries it."""
    related = (_meta_of(payload) or {}).get(RELATED_TASK_META)
    if not isinstance(related, dict):
        return None
    task_id = related.get("taskId")
    return task_id if isinstance(task_id, str) else None


def epoch_echo_of(payload: Json) -> int | None:
    """``_meta["dev.finality/epoch"]`` when the server echoed the executor's epoch."""
    echo = (_meta_of(payload) or {}).get(EPOCH_META)
    return echo if isinstance(echo, int) and not isinstance(echo, bool) else None


def verify_outcome(
    status: ServerStatus,
    payload: Json,
    kind: PayloadKind,
    expected: Expectation,
    *,
    reported_task_id: str | None = None,
    related_task_id: str | None = None,
    epoch_echo: int | None = None,
) -> Outcome:
    """Check a terminal outcome and wrap it with its digest.

    Args:
        status: the terminal status the adapter read for this outcome.
        payload: the outcome exactly as the server sent it.
        kind: which wire shape it must have.
        expected: the operation's task id, the size cap and the tool's output schema.
        reported_task_id: the task id the reply itself names (task record, operation name).
        related_task_id: the related-task metadata's task id, where the version has it.
        epoch_echo: the execution epoch the server echoed back.

    Raises:
        ProtocolViolation: the payload is not terminal, too large, foreign, malformed, or does not
            match the output schema.
    """
    if not status.terminal:
        raise ProtocolViolation(f"an outcome needs a terminal status, got {status}")
    size = len(canonical_json(payload).encode())
    if size > expected.max_result_bytes:
        raise ProtocolViolation(f"result is {size} bytes, over the {expected.max_result_bytes} byte limit")
    for label, named in (("reply", reported_task_id), ("related-task metadata", related_task_id)):
        if named is not None and expected.task_id is not None and named != expected.task_id:
            raise ProtocolViolation(
                f"result belongs to another task: {label} names {named!r}, this operation is {expected.task_id!r}"
            )
    _check_shape(kind, payload)
    if kind in _TOOL_RESULTS and status is ServerStatus.COMPLETED and payload.get("isError") is not True:
        _check_output_schema(payload, expected.output_schema)
    return Outcome(
        status=status,
        payload=payload,
        digest=digest_of(payload),
        task_id=expected.task_id,
        epoch_echo=epoch_echo,
    )


def error_outcome(payload: Json, expected: Expectation) -> Outcome:
    """A JSON-RPC error answering ``tools/call``: ``FAILED`` with the error object as its payload, verified.

    Both MCP versions answer a refused call (before any work) this way; the error is kept as sent,
    because the outcome digest is over it.
    """
    return verify_outcome(
        ServerStatus.FAILED, payload, PayloadKind.JSONRPC_ERROR, expected, epoch_echo=epoch_echo_of(payload)
    )


def _check_shape(kind: PayloadKind, payload: Json) -> None:
    if kind is PayloadKind.AIP_RESPONSE:
        # An AIP-151 response is whatever message the method declares; JSON object is all we know.
        return
    model = _MODELS[kind]
    body = payload
    if kind is PayloadKind.MCP_2026_TOOL_RESULT and "resultType" not in payload:
        # 2026-07-28: an absent resultType MUST be read as "complete" (servers of older versions).
        body = {**payload, "resultType": "complete"}
    try:
        model.model_validate(body)
    except ValidationError as exc:
        raise ProtocolViolation(f"result is not a valid {kind}: {summarize(exc)}") from exc
    if kind is PayloadKind.MCP_2026_TOOL_RESULT and body["resultType"] != "complete":
        raise ProtocolViolation(f"tool result has resultType {body['resultType']!r}, expected 'complete'")


@functools.lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.protocols.Validator:
    """The checked validator for one schema (checking a schema costs ~20 times validating against it)."""
    schema = json.loads(schema_json)
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator_class.check_schema(schema)
    except SchemaError as exc:
        raise ProtocolViolation(f"the tool's outputSchema is not a valid JSON Schema: {exc.message}") from exc
    return validator_class(schema)


def _check_output_schema(payload: Json, schema: Json | None) -> None:
    if schema is None:
        return
    if "structuredContent" not in payload:
        raise ProtocolViolation("the tool declares an outputSchema but the result has no structuredContent")
    validator = _validator(canonical_json(schema))
    try:
        validator.validate(payload["structuredContent"])
    except SchemaValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ProtocolViolation(
            f"structuredContent does not match the tool's outputSchema at {where}: {exc.message}"
        ) from exc


__all__ = [
    "EPOCH_META",
    "RELATED_TASK_META",
    "Expectation",
    "PayloadKind",
    "RpcStatus",
    "epoch_echo_of",
    "error_outcome",
    "related_task_of",
    "summarize",
    "verify_outcome",
]
