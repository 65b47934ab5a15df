"""The shared SQL ledger's records of what people act on: approvals (input rounds) and reconciliation.

It stores and closes rounds and entries; who may act and what an answer means is decided in
``service.executor.actions`` and ``engine.machine``. It must not import a database driver.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from engine.ledger import sql
from engine.ledger.core import SqlCore
from engine.ledger.port import ApprovalRequest, Json
from engine.ledger.rows import require_resolution
from engine.model import Operation, canonical_json

__all__ = ["ActionRecords"]


class ActionRecords(SqlCore):
    """Approvals of input rounds and reconciliation entries."""

    def open_approval(self, op: Operation, request: ApprovalRequest, *, at: datetime) -> bool:
        """Open the approval for the operation's current input round. False if it was already open."""
        params = [
            op.operation_id,
            op.input_round,
            op.input_request_key,
            request.message,
            canonical_json(request.requested_schema),
            request.schema_digest,
            request.deadline,
            at,
        ]
        with self._tx() as tx:
            return self._affected(tx, sql.APPROVAL_INSERT, params) == 1

    def record_answer(
        self, operation_id: str, input_round: int, answer: Json, actor: str, at: datetime
    ) -> bool:
        """Store the answer of a pending round. False if that round is not pending (stale or answered)."""
        params = [canonical_json(answer), actor, at, operation_id, input_round]
        with self._tx() as tx:
            return self._affected(tx, sql.APPROVAL_ANSWER, params) == 1

    def close_rounds(self, at: datetime) -> int:
        """Close every pending round that is no longer answerable at ``at``: its operation moved past
        it (``closed``) or its deadline passed (``expired``). Returns how many were closed."""
        with self._tx() as tx:
            moved = self._affected(tx, sql.ROUNDS_MOVED_PAST, [at])
            return moved + self._affected(tx, sql.ROUNDS_EXPIRE, [at, at])

    def answer_of(self, operation_id: str, input_round: int) -> Json | None:
        row = self._fetchone(sql.ANSWER_OF, [operation_id, input_round])
        if row is None or row[0] is None:
            return None
        value = json.loads(str(row[0]))
        return value if isinstance(value, dict) else {"value": value}

    def approval(self, operation_id: str, input_round: int) -> dict[str, object] | None:
        """One round's approval row (any status), or None if that round never asked a person."""
        rows = self._rows(sql.APPROVAL_OF, [operation_id, input_round])
        return rows[0] if rows else None

    def approvals(self, *, pending_only: bool = True) -> list[dict[str, object]]:
        query = sql.APPROVALS + (sql.APPROVALS_PENDING if pending_only else "")
        return self._rows(query + sql.APPROVALS_ORDER)

    def open_reconciliation(
        self,
        op: Operation,
        *,
        kind: str,
        reason: str,
        window_end: datetime,
        candidates: Sequence[str] = (),
        at: datetime,
    ) -> int:
        """Open a reconciliation entry with everything a person needs to find the operation.

        Idempotent per (operation, kind) while an entry is open: returns the open entry's id.
        """
        with self._tx() as tx:
            # Two executors may open the same entry at once: serialise them on (operation, kind).
            self._serialise(tx, f"reconciliation {op.operation_id} {kind}")
            open_row = tx.execute(self._q(sql.RECONCILIATION_OPEN_ENTRY), [op.operation_id, kind]).fetchone()
            if open_row is not None:
                return int(open_row[0])
            row = tx.execute(
                self._q(sql.RECONCILIATION_INSERT),
                [
                    op.operation_id,
                    kind,
                    reason,
                    op.idempotency_key,
                    op.task_id,
                    op.request_digest,
                    op.created_at,
                    window_end,
                    canonical_json(list(candidates)),
                    at,
                ],
            ).fetchone()
        assert row is not None
        return int(row[0])

    def resolve_reconciliation(self, entry_id: int, *, actor: str, resolution: str, at: datetime) -> bool:
        """Close an open entry. False if it is not open."""
        require_resolution(actor, resolution)
        with self._tx() as tx:
            return (
                self._affected(tx, sql.RECONCILIATION_RESOLVE_ENTRY, [at, actor, resolution, entry_id]) == 1
            )

    def resolve_open(self, operation_id: str, *, kind: str, actor: str, resolution: str, at: datetime) -> int:
        """Close every open entry of one kind for an operation (e.g. the server reappeared); returns how many."""
        with self._tx() as tx:
            return self._affected(
                tx, sql.RECONCILIATION_RESOLVE_OPEN, [at, actor, resolution, operation_id, kind]
            )

    def reconciliation(self, *, open_only: bool = True) -> list[dict[str, object]]:
        query = sql.RECONCILIATION + (sql.RECONCILIATION_OPEN if open_only else "")
        return self._rows(query + sql.RECONCILIATION_ORDER)
