"""Approval rounds over real HTTP on a real ledger, with the injected clock: every round has a
deadline (the server's expiry of the task, or the tool's wait budget when that ends first), and an
answer that arrives after it is refused and the round recorded as expired; nothing reaches the server.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from race_kit import ACCEPT, MARGIN, MCP, spec_for

from engine.clock import SystemClock
from engine.errors import ConfigError
from engine.ledger.duckdb import Ledger
from engine.model import LocalState
from engine.runtime.call import run_call
from engine.testing import FakeClock
from refserver.testing import RefServer

# The round shows after a few real milliseconds; the server keeps the task 6 s (real) after creation.
ASKS = {"duration_ms": 2_000, "input_rounds": 1, "ttl_ms": 600_000}


async def _park(server: RefServer, ledger: Ledger, clock: FakeClock, wait_budget: timedelta) -> None:
    """Drive one call until it waits on a person (no answer given), bounded in real time."""
    spec = spec_for(server, sim=ASKS, wait_budget=wait_budget)
    op = await asyncio.wait_for(run_call(spec, ledger, clock), MARGIN.total_seconds())
    assert op.state is LocalState.INPUT_REQUIRED


@pytest.mark.parametrize("server", MCP, indirect=True)
async def test_a_round_answered_after_its_deadline_is_refused_and_recorded_as_expired(
    server: RefServer, ledger: Ledger
) -> None:
    """The round's deadline is the task's expiry (the budget ends later); once the injected clock
    passes it, the answer is refused, the round is expired at that instant, and no answer is sent."""
    # The server's timestamps are real instants: the injected clock starts at the real now.
    clock = FakeClock(SystemClock().now())
    await _park(server, ledger, clock, timedelta(hours=1))
    (approval,) = ledger.approvals()
    op = ledger.by_call_node("node-1")
    assert op is not None
    assert op.expires_at is not None
    assert approval["deadline"] == op.expires_at

    clock.advance(op.expires_at - clock.now() + timedelta(seconds=1))
    late = spec_for(server, sim=ASKS, wait_budget=timedelta(hours=1), answer=ACCEPT)
    # `finality call --answer` refuses a closed round as a usage error (exit 2), naming it.
    with pytest.raises(ConfigError, match="expired"):
        await asyncio.wait_for(run_call(late, ledger, clock), MARGIN.total_seconds())
    assert ledger.approvals() == []
    (expired,) = ledger.approvals(pending_only=False)
    assert (expired["status"], expired["closed_at"]) == ("expired", clock.now())
    assert expired["answer"] is None
    assert "response" not in server.stats()["requests"]


@pytest.mark.parametrize("server", ["mcp25"], indirect=True)
async def test_a_round_whose_wait_budget_ends_before_the_task_expires_has_the_budget_as_deadline(
    server: RefServer, ledger: Ledger
) -> None:
    """A 2 s wait budget ends before the server's 6 s expiry: the round's deadline is the budget's end."""
    clock = FakeClock(SystemClock().now())
    await _park(server, ledger, clock, timedelta(seconds=2))
    (approval,) = ledger.approvals()
    op = ledger.by_call_node("node-1")
    assert op is not None
    assert approval["deadline"] == op.created_at + timedelta(seconds=2)
