"""Input races (MCP only; AIP-151 has no mid-operation input): an input round the server replays after
it was answered must never open a second round, reach a person twice, or be answered twice."""

from __future__ import annotations

import logging

import pytest
from race_kit import ACCEPT, MCP, call, invariants

from engine.model import LocalState, ServerStatus

# Two 200 ms segments around the one round, so the task is still working when the replay shows.
ROUND = {"duration_ms": 40_000, "input_rounds": 1}


@pytest.mark.parametrize("server", MCP, indirect=True)
async def test_an_answered_input_round_completes_with_one_approval(server, ledger):
    """input_required → one approval answered (bound to its round) → working → completed."""
    op = await call(server, ledger, sim=ROUND, answer=ACCEPT)
    seen = invariants(ledger, server)
    assert op.state is LocalState.ACCEPTED
    (approval,) = ledger.approvals(pending_only=False)
    assert (approval["input_round"], approval["status"]) == (1, "answered")
    assert approval["request_key"] == op.input_request_key
    assert seen.task()["input_rounds_answered"] == 1


@pytest.mark.parametrize("server", MCP, indirect=True)
async def test_a_replayed_input_round_is_not_asked_or_answered_twice(server, ledger, caplog):
    """input_replayed: the answered round shows again; it is ignored, one approval, one round on the server."""
    caplog.set_level(logging.WARNING, logger="engine.runtime.driver")
    op = await call(server, ledger, sim={**ROUND, "faults": ["input_replayed"]}, answer=ACCEPT)
    seen = invariants(ledger, server)
    assert "input_replayed" in seen.fired()
    assert op.state is LocalState.ACCEPTED
    receipt = seen.receipt()
    assert receipt is not None
    assert receipt.status is ServerStatus.COMPLETED
    assert op.input_round == 1
    approvals = ledger.approvals(pending_only=False)
    assert [(a["input_round"], a["status"]) for a in approvals] == [(1, "answered")]
    assert seen.path().count("INPUT_REQUIRED") == 1
    assert seen.task()["input_rounds_answered"] == 1
    # The engine did see the replay: with its request (2026: the same key again, ignored), or as
    # input_required whose request went to the old result stream (2025), which opens no round.
    causes = [str(t["cause"]) for t in seen.transitions["node-1"]]
    assert any("input round replayed" in c for c in causes) or any(
        "input_required without a request" in r.getMessage() for r in caplog.records
    )


@pytest.mark.parametrize("server", ["mcp25_id0"], indirect=True)
async def test_two_different_questions_under_one_elicitation_id_are_two_rounds(server, ledger):
    """A server that sends every elicitation as id 0: the second question is a new round, answered by
    a person for itself, never with the first round's stored answer."""
    op = await call(server, ledger, sim={"duration_ms": 40_000, "input_rounds": 2}, answer=ACCEPT)
    seen = invariants(ledger, server)
    assert op.state is LocalState.ACCEPTED
    approvals = ledger.approvals(pending_only=False)
    assert [(a["input_round"], a["status"]) for a in approvals] == [(1, "answered"), (2, "answered")]
    assert approvals[0]["request_key"] != approvals[1]["request_key"]
    assert all(str(a["request_key"]).startswith("0#") for a in approvals)
    assert seen.path().count("INPUT_REQUIRED") == 2
    assert op.input_round == op.answered_round == 2
    assert seen.task()["input_rounds_answered"] == 2
    # Exactly one answer reached the server per question: nothing was re-sent to the second one.
    assert seen.stats["requests"]["response"] == 2
