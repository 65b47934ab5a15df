"""The shared SQL ledger's reads for the engine and the console: operations, receipts, logs, counts.

Every read here is one statement of ``engine.ledger.sql`` run through the driver's ``_rows``,
``_fetchone`` or ``_fetchall`` and decoded by ``engine.ledger.rows``. It must not write, import a
database driver, or decide anything about states.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from engine.errors import InvalidRecord, LedgerError
from engine.ledger import sql
from engine.ledger.core import SqlCore
from engine.ledger.port import HeldOutcome, Json
from engine.ledger.rows import held_from_row, operation_from_record, receipt_from_row
from engine.ledger.schema import _TABLES
from engine.model import LocalState, Operation, Receipt

__all__ = ["EngineReads"]


class EngineReads(SqlCore):
    """Reads of operations, receipts, results, logs and counts, shared by both SQL backends."""

    def get_many(self, operation_ids: Sequence[str]) -> dict[str, Operation]:
        """Several operations by id in one query (the ones that exist)."""
        if not operation_ids:
            return {}
        return {op.operation_id: op for op in self._operations_in("operation_id", operation_ids)}

    def by_call_nodes(self, call_node_ids: Sequence[str]) -> dict[str, Operation]:
        """The operations of several call nodes in one query (the ones that exist), by call node."""
        if not call_node_ids:
            return {}
        return {op.call_node_id: op for op in self._operations_in("call_node_id", call_node_ids)}

    def _operations_where(self, where: str, params: Sequence[object], suffix: str = "") -> list[Operation]:
        query = sql.OPERATION_SELECT + (f" WHERE {where}" if where else "") + suffix
        return [operation_from_record(r) for r in self._rows(query, params)]

    def _one(self, where: str, params: Sequence[object]) -> Operation | None:
        found = self._operations_where(where, params)
        return found[0] if found else None

    def get(self, operation_id: str) -> Operation | None:
        return self._one(sql.BY_ID, [operation_id])

    def by_call_node(self, call_node_id: str) -> Operation | None:
        return self._one(sql.BY_CALL_NODE, [call_node_id])

    def by_task(self, server: str, task_id: str) -> Operation | None:
        return self._one(sql.BY_TASK, [server, task_id])

    def by_key(self, key: str) -> Operation | None:
        return self._one(sql.BY_KEY, [key])

    def arguments(self, operation_id: str) -> Json:
        row = self._fetchone(sql.ARGUMENTS, [operation_id])
        if row is None:
            raise InvalidRecord(f"no operation {operation_id}")
        value = json.loads(str(row[0]))
        if not isinstance(value, dict):
            raise InvalidRecord(f"arguments of {operation_id} are not an object")
        return value

    def operations(
        self, *, states: Sequence[LocalState] | None = None, limit: int | None = None
    ) -> list[Operation]:
        where = ""
        params: list[object] = []
        if states:
            where = f"state IN ({sql.placeholders(len(states))})"
            params.extend(s.value for s in states)
        suffix = sql.OPERATIONS_ORDER
        if limit is not None:
            suffix += " LIMIT ?"
            params.append(limit)
        return self._operations_where(where, params, suffix)

    def receipt(self, call_node_id: str) -> Receipt | None:
        row = self._fetchone(sql.RECEIPT_OF_CALL_NODE, [call_node_id])
        return None if row is None else receipt_from_row(row)

    def result_payload(self, operation_id: str) -> Json | None:
        row = self._fetchone(sql.RESULT_PAYLOAD, [operation_id])
        if row is None:
            return None
        value = json.loads(str(row[0]))
        return value if isinstance(value, dict) else None

    def transitions(self, operation_id: str) -> list[dict[str, object]]:
        return self._rows(sql.TRANSITIONS_OF, [operation_id])

    def count(self, table: str) -> int:
        if table not in _TABLES:
            raise LedgerError(f"unknown ledger table {table!r}")
        row = self._fetchone(f"SELECT count(*) FROM {table}")
        return int(row[0]) if row else 0

    def table_columns(self) -> dict[str, list[str]]:
        """Every table and view of the ledger with its columns, in order (for the documentation check)."""
        out: dict[str, list[str]] = {}
        for table, column in self._fetchall(sql.TABLE_COLUMNS):
            if table in self._private_tables:
                continue  # the driver's own coordination, not ledger data
            out.setdefault(str(table), []).append(str(column))
        return out

    def list_operations(
        self,
        *,
        state: str | None = None,
        protocol: str | None = None,
        tool: str | None = None,
        principal: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, object]]:
        """Operations as flat records, newest first, filtered by exact state/protocol/tool/principal."""
        where: list[str] = []
        params: list[object] = []
        filters = (("state", state), ("protocol", protocol), ("tool_name", tool), ("principal", principal))
        for column, value in filters:
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        query = sql.OPERATION_SELECT + (f" WHERE {' AND '.join(where)}" if where else "")
        return self._rows(query + sql.LIST_OPERATIONS_ORDER, [*params, limit])

    def state_counts(self) -> list[tuple[str, str, int]]:
        return [(str(a), str(b), int(c)) for a, b, c in self._fetchall(sql.STATE_COUNTS)]

    def poll_counts(self) -> list[tuple[str, int]]:
        return [(str(a), int(b)) for a, b in self._fetchall(sql.POLL_COUNTS)]

    def open_reconciliation_counts(self) -> list[tuple[str, int]]:
        return [(str(a), int(b)) for a, b in self._fetchall(sql.OPEN_RECONCILIATION_COUNTS)]

    def polls(self, operation_id: str | None = None) -> list[dict[str, object]]:
        if operation_id is None:
            return self._rows(sql.POLLS)
        return self._rows(sql.POLLS_OF, [operation_id])

    def held_outcome(self, operation_id: str) -> HeldOutcome | None:
        row = self._fetchone(sql.HELD_OUTCOME, [operation_id])
        return None if row is None else held_from_row(operation_id, row)
