"""The DuckDB ledger's whole-ledger paths: snapshot copies, the gate-inputs read, export batches, seeded import.

What ``engine.ledger.duckdb.Ledger`` does over the whole file rather than one operation: the
consistent copy readers open (``snapshot``), the one gate-inputs statement, the Parquet export's
read transaction and the seeding's sequence numbers and appends. It runs through the
connection the driver gives (``_con``, the transaction's cursor) and must not import duckdb
(``engine.ledger.duckdb`` owns the connection); it decides nothing about states.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from engine.errors import LedgerError
from engine.ledger.bulk import BulkRows
from engine.ledger.export import BATCH_ROWS
from engine.ledger.gate_sql import gate_inputs_from_values, gate_inputs_sql

__all__ = ["DuckBulk"]


class DuckBulk(BulkRows):
    """Snapshot copies, the gate inputs, the export's batches and the seeding's import, for DuckDB."""

    @property
    @abstractmethod
    def _con(self) -> Any:
        """This thread's cursor on the database (the driver's ``duckdb`` connection)."""

    def _next_ids(self, tx: Any, sequence: str, n: int) -> list[int]:
        # fetchall: a half-read result would block registering the rows afterwards
        (row,) = tx.execute(
            f"SELECT min(v), max(v) FROM (SELECT nextval('{sequence}') AS v FROM range(?))", [n]
        ).fetchall()
        first = int(row[0])
        if int(row[1]) - first + 1 != n:
            raise LedgerError(f"{sequence} moved during the import; another writer is active")
        return list(range(first, first + n))

    def _import_table(self, tx: Any, table: str, rows: pa.Table) -> None:
        tx.register("imported_rows", rows)
        try:
            tx.execute(f"INSERT INTO {table} BY NAME SELECT * FROM imported_rows")
        finally:
            tx.unregister("imported_rows")

    @contextmanager
    def _read_batches(self) -> Iterator[Callable[[str], pa.RecordBatchReader]]:
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            yield lambda query: con.sql(query).to_arrow_reader(BATCH_ROWS)
        finally:
            con.execute("ROLLBACK")

    def snapshot(self, dest: str | Path) -> Path:
        """Write a consistent copy of the whole ledger to ``dest`` (replaced if present), for readers.

        The copy is made inside one read transaction, so it is a single point in time.
        """
        target = Path(dest)
        partial = target.with_name(target.name + ".partial")
        for stale in (partial, Path(str(partial) + ".wal")):
            stale.unlink(missing_ok=True)
        con = self._con
        row = con.execute("SELECT current_database()").fetchone()
        source = str(row[0]) if row else "memory"
        escaped = str(partial).replace("'", "''")
        con.execute(f"ATTACH '{escaped}' AS finality_snapshot")
        try:
            con.execute(f'COPY FROM DATABASE "{source}" TO finality_snapshot')
        finally:
            con.execute("DETACH finality_snapshot")
        partial.replace(target)
        return target

    def gate_inputs(self, now: datetime) -> dict[str, dict[str, object]]:
        """The raw inputs of the six gates, read from the ledger only (no thresholds applied here).

        One statement, defined once in ``engine.ledger.gate_sql`` and shared with the console.
        """
        cur = self._con.execute(gate_inputs_sql(now))
        row = cur.fetchone()
        if row is None:
            raise LedgerError("the gate-inputs statement returned no row")
        return gate_inputs_from_values([d[0] for d in cur.description or ()], row)
