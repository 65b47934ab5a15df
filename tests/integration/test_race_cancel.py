"""Cancel races: the completion and the cancel arriving together, and the cancel's acknowledgement
lost after the server already cancelled. Cancel is a request, never a reverse completion."""

from __future__ import annotations

from datetime import timedelta

import pytest
from race_kit import LONG, PLAIN, call, invariants

from engine.model import LocalState, ServerStatus

SOON = timedelta(milliseconds=100)


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_completion_and_cancel_arriving_together_accept_the_completion_once(server, ledger):
    """complete_on_cancel: the work ends as the cancel lands; the server's completion is the one receipt."""
    op = await call(
        server,
        ledger,
        tool="apply_batch_change",
        sim={"duration_ms": LONG, "faults": ["complete_on_cancel"]},
        cancel_after=SOON,
    )
    seen = invariants(ledger, server)
    assert "complete_on_cancel" in seen.fired()
    assert op.state is LocalState.ACCEPTED
    receipt = seen.receipt()
    assert receipt is not None
    assert receipt.status is ServerStatus.COMPLETED
    assert receipt.cancel_generation == 1
    assert seen.path()[-4:] == ["CANCEL_REQUESTED", "TERMINAL_OBSERVED", "FETCHING_RESULT", "ACCEPTED"]
    # The completion won, so nothing is left half-done for a person to check.
    assert not op.effect_reconciliation_required
    assert len(seen.stats["executions"]["apply_batch_change"]) == 1


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_lost_cancel_ack_is_settled_by_what_the_server_says_afterwards(server, ledger):
    """cancel_ack_lost: the server cancelled but the reply broke; asking again confirms cancelled, once."""
    op = await call(
        server,
        ledger,
        tool="apply_batch_change",
        sim={"duration_ms": LONG, "faults": ["cancel_ack_lost"]},
        cancel_after=SOON,
    )
    seen = invariants(ledger, server)
    assert "cancel_ack_lost" in seen.fired()
    assert op.state is LocalState.CANCELLED_ACCEPTED
    receipt = seen.receipt()
    assert receipt is not None
    assert receipt.cancel_generation == 1
    cancels = [p["outcome"] for p in seen.polls["node-1"] if p["method"] == "cancel"]
    assert cancels[0] == "unavailable"
    assert seen.task()["cancel_requested_at"] is not None
    assert op.effect_reconciliation_required
    assert len(seen.stats["executions"]["apply_batch_change"]) == 1
