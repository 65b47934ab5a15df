"""The plain paths of every protocol, end to end: completed, failed, isError, cancelled while working,
and a cancel that arrives after the task already finished."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from race_kit import LONG, PLAIN, POLICY, QUICK, call, invariants

from engine.model import LocalState, ServerStatus

CANCEL_METHOD = {
    "mcp-2025-11-25": "tasks/cancel",
    "mcp-2026-07-28": "tasks/cancel",
    "aip-151": "CancelOperation",
}


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_completed_call_is_accepted_once_after_its_result_is_fetched(server, ledger):
    """working → completed: one receipt, after FETCHING_RESULT, holding the tool's own result."""
    op = await call(server, ledger, sim={"duration_ms": QUICK})
    seen = invariants(ledger, server)
    assert op.state is LocalState.ACCEPTED
    receipt = seen.receipt()
    assert receipt is not None
    assert receipt.status is ServerStatus.COMPLETED
    assert seen.path()[-3:] == ["TERMINAL_OBSERVED", "FETCHING_RESULT", "ACCEPTED"]


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_failed_call_is_accepted_as_failed_with_the_servers_error(server, ledger):
    """A failure the tool reports as an error is accepted as failed, with that error as its payload."""
    op = await call(server, ledger, sim={"duration_ms": QUICK, "outcome": "failed"})
    seen = invariants(ledger, server)
    assert op.state is LocalState.ACCEPTED
    receipt = seen.receipt()
    assert receipt is not None
    assert receipt.status is ServerStatus.FAILED
    payload = ledger.result_payload(op.operation_id)
    assert payload is not None
    assert "simulated failure" in str(payload["message"])


@pytest.mark.parametrize(
    ("server", "status"),
    [("mcp25", ServerStatus.FAILED), ("mcp26", ServerStatus.COMPLETED), ("aip", ServerStatus.COMPLETED)],
    indirect=["server"],
)
async def test_an_is_error_result_is_accepted_with_the_status_its_protocol_gives_it(server, ledger, status):
    """isError is failed on 2025-11-25 and completed on the 2026 extension and AIP-151; never lost."""
    op = await call(server, ledger, sim={"duration_ms": QUICK, "outcome": "is_error"})
    seen = invariants(ledger, server)
    receipt = seen.receipt()
    assert receipt is not None
    assert receipt.status is status
    payload = ledger.result_payload(op.operation_id)
    assert payload is not None
    assert payload["isError"] is True


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_cancel_while_working_is_accepted_as_cancelled_and_flags_the_effects(server, ledger):
    """CANCEL_REQUESTED first, then the request; the cancelled receipt asks a person about effects."""
    op = await call(
        server,
        ledger,
        tool="apply_batch_change",
        sim={"duration_ms": LONG},
        cancel_after=timedelta(milliseconds=100),
    )
    seen = invariants(ledger, server)
    assert op.state is LocalState.CANCELLED_ACCEPTED
    assert op.effect_reconciliation_required
    assert seen.path()[-2:] == ["CANCEL_REQUESTED", "CANCELLED_ACCEPTED"]
    assert seen.task()["status"] == "cancelled"
    assert len(seen.stats["executions"]["apply_batch_change"]) == 1


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_cancel_after_the_task_finished_never_rewrites_the_outcome_as_cancelled(server, ledger):
    """The task completes unseen, then the cancel goes out: the completion is what gets accepted."""
    # The next poll is a second away (the server's pollInterval, or our default on AIP-151); the
    # cancel goes at 300 ms, long after the 5 ms of work, even on a slow first call of the session.
    slow_polls = replace(POLICY, default_interval=timedelta(seconds=1))
    op = await call(
        server,
        ledger,
        tool="apply_batch_change",
        sim={"duration_ms": QUICK, "poll_interval_ms": 100_000},
        cancel_after=timedelta(milliseconds=300),
        policy=slow_polls,
    )
    seen = invariants(ledger, server)
    assert op.state is LocalState.ACCEPTED
    receipt = seen.receipt()
    assert receipt is not None
    assert receipt.status is ServerStatus.COMPLETED
    assert receipt.cancel_generation == 1
    assert "CANCEL_REQUESTED" in seen.path()
    assert seen.stats["requests"][CANCEL_METHOD[server.protocol]] == 1
    assert not op.effect_reconciliation_required
