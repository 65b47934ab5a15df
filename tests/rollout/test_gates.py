"""The six gates, computed from ledger data only, with raw inputs, failing safe on missing data."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest

from engine.ledger.duckdb import Ledger
from engine.ledger.port import ExplorerRun, PollRecord
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
from engine.revision import running_revision
from engine.testing import EPOCH_START, acknowledge_ready, make_operation
from rollout.gates import GATES, Thresholds, evaluate
from service.cli import main

E = Epoch(1)
PAYLOAD: dict[str, object] = {"content": [], "isError": False}


def completed(ledger: Ledger, node: str) -> None:
    op, _ = ledger.create_operation(make_operation(node), {})
    task = TaskId(f"t-{node}")
    for event in (Submitted(task, E), StatusObserved(task, ServerStatus.COMPLETED, E), FetchStarted(E)):
        op = ledger.apply(step(op, event, EPOCH_START))
    ledger.accept_terminal(
        step(op, ResultVerified(task, ServerStatus.COMPLETED, digest_of(PAYLOAD), E), EPOCH_START), PAYLOAD
    )


def cancelled(ledger: Ledger, node: str, after: timedelta) -> None:
    op, _ = ledger.create_operation(make_operation(node), {})
    task = TaskId(f"t-{node}")
    op = ledger.apply(step(op, Submitted(task, E), EPOCH_START))
    op = ledger.apply(step(op, CancelRequested(1, "a", "r"), EPOCH_START))
    ledger.accept_terminal(step(op, CancelConfirmed(task, 1, E), EPOCH_START + after), None)


def polls(ledger: Ledger, count: int, spread: timedelta, start: timedelta = timedelta(0)) -> None:
    first = EPOCH_START + start
    ledger.record_polls(
        [
            PollRecord("op", "srv", "get", 1, first + spread * i / count, first + spread * i / count, "ok")
            for i in range(count)
        ]
    )


def healthy(ledger: Ledger) -> None:
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
    completed(ledger, "c1")
    cancelled(ledger, "k1", timedelta(seconds=3))
    polls(ledger, 10, timedelta(seconds=1))
    ledger.put_setting("global_qps", "10", EPOCH_START)
    acknowledge_ready(ledger)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    with Ledger.open(tmp_path / "g.duckdb") as led:
        yield led  # type: ignore[misc]


def verdicts(ledger: Ledger, **thresholds: object) -> dict[str, object]:
    report = evaluate(ledger.gate_inputs(EPOCH_START + timedelta(minutes=1)), Thresholds(**thresholds))  # type: ignore[arg-type]
    return {r.gate: r for r in report.results}


def test_an_empty_ledger_fails_every_gate_with_no_data(ledger: Ledger) -> None:
    """No data never passes silently."""
    results = verdicts(ledger)
    assert list(results) == list(GATES)
    for r in results.values():
        assert not r.passed  # type: ignore[attr-defined]
        assert r.verdict.startswith("no data")  # type: ignore[attr-defined]


def test_a_healthy_ledger_passes_every_gate(ledger: Ledger) -> None:
    """Explorer coverage, one operation each, polls within the cap, fast cancels, all traceable."""
    healthy(ledger)
    results = verdicts(ledger)
    assert all(r.passed for r in results.values()), results  # type: ignore[attr-defined]


def test_too_few_interleavings_fail_the_divergence_gate(ledger: Ledger) -> None:
    """A clean explorer run below 10,000 interleavings does not count."""
    healthy(ledger)
    assert not verdicts(ledger, min_interleavings=20_000)["terminal_divergence"].passed  # type: ignore[attr-defined]


def test_a_divergent_explorer_run_fails(ledger: Ledger) -> None:
    """One divergent interleaving fails the gate."""
    healthy(ledger)
    ledger.record_explorer_run(
        ExplorerRun(
            "x",
            "aip-151",
            2,
            10,
            10,
            1,
            True,
            "engine",
            "trace",
            EPOCH_START,
            EPOCH_START,
            code="shipped",
            revision=running_revision(),
        )
    )
    assert not verdicts(ledger)["terminal_divergence"].passed  # type: ignore[attr-defined]


def test_a_second_server_operation_fails_the_duplicate_gate(ledger: Ledger) -> None:
    """An operation bound to two server tasks is a duplicate submission."""
    healthy(ledger)
    op = ledger.by_call_node("c1")
    assert op is not None
    ledger._con.execute("INSERT INTO task_bindings VALUES ('srv', 'second', ?, now())", [op.operation_id])
    result = verdicts(ledger)["duplicate_operations"]
    assert not result.passed  # type: ignore[attr-defined]
    assert result.inputs["operations_with_second_server_task"] == 1  # type: ignore[attr-defined]


def test_one_request_over_the_cap_in_any_window_fails(ledger: Ledger) -> None:
    """Eleven requests inside one second against a cap of ten fail the amplification gate."""
    healthy(ledger)
    polls(ledger, 11, timedelta(milliseconds=900), start=timedelta(seconds=5))
    result = verdicts(ledger)["poll_amplification"]
    assert not result.passed  # type: ignore[attr-defined]
    assert result.value == 11  # type: ignore[attr-defined]


def test_slow_cancel_confirmation_fails(ledger: Ledger) -> None:
    """A cancel confirmed after 90 s breaks the 60 s p99."""
    healthy(ledger)
    cancelled(ledger, "slow", timedelta(seconds=90))
    assert not verdicts(ledger)["cancel_confirmation"].passed  # type: ignore[attr-defined]


def test_an_unknown_older_than_fifteen_minutes_fails(ledger: Ledger) -> None:
    """An UNKNOWN left open past 15 minutes fails, with its age shown."""
    healthy(ledger)
    op = ledger.by_call_node("c1")
    assert op is not None
    ledger.open_reconciliation(
        op, kind="unknown", reason="r", window_end=EPOCH_START, at=EPOCH_START - timedelta(minutes=20)
    )
    result = verdicts(ledger)["unknown_reconciliation"]
    assert not result.passed  # type: ignore[attr-defined]
    assert result.inputs["oldest_open_s"] == pytest.approx(21 * 60)  # type: ignore[attr-defined]


def test_gates_cli_prints_inputs_records_the_run_and_sets_the_exit_code(
    ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    """`finality gates --json` exits 0 only when all pass, and appends to gate_runs."""
    path = ledger.path
    ledger.close()
    assert main(["gates", "--ledger", path, "--json"]) == 1
    failing = json.loads(capsys.readouterr().out)
    assert not failing["passed"]
    with Ledger.open(path) as led:
        healthy(led)
    assert main(["gates", "--ledger", path, "--json"]) == 0
    passing = json.loads(capsys.readouterr().out)
    assert passing["passed"]
    assert {g["gate"] for g in passing["gates"]} == set(GATES)
    with Ledger.open(path, read_only=True) as led:
        assert len({r["run_id"] for r in led.gate_runs()}) == 2


def test_the_divergence_gate_counts_only_shipped_runs_at_the_running_revision(ledger: Ledger) -> None:
    """Seeded rows, runs of the explorer's model and runs of another revision never count."""
    healthy(ledger)
    ledger._con.execute("DELETE FROM explorer_runs")
    for code, revision in (("seeded", None), ("model", running_revision()), ("shipped", "0" * 40)):
        ledger.record_explorer_run(
            ExplorerRun(
                "all",
                "aip-151",
                1,
                20_000,
                20_000,
                0,
                True,
                "engine",
                None,
                EPOCH_START,
                EPOCH_START,
                code=code,
                revision=revision,
            )
        )
    result = verdicts(ledger)["terminal_divergence"]
    assert not result.passed  # type: ignore[attr-defined]
    assert result.inputs["explorer_runs"] == 0  # type: ignore[attr-defined]
    ledger.record_explorer_run(
        ExplorerRun(
            "all",
            "aip-151",
            1,
            20_000,
            20_000,
            0,
            True,
            "engine",
            None,
            EPOCH_START,
            EPOCH_START,
            code="shipped",
            revision=running_revision(),
        )
    )
    result = verdicts(ledger)["terminal_divergence"]
    assert result.passed  # type: ignore[attr-defined]
    assert result.inputs["explorer_runs"] == 1  # type: ignore[attr-defined]
