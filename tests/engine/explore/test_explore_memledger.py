"""The in-memory ledger keeps the DuckDB ledger's contract for the writes the executor makes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.errors import DuplicateOperation, LedgerError, ReceiptConflict, StaleWrite
from engine.ledger.memory import MemLedger
from engine.machine import step
from engine.model import (
    CancelRequested,
    Digest,
    Epoch,
    FetchStarted,
    LocalState,
    Operation,
    ResultVerified,
    Role,
    ServerStatus,
    StatusObserved,
    Submitted,
    TaskId,
    Transition,
    digest_of,
)
from engine.testing import EPOCH_START, make_operation

E = Epoch(1)
NOW = EPOCH_START
PAYLOAD: dict[str, object] = {"content": [{"type": "text", "text": "done"}]}


def created(ledger: MemLedger, node: str = "n1", role: Role = Role.PRIMARY) -> Operation:
    op = make_operation(node, role=role)
    stored, _ = ledger.create_operation(op, {"report": node})
    return stored


def working(ledger: MemLedger, node: str = "n1", task: str = "t1", role: Role = Role.PRIMARY) -> Operation:
    op = created(ledger, node, role)
    return ledger.apply(step(op, Submitted(TaskId(task), E), NOW))


def fetching(
    ledger: MemLedger, status: ServerStatus = ServerStatus.COMPLETED, role: Role = Role.PRIMARY
) -> Operation:
    op = working(ledger, role=role)
    op = ledger.apply(step(op, StatusObserved(TaskId("t1"), status, E), NOW))
    return ledger.apply(step(op, FetchStarted(E), NOW))


def test_create_operation_returns_the_existing_operation_of_a_call_node() -> None:
    """A second create for the same call node and request gives back the first, not a new row."""
    ledger = MemLedger()
    first = created(ledger)
    again, was_created = ledger.create_operation(make_operation("n1"), {"report": "n1"})
    assert (again, was_created) == (first, False)
    assert len(ledger.operations()) == 1


def test_create_operation_refuses_a_call_node_reused_for_another_request() -> None:
    """The same call node with different arguments is a DuplicateOperation."""
    ledger = MemLedger()
    created(ledger)
    with pytest.raises(DuplicateOperation):
        ledger.create_operation(make_operation("n1", arguments={"other": 1}), {"other": 1})


def test_apply_refuses_a_transition_computed_from_an_old_row_version() -> None:
    """Compare-and-swap: a transition whose ``before`` is stale raises StaleWrite."""
    ledger = MemLedger()
    op = working(ledger)
    ledger.apply(step(op, CancelRequested(1, "alice", "stop"), NOW))
    with pytest.raises(StaleWrite):
        ledger.apply(step(op, StatusObserved(TaskId("t1"), ServerStatus.COMPLETED, E), NOW))


def test_apply_binds_each_server_task_id_to_one_operation() -> None:
    """A task id already bound to another call node's operation is a DuplicateOperation."""
    ledger = MemLedger()
    working(ledger, "n1", "t1")
    other = created(ledger, "n2")
    with pytest.raises(DuplicateOperation):
        ledger.apply(step(other, Submitted(TaskId("t1"), E), NOW))
    assert ledger.get(other.operation_id) == other


def test_apply_never_writes_a_receipt() -> None:
    """A transition that carries an acceptance must go through accept_terminal."""
    ledger = MemLedger()
    op = fetching(ledger)
    t = step(op, ResultVerified(TaskId("t1"), ServerStatus.COMPLETED, digest_of(PAYLOAD), E), NOW)
    with pytest.raises(LedgerError):
        ledger.apply(t)


def test_accept_terminal_writes_one_receipt_and_one_outbox_entry() -> None:
    """The single acceptance point writes the receipt, the result and exactly one outbox entry."""
    ledger = MemLedger()
    op = fetching(ledger)
    t = step(op, ResultVerified(TaskId("t1"), ServerStatus.COMPLETED, digest_of(PAYLOAD), E), NOW)
    receipt = ledger.accept_terminal(t, PAYLOAD)
    assert ledger.receipts == {op.call_node_id: receipt}
    assert list(ledger.outbox) == [op.call_node_id]
    assert ledger.results[op.operation_id] == PAYLOAD


def test_accept_terminal_refuses_a_result_whose_digest_does_not_match() -> None:
    """check_acceptance runs inside accept_terminal: a payload with another digest is refused."""
    ledger = MemLedger()
    op = fetching(ledger)
    t = step(op, ResultVerified(TaskId("t1"), ServerStatus.COMPLETED, Digest("sha256:other"), E), NOW)
    with pytest.raises(ReceiptConflict) as refused:
        ledger.accept_terminal(t, PAYLOAD)
    assert refused.value.field == "result_digest"
    assert ledger.receipts == {}


def test_accept_terminal_refuses_a_second_receipt_for_a_call_node() -> None:
    """Even a row moved back out of its receipt state cannot get a second receipt."""
    ledger = MemLedger()
    op = fetching(ledger)
    verified = ResultVerified(TaskId("t1"), ServerStatus.COMPLETED, digest_of(PAYLOAD), E)
    ledger.accept_terminal(step(op, verified, NOW), PAYLOAD)
    accepted = ledger.get(op.operation_id)
    assert accepted is not None
    reopened = replace(accepted, state=LocalState.FETCHING_RESULT, row_version=accepted.row_version + 1)
    ledger.apply(Transition(accepted, reopened, FetchStarted(E), (), True, "reopened by a bug", NOW))
    with pytest.raises(ReceiptConflict) as refused:
        ledger.accept_terminal(step(reopened, verified, NOW), PAYLOAD)
    assert refused.value.field == "receipt"
    assert len(ledger.receipts) == 1


def test_a_shadow_operation_gets_a_receipt_but_no_outbox_entry() -> None:
    """Only primary operations release anything downstream."""
    ledger = MemLedger()
    op = fetching(ledger, role=Role.SHADOW)
    t = step(op, ResultVerified(TaskId("t1"), ServerStatus.COMPLETED, digest_of(PAYLOAD), E), NOW)
    ledger.accept_terminal(t, PAYLOAD)
    assert len(ledger.receipts) == 1
    assert ledger.outbox == {}
