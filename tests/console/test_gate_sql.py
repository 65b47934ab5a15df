"""engine.ledger.gate_sql: the one gate-inputs statement runs on a ledger connection and in the sandbox alike,
and agrees with a plain, unpruned reference computed here independently."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from engine.ledger import duckdb_client
from engine.ledger.duckdb import Ledger
from engine.ledger.gate_sql import COLUMNS, gate_inputs_from_row, gate_inputs_sql
from engine.ledger.port import ExplorerRun
from engine.ledger.sandbox import run_query
from engine.revision import running_revision

NOW = datetime(2030, 1, 1, tzinfo=UTC)


SHIPPED = "rules = 'engine' AND code = 'shipped' AND revision = ?"
"""The runs the divergence gate counts: the shipped code's, with the engine's rules, at this revision."""


def _reference(con: duckdb_client.Connection, now: datetime) -> dict[str, object]:
    """Each input by the simplest SQL that states it (no pruning, one query each)."""

    def one(sql: str, *params: object) -> object:
        row = con.execute(sql, list(params)).fetchone()
        assert row is not None
        return row[0]

    cancel = "epoch(r.accepted_at) - epoch(s.cancel_requested_at)"
    age = "CASE WHEN status = 'open' THEN epoch(?::TIMESTAMPTZ) - epoch(opened_at) ELSE epoch(resolved_at) - epoch(opened_at) END"
    return {
        "explorer_runs": one(f"SELECT count(*) FROM explorer_runs WHERE {SHIPPED}", running_revision()),
        "interleavings": one(
            f"SELECT coalesce(sum(distinct_interleavings), 0) FROM explorer_runs WHERE {SHIPPED}",
            running_revision(),
        ),
        "divergent": one(
            f"SELECT coalesce(sum(divergent), 0) FROM explorer_runs WHERE {SHIPPED}", running_revision()
        ),
        "operations": one("SELECT count(*) FROM op_state"),
        "operations_with_second_server_task": one(
            "SELECT count(*) FROM (SELECT operation_id FROM task_bindings GROUP BY 1 HAVING count(*) > 1)"
        ),
        "resubmitted": one("SELECT count(*) FROM op_state WHERE submit_attempts > 0"),
        "requests": one("SELECT count(*) FROM polls"),
        # Every poll opens a one-second window; the busiest one, counted over all polls (no buckets).
        "busiest_1s_window": one(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) OVER (ORDER BY sent_at RANGE BETWEEN CURRENT ROW "
            "AND INTERVAL 999999 MICROSECONDS FOLLOWING) AS n FROM polls)"
        ),
        "confirmed": one(
            "SELECT count(*) FROM op_state s JOIN receipts r USING (operation_id) "
            "WHERE s.cancel_requested_at IS NOT NULL"
        ),
        "p99_s": one(
            f"SELECT quantile_cont({cancel}, 0.99) FROM op_state s JOIN receipts r USING (operation_id) "
            "WHERE s.cancel_requested_at IS NOT NULL"
        ),
        "pending": one(
            "SELECT count(*) FROM op_state WHERE cancel_requested_at IS NOT NULL "
            "AND state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED')"
        ),
        "entries": one("SELECT count(*) FROM reconciliation WHERE kind = 'unknown'"),
        "open": one("SELECT count(*) FROM reconciliation WHERE kind = 'unknown' AND status = 'open'"),
        "p99_age_s": one(
            f"SELECT quantile_cont({age}, 0.99) FROM reconciliation WHERE kind = 'unknown'", now
        ),
        "outbox_rows": one("SELECT count(*) FROM outbox"),
        "advances": one("SELECT count(*) FROM outbox_acks"),
        "untraceable": one(
            "SELECT count(*) FROM outbox_acks a WHERE NOT EXISTS (SELECT 1 FROM receipts r WHERE "
            "r.call_node_id = a.call_node_id AND r.status = a.status "
            "AND r.result_digest IS NOT DISTINCT FROM a.result_digest)"
        ),
        "refused_acks": one("SELECT count(*) FROM outbox_ack_refusals"),
        "unacknowledged": one(
            "SELECT count(*) FROM outbox o WHERE o.call_node_id NOT IN (SELECT call_node_id FROM outbox_acks)"
        ),
    }


def _flat(inputs: dict[str, dict[str, object]]) -> dict[str, object]:
    names = {"resubmitted_after_proof_of_absence": "resubmitted"}
    return {names.get(k, k): v for values in inputs.values() for k, v in values.items()}


def test_the_statement_agrees_with_a_plain_reference_on_a_ledger_connection_and_in_the_sandbox(
    seeded_ledger: Path,
) -> None:
    """Same row on a ledger connection and through the sandbox, and each input equals its plain definition."""
    sql = gate_inputs_sql(NOW)
    con = duckdb_client.connect(str(seeded_ledger), read_only=True)
    try:
        cursor = con.execute(sql)
        columns = [d[0] for d in cursor.description or ()]
        values = cursor.fetchone()
        assert values is not None
        reference = _reference(con, NOW)
    finally:
        con.close()
    assert tuple(columns) == COLUMNS
    on_ledger = gate_inputs_from_row(dict(zip(columns, values, strict=True)))
    boxed = run_query(seeded_ledger, sql, max_rows=1)
    in_sandbox = gate_inputs_from_row(dict(zip(boxed.columns, boxed.rows[0], strict=True)))
    assert in_sandbox == on_ledger
    flat = _flat(on_ledger)
    assert flat["busiest_1s_window"] > 1  # the seeded polls make the pruned window count matter
    assert flat["open"] > 0
    assert flat["confirmed"] > 0
    assert flat["outbox_rows"] > 0
    for key, expected in reference.items():
        if isinstance(expected, float):
            assert flat[key] == pytest.approx(expected), key
        else:
            assert flat[key] == expected, key


def test_the_busiest_window_is_exact_when_it_straddles_two_seconds(
    seeded_ledger: Path, tmp_path: Path
) -> None:
    """Polls bunched across a second boundary: the pruned count finds the window no single bucket holds."""
    path = tmp_path / "polls.duckdb"
    path.write_bytes(seeded_ledger.read_bytes())
    con = duckdb_client.connect(str(path))
    try:
        con.execute("DELETE FROM polls")
        # 3 polls late in second 10, 3 early in second 11 (6 within 0.2 s), 5 spread over second 20.
        offsets = [0.9, 0.95, 0.99, 1.0, 1.05, 1.1, 10.0, 10.2, 10.4, 10.6, 10.8]
        for offset in offsets:
            con.execute(
                "INSERT INTO polls (operation_id, server, method, epoch, sent_at, outcome) VALUES "
                "('op-1', 's', 'tasks/get', 1, TIMESTAMPTZ '2030-01-01 00:00:10+00' + to_microseconds(?), 'ok')",
                [int(offset * 1_000_000)],
            )
        cursor = con.execute(gate_inputs_sql(NOW))
        row = dict(zip([d[0] for d in cursor.description or ()], cursor.fetchone() or (), strict=True))
    finally:
        con.close()
    assert row["requests"] == 11
    assert row["busiest_1s_window"] == 6


def test_a_row_that_travelled_as_json_converts_to_the_same_inputs(
    seeded_ledger: Path, tmp_path: Path
) -> None:
    """Counts as floats and instants as ISO text (the service's JSON) give the very same inputs."""
    path = tmp_path / "shipped.duckdb"
    path.write_bytes(seeded_ledger.read_bytes())
    with Ledger.open(path) as ledger:  # one run of the shipped code, so the gate has a last run
        ledger.record_explorer_run(
            ExplorerRun(
                "happy",
                "aip-151",
                0,
                10,
                10,
                0,
                True,
                "engine",
                None,
                NOW,
                NOW,
                code="shipped",
                revision=running_revision(),
            )
        )
    boxed = run_query(path, gate_inputs_sql(NOW), max_rows=1)
    row = dict(zip(boxed.columns, boxed.rows[0], strict=True))
    native = gate_inputs_from_row(row)
    as_json = json.loads(json.dumps(row, default=lambda v: v.isoformat()))
    as_json = {k: float(v) if isinstance(v, int) else v for k, v in as_json.items()}
    assert gate_inputs_from_row(as_json) == native
    assert isinstance(native["traceability"]["outbox_rows"], int)
    assert isinstance(native["terminal_divergence"]["last_run_at"], datetime)
    with pytest.raises(ValueError, match="lacks"):
        gate_inputs_from_row({"operations": 1})
