"""demo.seed: a seeded ledger keeps the ledger's invariants, and later writes continue after it."""

from __future__ import annotations

import json
import typing
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import pytest

from demo.seed import SCRIPTS, SeedScriptError, replay
from engine.clock import SystemClock
from engine.errors import LedgerError
from engine.ledger.duckdb import Ledger
from engine.ledger.sandbox import run_query
from engine.machine import step
from engine.model import Event, LocalState, ServerStatus
from engine.testing import make_operation
from rollout.gates import evaluate


def one(path: Path, sql: str) -> object:
    return run_query(path, sql).rows[0][0]


def test_seeded_history_keeps_one_receipt_and_one_outbox_row_per_call_node(seeded_ledger: Path) -> None:
    """Terminal operations hold exactly one receipt; only primaries reach the outbox, each joining its receipt."""
    assert one(seeded_ledger, "SELECT count(*) FROM operations") == 3000
    terminal = one(
        seeded_ledger, "SELECT count(*) FROM op_state WHERE state IN ('ACCEPTED','CANCELLED_ACCEPTED')"
    )
    assert one(seeded_ledger, "SELECT count(*) FROM receipts") == terminal
    assert (
        one(
            seeded_ledger,
            "SELECT count(*) FROM outbox o JOIN receipts r USING (call_node_id) WHERE r.role = 'shadow'",
        )
        == 0
    )
    assert one(seeded_ledger, "SELECT count(DISTINCT state) FROM op_state") >= 10
    assert (
        one(
            seeded_ledger,
            "SELECT count(*) FROM transitions t JOIN op_state s USING (operation_id) "
            "WHERE t.row_version = s.row_version AND t.to_state <> s.state",
        )
        == 0
    )


def test_writes_after_seeding_continue_the_sequences(seeded_ledger: Path, tmp_path: Path) -> None:
    """A new operation after the import gets the next transition seq, not a reused one."""
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(seeded_ledger.read_bytes())
    with Ledger.open(copy) as ledger:
        before = ledger.count("transitions")
        ledger.create_operation(make_operation("after-seeding"), {})
        seqs = ledger._rows(
            "SELECT max(seq) AS m, count(DISTINCT seq) AS d, count(*) AS n FROM transitions", []
        )[0]
    assert seqs["m"] == before + 1
    assert seqs["d"] == seqs["n"]


def test_import_refuses_tables_it_must_not_write(tmp_path: Path) -> None:
    """Gate runs and the rollout's chain are never bulk-imported."""
    import pyarrow as pa

    with (
        Ledger.open(tmp_path / "l.duckdb") as ledger,
        pytest.raises(LedgerError, match="cannot be bulk-imported"),
    ):
        ledger.import_rows({"gate_runs": pa.table({"run_id": [1]})})


def _event_from_row(name: str, detail: str) -> Event:
    """The event a transitions row records, rebuilt from its name and detail alone."""
    cls = {c.__name__: c for c in typing.get_args(Event)}[name]
    hints = typing.get_type_hints(cls)
    fields = json.loads(detail)
    for field, value in list(fields.items()):
        hint = str(hints[field])
        if value is not None and "ServerStatus" in hint:
            fields[field] = ServerStatus(value)
        elif value is not None and "datetime" in hint:
            fields[field] = datetime.fromisoformat(value)
    return cls(**fields)  # type: ignore[no-any-return]


def test_seeded_histories_replay_through_the_machine_row_by_row(seeded_ledger: Path) -> None:
    """Every seeded transition is what ``machine.step`` makes of the event its row records, and each chain ends at the operation's row."""
    with Ledger.open(seeded_ledger, read_only=True) as ledger:
        log = ledger._rows(
            "SELECT operation_id, event, detail, to_state, cause, row_version, recorded_at "
            "FROM transitions ORDER BY operation_id, seq",
            [],
        )
        by_op: dict[str, list[dict[str, object]]] = {}
        for row in log:
            by_op.setdefault(str(row["operation_id"]), []).append(row)
        # Three operations of every distinct history (reading each operation is a query).
        sample: dict[tuple[object, ...], list[str]] = {}
        for operation_id, rows in by_op.items():
            chain = tuple((r["event"], r["to_state"]) for r in rows)
            if len(sample.setdefault(chain, [])) < 3:
                sample[chain].append(operation_id)
        assert len(sample) >= 12
        checked = 0
        for operation_id in (o for ops in sample.values() for o in ops):
            rows = by_op[operation_id]
            final = ledger.get(operation_id)
            assert final is not None
            op = replace(
                final,
                state=LocalState.SUBMITTING,
                task_id=None,
                server_status=None,
                input_round=0,
                answered_round=0,
                input_request_key=None,
                cancel_generation=0,
                cancel_requested_at=None,
                expires_at=None,
                result_digest=None,
                result_held=False,
                effect_reconciliation_required=False,
                row_version=0,
                updated_at=final.created_at,
            )
            assert rows[0]["event"] == "Created"
            for row in rows[1:]:
                at = row["recorded_at"]
                assert isinstance(at, datetime)
                t = step(op, _event_from_row(str(row["event"]), str(row["detail"])), at)
                assert t.accepted, (operation_id, row["event"], t.reason)
                assert (t.after.state.value, t.reason, t.after.row_version) == (
                    row["to_state"],
                    row["cause"],
                    row["row_version"],
                ), operation_id
                op = t.after
                checked += 1
            assert (op.state, op.row_version, op.server_status, op.task_id, op.cancel_generation) == (
                final.state,
                final.row_version,
                final.server_status,
                final.task_id,
                final.cancel_generation,
            ), operation_id
            assert op.effect_reconciliation_required == final.effect_reconciliation_required
    assert checked > 100


def test_every_seeded_history_is_one_the_decision_path_and_the_machine_allow() -> None:
    """Each script's replies answer the step ``plan.next_step`` names as due, and the machine accepts every event."""
    for name in SCRIPTS:
        for side_effects in (False, True):
            replayed = replay(name, side_effects=side_effects)
            assert replayed.rows[0].event == "Created"
            assert len(replayed.rows) == len(SCRIPTS[name]) + 1


def test_a_script_asking_for_a_reply_the_decision_path_does_not_wait_for_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fetch before any terminal status is no seeded history: the replay raises instead of writing it."""
    completed = SCRIPTS["completed"]
    monkeypatch.setitem(SCRIPTS, "completed", (completed[0], completed[-1]))
    with pytest.raises(SeedScriptError, match="calls for poll, not fetch"):
        replay("completed", side_effects=False)


def test_seeded_explorer_runs_are_marked_seeded_and_never_count_toward_the_divergence_gate(
    seeded_ledger: Path,
) -> None:
    """#14 point 9 on a seeded ledger: every explorer row says code 'seeded', and the gate counts none of them."""
    with Ledger.open(seeded_ledger, read_only=True) as ledger:
        codes = {r["code"] for r in ledger._rows("SELECT DISTINCT code FROM explorer_runs", [])}
        assert codes == {"seeded"}
        inputs = ledger.gate_inputs(SystemClock().now())
    assert inputs["terminal_divergence"]["explorer_runs"] == 0
    verdict = {r.gate: r for r in evaluate(inputs).results}["terminal_divergence"]
    assert not verdict.passed
