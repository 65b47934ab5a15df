"""The executor's epoch decisions (``engine.runtime.epochs``), which the service and the explorer share."""

from __future__ import annotations

from dataclasses import replace

from engine.model import Epoch, LocalState, OperationId
from engine.runtime.epochs import adoption, behind, startup_epoch, to_advance, urgent
from engine.testing import EPOCH_START, make_operation

S = LocalState


def test_a_restarted_executor_runs_at_the_epoch_the_ledger_recorded_not_the_configured_one() -> None:
    """A rollback's epoch survives restarts; with none recorded the configured epoch holds."""
    assert startup_epoch(Epoch(1), 3) == Epoch(3)
    assert startup_epoch(Epoch(2), None) == Epoch(2)
    assert startup_epoch(Epoch(2), 2) == Epoch(2)


def test_every_live_operation_behind_the_epoch_is_adopted_even_one_epoch_behind() -> None:
    """Operations of an older epoch are adopted; current ones and receipts are left alone."""
    old = replace(make_operation("a", epoch=1), state=S.WORKING)
    current = replace(make_operation("b", epoch=2), state=S.WORKING)
    done = replace(make_operation("c", epoch=1), state=S.ACCEPTED)
    assert [op.operation_id for op in behind([old, current, done], Epoch(2))] == [old.operation_id]


def test_adoption_moves_the_operation_to_the_new_epoch_and_keeps_its_state() -> None:
    """EpochRaised through step: the state carries over, the epoch is the new one."""
    op = replace(make_operation("a", epoch=1), state=S.WORKING)
    t = adoption(op, Epoch(2), "test", EPOCH_START)
    assert t.accepted
    assert (t.after.epoch, t.after.state) == (Epoch(2), S.WORKING)


def test_a_value_from_before_a_rollback_is_replaced_by_the_ledgers_adopted_row() -> None:
    """An advance starts from the ledger's row when its value is of an older epoch, else from its own."""
    stale = replace(make_operation("a", epoch=1), state=S.WORKING)
    adopted = replace(stale, epoch=Epoch(2), row_version=stale.row_version + 1)
    rows = {stale.operation_id: adopted}

    def read(op_id: OperationId):  # type: ignore[no-untyped-def]
        return rows.get(op_id)

    assert to_advance(stale, Epoch(2), read) == adopted
    assert to_advance(adopted, Epoch(2), read) is adopted


def test_a_recorded_cancel_goes_ahead_of_routine_polls_until_its_operation_settles() -> None:
    """Urgent: a cancel generation recorded and no receipt yet."""
    op = replace(make_operation("a"), state=S.WORKING)
    assert not urgent(op)
    assert urgent(replace(op, state=S.CANCEL_REQUESTED, cancel_generation=1))
    assert not urgent(replace(op, state=S.CANCELLED_ACCEPTED, cancel_generation=1))
