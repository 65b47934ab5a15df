"""Result races: the server says completed while the result is lost, truncated, or from an old
execution epoch. ``completed`` never advances before the result is fetched and its digest verified."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from race_kit import MARGIN, PLAIN, QUICK, call, invariants, spec_for

from engine.model import LocalState
from engine.runtime.call import run_call
from engine.testing import FakeClock

# Where each protocol reads the outcome: 2025-11-25 from tasks/result, the others from the status read.
RESULT_READ = {"mcp-2025-11-25": "result", "mcp-2026-07-28": "get", "aip-151": "get"}


@pytest.mark.parametrize("fault", ["result_lost", "result_truncated"])
@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_lost_or_truncated_result_is_read_again_before_completed_is_accepted(server, ledger, fault):
    """result_lost / result_truncated once: the broken read is retried, the whole result accepted once."""
    op = await call(server, ledger, sim={"duration_ms": QUICK, "faults": [fault]})
    seen = invariants(ledger, server)
    assert fault in seen.fired()
    assert op.state is LocalState.ACCEPTED
    reads = [p["outcome"] for p in seen.polls["node-1"] if p["method"] == RESULT_READ[server.protocol]]
    assert "unavailable" in reads
    assert reads[-1] == "ok"


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_result_that_never_arrives_whole_never_yields_a_receipt(server, ledger):
    """result_truncated on every read: the server says completed, yet nothing is accepted or sent downstream."""
    always = {"name": "result_truncated", "times": 1_000}
    op = await call(
        server,
        ledger,
        sim={"duration_ms": QUICK, "faults": [always]},
        wait_budget=timedelta(seconds=1),
    )
    seen = invariants(ledger, server)
    assert seen.fired().count("result_truncated") >= 2
    assert seen.task()["status"] == "completed"
    assert seen.receipt() is None
    assert ledger.count("outbox") == 0
    # 2025-11-25 saw "completed" from tasks/get and waits in FETCHING_RESULT; on the other two the
    # status and the result are one read, so not even the status has come through.
    expected = LocalState.FETCHING_RESULT if server.protocol == "mcp-2025-11-25" else LocalState.WORKING
    assert op.state is expected


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_result_from_an_old_execution_epoch_is_fenced_and_goes_to_reconciliation(server, ledger):
    """stale_epoch_result: the result echoes epoch 0 to an epoch-1 executor; refused, then UNKNOWN by task id."""
    op = await call(server, ledger, sim={"duration_ms": QUICK, "faults": ["stale_epoch_result"]})
    seen = invariants(ledger, server)
    assert "stale_epoch_result" in seen.fired()
    assert seen.task()["status"] == "completed"
    assert op.state is LocalState.UNKNOWN
    assert seen.receipt() is None
    refused = [t for t in seen.transitions["node-1"] if t["event"] == "ResultVerified"]
    assert refused
    assert all(not t["accepted"] and "stale epoch 0" in str(t["cause"]) for t in refused)
    (entry,) = seen.entries["node-1"]
    assert entry["task_id"] == op.task_id
    assert "stale epoch" in str(entry["reason"])


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_result_echoing_a_newer_epoch_never_stands_in_for_the_drivers_own(server, ledger):
    """future_epoch_result: the result echoes epoch 2 to an epoch-1 driver; the echo is checked beside the
    driver's own epoch (both must match), so it is refused, named as the echo, and goes to reconciliation."""
    op = await call(server, ledger, sim={"duration_ms": QUICK, "faults": ["future_epoch_result"]})
    seen = invariants(ledger, server)
    assert "future_epoch_result" in seen.fired()
    assert op.state is LocalState.UNKNOWN
    assert seen.receipt() is None
    refused = [t for t in seen.transitions["node-1"] if t["event"] == "ResultVerified"]
    assert refused
    assert all(not t["accepted"] for t in refused)
    # The event went out under the driver's epoch; what refused it is the echo, not a "future" driver.
    assert all(int(str(t["epoch"])) == 1 for t in refused)
    assert all(
        "future epoch 2 echoed by the result; it was fetched at epoch 1" in str(t["cause"]) for t in refused
    )


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_result_that_never_verifies_reaches_a_person_once_and_stays_open(server, ledger):
    """A persistent verification failure (every fetch echoes an old epoch): one reconciliation entry,
    open until a person resolves it, naming the error and the candidate digest; resuming it starts no
    probe laps that fetch again and close it as resolved by "finality". The driver's clock jumps over
    every wait, so ten minutes of probing take no wall-clock time."""
    spec = spec_for(
        server,
        sim={"duration_ms": QUICK, "faults": ["stale_epoch_result"]},
        wait_budget=timedelta(minutes=10),
    )
    clock = FakeClock()
    op = await asyncio.wait_for(run_call(spec, ledger, clock), MARGIN.total_seconds() * 3)
    assert op.state is LocalState.UNKNOWN
    # Resumed (``finality call`` run again, or the service after a restart): still a person's decision.
    op = await asyncio.wait_for(run_call(spec, ledger, clock), MARGIN.total_seconds() * 3)
    assert op.state is LocalState.UNKNOWN
    entries = [e for e in ledger.reconciliation(open_only=False) if e["operation_id"] == op.operation_id]
    assert [(e["kind"], e["status"], e["actor"]) for e in entries] == [("unknown", "open", None)]
    reason = str(entries[0]["reason"])
    assert "stale epoch 0" in reason
    assert "candidate result digest sha256:" in reason
    path = [t["to_state"] for t in ledger.transitions(op.operation_id) if t["accepted"]]
    assert path.count("UNKNOWN") == 1
