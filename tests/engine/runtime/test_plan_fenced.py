"""The one decision path's fence (``engine.runtime.plan.next_step``): another epoch's operation is FENCED."""

from __future__ import annotations

from dataclasses import replace

from engine.model import Epoch, LocalState
from engine.runtime.plan import Step, next_step
from engine.testing import make_operation

S = LocalState


def test_an_operation_adopted_by_a_newer_epoch_is_fenced_for_the_executor_it_left_behind() -> None:
    """After a rollback the old executor's next step for the adopted operation is FENCED, in every
    state that would otherwise send a request."""
    for state in (S.SUBMITTING, S.SUBMISSION_UNKNOWN, S.WORKING, S.CANCEL_REQUESTED, S.FETCHING_RESULT):
        adopted = replace(make_operation("a", epoch=2), state=state, cancel_generation=1)
        assert next_step(adopted, epoch=Epoch(1), fresh_submit=True, cancel_sent=0) is Step.FENCED


def test_an_operation_of_an_older_epoch_is_fenced_for_a_newer_executor_until_adopted() -> None:
    """The fence is equality: a newer executor does not drive an operation it has not adopted."""
    old = replace(make_operation("a", epoch=1), state=S.WORKING)
    assert next_step(old, epoch=Epoch(2), fresh_submit=False, cancel_sent=0) is Step.FENCED
    assert next_step(old, epoch=Epoch(1), fresh_submit=False, cancel_sent=0) is Step.POLL
