"""The shared SQL ledger's bulk paths: importing seeded rows (demo, tests, bench) and the Parquet export.

``import_rows`` bypasses ``engine.machine`` and ``accept_terminal`` and is for seeded ledgers only;
the service never calls it. ``export_parquet`` reads every documented table in one instant. The
driver supplies sequence numbers, the table append and the read-only batch reader. It must not
import a database driver.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from engine.errors import LedgerError
from engine.ledger import export
from engine.ledger.reads import EngineReads
from engine.ledger.schema import _TABLES, OUTBOX_SEQUENCE

__all__ = ["NOT_IMPORTABLE", "SEQUENCED", "BulkRows"]

SEQUENCED: Final[dict[str, tuple[str, str]]] = {
    "transitions": ("seq", "transition_seq"),
    "reconciliation": ("entry_id", "reconciliation_seq"),
    "outbox": ("seq", OUTBOX_SEQUENCE),
}
"""Tables whose first column a sequence numbers: the column, and the sequence."""


NOT_IMPORTABLE: Final = frozenset(
    # The rollout's state and its hash chain are written only by the rollout module.
    {
        "operations",
        "gate_runs",
        "explorer_runs",
        "settings",
        "rollout_state",
        "rollout_events",
        "access_denials",
    }
)


class BulkRows(EngineReads):
    """Bulk import of seeded rows and the Parquet export of every documented table."""

    def import_rows(self, tables: Mapping[str, pa.Table]) -> dict[str, int]:
        """Append pre-built rows to ledger tables in ONE transaction: for seeded demo/test/bench ledgers only.

        This bypasses ``engine.machine`` and ``accept_terminal``: the caller (``demo.seed``)
        vouches that the rows are one consistent history. The service never calls it. The database's
        own keys still hold, so a second receipt or outbox row for a call node fails the whole import.
        Columns are matched by name. Sequence-backed ids (``transitions.seq``,
        ``reconciliation.entry_id``) must be left out: they are numbered here, in the order of the
        rows given, and the sequence is advanced past them so later writes continue after them.
        ``gate_runs`` and ``explorer_runs`` are not importable (use ``record_gate_run`` and
        ``record_explorer_run``), nor are the rollout's state and hash-chained events. Columns a
        backend adds of its own (PostgreSQL's leases) are left empty.

        Returns:
            Rows imported per table.

        Raises:
            LedgerError: a table is not importable, or its columns do not match the schema.
        """
        prepared = self._import_plan(tables)
        counts: dict[str, int] = {}
        with self._tx() as tx:
            for table, rows in prepared:
                if table in SEQUENCED and rows.num_rows:
                    column, sequence = SEQUENCED[table]
                    ids = self._next_ids(tx, sequence, rows.num_rows)
                    rows = rows.append_column(column, pa.array(ids, pa.int64()))
                self._import_table(tx, table, rows)
                counts[table] = counts.get(table, 0) + rows.num_rows
        return counts

    @abstractmethod
    def _next_ids(self, tx: Any, sequence: str, n: int) -> list[int]:
        """``n`` consecutive numbers of ``sequence``, in order (the sequence moves past them)."""

    @abstractmethod
    def _import_table(self, tx: Any, table: str, rows: pa.Table) -> None:
        """Append ``rows`` to ``table``, columns matched by name."""

    @abstractmethod
    def _read_batches(self) -> AbstractContextManager[Callable[[str], pa.RecordBatchReader]]:
        """One read-only transaction (a single instant); yields ``query -> record batches`` within it."""

    def export_parquet(self, folder: str | Path) -> dict[str, int]:
        """Write every documented table (``table_columns``) as Parquet under ``folder``; rows per table.

        All tables are read in one read-only transaction, so the files agree with each other as of
        one instant while writers go on; ``engine.ledger.export`` says how the files are laid out.
        Columns a backend adds of its own (PostgreSQL's leases) are left out, so both backends write
        the columns of ``docs/ledger.md``.

        Raises:
            LedgerUnavailable: the ledger cannot be read.
        """
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written: dict[str, int] = {}
        with self._read_batches() as read:
            for table, columns in sorted(self.table_columns().items()):
                own = set(self._unimported_columns.get(table, ()))
                kept = [c for c in columns if c not in own]
                written[table] = export.write_table(out, table, read(export.export_select(table, kept)))
        return written

    def _import_plan(self, tables: Mapping[str, pa.Table]) -> list[tuple[str, pa.Table]]:
        """``import_rows``' tables, checked: importable, with exactly the schema's columns (the
        sequence-numbered one left out)."""
        importable = _TABLES - NOT_IMPORTABLE
        schema = self.table_columns()
        prepared: list[tuple[str, pa.Table]] = []
        for table, rows in tables.items():
            if table not in importable:
                raise LedgerError(f"table {table!r} cannot be bulk-imported")
            left_empty = self._unimported_columns.get(table, ())
            expected = [c for c in schema[table] if c not in left_empty]
            if table in SEQUENCED:
                column, _ = SEQUENCED[table]
                if column in rows.column_names:
                    raise LedgerError(f"{table}.{column} is numbered by the ledger; leave it out")
                expected.remove(column)
            if sorted(rows.column_names) != sorted(expected):
                missing = sorted(set(expected) - set(rows.column_names))
                extra = sorted(set(rows.column_names) - set(expected))
                raise LedgerError(f"{table}: columns do not match (missing {missing}, unexpected {extra})")
            prepared.append((table, rows))
        return prepared
