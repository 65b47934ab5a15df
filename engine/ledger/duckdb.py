"""The DuckDB ledger: the one persistence boundary; it reaches DuckDB through ``engine.ledger.duckdb_client``.

It owns recorded, transactional migrations; compare-and-swap writes of operation state (one at a
time or group-committed); the single ``accept_terminal`` transaction, the only code path that
writes a receipt or an outbox row; and typed read queries. It decides nothing about states: that
is ``engine.machine``'s job. Uniqueness (one operation per call node and key, one receipt and one
outbox entry per call node, one operation per server task id) is enforced by the database.

An operation is stored in two tables: ``op_identity`` (written once) and ``op_state`` (the narrow,
mutable part, so that group-committed updates stay cheap in a column store); the ``operations``
view joins them for analysts.

``Ledger`` is the shared SQL ledger (``engine.ledger.base``) over this driver's primitives and
write paths; its whole-ledger paths (snapshot copies, the gate-inputs read, the export's batches,
the seeding's import) are ``engine.ledger.duckdb_bulk``'s.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from operator import attrgetter, ne
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from engine.acceptance import check_acceptance, receipt_of
from engine.clock import SystemClock
from engine.errors import (
    InvalidRecord,
    LedgerCorrupt,
    LedgerError,
    LedgerUnavailable,
    SchemaTooNew,
    StaleWrite,
)
from engine.ledger import duckdb_client as duck
from engine.ledger import rows as codec
from engine.ledger import sql
from engine.ledger.base import SqlLedger
from engine.ledger.core import cas_params
from engine.ledger.duckdb_bulk import DuckBulk
from engine.ledger.port import (
    BatchOutcome,
    GroupOutcome,
    HeldOutcome,
    Json,
    Outcomes,
    WriteGroup,
)
from engine.ledger.receipts import acceptance_outcomes, repeated_acceptances
from engine.ledger.schema import (
    _EXPECT_SCHEMA,
    _IDENTITY_SCHEMA,
    _STATE_COLUMNS,
    _STATE_SCHEMA,
    _TRANSITION_SCHEMA,
    MIGRATIONS,
    OUTBOX_SEQUENCE,
    ROW_SCHEMAS,
    SUPPORTED_SCHEMA,
)
from engine.ledger.schema import _TABLES as _TABLES  # the table names, for the contract suite
from engine.ledger.writes import chain, outcomes
from engine.model import (
    Operation,
    OperationId,
    Receipt,
    Transition,
)

__all__ = ["SUPPORTED_SCHEMA", "Ledger"]

# Each migration (``engine.ledger.schema.MIGRATIONS``) is applied once, in its own transaction, and
# recorded in schema_migrations. Never edit a released migration: add a new one.

_STATE_VERSION: Final = "SELECT row_version, cancel_generation FROM op_state WHERE operation_id = ?"
# A parameter list, not a join with the batch: looked up in the call node's index, where a join
# scans every row of op_identity (1.8 ms for one call node at 100,000 operations against 0.55).
_HELD_CALL_NODES: Final = "SELECT call_node_id FROM op_identity WHERE call_node_id IN "
_DUCKDB_MAGIC: Final = b"DUCK"
_HEADER_BYTES: Final = 3 * 4096


_columns: Final = codec.arrow_rows
_BEFORE: Final = attrgetter("before")
_AFTER: Final = attrgetter("after")
_VERSION: Final = attrgetter("row_version")


# ------------------------------------------------------------------------------------- the ledger


class Ledger(SqlLedger, DuckBulk):
    """A ledger file (or ``:memory:``). One process writes a file; readers may open it read-only.

    Thread-safe: each thread gets its own cursor on the shared database, so concurrent writers
    race on the database's own constraints and transaction conflicts, never on Python state.
    """

    dialect = "duckdb"
    leasing = None
    """One process owns a DuckDB file: nothing is leased or fenced."""

    def __init__(self, con: duck.Connection, path: str, read_only: bool) -> None:
        self._root = con
        self.path = path
        self.read_only = read_only
        self._local = threading.local()

    # ---------------------------------------------------------------------------- open / close

    @classmethod
    def open(cls, path: str | Path, *, read_only: bool = False, threads: int | None = None) -> Ledger:
        """Open (and migrate) a ledger.

        ``threads``: DuckDB's worker threads for everything this process runs on the ledger (None:
        DuckDB's default, one per core). With 1, every statement runs on the thread that issued it
        alone, so the CPU of a statement counts at its caller's priority: a snapshot made on a niced
        reader thread then takes no CPU at the executor's priority (``finality serve`` opens it so).

        Raises:
            LedgerUnavailable: the file or its folder cannot be read or written.
            LedgerCorrupt: the file is not a DuckDB ledger, or is damaged.
            SchemaTooNew: a newer Finality wrote it.
        """
        spath = str(path)
        if spath != ":memory:":
            _check_file(Path(spath), read_only)
        try:
            con = duck.connect(
                spath, read_only=read_only, config={} if threads is None else {"threads": threads}
            )
        except duck.IOException as exc:
            if "lock" in str(exc).lower():
                # Another process (a running finality serve) holds the file: it is fine, only busy.
                raise LedgerUnavailable(f"ledger {spath} is held by another process: {exc}") from exc
            raise LedgerCorrupt(f"cannot open ledger {spath}: {exc}") from exc
        except duck.Error as exc:
            raise LedgerCorrupt(f"cannot open ledger {spath}: {exc}") from exc
        ledger = cls(con, spath, read_only)
        try:
            if spath != ":memory:":
                ledger._check_size(Path(spath))
            ledger._migrate()
        except LedgerError:
            con.close()
            raise
        except duck.Error as exc:
            con.close()
            raise LedgerCorrupt(f"ledger {spath} is damaged: {exc}") from exc
        return ledger

    def close(self) -> None:
        self._root.close()

    @property
    def snapshots(self) -> Ledger:
        """Analysts read snapshot files of a DuckDB ledger, never the file the executor writes."""
        return self

    def warm_up(self) -> None:
        """Pay one-time costs (pyarrow's lazy imports) now rather than on the first write."""
        _columns([codec._state_row(_WARM_UP_OP, 0, 0)], _STATE_SCHEMA)

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _con(self) -> duck.Connection:
        cur: duck.Connection | None = getattr(self._local, "cur", None)
        if cur is None:
            cur = self._root.cursor()
            self._local.cur = cur
        return cur

    @contextmanager
    def _tx(self) -> Iterator[duck.Connection]:
        if self.read_only:
            # Said at once: DuckDB's own refusal would look like a constraint conflict to callers.
            raise LedgerUnavailable(f"ledger {self.path} was opened read-only")
        with self._begin() as con:
            yield con

    @contextmanager
    def _begin(self) -> Iterator[duck.Connection]:
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
        except duck.Error:
            # A commit-time conflict leaves the transaction aborted; clear it before re-raising.
            with suppress(duck.Error):
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
        applied = False
        for version, name, statements in MIGRATIONS:
            if version <= current:
                continue
            if self.read_only:
                raise LedgerUnavailable(f"{self.path} needs migration {version} but was opened read-only")
            with self._tx() as tx:
                for sql in statements:
                    tx.execute(sql)
                tx.execute(
                    "INSERT INTO schema_migrations VALUES (?, ?, ?)", [version, name, SystemClock().now()]
                )
            applied = True
        if applied:
            # Write the new schema into the file now. Left in the WAL, a crash before DuckDB's own
            # checkpoint makes the next open replay the DDL, and replaying an ALTER of a table with
            # CHECK constraints asks to download an extension (found by SIGKILLing a fresh service):
            # the ledger would not open again on a machine without network.
            con.execute("CHECKPOINT")

    # ----------------------------------------------------------------------- driver primitives

    def _rows(self, query: str, params: Sequence[object] = ()) -> list[dict[str, object]]:
        cur = self._con.execute(self._q(query), list(params))
        cols = [d[0] for d in cur.description or ()]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def _fetchone(self, query: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        return self._con.execute(self._q(query), list(params)).fetchone()

    def _fetchall(self, query: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        return self._con.execute(self._q(query), list(params)).fetchall()

    def _affected(self, tx: Any, query: str, params: Sequence[object]) -> int:
        # DuckDB answers a write with one row: how many rows it wrote.
        row = tx.execute(self._q(query), list(params)).fetchone()
        return int(row[0]) if row else 0

    def _insert_many(self, tx: Any, table: str, rows: Sequence[Sequence[object]], suffix: str = "") -> None:
        # One Arrow table per append: a column store takes a batch far faster than rows.
        numbered = "nextval('transition_seq'), " if table == "transitions" else ""
        trailing = f", nextval('{OUTBOX_SEQUENCE}')" if table == "outbox" else ""
        _over(
            tx,
            f"INSERT INTO {table} SELECT {numbered}*{trailing} FROM arrow_batch{suffix}",
            _columns(rows, ROW_SCHEMAS[table]),
        )

    def _conflict(self, exc: Exception) -> bool:
        # A CHECK failure (engine.limits' identifier rules, migration 8) is a refusal, not a
        # conflict with another writer; it may sit under the aborted transaction's error.
        seen: BaseException | None = exc
        while seen is not None:
            if isinstance(seen, duck.ConstraintException) and "CHECK constraint" in str(seen):
                raise InvalidRecord(f"the ledger's identifier rules refuse this row: {seen}") from exc
            seen = seen.__context__
        return isinstance(exc, duck.ConstraintException | duck.TransactionException)

    def _operations_in(self, column: str, values: Sequence[str]) -> list[Operation]:
        # In a transaction: the statement reads one snapshot of both tables of the view.
        with self._begin() as con:
            records = _records_over(
                con,
                f"{sql.OPERATION_SELECT} WHERE {column} IN (SELECT {column} FROM arrow_batch)",
                pa.table({column: pa.array(list(values), pa.string())}),
            )
            return [codec.operation_from_record(r) for r in records]

    # ---------------------------------------------------------------------------------- writes

    def _insert_fresh(
        self, fresh: Sequence[tuple[Operation, Json]], arms: Sequence[dict[str, object]] = ()
    ) -> set[str] | None:
        try:
            with self._tx() as tx:
                inserted = self._bulk_insert_new(tx, fresh)
                self._insert_arms(tx, [r for r in arms if r["operation_id"] in inserted], fresh=True)
        except duck.Error as exc:
            if not self._conflict(exc):  # a CHECK refusal raises InvalidRecord there
                raise
            return None
        return inserted

    def _created_by_another(self, op: Operation) -> Operation | None:
        # The conflicting row may belong to a creator whose transaction has not committed yet;
        # give it a bounded moment to land so that the caller gets the one operation back.
        pause = threading.Event()
        for _ in range(200):
            existing = self.by_call_node(op.call_node_id) or self.by_key(op.idempotency_key)
            if existing is not None:
                return existing
            pause.wait(0.005)
        return None

    def _bulk_insert_new(self, tx: duck.Connection, fresh: Sequence[tuple[Operation, Json]]) -> set[str]:
        """Insert the operations whose call node is new; their ids. A call node the ledger holds is
        skipped (the caller reads those), looked up by its index inside this transaction, so that no
        read has to come first; a creator that has not committed yet still conflicts (the caller
        then goes one by one). DuckDB's ``ON CONFLICT DO NOTHING`` would skip them too, at 2-3x the
        INSERT's cost for a batch of 1-50 (measured): the lookup costs less."""
        nodes = [op.call_node_id for op, _ in fresh]
        held = tx.execute(_HELD_CALL_NODES + f"({sql.placeholders(len(nodes))})", nodes).fetchall()
        if held:
            skip = {str(r[0]) for r in held}
            fresh = [(op, args) for op, args in fresh if op.call_node_id not in skip]
            if not fresh:
                return set()
        _over(
            tx,
            "INSERT INTO op_identity SELECT * FROM arrow_batch",
            _columns([codec.identity_row(op, args) for op, args in fresh], _IDENTITY_SCHEMA),
        )
        # By column (C-level maps), not a row per operation: a burst of 200 submissions spent more
        # CPU on the rows' per-value conversions than on this INSERT.
        _over(
            tx,
            f"INSERT INTO op_state SELECT {', '.join(_STATE_COLUMNS)} FROM arrow_batch",
            codec.state_table([op for op, _ in fresh], [(0, 0)] * len(fresh)),
        )
        _over(
            tx,
            "INSERT INTO transitions SELECT nextval('transition_seq'), * FROM arrow_batch",
            _columns([codec.created_row(op) for op, _ in fresh], _TRANSITION_SCHEMA),
        )
        return {op.operation_id for op, _ in fresh}

    def _apply_one(self, t: Transition) -> BatchOutcome:
        # The common single write: plain parameterised statements beat registering Arrow tables.
        before, after = t.before, t.after
        with self._tx() as tx:
            if after == before:
                # Nothing to write but the log line; it must still be about the row as it is,
                # or a stale reply would be logged as accepted against a state it never saw.
                current = tx.execute(_STATE_VERSION, [before.operation_id]).fetchone()
                if current is None or (int(current[0]), int(current[1])) != (
                    before.row_version,
                    before.cancel_generation,
                ):
                    return BatchOutcome(None, StaleWrite(before.operation_id, before.row_version))
            else:
                row = codec._state_row(after, before.row_version, before.cancel_generation)
                if self._affected(tx, sql.STATE_UPDATE, cas_params(row)) != 1:
                    return BatchOutcome(None, StaleWrite(before.operation_id, before.row_version))
                if after.task_id is not None and after.task_id != before.task_id:
                    tx.execute(
                        sql.TASK_BINDING_INSERT, [after.server, after.task_id, after.operation_id, t.at]
                    )
            if t.logged:
                tx.execute(sql.TRANSITION_INSERT, codec._transition_row(t))
        return BatchOutcome(after, None)

    def _apply_batch(self, transitions: Sequence[Transition]) -> Sequence[BatchOutcome]:
        try:
            with self._tx() as tx:
                return self._apply_batch_in(tx, transitions)
        except _Moved:
            with self._tx() as tx:
                return self._apply_batch_in(tx, transitions, checked=True)

    def _apply_batch_in(
        self, tx: duck.Connection, transitions: Sequence[Transition], *, checked: bool = False
    ) -> Outcomes:
        """The batch's compare-and-swaps in ``tx``: one set-based UPDATE whose count is verified.

        Unless ``checked``, the UPDATE runs unguarded by a read: if it wrote fewer rows than the batch
        changes, some operation moved, and ``_Moved`` aborts the transaction for a ``checked`` retry
        that finds the stale rows first (a stale write is rare; the read costs a join every time).
        """
        first, last, chain_errors = chain(transitions)
        befores = list(map(_BEFORE, first.values()))
        changed = list(map(_AFTER, last.values()))
        unchanged: list[tuple[str, int, int]] = []
        # A new row version says at once that the row changed (the whole group, usually, compared
        # at C speed); equal ones are compared in full.
        if not all(map(ne, map(_VERSION, changed), map(_VERSION, befores))):
            moved: list[tuple[Operation, Operation]] = []
            for before, after in zip(befores, changed, strict=True):
                if after.row_version != before.row_version or after != before:
                    moved.append((before, after))
                else:
                    unchanged.append((before.operation_id, before.row_version, before.cancel_generation))
            befores, changed = [b for b, _ in moved], [a for _, a in moved]
        stale_ids: set[str] = set()
        if unchanged:
            # Log-only transitions are checked too: they must describe the row as it is.
            stale_ids |= {
                str(r[0])
                for r in _over(
                    tx,
                    "SELECT e.operation_id FROM arrow_batch e LEFT JOIN op_state s USING (operation_id) "
                    "WHERE s.operation_id IS NULL OR s.row_version <> e.expected_version "
                    "OR s.cancel_generation <> e.expected_cancel_generation",
                    _columns(unchanged, _EXPECT_SCHEMA),
                )
            }
        state = codec.state_changes(befores, changed) if changed else None
        if state is not None:
            stale_ids |= self._update_states_in(tx, state, "group commit", find_stale=checked, verify=checked)
        # One transition per operation, each moving its row: the compare-and-swap table's rows are
        # the transitions' operations in order, and the log takes the columns they share from it.
        aligned = state if first is last and not unchanged else None
        self._append_batch(tx, transitions, first, last, chain_errors, stale_ids, aligned)
        if not stale_ids and not chain_errors:
            return Outcomes(list(map(_AFTER, transitions)))
        refused = {k: StaleWrite(k, first[k].before.row_version) for k in stale_ids}
        return outcomes(transitions, chain_errors, refused)

    def _append_log(self, tx: Any, transitions: Sequence[Transition], prepared: object = None) -> None:
        # ``prepared``: the group's compare-and-swap table, when its rows are these transitions'
        # operations in order (``_apply_batch_in``).
        _over(
            tx,
            "INSERT INTO transitions SELECT nextval('transition_seq'), * FROM arrow_batch",
            codec.transition_table(transitions, prepared if isinstance(prepared, pa.Table) else None),
        )

    def _update_states_in(
        self,
        tx: duck.Connection,
        state: pa.Table,
        what: str,
        *,
        find_stale: bool,
        verify: bool = True,
    ) -> set[str]:
        """Compare-and-swap many state rows (``rows.state_table``) in one statement; returns the stale
        ones (not written).

        Without ``find_stale`` every row must still be as expected: a shortfall raises ``_Moved``
        unless ``verify`` (its operations were checked already: another writer moved them, a
        conflict).
        """
        stale: set[str] = set()
        if find_stale:
            stale = {
                str(r[0])
                for r in _over(
                    tx,
                    "SELECT n.operation_id FROM arrow_batch n LEFT JOIN op_state s "
                    "ON s.operation_id = n.operation_id "
                    "WHERE s.operation_id IS NULL OR s.row_version <> n.expected_version "
                    "OR s.cancel_generation <> n.expected_cancel_generation",
                    state,
                )
            }
        written = set(state.column_names)  # every state column, or those a group moved
        assignments = ", ".join(f"{c} = n.{c}" for c in _STATE_COLUMNS[1:] if c in written)
        updated = _over(
            tx,
            f"UPDATE op_state SET {assignments} FROM arrow_batch n "
            "WHERE op_state.operation_id = n.operation_id AND op_state.row_version = n.expected_version "
            "AND op_state.cancel_generation = n.expected_cancel_generation",
            state,
        )
        if not updated or int(updated[0][0]) != state.num_rows - len(stale):
            if not verify:
                raise _Moved
            raise duck.TransactionException(f"concurrent writer moved rows during {what}")
        return stale

    def _update_states(self, tx: Any, state_rows: Sequence[Sequence[object]]) -> None:
        self._update_states_in(
            tx, _columns(state_rows, _STATE_SCHEMA), "batched acceptance", find_stale=False
        )

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
        with self._tx() as tx:
            row = tx.execute(f"{sql.OPERATION_SELECT} WHERE {sql.BY_ID}", [receipt.operation_id]).fetchone()
            current = None
            if row is not None:
                cols = [d[0] for d in tx.description or ()]
                current = codec.operation_from_record(dict(zip(cols, row, strict=True)))
            check_acceptance(current, transition, payload)
            assert current is not None
            self._write_acceptance(tx, current, codec.acceptance_rows(current, transition, payload, receipt))
        return receipt

    def _accept_batch(self, items: Sequence[tuple[Transition, Json | None]]) -> Sequence[BatchOutcome]:
        with self._tx() as tx:
            return self._accept_batch_in(tx, items)

    def _accept_batch_in(
        self, tx: duck.Connection, items: Sequence[tuple[Transition, Json | None]]
    ) -> Sequence[BatchOutcome]:
        errors, seen = repeated_acceptances(items)
        records = _records_over(
            tx,
            f"{sql.OPERATION_SELECT} WHERE operation_id IN (SELECT operation_id FROM arrow_batch)",
            pa.table({"operation_id": pa.array(sorted(seen), pa.string())}),
        )
        current = {op.operation_id: op for op in map(codec.operation_from_record, records)}
        self._write_acceptances(tx, self._acceptances(items, current, errors))
        return acceptance_outcomes(items, errors)

    def _apply_and_accept_unread(self, tx: duck.Connection, group: WriteGroup) -> GroupOutcome:
        """A group's first try: its acceptances matched unread (``_unread_rows``) and written with
        its transitions, one compare-and-swap and one log insert for both; ``_Moved`` when an
        acceptance is refused or its row is not the one it was matched against."""
        items = group.acceptances
        errors, _ = repeated_acceptances(items)
        refused = len(errors)
        accepted = self._acceptances(items, _unread_rows(items, errors, group.transitions), errors)
        if len(errors) != refused:
            raise _Moved  # the checked retry names the refusal against the row as read
        n = len(group.transitions)
        riding = [t for i, (t, _) in enumerate(items) if i not in errors]
        applied = self._apply_batch_in(tx, [*group.transitions, *riding])
        if any(i >= n for i in applied.errors):
            raise _Moved
        self._write_receipt_rows(tx, accepted)
        return GroupOutcome(applied.head(n), acceptance_outcomes(items, errors))

    def _commit_group_once(self, group: WriteGroup) -> GroupOutcome:
        try:
            return self._commit_group_in(group, checked=False)
        except _Moved:
            return self._commit_group_in(group, checked=True)

    def _commit_group_in(self, group: WriteGroup, *, checked: bool) -> GroupOutcome:
        with self._tx() as tx:
            if group.acceptances and not checked:
                first_try = self._apply_and_accept_unread(tx, group)
                applied, accepted = first_try.transitions, first_try.acceptances
            else:
                applied = (
                    self._apply_batch_in(tx, group.transitions, checked=checked) if group.transitions else []
                )
                accepted = self._accept_batch_in(tx, group.acceptances) if group.acceptances else []
            held = _still_held(group, accepted)
            if held:
                self._insert_held(tx, held)
            if group.polls:
                self._insert_polls(tx, group.polls)
        return GroupOutcome(applied, accepted)


def _unread_rows(
    items: Sequence[tuple[Transition, Json | None]],
    errors: Mapping[int, LedgerError],
    transitions: Sequence[Transition],
) -> dict[OperationId, Operation]:
    """The rows a group's acceptances are matched against without reading them: each transition's
    own ``before``; ``_Moved`` where that cannot stand in for the row.

    Every change to ``op_state`` is a compare-and-swap to a new row version (``machine.step``
    numbers each change), so a row still at the version and cancel generation a transition was
    computed from IS its ``before``: ``check_acceptance`` against it decides as it would against the
    row read, and the compare-and-swap that writes the acceptance proves the row is still at that
    version (a shortfall raises ``_Moved``). Where the group's own ``transitions`` write the row,
    ``before`` must be what the last of them leaves behind. The read this saves was a fifth of the
    CPU of a group that carries receipts (bench/results/latest.md, fastmcp, session 11).
    """
    written = {t.after.operation_id: t.after for t in transitions}
    current: dict[OperationId, Operation] = {}
    for i, (t, _) in enumerate(items):
        if i in errors:
            continue
        left = written.get(t.after.operation_id)
        if left is not None and left is not t.before and left != t.before:
            raise _Moved
        current[t.after.operation_id] = t.before
    return current


def _still_held(group: WriteGroup, accepted: Sequence[BatchOutcome]) -> Sequence[tuple[str, HeldOutcome]]:
    """The group's held outcomes but those of operations it accepts: their receipt and result are
    written in the same transaction, and nothing reads a held outcome after its acceptance.

    An outcome that came with a terminal status is usually accepted in the group that holds it (the
    driver verifies it without a request); its held row (an upsert) was a tenth of the group
    commit's CPU under bench/fastmcp_compare.py. A refused acceptance keeps its held row.
    """
    if not group.held or not group.acceptances:
        return group.held
    done = {
        t.after.operation_id for (t, _), o in zip(group.acceptances, accepted, strict=True) if o.error is None
    }
    return [(k, h) for k, h in group.held if k not in done]


def _over(tx: duck.Connection, query: str, arrow_batch: pa.Table) -> list[tuple[Any, ...]]:
    """Run ``query``, which reads the Arrow table ``arrow_batch`` by that name; its rows (a write's: its count).

    DuckDB's replacement scan finds the table among the locals of the frame that calls ``execute``
    (this one), so nothing is registered: ``register`` and ``unregister`` cost about 1 ms of CPU per
    statement together, as much as a group commit's INSERT itself, and a group commit runs six or more.
    """
    return tx.execute(query).fetchall()


def _records_over(tx: duck.Connection, query: str, arrow_batch: pa.Table) -> list[dict[str, object]]:
    """``_over``'s rows as records (column name -> value)."""
    cur = tx.execute(query)
    cols = [d[0] for d in cur.description or ()]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


class _Moved(Exception):
    """A group's unguarded compare-and-swap wrote fewer rows than it changes: retry it checked."""


_WARM_UP_OP: Final = codec.warm_up_operation()


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
