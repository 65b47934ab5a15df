"""Parquet files of a ledger for analysts: every documented table, the large append-only ones by UTC day.

``SqlLedger.export_parquet`` reads each table in one read transaction (a single instant, whichever
backend) as Arrow record batches, with ``export_select``'s statement, and hands them here; this module
only decides the layout and writes the files. ``transitions`` and ``polls`` grow with traffic, so they
become Hive-partitioned folders (``<table>/day=YYYY-MM-DD/*.parquet``, one extra ``day`` DATE column);
every other table is one file ``<table>.parquet``. Columns, their order and their types are the
ledger's own (``docs/ledger.md``).

It must not open a database or choose which tables exist: the ledger says that (``table_columns``).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

PARTITIONED: Final[dict[str, str]] = {"transitions": "recorded_at", "polls": "sent_at"}
"""The tables that grow with traffic, and the instant whose UTC day partitions each row."""

DAY: Final = "day"
"""The partition column added to ``PARTITIONED`` tables (a DATE, the UTC day of the row's instant)."""

BATCH_ROWS: Final = 65_536
"""Rows per Arrow batch read from the ledger: bounds the export's memory whatever the table's size."""


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def export_select(table: str, columns: Sequence[str]) -> str:
    """The one statement that reads ``table`` for export, in both dialects: its columns, and the day."""
    listed = ", ".join(_quoted(c) for c in columns)
    stamp = PARTITIONED.get(table)
    if stamp is not None:
        # timezone('UTC', timestamptz) is the UTC wall-clock time in DuckDB and PostgreSQL alike.
        listed += f", CAST(timezone('UTC', {_quoted(stamp)}) AS DATE) AS {DAY}"
    return f"SELECT {listed} FROM {_quoted(table)}"


def write_table(folder: Path, table: str, batches: pa.RecordBatchReader) -> int:
    """Write ``table``'s rows under ``folder`` (replacing an earlier export of it); rows written."""
    # Imported here, not at the top: pyarrow.dataset pulls in pandas, a fifth of the import time of
    # every `finality` process, and only an export needs it.
    import pyarrow.dataset as pa_ds
    import pyarrow.parquet as pq

    if table in PARTITIONED:
        target = folder / table
        if target.exists():
            shutil.rmtree(target)
        counted = _Counting(batches)
        pa_ds.write_dataset(
            counted.reader(),
            target,
            format="parquet",
            partitioning=pa_ds.partitioning(pa.schema([(DAY, pa.date32())]), flavor="hive"),
            basename_template="part-{i}.parquet",
            existing_data_behavior="overwrite_or_ignore",
        )
        if counted.rows == 0:
            # No day to partition by: one empty file keeps the folder readable, with every column.
            target.mkdir(parents=True, exist_ok=True)
            pq.write_table(batches.schema.empty_table(), target / "empty.parquet")
        return counted.rows
    rows = 0
    with pq.ParquetWriter(folder / f"{table}.parquet", batches.schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
            rows += batch.num_rows
    return rows


class _Counting:
    """Passes batches through, counting their rows (``write_dataset`` does not say how many it wrote)."""

    def __init__(self, batches: pa.RecordBatchReader) -> None:
        self._batches = batches
        self.rows = 0

    def reader(self) -> pa.RecordBatchReader:
        def counted() -> Iterator[Any]:
            for batch in self._batches:
                self.rows += batch.num_rows
                yield batch

        return pa.RecordBatchReader.from_batches(self._batches.schema, counted())


__all__ = ["BATCH_ROWS", "DAY", "PARTITIONED", "export_select", "write_table"]
