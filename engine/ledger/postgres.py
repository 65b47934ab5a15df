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

``PgLedger`` is composed of the shared SQL ledger (``engine.ledger.base``) and three parts of its
own, each in its module: leases (``pg_leases``), fencing (``pg_fencing``) and the shared QPS send
slots (``pg_slots``). This module keeps the connection pool, the migrations and the row-locking
write paths; it reaches psycopg through ``engine.ledger.pg_client``, as its parts do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, ClassVar, Final, TypeVar

import pyarrow as pa

from engine.acceptance import check_acceptance, receipt_of
from engine.errors import (
    EpochMoved,
    LeaseLost,
    LedgerCorrupt,
    LedgerError,
    LedgerUnavailable,
    ReceiptConflict,
    SchemaTooNew,
    StaleWrite,
)
from engine.ledger import pg_client as pg
from engine.ledger import rows as codec
from engine.ledger import sql
from engine.ledger.analyst import run_query
from engine.ledger.base import SqlLedger
from engine.ledger.core import cas_params
from engine.ledger.export import BATCH_ROWS
from engine.ledger.gate_sql import gate_inputs_from_values, gate_inputs_sql
from engine.ledger.pg_client import ConnectionPool, PoolTimeout, TupleRow, conninfo_to_dict, dict_row
from engine.ledger.pg_client import errors as pg_errors
from engine.ledger.pg_client import sql as pg_sql
from engine.ledger.pg_fencing import PgFencing
from engine.ledger.pg_leases import PgLeases
from engine.ledger.pg_slots import PgSendSlots
from engine.ledger.port import (
    BatchOutcome,
    Fence,
    GroupOutcome,
    Json,
    PollRecord,
    WriteGroup,
)
from engine.ledger.receipts import acceptance_outcomes, repeated_acceptances
from engine.ledger.sandbox import QueryResult
from engine.ledger.schema import (
    _STATE_COLUMNS,
    LEASE_COLUMNS,
    OUTBOX_SEQUENCE,
    ROW_SCHEMAS,
    SEND_SLOTS_TABLE,
)
from engine.ledger.schema import PG_MIGRATIONS as MIGRATIONS
from engine.ledger.schema import PG_SUPPORTED_SCHEMA as SUPPORTED_SCHEMA
from engine.ledger.writes import chain, outcomes
from engine.model import (
    Operation,
    Receipt,
    Transition,
)

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

logger = logging.getLogger(__name__)

Connection = pg.Connection[TupleRow]
Cursor = pg.Cursor[TupleRow]
T = TypeVar("T")

ANALYST_ROLE: Final = "finality_analyst"
"""The NOLOGIN role analyst SQL runs under (``SET LOCAL ROLE``): SELECT on the ledger's tables, nothing else."""

_MIGRATION_LOCK: Final = 0x46494E414C495459  # "FINALITY": one migrating process at a time
_STATE_INSERT: Final = (
    f"INSERT INTO op_state ({', '.join(_STATE_COLUMNS + LEASE_COLUMNS)}) "
    f"VALUES ({', '.join(['%s'] * (len(_STATE_COLUMNS) + len(LEASE_COLUMNS)))})"
)
_STATE_LEASE: Final = (
    "SELECT row_version, cancel_generation, lease_token FROM op_state WHERE operation_id = %s"
)
_IDENTITY_TYPES: Final = tuple(
    (
        f.name,
        "boolean" if f.type == pa.bool_() else "timestamptz" if pa.types.is_timestamp(f.type) else "varchar",
    )
    for f in ROW_SCHEMAS["op_identity"]
)
"""``op_identity``'s columns with the PostgreSQL type of each (the arrays ``_insert_new`` unnests)."""
_RETRIES: Final = 3


# ------------------------------------------------------------------------------------- helpers


def redact(url: str) -> str:
    """A connection URL without its password, for messages."""
    try:
        parts = conninfo_to_dict(url)
    except pg.ProgrammingError:
        return "postgresql://?"
    host = parts.get("host") or "localhost"
    port = parts.get("port") or "5432"
    user = parts.get("user")
    db = parts.get("dbname") or ""
    return f"postgresql://{f'{user}@' if user else ''}{host}:{port}/{db}"


def _is_connection_error(exc: pg.Error) -> bool:
    state = exc.sqlstate
    return isinstance(exc, PoolTimeout) or (
        isinstance(exc, pg.OperationalError) and (state is None or state.startswith(("08", "57P")))
    )


# ------------------------------------------------------------------------------------- the ledger


class PgLedger(SqlLedger, PgFencing, PgLeases, PgSendSlots):
    """A ledger in a PostgreSQL database, shared by any number of processes.

    Thread-safe: every call borrows a connection from a pool, so threads (and processes) race only
    on the database's own row locks and constraints.
    """

    dialect = "postgres"
    snapshots = None
    """Analysts read PostgreSQL in place (a read-only role on a pool of their own)."""
    _private_tables: ClassVar[frozenset[str]] = frozenset({SEND_SLOTS_TABLE})  # QPS coordination
    _unimported_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {"op_state": LEASE_COLUMNS}  # leases free

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
            con = pg.connect(url, autocommit=True, connect_timeout=connect_timeout_s)
        except pg.Error as exc:
            raise LedgerUnavailable(f"cannot connect to the PostgreSQL ledger {where}: {exc}") from exc
        try:
            _configure(con, read_only=False)
            _migrate(con, where, read_only=read_only, analyst_role=analyst_role)
        except pg.Error as exc:
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

    @property
    def leasing(self) -> PgLedger:
        """Any number of executors share a PostgreSQL ledger: leases, fencing, shared QPS slots."""
        return self

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
        except pg.Error as exc:
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

    def _rows(self, query: str, params: Sequence[object] = ()) -> list[dict[str, object]]:
        with self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(self._q(query), list(params))
            return list(cur.fetchall())

    def _fetchone(self, query: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        with self._conn() as conn:
            return conn.execute(self._q(query), list(params)).fetchone()

    def _fetchall(self, query: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._conn() as conn:
            return conn.execute(self._q(query), list(params)).fetchall()

    def _affected(self, tx: Any, query: str, params: Sequence[object]) -> int:
        tx.execute(self._q(query), list(params))
        return int(tx.rowcount)

    def _insert_many(self, tx: Any, table: str, rows: Sequence[Sequence[object]], suffix: str = "") -> None:
        values = sql.placeholders(len(ROW_SCHEMAS[table]))
        numbered = "nextval('transition_seq'), " if table == "transitions" else ""
        trailing = f", nextval('{OUTBOX_SEQUENCE}')" if table == "outbox" else ""
        tx.executemany(self._q(f"INSERT INTO {table} VALUES ({numbered}{values}{trailing}){suffix}"), rows)

    def _conflict(self, exc: Exception) -> bool:
        return isinstance(exc, pg_errors.UniqueViolation)

    def _operations_in(self, column: str, values: Sequence[str]) -> list[Operation]:
        return self._operations_where(f"{column} = ANY(?)", [list(values)])

    def _serialise(self, tx: Any, key: str) -> None:
        tx.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [key])

    def _insert_polls(self, tx: Any, rows: Sequence[PollRecord]) -> None:
        with tx.copy("COPY polls FROM STDIN") as copy:
            for r in rows:
                copy.write_row(r)

    # ---------------------------------------------------------------------------------- writes

    def _insert_fresh(
        self, fresh: Sequence[tuple[Operation, Json]], arms: Sequence[dict[str, object]] = ()
    ) -> set[str] | None:
        return self._retrying(lambda: self._insert_new(fresh, arms))

    def _created_by_another(self, op: Operation) -> Operation | None:
        # The conflicting creator has committed: PostgreSQL's unique check waits for it.
        return self.by_call_node(op.call_node_id) or self.by_key(op.idempotency_key)

    def _insert_new(
        self, fresh: Sequence[tuple[Operation, Json]], arms: Sequence[dict[str, object]] = ()
    ) -> set[str]:
        """Insert the operations whose call node, key and id are all new, and their arms; return their ids.

        ``ON CONFLICT DO NOTHING`` waits for a concurrent creator of the same key to finish, so a
        skipped row belongs to a committed operation.
        """
        ordered = sorted(fresh, key=lambda item: item[0].call_node_id)
        identity = [codec.identity_row(op, args) for op, args in ordered]
        arrays = ", ".join(f"%s::{kind}[]" for _, kind in _IDENTITY_TYPES)
        with self._tx() as cur:
            epoch_refused = self._epoch_refusal(cur)
            if epoch_refused is not None:
                raise EpochMoved(ordered[0][0].operation_id, 0, epoch_refused)
            cur.execute(
                f"INSERT INTO op_identity SELECT * FROM unnest({arrays}) ON CONFLICT DO NOTHING RETURNING operation_id",
                [list(col) for col in zip(*identity, strict=True)],
            )
            inserted = {str(r[0]) for r in cur.fetchall()}
            created = [op for op, _ in ordered if op.operation_id in inserted]
            if created:
                cur.executemany(
                    _STATE_INSERT,
                    [
                        [*codec._state_row(op, 0, 0)[: len(_STATE_COLUMNS)], *self._new_lease(op)]
                        for op in created
                    ],
                )
                self._insert_many(cur, "transitions", [codec.created_row(op) for op in created])
                self._insert_arms(cur, [r for r in arms if r["operation_id"] in inserted])
        return inserted

    def _refusal(self, cur: Cursor, before: Operation) -> LedgerError:
        row = cur.execute(_STATE_LEASE, [before.operation_id]).fetchone()
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
                return BatchOutcome(None, EpochMoved(before.operation_id, before.row_version, epoch_refused))
            if after == before:
                # Nothing to write but the log line; it must still be about the row as it is.
                row = cur.execute(_STATE_LEASE + " FOR SHARE", [before.operation_id]).fetchone()
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
                row_values = codec._state_row(after, before.row_version, before.cancel_generation)
                cur.execute(self._q(sql.STATE_UPDATE) + fence_sql, [*cas_params(row_values), *fence_params])
                if cur.rowcount != 1:
                    return BatchOutcome(None, self._refusal(cur, before))
                if after.task_id is not None and after.task_id != before.task_id:
                    cur.execute(
                        self._q(sql.TASK_BINDING_INSERT),
                        [after.server, after.task_id, after.operation_id, t.at],
                    )
            if t.logged:
                cur.execute(self._q(sql.TRANSITION_INSERT), codec._transition_row(t))
        return BatchOutcome(after, None)

    def _apply_batch(self, transitions: Sequence[Transition]) -> Sequence[BatchOutcome]:
        with self._tx() as cur:
            return self._apply_batch_in(cur, transitions, self._epoch_refusal(cur))

    def _apply_batch_in(
        self, cur: Cursor, transitions: Sequence[Transition], epoch_refused: str | None
    ) -> Sequence[BatchOutcome]:
        first, last, chain_errors = chain(transitions)
        keys = sorted(last)
        refused: dict[str, LedgerError] = {}
        if epoch_refused is not None:
            refused = {k: EpochMoved(k, first[k].before.row_version, epoch_refused) for k in keys}
            return outcomes(transitions, chain_errors, refused)
        # Lock the rows in one order (no deadlock between two batches) and check them here; once
        # locked they cannot move before the commit.
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
            self._update_states(
                cur,
                [
                    codec._state_row(
                        last[k].after, first[k].before.row_version, first[k].before.cancel_generation
                    )
                    for k in changed
                ],
            )
        self._append_batch(cur, transitions, first, last, chain_errors, set(refused))
        return outcomes(transitions, chain_errors, refused)

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
        try:
            with self._tx() as cur:
                epoch_refused = self._epoch_refusal(cur)
                if epoch_refused is not None:
                    raise EpochMoved(receipt.operation_id, transition.before.row_version, epoch_refused)
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
                    current = self._one_in(cur, receipt.operation_id)
                check_acceptance(current, transition, payload)
                assert current is not None
                self._write_acceptance(
                    cur, current, codec.acceptance_rows(current, transition, payload, receipt)
                )
        except pg_errors.UniqueViolation as exc:
            # Unreachable through this method (the row lock orders acceptances); a receipt written
            # some other way still makes the database refuse a second one.
            raise ReceiptConflict(
                receipt.call_node_id, "receipt", "already written", receipt.operation_id
            ) from exc
        return receipt

    @staticmethod
    def _one_in(cur: Cursor, operation_id: str) -> Operation | None:
        cur.execute(f"{sql.OPERATION_SELECT} WHERE operation_id = %s", [operation_id])
        row = cur.fetchone()
        if row is None:
            return None
        cols = [d.name for d in cur.description or ()]
        return codec.operation_from_record(dict(zip(cols, row, strict=True)))

    def _accept_batch(self, items: Sequence[tuple[Transition, Json | None]]) -> Sequence[BatchOutcome]:
        with self._tx() as cur:
            return self._accept_batch_in(cur, items, self._epoch_refusal(cur))

    def _accept_batch_in(
        self, cur: Cursor, items: Sequence[tuple[Transition, Json | None]], epoch_refused: str | None
    ) -> Sequence[BatchOutcome]:
        errors, seen = repeated_acceptances(items)
        if epoch_refused is not None:
            return [
                BatchOutcome(
                    None,
                    errors.get(i) or EpochMoved(t.after.operation_id, t.before.row_version, epoch_refused),
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
        cur.execute(f"{sql.OPERATION_SELECT} WHERE operation_id = ANY(%s)", [sorted(tokens)])
        cols = [d.name for d in cur.description or ()]
        current = {
            op.operation_id: op
            for op in (codec.operation_from_record(dict(zip(cols, r, strict=True))) for r in cur.fetchall())
        }

        def lease_lost(_: int, t: Transition) -> LedgerError | None:
            op_id = t.after.operation_id
            if op_id in tokens and (lost := self._lease_refusal(tokens[op_id])) is not None:
                return LeaseLost(op_id, t.before.row_version, lost)
            return None

        self._write_acceptances(cur, self._acceptances(items, current, errors, lease_lost))
        return acceptance_outcomes(items, errors)

    def _commit_group_once(self, group: WriteGroup) -> GroupOutcome:
        # Every row the group touches is locked first, in one order, so two executors' groups never
        # deadlock on each other.
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
            applied = self._apply_batch_in(cur, group.transitions, epoch_refused) if group.transitions else []
            accepted = (
                self._accept_batch_in(cur, group.acceptances, epoch_refused) if group.acceptances else []
            )
            if group.polls:
                self._insert_polls(cur, group.polls)
        return GroupOutcome(applied, accepted)

    # ------------------------------------------------------------ bulk import (seeding only)

    def _next_ids(self, tx: Any, sequence: str, n: int) -> list[int]:
        rows = tx.execute("SELECT nextval(%s) FROM generate_series(1, %s)", [sequence, n]).fetchall()
        return sorted(int(r[0]) for r in rows)

    def _import_table(self, tx: Any, table: str, rows: pa.Table) -> None:
        names = list(rows.column_names)
        columns = pg_sql.SQL(", ").join(pg_sql.Identifier(n) for n in names)
        statement = pg_sql.SQL("COPY {} ({}) FROM STDIN").format(pg_sql.Identifier(table), columns)
        with tx.copy(statement) as copy:
            for record in rows.to_pylist():
                copy.write_row([record[n] for n in names])

    @contextmanager
    def _read_batches(self) -> Iterator[Callable[[str], pa.RecordBatchReader]]:
        """One REPEATABLE READ, READ ONLY transaction under the analyst role: the export reads the
        ledger exactly as analysts may, on a connection of this ledger's own pool."""
        with self._conn() as conn, conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            try:
                conn.execute(pg_sql.SQL("SET LOCAL ROLE {}").format(pg_sql.Identifier(self.analyst_role)))
            except pg.Error as exc:
                raise LedgerUnavailable(
                    f"PostgreSQL ledger {self.path}: cannot read as the analyst role {self.analyst_role}: {exc}"
                ) from exc
            yield lambda query: _pg_batches(conn, query)

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

    def analyst_query(
        self,
        query: str,
        *,
        max_rows: int = 1000,
        timeout: timedelta = timedelta(seconds=10),
        work_mem_mb: int = 64,
    ) -> QueryResult:
        """Run one read-only analyst query under the analyst role (see ``engine.ledger.analyst.run_query``).

        Raises:
            SqlRefused: the query would write or reach outside the ledger, ran over a limit or failed.
        """
        return run_query(self, query, max_rows=max_rows, timeout=timeout, work_mem_mb=work_mem_mb)


# ------------------------------------------------------------------------------- Parquet export

# PostgreSQL type oids -> the Arrow types DuckDB gives the same columns (docs/ledger.md's types).
_ARROW_OF_OID: Final[dict[int, Any]] = {
    16: pa.bool_(),
    20: pa.int64(),
    21: pa.int16(),
    23: pa.int32(),
    700: pa.float32(),
    701: pa.float64(),
    1082: pa.date32(),
    1184: pa.timestamp("us", tz="Etc/UTC"),  # the zone name DuckDB gives its TIMESTAMPTZ
}


def _pg_batches(conn: Connection, query: str) -> pa.RecordBatchReader:
    """``query``'s rows as Arrow batches, fetched through a server-side cursor (bounded memory)."""
    cur = conn.cursor(name="finality_export")
    try:
        cur.execute(query)
    except pg.Error as exc:
        cur.close()
        raise LedgerUnavailable(f"cannot read for export ({query}): {exc}") from exc
    schema = pa.schema(
        [(d.name, _ARROW_OF_OID.get(int(d.type_code), pa.string())) for d in cur.description or ()]
    )

    def batches() -> Iterator[Any]:
        try:
            while rows := cur.fetchmany(BATCH_ROWS):
                columns = list(zip(*rows, strict=True))
                yield pa.record_batch(
                    [pa.array(list(col), type=f.type) for col, f in zip(columns, schema, strict=True)],
                    schema=schema,
                )
        finally:
            cur.close()

    return pa.RecordBatchReader.from_batches(schema, batches())


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
    ident = pg_sql.Identifier(role)
    for attempt in range(3):
        try:
            with con.transaction():
                row = con.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone()
                if row is None:
                    con.execute(
                        pg_sql.SQL(
                            "CREATE ROLE {} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS"
                        ).format(ident)
                    )
                schema = con.execute("SELECT current_schema()").fetchone()
                assert schema is not None
                schema_ident = pg_sql.Identifier(str(schema[0]))
                con.execute(pg_sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema_ident, ident))
                con.execute(
                    pg_sql.SQL("GRANT SELECT ON ALL TABLES IN SCHEMA {} TO {}").format(schema_ident, ident)
                )
                member = con.execute(
                    "SELECT rolsuper OR pg_has_role(current_user, %s, 'MEMBER') FROM pg_roles WHERE rolname = current_user",
                    [role],
                ).fetchone()
                if not (member and member[0]):
                    con.execute(pg_sql.SQL("GRANT {} TO CURRENT_USER").format(ident))
            return
        except (pg_errors.DuplicateObject, pg_errors.UniqueViolation, pg_errors.InternalError_):
            # Another ledger in this cluster created or granted the role at the same moment
            # ("tuple concurrently updated"): look again.
            if attempt == 2:
                raise
        except pg_errors.InsufficientPrivilege as exc:
            logger.warning("analyst SQL is unavailable on this ledger: cannot set up role %s: %s", role, exc)
            return
