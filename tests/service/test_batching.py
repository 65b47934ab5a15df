"""The service's group-committing ledger: writes wait for the tick's flush, refusals come back, order holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.errors import LedgerError, ReceiptConflict, StaleWrite
from engine.ledger.duckdb import Ledger
from engine.machine import step
from engine.model import (
    Epoch,
    EpochRaised,
    FetchStarted,
    LocalState,
    Operation,
    ResultVerified,
    ServerStatus,
    StatusObserved,
    Submitted,
    TaskId,
    digest_of,
)
from engine.testing import EPOCH_START, make_operation
from service.batching import BatchingLedger

E = Epoch(1)
NOW = EPOCH_START
PAYLOAD: dict[str, object] = {"content": [{"type": "text", "text": "report"}], "isError": False}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[BatchingLedger]:
    with Ledger.open(tmp_path / "ledger.duckdb") as inner:
        yield BatchingLedger(inner)


def fetching(store: BatchingLedger, node: str) -> Operation:
    """An operation whose result is being fetched, built through the buffered ledger and flushed."""
    op, _ = store.create_operation(make_operation(node), {"report": node})
    task = TaskId(f"task-{node}")
    for event in (Submitted(task, E), StatusObserved(task, ServerStatus.COMPLETED, E), FetchStarted(E)):
        op = store.apply(step(op, event, NOW))
    assert store.flush() == []
    return op


def test_acceptance_waits_for_the_flush_and_then_writes_receipt_and_outbox_together(
    store: BatchingLedger,
) -> None:
    op = fetching(store, "n1")
    t = step(op, ResultVerified(op.task_id, ServerStatus.COMPLETED, digest_of(PAYLOAD), E), NOW)
    receipt = store.accept_terminal(t, PAYLOAD)
    assert receipt.call_node_id == op.call_node_id
    assert store.count("receipts") == 0
    assert store.pending == 1
    overlay = store.get(op.operation_id)
    assert overlay is not None
    assert overlay.state is LocalState.ACCEPTED
    assert store.flush() == []
    assert store.count("receipts") == 1
    assert store.count("outbox") == 1
    assert store.flushed_acceptances == 1


def test_buffered_transitions_commit_before_the_acceptance_that_follows_them(store: BatchingLedger) -> None:
    op, _ = store.create_operation(make_operation("n2"), {"report": "n2"})
    task = TaskId("task-n2")
    for event in (Submitted(task, E), StatusObserved(task, ServerStatus.COMPLETED, E), FetchStarted(E)):
        op = store.apply(step(op, event, NOW))
    t = step(op, ResultVerified(task, ServerStatus.COMPLETED, digest_of(PAYLOAD), E), NOW)
    store.accept_terminal(t, PAYLOAD)
    assert store.flush() == []  # the chain and its acceptance in one flush
    assert store.receipt(op.call_node_id) is not None


def test_a_refused_acceptance_comes_back_from_the_flush_and_writes_nothing(store: BatchingLedger) -> None:
    op = fetching(store, "n3")
    wrong: dict[str, object] = {"content": [], "isError": False}
    t = step(op, ResultVerified(op.task_id, ServerStatus.COMPLETED, digest_of(PAYLOAD), E), NOW)
    store.accept_terminal(t, wrong)  # the payload does not match the verified digest
    refused = store.flush()
    assert len(refused) == 1
    assert isinstance(refused[0][1].error, ReceiptConflict)
    assert store.count("receipts") == 0
    assert store.count("outbox") == 0


def test_an_acceptance_overtaken_by_a_person_action_is_refused_as_stale(store: BatchingLedger) -> None:
    op = fetching(store, "n4")
    t = step(op, ResultVerified(op.task_id, ServerStatus.COMPLETED, digest_of(PAYLOAD), E), NOW)
    store.accept_terminal(t, PAYLOAD)
    with store.immediate():  # the buffered acceptance commits first, then the person's write
        pass
    assert store.count("receipts") == 1
    op2 = fetching(store, "n5")
    t2 = step(op2, ResultVerified(op2.task_id, ServerStatus.COMPLETED, digest_of(PAYLOAD), E), NOW)
    store.accept_terminal(t2, PAYLOAD)
    moved = step(op2, EpochRaised(Epoch(2), "ops"), NOW)
    Ledger.apply(store, moved)  # a write behind the buffer's back, as another path would make it
    refused = store.flush()
    assert len(refused) == 1
    assert isinstance(refused[0][1].error, StaleWrite)
    assert store.receipt(op2.call_node_id) is None


def test_a_transition_that_is_not_an_acceptance_is_refused_at_once(store: BatchingLedger) -> None:
    op, _ = store.create_operation(make_operation("n6"), {"report": "n6"})
    with pytest.raises(LedgerError):
        store.accept_terminal(step(op, Submitted(TaskId("t"), E), NOW), None)
    assert store.pending == 0
