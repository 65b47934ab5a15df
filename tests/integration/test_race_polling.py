"""Races while waiting: poll replies out of order, 429/503 with Retry-After, reset connections,
malformed bodies, and "not found" before and after expiry."""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta

import pytest
from race_kit import LONG, OPTIONS, PLAIN, POLICY, QUICK, call, engine_url, invariants

from engine.adapters import open_backend, open_client
from engine.clock import SystemClock
from engine.ledger.duckdb import Ledger
from engine.model import LocalState, Operation, Protocol, ServerStatus
from engine.runtime.driver import Driver
from refserver.testing import RefServer


async def two_pollers(server: RefServer, ledger: Ledger, op: Operation) -> None:
    """Two drivers (own HTTP clients, one ledger) poll the same operation at the same time."""
    async with open_client() as client_a, open_client() as client_b:
        drivers = [
            Driver(
                ledger=ledger,
                backend=open_backend(
                    Protocol(server.protocol), engine_url(server), client=c, token=None, options=OPTIONS
                ),
                clock=SystemClock(),
                rng=random.Random(n),
                server=engine_url(server),
                epoch=op.epoch,
                policy=POLICY,
            )
            for n, c in enumerate((client_a, client_b))
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*(d.advance(op) for d in drivers)), 10)
        finally:
            for driver in drivers:
                await driver.backend.aclose()


# slow_response fires on the creating reply first, then on the first poll: the one that is
# answered with the stale snapshot, so that reply arrives ~500 ms after the fresh one.
OUT_OF_ORDER_SIM = {
    "duration_ms": QUICK,
    "faults": [{"name": "slow_response", "times": 2, "delay_ms": 50_000}, "poll_out_of_order"],
}


async def out_of_order_replies(server: RefServer, ledger: Ledger) -> Operation:
    """Submit, let the task finish unseen, then two pollers at once: the stale reply lands last."""
    submitted = await call(server, ledger, sim=OUT_OF_ORDER_SIM, wait_budget=timedelta(0))
    assert submitted.state is LocalState.WORKING
    assert server.stats()["tasks"][0]["status"] == "completed"
    await two_pollers(server, ledger, submitted)
    return submitted


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_two_poll_replies_out_of_order_never_move_a_terminal_status_back(server, ledger):
    """poll_out_of_order: "working" lands after "completed"; the state stays terminal and is accepted once."""
    submitted = await out_of_order_replies(server, ledger)
    between = ledger.get(submitted.operation_id)
    assert between is not None
    assert (between.state, between.server_status) == (LocalState.TERMINAL_OBSERVED, ServerStatus.COMPLETED)

    # Resuming the same call node takes the same request (another one would be refused).
    op = await call(server, ledger, sim=OUT_OF_ORDER_SIM)

    seen = invariants(ledger, server)
    assert seen.fired().count("poll_out_of_order") == 1
    assert op.state is LocalState.ACCEPTED
    path = seen.path()
    assert path[path.index("TERMINAL_OBSERVED") :] == ["TERMINAL_OBSERVED", "FETCHING_RESULT", "ACCEPTED"]


@pytest.mark.parametrize("server", ["mcp25", "aip"], indirect=True)
async def test_a_late_poll_reply_is_logged_as_refused_not_as_accepted_from_a_state_already_left(
    server, ledger
):
    """The out-of-order reply's log entry says it was refused in TERMINAL_OBSERVED."""
    submitted = await out_of_order_replies(server, ledger)
    rows = ledger.transitions(submitted.operation_id)
    terminal_at = next(i for i, t in enumerate(rows) if t["to_state"] == "TERMINAL_OBSERVED")
    late = rows[terminal_at + 1 :]
    assert [(t["from_state"], t["accepted"]) for t in late] == [("TERMINAL_OBSERVED", False)]


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_poll_that_finds_the_task_still_working_is_in_the_polls_table_and_not_in_the_log(
    server, ledger
):
    """Status reads that repeat what the operation holds each leave their request in polls (sent and
    received) and no transitions row: the log keeps only what changed."""
    op = await call(server, ledger, sim={"duration_ms": LONG})
    seen = invariants(ledger, server)
    assert op.state is LocalState.ACCEPTED
    reads = [p for p in seen.polls["node-1"] if p["method"] == "get"]
    assert len(reads) >= 3, reads
    assert all(p["outcome"] == "ok" and p["received_at"] >= p["sent_at"] for p in reads)
    observed = [t for t in seen.transitions["node-1"] if t["event"] == "StatusObserved"]
    assert [(t["from_state"], t["to_state"]) for t in observed] == [
        ("WORKING", "WORKING"),
        ("WORKING", "TERMINAL_OBSERVED"),
    ]


@pytest.mark.parametrize("fault", ["poll_429", "poll_503"])
@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_poll_answered_busy_waits_out_retry_after_before_asking_again(server, ledger, fault):
    """poll_429 / poll_503 with Retry-After: 1: the next request goes no sooner than a second later."""
    busy = {"name": fault, "retry_after_s": 1}
    op = await call(server, ledger, sim={"duration_ms": QUICK, "faults": [busy]})
    seen = invariants(ledger, server)
    assert fault in seen.fired()
    assert op.state is LocalState.ACCEPTED
    polls = seen.polls["node-1"]
    refused = next(i for i, p in enumerate(polls) if p["outcome"] == "unavailable")
    assert polls[refused]["method"] == "get"
    asked_again, refused_at = polls[refused + 1]["sent_at"], polls[refused]["received_at"]
    assert isinstance(asked_again, datetime)
    assert isinstance(refused_at, datetime)
    gap = asked_again - refused_at
    assert gap >= timedelta(seconds=1), f"asked again after {gap}"


@pytest.mark.parametrize(
    ("fault", "outcome"), [("connection_reset", "unavailable"), ("malformed_body", "violation")]
)
@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_broken_status_reply_is_asked_again_without_a_second_operation(
    server, ledger, fault, outcome
):
    """connection_reset / malformed_body on two polls: each is retried; one operation, one receipt."""
    broken = {"name": fault, "times": 2}
    op = await call(server, ledger, sim={"duration_ms": QUICK, "faults": [broken]})
    seen = invariants(ledger, server)
    assert seen.fired().count(fault) == 2
    assert op.state is LocalState.ACCEPTED
    assert [p["outcome"] for p in seen.polls["node-1"]][1:3] == [outcome, outcome]


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_404_before_expiry_goes_to_unknown_and_resumes_when_the_server_answers(server, ledger):
    """not_found_before_expiry: UNKNOWN with a findable entry; the task answers again and is accepted once."""
    op = await call(server, ledger, sim={"duration_ms": QUICK, "faults": ["not_found_before_expiry"]})
    seen = invariants(ledger, server)
    assert "not_found_before_expiry" in seen.fired()
    assert op.state is LocalState.ACCEPTED
    assert "UNKNOWN" in seen.path()
    (entry,) = seen.entries["node-1"]
    assert entry["task_id"] == op.task_id
    assert "before expiry" in str(entry["reason"])


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_leaving_unknown_is_logged_from_unknown(server, ledger):
    """The transition that takes an operation out of UNKNOWN names UNKNOWN as where it came from."""
    op = await call(server, ledger, sim={"duration_ms": QUICK, "faults": ["not_found_before_expiry"]})
    rows = [t for t in ledger.transitions(op.operation_id) if t["accepted"]]
    into = next(i for i, t in enumerate(rows) if t["to_state"] == "UNKNOWN")
    assert rows[into + 1]["from_state"] == "UNKNOWN"


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_404_after_expiry_without_a_held_outcome_is_never_accepted(server, ledger):
    """expire_early: deleted the moment it ended; nothing was read, so UNKNOWN by task id, no receipt."""
    sim = {"duration_ms": QUICK, "ttl_ms": 1_000, "faults": ["expire_early"]}
    op = await call(server, ledger, sim=sim, wait_budget=timedelta(milliseconds=800))
    seen = invariants(ledger, server)
    assert op.state is LocalState.UNKNOWN
    assert seen.receipt() is None
    assert op.server_status is not ServerStatus.COMPLETED
    task = seen.task()
    assert (task["status"], task["deleted"], task["deleted_reason"]) == ("completed", True, "expire_early")
    (entry,) = seen.entries["node-1"]
    assert entry["status"] == "open"
    assert entry["task_id"] == op.task_id
    # MCP tasks carry a ttl, so the engine knows it is past expiry; AIP-151 operations do not say.
    if server.protocol != "aip-151":
        assert "after expiry" in str(entry["reason"])
