"""The DuckDB ledger: the one persistence boundary, and the only module that imports ``duckdb``.

It owns recorded, transactional migrations; compare-and-swap writes of operation state (one at a
time or group-committed); the single ``accept_terminal`` transaction, the only code path that
writes a receipt or an outbox row; and typed read queries. It decides nothing about states: that
is ``engine.machine``'s job. Uniqueness (one operation per call node and key, one receipt and one
outbox entry per call node, one operation per server task id) is enforced by the database.

An operation is stored in two tables: ``op_identity`` (written once) and ``op_state`` (the narrow,
mutable part, so that group-committed updates stay cheap in a column store); the ``operations``
view joins them for analysts.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import duckdb
import pyarrow as pa

from engine.acceptance import check_acceptance, receipt_of
from engine.errors import (
    DuplicateOperation,
    InvalidRecord,
    LedgerCorrupt,
    LedgerError,
    LedgerUnavailable,
    ReceiptConflict,
    SchemaTooNew,
    StaleWrite,
)
from engine.ledger.gate_sql import gate_inputs_from_values, gate_inputs_sql
from engine.ledger.port import (
    BatchOutcome,
    ExplorerRun,
    GroupOutcome,
    HeldOutcome,
    Json,
    PollRecord,
    WriteGroup,
)
from engine.ledger.rows import (
    _as_dt,
    _json_text,
    _refuse_receipt_state,
    _state_row,
    _string_list,
    _transition_row,
    operation_from_record,
)
from engine.ledger.schema import (
    _ASSIGNMENT_SCHEMA,
    _BINDING_SCHEMA,
    _EXPECT_SCHEMA,
    _HELD_SCHEMA,
    _IDENTITY_SCHEMA,
    _OUTBOX_SCHEMA,
    _POLL_SCHEMA,
    _RECEIPT_SCHEMA,
    _RESULT_SCHEMA,
    _STATE_COLUMNS,
    _STATE_SCHEMA,
    _TABLES,
    _TRANSITION_SCHEMA,
    MIGRATIONS,
    SUPPORTED_SCHEMA,
)
from engine.model import (
    CallNodeId,
    Digest,
    Epoch,
    GateRecord,
    IdempotencyKey,
    LocalState,
    Operation,
    OperationId,
    Principal,
    Protocol,
    Receipt,
    Role,
    ServerStatus,
    TaskId,
    ToolRef,
    Transition,
    canonical_json,
    digest_of,
)

# ------------------------------------------------------------------------------------ migrations
# Each migration is applied once, in its own transaction, and recorded in schema_migrations.
# Never edit a released migration: add a new one.


_OPERATION_SELECT: Final = "SELECT * FROM operations"
_DUCKDB_MAGIC: Final = b"DUCK"
_HEADER_BYTES: Final = 3 * 4096


# --------------------------------------------------------------------------------- conversions


def _columns(rows: Sequence[Sequence[object]], schema: pa.Schema) -> pa.Table:
    cols: list[Sequence[object]] = list(zip(*rows, strict=True)) if rows else [[] for _ in schema.names]
    return pa.Table.from_arrays(
        [pa.array(list(c), type=f.type) for c, f in zip(cols, schema, strict=True)], schema=schema
    )


def _is_constraint_error(exc: Exception) -> bool:
    return isinstance(exc, duckdb.ConstraintException | duckdb.TransactionException)


# ------------------------------------------------------------------------------------- the ledger


class Ledger:
    """A ledger file (or ``:memory:``). One process writes a file; readers may open it read-only.

    Thread-safe: each thread gets its own cursor on the shared database, so concurrent writers
    race on the database's own constraints and transaction conflicts, never on Python state.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: str, read_only: bool) -> None:
        self._root = con
        self.path = path
        self.read_only = read_only
        self._local = threading.local()

    # ---------------------------------------------------------------------------- open / close

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False) -> Ledger:
        """Open (and migrate) a ledger.

        Raises:
            LedgerUnavailable: the file or its folder cannot be read or written.
            LedgerCorrupt: the file is not a DuckDB ledger, or is damaged.
            SchemaTooNew: a newer Finality wrote it.
        """
        spath = str(path)
        if spath != ":memory:":
            _check_file(Path(spath), read_only)
        try:
            con = duckdb.connect(spath, read_only=read_only)
        except duckdb.Error as exc:
            raise LedgerCorrupt(f"cannot open ledger {spath}: {exc}") from exc
        ledger = cls(con, spath, read_only)
        try:
            if spath != ":memory:":
                ledger._check_size(Path(spath))
            ledger._migrate()
        except LedgerError:
            con.close()
            raise
        except duckdb.Error as exc:
            con.close()
            raise LedgerCorrupt(f"ledger {spath} is damaged: {exc}") from exc
        return ledger

    def close(self) -> None:
        self._root.close()

    def warm_up(self) -> None:
        """Pay one-time costs (pyarrow's lazy imports) now rather than on the first write."""
        _columns([_state_row(_WARM_UP_OP, 0, 0)], _STATE_SCHEMA)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _con(self) -> duckdb.DuckDBPyConnection:
        cur: duckdb.DuckDBPyConnection | None = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._root.cursor()
            self._local.cur = cur
        return cur

    @contextmanager
    def _tx(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self.read_only:
            # Said at once: DuckDB's own refusal would look like a constraint conflict to callers.
            raise LedgerUnavailable(f"ledger {self.path} was opened read-only")
        with self._begin() as con:
            yield con

    @contextmanager
    def _begin(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A transaction on this thread's cursor (reads use it too: see ``get_many``)."""
        con = self._con
        con.execute("BEGIN TRANSACTION")
        try:
            yield con
        except BaseException:
            con.execute("ROLLBACK")
            raise
        try:
            con.execute("COMMIT")
        except duckdb.Error:
            # A commit-time conflict leaves the transaction aborted; clear it before re-raising.
            with suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise

    def _check_size(self, path: Path) -> None:
        # A truncated file opens fine and fails only when a missing block is read; the block
        # count in the header tells how long the file must be.
        row = self._con.execute("PRAGMA database_size").fetchone()
        if row is None:
            return
        block_size, total_blocks = int(row[2]), int(row[3])
        needed = _HEADER_BYTES + block_size * total_blocks
        if path.stat().st_size < needed:
            raise LedgerCorrupt(
                f"{path} is truncated: {path.stat().st_size} bytes, the ledger needs {needed}"
            )

    def schema_version(self) -> int:
        row = self._con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
        return int(row[0]) if row else 0

    def _migrate(self) -> None:
        con = self._con
        exists = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'schema_migrations'"
        ).fetchone()
        if not exists or exists[0] == 0:
            if self.read_only:
                raise LedgerCorrupt(f"{self.path} is not a Finality ledger (no schema_migrations table)")
            con.execute(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
                "applied_at TIMESTAMPTZ NOT NULL)"
            )
        current = self.schema_version()
        if current > SUPPORTED_SCHEMA:
            raise SchemaTooNew(current, SUPPORTED_SCHEMA)
        for version, name, statements in MIGRATIONS:
            if version <= current:
                continue
            if self.read_only:
                raise LedgerUnavailable(f"{self.path} needs migration {version} but was opened read-only")
            with self._tx() as tx:
                for sql in statements:
                    tx.execute(sql)
                tx.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)", [version, name, datetime.now(UTC)]
                )

    # ---------------------------------------------------------------------------------- writes

    def create_operation(self, op: Operation, arguments: Json) -> tuple[Operation, bool]:
        """Record a new operation in SUBMITTING, or return the call node's existing one.

        Returns:
            ``(operation, created)``; ``created`` is False when the call node already had one.

        Raises:
            DuplicateOperation: the call node (or key) exists for a different request.
        """
        if op.state is not LocalState.SUBMITTING or op.row_version != 0:
            raise InvalidRecord("a new operation starts in SUBMITTING at row version 0")
        try:
            with self._tx() as tx:
                self._bulk_insert_new(tx, [(op, arguments)])
        except duckdb.Error as exc:
            if not _is_constraint_error(exc):
                raise
            existing = self._await_committed(op)
            if existing is None:
                raise DuplicateOperation("submission key", op.idempotency_key) from exc
            if existing.request_digest != op.request_digest:
                raise DuplicateOperation(
                    "call node (for a different request)", f"{op.call_node_id} ({existing.request_digest})"
                ) from exc
            return existing, False
        return op, True

    def create_many(self, items: Sequence[tuple[Operation, Json]]) -> list[tuple[Operation, bool]]:
        """Group-committed ``create_operation``: one transaction for many new operations.

        Call nodes that already have an operation get it back (``created`` False). If any item
        conflicts otherwise, every item is retried on its own so that the offender is named.
        """
        if not items:
            return []
        nodes = [op.call_node_id for op, _ in items]
        if len(set(nodes)) != len(nodes):
            return [self.create_operation(op, args) for op, args in items]
        existing = self._existing_by_call_node(nodes)
        fresh = [(op, args) for op, args in items if op.call_node_id not in existing]
        for op, _ in fresh:
            if op.state is not LocalState.SUBMITTING or op.row_version != 0:
                raise InvalidRecord("a new operation starts in SUBMITTING at row version 0")
        try:
            with self._tx() as tx:
                if fresh:
                    self._bulk_insert_new(tx, fresh)
        except duckdb.Error as exc:
            if not _is_constraint_error(exc):
                raise
            return [self.create_operation(op, args) for op, args in items]
        out: list[tuple[Operation, bool]] = []
        for op, args in items:
            have = existing.get(op.call_node_id)
            if have is None:
                out.append((op, True))
            elif have.request_digest != op.request_digest:
                out.append(self.create_operation(op, args))
            else:
                out.append((have, False))
        return out

    def _existing_by_call_node(self, nodes: Sequence[str]) -> dict[str, Operation]:
        # In a transaction: registering a table on a cursor whose last result was read with
        # fetchone() (e.g. ``get``) is refused by DuckDB; BEGIN closes that result first.
        with self._begin() as con:
            con.register("wanted_nodes", pa.table({"call_node_id": pa.array(list(nodes), pa.string())}))
            try:
                cur = con.execute(
                    f"{_OPERATION_SELECT} WHERE call_node_id IN (SELECT call_node_id FROM wanted_nodes)"
                )
                cols = [d[0] for d in cur.description or ()]
                found = [operation_from_record(dict(zip(cols, r, strict=True))) for r in cur.fetchall()]
            finally:
                con.unregister("wanted_nodes")
        return {op.call_node_id: op for op in found}

    def _bulk_insert_new(
        self, tx: duckdb.DuckDBPyConnection, fresh: Sequence[tuple[Operation, Json]]
    ) -> None:
        identity = [
            [
                op.operation_id,
                op.call_node_id,
                op.role.value,
                op.request_digest,
                op.tool.name,
                op.tool.version,
                op.tool.descriptor_version,
                op.tool.side_effects,
                op.principal,
                op.protocol.value,
                op.adapter_version,
                op.server,
                op.idempotency_key,
                canonical_json(args),
                op.schema_version,
                op.created_at,
            ]
            for op, args in fresh
        ]
        states = [_state_row(op, 0, 0) for op, _ in fresh]
        log = [
            [
                op.operation_id,
                op.call_node_id,
                None,
                op.state.value,
                "Created",
                canonical_json({"idempotency_key": op.idempotency_key}),
                "operation recorded before submission",
                True,
                op.epoch,
                op.row_version,
                op.created_at,
            ]
            for op, _ in fresh
        ]
        tx.register("new_identity", _columns(identity, _IDENTITY_SCHEMA))
        tx.register("new_state", _columns(states, _STATE_SCHEMA))
        tx.register("new_log", _columns(log, _TRANSITION_SCHEMA))
        try:
            tx.execute("INSERT INTO op_identity SELECT * FROM new_identity")
            tx.execute(f"INSERT INTO op_state SELECT {', '.join(_STATE_COLUMNS)} FROM new_state")
            tx.execute("INSERT INTO transitions SELECT nextval('transition_seq'), * FROM new_log")
        finally:
            for name in ("new_identity", "new_state", "new_log"):
                tx.unregister(name)

    def _await_committed(self, op: Operation) -> Operation | None:
        # The conflicting row may belong to a creator whose transaction has not committed yet;
        # give it a bounded moment to land so that the caller gets the one operation back.
        pause = threading.Event()
        for _ in range(200):
            existing = self.by_call_node(op.call_node_id) or self.by_key(op.idempotency_key)
            if existing is not None:
                return existing
            pause.wait(0.005)
        return None

    def apply(self, transition: Transition) -> Operation:
        """Compare-and-swap one transition into the ledger.

        Raises:
            StaleWrite: the row moved since ``transition.before`` was read.
            DuplicateOperation: the new server task id is already bound to another operation.
        """
        outcome = self.apply_many([transition])[0]
        if outcome.error is not None:
            raise outcome.error
        assert outcome.operation is not None
        return outcome.operation

    def apply_many(self, transitions: Sequence[Transition]) -> list[BatchOutcome]:
        """Group commit: many transitions, one transaction, each compare-and-swapped on its own.

        Transitions of the same operation must chain (each ``before`` is the previous ``after``).
        A stale one is refused (``StaleWrite``) without touching the others. Rejected transitions
        (``accepted=False``) are only appended to the log.
        """
        for t in transitions:
            _refuse_receipt_state(t)
        if not transitions:
            return []
        try:
            if len(transitions) == 1:
                return [self._apply_one(transitions[0])]
            return self._apply_batch(transitions)
        except duckdb.Error as exc:
            if not _is_constraint_error(exc) or len(transitions) == 1:
                if _is_constraint_error(exc):
                    t = transitions[0]
                    return [
                        BatchOutcome(
                            None, DuplicateOperation("server task id", f"{t.after.server} {t.after.task_id}")
                        )
                    ]
                raise
            # One transition broke a constraint: fall back to one transaction each, so the
            # others still commit and the offender is named.
            out: list[BatchOutcome] = []
            for t in transitions:
                out.extend(self.apply_many([t]))
            return out

    def _apply_one(self, t: Transition) -> BatchOutcome:
        # The common single write: plain parameterised statements beat registering Arrow tables.
        before, after = t.before, t.after
        with self._tx() as tx:
            if after == before:
                # Nothing to write but the log line; it must still be about the row as it is,
                # or a stale reply would be logged as accepted against a state it never saw.
                current = tx.execute(
                    "SELECT row_version, cancel_generation FROM op_state WHERE operation_id = ?",
                    [before.operation_id],
                ).fetchone()
                if current is None or (int(current[0]), int(current[1])) != (
                    before.row_version,
                    before.cancel_generation,
                ):
                    return BatchOutcome(None, StaleWrite(before.operation_id, before.row_version))
            else:
                assignments = ", ".join(f"{c} = ?" for c in _STATE_COLUMNS[1:])
                row = _state_row(after, before.row_version, before.cancel_generation)[: len(_STATE_COLUMNS)]
                updated = tx.execute(
                    f"UPDATE op_state SET {assignments} "
                    "WHERE operation_id = ? AND row_version = ? AND cancel_generation = ?",
                    [*row[1:], before.operation_id, before.row_version, before.cancel_generation],
                ).fetchone()
                if not updated or updated[0] != 1:
                    return BatchOutcome(None, StaleWrite(before.operation_id, before.row_version))
                if after.task_id is not None and after.task_id != before.task_id:
                    tx.execute(
                        "INSERT INTO task_bindings VALUES (?, ?, ?, ?)",
                        [after.server, after.task_id, after.operation_id, t.at],
                    )
            tx.execute(
                "INSERT INTO transitions VALUES (nextval('transition_seq'), ?,?,?,?,?,?,?,?,?,?,?)",
                _transition_row(t),
            )
        return BatchOutcome(after, None)

    def _apply_batch(self, transitions: Sequence[Transition]) -> list[BatchOutcome]:
        with self._tx() as tx:
            return self._apply_batch_in(tx, transitions)

    def _apply_batch_in(
        self, tx: duckdb.DuckDBPyConnection, transitions: Sequence[Transition]
    ) -> list[BatchOutcome]:
        # Collapse chains: per operation, the first 'before' is what the ledger must hold, the
        # last 'after' is what it will hold.
        first: dict[str, Transition] = {}
        last: dict[str, Transition] = {}
        chain_errors: dict[int, LedgerError] = {}
        for i, t in enumerate(transitions):
            key = t.after.operation_id
            if t.before.operation_id != key:
                chain_errors[i] = LedgerError("transition changes operation id")
                continue
            if key in last:
                prev = last[key].after
                if t.before.row_version != prev.row_version:
                    chain_errors[i] = StaleWrite(key, t.before.row_version, "does not chain within the batch")
                    continue
            else:
                first[key] = t
            last[key] = t
        state_rows = [
            _state_row(last[k].after, first[k].before.row_version, first[k].before.cancel_generation)
            for k in last
            if last[k].after != first[k].before
        ]
        unchanged = [
            (k, first[k].before.row_version, first[k].before.cancel_generation)
            for k in last
            if last[k].after == first[k].before
        ]
        bindings = []
        for k, t in last.items():
            before_task = first[k].before.task_id
            if t.after.task_id is not None and t.after.task_id != before_task:
                bindings.append((t.after.server, t.after.task_id, k, t.at))
        new_state = _columns(state_rows, _STATE_SCHEMA)
        stale_ids: set[str] = set()
        if unchanged:
            # Log-only transitions are checked too: they must describe the row as it is.
            tx.register("log_only", _columns(unchanged, _EXPECT_SCHEMA))
            try:
                stale_ids |= {
                    str(r[0])
                    for r in tx.execute(
                        "SELECT e.operation_id FROM log_only e LEFT JOIN op_state s USING (operation_id) "
                        "WHERE s.operation_id IS NULL OR s.row_version <> e.expected_version "
                        "OR s.cancel_generation <> e.expected_cancel_generation"
                    ).fetchall()
                }
            finally:
                tx.unregister("log_only")
        if state_rows:
            tx.register("new_state", new_state)
            try:
                stale = tx.execute(
                    "SELECT n.operation_id, s.row_version FROM new_state n LEFT JOIN op_state s "
                    "ON s.operation_id = n.operation_id "
                    "WHERE s.operation_id IS NULL OR s.row_version <> n.expected_version "
                    "OR s.cancel_generation <> n.expected_cancel_generation"
                ).fetchall()
                changed_stale = {str(r[0]) for r in stale}
                stale_ids |= changed_stale
                assignments = ", ".join(f"{c} = n.{c}" for c in _STATE_COLUMNS[1:])
                updated = tx.execute(
                    f"UPDATE op_state SET {assignments} FROM new_state n "
                    "WHERE op_state.operation_id = n.operation_id AND op_state.row_version = n.expected_version "
                    "AND op_state.cancel_generation = n.expected_cancel_generation"
                ).fetchone()
            finally:
                tx.unregister("new_state")
            expected = len(state_rows) - len(changed_stale)
            if updated is None or int(updated[0]) != expected:
                raise duckdb.TransactionException("concurrent writer moved rows during group commit")
        fresh = [b for b in bindings if b[2] not in stale_ids]
        if fresh:
            tx.register("new_bindings", _columns(fresh, _BINDING_SCHEMA))
            try:
                tx.execute("INSERT INTO task_bindings SELECT * FROM new_bindings")
            finally:
                tx.unregister("new_bindings")
        log_rows = [
            _transition_row(t)
            for i, t in enumerate(transitions)
            if i not in chain_errors and t.after.operation_id not in stale_ids
        ]
        if log_rows:
            log = _columns(log_rows, _TRANSITION_SCHEMA)
            tx.register("new_log", log)
            try:
                tx.execute("INSERT INTO transitions SELECT nextval('transition_seq'), * FROM new_log")
            finally:
                tx.unregister("new_log")
        out: list[BatchOutcome] = []
        for i, t in enumerate(transitions):
            if i in chain_errors:
                out.append(BatchOutcome(None, chain_errors[i]))
            elif t.after.operation_id in stale_ids:
                out.append(BatchOutcome(None, StaleWrite(t.after.operation_id, t.before.row_version)))
            else:
                out.append(BatchOutcome(t.after, None))
        return out

    def accept_terminal(self, transition: Transition, payload: Json | None) -> Receipt:
        """The single acceptance point: one transaction writes the receipt and the outbox entry.

        It matches call node, request digest, operation id, task id, tool version, execution
        epoch, cancel generation, terminal status and result digest against the ledger's row
        (and the result digest against ``payload``), then writes the operation's new state, the
        transition, the receipt, the stored result and (for a primary operation) exactly one ready
        outbox entry. A shadow operation's receipt never reaches the outbox.

        Raises:
            ReceiptConflict: a field does not match; names the field; nothing is written.
            StaleWrite: the row moved since it was read; nothing is written.
        """
        receipt = receipt_of(transition)
        after = transition.after
        with self._tx() as tx:
            row = tx.execute(f"{_OPERATION_SELECT} WHERE operation_id = ?", [receipt.operation_id]).fetchone()
            current = None
            if row is not None:
                cols = [d[0] for d in tx.description or ()]
                current = operation_from_record(dict(zip(cols, row, strict=True)))
            check_acceptance(current, transition, payload)
            assert current is not None
            state_row = _state_row(after, current.row_version, current.cancel_generation)[
                : len(_STATE_COLUMNS)
            ]
            assignments = ", ".join(f"{c} = ?" for c in _STATE_COLUMNS[1:])
            updated = tx.execute(
                f"UPDATE op_state SET {assignments} WHERE operation_id = ? AND row_version = ? AND cancel_generation = ?",
                [*state_row[1:], current.operation_id, current.row_version, current.cancel_generation],
            ).fetchone()
            if not updated or updated[0] != 1:
                raise StaleWrite(current.operation_id, current.row_version)
            tx.execute(
                "INSERT INTO transitions VALUES (nextval('transition_seq'), ?,?,?,?,?,?,?,?,?,?,?)",
                _transition_row(transition),
            )
            tx.execute(
                "INSERT INTO receipts VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    receipt.call_node_id,
                    receipt.operation_id,
                    receipt.request_digest,
                    receipt.task_id,
                    receipt.tool_version,
                    receipt.epoch,
                    receipt.cancel_generation,
                    receipt.status.value,
                    receipt.result_digest,
                    receipt.cancel_evidence,
                    current.role.value,
                    receipt.accepted_at,
                ],
            )
            body = canonical_json(payload) if payload is not None else None
            if payload is not None and after.state is LocalState.ACCEPTED:
                tx.execute(
                    "INSERT INTO results VALUES (?,?,?,?,?)",
                    [
                        current.operation_id,
                        receipt.result_digest,
                        receipt.status.value,
                        body,
                        receipt.accepted_at,
                    ],
                )
            if current.role is Role.PRIMARY:
                tx.execute(
                    "INSERT INTO outbox VALUES (?,?,?,?,?,?,?)",
                    [
                        receipt.call_node_id,
                        receipt.operation_id,
                        "ready",
                        receipt.status.value,
                        receipt.result_digest,
                        body if after.state is LocalState.ACCEPTED else None,
                        receipt.accepted_at,
                    ],
                )
        return receipt

    def accept_many(self, items: Sequence[tuple[Transition, Json | None]]) -> list[BatchOutcome]:
        """Many acceptances, one transaction: each matched exactly as ``accept_terminal`` matches it.

        The same rule (``check_acceptance`` against the row read inside the transaction) decides
        each item; a refused item (``StaleWrite``, ``ReceiptConflict``) writes nothing and does
        not stop the others. If a uniqueness constraint fires, the batch is retried one acceptance
        per transaction so that the offender alone is refused and named.
        """
        if not items:
            return []
        for t, _ in items:
            receipt_of(t)  # refuses anything that is not an acceptance before a transaction starts
        try:
            return self._accept_batch(items)
        except duckdb.Error as exc:
            if not _is_constraint_error(exc):
                raise
        out: list[BatchOutcome] = []
        for t, payload in items:
            try:
                self.accept_terminal(t, payload)
                out.append(BatchOutcome(t.after, None))
            except (StaleWrite, ReceiptConflict) as refusal:
                out.append(BatchOutcome(None, refusal))
            except duckdb.Error as exc:
                if not _is_constraint_error(exc):
                    raise
                # The database's uniqueness refused it: this call node already holds a receipt.
                receipt = receipt_of(t)
                out.append(
                    BatchOutcome(
                        None,
                        ReceiptConflict(receipt.call_node_id, "receipt", "already written", "a second one"),
                    )
                )
        return out

    def _accept_batch(self, items: Sequence[tuple[Transition, Json | None]]) -> list[BatchOutcome]:
        with self._tx() as tx:
            return self._accept_batch_in(tx, items)

    def _accept_batch_in(
        self, tx: duckdb.DuckDBPyConnection, items: Sequence[tuple[Transition, Json | None]]
    ) -> list[BatchOutcome]:
        errors: dict[int, LedgerError] = {}
        ids = [t.after.operation_id for t, _ in items]
        seen: set[str] = set()
        for i, op_id in enumerate(ids):
            if op_id in seen:
                # An operation reaches one receipt state once; a second acceptance is stale.
                errors[i] = StaleWrite(op_id, items[i][0].before.row_version, "accepted twice in one batch")
            seen.add(op_id)
        tx.register("wanted_ops", pa.table({"operation_id": pa.array(sorted(seen), pa.string())}))
        try:
            cur = tx.execute(
                f"{_OPERATION_SELECT} WHERE operation_id IN (SELECT operation_id FROM wanted_ops)"
            )
            cols = [d[0] for d in cur.description or ()]
            current = {
                op.operation_id: op
                for op in (operation_from_record(dict(zip(cols, r, strict=True))) for r in cur.fetchall())
            }
        finally:
            tx.unregister("wanted_ops")
        states: list[list[object]] = []
        log: list[list[object]] = []
        receipts: list[list[object]] = []
        results: list[list[object]] = []
        outbox: list[list[object]] = []
        for i, (t, payload) in enumerate(items):
            if i in errors:
                continue
            now = current.get(t.after.operation_id)
            try:
                receipt = check_acceptance(now, t, payload)
            except (StaleWrite, ReceiptConflict) as refusal:
                errors[i] = refusal
                continue
            assert now is not None
            states.append(_state_row(t.after, now.row_version, now.cancel_generation))
            log.append(_transition_row(t))
            receipts.append(
                [
                    receipt.call_node_id,
                    receipt.operation_id,
                    receipt.request_digest,
                    receipt.task_id,
                    receipt.tool_version,
                    receipt.epoch,
                    receipt.cancel_generation,
                    receipt.status.value,
                    receipt.result_digest,
                    receipt.cancel_evidence,
                    now.role.value,
                    receipt.accepted_at,
                ]
            )
            body = canonical_json(payload) if payload is not None else None
            accepted = t.after.state is LocalState.ACCEPTED
            if body is not None and accepted:
                results.append(
                    [
                        now.operation_id,
                        receipt.result_digest,
                        receipt.status.value,
                        body,
                        receipt.accepted_at,
                    ]
                )
            if now.role is Role.PRIMARY:
                outbox.append(
                    [
                        receipt.call_node_id,
                        receipt.operation_id,
                        "ready",
                        receipt.status.value,
                        receipt.result_digest,
                        body if accepted else None,
                        receipt.accepted_at,
                    ]
                )
        if states:
            assignments = ", ".join(f"{c} = n.{c}" for c in _STATE_COLUMNS[1:])
            tx.register("new_state", _columns(states, _STATE_SCHEMA))
            try:
                updated = tx.execute(
                    f"UPDATE op_state SET {assignments} FROM new_state n "
                    "WHERE op_state.operation_id = n.operation_id AND op_state.row_version = n.expected_version "
                    "AND op_state.cancel_generation = n.expected_cancel_generation"
                ).fetchone()
            finally:
                tx.unregister("new_state")
            if updated is None or int(updated[0]) != len(states):
                raise duckdb.TransactionException("concurrent writer moved rows during batched acceptance")
            for name, rows, schema, sql in (
                (
                    "new_log",
                    log,
                    _TRANSITION_SCHEMA,
                    "INSERT INTO transitions SELECT nextval('transition_seq'), * FROM new_log",
                ),
                (
                    "new_receipts",
                    receipts,
                    _RECEIPT_SCHEMA,
                    "INSERT INTO receipts SELECT * FROM new_receipts",
                ),
                ("new_results", results, _RESULT_SCHEMA, "INSERT INTO results SELECT * FROM new_results"),
                ("new_outbox", outbox, _OUTBOX_SCHEMA, "INSERT INTO outbox SELECT * FROM new_outbox"),
            ):
                if not rows:
                    continue
                tx.register(name, _columns(rows, schema))
                try:
                    tx.execute(sql)
                finally:
                    tx.unregister(name)
        return [
            BatchOutcome(None, errors[i]) if i in errors else BatchOutcome(t.after, None)
            for i, (t, _) in enumerate(items)
        ]

    def commit_group(self, group: WriteGroup) -> GroupOutcome:
        """Everything a service tick buffered, in ONE transaction (one durable commit).

        In order: held outcomes, transitions (each compare-and-swapped, as ``apply_many``),
        acceptances (each matched, as ``accept_many``, against the rows the transitions leave
        behind), then the protocol requests. A refused item is reported and writes nothing; the
        rest commit. If a uniqueness constraint fires, the group is retried piece by piece so
        that only the offender is refused.
        """
        for t in group.transitions:
            _refuse_receipt_state(t)
        for t, _ in group.acceptances:
            receipt_of(t)
        if group.empty:
            return GroupOutcome([], [])
        try:
            with self._tx() as tx:
                if group.held:
                    self._insert_held(tx, group.held)
                applied = self._apply_batch_in(tx, group.transitions) if group.transitions else []
                accepted = self._accept_batch_in(tx, group.acceptances) if group.acceptances else []
                if group.polls:
                    self._insert_polls(tx, group.polls)
            return GroupOutcome(applied, accepted)
        except duckdb.Error as exc:
            if not _is_constraint_error(exc):
                raise
        self.hold_many(group.held)
        applied = self.apply_many(group.transitions)
        accepted = self.accept_many(group.acceptances)
        self.record_polls(group.polls)
        return GroupOutcome(applied, accepted)

    def attach_audit_result(self, op: Operation, kind: str, payload: Json | None, at: datetime) -> None:
        """Attach something read after the terminal (e.g. a result read after cancel) to the audit trail.

        Never a success payload: it is written beside the receipt, not into it or the outbox.
        """
        with self._tx() as tx:
            tx.execute(
                "INSERT INTO receipt_audit VALUES (?,?,?,?,?,?)",
                [
                    op.call_node_id,
                    op.operation_id,
                    kind,
                    digest_of(payload) if payload is not None else None,
                    canonical_json(payload) if payload is not None else None,
                    at,
                ],
            )

    # ------------------------------------------------------- polls, approvals and reconciliation

    def record_polls(self, rows: Sequence[PollRecord]) -> None:
        """Append protocol requests to the polls table (group-committed by the caller)."""
        if not rows:
            return
        with self._tx() as tx:
            self._insert_polls(tx, rows)

    @staticmethod
    def _insert_polls(tx: duckdb.DuckDBPyConnection, rows: Sequence[PollRecord]) -> None:
        tx.register("new_polls", _columns([list(r) for r in rows], _POLL_SCHEMA))
        try:
            tx.execute("INSERT INTO polls SELECT * FROM new_polls")
        finally:
            tx.unregister("new_polls")

    def open_approval(
        self,
        op: Operation,
        *,
        message: str,
        requested_schema: Json,
        schema_digest: str,
        deadline: datetime | None,
        at: datetime,
    ) -> bool:
        """Open the approval for the operation's current input round. False if it was already open."""
        try:
            with self._tx() as tx:
                tx.execute(
                    "INSERT INTO approvals VALUES (?,?,?,?,?,?,?,'pending',NULL,NULL,?,NULL)",
                    [
                        op.operation_id,
                        op.input_round,
                        op.input_request_key,
                        message,
                        canonical_json(requested_schema),
                        schema_digest,
                        deadline,
                        at,
                    ],
                )
        except duckdb.ConstraintException:
            return False
        return True

    def record_answer(
        self, operation_id: str, input_round: int, answer: Json, actor: str, at: datetime
    ) -> bool:
        """Store the answer of a pending round. False if that round is not pending (stale or answered)."""
        with self._tx() as tx:
            row = tx.execute(
                "UPDATE approvals SET status = 'answered', answer = ?, actor = ?, answered_at = ? "
                "WHERE operation_id = ? AND input_round = ? AND status = 'pending'",
                [canonical_json(answer), actor, at, operation_id, input_round],
            ).fetchone()
        return bool(row and row[0] == 1)

    def answer_of(self, operation_id: str, input_round: int) -> Json | None:
        row = self._con.execute(
            "SELECT answer FROM approvals WHERE operation_id = ? AND input_round = ? AND status = 'answered'",
            [operation_id, input_round],
        ).fetchone()
        if row is None or row[0] is None:
            return None
        value = json.loads(str(row[0]))
        return value if isinstance(value, dict) else {"value": value}

    def approvals(self, *, pending_only: bool = True) -> list[dict[str, object]]:
        sql = "SELECT * FROM approvals"
        if pending_only:
            sql += " WHERE status = 'pending'"
        return self._rows(sql + " ORDER BY opened_at, operation_id", [])

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
            open_row = tx.execute(
                "SELECT entry_id FROM reconciliation WHERE operation_id = ? AND kind = ? AND status = 'open'",
                [op.operation_id, kind],
            ).fetchone()
            if open_row is not None:
                return int(open_row[0])
            row = tx.execute(
                "INSERT INTO reconciliation VALUES (nextval('reconciliation_seq'),?,?,?,?,?,?,?,?,?,'open',?,NULL,NULL,NULL) "
                "RETURNING entry_id",
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
        if not actor.strip() or not resolution.strip():
            raise InvalidRecord("resolving a reconciliation entry needs an actor and a reason")
        with self._tx() as tx:
            row = tx.execute(
                "UPDATE reconciliation SET status = 'resolved', resolved_at = ?, actor = ?, resolution = ? "
                "WHERE entry_id = ? AND status = 'open'",
                [at, actor, resolution, entry_id],
            ).fetchone()
        return bool(row and row[0] == 1)

    def resolve_open(self, operation_id: str, *, kind: str, actor: str, resolution: str, at: datetime) -> int:
        """Close every open entry of one kind for an operation (e.g. the server reappeared); returns how many."""
        with self._tx() as tx:
            row = tx.execute(
                "UPDATE reconciliation SET status = 'resolved', resolved_at = ?, actor = ?, resolution = ? "
                "WHERE operation_id = ? AND kind = ? AND status = 'open'",
                [at, actor, resolution, operation_id, kind],
            ).fetchone()
        return int(row[0]) if row else 0

    def reconciliation(self, *, open_only: bool = True) -> list[dict[str, object]]:
        sql = "SELECT * FROM reconciliation"
        if open_only:
            sql += " WHERE status = 'open'"
        return self._rows(sql + " ORDER BY opened_at, entry_id", [])

    def polls(self, operation_id: str | None = None) -> list[dict[str, object]]:
        if operation_id is None:
            return self._rows("SELECT * FROM polls ORDER BY sent_at", [])
        return self._rows("SELECT * FROM polls WHERE operation_id = ? ORDER BY sent_at", [operation_id])

    def hold_outcome(self, operation_id: str, held: HeldOutcome) -> None:
        """Keep a terminal outcome that arrived inline, so it survives a restart or the server's expiry."""
        self.hold_many([(operation_id, held)])

    def hold_many(self, items: Sequence[tuple[str, HeldOutcome]]) -> None:
        if not items:
            return
        with self._tx() as tx:
            self._insert_held(tx, items)

    @staticmethod
    def _insert_held(tx: duckdb.DuckDBPyConnection, items: Sequence[tuple[str, HeldOutcome]]) -> None:
        latest = {operation_id: held for operation_id, held in items}  # a later copy replaces an earlier one
        rows = [
            [
                operation_id,
                held.status,
                held.digest,
                canonical_json(held.payload),
                held.task_id,
                held.epoch_echo,
                held.held_at,
            ]
            for operation_id, held in latest.items()
        ]
        tx.register("new_held", _columns(rows, _HELD_SCHEMA))
        try:
            tx.execute("INSERT OR REPLACE INTO held_outcomes SELECT * FROM new_held")
        finally:
            tx.unregister("new_held")

    def held_outcome(self, operation_id: str) -> HeldOutcome | None:
        row = self._con.execute(
            "SELECT status, digest, payload, task_id, epoch_echo, held_at FROM held_outcomes WHERE operation_id = ?",
            [operation_id],
        ).fetchone()
        if row is None:
            return None
        payload = json.loads(str(row[2]))
        if not isinstance(payload, dict):
            raise LedgerCorrupt(f"held outcome of {operation_id} is not a JSON object")
        return HeldOutcome(
            status=str(row[0]),
            digest=str(row[1]),
            payload=payload,
            task_id=row[3],
            epoch_echo=int(row[4]) if row[4] is not None else None,
            held_at=_as_dt(row[5], "held_at") or datetime.min.replace(tzinfo=UTC),
        )

    # ------------------------------------------------------------ bulk import (seeding only)

    def import_rows(self, tables: Mapping[str, pa.Table]) -> dict[str, int]:
        """Append pre-built rows to ledger tables in ONE transaction: for seeded demo/test/bench ledgers only.

        This bypasses ``engine.machine`` and ``accept_terminal``: the caller (``demo.seed``)
        vouches that the rows are one consistent history. The service never calls it. The database's
        own keys still hold, so a second receipt or outbox row for a call node fails the whole import.
        Columns are matched by name. Sequence-backed ids (``transitions.seq``,
        ``reconciliation.entry_id``) must be left out: they are numbered here, in the order of the
        rows given, and the sequence is advanced past them so later writes continue after them.
        ``gate_runs`` and ``explorer_runs`` are not importable (use ``record_gate_run`` and
        ``record_explorer_run``), nor are the rollout's state and hash-chained events.

        Returns:
            Rows imported per table.

        Raises:
            LedgerError: a table is not importable, or its columns do not match the schema.
        """
        sequenced = {
            "transitions": ("seq", "transition_seq"),
            "reconciliation": ("entry_id", "reconciliation_seq"),
        }
        # The rollout's state and its hash chain are written only by the rollout module.
        importable = _TABLES - {
            "operations",
            "gate_runs",
            "explorer_runs",
            "settings",
            "rollout_state",
            "rollout_events",
        }
        schema = self.table_columns()
        prepared: list[tuple[str, pa.Table]] = []
        for table, rows in tables.items():
            if table not in importable:
                raise LedgerError(f"table {table!r} cannot be bulk-imported")
            expected = list(schema[table])
            if table in sequenced:
                column, _ = sequenced[table]
                if column in rows.column_names:
                    raise LedgerError(f"{table}.{column} is numbered by the ledger; leave it out")
                expected.remove(column)
            if sorted(rows.column_names) != sorted(expected):
                missing = sorted(set(expected) - set(rows.column_names))
                extra = sorted(set(rows.column_names) - set(expected))
                raise LedgerError(f"{table}: columns do not match (missing {missing}, unexpected {extra})")
            prepared.append((table, rows))
        counts: dict[str, int] = {}
        with self._tx() as tx:
            for table, rows in prepared:
                if table in sequenced and rows.num_rows:
                    column, sequence = sequenced[table]
                    # fetchall: a half-read result would block registering the rows below
                    (row,) = tx.execute(
                        f"SELECT min(v), max(v) FROM (SELECT nextval('{sequence}') AS v FROM range(?))",
                        [rows.num_rows],
                    ).fetchall()
                    first = int(row[0])
                    if int(row[1]) - first + 1 != rows.num_rows:
                        raise LedgerError(f"{sequence} moved during the import; another writer is active")
                    ids = pa.array(range(first, first + rows.num_rows), pa.int64())
                    rows = rows.append_column(column, ids)
                tx.register("imported_rows", rows)
                try:
                    tx.execute(f"INSERT INTO {table} BY NAME SELECT * FROM imported_rows")
                finally:
                    tx.unregister("imported_rows")
                counts[table] = counts.get(table, 0) + rows.num_rows
        return counts

    def record_explorer_run(self, run: ExplorerRun) -> int:
        """Append one explorer result (per scenario and protocol); returns its run id."""
        with self._tx() as tx:
            row = tx.execute(
                "INSERT INTO explorer_runs VALUES (nextval('explorer_run_seq'),?,?,?,?,?,?,?,?,?,?,?,?,?) "
                "RETURNING run_id",
                [
                    run.scenario,
                    run.protocol,
                    run.seed,
                    run.explored,
                    run.distinct_interleavings,
                    run.divergent,
                    run.exhaustive,
                    run.rules,
                    run.shortest_trace,
                    run.started_at,
                    run.finished_at,
                    run.code,
                    run.revision,
                ],
            ).fetchone()
        assert row is not None
        return int(row[0])

    def explorer_runs(self) -> list[dict[str, object]]:
        return self._rows("SELECT * FROM explorer_runs ORDER BY run_id", [])

    def snapshot(self, dest: str | Path) -> Path:
        """Write a consistent copy of the whole ledger to ``dest`` (replaced if present), for readers.

        The copy is made inside one read transaction, so it is a single point in time.
        """
        target = Path(dest)
        partial = target.with_name(target.name + ".partial")
        for stale in (partial, Path(str(partial) + ".wal")):
            stale.unlink(missing_ok=True)
        con = self._con
        row = con.execute("SELECT current_database()").fetchone()
        source = str(row[0]) if row else "memory"
        escaped = str(partial).replace("'", "''")
        con.execute(f"ATTACH '{escaped}' AS finality_snapshot")
        try:
            con.execute(f'COPY FROM DATABASE "{source}" TO finality_snapshot')
        finally:
            con.execute("DETACH finality_snapshot")
        partial.replace(target)
        return target

    def list_operations(
        self,
        *,
        state: str | None = None,
        protocol: str | None = None,
        tool: str | None = None,
        limit: int = 100,
    ) -> list[dict[str, object]]:
        """Operations as flat records, newest first, filtered by exact state/protocol/tool."""
        where: list[str] = []
        params: list[object] = []
        for column, value in (("state", state), ("protocol", protocol), ("tool_name", tool)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = _OPERATION_SELECT + (f" WHERE {' AND '.join(where)}" if where else "")
        return self._rows(sql + " ORDER BY created_at DESC, operation_id LIMIT ?", [*params, limit])

    def state_counts(self) -> list[tuple[str, str, int]]:
        rows = self._con.execute(
            "SELECT s.state, i.protocol, count(*) FROM op_state s JOIN op_identity i USING (operation_id) "
            "GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        return [(str(a), str(b), int(c)) for a, b, c in rows]

    def poll_counts(self) -> list[tuple[str, int]]:
        rows = self._con.execute("SELECT outcome, count(*) FROM polls GROUP BY ALL ORDER BY ALL").fetchall()
        return [(str(a), int(b)) for a, b in rows]

    def open_reconciliation_counts(self) -> list[tuple[str, int]]:
        rows = self._con.execute(
            "SELECT kind, count(*) FROM reconciliation WHERE status = 'open' GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        return [(str(a), int(b)) for a, b in rows]

    def put_setting(self, key: str, value: str, at: datetime) -> None:
        with self._tx() as tx:
            tx.execute("INSERT OR REPLACE INTO settings VALUES (?, ?, ?)", [key, value, at])

    def setting(self, key: str) -> str | None:
        row = self._con.execute("SELECT value FROM settings WHERE key = ?", [key]).fetchone()
        return str(row[0]) if row else None

    def gate_inputs(self, now: datetime) -> dict[str, dict[str, object]]:
        """The raw inputs of the six gates, read from the ledger only (no thresholds applied here).

        One statement, defined once in ``engine.ledger.gate_sql`` and shared with the console.
        """
        cur = self._con.execute(gate_inputs_sql(now))
        row = cur.fetchone()
        if row is None:
            raise LedgerError("the gate-inputs statement returned no row")
        return gate_inputs_from_values([d[0] for d in cur.description or ()], row)

    def record_gate_run(self, results: Sequence[GateRecord], at: datetime) -> int:
        """Store one evaluation of the gates; returns its run id."""
        with self._tx() as tx:
            row = tx.execute("SELECT nextval('gate_run_seq')").fetchone()
            assert row is not None
            run_id = int(row[0])
            for r in results:
                tx.execute(
                    "INSERT INTO gate_runs VALUES (?,?,?,?,?,?,?,?)",
                    [run_id, r.gate, r.passed, r.value, r.threshold, r.verdict, _json_text(r.inputs), at],
                )
        return run_id

    def gate_runs(self, limit: int = 500) -> list[dict[str, object]]:
        return self._rows("SELECT * FROM gate_runs ORDER BY run_id DESC, gate LIMIT ?", [limit])

    # --------------------------------------------------------------------------------- rollout
    # Persistence for ``rollout/``: the rollout state (with the execution epoch), its hash-chained
    # audit log, each operation's arm and the shadow comparisons. The decisions are rollout's.

    _ROLLOUT_EVENT_COLUMNS: Final = (
        "seq",
        "action",
        "actor",
        "reason",
        "override",
        "before_state",
        "after_state",
        "detail",
        "gate_inputs",
        "gate_inputs_digest",
        "prev_hash",
        "hash",
        "recorded_at",
    )
    _ASSIGNMENT_COLUMNS: Final = (
        "operation_id",
        "call_node_id",
        "tool_name",
        "role",
        "arm",
        "stage",
        "bucket",
        "canary_bp",
        "server_name",
        "rerouted_from",
        "primary_operation_id",
        "rollout_seq",
        "assigned_at",
    )
    _SHADOW_DIFF_COLUMNS: Final = (
        "primary_operation_id",
        "shadow_operation_id",
        "call_node_id",
        "tool_name",
        "primary_status",
        "shadow_status",
        "primary_result_digest",
        "shadow_result_digest",
        "primary_content_digest",
        "shadow_content_digest",
        "primary_latency_ms",
        "shadow_latency_ms",
        "primary_polls",
        "shadow_polls",
        "diverged",
        "differences",
        "recorded_at",
    )

    def rollout_state(self) -> dict[str, object] | None:
        """The one ``rollout_state`` row (list columns decoded), or None before the first action."""
        rows = self._rows("SELECT * FROM rollout_state WHERE id = 1", [])
        if not rows:
            return None
        row = rows[0]
        for key in ("shadow_tools", "disabled_protocols"):
            row[key] = json.loads(str(row[key]))
        return row

    def execution_epoch(self) -> int | None:
        """The execution epoch the ledger records (raised only by a rollback), or None if never set."""
        row = self._con.execute("SELECT epoch FROM rollout_state WHERE id = 1").fetchone()
        return int(row[0]) if row else None

    def append_rollout_event(
        self, event: dict[str, object], state: dict[str, object], *, expected_seq: int, expected_epoch: int
    ) -> None:
        """Append one audit row and move ``rollout_state`` to ``state`` in one transaction.

        Compare-and-swap on the chain head and the epoch: the write only lands if the state row is
        still at ``expected_seq`` and ``expected_epoch`` (no row at all when ``expected_seq`` is 0),
        so two actions can never fork the chain or both raise the epoch.

        Raises:
            StaleWrite: another action moved the rollout (or the epoch) first; nothing is written.
        """
        values = [event[c] for c in self._ROLLOUT_EVENT_COLUMNS]
        if event["seq"] != expected_seq + 1:
            raise LedgerError("a rollout event must follow the chain head")
        columns = [
            state["stage"],
            state["canary_bp"],
            state["salt"],
            _json_text(_string_list(state["shadow_tools"])),
            _json_text(_string_list(state["disabled_protocols"])),
            state["epoch"],
            event["seq"],
            event["hash"],
            event["recorded_at"],
        ]
        with self._tx() as tx:
            current = tx.execute("SELECT head_seq, epoch FROM rollout_state WHERE id = 1").fetchone()
            if current is None:
                if expected_seq != 0:
                    raise StaleWrite("rollout", expected_seq, "the rollout state row is missing")
                tx.execute("INSERT INTO rollout_state VALUES (1, ?,?,?,?,?,?,?,?,?)", columns)
            else:
                updated = tx.execute(
                    "UPDATE rollout_state SET stage = ?, canary_bp = ?, salt = ?, shadow_tools = ?, "
                    "disabled_protocols = ?, epoch = ?, head_seq = ?, head_hash = ?, updated_at = ? "
                    "WHERE id = 1 AND head_seq = ? AND epoch = ?",
                    [*columns, expected_seq, expected_epoch],
                ).fetchone()
                if not updated or updated[0] != 1:
                    raise StaleWrite(
                        "rollout",
                        expected_seq,
                        f"the rollout moved to seq {current[0]} at epoch {current[1]} first",
                    )
            tx.execute(
                f"INSERT INTO rollout_events VALUES ({', '.join('?' * len(values))})",
                values,
            )

    def rollout_events(
        self, *, limit: int | None = None, newest_first: bool = False
    ) -> list[dict[str, object]]:
        """Audit rows in chain order (or newest first)."""
        sql = "SELECT * FROM rollout_events ORDER BY seq" + (" DESC" if newest_first else "")
        params: list[object] = []
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return self._rows(sql, params)

    def record_assignments(self, rows: Sequence[dict[str, object]]) -> None:
        """Record operations' arms (one per operation; a second row for an operation is ignored)."""
        if not rows:
            return
        table = _columns([[r.get(c) for c in self._ASSIGNMENT_COLUMNS] for r in rows], _ASSIGNMENT_SCHEMA)
        with self._tx() as tx:
            tx.register("new_assignments", table)
            try:
                tx.execute("INSERT OR IGNORE INTO rollout_assignments SELECT * FROM new_assignments")
            finally:
                tx.unregister("new_assignments")

    def assignments(self, *, limit: int = 1000) -> list[dict[str, object]]:
        return self._rows("SELECT * FROM rollout_assignments ORDER BY assigned_at DESC LIMIT ?", [limit])

    def rollout_keys(self) -> list[tuple[str, str, str]]:
        """``(call_node_id, operation_id, state)`` of every primary operation routed by arm."""
        rows = self._con.execute(
            "SELECT a.call_node_id, a.operation_id, s.state FROM rollout_assignments a "
            "JOIN op_state s USING (operation_id) WHERE a.role = 'primary' AND a.arm IN ('control', 'canary') "
            "ORDER BY a.call_node_id"
        ).fetchall()
        return [(str(a), str(b), str(c)) for a, b, c in rows]

    def arm_counts(self) -> list[dict[str, object]]:
        """Operations per arm, server, protocol and whether they still hold no receipt."""
        return self._rows(
            "SELECT a.arm, a.server_name, i.protocol, "
            "s.state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED') AS in_flight, count(*) AS operations "
            "FROM rollout_assignments a JOIN op_state s USING (operation_id) "
            "JOIN op_identity i USING (operation_id) GROUP BY ALL ORDER BY ALL",
            [],
        )

    def live_by_protocol(self) -> dict[str, dict[str, int]]:
        """Operations without a receipt, per protocol and local state (UNKNOWN ones included)."""
        rows = self._con.execute(
            "SELECT i.protocol, s.state, count(*) FROM op_state s JOIN op_identity i USING (operation_id) "
            "WHERE s.state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED') GROUP BY ALL ORDER BY ALL"
        ).fetchall()
        out: dict[str, dict[str, int]] = {}
        for protocol, state, count in rows:
            out.setdefault(str(protocol), {})[str(state)] = int(count)
        return out

    def shadow_pairs(self, *, ready_only: bool) -> list[tuple[str, str]]:
        """``(primary, shadow)`` operation ids not yet compared; ``ready_only``: both hold a receipt."""
        sql = (
            "SELECT a.primary_operation_id, a.operation_id FROM rollout_assignments a "
            "LEFT JOIN shadow_diffs d ON d.shadow_operation_id = a.operation_id "
            "WHERE a.role = 'shadow' AND a.primary_operation_id IS NOT NULL AND d.shadow_operation_id IS NULL"
        )
        if ready_only:
            sql += (
                " AND a.operation_id IN (SELECT operation_id FROM receipts)"
                " AND a.primary_operation_id IN (SELECT operation_id FROM receipts)"
            )
        rows = self._con.execute(sql + " ORDER BY a.assigned_at").fetchall()
        return [(str(a), str(b)) for a, b in rows]

    def receipt_of_operation(self, operation_id: str) -> dict[str, object] | None:
        rows = self._rows("SELECT * FROM receipts WHERE operation_id = ?", [operation_id])
        return rows[0] if rows else None

    def poll_count(self, operation_id: str) -> int:
        row = self._con.execute(
            "SELECT count(*) FROM polls WHERE operation_id = ?", [operation_id]
        ).fetchone()
        return int(row[0]) if row else 0

    def record_shadow_diff(self, row: dict[str, object]) -> bool:
        """Store one comparison; False if the pair was already compared."""
        with self._tx() as tx:
            done = tx.execute(
                f"INSERT OR IGNORE INTO shadow_diffs VALUES ({', '.join('?' * len(self._SHADOW_DIFF_COLUMNS))})",
                [row.get(c) for c in self._SHADOW_DIFF_COLUMNS],
            ).fetchone()
        return bool(done and done[0] == 1)

    def shadow_diffs(self, *, diverged_only: bool = False, limit: int = 100) -> list[dict[str, object]]:
        sql = "SELECT * FROM shadow_diffs"
        if diverged_only:
            sql += " WHERE diverged"
        return self._rows(sql + " ORDER BY recorded_at DESC LIMIT ?", [limit])

    def shadow_summary(self) -> dict[str, object]:
        """Shadow operations started, compared, diverged (by what), and still waiting for a comparison."""
        row = self._con.execute(
            "SELECT (SELECT count(*) FROM rollout_assignments WHERE role = 'shadow'), count(*), "
            "count(*) FILTER (WHERE diverged), count(*) FILTER (WHERE differences LIKE '%status%'), "
            "count(*) FILTER (WHERE differences LIKE '%result%'), avg(shadow_latency_ms - primary_latency_ms), "
            "avg(shadow_polls - primary_polls) FROM shadow_diffs"
        ).fetchone()
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
        row = self._con.execute(
            "SELECT count(*) FROM transitions WHERE NOT accepted AND cause LIKE 'stale epoch%'"
        ).fetchone()
        return int(row[0]) if row else 0

    def get_many(self, operation_ids: Sequence[str]) -> dict[str, Operation]:
        """Several operations by id in one query (the ones that exist)."""
        if not operation_ids:
            return {}
        with self._begin() as con:
            con.register("wanted_ops", pa.table({"operation_id": pa.array(list(operation_ids), pa.string())}))
            try:
                cur = con.execute(
                    f"{_OPERATION_SELECT} WHERE operation_id IN (SELECT operation_id FROM wanted_ops)"
                )
                cols = [d[0] for d in cur.description or ()]
                found = [operation_from_record(dict(zip(cols, r, strict=True))) for r in cur.fetchall()]
            finally:
                con.unregister("wanted_ops")
        return {op.operation_id: op for op in found}

    def _rows(self, sql: str, params: list[object]) -> list[dict[str, object]]:
        cur = self._con.execute(sql, params)
        cols = [d[0] for d in cur.description or ()]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    # ----------------------------------------------------------------------------------- reads

    def _one(self, where: str, params: list[object]) -> Operation | None:
        cur = self._con.execute(f"{_OPERATION_SELECT} WHERE {where}", params)
        row = cur.fetchone()
        if row is None:
            return None
        cols = [d[0] for d in cur.description or ()]
        return operation_from_record(dict(zip(cols, row, strict=True)))

    def get(self, operation_id: str) -> Operation | None:
        return self._one("operation_id = ?", [operation_id])

    def by_call_node(self, call_node_id: str) -> Operation | None:
        return self._one("call_node_id = ?", [call_node_id])

    def by_task(self, server: str, task_id: str) -> Operation | None:
        return self._one("server = ? AND task_id = ?", [server, task_id])

    def by_key(self, key: str) -> Operation | None:
        return self._one("idempotency_key = ?", [key])

    def arguments(self, operation_id: str) -> Json:
        row = self._con.execute(
            "SELECT arguments FROM op_identity WHERE operation_id = ?", [operation_id]
        ).fetchone()
        if row is None:
            raise InvalidRecord(f"no operation {operation_id}")
        value = json.loads(str(row[0]))
        if not isinstance(value, dict):
            raise InvalidRecord(f"arguments of {operation_id} are not an object")
        return value

    def operations(
        self, *, states: Sequence[LocalState] | None = None, limit: int | None = None
    ) -> list[Operation]:
        sql = _OPERATION_SELECT
        params: list[object] = []
        if states:
            sql += f" WHERE state IN ({', '.join('?' * len(states))})"
            params.extend(s.value for s in states)
        sql += " ORDER BY created_at, operation_id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        cur = self._con.execute(sql, params)
        cols = [d[0] for d in cur.description or ()]
        return [operation_from_record(dict(zip(cols, r, strict=True))) for r in cur.fetchall()]

    def receipt(self, call_node_id: str) -> Receipt | None:
        row = self._con.execute(
            "SELECT call_node_id, operation_id, request_digest, task_id, tool_version, epoch, cancel_generation, "
            "status, result_digest, accepted_at, cancel_evidence FROM receipts WHERE call_node_id = ?",
            [call_node_id],
        ).fetchone()
        if row is None:
            return None
        return Receipt(
            call_node_id=CallNodeId(row[0]),
            operation_id=OperationId(row[1]),
            request_digest=Digest(row[2]),
            task_id=TaskId(row[3]) if row[3] is not None else None,
            tool_version=str(row[4]),
            epoch=Epoch(int(row[5])),
            cancel_generation=int(row[6]),
            status=ServerStatus(row[7]),
            result_digest=Digest(row[8]) if row[8] is not None else None,
            accepted_at=_as_dt(row[9], "accepted_at") or datetime.min.replace(tzinfo=UTC),
            cancel_evidence=row[10],
        )

    def result_payload(self, operation_id: str) -> Json | None:
        row = self._con.execute(
            "SELECT payload FROM results WHERE operation_id = ?", [operation_id]
        ).fetchone()
        if row is None:
            return None
        value = json.loads(str(row[0]))
        return value if isinstance(value, dict) else None

    def transitions(self, operation_id: str) -> list[dict[str, object]]:
        cur = self._con.execute(
            "SELECT seq, from_state, to_state, event, cause, accepted, epoch, row_version, recorded_at FROM transitions "
            "WHERE operation_id = ? ORDER BY seq",
            [operation_id],
        )
        cols = [d[0] for d in cur.description or ()]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def count(self, table: str) -> int:
        if table not in _TABLES:
            raise LedgerError(f"unknown ledger table {table!r}")
        row = self._con.execute(f"SELECT count(*) FROM {table}").fetchone()
        return int(row[0]) if row else 0

    def table_columns(self) -> dict[str, list[str]]:
        """Every table and view of the ledger with its columns, in order (for the documentation check)."""
        rows = self._con.execute(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = 'main' ORDER BY table_name, ordinal_position"
        ).fetchall()
        out: dict[str, list[str]] = {}
        for table, column in rows:
            out.setdefault(str(table), []).append(str(column))
        return out


def _warm_up_operation() -> Operation:
    now = datetime(2000, 1, 1, tzinfo=UTC)
    return Operation(
        operation_id=OperationId("warm-up"),
        call_node_id=CallNodeId("warm-up"),
        request_digest=Digest("sha256:0"),
        tool=ToolRef("warm-up", "0", "0"),
        principal=Principal("warm-up"),
        protocol=Protocol.LEGACY_SYNC,
        adapter_version="0",
        server="warm-up",
        idempotency_key=IdempotencyKey("warm-up"),
        state=LocalState.WORKING,
        epoch=Epoch(0),
        created_at=now,
        updated_at=now,
    )


_WARM_UP_OP: Final = _warm_up_operation()


def _check_file(path: Path, read_only: bool) -> None:
    if path.exists():
        if path.is_dir():
            raise LedgerUnavailable(f"ledger path {path} is a directory")
        if not os.access(path, os.R_OK) or (not read_only and not os.access(path, os.W_OK)):
            raise LedgerUnavailable(f"ledger file {path} is not {'readable' if read_only else 'writable'}")
        size = path.stat().st_size
        if size:
            with path.open("rb") as fh:
                head = fh.read(16)
            if len(head) < 12 or head[8:12] != _DUCKDB_MAGIC:
                raise LedgerCorrupt(f"{path} is not a DuckDB ledger file (bad header)")
        return
    if read_only:
        raise LedgerUnavailable(f"ledger file {path} does not exist")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise LedgerUnavailable(f"folder {parent} for ledger {path.name} does not exist")
    if not os.access(parent, os.W_OK):
        raise LedgerUnavailable(f"folder {parent} is not writable; cannot create ledger {path.name}")


__all__ = [
    "Ledger",
]
