"""The PostgreSQL ledger's shared QPS budget: send slots booked atomically across every executor.

``engine.runtime.limiter.SharedLimiter`` chooses the slot grid and the caps; this module books and
prunes slots in one transaction each, through the database function the migrations install. It
must not import psycopg (``engine.ledger.postgres`` owns the connection) and decides no pacing.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.ledger.core import SqlCore
from engine.ledger.schema import SEND_SLOTS_TABLE

__all__ = ["PgSendSlots"]


class PgSendSlots(SqlCore):
    """Booking and pruning the shared send slots."""

    def book_send_slots(
        self, scopes: Sequence[str], caps: Sequence[int], first_slot: int, n: int
    ) -> list[int]:
        """Book ``n`` sends into the earliest slots from ``first_slot`` on with room in every scope.

        A slot is a number on a grid the caller chose (``engine.runtime.limiter.SharedLimiter``);
        ``caps[i]`` is how many sends slot may hold in ``scopes[i]``. One transaction, atomic
        across every executor sharing the database. Returns the slot of each booked send, in order.
        """
        if n <= 0:
            return []
        order = sorted(range(len(scopes)), key=lambda i: scopes[i])  # one lock order for every booker
        with self._tx() as cur:
            row = cur.execute(
                f"SELECT {SEND_SLOTS_TABLE}_book(%s::varchar[], %s::integer[], %s, %s)",
                [[scopes[i] for i in order], [int(caps[i]) for i in order], first_slot, n],
            ).fetchone()
        return [int(k) for k in (row[0] if row else [])]

    def prune_send_slots(self, before_slot: int) -> int:
        """Forget bookings of slots before ``before_slot`` (long past); returns how many rows went."""
        with self._tx() as cur:
            cur.execute(f"DELETE FROM {SEND_SLOTS_TABLE} WHERE slot < %s", [before_slot])
            return int(cur.rowcount)
