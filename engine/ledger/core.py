"""The primitives every part of the shared SQL ledger (``engine.ledger.base.SqlLedger``) stands on.

``SqlCore`` names what a driver (``engine.ledger.duckdb``, ``engine.ledger.postgres``) supplies:
its dialect, write transactions, reads, bulk appends and what counts as a uniqueness conflict.
The concerns built on it (``reads``, ``receipts``, ``writes``, ``actions``, ``rollout_records``,
``records``, ``bulk``) use only these and each other's public methods.

It must not import a database driver, and it decides nothing about states (``engine.machine`` does).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Final, TypeVar

from engine.ledger import sql
from engine.ledger.schema import _STATE_COLUMNS, ASSIGNMENT_COLUMNS
from engine.model import Operation

__all__ = ["SqlCore", "cas_params"]

T = TypeVar("T")


_N: Final = len(_STATE_COLUMNS)


def cas_params(state_row: Sequence[object]) -> list[object]:
    """``sql.STATE_UPDATE``'s parameters from a ``rows._state_row`` (new values, then id and expected row)."""
    return [*state_row[1:_N], state_row[0], state_row[_N], state_row[_N + 1]]


class SqlCore(ABC):
    """What every part of ``SqlLedger`` stands on: the driver's primitives and its dialect."""

    dialect: ClassVar[str]
    """``"duckdb"`` or ``"postgres"``: which spelling of ``engine.ledger.sql``'s texts this driver runs."""
    _private_tables: ClassVar[frozenset[str]] = frozenset()
    """Tables of the driver's own coordination, not ledger data (left out of ``table_columns``)."""
    _unimported_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    """Columns ``import_rows`` leaves empty, per table."""
    path: str
    read_only: bool

    @abstractmethod
    def _tx(self) -> AbstractContextManager[Any]:
        """A write transaction; yields a cursor (``execute``, ``executemany``, ``fetchone``, ``fetchall``)."""

    @abstractmethod
    def _rows(self, query: str, params: Sequence[object] = ()) -> list[dict[str, object]]:
        """A read (``query`` in ``engine.ledger.sql``'s spelling) as rows of column -> value."""

    @abstractmethod
    def _fetchone(self, query: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        """A read's first row, or None."""

    @abstractmethod
    def _fetchall(self, query: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """A read's rows, as tuples."""

    @abstractmethod
    def _affected(self, tx: Any, query: str, params: Sequence[object]) -> int:
        """Run a write in ``tx``; how many rows it wrote."""

    @abstractmethod
    def _insert_many(self, tx: Any, table: str, rows: Sequence[Sequence[object]], suffix: str = "") -> None:
        """Append ``rows`` (``schema.ROW_SCHEMAS[table]``'s columns) to ``table``; ``suffix`` ends the INSERT."""

    @abstractmethod
    def _conflict(self, exc: Exception) -> bool:
        """Whether ``exc`` is the database refusing a write on a uniqueness or write-write conflict."""

    @abstractmethod
    def _operations_in(self, column: str, values: Sequence[str]) -> list[Operation]:
        """The operations whose ``column`` is one of ``values``."""

    def _insert_arms(self, tx: Any, rows: Sequence[Mapping[str, object]], *, fresh: bool = False) -> None:
        """Append rollout assignment rows (``ASSIGNMENT_COLUMNS``) in ``tx``; a second row for an
        operation is ignored. The one writer of ``rollout_assignments``.

        ``fresh``: the arms of operations ``tx`` itself inserted, which no row can hold yet; written
        without the conflict clause, which doubles DuckDB's INSERT (3.7 -> 7.7 ms for 1-20 rows)."""
        if rows:
            self._insert_many(
                tx,
                "rollout_assignments",
                [[r.get(c) for c in ASSIGNMENT_COLUMNS] for r in rows],
                "" if fresh else sql.IGNORE_DUPLICATE,
            )

    def _retrying(self, action: Callable[[], T]) -> T:
        """Run ``action``, again where the backend aborts a transaction that is safe to repeat."""
        return action()

    def _serialise(self, tx: Any, key: str) -> None:
        """Make concurrent transactions about ``key`` wait for each other (a backend shared by processes)."""
        return  # one writing process: nothing to wait for

    def _q(self, text: str) -> str:
        return sql.render(text, self.dialect)

    def schema_version(self) -> int:
        row = self._fetchone(sql.SCHEMA_VERSION)
        return int(row[0]) if row else 0
