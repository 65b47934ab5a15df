"""Operation <-> row conversions both ledger backends share: the record codec and every row they write.

The operation record codec; the rows of ``op_identity``, ``op_state``, ``transitions``, receipts,
results, the outbox, held outcomes and the rollout's state; and the records read back (receipts,
held outcomes). Pure functions over model values and plain rows: no database driver, no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from engine.errors import (
    InvalidRecord,
    LedgerCorrupt,
    LedgerError,
)
from engine.ledger.port import HeldOutcome, Json
from engine.model import (
    RECEIPT_STATES,
    SCHEMA_VERSION,
    AcceptTerminal,
    CallNodeId,
    Digest,
    Epoch,
    IdempotencyKey,
    LocalState,
    Operation,
    OperationId,
    Principal,
    Protocol,
    Receipt,
    Role,
    ServerStatus,
    TaskId,
    ToolRef,
    Transition,
    canonical_json,
    digest_of,
)


def _json_text(value: object) -> str:
    """Canonical JSON that also takes instants (as ISO 8601)."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS).decode()


def event_detail(transition: Transition) -> str:
    """The event's fields as canonical JSON (sorted keys), for the append-only log.

    orjson serialises the slotted event dataclasses directly; on the group-commit hot path this
    is an order of magnitude cheaper than ``json`` plus ``asdict``.
    """
    return orjson.dumps(transition.event, option=orjson.OPT_SORT_KEYS).decode()


def _refuse_receipt_state(t: Transition) -> None:
    if any(isinstance(e, AcceptTerminal) for e in t.effects) or (
        t.after.state in RECEIPT_STATES and t.before.state not in RECEIPT_STATES
    ):
        raise LedgerError("a transition to a receipt state goes through accept_terminal, never apply")


def operation_to_record(op: Operation) -> dict[str, object]:
    """The flat ``toolOperation.v1`` record (the shape the ``operations`` view has)."""
    return {
        "operation_id": op.operation_id,
        "call_node_id": op.call_node_id,
        "role": op.role.value,
        "request_digest": op.request_digest,
        "tool_name": op.tool.name,
        "tool_version": op.tool.version,
        "descriptor_version": op.tool.descriptor_version,
        "side_effects": op.tool.side_effects,
        "principal": op.principal,
        "protocol": op.protocol.value,
        "adapter_version": op.adapter_version,
        "server": op.server,
        "idempotency_key": op.idempotency_key,
        "task_id": op.task_id,
        "poll_cursor": op.poll_cursor,
        "server_status": op.server_status.value if op.server_status else None,
        "input_round": op.input_round,
        "answered_round": op.answered_round,
        "input_request_key": op.input_request_key,
        "cancel_generation": op.cancel_generation,
        "cancel_requested_at": op.cancel_requested_at,
        "expires_at": op.expires_at,
        "result_digest": op.result_digest,
        "result_held": op.result_held,
        "effect_reconciliation_required": op.effect_reconciliation_required,
        "submit_attempts": op.submit_attempts,
        "state": op.state.value,
        "epoch": op.epoch,
        "row_version": op.row_version,
        "schema_version": op.schema_version,
        "created_at": op.created_at,
        "updated_at": op.updated_at,
    }


REQUIRED_RECORD_FIELDS: Final[tuple[str, ...]] = (
    "operation_id",
    "call_node_id",
    "role",
    "request_digest",
    "tool_name",
    "tool_version",
    "descriptor_version",
    "side_effects",
    "principal",
    "protocol",
    "adapter_version",
    "server",
    "idempotency_key",
    "state",
    "epoch",
    "created_at",
    "updated_at",
    "row_version",
    "schema_version",
)
"""Fields a ``toolOperation.v1`` record cannot lack; the others default (counters 0, ids absent)."""


def _as_dt(value: object, name: str) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError as exc:
            raise InvalidRecord(f"field {name!r} is not an ISO 8601 instant: {value!r}") from exc
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    raise InvalidRecord(f"field {name!r} is not an instant: {value!r}")


def operation_from_record(record: dict[str, object]) -> Operation:
    """Rebuild an ``Operation`` from its flat record.

    Raises:
        InvalidRecord: a required field is missing or malformed (all missing fields are named),
            or the record is of another schema version.
    """
    missing = [n for n in REQUIRED_RECORD_FIELDS if record.get(n) is None]
    if missing:
        raise InvalidRecord(f"operation record is missing required fields: {', '.join(missing)}")
    if record["schema_version"] != SCHEMA_VERSION:
        raise InvalidRecord(
            f"operation record has schema {record['schema_version']!r}, expected {SCHEMA_VERSION!r}"
        )
    try:
        created_at = _as_dt(record["created_at"], "created_at")
        updated_at = _as_dt(record["updated_at"], "updated_at")
        assert created_at is not None
        assert updated_at is not None
        server_status = record.get("server_status")
        return Operation(
            operation_id=OperationId(str(record["operation_id"])),
            call_node_id=CallNodeId(str(record["call_node_id"])),
            request_digest=Digest(str(record["request_digest"])),
            tool=ToolRef(
                name=str(record["tool_name"]),
                version=str(record["tool_version"]),
                descriptor_version=str(record["descriptor_version"]),
                side_effects=bool(record["side_effects"]),
            ),
            principal=Principal(str(record["principal"])),
            protocol=Protocol(str(record["protocol"])),
            adapter_version=str(record["adapter_version"]),
            server=str(record["server"]),
            idempotency_key=IdempotencyKey(str(record["idempotency_key"])),
            state=LocalState(str(record["state"])),
            epoch=Epoch(int(str(record["epoch"]))),
            created_at=created_at,
            updated_at=updated_at,
            role=Role(str(record["role"])),
            task_id=TaskId(str(record["task_id"])) if record.get("task_id") is not None else None,
            poll_cursor=str(record["poll_cursor"]) if record.get("poll_cursor") is not None else None,
            server_status=ServerStatus(str(server_status)) if server_status is not None else None,
            input_round=int(str(record.get("input_round") or 0)),
            answered_round=int(str(record.get("answered_round") or 0)),
            input_request_key=(
                str(record["input_request_key"]) if record.get("input_request_key") is not None else None
            ),
            cancel_generation=int(str(record.get("cancel_generation") or 0)),
            cancel_requested_at=_as_dt(record.get("cancel_requested_at"), "cancel_requested_at"),
            expires_at=_as_dt(record.get("expires_at"), "expires_at"),
            result_digest=Digest(str(record["result_digest"]))
            if record.get("result_digest") is not None
            else None,
            result_held=bool(record.get("result_held") or False),
            effect_reconciliation_required=bool(record.get("effect_reconciliation_required") or False),
            submit_attempts=int(str(record.get("submit_attempts") or 0)),
            row_version=int(str(record["row_version"])),
            schema_version=str(record["schema_version"]),
        )
    except ValueError as exc:
        raise InvalidRecord(f"operation record has a malformed field: {exc}") from exc


def _state_row(op: Operation, expected_version: int, expected_cancel: int) -> list[object]:
    return [
        op.operation_id,
        op.state.value,
        op.server_status.value if op.server_status else None,
        op.task_id,
        op.poll_cursor,
        op.input_round,
        op.answered_round,
        op.input_request_key,
        op.cancel_generation,
        op.cancel_requested_at,
        op.expires_at,
        op.result_digest,
        op.result_held,
        op.effect_reconciliation_required,
        op.submit_attempts,
        op.epoch,
        op.row_version,
        op.updated_at,
        expected_version,
        expected_cancel,
    ]


def _transition_row(t: Transition) -> list[object]:
    return [
        t.after.operation_id,
        t.after.call_node_id,
        t.before.state.value,
        t.after.state.value,
        type(t.event).__name__,
        event_detail(t),
        t.reason,
        t.accepted,
        t.after.epoch,
        t.after.row_version,
        t.at,
    ]


def _string_list(value: object) -> list[str]:
    if not isinstance(value, list | tuple):
        raise InvalidRecord(f"expected a list of strings, got {value!r}")
    return [str(v) for v in value]


def require_new(op: Operation) -> None:
    """Refuse an operation that is not new (SUBMITTING at row version 0)."""
    if op.state is not LocalState.SUBMITTING or op.row_version != 0:
        raise InvalidRecord("a new operation starts in SUBMITTING at row version 0")


def identity_row(op: Operation, arguments: Json) -> list[object]:
    """The operation's ``op_identity`` row (written once)."""
    return [
        op.operation_id,
        op.call_node_id,
        op.role.value,
        op.request_digest,
        op.tool.name,
        op.tool.version,
        op.tool.descriptor_version,
        op.tool.side_effects,
        op.principal,
        op.protocol.value,
        op.adapter_version,
        op.server,
        op.idempotency_key,
        canonical_json(arguments),
        op.schema_version,
        op.created_at,
    ]


def created_row(op: Operation) -> list[object]:
    """The ``transitions`` row (without ``seq``) that records a new operation before its submission."""
    return [
        op.operation_id,
        op.call_node_id,
        None,
        op.state.value,
        "Created",
        canonical_json({"idempotency_key": op.idempotency_key}),
        "operation recorded before submission",
        True,
        op.epoch,
        op.row_version,
        op.created_at,
    ]


@dataclass(frozen=True, slots=True)
class AcceptanceRows:
    """Every row one acceptance writes: the operation's state, its transition, the receipt, and
    (for an accepted result) the stored result and (for a primary operation) one ready outbox row."""

    state: list[object]
    transition: list[object]
    receipt: list[object]
    result: list[object] | None
    outbox: list[object] | None


def acceptance_rows(
    current: Operation, t: Transition, payload: Json | None, receipt: Receipt
) -> AcceptanceRows:
    """The rows of an acceptance ``engine.acceptance.check_acceptance`` allowed against ``current``.

    A shadow operation's receipt never reaches the outbox; a payload is stored (and sent on) only
    for an ACCEPTED result.
    """
    body = canonical_json(payload) if payload is not None else None
    accepted = t.after.state is LocalState.ACCEPTED
    return AcceptanceRows(
        state=_state_row(t.after, current.row_version, current.cancel_generation),
        transition=_transition_row(t),
        receipt=[
            receipt.call_node_id,
            receipt.operation_id,
            receipt.request_digest,
            receipt.task_id,
            receipt.tool_version,
            receipt.epoch,
            receipt.cancel_generation,
            receipt.status.value,
            receipt.result_digest,
            receipt.cancel_evidence,
            current.role.value,
            receipt.accepted_at,
        ],
        result=(
            [current.operation_id, receipt.result_digest, receipt.status.value, body, receipt.accepted_at]
            if body is not None and accepted
            else None
        ),
        outbox=(
            [
                receipt.call_node_id,
                receipt.operation_id,
                "ready",
                receipt.status.value,
                receipt.result_digest,
                body if accepted else None,
                receipt.accepted_at,
            ]
            if current.role is Role.PRIMARY
            else None
        ),
    )


def audit_row(op: Operation, kind: str, payload: Json | None, at: datetime) -> list[object]:
    """A ``receipt_audit`` row: something read after the terminal, beside the receipt."""
    return [
        op.call_node_id,
        op.operation_id,
        kind,
        digest_of(payload) if payload is not None else None,
        canonical_json(payload) if payload is not None else None,
        at,
    ]


def held_rows(items: Sequence[tuple[str, HeldOutcome]]) -> list[list[object]]:
    """``held_outcomes`` rows, one per operation: a later copy replaces an earlier one."""
    latest = dict(items)
    return [
        [
            operation_id,
            held.status,
            held.digest,
            canonical_json(held.payload),
            held.task_id,
            held.epoch_echo,
            held.held_at,
        ]
        for operation_id, held in latest.items()
    ]


def held_from_row(operation_id: str, row: Sequence[Any]) -> HeldOutcome:
    """A held outcome from its ``status, digest, payload, task_id, epoch_echo, held_at`` row."""
    payload = json.loads(str(row[2]))
    if not isinstance(payload, dict):
        raise LedgerCorrupt(f"held outcome of {operation_id} is not a JSON object")
    return HeldOutcome(
        status=str(row[0]),
        digest=str(row[1]),
        payload=payload,
        task_id=row[3],
        epoch_echo=int(row[4]) if row[4] is not None else None,
        held_at=_as_dt(row[5], "held_at") or datetime.min.replace(tzinfo=UTC),
    )


def receipt_from_row(row: Sequence[Any]) -> Receipt:
    """A receipt from its row in ``engine.ledger.sql.RECEIPT_OF_CALL_NODE``'s column order."""
    return Receipt(
        call_node_id=CallNodeId(row[0]),
        operation_id=OperationId(row[1]),
        request_digest=Digest(row[2]),
        task_id=TaskId(row[3]) if row[3] is not None else None,
        tool_version=str(row[4]),
        epoch=Epoch(int(row[5])),
        cancel_generation=int(row[6]),
        status=ServerStatus(row[7]),
        result_digest=Digest(row[8]) if row[8] is not None else None,
        accepted_at=_as_dt(row[9], "accepted_at") or datetime.min.replace(tzinfo=UTC),
        cancel_evidence=row[10],
    )


def rollout_state_row(event: dict[str, object], state: dict[str, object]) -> list[object]:
    """The ``rollout_state`` columns after ``id``: the new state, with the event as the chain head."""
    return [
        state["stage"],
        state["canary_bp"],
        state["salt"],
        _json_text(_string_list(state["shadow_tools"])),
        _json_text(_string_list(state["disabled_protocols"])),
        state["epoch"],
        event["seq"],
        event["hash"],
        event["recorded_at"],
    ]


__all__ = [
    "REQUIRED_RECORD_FIELDS",
    "AcceptanceRows",
    "acceptance_rows",
    "audit_row",
    "created_row",
    "event_detail",
    "held_from_row",
    "held_rows",
    "identity_row",
    "operation_from_record",
    "operation_to_record",
    "receipt_from_row",
    "require_new",
    "rollout_state_row",
]
