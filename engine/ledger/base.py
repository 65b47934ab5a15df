"""What the DuckDB and PostgreSQL ledgers do the same way, written once over a few primitives each driver gives.

``SqlLedger`` holds every method whose logic and statements (``engine.ledger.sql``) both backends
share, composed from one part per concern, each under ``engine.ledger``:

- ``core.SqlCore``: what a driver supplies (its dialect, transactions, reads, bulk appends and what
  counts as a uniqueness conflict), which every part below stands on;
- ``reads.EngineReads``: operations, receipts, results, logs and counts;
- ``receipts.Receipts``: the rows an acceptance writes (receipt, result, outbox) and the outbox's
  consumers;
- ``writes.GroupWrites``: new operations, compare-and-swap and write groups, with the
  retry-one-by-one fallbacks of the group-committed writes;
- ``actions.ActionRecords``: approvals and reconciliation, what people act on;
- ``rollout_records.RolloutRecords``: the rollout's state, audit chain, arms and shadow comparisons;
- ``records.ServiceRecords``: settings and turns, gate runs, explorer runs, refused attempts;
- ``bulk.BulkRows``: the seeding's bulk import and the Parquet export.

A driver (``engine.ledger.duckdb``, ``engine.ledger.postgres``) keeps what only it does (DuckDB's
Arrow-registered batches and file checks; PostgreSQL's row locks, leases, fencing and send slots).

It must not import a database driver, and it decides nothing about states (``engine.machine`` does).
"""

from __future__ import annotations

from engine.ledger.actions import ActionRecords
from engine.ledger.bulk import BulkRows
from engine.ledger.records import ServiceRecords
from engine.ledger.rollout_records import RolloutRecords
from engine.ledger.writes import GroupWrites

__all__ = ["SqlLedger"]


class SqlLedger(GroupWrites, ActionRecords, RolloutRecords, ServiceRecords, BulkRows):
    """The shared body of ``Ledger`` (DuckDB) and ``PgLedger`` (PostgreSQL); see the module docstring."""
