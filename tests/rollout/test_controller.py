"""The rollout controller over a real DuckDB ledger: atomic audit rows, epoch compare-and-swap, gates recorded."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from engine.errors import RolloutRefused
from engine.ledger.duckdb import Ledger
from engine.ledger.port import ExplorerRun, PollRecord
from engine.revision import running_revision
from engine.testing import EPOCH_START, FakeClock
from rollout.controller import RolloutController, verify_ledger
from rollout.plan import Action, Request, Stage
from rollout.route import ToolPaths

TOOLS = {
    "generate_report": ToolPaths("generate_report", "old", "new", side_effect_free=True),
    "apply_batch_change": ToolPaths("apply_batch_change", "old", "new", side_effect_free=False),
}


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger.open(tmp_path / "c.duckdb") as led:
        yield led


def controller(ledger: Ledger, clock: FakeClock | None = None) -> RolloutController:
    return RolloutController(ledger, clock or FakeClock(), TOOLS, salt="s1")


def req(action: Action, **kw: object) -> Request:
    return Request(action, actor="rm", reason="because", **kw)  # type: ignore[arg-type]


def test_every_action_appends_one_linked_row_and_moves_the_state_with_it(ledger: Ledger) -> None:
    """Rows chain from the genesis hash; the state row and its anchor follow the last row."""
    c = controller(ledger)
    c.act(req(Action.SHADOW))
    c.act(req(Action.CANARY, canary_bp=500, override=True))
    rows = ledger.rollout_events()
    assert [r["seq"] for r in rows] == [1, 2]
    assert rows[1]["prev_hash"] == rows[0]["hash"]
    state = ledger.rollout_state()
    assert state is not None
    assert (state["stage"], state["canary_bp"], state["head_seq"], state["head_hash"]) == (
        "canary",
        500,
        2,
        rows[1]["hash"],
    )
    assert verify_ledger(ledger).ok
    assert controller(ledger).state == c.state, "a new controller reads the same state back"


def test_each_row_carries_a_digest_of_the_gate_inputs_of_its_moment(ledger: Ledger) -> None:
    """The gate inputs are stored as read, with their digest inside the hashed fields."""
    c = controller(ledger)
    result = c.act(req(Action.SHADOW))
    row = ledger.rollout_events()[0]
    assert "terminal_divergence" in str(row["gate_inputs"])
    assert str(row["gate_inputs_digest"]).startswith("sha256:")
    assert result.event.gate_inputs_digest == row["gate_inputs_digest"]


def test_rollback_raises_the_epoch_by_compare_and_swap(ledger: Ledger) -> None:
    """The epoch moves once; a second controller that read the old epoch is refused (409) on the
    ledger's state (it decides on the ledger's truth, since several executors share it)."""
    first = controller(ledger)
    first.act(req(Action.SHADOW))
    second = controller(ledger)
    first.act(req(Action.ROLLBACK))
    assert ledger.execution_epoch() == 2
    with pytest.raises(
        RolloutRefused, match=r"changed while this action was decided|nothing to roll back"
    ) as refused:
        second.act(req(Action.ROLLBACK))
    assert refused.value.status == 409
    assert ledger.execution_epoch() == 2
    assert second.state.stage is Stage.ROLLED_BACK, "the loser reloads the truth"
    assert len(ledger.rollout_events()) == 2
    assert verify_ledger(ledger).ok


def test_a_blocked_promotion_records_its_gate_run_but_no_audit_row(ledger: Ledger) -> None:
    """The evaluation is kept in gate_runs; the chain only holds changes."""
    c = controller(ledger)
    c.act(req(Action.SHADOW))
    with pytest.raises(RolloutRefused, match="promotion blocked"):
        c.act(req(Action.CANARY, canary_bp=500))
    assert ledger.gate_runs()
    assert len(ledger.rollout_events()) == 1
    assert c.state.stage is Stage.SHADOW


def test_promotion_with_passing_gates_needs_no_override(ledger: Ledger) -> None:
    """With every gate passing, the canary and the promotion go through and are not marked overrides."""
    ledger.record_explorer_run(
        ExplorerRun(
            "all",
            "mcp-2025-11-25",
            1,
            12_000,
            10_500,
            0,
            False,
            "engine",
            None,
            EPOCH_START,
            EPOCH_START,
            code="shipped",
            revision=running_revision(),
        )
    )
    _seed_terminal_work(ledger)
    clock = FakeClock(EPOCH_START + timedelta(minutes=1))
    c = controller(ledger, clock)
    c.act(req(Action.SHADOW))
    canary = c.act(req(Action.CANARY, canary_bp=500))
    assert canary.gates.passed, [r.verdict for r in canary.gates.failing()]
    assert not canary.event.override
    full = c.act(req(Action.PROMOTE, override=True))
    assert not full.event.override
    assert "override requested but not needed" in full.event.detail
    assert c.state.stage is Stage.FULL


def _seed_terminal_work(ledger: Ledger) -> None:
    from engine.machine import step
    from engine.model import (
        CancelConfirmed,
        CancelRequested,
        Epoch,
        FetchStarted,
        ResultVerified,
        ServerStatus,
        StatusObserved,
        Submitted,
        TaskId,
        digest_of,
    )
    from engine.testing import acknowledge_ready, make_operation

    e = Epoch(1)
    payload: dict[str, object] = {"content": [], "isError": False}
    op, _ = ledger.create_operation(make_operation("done"), {})
    task = TaskId("t-done")
    for event in (Submitted(task, e), StatusObserved(task, ServerStatus.COMPLETED, e), FetchStarted(e)):
        op = ledger.apply(step(op, event, EPOCH_START))
    ledger.accept_terminal(
        step(op, ResultVerified(task, ServerStatus.COMPLETED, digest_of(payload), e), EPOCH_START), payload
    )
    op, _ = ledger.create_operation(make_operation("stopped"), {})
    task = TaskId("t-stopped")
    op = ledger.apply(step(op, Submitted(task, e), EPOCH_START))
    op = ledger.apply(step(op, CancelRequested(1, "a", "r"), EPOCH_START))
    ledger.accept_terminal(step(op, CancelConfirmed(task, 1, e), EPOCH_START + timedelta(seconds=2)), None)
    ledger.record_polls(
        [
            PollRecord("op", "srv", "get", 1, EPOCH_START + timedelta(milliseconds=100 * i), None, "ok")
            for i in range(10)
        ]
    )
    ledger.put_setting("global_qps", "20", EPOCH_START)
    acknowledge_ready(ledger)  # the downstream advanced on both receipts (traceability)
