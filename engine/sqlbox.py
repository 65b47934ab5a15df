"""The analysts' SQL sandbox: read-only queries on a ledger snapshot, never on the live ledger.

Each query runs in a fresh in-memory DuckDB that ATTACHes a snapshot file READ_ONLY, then turns
external access off and locks its configuration, so files, extensions, other databases and
settings are out of reach. Only a single SELECT (or EXPLAIN) statement is accepted; everything else
is refused with a clear message before it runs. Results are capped in rows and in time.

Snapshots are made by the process that owns the ledger (``Ledger.snapshot``); readers with no
service running may point the sandbox at a ledger file directly, which it attaches read-only.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import duckdb

from engine.errors import SqlRefused

_ALLOWED = {"StatementType.SELECT", "StatementType.EXPLAIN"}
_WHAT = {
    "StatementType.INSERT": "writes (INSERT)",
    "StatementType.UPDATE": "writes (UPDATE)",
    "StatementType.DELETE": "writes (DELETE)",
    "StatementType.CREATE": "creating objects",
    "StatementType.DROP": "dropping objects",
    "StatementType.ALTER": "altering objects",
    "StatementType.COPY": "COPY (files are out of reach)",
    "StatementType.ATTACH": "ATTACH (other databases are out of reach)",
    "StatementType.DETACH": "DETACH",
    "StatementType.LOAD": "INSTALL/LOAD of extensions",
    "StatementType.SET": "changing settings",
    "StatementType.PRAGMA": "PRAGMA",
    "StatementType.EXPORT": "EXPORT",
    "StatementType.TRANSACTION": "transaction control",
    "StatementType.CALL": "CALL",
}
# Table functions that read files or reach outside; refused by name too, so the message is clear
# even before DuckDB's own external-access check refuses them.
_FILE_FUNCTIONS = re.compile(
    r"\b(read_\w+|glob|parquet_\w+|sniff_csv|iceberg_\w+|delta_scan|sqlite_\w+|postgres_\w+|mysql_\w+|"
    r"httpfs\w*|duckdb_secrets|getenv|current_setting|which_secret)\s*\(",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: list[str]
    rows: list[list[object]]
    truncated: bool
    elapsed_ms: float

    def as_json(self) -> dict[str, object]:
        return {
            "columns": self.columns,
            "rows": [[_plain(v) for v in row] for row in self.rows],
            "truncated": self.truncated,
            "row_count": len(self.rows),
            "elapsed_ms": round(self.elapsed_ms, 1),
        }


def _plain(value: object) -> object:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


def check_query(query: str) -> None:
    """Refuse anything but one read-only statement.

    Raises:
        SqlRefused: with what was refused and why.
    """
    text = query.strip().rstrip(";").strip()
    if not text:
        raise SqlRefused("empty query")
    if len(text) > 100_000:
        raise SqlRefused("query longer than 100,000 characters")
    try:
        statements = duckdb.connect(":memory:").extract_statements(text)
    except duckdb.Error as exc:
        raise SqlRefused(f"cannot parse the query: {exc}") from exc
    if len(statements) != 1:
        raise SqlRefused(f"one statement at a time, got {len(statements)}")
    kind = str(statements[0].type)
    if kind not in _ALLOWED:
        what = _WHAT.get(kind, kind.removeprefix("StatementType."))
        raise SqlRefused(f"read-only sandbox: {what} is not allowed; only SELECT queries run here")
    match = _FILE_FUNCTIONS.search(text)
    if match:
        raise SqlRefused(
            f"read-only sandbox: {match.group(1)}() reaches outside the ledger and is not allowed"
        )


def run_query(
    source: str | Path,
    query: str,
    *,
    max_rows: int = 1000,
    timeout: timedelta = timedelta(seconds=10),
) -> QueryResult:
    """Run one read-only query against a ledger snapshot (or file), attached as ``ledger`` and set as default.

    Raises:
        SqlRefused: the query is not a single read-only statement, reaches outside, times out or fails.
    """
    check_query(query)
    con = duckdb.connect(":memory:")
    try:
        path = str(source).replace("'", "''")
        con.execute(f"ATTACH '{path}' AS ledger (READ_ONLY)")
        con.execute("USE ledger")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        timer = threading.Timer(timeout.total_seconds(), con.interrupt)
        timer.start()
        started = time.perf_counter()
        try:
            cur = con.execute(query)
            columns = [d[0] for d in cur.description or ()]
            rows = cur.fetchmany(max_rows + 1)
        except duckdb.InterruptException as exc:
            raise SqlRefused(f"query stopped after {timeout.total_seconds():g} s") from exc
        except duckdb.Error as exc:
            raise SqlRefused(f"query failed: {exc}") from exc
        finally:
            timer.cancel()
        elapsed = (time.perf_counter() - started) * 1000
    finally:
        con.close()
    truncated = len(rows) > max_rows
    return QueryResult(columns, [list(r) for r in rows[:max_rows]], truncated, elapsed)
