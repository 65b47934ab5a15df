"""The analysts' SQL sandbox refuses writes and anything that reaches outside the snapshot."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from engine.errors import SqlRefused
from engine.ledger import Ledger
from engine.sqlbox import run_query
from engine.testing import make_operation


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sql")
    with Ledger.open(folder / "live.duckdb") as ledger:
        ledger.create_many([(make_operation(f"q{i}"), {"i": i}) for i in range(50)])
        return ledger.snapshot(folder / "snap.duckdb")


def test_select_runs_on_the_snapshot(snapshot: Path) -> None:
    """A plain SELECT answers with columns and rows."""
    result = run_query(snapshot, "SELECT state, count(*) AS n FROM operations GROUP BY state")
    assert result.columns == ["state", "n"]
    assert result.rows == [["SUBMITTING", 50]]


def test_rows_are_capped(snapshot: Path) -> None:
    """Results stop at max_rows and say they were truncated."""
    result = run_query(snapshot, "SELECT * FROM operations", max_rows=10)
    assert len(result.rows) == 10
    assert result.truncated


def test_long_queries_are_stopped(snapshot: Path) -> None:
    """A query past its time cap is interrupted with a clear message."""
    with pytest.raises(SqlRefused, match="stopped after"):
        run_query(
            snapshot,
            "SELECT count(*) FROM range(1000000000) a, range(1000) b",
            timeout=timedelta(milliseconds=200),
        )


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("DELETE FROM op_state", "DELETE"),
        ("UPDATE op_state SET state = 'ACCEPTED'", "UPDATE"),
        ("INSERT INTO receipts SELECT * FROM receipts", "INSERT"),
        ("COPY op_state TO 'out.csv'", "COPY"),
        ("ATTACH 'other.duckdb' AS other", "ATTACH"),
        ("INSTALL httpfs", "INSTALL/LOAD"),
        ("LOAD httpfs", "INSTALL/LOAD"),
        ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
        ("SELECT * FROM read_text('/etc/passwd')", "read_text"),
        ("SELECT * FROM read_parquet('x.parquet')", "read_parquet"),
        ("SELECT * FROM '/etc/passwd.csv'", "disabled"),
        ("SELECT getenv('HOME')", "getenv"),
        ("SET threads = 1", "settings"),
        ("CREATE TABLE t AS SELECT 1", "creating"),
        ("DROP TABLE op_state", "dropping"),
        ("SELECT 1; DELETE FROM op_state", "one statement"),
        ("", "empty"),
    ],
)
def test_hostile_sql_is_refused_clearly(snapshot: Path, query: str, message: str) -> None:
    """Each kind of write, escape or trick is refused with a message that says what was refused."""
    before = run_query(snapshot, "SELECT count(*) FROM op_state").rows
    with pytest.raises(SqlRefused, match=message):
        run_query(snapshot, query)
    assert run_query(snapshot, "SELECT count(*) FROM op_state").rows == before
