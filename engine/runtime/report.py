"""The one JSON object that describes a call node's operation: what ``finality call``/``show`` print
and what the control API returns. Reads the ledger only; decides nothing."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Final

from engine.ledger.rows import created_row
from engine.model import RECEIPT_STATES, Operation, Receipt, ServerStatus

Json = dict[str, object]

if TYPE_CHECKING:  # both ledgers (DuckDB, PostgreSQL) offer this port
    from engine.ledger.port import LedgerPort


def _iso(value: object) -> str | None:
    return value.isoformat() if isinstance(value, datetime) else None


def operation_report(ledger: LedgerPort, call_node_id: str) -> Json | None:
    """The operation object for a call node, or None if the ledger has none."""
    op = ledger.by_call_node(call_node_id)
    if op is None:
        return None
    receipt = ledger.receipt(call_node_id)
    result = None
    if receipt is not None and receipt.status is not ServerStatus.CANCELLED:
        result = ledger.result_payload(op.operation_id)
    return _report(op, receipt, result, ledger.transitions(op.operation_id))


def creation_report(op: Operation) -> Json:
    """``operation_report`` of an operation at row version 0, without reading the ledger.

    Every write moves the row version, so at version 0 the ledger holds the operation as it was
    created and nothing else: its one ``Created`` transition (``engine.ledger.rows.created_row``),
    no receipt, no result.
    """
    if op.row_version != 0:
        raise ValueError(f"{op.operation_id} has been written since its creation; read its report")
    created = dict(zip(_CREATED_COLUMNS, created_row(op), strict=True))
    return _report(op, None, None, [created])


_CREATED_COLUMNS: Final = (
    "operation_id",
    "call_node_id",
    "from_state",
    "to_state",
    "event",
    "detail",
    "cause",
    "accepted",
    "epoch",
    "row_version",
    "recorded_at",
)
"""``created_row``'s values, named as the ``transitions`` table names them."""


def _report(
    op: Operation, receipt: Receipt | None, result: Json | None, transitions: list[dict[str, object]]
) -> Json:
    return {
        "call_node": op.call_node_id,
        "operation_id": op.operation_id,
        "task_id": op.task_id,
        "protocol": op.protocol.value,
        "server": op.server,
        "tool": op.tool.name,
        "principal": op.principal,
        "state": op.state.value,
        "terminal": op.state in RECEIPT_STATES,
        "server_status": op.server_status.value if op.server_status else None,
        "idempotency_key": op.idempotency_key,
        "epoch": op.epoch,
        "cancel_generation": op.cancel_generation,
        "input_round": op.input_round,
        "receipt": None
        if receipt is None
        else {
            "status": receipt.status.value,
            "result_digest": receipt.result_digest,
            "epoch": receipt.epoch,
            "cancel_generation": receipt.cancel_generation,
            "task_id": receipt.task_id,
            "accepted_at": _iso(receipt.accepted_at),
            "cancel_evidence": receipt.cancel_evidence,
        },
        "result": result,
        "effect_reconciliation_required": op.effect_reconciliation_required,
        "transitions": [
            {
                "from": row["from_state"],
                "to": row["to_state"],
                "event": row["event"],
                "cause": row["cause"],
                "accepted": row["accepted"],
                "at": _iso(row["recorded_at"]),
            }
            for row in transitions
        ],
    }


__all__ = [
    "Json",
    "creation_report",
    "operation_report",
]
