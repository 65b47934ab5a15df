"""The rule of the single acceptance point, apart from any database: may this receipt be written?

``check_acceptance`` is what every ledger backend runs inside its ``accept_terminal`` transaction,
against the row it just read. Pure: no I/O.
"""

from __future__ import annotations

from engine.errors import LedgerError, ReceiptConflict, StaleWrite
from engine.model import (
    RECEIPT_STATES,
    AcceptTerminal,
    LocalState,
    Operation,
    Receipt,
    ServerStatus,
    Transition,
    digest_of,
)

Json = dict[str, object]


def receipt_of(transition: Transition) -> Receipt:
    """The receipt a transition asks to write.

    Raises:
        LedgerError: the transition carries no (or more than one) acceptance, or was rejected.
    """
    accepts = [e for e in transition.effects if isinstance(e, AcceptTerminal)]
    if len(accepts) != 1 or not transition.accepted:
        raise LedgerError("accept_terminal needs a transition carrying exactly one AcceptTerminal effect")
    if transition.after.state not in RECEIPT_STATES:
        raise LedgerError(f"accept_terminal cannot move an operation to {transition.after.state}")
    return accepts[0].receipt


def check_acceptance(current: Operation | None, transition: Transition, payload: Json | None) -> Receipt:
    """Match the receipt against the ledger's current row; return it if every field agrees.

    Matches call node, request digest, operation id, task id, tool version, execution epoch,
    cancel generation, terminal status and, for an accepted result, the digest of ``payload``.

    Raises:
        StaleWrite: the row moved since the transition was computed.
        ReceiptConflict: a field does not match (the field is named).
    """
    receipt = receipt_of(transition)
    if current is None:
        raise ReceiptConflict(receipt.call_node_id, "operation_id", None, receipt.operation_id)
    if current.row_version != transition.before.row_version:
        raise StaleWrite(current.operation_id, transition.before.row_version)
    cancelled = transition.after.state is LocalState.CANCELLED_ACCEPTED
    checks: list[tuple[str, object, object]] = [
        ("call_node_id", current.call_node_id, receipt.call_node_id),
        ("request_digest", current.request_digest, receipt.request_digest),
        ("operation_id", current.operation_id, receipt.operation_id),
        ("task_id", current.task_id, receipt.task_id),
        ("tool_version", current.tool.version, receipt.tool_version),
        ("epoch", current.epoch, receipt.epoch),
        ("cancel_generation", current.cancel_generation, receipt.cancel_generation),
        ("status", ServerStatus.CANCELLED if cancelled else current.server_status, receipt.status),
    ]
    if cancelled:
        if current.state not in (LocalState.CANCEL_REQUESTED, LocalState.UNKNOWN):
            raise ReceiptConflict(receipt.call_node_id, "state", current.state, "CANCEL_REQUESTED")
    else:
        if current.state is not LocalState.FETCHING_RESULT:
            raise ReceiptConflict(receipt.call_node_id, "state", current.state, "FETCHING_RESULT")
        checks.append(
            ("result_digest", digest_of(payload) if payload is not None else None, receipt.result_digest)
        )
    for name, have, got in checks:
        if have != got:
            raise ReceiptConflict(receipt.call_node_id, name, have, got)
    return receipt


__all__ = [
    "Json",
    "check_acceptance",
    "receipt_of",
]
