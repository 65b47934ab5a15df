"""The PostgreSQL ledger's fencing: why a write of an executor whose lease or epoch moved is refused.

A handle made by ``PgLedger.fenced`` carries a ``Fence`` (owner, lease token, execution epoch);
every operation write in ``engine.ledger.postgres`` asks these methods first and refuses
(``LeaseLost``, ``EpochMoved``) instead of writing. They read through the write transaction's
cursor only; they must not import psycopg (``engine.ledger.postgres`` owns the connection) and
decide nothing about states.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from engine.ledger.core import SqlCore
from engine.ledger.port import Fence
from engine.model import Operation

__all__ = ["PgFencing"]


class PgFencing(SqlCore):
    """The fence of a handle and the refusals it makes (the epoch row is share-locked until commit)."""

    fence: Fence | None
    """The fence every operation write of this handle checks, or None (an unfenced handle)."""

    def _epoch_refusal(self, cur: Any) -> str | None:
        """Why the fence's epoch is too old, or None. Share-locks the epoch row until commit,
        so a rollback raising the epoch waits for this write (and fences every later one).

        ``cur`` is the write transaction's cursor (typed ``Any``: psycopg is the driver's import)."""
        if self.fence is None:
            return None
        row = cur.execute("SELECT epoch FROM rollout_state WHERE id = 1 FOR SHARE").fetchone()
        if row is not None and int(row[0]) > self.fence.epoch:
            return f"the execution epoch is {int(row[0])}, this executor writes at {self.fence.epoch}"
        return None

    def _lease_refusal(self, token: object) -> str | None:
        if self.fence is None or token == self.fence.token:
            return None
        if token is None:
            return f"the operation is not leased to {self.fence.owner}"
        return f"the lease of {self.fence.owner} was taken over"

    def _fence_clause(self) -> tuple[str, list[object]]:
        if self.fence is None:
            return "", []
        return " AND lease_token = %s", [self.fence.token]

    def _new_lease(self, op: Operation) -> list[object]:
        if self.fence is None:
            return [None, None, None, None]
        f = self.fence
        return [f.owner, f.token, f.epoch, op.created_at + timedelta(seconds=f.lease_s)]
