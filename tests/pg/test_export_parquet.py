"""finality export --parquet: every documented table as Parquet, from a DuckDB snapshot file or a PostgreSQL ledger.

Both backends are seeded with the same history (``demo.seed``) and exported; the files are read
back with plain pyarrow and pandas and checked against ``docs/ledger.md`` (columns, order, types)
and against the ledger's own counts. The PostgreSQL export reads through the read-only analyst role.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import cast

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pa_ds
import pyarrow.parquet as pq
import pytest

from demo.seed import seed_ledger
from engine.ledger import open_ledger, pg_client
from engine.ledger.export import DAY, PARTITIONED
from engine.ledger.postgres import ANALYST_ROLE
from engine.testing import make_operation
from engine.testing.postgres import TemporaryPostgres
from service.cli import main

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
ARROW_OF_DOC = {
    "VARCHAR": pa.string(),
    "BOOLEAN": pa.bool_(),
    "INTEGER": pa.int32(),
    "BIGINT": pa.int64(),
    "DOUBLE": pa.float64(),
    "TIMESTAMPTZ": pa.timestamp("us", tz="Etc/UTC"),
}


def documented_schema() -> dict[str, list[tuple[str, str]]]:
    tables: dict[str, list[tuple[str, str]]] = {}
    current: str | None = None
    for line in (ROOT / "docs" / "ledger.md").read_text().splitlines():
        heading = re.match(r"^### (\w+)$", line)
        if heading:
            current = heading.group(1)
            tables[current] = []
        elif current and (cell := re.match(r"^\| (\w+) \| ([A-Z]+) \|", line)):
            tables[current].append((cell.group(1), cell.group(2)))
    return tables


def seeded(target: str) -> dict[str, int]:
    """Seed ``target`` with the fixed history; the ledger's own count of every table of ledger data
    (``schema_migrations`` differs by backend and is not one)."""
    seed_ledger(target, operations=240, seed=11, now=NOW, gate_run_count=4)
    led = open_ledger(target, read_only=True)
    try:
        return {t: led.count(t) for t in documented_schema() if t != "schema_migrations"}
    finally:
        led.close()


def export(ledger: str, folder: Path) -> tuple[int, str, str]:
    """``finality export --parquet folder --ledger ledger --json`` in this process: exit code, out, err."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["export", "--parquet", str(folder), "--ledger", ledger, "--json"])
    return code, out.getvalue(), err.getvalue()


@dataclass(frozen=True)
class Exported:
    counts: dict[str, int]
    written: dict[str, int]
    folder: Path


def seeded_and_exported(target: str, folder: Path) -> Exported:
    counts = seeded(target)
    code, out, err = export(target, folder)
    assert code == 0, err
    return Exported(counts, json.loads(out), folder)


@pytest.fixture(scope="module")
def from_duckdb(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    where = tmp_path_factory.mktemp("duckdb-export")
    return seeded_and_exported(str(where / "seeded.duckdb"), where / "parquet")


@pytest.fixture(scope="module")
def from_postgres(tmp_path_factory: pytest.TempPathFactory, pg_cluster: TemporaryPostgres) -> Exported:
    where = tmp_path_factory.mktemp("pg-export")
    return seeded_and_exported(pg_cluster.create_database(f"t_{uuid.uuid4().hex[:16]}"), where / "parquet")


@pytest.fixture(params=["duckdb", "postgres"])
def exported(request: pytest.FixtureRequest) -> Exported:
    return cast(Exported, request.getfixturevalue(f"from_{request.param}"))


def read_schema(folder: Path, table: str) -> pa.Schema:
    if table in PARTITIONED:
        return pa_ds.dataset(folder / table, format="parquet", partitioning="hive").schema
    return pq.read_schema(folder / f"{table}.parquet")


def test_every_documented_table_is_written_with_the_documented_columns_types_and_counts(
    exported: Exported,
) -> None:
    """Each table of docs/ledger.md becomes Parquet with its columns in order, its types, and every row."""
    out = exported.folder
    assert set(exported.written) == set(documented_schema())
    for table, columns in documented_schema().items():
        schema = read_schema(out, table)
        expected = [(name, ARROW_OF_DOC[kind]) for name, kind in columns]
        got = [(f.name, f.type) for f in schema if f.name != DAY]
        assert got == expected, table
        frame = pd.read_parquet(out / (table if table in PARTITIONED else f"{table}.parquet"))
        assert len(frame) == exported.written[table] == exported.counts.get(table, len(frame)), table
    assert exported.counts["operations"] == 240
    assert exported.counts["polls"] > 0


def test_large_tables_are_partitioned_by_the_utc_day_of_their_instant(exported: Exported) -> None:
    """transitions and polls sit in day=YYYY-MM-DD folders, and each row's day is its instant's UTC day."""
    for table, stamp in PARTITIONED.items():
        days = sorted(p.name for p in (exported.folder / table).iterdir())
        assert len(days) >= 2, days
        assert all(re.fullmatch(r"day=\d{4}-\d{2}-\d{2}", d) for d in days)
        frame = pd.read_parquet(exported.folder / table)
        utc_days = frame[stamp].dt.tz_convert("UTC").dt.strftime("%Y-%m-%d")
        assert (frame[DAY].astype(str) == utc_days).all(), table


def test_both_backends_export_the_same_rows_for_the_same_history(
    from_duckdb: Exported, from_postgres: Exported
) -> None:
    """A DuckDB ledger and a PostgreSQL ledger seeded alike export equal operations and receipts."""
    assert from_duckdb.counts == from_postgres.counts
    for table, key in (("operations", "operation_id"), ("receipts", "call_node_id")):
        a = pd.read_parquet(from_duckdb.folder / f"{table}.parquet").sort_values(key, ignore_index=True)
        b = pd.read_parquet(from_postgres.folder / f"{table}.parquet").sort_values(key, ignore_index=True)
        pd.testing.assert_frame_equal(a, b)


def test_the_postgres_export_reads_as_the_analyst_role_and_fails_clearly_without_it(
    pg_url: str, tmp_path: Path
) -> None:
    """Without SELECT for the analyst role the export stops naming the table, instead of reading as the owner."""
    led = open_ledger(pg_url)
    led.create_operation(make_operation("n1"), {"report": "n1"})
    led.close()
    with pg_client.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"REVOKE SELECT ON receipts FROM {ANALYST_ROLE}")
    code, _, err = export(pg_url, tmp_path / "p")
    assert code != 0
    assert "permission denied for table receipts" in err
