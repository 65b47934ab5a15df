"""What the DuckDB and PostgreSQL ledgers do the same way, written once over a few primitives each driver gives.

``SqlLedger`` holds every method whose logic and statements (``engine.ledger.sql``) both backends
share: the reads, the person-action and rollout writes, the retry-one-by-one fallbacks of the
group-committed writes, and the rows an acceptance writes. A driver (``engine.ledger.duckdb``,
``engine.ledger.postgres``) supplies its dialect, transactions, reads, bulk appends and what counts
as a uniqueness conflict; it keeps what only it does (DuckDB's Arrow-registered batches and file
checks; PostgreSQL's row locks, leases, fencing and send slots).

It must not import a database driver, and it decides nothing about states (``engine.machine`` does).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar, Final, TypeVar

import pyarrow as pa

from engine.acceptance import check_acceptance, receipt_of
from engine.errors import (
    AckRefused,
    DuplicateOperation,
    InvalidRecord,
    LeaseLost,
    LedgerError,
    ReceiptConflict,
    StaleWrite,
)
from engine.ledger import export, sql
from engine.ledger.port import (
    BatchOutcome,
    ExplorerRun,
    GroupOutcome,
    HeldOutcome,
    Json,
    OutboxAck,
    PollRecord,
    WriteGroup,
)
from engine.ledger.rows import (
    AcceptanceRows,
    _json_text,
    _refuse_receipt_state,
    _transition_row,
    acceptance_rows,
    audit_row,
    held_from_row,
    held_rows,
    operation_from_record,
    receipt_from_row,
    require_new,
    require_resolution,
    rollout_state_row,
)
from engine.ledger.schema import (
    _STATE_COLUMNS,
    _TABLES,
    ACCESS_DENIAL_COLUMNS,
    ASSIGNMENT_COLUMNS,
    OUTBOX_SEQUENCE,
    ROLLOUT_EVENT_COLUMNS,
    SHADOW_DIFF_COLUMNS,
)
from engine.model import GateRecord, LocalState, Operation, OperationId, Receipt, Transition, canonical_json

__all__ = [
    "NOT_IMPORTABLE",
    "SEQUENCED",
    "SqlLedger",
    "cas_params",
    "chain",
    "outcomes",
    "repeated_acceptances",
]

T = TypeVar("T")

_N: Final = len(_STATE_COLUMNS)

SEQUENCED: Final[dict[str, tuple[str, str]]] = {
    "transitions": ("seq", "transition_seq"),
    "reconciliation": ("entry_id", "reconciliation_seq"),
    "outbox": ("seq", OUTBOX_SEQUENCE),
}
"""Tables whose first column a sequence numbers: the column, and the sequence."""

NOT_IMPORTABLE: Final = frozenset(
    # The rollout's state and its hash chain are written only by the rollout module.
    {
        "operations",
        "gate_runs",
        "explorer_runs",
        "settings",
        "rollout_state",
        "rollout_events",
        "access_denials",
    }
)


_FIRST_SEQ: Final = -(2**62)
"""Below every outbox ``seq`` (rows from before the numbering migration are numbered at or below 0)."""


def _ack_mismatch(entry: tuple[Any, ...] | None, status: str, result_digest: str | None) -> str | None:
    """Why an acknowledgement does not match the entry (``seq, status, result_digest``), or None."""
    if entry is None:
        return "no such outbox entry"
    if entry[1] != status:
        return f"the entry's status is {entry[1]!r}, the acknowledgement says {status!r}"
    if entry[2] != result_digest:
        return f"the entry's result digest is {entry[2]!r}, the acknowledgement says {result_digest!r}"
    return None


def cas_params(state_row: Sequence[object]) -> list[object]:
    """``sql.STATE_UPDATE``'s parameters from a ``rows._state_row`` (new values, then id and expected row)."""
    return [*state_row[1:_N], state_row[0], state_row[_N], state_row[_N + 1]]


def chain(
    transitions: Sequence[Transition],
) -> tuple[dict[str, Transition], dict[str, Transition], dict[int, LedgerError]]:
    """Collapse chains: per operation, the first transition (whose ``before`` the ledger must hold) and
    the last (whose ``after`` it will hold); and the transitions that do not chain, by index."""
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
    return first, last, chain_errors


def outcomes(
    transitions: Sequence[Transition],
    chain_errors: Mapping[int, LedgerError],
    refused: Mapping[str, LedgerError],
) -> list[BatchOutcome]:
    """Each transition's outcome: its chain error, its operation's refusal (a plain stale write is
    named by the transition's own row version), or written."""
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


def repeated_acceptances(
    items: Sequence[tuple[Transition, Json | None]],
) -> tuple[dict[int, LedgerError], set[str]]:
    """The second and later acceptances of one operation in a batch (stale), and every operation id."""
    errors: dict[int, LedgerError] = {}
    seen: set[str] = set()
    for i, (t, _) in enumerate(items):
        op_id = t.after.operation_id
        if op_id in seen:
            # An operation reaches one receipt state once; a second acceptance is stale.
            errors[i] = StaleWrite(op_id, t.before.row_version, "accepted twice in one batch")
        seen.add(op_id)
    return errors, seen


class SqlLedger(ABC):
    """The shared body of ``Ledger`` (DuckDB) and ``PgLedger`` (PostgreSQL); see the module docstring."""

    dialect: ClassVar[str]
    """``"duckdb"`` or ``"postgres"``: which spelling of ``engine.ledger.sql``'s texts this driver runs."""
    _private_tables: ClassVar[frozenset[str]] = frozenset()
    """Tables of the driver's own coordination, not ledger data (left out of ``table_columns``)."""
    _unimported_columns: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    """Columns ``import_rows`` leaves empty, per table."""
    path: str
    read_only: bool

    # ---------------------------------------------------------------- what a driver supplies

    @abstractmethod
    def _tx(self) -> AbstractContextManager[Any]:
        """A write transaction; yields a cursor (``execute``, ``executemany``, ``fetchone``, ``fetchall``)."""

    @abstractmethod
    def _rows(self, query: str, params: Sequence[object] = ()) -> list[dict[str, object]]:
        """A read (``query`` in ``engine.ledger.sql``'s spelling) as rows of column -> value."""

    @abstractmethod
    def _fetchone(self, query: str, params: Sequence[object] = ()) -> tuple[Any, ...] | None:
        """A read's first row, or None."""

    @abstractmethod
    def _fetchall(self, query: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        """A read's rows, as tuples."""

    @abstractmethod
    def _affected(self, tx: Any, query: str, params: Sequence[object]) -> int:
        """Run a write in ``tx``; how many rows it wrote."""

    @abstractmethod
    def _insert_many(self, tx: Any, table: str, rows: Sequence[Sequence[object]], suffix: str = "") -> None:
        """Append ``rows`` (``schema.ROW_SCHEMAS[table]``'s columns) to ``table``; ``suffix`` ends the INSERT."""

    @abstractmethod
    def _conflict(self, exc: Exception) -> bool:
        """Whether ``exc`` is the database refusing a write on a uniqueness or write-write conflict."""

    @abstractmethod
    def _operations_in(self, column: str, values: Sequence[str]) -> list[Operation]:
        """The operations whose ``column`` is one of ``values``."""

    @abstractmethod
    def _insert_fresh(self, fresh: Sequence[tuple[Operation, Json]]) -> set[str] | None:
        """Insert new operations in one transaction; the ids inserted (another creator's call node
        or key skipped), or None if the backend refused the whole batch."""

    @abstractmethod
    def _created_by_another(self, op: Operation) -> Operation | None:
        """The operation that holds ``op``'s call node or key, once its creator has committed."""

    @abstractmethod
    def _apply_one(self, t: Transition) -> BatchOutcome:
        """Compare-and-swap one transition in its own transaction."""

    @abstractmethod
    def _apply_batch(self, transitions: Sequence[Transition]) -> list[BatchOutcome]:
        """Many transitions in one transaction, each compare-and-swapped on its own."""

    @abstractmethod
    def _accept_batch(self, items: Sequence[tuple[Transition, Json | None]]) -> list[BatchOutcome]:
        """Many acceptances in one transaction, each matched on its own."""

    @abstractmethod
    def _commit_group_once(self, group: WriteGroup) -> GroupOutcome:
        """A whole write group in one transaction (a uniqueness conflict aborts it all)."""

    @abstractmethod
    def accept_terminal(self, transition: Transition, payload: Json | None) -> Receipt:
        """The single acceptance point (each driver says how it locks the row)."""

    def _retrying(self, action: Callable[[], T]) -> T:
        """Run ``action``, again where the backend aborts a transaction that is safe to repeat."""
        return action()

    def _serialise(self, tx: Any, key: str) -> None:
        """Make concurrent transactions about ``key`` wait for each other (a backend shared by processes)."""
        return  # one writing process: nothing to wait for

    def _q(self, text: str) -> str:
        return sql.render(text, self.dialect)

    def schema_version(self) -> int:
        row = self._fetchone(sql.SCHEMA_VERSION)
        return int(row[0]) if row else 0

    # ------------------------------------------------------------------------ group commits

    def create_operation(self, op: Operation, arguments: Json) -> tuple[Operation, bool]:
        """Record a new operation in SUBMITTING, or return the call node's existing one.

        Returns:
            ``(operation, created)``; ``created`` is False when the call node already had one.

        Raises:
            DuplicateOperation: the call node (or key) exists for a different request.
        """
        require_new(op)
        inserted = self._insert_fresh([(op, arguments)])
        if inserted is not None and op.operation_id in inserted:
            return op, True
        existing = self._created_by_another(op)
        if existing is None:
            raise DuplicateOperation("submission key", op.idempotency_key)
        if existing.request_digest != op.request_digest:
            raise DuplicateOperation(
                "call node (for a different request)", f"{op.call_node_id} ({existing.request_digest})"
            )
        return existing, False

    def create_many(self, items: Sequence[tuple[Operation, Json]]) -> list[tuple[Operation, bool]]:
        """Group-committed ``create_operation``: one transaction for many new operations.

        Call nodes that already have an operation get it back (``created`` False). An item that
        conflicts otherwise (another creator won the race since the lookup) is resolved on its own,
        as ``create_operation`` would, so that the offender is named.
        """
        if not items:
            return []
        nodes = [op.call_node_id for op, _ in items]
        if len(set(nodes)) != len(nodes):
            return [self.create_operation(op, args) for op, args in items]
        existing = self.by_call_nodes(nodes)
        fresh = [(op, args) for op, args in items if op.call_node_id not in existing]
        for op, _ in fresh:
            require_new(op)
        inserted = self._insert_fresh(fresh) if fresh else set()
        if inserted is None:
            return [self.create_operation(op, args) for op, args in items]
        out: list[tuple[Operation, bool]] = []
        for op, args in items:
            have = existing.get(op.call_node_id)
            if have is None:
                out.append((op, True) if op.operation_id in inserted else self.create_operation(op, args))
            elif have.request_digest != op.request_digest:
                out.append(self.create_operation(op, args))
            else:
                out.append((have, False))
        return out

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
        except Exception as exc:
            if not self._conflict(exc):
                raise
            if len(transitions) == 1:
                t = transitions[0]
                return [
                    BatchOutcome(
                        None, DuplicateOperation("server task id", f"{t.after.server} {t.after.task_id}")
                    )
                ]
        # One transition broke a constraint: one transaction each, so the others still commit and
        # the offender is named.
        out: list[BatchOutcome] = []
        for t in transitions:
            out.extend(self.apply_many([t]))
        return out

    def accept_many(self, items: Sequence[tuple[Transition, Json | None]]) -> list[BatchOutcome]:
        """Many acceptances, one transaction: each matched exactly as ``accept_terminal`` matches it.

        The same rule (``check_acceptance`` against the row read inside the transaction) decides
        each item; a refused item (``StaleWrite``, ``ReceiptConflict``, ``LeaseLost``) writes nothing
        and does not stop the others. If a uniqueness constraint fires, the batch is retried one
        acceptance per transaction so that the offender alone is refused and named.
        """
        if not items:
            return []
        for t, _ in items:
            receipt_of(t)  # refuses anything that is not an acceptance before a transaction starts
        try:
            return self._retrying(lambda: self._accept_batch(items))
        except Exception as exc:
            if not self._conflict(exc):
                raise
        out: list[BatchOutcome] = []
        for t, payload in items:
            try:
                self.accept_terminal(t, payload)
                out.append(BatchOutcome(t.after, None))
            except (StaleWrite, ReceiptConflict) as refusal:
                out.append(BatchOutcome(None, refusal))
            except Exception as exc:
                if not self._conflict(exc):
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
            return self._retrying(lambda: self._commit_group_once(group))
        except Exception as exc:
            if not self._conflict(exc):
                raise
        self.hold_many(group.held)
        applied = self.apply_many(group.transitions)
        accepted = self.accept_many(group.acceptances)
        self.record_polls(group.polls)
        return GroupOutcome(applied, accepted)

    def _append_batch(
        self,
        tx: Any,
        transitions: Sequence[Transition],
        first: Mapping[str, Transition],
        last: Mapping[str, Transition],
        chain_errors: Mapping[int, LedgerError],
        refused: set[str],
    ) -> None:
        """A batch's new task bindings and log rows, for every operation not ``refused``."""
        bound = sorted(
            k
            for k, t in last.items()
            if t.after.task_id is not None and t.after.task_id != first[k].before.task_id and k not in refused
        )
        bindings = [[last[k].after.server, last[k].after.task_id, k, last[k].at] for k in bound]
        if bindings:
            self._insert_many(tx, "task_bindings", bindings)
        logged = (
            [
                t
                for i, t in enumerate(transitions)
                if i not in chain_errors and t.after.operation_id not in refused
            ]
            if chain_errors or refused
            else transitions
        )
        if logged:
            self._append_log(tx, logged)

    def _append_log(self, tx: Any, transitions: Sequence[Transition]) -> None:
        """Append the transitions' log rows (a driver may build them by column)."""
        self._insert_many(tx, "transitions", [_transition_row(t) for t in transitions])

    def _acceptances(
        self,
        items: Sequence[tuple[Transition, Json | None]],
        current: Mapping[OperationId, Operation],
        errors: dict[int, LedgerError],
        refuse: Callable[[int, Transition], LedgerError | None] | None = None,
    ) -> list[AcceptanceRows]:
        """The rows of every acceptance ``check_acceptance`` allows against ``current``; each refusal
        (or ``refuse``'s, checked first) goes into ``errors`` by index instead."""
        accepted: list[AcceptanceRows] = []
        for i, (t, payload) in enumerate(items):
            if i in errors:
                continue
            if refuse is not None and (refusal := refuse(i, t)) is not None:
                errors[i] = refusal
                continue
            now = current.get(t.after.operation_id)
            try:
                receipt = check_acceptance(now, t, payload)
            except (StaleWrite, ReceiptConflict) as refused:
                errors[i] = refused
                continue
            assert now is not None
            accepted.append(acceptance_rows(now, t, payload, receipt))
        return accepted

    def _update_states(self, tx: Any, state_rows: Sequence[Sequence[object]]) -> None:
        """Compare-and-swap many ``rows._state_row`` rows whose operations the transaction holds."""
        tx.executemany(self._q(sql.STATE_UPDATE), [cas_params(r) for r in state_rows])

    def _write_acceptances(self, tx: Any, accepted: Sequence[AcceptanceRows]) -> None:
        """Write the state, transition, receipt, result and outbox rows of checked acceptances."""
        if not accepted:
            return
        self._update_states(tx, [a.state for a in accepted])
        self._insert_many(tx, "transitions", [a.transition for a in accepted])
        self._insert_many(tx, "receipts", [a.receipt for a in accepted])
        results = [a.result for a in accepted if a.result is not None]
        if results:
            self._insert_many(tx, "results", results)
        outbox = [a.outbox for a in accepted if a.outbox is not None]
        if outbox:
            self._serialise(tx, sql.OUTBOX_ORDER_LOCK)
            self._insert_many(tx, "outbox", outbox)

    def _write_acceptance(self, tx: Any, current: Operation, rows: AcceptanceRows) -> None:
        """One checked acceptance's rows; ``StaleWrite`` if ``current`` moved since it was read."""
        if self._affected(tx, sql.STATE_UPDATE, cas_params(rows.state)) != 1:
            raise StaleWrite(current.operation_id, current.row_version)
        tx.execute(self._q(sql.TRANSITION_INSERT), rows.transition)
        tx.execute(self._q(sql.RECEIPT_INSERT), rows.receipt)
        if rows.result is not None:
            tx.execute(self._q(sql.RESULT_INSERT), rows.result)
        if rows.outbox is not None:
            self._serialise(tx, sql.OUTBOX_ORDER_LOCK)
            tx.execute(self._q(sql.OUTBOX_INSERT), rows.outbox)

    def attach_audit_result(self, op: Operation, kind: str, payload: Json | None, at: datetime) -> None:
        """Attach something read after the terminal (e.g. a result read after cancel) to the audit trail.

        Never a success payload: it is written beside the receipt, not into it or the outbox.
        """
        with self._tx() as tx:
            tx.execute(self._q(sql.AUDIT_INSERT), audit_row(op, kind, payload, at))

    # ------------------------------------------------------------------ the outbox's consumers

    def outbox_ready(self, consumer: str, after: int | None, limit: int) -> list[dict[str, object]]:
        """``consumer``'s ready entries: those after ``after`` (its cursor; None: from the first) it
        has not acknowledged, in acceptance order, at most ``limit``.

        At-least-once: an entry stays ready for a consumer until that consumer acknowledges it, so
        a consumer that restarts with the cursor it had before receiving an entry receives it again.
        Each entry carries its receipt's status and digests and, for an accepted result, the payload
        as verified at acceptance; a cancelled call's entry carries the cancel evidence and no payload.
        """
        rows = self._rows(sql.OUTBOX_READY, [consumer, _FIRST_SEQ if after is None else after, limit])
        for row in rows:
            payload = row.pop("payload")
            row["result"] = None if payload is None else json.loads(str(payload))
        return rows

    def ack_outbox(
        self, consumer: str, call_node_id: str, status: str, result_digest: str | None, at: datetime
    ) -> OutboxAck:
        """Record that ``consumer``'s downstream advanced on the entry of ``call_node_id``.

        Idempotent per consumer: a second acknowledgement by the same consumer is a no-op (the
        first record stands, ``repeated``); another consumer's is its own record. The consumer says
        what it advanced on (``status``, ``result_digest``); an acknowledgement of an entry that does
        not exist, or that does not match it, is refused and the refusal recorded (the traceability
        gate counts refusals as advances that do not trace to a receipt).

        Raises:
            AckRefused: no such entry (``missing``), or its status or result digest differ.
        """
        with self._tx() as tx:
            entry = tx.execute(self._q(sql.OUTBOX_ENTRY), [call_node_id]).fetchone()
            reason = _ack_mismatch(entry, status, result_digest)
            if reason is None:
                assert entry is not None
                new = self._affected(
                    tx, sql.OUTBOX_ACK_INSERT, [consumer, call_node_id, entry[0], status, result_digest, at]
                )
                if new:
                    return OutboxAck(consumer, call_node_id, int(entry[0]), at, repeated=False)
                first = tx.execute(self._q(sql.OUTBOX_ACK_OF), [consumer, call_node_id]).fetchone()
                assert first is not None
                return OutboxAck(consumer, call_node_id, int(entry[0]), first[0], repeated=True)
            tx.execute(
                self._q(sql.OUTBOX_ACK_REFUSAL_INSERT),
                [consumer, call_node_id, status, result_digest, reason, at],
            )
        raise AckRefused(call_node_id, reason, missing=entry is None)

    def outbox_lag(self) -> list[dict[str, object]]:
        """Per consumer that has acknowledged an entry: acknowledged, behind, its last acknowledgement
        and the oldest entry it has not acknowledged."""
        return self._rows(sql.OUTBOX_LAG)

    # ------------------------------------------------------- polls, approvals and reconciliation

    def record_polls(self, rows: Sequence[PollRecord]) -> None:
        """Append protocol requests to the polls table (group-committed by the caller)."""
        if not rows:
            return
        with self._tx() as tx:
            self._insert_polls(tx, rows)

    def _insert_polls(self, tx: Any, rows: Sequence[PollRecord]) -> None:
        self._insert_many(tx, "polls", [list(r) for r in rows])

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
        params = [
            op.operation_id,
            op.input_round,
            op.input_request_key,
            message,
            canonical_json(requested_schema),
            schema_digest,
            deadline,
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

    def polls(self, operation_id: str | None = None) -> list[dict[str, object]]:
        if operation_id is None:
            return self._rows(sql.POLLS)
        return self._rows(sql.POLLS_OF, [operation_id])

    def hold_outcome(self, operation_id: str, held: HeldOutcome) -> None:
        """Keep a terminal outcome that arrived inline, so it survives a restart or the server's expiry."""
        self.hold_many([(operation_id, held)])

    def hold_many(self, items: Sequence[tuple[str, HeldOutcome]]) -> None:
        if not items:
            return
        with self._tx() as tx:
            self._insert_held(tx, items)

    def _insert_held(self, tx: Any, items: Sequence[tuple[str, HeldOutcome]]) -> None:
        self._insert_many(tx, "held_outcomes", held_rows(items), sql.HELD_REPLACE)

    def held_outcome(self, operation_id: str) -> HeldOutcome | None:
        row = self._fetchone(sql.HELD_OUTCOME, [operation_id])
        return None if row is None else held_from_row(operation_id, row)

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
        ``record_explorer_run``), nor are the rollout's state and hash-chained events. Columns a
        backend adds of its own (PostgreSQL's leases) are left empty.

        Returns:
            Rows imported per table.

        Raises:
            LedgerError: a table is not importable, or its columns do not match the schema.
        """
        prepared = self._import_plan(tables)
        counts: dict[str, int] = {}
        with self._tx() as tx:
            for table, rows in prepared:
                if table in SEQUENCED and rows.num_rows:
                    column, sequence = SEQUENCED[table]
                    ids = self._next_ids(tx, sequence, rows.num_rows)
                    rows = rows.append_column(column, pa.array(ids, pa.int64()))
                self._import_table(tx, table, rows)
                counts[table] = counts.get(table, 0) + rows.num_rows
        return counts

    @abstractmethod
    def _next_ids(self, tx: Any, sequence: str, n: int) -> list[int]:
        """``n`` consecutive numbers of ``sequence``, in order (the sequence moves past them)."""

    @abstractmethod
    def _import_table(self, tx: Any, table: str, rows: pa.Table) -> None:
        """Append ``rows`` to ``table``, columns matched by name."""

    # ------------------------------------------------------------ Parquet export (analysts)

    @abstractmethod
    def _read_batches(self) -> AbstractContextManager[Callable[[str], pa.RecordBatchReader]]:
        """One read-only transaction (a single instant); yields ``query -> record batches`` within it."""

    def export_parquet(self, folder: str | Path) -> dict[str, int]:
        """Write every documented table (``table_columns``) as Parquet under ``folder``; rows per table.

        All tables are read in one read-only transaction, so the files agree with each other as of
        one instant while writers go on; ``engine.ledger.export`` says how the files are laid out.
        Columns a backend adds of its own (PostgreSQL's leases) are left out, so both backends write
        the columns of ``docs/ledger.md``.

        Raises:
            LedgerUnavailable: the ledger cannot be read.
        """
        out = Path(folder)
        out.mkdir(parents=True, exist_ok=True)
        written: dict[str, int] = {}
        with self._read_batches() as read:
            for table, columns in sorted(self.table_columns().items()):
                own = set(self._unimported_columns.get(table, ()))
                kept = [c for c in columns if c not in own]
                written[table] = export.write_table(out, table, read(export.export_select(table, kept)))
        return written

    def _import_plan(self, tables: Mapping[str, pa.Table]) -> list[tuple[str, pa.Table]]:
        """``import_rows``' tables, checked: importable, with exactly the schema's columns (the
        sequence-numbered one left out)."""
        importable = _TABLES - NOT_IMPORTABLE
        schema = self.table_columns()
        prepared: list[tuple[str, pa.Table]] = []
        for table, rows in tables.items():
            if table not in importable:
                raise LedgerError(f"table {table!r} cannot be bulk-imported")
            left_empty = self._unimported_columns.get(table, ())
            expected = [c for c in schema[table] if c not in left_empty]
            if table in SEQUENCED:
                column, _ = SEQUENCED[table]
                if column in rows.column_names:
                    raise LedgerError(f"{table}.{column} is numbered by the ledger; leave it out")
                expected.remove(column)
            if sorted(rows.column_names) != sorted(expected):
                missing = sorted(set(expected) - set(rows.column_names))
                extra = sorted(set(rows.column_names) - set(expected))
                raise LedgerError(f"{table}: columns do not match (missing {missing}, unexpected {extra})")
            prepared.append((table, rows))
        return prepared

    # ---------------------------------------------------------------- explorer, settings, gates

    def record_explorer_run(self, run: ExplorerRun) -> int:
        """Append one explorer result (per scenario and protocol); returns its run id."""
        with self._tx() as tx:
            row = tx.execute(
                self._q(sql.EXPLORER_RUN_INSERT),
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
        return self._rows(sql.EXPLORER_RUNS)

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

    def put_setting(self, key: str, value: str, at: datetime) -> None:
        with self._tx() as tx:
            tx.execute(self._q(sql.SETTING_PUT), [key, value, at])

    def setting(self, key: str) -> str | None:
        row = self._fetchone(sql.SETTING, [key])
        return str(row[0]) if row else None

    def take_turn(self, job: str, at: datetime, every: timedelta) -> bool:
        """Whether the caller takes this interval's turn at ``job``, a periodic job that every
        process on the ledger runs but that must run once per interval for all of them together
        (the periodic gate run). The first caller once ``every`` (less a tenth, so that a turn is
        not lost to timer jitter) has passed since the last turn, by any process, takes it; the turn
        is recorded in the same transaction, under a lock on the job's name, so two processes
        never both take one. Whoever is alive takes the next turn: a dead process leaves no gap.
        """
        key = f"turn:{job}"
        with self._tx() as tx:
            self._serialise(tx, key)
            row = tx.execute(self._q(sql.SETTING), [key]).fetchone()
            if row is not None:
                last = datetime.fromisoformat(str(row[0]))
                if at - last < every * 0.9:
                    return False
            tx.execute(self._q(sql.SETTING_PUT), [key, at.isoformat(), at])
        return True

    def record_gate_run(self, results: Sequence[GateRecord], at: datetime) -> int:
        """Store one evaluation of the gates; returns its run id."""
        with self._tx() as tx:
            row = tx.execute(self._q(sql.GATE_RUN_ID), []).fetchone()
            assert row is not None
            run_id = int(row[0])
            if results:
                tx.executemany(
                    self._q(sql.GATE_RUN_INSERT),
                    [
                        [run_id, r.gate, r.passed, r.value, r.threshold, r.verdict, _json_text(r.inputs), at]
                        for r in results
                    ],
                )
        return run_id

    def gate_runs(self, limit: int = 500) -> list[dict[str, object]]:
        return self._rows(sql.GATE_RUNS, [limit])

    def record_denial(self, row: dict[str, object]) -> None:
        """Record one refused control-API attempt (``ACCESS_DENIAL_COLUMNS``)."""
        with self._tx() as tx:
            tx.execute(self._q(sql.DENIAL_INSERT), [row[c] for c in ACCESS_DENIAL_COLUMNS])

    def denials(self, *, limit: int = 100) -> list[dict[str, object]]:
        """Refused attempts, newest first."""
        return self._rows(sql.DENIALS, [limit])

    # --------------------------------------------------------------------------------- rollout
    # Persistence for ``rollout/``: the rollout state (with the execution epoch), its hash-chained
    # audit log, each operation's arm and the shadow comparisons. The decisions are rollout's.

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
            self._insert_many(
                tx,
                "rollout_assignments",
                [[r.get(c) for c in ASSIGNMENT_COLUMNS] for r in rows],
                sql.IGNORE_DUPLICATE,
            )

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

    # ----------------------------------------------------------------------------------- reads

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
