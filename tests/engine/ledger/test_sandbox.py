"""The analysts' SQL sandbox refuses writes and anything that reaches outside the snapshot."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from engine.errors import LedgerError, SqlRefused
from engine.ledger.duckdb import Ledger
from engine.ledger.sandbox import SharedSandbox, run_query
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


def test_a_kept_sandbox_is_reused_until_its_snapshot_is_replaced(tmp_path: Path) -> None:
    """keep_open reuses the attached snapshot; a newer snapshot at the same path is attached afresh."""
    from engine.ledger import sandbox as sqlbox

    with Ledger.open(tmp_path / "live.duckdb") as ledger:
        ledger.create_many([(make_operation(f"k{i}"), {"i": i}) for i in range(3)])
        snap = ledger.snapshot(tmp_path / "snap.duckdb")
        count = "SELECT count(*) FROM operations"
        assert run_query(snap, count, keep_open=True).rows == [[3]]
        first = sqlbox._local.sandbox[1]
        assert run_query(snap, count, keep_open=True).rows == [[3]]
        assert sqlbox._local.sandbox[1] is first  # same file, unchanged: no new attach
        ledger.create_many([(make_operation(f"k{i}"), {"i": i}) for i in range(3, 5)])
        ledger.snapshot(tmp_path / "snap.duckdb")  # replaced by rename: a new file
        assert run_query(snap, count, keep_open=True).rows == [[5]]
        assert sqlbox._local.sandbox[1] is not first
    sqlbox.close_sandboxes()
    assert sqlbox._local.sandbox is None


def test_a_sandbox_not_kept_leaves_the_file_free_to_open(tmp_path: Path) -> None:
    """Without keep_open the sandbox is closed after the query, so the file can be opened for writing."""
    with Ledger.open(tmp_path / "l.duckdb") as ledger:
        ledger.create_many([(make_operation("f1"), {"i": 1})])
    assert run_query(tmp_path / "l.duckdb", "SELECT count(*) FROM operations").rows == [[1]]
    with Ledger.open(tmp_path / "l.duckdb") as ledger:  # refused if a sandbox still held it
        assert ledger.count("op_state") == 1


def test_kept_sandboxes_refuse_writes_like_fresh_ones(snapshot: Path) -> None:
    """Reuse changes nothing about what is refused: the kept sandbox still runs only single SELECTs."""
    run_query(snapshot, "SELECT 1", keep_open=True)
    for query in ("DELETE FROM op_state", "SET threads = 1", "ATTACH ':memory:' AS x", "SELECT 1; SELECT 2"):
        with pytest.raises(SqlRefused):
            run_query(snapshot, query, keep_open=True)
    with pytest.raises(SqlRefused, match="reaches outside"):
        run_query(snapshot, "SELECT * FROM read_text('/etc/passwd')", keep_open=True)
    assert run_query(snapshot, "SELECT count(*) FROM operations", keep_open=True).rows == [[50]]


def test_a_shared_sandbox_attaches_once_for_overlapping_reads_and_frees_the_file_after(
    tmp_path: Path,
) -> None:
    """Reads made while a SharedSandbox is held (from several threads) share one attach, which keeps a
    writer out; once none runs the file is free, and the next read sees what was written meanwhile."""
    from concurrent.futures import ThreadPoolExecutor

    path = tmp_path / "l.duckdb"
    with Ledger.open(path) as ledger:
        ledger.create_many([(make_operation(f"s{i}"), {"i": i}) for i in range(3)])
    box = SharedSandbox(path)
    count = "SELECT count(*) FROM operations"
    with box.held():
        assert box._con is None  # held, but nothing read yet: nothing attached
        assert box.query(count).rows == [[3]]
        attached = box._con
        assert attached is not None
        with ThreadPoolExecutor(max_workers=3) as pool:
            answers = list(pool.map(lambda _: box.query(count).rows, range(6)))
        assert answers == [[[3]]] * 6
        assert box._con is attached  # one attach for every read of the burst
        with pytest.raises(LedgerError):
            Ledger.open(path)  # held: a writer cannot open the file meanwhile
        for query in ("DELETE FROM op_state", "SET threads = 4", "SELECT 1; SELECT 2"):
            with pytest.raises(SqlRefused):
                box.query(query)
    assert box._con is None
    with Ledger.open(path) as ledger:  # free again once the reads ended
        ledger.create_many([(make_operation("s3"), {"i": 3})])
    assert box.query(count).rows == [[4]]
