"""The PostgreSQL ledger's leases: how executors sharing one database divide the work.

``claim`` (``SELECT ... FOR UPDATE SKIP LOCKED`` over operations without a receipt whose lease is
free or expired), ``renew``, ``release`` and the lease reads. Whether a write still holds its
lease is ``engine.ledger.pg_fencing``'s question. It must not import psycopg
(``engine.ledger.postgres`` owns the connection), and it decides nothing about states.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from engine.errors import EpochMoved
from engine.ledger import rows as codec
from engine.ledger import sql
from engine.ledger.core import SqlCore
from engine.ledger.port import Lease
from engine.ledger.schema import LEASE_COLUMNS
from engine.model import RECEIPT_STATES, Operation

__all__ = ["PgLeases"]

_RECEIPT_STATE_VALUES: Final = sorted(s.value for s in RECEIPT_STATES)


def _only(params: list[object], operation_ids: Sequence[str] | None) -> str:
    """The condition that narrows a lease statement to ``operation_ids`` (appending its parameter)."""
    if operation_ids is None:
        return ""
    params.append(list(operation_ids))
    return " AND operation_id = ANY(%s)"


def _lease_of(row: Sequence[Any]) -> Lease:
    return Lease(
        operation_id=str(row[0]),
        owner=row[1],
        token=row[2],
        epoch=int(row[3]) if row[3] is not None else None,
        expires_at=codec._as_dt(row[4], "lease_expires_at"),
    )


class PgLeases(SqlCore):
    """Claiming, renewing and releasing leases on operations without a receipt."""

    def claim(
        self,
        owner: str,
        lease_token: str,
        limit: int,
        lease_s: float,
        now: datetime,
        *,
        epoch: int | None = None,
        servers: Sequence[str] | None = None,
    ) -> list[Operation]:
        """Lease up to ``limit`` operations without a receipt whose lease is free or expired.

        ``FOR UPDATE SKIP LOCKED``: concurrent claimers never wait for each other and never get the
        same operation. A claimed operation's lease carries ``owner``, ``lease_token`` and
        ``epoch`` and expires ``lease_s`` seconds after ``now``; an expired lease is taken over
        (the previous holder's fenced writes are refused from then on).

        Args:
            epoch: the claimer's execution epoch: operations of a newer epoch are left alone, and
                the claim is refused if the ledger's epoch is newer than this.
            servers: only operations sent to these server URLs.

        Raises:
            LeaseLost: the ledger's execution epoch is newer than ``epoch``.
        """
        if limit <= 0:
            return []
        where = [
            "s.state <> ALL(%(receipt)s)",
            "(s.lease_expires_at IS NULL OR s.lease_expires_at <= %(now)s)",
        ]
        params: dict[str, object] = {
            "receipt": _RECEIPT_STATE_VALUES,
            "now": now,
            "limit": limit,
            "owner": owner,
            "token": lease_token,
            "epoch": epoch,
            "expires": now + timedelta(seconds=lease_s),
        }
        if epoch is not None:
            where.append("s.epoch <= %(epoch)s")
        source = "op_state s"
        if servers is not None:
            source = "op_state s JOIN op_identity i USING (operation_id)"
            where.append("i.server = ANY(%(servers)s)")
            params["servers"] = list(servers)
        with self._tx() as cur:
            if epoch is not None:
                row = cur.execute("SELECT epoch FROM rollout_state WHERE id = 1 FOR SHARE").fetchone()
                if row is not None and int(row[0]) > epoch:
                    raise EpochMoved(
                        "*", 0, f"the execution epoch is {int(row[0])}, the claimer is at {epoch}"
                    )
            cur.execute(
                f"""WITH picked AS (
                        SELECT s.operation_id FROM {source}
                        WHERE {" AND ".join(where)}
                        ORDER BY s.lease_expires_at NULLS FIRST, s.updated_at, s.operation_id
                        LIMIT %(limit)s
                        FOR UPDATE OF s SKIP LOCKED)
                    UPDATE op_state SET lease_owner = %(owner)s, lease_token = %(token)s,
                        lease_epoch = %(epoch)s, lease_expires_at = %(expires)s
                    FROM picked WHERE op_state.operation_id = picked.operation_id
                    RETURNING op_state.operation_id""",
                params,
            )
            ids = [str(r[0]) for r in cur.fetchall()]
            if not ids:
                return []
            cur.execute(
                f'{sql.OPERATION_SELECT} WHERE operation_id = ANY(%s) ORDER BY created_at, operation_id COLLATE "C"',
                [ids],
            )
            cols = [d.name for d in cur.description or ()]
            return [codec.operation_from_record(dict(zip(cols, r, strict=True))) for r in cur.fetchall()]

    def renew(
        self,
        owner: str,
        lease_token: str,
        lease_s: float,
        now: datetime,
        operation_ids: Sequence[str] | None = None,
    ) -> list[str]:
        """Extend the leases still held under ``lease_token`` (all, or those of ``operation_ids``).

        Returns:
            The operations (without a receipt) still held; any other one asked for was taken over.
        """
        params: list[object] = [now + timedelta(seconds=lease_s), lease_token, owner, _RECEIPT_STATE_VALUES]
        only = _only(params, operation_ids)
        with self._tx() as cur:
            cur.execute(
                "UPDATE op_state SET lease_expires_at = %s "
                f"WHERE lease_token = %s AND lease_owner = %s AND state <> ALL(%s){only} RETURNING operation_id",
                params,
            )
            return sorted(str(r[0]) for r in cur.fetchall())

    def release(self, owner: str, lease_token: str, operation_ids: Sequence[str] | None = None) -> int:
        """Give leases back at once (a clean stop), so other executors may claim them; returns how many."""
        params: list[object] = [lease_token, owner]
        only = _only(params, operation_ids)
        with self._tx() as cur:
            cur.execute(
                "UPDATE op_state SET lease_owner = NULL, lease_token = NULL, lease_epoch = NULL, "
                f"lease_expires_at = NULL WHERE lease_token = %s AND lease_owner = %s{only}",
                params,
            )
            return int(cur.rowcount)

    def lease_of(self, operation_id: str) -> Lease | None:
        row = self._fetchone(
            f"SELECT operation_id, {', '.join(LEASE_COLUMNS)} FROM op_state WHERE operation_id = ?",
            [operation_id],
        )
        return _lease_of(row) if row is not None else None

    def leases(self, *, owner: str | None = None) -> list[Lease]:
        """Leased operations without a receipt (of one owner, or all), oldest expiry first."""
        sql_text = (
            f"SELECT operation_id, {', '.join(LEASE_COLUMNS)} FROM op_state "
            "WHERE lease_token IS NOT NULL AND state <> ALL(?)"
        )
        params: list[object] = [_RECEIPT_STATE_VALUES]
        if owner is not None:
            sql_text += " AND lease_owner = ?"
            params.append(owner)
        return [
            _lease_of(r)
            for r in self._fetchall(sql_text + " ORDER BY lease_expires_at, operation_id", params)
        ]
