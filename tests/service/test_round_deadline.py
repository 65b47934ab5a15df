"""An input round no one answers by its deadline: the operation moves on by the decision path, and
``finality call --answer`` on a closed round is refused as a usage error.

Issue 14 leftovers. On the real DuckDB ledger, against the reference servers over HTTP; the call's
clock is a ``FakeClock`` (the deadline passes by advancing it, never by waiting).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from engine.ledger.duckdb import Ledger
from engine.model import LocalState, Operation, ServerStatus, ToolRef
from engine.runtime.call import CallSpec, run_call
from engine.testing import FakeClock
from refserver.testing import RefServer
from service.cli import EXIT_USAGE, main

ROUND = {"duration_ms": 2000, "input_rounds": 1, "ttl_ms": 10_000_000}
"""One input round; kept on the server long after it ends (never an expiry test)."""
BUDGET = timedelta(hours=1)
REPORT = ToolRef("generate_report", "1.0.0", "1", side_effects=False)


@pytest.fixture(scope="module")
def no_cancel() -> Iterator[RefServer]:
    with RefServer("mcp-2025-11-25", time_scale=0.05, no_cancel=True) as server:
        yield server


def _spec(server: RefServer, node: str) -> CallSpec:
    return CallSpec(
        server=server.endpoint,
        protocol="mcp-2025-11-25",
        tool=REPORT,
        arguments={"_sim": ROUND},
        call_node=node,
        wait_budget=BUDGET,
    )


def _parked_on_a_round(server: RefServer, ledger: Ledger, node: str, clock: FakeClock) -> Operation:
    op = asyncio.run(run_call(_spec(server, node), ledger, clock))
    assert op.state is LocalState.INPUT_REQUIRED
    (approval,) = [a for a in ledger.approvals() if a["operation_id"] == op.operation_id]
    assert approval["deadline"] == op.created_at + BUDGET
    return op


def test_a_round_unanswered_by_its_deadline_is_cancelled_as_a_request_and_ends_cancelled(
    servers: dict[str, RefServer], tmp_path: Path
) -> None:
    """Past the deadline the executor records a cancel naming the unanswered round (never a local
    ending), sends it, and the server's confirmation ends the call CANCELLED_ACCEPTED."""
    clock = FakeClock()
    with Ledger.open(tmp_path / "l.duckdb") as ledger:
        op = _parked_on_a_round(servers["mcp"], ledger, "rd1", clock)
        # Before the deadline, resuming it leaves it waiting for a person.
        assert (
            asyncio.run(run_call(_spec(servers["mcp"], "rd1"), ledger, clock)).state
            is LocalState.INPUT_REQUIRED
        )
        clock.advance(BUDGET)
        after = asyncio.run(run_call(_spec(servers["mcp"], "rd1"), ledger, clock))
        assert after.state is LocalState.CANCELLED_ACCEPTED
        assert after.server_status is ServerStatus.CANCELLED
        causes = [
            (str(r["event"]), str(r["cause"]))
            for r in ledger._rows(
                "SELECT event, cause FROM transitions WHERE operation_id = ? ORDER BY seq", [op.operation_id]
            )
        ]
        assert (
            "CancelRequested",
            f"finality: input round 1 unanswered by its deadline {op.created_at + BUDGET}",
        ) in causes


def test_a_round_unanswered_on_a_server_without_cancel_goes_to_a_person_once(
    no_cancel: RefServer, tmp_path: Path
) -> None:
    """No cancel capability: nothing is recorded as a cancel; one reconciliation entry names the
    missing capability, and resuming again does not open a second one."""
    clock = FakeClock()
    with Ledger.open(tmp_path / "l.duckdb") as ledger:
        op = _parked_on_a_round(no_cancel, ledger, "rd2", clock)
        clock.advance(BUDGET)
        for _ in range(2):
            after = asyncio.run(run_call(_spec(no_cancel, "rd2"), ledger, clock))
            assert after.state is LocalState.INPUT_REQUIRED
            assert after.cancel_generation == 0
        entries = [e for e in ledger.reconciliation() if e["operation_id"] == op.operation_id]
        assert [e["kind"] for e in entries] == ["approval"]
        assert "tasks.cancel" in str(entries[0]["reason"])
        assert "unanswered by its deadline" in str(entries[0]["reason"])


def test_call_answer_on_a_closed_round_exits_two_naming_the_round(
    servers: dict[str, RefServer], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`finality call --answer` for a round closed as expired: exit 2 (usage/refused), a message
    naming --answer and the round, and nothing sent to the server."""
    path = tmp_path / "l.duckdb"
    clock = FakeClock()
    with Ledger.open(path) as ledger:
        op = _parked_on_a_round(servers["mcp"], ledger, "rd3", clock)
        assert ledger.close_rounds(op.created_at + BUDGET + timedelta(seconds=1)) == 1
        (closed,) = [a for a in ledger.approvals(pending_only=False) if a["operation_id"] == op.operation_id]
        assert closed["status"] == "expired"
    answered_before = servers["mcp"].stats()["requests"].get("response", 0)
    code = main(
        [
            "call", "--server", servers["mcp"].endpoint, "--protocol", "mcp-2025-11-25",
            "--tool", "generate_report", "--tool-version", "1.0.0", "--side-effect-free",
            "--args", json.dumps({"_sim": ROUND}), "--call-node", "rd3", "--ledger", str(path),
            "--answer", '{"approve": true}',
        ]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    for word in ("--answer", "round 1", "expired", "nothing was sent"):
        assert word in err
    assert servers["mcp"].stats()["requests"].get("response", 0) == answered_before
