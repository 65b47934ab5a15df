"""The shared SQL ledger's persistence for ``rollout/``: state and epoch, the audit chain, arms, shadows.

The rollout state (with the execution epoch), its hash-chained audit log, each operation's arm
and the shadow comparisons. The decisions are rollout's; this module only stores and reads them,
compare-and-swapping the chain head so that no two actions fork it. It must not import a
database driver or ``rollout``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from engine.errors import LedgerError, StaleWrite
from engine.ledger import sql
from engine.ledger.core import SqlCore
from engine.ledger.rows import rollout_state_row
from engine.ledger.schema import ROLLOUT_EVENT_COLUMNS, SHADOW_DIFF_COLUMNS

__all__ = ["RolloutRecords"]


class RolloutRecords(SqlCore):
    """The rollout's state, audit chain, arm assignments and shadow comparisons."""

    def rollout_state(self) -> dict[str, object] | None:
        """The one ``rollout_state`` row (list columns decoded), or None before the first action."""
        rows = self._rows(sql.ROLLOUT_STATE)
        if not rows:
            return None
        row = rows[0]
        for key in ("shadow_tools", "disabled_protocols"):
            row[key] = json.loads(str(row[key]))
        return row

    def execution_epoch(self) -> int | None:
        """The execution epoch the ledger records (raised only by a rollback), or None if never set."""
        row = self._fetchone(sql.EXECUTION_EPOCH)
        return int(row[0]) if row else None

    def append_rollout_event(
        self, event: dict[str, object], state: dict[str, object], *, expected_seq: int, expected_epoch: int
    ) -> None:
        """Append one audit row and move ``rollout_state`` to ``state`` in one transaction.

        Compare-and-swap on the chain head and the epoch: the write only lands if the state row is
        still at ``expected_seq`` and ``expected_epoch`` (no row at all when ``expected_seq`` is 0),
        so two actions, from any processes, can never fork the chain or both raise the epoch.

        Raises:
            StaleWrite: another action moved the rollout (or the epoch) first; nothing is written.
        """
        values = [event[c] for c in ROLLOUT_EVENT_COLUMNS]
        if event["seq"] != expected_seq + 1:
            raise LedgerError("a rollout event must follow the chain head")
        columns = rollout_state_row(event, state)
        try:
            with self._tx() as tx:
                current = tx.execute(self._q(sql.ROLLOUT_HEAD), []).fetchone()
                if current is None:
                    if expected_seq != 0:
                        raise StaleWrite("rollout", expected_seq, "the rollout state row is missing")
                    tx.execute(self._q(sql.ROLLOUT_STATE_INSERT), columns)
                elif (
                    self._affected(tx, sql.ROLLOUT_STATE_UPDATE, [*columns, expected_seq, expected_epoch])
                    != 1
                ):
                    raise StaleWrite(
                        "rollout",
                        expected_seq,
                        f"the rollout moved to seq {current[0]} at epoch {current[1]} first",
                    )
                tx.execute(
                    self._q(f"INSERT INTO rollout_events VALUES ({sql.placeholders(len(values))})"), values
                )
        except Exception as exc:
            if isinstance(exc, LedgerError) or not self._conflict(exc):
                raise
            # Two first actions at once: the second one's state row (or event seq) already exists.
            raise StaleWrite("rollout", expected_seq, "another action was recorded first") from exc

    def rollout_events(
        self, *, limit: int | None = None, newest_first: bool = False
    ) -> list[dict[str, object]]:
        """Audit rows in chain order (or newest first)."""
        query = sql.ROLLOUT_EVENTS + (" DESC" if newest_first else "")
        params: list[object] = []
        if limit is not None:
            query += " LIMIT ?"
            params.append(limit)
        return self._rows(query, params)

    def record_assignments(self, rows: Sequence[dict[str, object]]) -> None:
        """Record operations' arms (one per operation; a second row for an operation is ignored)."""
        if not rows:
            return
        with self._tx() as tx:
            self._insert_arms(tx, rows)

    def assignments(self, *, limit: int = 1000) -> list[dict[str, object]]:
        return self._rows(sql.ASSIGNMENTS, [limit])

    def rollout_keys(self) -> list[tuple[str, str, str]]:
        """``(call_node_id, operation_id, state)`` of every primary operation routed by arm."""
        return [(str(a), str(b), str(c)) for a, b, c in self._fetchall(sql.ROLLOUT_KEYS)]

    def arm_counts(self) -> list[dict[str, object]]:
        """Operations per arm, server, protocol and whether they still hold no receipt."""
        return self._rows(sql.ARM_COUNTS)

    def live_by_protocol(self) -> dict[str, dict[str, int]]:
        """Operations without a receipt, per protocol and local state (UNKNOWN ones included)."""
        out: dict[str, dict[str, int]] = {}
        for protocol, state, count in self._fetchall(sql.LIVE_BY_PROTOCOL):
            out.setdefault(str(protocol), {})[str(state)] = int(count)
        return out

    def shadow_pairs(self, *, ready_only: bool) -> list[tuple[str, str]]:
        """``(primary, shadow)`` operation ids not yet compared; ``ready_only``: both hold a receipt."""
        query = sql.SHADOW_PAIRS + (sql.SHADOW_PAIRS_READY if ready_only else "") + sql.SHADOW_PAIRS_ORDER
        return [(str(a), str(b)) for a, b in self._fetchall(query)]

    def receipt_of_operation(self, operation_id: str) -> dict[str, object] | None:
        rows = self._rows(sql.RECEIPT_OF_OPERATION, [operation_id])
        return rows[0] if rows else None

    def poll_count(self, operation_id: str) -> int:
        row = self._fetchone(sql.POLL_COUNT, [operation_id])
        return int(row[0]) if row else 0

    def record_shadow_diff(self, row: dict[str, object]) -> bool:
        """Store one comparison; False if the pair was already compared."""
        query = f"INSERT INTO shadow_diffs VALUES ({sql.placeholders(len(SHADOW_DIFF_COLUMNS))}){sql.IGNORE_DUPLICATE}"
        with self._tx() as tx:
            return self._affected(tx, query, [row.get(c) for c in SHADOW_DIFF_COLUMNS]) == 1

    def shadow_diffs(self, *, diverged_only: bool = False, limit: int = 100) -> list[dict[str, object]]:
        query = sql.SHADOW_DIFFS + (" WHERE diverged" if diverged_only else "") + sql.SHADOW_DIFFS_ORDER
        return self._rows(query, [limit])

    def shadow_summary(self) -> dict[str, object]:
        """Shadow operations started, compared, diverged (by what), and still waiting for a comparison."""
        row = self._fetchone(sql.SHADOW_SUMMARY)
        assert row is not None
        started, compared = int(row[0]), int(row[1])
        return {
            "shadow_operations": started,
            "compared": compared,
            "diverged": int(row[2]),
            "status_differs": int(row[3]),
            "result_differs": int(row[4]),
            "awaiting_comparison": started - compared,
            "mean_latency_delta_ms": row[5],
            "mean_polls_delta": row[6],
        }

    def fenced_replies(self) -> int:
        """Replies refused because they answered a request of an older execution epoch."""
        row = self._fetchone(sql.FENCED_REPLIES)
        return int(row[0]) if row else 0
