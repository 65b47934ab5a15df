"""Which ledger: ``open_ledger`` picks the backend from the target, and ``LedgerPort`` is what both offer.

A path (or ``:memory:``) opens the embedded DuckDB ledger (``engine.ledger.duckdb.Ledger``, one writing
process); a ``postgresql://`` URL opens the shared PostgreSQL ledger (``engine.ledger.postgres.PgLedger``,
any number of processes, with leases). Code above the ledger types against ``LedgerPort`` and
works on either; ``LeasingLedgerPort`` adds the lease primitives only PostgreSQL has. No I/O here
beyond the backends' own ``open``. ``PgLedger`` loads on first use (PEP 562): a process on a DuckDB
ledger (``finality serve`` restarted after a crash, each ``finality`` command) never imports psycopg.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import LeaseLost
from engine.ledger.duckdb import Ledger
from engine.ledger.port import (
    BatchOutcome,
    ExplorerRun,
    Fence,
    GroupOutcome,
    HeldOutcome,
    Json,
    Lease,
    LeasingLedgerPort,
    LedgerPort,
    Outcomes,
    PollRecord,
    WriteGroup,
    refusals,
)
from engine.model import GateRecord

if TYPE_CHECKING:
    from engine.ledger.postgres import PgLedger

POSTGRES_SCHEMES: tuple[str, ...] = ("postgresql://", "postgres://")


def is_postgres(target: str) -> bool:
    """True if ``target`` names a PostgreSQL ledger (a ``postgresql://`` or ``postgres://`` URL)."""
    return target.strip().lower().startswith(POSTGRES_SCHEMES)


def open_ledger(
    target: str, *, read_only: bool = False, duckdb_threads: int | None = None
) -> Ledger | PgLedger:
    """Open (and migrate) the ledger ``target`` names: a DuckDB file path, or a PostgreSQL URL.

    ``duckdb_threads``: a DuckDB ledger's worker threads (``Ledger.open``'s ``threads``); unused on
    PostgreSQL, whose backends are processes of their own.

    Raises:
        LedgerUnavailable: the file or server cannot be reached, read or written.
        LedgerCorrupt: it is not a Finality ledger, or is damaged.
        SchemaTooNew: a newer Finality wrote it.
    """
    if is_postgres(target):
        from engine.ledger.postgres import PgLedger

        return PgLedger.open(target.strip(), read_only=read_only)
    return Ledger.open(target, read_only=read_only, threads=duckdb_threads)


def __getattr__(name: str) -> object:
    if name == "PgLedger":  # psycopg is imported only where a PostgreSQL ledger is named
        from engine.ledger.postgres import PgLedger

        return PgLedger
    raise AttributeError(f"module 'engine.ledger' has no attribute {name!r}")


def _duckdb_satisfies_the_port(ledger: Ledger) -> LedgerPort:
    return ledger  # mypy --strict checks the structural match


def _postgres_satisfies_the_ports(ledger: PgLedger) -> LeasingLedgerPort:
    return ledger


__all__ = [
    "POSTGRES_SCHEMES",
    "BatchOutcome",
    "ExplorerRun",
    "Fence",
    "GateRecord",
    "GroupOutcome",
    "HeldOutcome",
    "Json",
    "Lease",
    "LeaseLost",
    "LeasingLedgerPort",
    "Ledger",
    "LedgerPort",
    "Outcomes",
    "PgLedger",
    "PollRecord",
    "WriteGroup",
    "is_postgres",
    "open_ledger",
    "refusals",
]
