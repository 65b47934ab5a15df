"""The PostgreSQL ledger: ``engine.ledger.Ledger``'s interface and semantics over psycopg 3, plus leases.

Same tables, columns and uniqueness (one operation per call node and key, one receipt and one
outbox entry per call node, one operation per server task id), recorded transactional migrations,
compare-and-swap writes on row version and cancel generation, and ``accept_terminal`` as the only
writer of receipts and outbox rows, matching with the same pure rule (``engine.acceptance``).
It decides nothing about states.

What only PostgreSQL has: several processes may share one ledger. Work is leased with
``claim`` (``SELECT ... FOR UPDATE SKIP LOCKED`` over operations without a receipt whose lease is
free or expired), ``renew`` and ``release``; a handle returned by ``fenced`` refuses (``LeaseLost``)
every operation write of an executor whose lease was taken over or whose execution epoch was
raised. See docs/postgres.md.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeVar

import psycopg
import pyarrow as pa
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow, dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from engine.acceptance import check_acceptance, receipt_of
from engine.errors import (
    DuplicateOperation,
    InvalidRecord,
    LeaseLost,
    LedgerCorrupt,
    LedgerError,
    LedgerUnavailable,
    ReceiptConflict,
    SchemaTooNew,
    StaleWrite,
)
from engine.ledger.analyst import run_query
from engine.ledger.gate_sql import gate_inputs_from_values, gate_inputs_sql
from engine.ledger.port import (
    BatchOutcome,
    ExplorerRun,
    Fence,
    GroupOutcome,
    HeldOutcome,
    Json,
    Lease,
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
from engine.ledger.sandbox import QueryResult
from engine.ledger.schema import _STATE_COLUMNS, _TABLES, EXPLORER_CODE_MIGRATION
from engine.ledger.schema import MIGRATIONS as DUCKDB_MIGRATIONS
from engine.model import (
    RECEIPT_STATES,
    CallNodeId,
    Digest,
    Epoch,
    GateRecord,
    LocalState,
    Operation,
    OperationId,
    Receipt,
    Role,
    ServerStatus,
    TaskId,
    Transition,
    canonical_json,
    digest_of,
)

logger = logging.getLogger(__name__)

Connection = psycopg.Connection[TupleRow]
Cursor = psycopg.Cursor[TupleRow]
T = TypeVar("T")

# ------------------------------------------------------------------------------------ migrations
SEND_SLOTS_TABLE: Final = "send_slots"
"""Coordination table of the shared QPS budget (migration 8); not part of the ledger's data."""

# Migrations 1-6 are DuckDB's own (engine.ledger.schema.MIGRATIONS), in PostgreSQL's spelling of DOUBLE;
# later ones are PostgreSQL's own. Numbers are this backend's: DuckDB's and PostgreSQL's schema
# versions are counted apart. Never edit a released migration: add a new one.


def _postgres_spelling(statement: str) -> str:
    return re.sub(r"\bDOUBLE\b", "DOUBLE PRECISION", statement)


MIGRATIONS: Final[tuple[tuple[int, str, tuple[str, ...]], ...]] = (
    *(
        (version, name, tuple(_postgres_spelling(s) for s in statements))
        for version, name, statements in DUCKDB_MIGRATIONS
        if version <= 6
    ),
    (
        7,
        "leases (several executors share the ledger) and indexes for the executors' lookups",
        (
            "ALTER TABLE op_state ADD COLUMN lease_owner VARCHAR",
            "ALTER TABLE op_state ADD COLUMN lease_token VARCHAR",
            "ALTER TABLE op_state ADD COLUMN lease_epoch BIGINT",
            "ALTER TABLE op_state ADD COLUMN lease_expires_at TIMESTAMPTZ",
            # What claim scans: operations without a receipt, free or expired leases first.
            "CREATE INDEX op_state_claimable ON op_state (lease_expires_at NULLS FIRST, updated_at) "
            "WHERE state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED')",
            "CREATE INDEX op_state_lease_token ON op_state (lease_token) WHERE lease_token IS NOT NULL",
            "CREATE INDEX op_state_task ON op_state (task_id)",
            "CREATE INDEX op_state_state ON op_state (state)",
            "CREATE INDEX op_identity_created ON op_identity (created_at, operation_id)",
            "CREATE INDEX transitions_operation ON transitions (operation_id, seq)",
            "CREATE INDEX polls_operation ON polls (operation_id)",
            "CREATE INDEX polls_sent_at ON polls (sent_at)",
            "CREATE INDEX reconciliation_operation ON reconciliation (operation_id, kind)",
            "CREATE INDEX rollout_assignments_primary ON rollout_assignments (primary_operation_id)",
        ),
    ),
    (
        8,
        "send slots: the global QPS budget shared by every executor",
        (
            # One row per (scope, slot): how many requests were booked into that slot. Scope '*' is
            # the global cap, a server URL that server's cap. Coordination state, not ledger data:
            # ``table_columns`` leaves the table out.
            f"""CREATE TABLE {SEND_SLOTS_TABLE} (
                scope VARCHAR NOT NULL,
                slot BIGINT NOT NULL,
                used INTEGER NOT NULL,
                PRIMARY KEY (scope, slot)
            )""",
            # Books ``p_n`` sends into the earliest slots from ``p_from`` on that have room in every
            # scope; returns the slot of each. Rows are locked in (slot, scope) order, so two
            # bookers never deadlock; a booker waits only for another booking of the same slot.
            f"""CREATE FUNCTION {SEND_SLOTS_TABLE}_book(p_scopes VARCHAR[], p_caps INTEGER[], p_from BIGINT, p_n INTEGER)
            RETURNS BIGINT[] LANGUAGE plpgsql AS $$
            DECLARE
                k BIGINT := p_from;
                got BIGINT[] := '{{}}';
                room INTEGER;
                u INTEGER;
                i INTEGER;
            BEGIN
                WHILE coalesce(array_length(got, 1), 0) < p_n LOOP
                    room := p_n - coalesce(array_length(got, 1), 0);
                    FOR i IN 1 .. array_length(p_scopes, 1) LOOP
                        INSERT INTO {SEND_SLOTS_TABLE} (scope, slot, used) VALUES (p_scopes[i], k, 0)
                            ON CONFLICT DO NOTHING;
                        SELECT used INTO u FROM {SEND_SLOTS_TABLE}
                            WHERE scope = p_scopes[i] AND slot = k FOR UPDATE;
                        room := least(room, p_caps[i] - u);
                    END LOOP;
                    IF room > 0 THEN
                        UPDATE {SEND_SLOTS_TABLE} SET used = used + room
                            WHERE scope = ANY(p_scopes) AND slot = k;
                        got := got || array_fill(k, ARRAY[room]);
                    END IF;
                    k := k + 1;
                END LOOP;
                RETURN got;
            END $$""",
        ),
    ),
    (
        9,
        "explorer runs name the code that ran and its revision (the gate counts only the shipped code's)",
        EXPLORER_CODE_MIGRATION,
    ),
)
SUPPORTED_SCHEMA: Final[int] = MIGRATIONS[-1][0]

LEASE_COLUMNS: Final[tuple[str, ...]] = ("lease_owner", "lease_token", "lease_epoch", "lease_expires_at")
"""Columns only the PostgreSQL ``op_state`` has (migration 7); the ``operations`` view leaves them out."""

ANALYST_ROLE: Final = "finality_analyst"
"""The NOLOGIN role analyst SQL runs under (``SET LOCAL ROLE``): SELECT on the ledger's tables, nothing else."""

_MIGRATION_LOCK: Final = 0x46494E414C495459  # "FINALITY": one migrating process at a time
_RECEIPT_STATE_VALUES: Final = sorted(s.value for s in RECEIPT_STATES)
_OPERATION_SELECT: Final = "SELECT * FROM operations"
_STATE_ASSIGNMENTS: Final = ", ".join(f"{c} = %s" for c in _STATE_COLUMNS[1:])
_STATE_INSERT: Final = (
    f"INSERT INTO op_state ({', '.join(_STATE_COLUMNS + LEASE_COLUMNS)}) "
    f"VALUES ({', '.join(['%s'] * (len(_STATE_COLUMNS) + len(LEASE_COLUMNS)))})"
)
_TRANSITION_INSERT: Final = (
    "INSERT INTO transitions VALUES (nextval('transition_seq'), %s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)"
)
_IDENTITY_TYPES: Final = (
    ("operation_id", "varchar"),
    ("call_node_id", "varchar"),
    ("role", "varchar"),
    ("request_digest", "varchar"),
    ("tool_name", "varchar"),
    ("tool_version", "varchar"),
    ("descriptor_version", "varchar"),
    ("side_effects", "boolean"),
    ("principal", "varchar"),
    ("protocol", "varchar"),
    ("adapter_version", "varchar"),
    ("server", "varchar"),
    ("idempotency_key", "varchar"),
    ("arguments", "varchar"),
    ("schema_version", "varchar"),
    ("created_at", "timestamptz"),
)
_RETRIES: Final = 3


# ------------------------------------------------------------------------------------ leases


# ------------------------------------------------------------------------------------- helpers


def redact(url: str) -> str:
    """A connection URL without its password, for messages."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "postgresql://?"
    host = parts.get("host") or "localhost"
    port = parts.get("port") or "5432"
    user = parts.get("user")
    db = parts.get("dbname") or ""
    return f"postgresql://{f'{user}@' if user else ''}{host}:{port}/{db}"


def _is_connection_error(exc: psycopg.Error) -> bool:
    state = exc.sqlstate
    return isinstance(exc, PoolTimeout) or (
        isinstance(exc, psycopg.OperationalError) and (state is None or state.startswith(("08", "57P")))
    )


def _lease_of(row: Sequence[Any]) -> Lease:
    return Lease(
        operation_id=str(row[0]),
        owner=row[1],
        token=row[2],
        epoch=int(row[3]) if row[3] is not None else None,
        expires_at=_as_dt(row[4], "lease_expires_at"),
    )


# ------------------------------------------------------------------------------------- the ledger


class PgLedger:
    """A ledger in a PostgreSQL database, shared by any number of processes.

    Thread-safe: every call borrows a connection from a pool, so threads (and processes) race only
    on the database's own row locks and constraints.
    """

    def __init__(
        self,
        pool: ConnectionPool[Connection],
        url: str,
        *,
        read_only: bool,
        analyst_role: str = ANALYST_ROLE,
        fence: Fence | None = None,
        owns_pool: bool = True,
    ) -> None:
        self._pool = pool
        self._url = url  # holds the password: never logged or shown
        self.path = redact(url)
        self.read_only = read_only
        self.analyst_role = analyst_role
        self.fence = fence
        self._owns_pool = owns_pool

    # ---------------------------------------------------------------------------- open / close

    @classmethod
    def open(
        cls,
        url: str,
        *,
        read_only: bool = False,
        pool_size: int = 10,
        analyst_role: str = ANALYST_ROLE,
        connect_timeout_s: int = 10,
    ) -> PgLedger:
        """Connect to (and migrate) a ledger database.

        Raises:
            LedgerUnavailable: the server cannot be reached or refuses the login, or a read-only
                handle finds the schema in need of a migration.
            LedgerCorrupt: a read-only handle finds no Finality ledger in the database.
            SchemaTooNew: a newer Finality migrated it.
        """
        where = redact(url)
        try:
            con = psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout_s)
        except psycopg.Error as exc:
            raise LedgerUnavailable(f"cannot connect to the PostgreSQL ledger {where}: {exc}") from exc
        try:
            _configure(con, read_only=False)
            _migrate(con, where, read_only=read_only, analyst_role=analyst_role)
        except psycopg.Error as exc:
            raise LedgerUnavailable(f"PostgreSQL ledger {where}: {exc}") from exc
        finally:
            con.close()

        def configure(conn: Connection) -> None:
            _configure(conn, read_only=read_only)

        pool: ConnectionPool[Connection] = ConnectionPool(
            url,
            min_size=1,
            max_size=max(1, pool_size),
            kwargs={"autocommit": True, "connect_timeout": connect_timeout_s},
            configure=configure,
            open=True,
            name=f"finality-ledger {where}",
            timeout=60.0,
        )
        return cls(pool, url, read_only=read_only, analyst_role=analyst_role)

    def close(self) -> None:
        if self._owns_pool:
            self._pool.close()

    def warm_up(self) -> None:
        """Make sure one pooled connection is open, so the first write pays no connection setup."""
        with self._conn() as conn:
            conn.execute("SELECT 1")

    def __enter__(self) -> PgLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def fenced(self, fence: Fence) -> PgLedger:
        """A handle on the same pool whose operation writes are fenced by ``fence`` (see ``Fence``).

        Closing the handle leaves the pool open; close the ledger it came from.
        """
        return PgLedger(
            self._pool,
            self._url,
            read_only=self.read_only,
            analyst_role=self.analyst_role,
            fence=fence,
            owns_pool=False,
        )

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        """A pooled connection (autocommit, UTC), for ``engine.ledger.analyst``."""
        with self._conn() as conn:
            yield conn

    @contextmanager
    def _conn(self) -> Iterator[Connection]:
        try:
            with self._pool.connection() as conn:
                yield conn
        except psycopg.Error as exc:
            if _is_connection_error(exc):
                raise LedgerUnavailable(f"PostgreSQL ledger {self.path}: {exc}") from exc
            raise

    @contextmanager
    def _tx(self) -> Iterator[Cursor]:
        if self.read_only:
            raise LedgerUnavailable(f"PostgreSQL ledger {self.path} was opened read-only")
        with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            yield cur

    def _retrying(self, action: Callable[[], T]) -> T:
        # Two transactions that lock rows in different orders (e.g. two creators of overlapping
        # call nodes) may deadlock; PostgreSQL aborts one, and it is safe to run it again.
        for attempt in range(_RETRIES):
            try:
                return action()
            except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure):
                if attempt == _RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _rows(self, query: str, params: Sequence[object] | None = None) -> list[dict[str, object]]:
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params or None)
            return list(cur.fetchall())

    def _fetchone(self, query: str, params: Sequence[object] | None = None) -> tuple[Any, ...] | None:
        with self._conn() as conn:
            return conn.execute(query, params or None).fetchone()

    def _fetchall(self, query: str, params: Sequence[object] | None = None) -> list[tuple[Any, ...]]:
        with self._conn() as conn:
            return conn.execute(query, params or None).fetchall()

    def schema_version(self) -> int:
        row = self._fetchone("SELECT coalesce(max(version), 0) FROM schema_migrations")
        return int(row[0]) if row else 0

    # ---------------------------------------------------------------------------------- fencing

    def _epoch_refusal(self, cur: Cursor) -> str | None:
        """Why the fence's epoch is too old, or None. Share-locks the epoch row until commit,
        so a rollback raising the epoch waits for this write (and fences every later one)."""
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
        if op.operation_id in self._retrying(lambda: self._insert_new([(op, arguments)])):
            return op, True
        # The conflicting creator has committed: PostgreSQL's unique check waits for it.
        existing = self.by_call_node(op.call_node_id) or self.by_key(op.idempotency_key)
        if existing is None:
            raise DuplicateOperation("submission key", op.idempotency_key)
        if existing.request_digest != op.request_digest:
            raise DuplicateOperation(
                "call node (for a different request)", f"{op.call_node_id} ({existing.request_digest})"
            )
        return existing, False

    def create_many(self, items: Sequence[tuple[Operation, Json]]) -> list[tuple[Operation, bool]]:
        """Group-committed ``create_operation``: one transaction for many new operations.

        Call nodes that already have an operation get it back (``created`` False).
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
        inserted = self._retrying(lambda: self._insert_new(fresh)) if fresh else set()
        out: list[tuple[Operation, bool]] = []
        for op, args in items:
            have = existing.get(op.call_node_id)
            if have is None:
                # Not inserted: another creator won the race since the lookup; resolve it alone.
                out.append((op, True) if op.operation_id in inserted else self.create_operation(op, args))
            elif have.request_digest != op.request_digest:
                out.append(self.create_operation(op, args))
            else:
                out.append((have, False))
        return out

    def _existing_by_call_node(self, nodes: Sequence[str]) -> dict[str, Operation]:
        found = self._operations_where("call_node_id = ANY(%s)", [list(nodes)])
        return {op.call_node_id: op for op in found}

    def _insert_new(self, fresh: Sequence[tuple[Operation, Json]]) -> set[str]:
        """Insert the operations whose call node, key and id are all new; return their ids.

        ``ON CONFLICT DO NOTHING`` waits for a concurrent creator of the same key to finish, so a
        skipped row belongs to a committed operation.
        """
        ordered = sorted(fresh, key=lambda item: item[0].call_node_id)
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
            for op, args in ordered
        ]
        arrays = ", ".join(f"%s::{kind}[]" for _, kind in _IDENTITY_TYPES)
        with self._tx() as cur:
            epoch_refused = self._epoch_refusal(cur)
            if epoch_refused is not None:
                raise LeaseLost(ordered[0][0].operation_id, 0, epoch_refused)
            cur.execute(
                f"INSERT INTO op_identity SELECT * FROM unnest({arrays}) ON CONFLICT DO NOTHING RETURNING operation_id",
                [list(col) for col in zip(*identity, strict=True)],
            )
            inserted = {str(r[0]) for r in cur.fetchall()}
            created = [op for op, _ in ordered if op.operation_id in inserted]
            if created:
                cur.executemany(
                    _STATE_INSERT,
                    [[*_state_row(op, 0, 0)[: len(_STATE_COLUMNS)], *self._new_lease(op)] for op in created],
                )
                cur.executemany(
                    _TRANSITION_INSERT,
                    [
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
                        for op in created
                    ],
                )
        return inserted

    def apply(self, transition: Transition) -> Operation:
        """Compare-and-swap one transition into the ledger.

        Raises:
            StaleWrite: the row moved since ``transition.before`` was read (``LeaseLost`` when a
                fenced handle no longer holds the operation's lease).
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
                return [self._retrying(lambda: self._apply_one(transitions[0]))]
            return self._retrying(lambda: self._apply_batch(transitions))
        except pg_errors.UniqueViolation:
            if len(transitions) == 1:
                t = transitions[0]
                return [
                    BatchOutcome(
                        None, DuplicateOperation("server task id", f"{t.after.server} {t.after.task_id}")
                    )
                ]
            # One transition broke a constraint: one transaction each, so the others still commit
            # and the offender is named.
            out: list[BatchOutcome] = []
            for t in transitions:
                out.extend(self.apply_many([t]))
            return out

    def _refusal(self, cur: Cursor, before: Operation) -> LedgerError:
        row = cur.execute(
            "SELECT row_version, cancel_generation, lease_token FROM op_state WHERE operation_id = %s",
            [before.operation_id],
        ).fetchone()
        if row is not None:
            lost = self._lease_refusal(row[2])
            if lost is not None:
                return LeaseLost(before.operation_id, before.row_version, lost)
        return StaleWrite(before.operation_id, before.row_version)

    def _apply_one(self, t: Transition) -> BatchOutcome:
        before, after = t.before, t.after
        with self._tx() as cur:
            epoch_refused = self._epoch_refusal(cur)
            if epoch_refused is not None:
                return BatchOutcome(None, LeaseLost(before.operation_id, before.row_version, epoch_refused))
            if after == before:
                # Nothing to write but the log line; it must still be about the row as it is.
                row = cur.execute(
                    "SELECT row_version, cancel_generation, lease_token FROM op_state "
                    "WHERE operation_id = %s FOR SHARE",
                    [before.operation_id],
                ).fetchone()
                if row is None or (int(row[0]), int(row[1])) != (
                    before.row_version,
                    before.cancel_generation,
                ):
                    return BatchOutcome(None, StaleWrite(before.operation_id, before.row_version))
                lost = self._lease_refusal(row[2])
                if lost is not None:
                    return BatchOutcome(None, LeaseLost(before.operation_id, before.row_version, lost))
            else:
                fence_sql, fence_params = self._fence_clause()
                row_values = _state_row(after, before.row_version, before.cancel_generation)[
                    : len(_STATE_COLUMNS)
                ]
                cur.execute(
                    f"UPDATE op_state SET {_STATE_ASSIGNMENTS} "
                    f"WHERE operation_id = %s AND row_version = %s AND cancel_generation = %s{fence_sql}",
                    [
                        *row_values[1:],
                        before.operation_id,
                        before.row_version,
                        before.cancel_generation,
                        *fence_params,
                    ],
                )
                if cur.rowcount != 1:
                    return BatchOutcome(None, self._refusal(cur, before))
                if after.task_id is not None and after.task_id != before.task_id:
                    cur.execute(
                        "INSERT INTO task_bindings VALUES (%s, %s, %s, %s)",
                        [after.server, after.task_id, after.operation_id, t.at],
                    )
            cur.execute(_TRANSITION_INSERT, _transition_row(t))
        return BatchOutcome(after, None)

    def _apply_batch(self, transitions: Sequence[Transition]) -> list[BatchOutcome]:
        with self._tx() as cur:
            return self._apply_batch_in(cur, transitions, self._epoch_refusal(cur))

    def _apply_batch_in(
        self, cur: Cursor, transitions: Sequence[Transition], epoch_refused: str | None
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
        keys = sorted(last)
        refused: dict[str, LedgerError] = {}
        if epoch_refused is not None:
            refused = {k: LeaseLost(k, first[k].before.row_version, epoch_refused) for k in keys}
        else:
            # Lock the rows in one order (no deadlock between two batches) and check them here;
            # once locked they cannot move before the commit.
            current = {
                str(r[0]): r
                for r in cur.execute(
                    "SELECT operation_id, row_version, cancel_generation, lease_token FROM op_state "
                    "WHERE operation_id = ANY(%s) ORDER BY operation_id FOR UPDATE",
                    [keys],
                ).fetchall()
            }
            for k in keys:
                b = first[k].before
                row = current.get(k)
                if row is None or (int(row[1]), int(row[2])) != (b.row_version, b.cancel_generation):
                    refused[k] = StaleWrite(k, b.row_version)
                elif (lost := self._lease_refusal(row[3])) is not None:
                    refused[k] = LeaseLost(k, b.row_version, lost)
            changed = [k for k in keys if k not in refused and last[k].after != first[k].before]
            if changed:
                cur.executemany(
                    f"UPDATE op_state SET {_STATE_ASSIGNMENTS} "
                    "WHERE operation_id = %s AND row_version = %s AND cancel_generation = %s",
                    [
                        [
                            *_state_row(last[k].after, 0, 0)[1 : len(_STATE_COLUMNS)],
                            k,
                            first[k].before.row_version,
                            first[k].before.cancel_generation,
                        ]
                        for k in changed
                    ],
                )
            bindings = [
                [last[k].after.server, last[k].after.task_id, k, last[k].at]
                for k in keys
                if k not in refused
                and last[k].after.task_id is not None
                and last[k].after.task_id != first[k].before.task_id
            ]
            if bindings:
                cur.executemany("INSERT INTO task_bindings VALUES (%s, %s, %s, %s)", bindings)
            log_rows = [
                _transition_row(t)
                for i, t in enumerate(transitions)
                if i not in chain_errors and t.after.operation_id not in refused
            ]
            if log_rows:
                cur.executemany(_TRANSITION_INSERT, log_rows)
        out: list[BatchOutcome] = []
        for i, t in enumerate(transitions):
            if i in chain_errors:
                out.append(BatchOutcome(None, chain_errors[i]))
            elif t.after.operation_id in refused:
                error = refused[t.after.operation_id]
                if isinstance(error, StaleWrite) and not isinstance(error, LeaseLost):
                    error = StaleWrite(t.after.operation_id, t.before.row_version)
                out.append(BatchOutcome(None, error))
            else:
                out.append(BatchOutcome(t.after, None))
        return out

    def accept_terminal(self, transition: Transition, payload: Json | None) -> Receipt:
        """The single acceptance point: one transaction writes the receipt and the outbox entry.

        It locks the operation's row, matches call node, request digest, operation id, task id,
        tool version, execution epoch, cancel generation, terminal status and result digest against
        it (``engine.acceptance.check_acceptance``), then writes the operation's new state, the
        transition, the receipt, the stored result and (for a primary operation) exactly one ready
        outbox entry. A shadow operation's receipt never reaches the outbox.

        Raises:
            ReceiptConflict: a field does not match; names the field; nothing is written.
            StaleWrite: the row moved since it was read (``LeaseLost``: a fenced handle lost the
                lease or the epoch); nothing is written.
        """
        receipt = receipt_of(transition)
        after = transition.after
        try:
            with self._tx() as cur:
                epoch_refused = self._epoch_refusal(cur)
                if epoch_refused is not None:
                    raise LeaseLost(receipt.operation_id, transition.before.row_version, epoch_refused)
                lock = cur.execute(
                    "SELECT lease_token FROM op_state WHERE operation_id = %s FOR UPDATE",
                    [receipt.operation_id],
                ).fetchone()
                current = None
                if lock is not None:
                    lost = self._lease_refusal(lock[0])
                    if lost is not None:
                        raise LeaseLost(receipt.operation_id, transition.before.row_version, lost)
                    # A new statement: it sees the row as committed by whoever held the lock before.
                    cur.execute(f"{_OPERATION_SELECT} WHERE operation_id = %s", [receipt.operation_id])
                    row = cur.fetchone()
                    if row is not None:
                        cols = [d.name for d in cur.description or ()]
                        current = operation_from_record(dict(zip(cols, row, strict=True)))
                check_acceptance(current, transition, payload)
                assert current is not None
                state_row = _state_row(after, current.row_version, current.cancel_generation)[
                    : len(_STATE_COLUMNS)
                ]
                cur.execute(
                    f"UPDATE op_state SET {_STATE_ASSIGNMENTS} "
                    "WHERE operation_id = %s AND row_version = %s AND cancel_generation = %s",
                    [*state_row[1:], current.operation_id, current.row_version, current.cancel_generation],
                )
                if cur.rowcount != 1:
                    raise StaleWrite(current.operation_id, current.row_version)
                cur.execute(_TRANSITION_INSERT, _transition_row(transition))
                cur.execute(
                    "INSERT INTO receipts VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)",
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
                    cur.execute(
                        "INSERT INTO results VALUES (%s,%s,%s,%s,%s)",
                        [
                            current.operation_id,
                            receipt.result_digest,
                            receipt.status.value,
                            body,
                            receipt.accepted_at,
                        ],
                    )
                if current.role is Role.PRIMARY:
                    cur.execute(
                        "INSERT INTO outbox VALUES (%s,%s,%s,%s,%s,%s,%s)",
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
        except pg_errors.UniqueViolation as exc:
            # Unreachable through this method (the row lock orders acceptances); a receipt written
            # some other way still makes the database refuse a second one.
            raise ReceiptConflict(
                receipt.call_node_id, "receipt", "already written", receipt.operation_id
            ) from exc
        return receipt

    def accept_many(self, items: Sequence[tuple[Transition, Json | None]]) -> list[BatchOutcome]:
        """Many acceptances, one transaction: each matched exactly as ``accept_terminal`` matches it.

        The rows are locked (in one order) and each item is decided by ``check_acceptance`` against
        its row; a refused item (``StaleWrite``, ``ReceiptConflict``, ``LeaseLost``) writes nothing
        and does not stop the others. If a uniqueness constraint fires, the batch is retried one
        acceptance per transaction so that the offender alone is refused and named.
        """
        if not items:
            return []
        for t, _ in items:
            receipt_of(t)  # refuses anything that is not an acceptance before a transaction starts
        try:
            return self._retrying(lambda: self._accept_batch(items))
        except pg_errors.UniqueViolation:
            pass
        out: list[BatchOutcome] = []
        for t, payload in items:
            try:
                self.accept_terminal(t, payload)
                out.append(BatchOutcome(t.after, None))
            except (StaleWrite, ReceiptConflict) as refusal:
                out.append(BatchOutcome(None, refusal))
        return out

    def _accept_batch(self, items: Sequence[tuple[Transition, Json | None]]) -> list[BatchOutcome]:
        with self._tx() as cur:
            return self._accept_batch_in(cur, items, self._epoch_refusal(cur))

    def _accept_batch_in(
        self, cur: Cursor, items: Sequence[tuple[Transition, Json | None]], epoch_refused: str | None
    ) -> list[BatchOutcome]:
        errors: dict[int, LedgerError] = {}
        seen: set[str] = set()
        for i, (t, _) in enumerate(items):
            op_id = t.after.operation_id
            if op_id in seen:
                # An operation reaches one receipt state once; a second acceptance is stale.
                errors[i] = StaleWrite(op_id, t.before.row_version, "accepted twice in one batch")
            seen.add(op_id)
        if epoch_refused is not None:
            return [
                BatchOutcome(
                    None,
                    errors.get(i) or LeaseLost(t.after.operation_id, t.before.row_version, epoch_refused),
                )
                for i, (t, _) in enumerate(items)
            ]
        tokens = {
            str(r[0]): r[1]
            for r in cur.execute(
                "SELECT operation_id, lease_token FROM op_state WHERE operation_id = ANY(%s) "
                "ORDER BY operation_id FOR UPDATE",
                [sorted(seen)],
            ).fetchall()
        }
        cur.execute(f"{_OPERATION_SELECT} WHERE operation_id = ANY(%s)", [sorted(tokens)])
        cols = [d.name for d in cur.description or ()]
        current = {
            op.operation_id: op
            for op in (operation_from_record(dict(zip(cols, r, strict=True))) for r in cur.fetchall())
        }
        states: list[list[object]] = []
        log: list[list[object]] = []
        receipts: list[list[object]] = []
        results: list[list[object]] = []
        outbox: list[list[object]] = []
        for i, (t, payload) in enumerate(items):
            if i in errors:
                continue
            op_id = t.after.operation_id
            if op_id in tokens and (lost := self._lease_refusal(tokens[op_id])) is not None:
                errors[i] = LeaseLost(op_id, t.before.row_version, lost)
                continue
            now = current.get(op_id)
            try:
                receipt = check_acceptance(now, t, payload)
            except (StaleWrite, ReceiptConflict) as refusal:
                errors[i] = refusal
                continue
            assert now is not None
            states.append(
                [
                    *_state_row(t.after, 0, 0)[1 : len(_STATE_COLUMNS)],
                    now.operation_id,
                    now.row_version,
                    now.cancel_generation,
                ]
            )
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
            cur.executemany(
                f"UPDATE op_state SET {_STATE_ASSIGNMENTS} "
                "WHERE operation_id = %s AND row_version = %s AND cancel_generation = %s",
                states,
            )
            cur.executemany(_TRANSITION_INSERT, log)
            cur.executemany("INSERT INTO receipts VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", receipts)
            if results:
                cur.executemany("INSERT INTO results VALUES (%s,%s,%s,%s,%s)", results)
            if outbox:
                cur.executemany("INSERT INTO outbox VALUES (%s,%s,%s,%s,%s,%s,%s)", outbox)
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
        that only the offender is refused. Every row the group touches is locked first, in one
        order, so two executors' groups never deadlock on each other.
        """
        for t in group.transitions:
            _refuse_receipt_state(t)
        for t, _ in group.acceptances:
            receipt_of(t)
        if group.empty:
            return GroupOutcome([], [])

        def run() -> GroupOutcome:
            with self._tx() as cur:
                epoch_refused = self._epoch_refusal(cur)
                ids = {t.after.operation_id for t in group.transitions}
                ids |= {t.after.operation_id for t, _ in group.acceptances}
                if ids and epoch_refused is None:
                    cur.execute(
                        "SELECT operation_id FROM op_state WHERE operation_id = ANY(%s) "
                        "ORDER BY operation_id FOR UPDATE",
                        [sorted(ids)],
                    )
                if group.held:
                    self._insert_held(cur, group.held)
                applied = (
                    self._apply_batch_in(cur, group.transitions, epoch_refused) if group.transitions else []
                )
                accepted = (
                    self._accept_batch_in(cur, group.acceptances, epoch_refused) if group.acceptances else []
                )
                if group.polls:
                    self._insert_polls(cur, group.polls)
            return GroupOutcome(applied, accepted)

        try:
            return self._retrying(run)
        except pg_errors.UniqueViolation:
            pass
        self.hold_many(group.held)
        applied = self.apply_many(group.transitions)
        accepted = self.accept_many(group.acceptances)
        self.record_polls(group.polls)
        return GroupOutcome(applied, accepted)

    def attach_audit_result(self, op: Operation, kind: str, payload: Json | None, at: datetime) -> None:
        """Attach something read after the terminal (e.g. a result read after cancel) to the audit trail.

        Never a success payload: it is written beside the receipt, not into it or the outbox.
        """
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO receipt_audit VALUES (%s,%s,%s,%s,%s,%s)",
                [
                    op.call_node_id,
                    op.operation_id,
                    kind,
                    digest_of(payload) if payload is not None else None,
                    canonical_json(payload) if payload is not None else None,
                    at,
                ],
            )

    # ------------------------------------------------------------------------------------ leases

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
                    raise LeaseLost(
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
                f'{_OPERATION_SELECT} WHERE operation_id = ANY(%s) ORDER BY created_at, operation_id COLLATE "C"',
                [ids],
            )
            cols = [d.name for d in cur.description or ()]
            return [operation_from_record(dict(zip(cols, r, strict=True))) for r in cur.fetchall()]

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
        only = ""
        if operation_ids is not None:
            only = " AND operation_id = ANY(%s)"
            params.append(list(operation_ids))
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
        only = ""
        if operation_ids is not None:
            only = " AND operation_id = ANY(%s)"
            params.append(list(operation_ids))
        with self._tx() as cur:
            cur.execute(
                "UPDATE op_state SET lease_owner = NULL, lease_token = NULL, lease_epoch = NULL, "
                f"lease_expires_at = NULL WHERE lease_token = %s AND lease_owner = %s{only}",
                params,
            )
            return int(cur.rowcount)

    def lease_of(self, operation_id: str) -> Lease | None:
        row = self._fetchone(
            f"SELECT operation_id, {', '.join(LEASE_COLUMNS)} FROM op_state WHERE operation_id = %s",
            [operation_id],
        )
        return _lease_of(row) if row is not None else None

    def leases(self, *, owner: str | None = None) -> list[Lease]:
        """Leased operations without a receipt (of one owner, or all), oldest expiry first."""
        sql_text = (
            f"SELECT operation_id, {', '.join(LEASE_COLUMNS)} FROM op_state "
            "WHERE lease_token IS NOT NULL AND state <> ALL(%s)"
        )
        params: list[object] = [_RECEIPT_STATE_VALUES]
        if owner is not None:
            sql_text += " AND lease_owner = %s"
            params.append(owner)
        return [
            _lease_of(r)
            for r in self._fetchall(sql_text + " ORDER BY lease_expires_at, operation_id", params)
        ]

    # ------------------------------------------------------------------ the shared QPS budget

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

    # ------------------------------------------------------- polls, approvals and reconciliation

    def record_polls(self, rows: Sequence[PollRecord]) -> None:
        """Append protocol requests to the polls table (group-committed by the caller)."""
        if not rows:
            return
        with self._tx() as cur:
            self._insert_polls(cur, rows)

    @staticmethod
    def _insert_polls(cur: Cursor, rows: Sequence[PollRecord]) -> None:
        with cur.copy("COPY polls FROM STDIN") as copy:
            for r in rows:
                copy.write_row(r)

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
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO approvals VALUES (%s,%s,%s,%s,%s,%s,%s,'pending',NULL,NULL,%s,NULL) ON CONFLICT DO NOTHING",
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
            return cur.rowcount == 1

    def record_answer(
        self, operation_id: str, input_round: int, answer: Json, actor: str, at: datetime
    ) -> bool:
        """Store the answer of a pending round. False if that round is not pending (stale or answered)."""
        with self._tx() as cur:
            cur.execute(
                "UPDATE approvals SET status = 'answered', answer = %s, actor = %s, answered_at = %s "
                "WHERE operation_id = %s AND input_round = %s AND status = 'pending'",
                [canonical_json(answer), actor, at, operation_id, input_round],
            )
            return cur.rowcount == 1

    def answer_of(self, operation_id: str, input_round: int) -> Json | None:
        row = self._fetchone(
            "SELECT answer FROM approvals WHERE operation_id = %s AND input_round = %s AND status = 'answered'",
            [operation_id, input_round],
        )
        if row is None or row[0] is None:
            return None
        value = json.loads(str(row[0]))
        return value if isinstance(value, dict) else {"value": value}

    def approvals(self, *, pending_only: bool = True) -> list[dict[str, object]]:
        query = "SELECT * FROM approvals"
        if pending_only:
            query += " WHERE status = 'pending'"
        return self._rows(query + ' ORDER BY opened_at, operation_id COLLATE "C"')

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
        with self._tx() as cur:
            # Two executors may open the same entry at once: serialise them on (operation, kind).
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                [f"reconciliation {op.operation_id} {kind}"],
            )
            open_row = cur.execute(
                "SELECT entry_id FROM reconciliation WHERE operation_id = %s AND kind = %s AND status = 'open'",
                [op.operation_id, kind],
            ).fetchone()
            if open_row is not None:
                return int(open_row[0])
            row = cur.execute(
                "INSERT INTO reconciliation VALUES (nextval('reconciliation_seq'),%s,%s,%s,%s,%s,%s,%s,%s,%s,"
                "'open',%s,NULL,NULL,NULL) RETURNING entry_id",
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
        with self._tx() as cur:
            cur.execute(
                "UPDATE reconciliation SET status = 'resolved', resolved_at = %s, actor = %s, resolution = %s "
                "WHERE entry_id = %s AND status = 'open'",
                [at, actor, resolution, entry_id],
            )
            return cur.rowcount == 1

    def resolve_open(self, operation_id: str, *, kind: str, actor: str, resolution: str, at: datetime) -> int:
        """Close every open entry of one kind for an operation (e.g. the server reappeared); returns how many."""
        with self._tx() as cur:
            cur.execute(
                "UPDATE reconciliation SET status = 'resolved', resolved_at = %s, actor = %s, resolution = %s "
                "WHERE operation_id = %s AND kind = %s AND status = 'open'",
                [at, actor, resolution, operation_id, kind],
            )
            return int(cur.rowcount)

    def reconciliation(self, *, open_only: bool = True) -> list[dict[str, object]]:
        query = "SELECT * FROM reconciliation"
        if open_only:
            query += " WHERE status = 'open'"
        return self._rows(query + " ORDER BY opened_at, entry_id")

    def polls(self, operation_id: str | None = None) -> list[dict[str, object]]:
        if operation_id is None:
            return self._rows("SELECT * FROM polls ORDER BY sent_at")
        return self._rows("SELECT * FROM polls WHERE operation_id = %s ORDER BY sent_at", [operation_id])

    def hold_outcome(self, operation_id: str, held: HeldOutcome) -> None:
        """Keep a terminal outcome that arrived inline, so it survives a restart or the server's expiry."""
        self.hold_many([(operation_id, held)])

    def hold_many(self, items: Sequence[tuple[str, HeldOutcome]]) -> None:
        if not items:
            return
        with self._tx() as cur:
            self._insert_held(cur, items)

    @staticmethod
    def _insert_held(cur: Cursor, items: Sequence[tuple[str, HeldOutcome]]) -> None:
        latest = dict(items)  # a later copy replaces an earlier one
        cur.executemany(
            "INSERT INTO held_outcomes VALUES (%s,%s,%s,%s,%s,%s,%s) ON CONFLICT (operation_id) DO UPDATE SET "
            "status = EXCLUDED.status, digest = EXCLUDED.digest, payload = EXCLUDED.payload, "
            "task_id = EXCLUDED.task_id, epoch_echo = EXCLUDED.epoch_echo, held_at = EXCLUDED.held_at",
            [
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
            ],
        )

    def held_outcome(self, operation_id: str) -> HeldOutcome | None:
        row = self._fetchone(
            "SELECT status, digest, payload, task_id, epoch_echo, held_at FROM held_outcomes WHERE operation_id = %s",
            [operation_id],
        )
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

        The same contract as ``Ledger.import_rows``: columns matched by name, sequence-backed ids
        (``transitions.seq``, ``reconciliation.entry_id``) numbered here in row order; the lease
        columns are left empty (free). The database's own keys still hold.

        Raises:
            LedgerError: a table is not importable, or its columns do not match the schema.
        """
        sequenced = {
            "transitions": ("seq", "transition_seq"),
            "reconciliation": ("entry_id", "reconciliation_seq"),
        }
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
            expected = [c for c in schema[table] if not (table == "op_state" and c in LEASE_COLUMNS)]
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
        with self._tx() as cur:
            for table, rows in prepared:
                names = list(rows.column_names)
                if table in sequenced and rows.num_rows:
                    column, sequence = sequenced[table]
                    ids = sorted(
                        int(r[0])
                        for r in cur.execute(
                            "SELECT nextval(%s) FROM generate_series(1, %s)", [sequence, rows.num_rows]
                        ).fetchall()
                    )
                    rows = rows.append_column(column, pa.array(ids, pa.int64()))
                    names.append(column)
                columns = sql.SQL(", ").join(sql.Identifier(n) for n in names)
                statement = sql.SQL("COPY {} ({}) FROM STDIN").format(sql.Identifier(table), columns)
                with cur.copy(statement) as copy:
                    for record in rows.to_pylist():
                        copy.write_row([record[n] for n in names])
                counts[table] = counts.get(table, 0) + rows.num_rows
        return counts

    def record_explorer_run(self, run: ExplorerRun) -> int:
        """Append one explorer result (per scenario and protocol); returns its run id."""
        with self._tx() as cur:
            row = cur.execute(
                "INSERT INTO explorer_runs VALUES (nextval('explorer_run_seq'),%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) "
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
        return self._rows("SELECT * FROM explorer_runs ORDER BY run_id")

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
                where.append(f"{column} = %s")
                params.append(value)
        query = _OPERATION_SELECT + (f" WHERE {' AND '.join(where)}" if where else "")
        return self._rows(
            query + ' ORDER BY created_at DESC, operation_id COLLATE "C" LIMIT %s', [*params, limit]
        )

    def state_counts(self) -> list[tuple[str, str, int]]:
        rows = self._fetchall(
            "SELECT s.state, i.protocol, count(*) FROM op_state s JOIN op_identity i USING (operation_id) "
            'GROUP BY s.state, i.protocol ORDER BY s.state COLLATE "C", i.protocol COLLATE "C"'
        )
        return [(str(a), str(b), int(c)) for a, b, c in rows]

    def poll_counts(self) -> list[tuple[str, int]]:
        rows = self._fetchall(
            'SELECT outcome, count(*) FROM polls GROUP BY outcome ORDER BY outcome COLLATE "C"'
        )
        return [(str(a), int(b)) for a, b in rows]

    def open_reconciliation_counts(self) -> list[tuple[str, int]]:
        rows = self._fetchall(
            "SELECT kind, count(*) FROM reconciliation WHERE status = 'open' GROUP BY kind ORDER BY kind COLLATE \"C\""
        )
        return [(str(a), int(b)) for a, b in rows]

    def put_setting(self, key: str, value: str, at: datetime) -> None:
        with self._tx() as cur:
            cur.execute(
                "INSERT INTO settings VALUES (%s, %s, %s) "
                "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = EXCLUDED.updated_at",
                [key, value, at],
            )

    def setting(self, key: str) -> str | None:
        row = self._fetchone("SELECT value FROM settings WHERE key = %s", [key])
        return str(row[0]) if row else None

    def gate_inputs(self, now: datetime) -> dict[str, dict[str, object]]:
        """The raw inputs of the six gates, read from the ledger only (no thresholds applied here).

        The one gate-inputs statement (``engine.ledger.gate_sql``, shared with DuckDB and the console) in
        PostgreSQL's dialect, read in one REPEATABLE READ transaction while executors keep writing.
        """
        with self._conn() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cur.execute(gate_inputs_sql(now, "postgres"))
            row = cur.fetchone()
            if row is None:
                raise LedgerError("the gate-inputs statement returned no row")
            return gate_inputs_from_values([d.name for d in cur.description or ()], list(row))

    def record_gate_run(self, results: Sequence[GateRecord], at: datetime) -> int:
        """Store one evaluation of the gates; returns its run id."""
        with self._tx() as cur:
            row = cur.execute("SELECT nextval('gate_run_seq')").fetchone()
            assert row is not None
            run_id = int(row[0])
            if results:
                cur.executemany(
                    "INSERT INTO gate_runs VALUES (%s,%s,%s,%s,%s,%s,%s,%s)",
                    [
                        [run_id, r.gate, r.passed, r.value, r.threshold, r.verdict, _json_text(r.inputs), at]
                        for r in results
                    ],
                )
        return run_id

    def gate_runs(self, limit: int = 500) -> list[dict[str, object]]:
        return self._rows('SELECT * FROM gate_runs ORDER BY run_id DESC, gate COLLATE "C" LIMIT %s', [limit])

    # --------------------------------------------------------------------------------- rollout

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
        rows = self._rows("SELECT * FROM rollout_state WHERE id = 1")
        if not rows:
            return None
        row = rows[0]
        for key in ("shadow_tools", "disabled_protocols"):
            row[key] = json.loads(str(row[key]))
        return row

    def execution_epoch(self) -> int | None:
        """The execution epoch the ledger records (raised only by a rollback), or None if never set."""
        row = self._fetchone("SELECT epoch FROM rollout_state WHERE id = 1")
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
        try:
            with self._tx() as cur:
                current = cur.execute(
                    "SELECT head_seq, epoch FROM rollout_state WHERE id = 1 FOR UPDATE"
                ).fetchone()
                if current is None:
                    if expected_seq != 0:
                        raise StaleWrite("rollout", expected_seq, "the rollout state row is missing")
                    cur.execute("INSERT INTO rollout_state VALUES (1, %s,%s,%s,%s,%s,%s,%s,%s,%s)", columns)
                else:
                    cur.execute(
                        "UPDATE rollout_state SET stage = %s, canary_bp = %s, salt = %s, shadow_tools = %s, "
                        "disabled_protocols = %s, epoch = %s, head_seq = %s, head_hash = %s, updated_at = %s "
                        "WHERE id = 1 AND head_seq = %s AND epoch = %s",
                        [*columns, expected_seq, expected_epoch],
                    )
                    if cur.rowcount != 1:
                        raise StaleWrite(
                            "rollout",
                            expected_seq,
                            f"the rollout moved to seq {current[0]} at epoch {current[1]} first",
                        )
                cur.execute(f"INSERT INTO rollout_events VALUES ({', '.join(['%s'] * len(values))})", values)
        except pg_errors.UniqueViolation as exc:
            # Two first actions at once: the second one's state row (or event seq) already exists.
            raise StaleWrite("rollout", expected_seq, "another action was recorded first") from exc

    def rollout_events(
        self, *, limit: int | None = None, newest_first: bool = False
    ) -> list[dict[str, object]]:
        """Audit rows in chain order (or newest first)."""
        query = "SELECT * FROM rollout_events ORDER BY seq" + (" DESC" if newest_first else "")
        params: list[object] = []
        if limit is not None:
            query += " LIMIT %s"
            params.append(limit)
        return self._rows(query, params)

    def record_assignments(self, rows: Sequence[dict[str, object]]) -> None:
        """Record operations' arms (one per operation; a second row for an operation is ignored)."""
        if not rows:
            return
        with self._tx() as cur:
            cur.executemany(
                f"INSERT INTO rollout_assignments VALUES ({', '.join(['%s'] * len(self._ASSIGNMENT_COLUMNS))}) "
                "ON CONFLICT DO NOTHING",
                [[r.get(c) for c in self._ASSIGNMENT_COLUMNS] for r in rows],
            )

    def assignments(self, *, limit: int = 1000) -> list[dict[str, object]]:
        return self._rows("SELECT * FROM rollout_assignments ORDER BY assigned_at DESC LIMIT %s", [limit])

    def rollout_keys(self) -> list[tuple[str, str, str]]:
        """``(call_node_id, operation_id, state)`` of every primary operation routed by arm."""
        rows = self._fetchall(
            "SELECT a.call_node_id, a.operation_id, s.state FROM rollout_assignments a "
            "JOIN op_state s USING (operation_id) WHERE a.role = 'primary' AND a.arm IN ('control', 'canary') "
            'ORDER BY a.call_node_id COLLATE "C"'
        )
        return [(str(a), str(b), str(c)) for a, b, c in rows]

    def arm_counts(self) -> list[dict[str, object]]:
        """Operations per arm, server, protocol and whether they still hold no receipt."""
        return self._rows(
            "SELECT a.arm, a.server_name, i.protocol, "
            "s.state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED') AS in_flight, count(*) AS operations "
            "FROM rollout_assignments a JOIN op_state s USING (operation_id) "
            "JOIN op_identity i USING (operation_id) GROUP BY 1, 2, 3, 4 "
            'ORDER BY a.arm COLLATE "C", a.server_name COLLATE "C", i.protocol COLLATE "C", 4, 5'
        )

    def live_by_protocol(self) -> dict[str, dict[str, int]]:
        """Operations without a receipt, per protocol and local state (UNKNOWN ones included)."""
        rows = self._fetchall(
            "SELECT i.protocol, s.state, count(*) FROM op_state s JOIN op_identity i USING (operation_id) "
            "WHERE s.state NOT IN ('ACCEPTED', 'CANCELLED_ACCEPTED') GROUP BY 1, 2 "
            'ORDER BY i.protocol COLLATE "C", s.state COLLATE "C"'
        )
        out: dict[str, dict[str, int]] = {}
        for protocol, state, count in rows:
            out.setdefault(str(protocol), {})[str(state)] = int(count)
        return out

    def shadow_pairs(self, *, ready_only: bool) -> list[tuple[str, str]]:
        """``(primary, shadow)`` operation ids not yet compared; ``ready_only``: both hold a receipt."""
        query = (
            "SELECT a.primary_operation_id, a.operation_id FROM rollout_assignments a "
            "LEFT JOIN shadow_diffs d ON d.shadow_operation_id = a.operation_id "
            "WHERE a.role = 'shadow' AND a.primary_operation_id IS NOT NULL AND d.shadow_operation_id IS NULL"
        )
        if ready_only:
            query += (
                " AND a.operation_id IN (SELECT operation_id FROM receipts)"
                " AND a.primary_operation_id IN (SELECT operation_id FROM receipts)"
            )
        rows = self._fetchall(query + " ORDER BY a.assigned_at")
        return [(str(a), str(b)) for a, b in rows]

    def receipt_of_operation(self, operation_id: str) -> dict[str, object] | None:
        rows = self._rows("SELECT * FROM receipts WHERE operation_id = %s", [operation_id])
        return rows[0] if rows else None

    def poll_count(self, operation_id: str) -> int:
        row = self._fetchone("SELECT count(*) FROM polls WHERE operation_id = %s", [operation_id])
        return int(row[0]) if row else 0

    def record_shadow_diff(self, row: dict[str, object]) -> bool:
        """Store one comparison; False if the pair was already compared."""
        with self._tx() as cur:
            cur.execute(
                f"INSERT INTO shadow_diffs VALUES ({', '.join(['%s'] * len(self._SHADOW_DIFF_COLUMNS))}) "
                "ON CONFLICT DO NOTHING",
                [row.get(c) for c in self._SHADOW_DIFF_COLUMNS],
            )
            return cur.rowcount == 1

    def shadow_diffs(self, *, diverged_only: bool = False, limit: int = 100) -> list[dict[str, object]]:
        query = "SELECT * FROM shadow_diffs"
        if diverged_only:
            query += " WHERE diverged"
        return self._rows(query + " ORDER BY recorded_at DESC LIMIT %s", [limit])

    def shadow_summary(self) -> dict[str, object]:
        """Shadow operations started, compared, diverged (by what), and still waiting for a comparison."""
        row = self._fetchone(
            "SELECT (SELECT count(*) FROM rollout_assignments WHERE role = 'shadow'), count(*), "
            "count(*) FILTER (WHERE diverged), count(*) FILTER (WHERE differences LIKE '%status%'), "
            "count(*) FILTER (WHERE differences LIKE '%result%'), "
            "avg(shadow_latency_ms - primary_latency_ms)::float8, "
            "avg(shadow_polls - primary_polls)::float8 FROM shadow_diffs"
        )
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
        row = self._fetchone(
            "SELECT count(*) FROM transitions WHERE NOT accepted AND cause LIKE 'stale epoch%'"
        )
        return int(row[0]) if row else 0

    def get_many(self, operation_ids: Sequence[str]) -> dict[str, Operation]:
        """Several operations by id in one query (the ones that exist)."""
        if not operation_ids:
            return {}
        found = self._operations_where("operation_id = ANY(%s)", [list(operation_ids)])
        return {op.operation_id: op for op in found}

    # ----------------------------------------------------------------------------------- reads

    def _operations_where(self, where: str, params: Sequence[object], suffix: str = "") -> list[Operation]:
        with self._conn() as conn, conn.cursor() as cur:
            cur.execute(f"{_OPERATION_SELECT} WHERE {where}{suffix}", params or None)
            cols = [d.name for d in cur.description or ()]
            return [operation_from_record(dict(zip(cols, r, strict=True))) for r in cur.fetchall()]

    def _one(self, where: str, params: Sequence[object]) -> Operation | None:
        found = self._operations_where(where, params)
        return found[0] if found else None

    def get(self, operation_id: str) -> Operation | None:
        return self._one("operation_id = %s", [operation_id])

    def by_call_node(self, call_node_id: str) -> Operation | None:
        return self._one("call_node_id = %s", [call_node_id])

    def by_task(self, server: str, task_id: str) -> Operation | None:
        return self._one("server = %s AND task_id = %s", [server, task_id])

    def by_key(self, key: str) -> Operation | None:
        return self._one("idempotency_key = %s", [key])

    def arguments(self, operation_id: str) -> Json:
        row = self._fetchone("SELECT arguments FROM op_identity WHERE operation_id = %s", [operation_id])
        if row is None:
            raise InvalidRecord(f"no operation {operation_id}")
        value = json.loads(str(row[0]))
        if not isinstance(value, dict):
            raise InvalidRecord(f"arguments of {operation_id} are not an object")
        return value

    def operations(
        self, *, states: Sequence[LocalState] | None = None, limit: int | None = None
    ) -> list[Operation]:
        where = "TRUE"
        params: list[object] = []
        if states:
            where = "state = ANY(%s)"
            params.append([s.value for s in states])
        suffix = ' ORDER BY created_at, operation_id COLLATE "C"'
        if limit is not None:
            suffix += " LIMIT %s"
            params.append(limit)
        return self._operations_where(where, params, suffix)

    def receipt(self, call_node_id: str) -> Receipt | None:
        row = self._fetchone(
            "SELECT call_node_id, operation_id, request_digest, task_id, tool_version, epoch, cancel_generation, "
            "status, result_digest, accepted_at, cancel_evidence FROM receipts WHERE call_node_id = %s",
            [call_node_id],
        )
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
        row = self._fetchone("SELECT payload FROM results WHERE operation_id = %s", [operation_id])
        if row is None:
            return None
        value = json.loads(str(row[0]))
        return value if isinstance(value, dict) else None

    def transitions(self, operation_id: str) -> list[dict[str, object]]:
        return self._rows(
            "SELECT seq, from_state, to_state, event, cause, accepted, epoch, row_version, recorded_at "
            "FROM transitions WHERE operation_id = %s ORDER BY seq",
            [operation_id],
        )

    def count(self, table: str) -> int:
        if table not in _TABLES:
            raise LedgerError(f"unknown ledger table {table!r}")
        row = self._fetchone(f"SELECT count(*) FROM {table}")
        return int(row[0]) if row else 0

    def table_columns(self) -> dict[str, list[str]]:
        """Every table and view of the ledger with its columns, in order (``op_state`` has the lease columns too)."""
        rows = self._fetchall(
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        )
        out: dict[str, list[str]] = {}
        for table, column in rows:
            if table == SEND_SLOTS_TABLE:
                continue  # the executors' QPS coordination, not ledger data
            out.setdefault(str(table), []).append(str(column))
        return out

    def analyst_query(
        self, query: str, *, max_rows: int = 1000, timeout: timedelta = timedelta(seconds=10)
    ) -> QueryResult:
        """Run one read-only analyst query under the analyst role (see ``engine.ledger.analyst.run_query``).

        Raises:
            SqlRefused: the query would write or reach outside the ledger, timed out or failed.
        """
        return run_query(self, query, max_rows=max_rows, timeout=timeout)


# ------------------------------------------------------------------------------- schema set-up


def _configure(conn: Connection, *, read_only: bool) -> None:
    conn.execute("SET TIME ZONE 'UTC'")
    # A process that hangs inside a transaction must not hold operation rows locked for ever.
    conn.execute("SET idle_in_transaction_session_timeout = '60s'")
    if read_only:
        conn.execute("SET default_transaction_read_only = on")


def _schema_version(con: Connection) -> int:
    row = con.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row else 0


def _migrate(con: Connection, where: str, *, read_only: bool, analyst_role: str) -> None:
    """Apply the missing migrations, each in its own transaction, one migrating process at a time;
    then (still alone) make sure the analyst role can read every table."""
    row = con.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    exists = bool(row and row[0])
    if read_only:
        if not exists:
            raise LedgerCorrupt(f"{where} is not a Finality ledger (no schema_migrations table)")
        current = _schema_version(con)
        if current > SUPPORTED_SCHEMA:
            raise SchemaTooNew(current, SUPPORTED_SCHEMA)
        if current < SUPPORTED_SCHEMA:
            raise LedgerUnavailable(f"{where} needs migration {current + 1} but was opened read-only")
        return
    # Several executors may open a new ledger at once: the lock makes the others wait and then
    # find every migration applied.
    con.execute("SELECT pg_advisory_lock(%s)", [_MIGRATION_LOCK])
    try:
        con.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, "
            "applied_at TIMESTAMPTZ NOT NULL)"
        )
        current = _schema_version(con)
        if current > SUPPORTED_SCHEMA:
            raise SchemaTooNew(current, SUPPORTED_SCHEMA)
        for version, name, statements in MIGRATIONS:
            if version <= current:
                continue
            with con.transaction():
                for statement in statements:
                    con.execute(statement)
                con.execute("INSERT INTO schema_migrations VALUES (%s, %s, now())", [version, name])
        _ensure_analyst_role(con, analyst_role)
    finally:
        con.execute("SELECT pg_advisory_unlock(%s)", [_MIGRATION_LOCK])


def _ensure_analyst_role(con: Connection, role: str) -> None:
    """The NOLOGIN role analyst SQL runs under: USAGE on this schema and SELECT on its tables, nothing else.

    Idempotent; a login without the right to create or grant roles leaves analyst SQL refused
    (``engine.ledger.analyst`` says why) instead of failing the ledger.
    """
    ident = sql.Identifier(role)
    for attempt in range(3):
        try:
            with con.transaction():
                row = con.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone()
                if row is None:
                    con.execute(
                        sql.SQL(
                            "CREATE ROLE {} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS"
                        ).format(ident)
                    )
                schema = con.execute("SELECT current_schema()").fetchone()
                assert schema is not None
                schema_ident = sql.Identifier(str(schema[0]))
                con.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema_ident, ident))
                con.execute(
                    sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(schema_ident, ident)
                )
                member = con.execute(
                    "SELECT rolsuper OR pg_has_role(current_user, %s, 'MEMBER') FROM pg_roles WHERE rolname = current_user",
                    [role],
                ).fetchone()
                if not (member and member[0]):
                    con.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(ident))
            return
        except (pg_errors.DuplicateObject, pg_errors.UniqueViolation, pg_errors.InternalError_):
            # Another ledger in this cluster created or granted the role at the same moment
            # ("tuple concurrently updated"): look again.
            if attempt == 2:
                raise
        except pg_errors.InsufficientPrivilege as exc:
            logger.warning("analyst SQL is unavailable on this ledger: cannot set up role %s: %s", role, exc)
            return


__all__ = [
    "ANALYST_ROLE",
    "LEASE_COLUMNS",
    "MIGRATIONS",
    "SEND_SLOTS_TABLE",
    "SUPPORTED_SCHEMA",
    "Connection",
    "Cursor",
    "PgLedger",
    "redact",
]
