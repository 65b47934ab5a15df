"""The shared SQL ledger's acceptances (receipts, results, outbox rows) and the outbox's consumers.

Every acceptance is decided by ``engine.acceptance.check_acceptance`` against the row the
transaction reads (or, in DuckDB's group commit, the row its compare-and-swap proves unchanged:
``duckdb._unread_rows``); this module writes the rows an allowed one produces
(``rows.acceptance_rows``) and serves the outbox (ready entries, acknowledgements, lag). The
driver's ``accept_terminal`` and ``_accept_batch`` say how the rows are locked and read.

It must not import a database driver, write a receipt any other way, or decide states.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from engine.acceptance import check_acceptance, receipt_of
from engine.errors import AckRefused, LedgerError, ReceiptConflict, StaleWrite
from engine.ledger import sql
from engine.ledger.core import SqlCore, cas_params
from engine.ledger.port import BatchOutcome, Json, OutboxAck, Outcomes
from engine.ledger.rows import AcceptanceRows, acceptance_rows, audit_row
from engine.model import Operation, OperationId, Receipt, Transition

__all__ = ["Receipts", "accept_each", "acceptance_outcomes", "repeated_acceptances"]

_FIRST_SEQ: Final = -(2**62)
"""Below every outbox ``seq`` (rows from before the numbering migration are numbered at or below 0)."""


def accept_each(
    accept: Callable[[Transition, Json | None], Receipt],
    items: Sequence[tuple[Transition, Json | None]],
    *,
    conflict: Callable[[Exception], bool] | None = None,
) -> list[BatchOutcome]:
    """Accept ``items`` one at a time through ``accept`` (each ledger's ``accept_terminal``): a refused
    item (``StaleWrite``, ``ReceiptConflict``) is named in its outcome and does not stop the others.

    ``conflict`` says whether a database error is a uniqueness refusal (the SQL ledgers): then the
    call node already holds a receipt, and the item is refused as a ``ReceiptConflict``.
    """
    out: list[BatchOutcome] = []
    for t, payload in items:
        try:
            accept(t, payload)
            out.append(BatchOutcome(t.after, None))
        except (StaleWrite, ReceiptConflict) as refusal:
            out.append(BatchOutcome(None, refusal))
        except Exception as exc:
            if conflict is None or not conflict(exc):
                raise
            # The database's uniqueness refused it: this call node already holds a receipt.
            receipt = receipt_of(t)
            out.append(
                BatchOutcome(
                    None, ReceiptConflict(receipt.call_node_id, "receipt", "already written", "a second one")
                )
            )
    return out


def _ack_mismatch(entry: tuple[Any, ...] | None, status: str, result_digest: str | None) -> str | None:
    """Why an acknowledgement does not match the entry (``seq, status, result_digest``), or None."""
    if entry is None:
        return "no such outbox entry"
    if entry[1] != status:
        return f"the entry's status is {entry[1]!r}, the acknowledgement says {status!r}"
    if entry[2] != result_digest:
        return f"the entry's result digest is {entry[2]!r}, the acknowledgement says {result_digest!r}"
    return None


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


def acceptance_outcomes(
    items: Sequence[tuple[Transition, Json | None]], errors: Mapping[int, LedgerError]
) -> Outcomes:
    """A batch of acceptances' outcomes: refused where ``errors`` says, else the accepted operation."""
    return Outcomes([None if i in errors else t.after for i, (t, _) in enumerate(items)], errors)


class Receipts(SqlCore):
    """Acceptances (the only writer of receipts and outbox rows) and the outbox's consumers."""

    @abstractmethod
    def accept_terminal(self, transition: Transition, payload: Json | None) -> Receipt:
        """The single acceptance point (each driver says how it locks the row)."""

    @abstractmethod
    def _accept_batch(self, items: Sequence[tuple[Transition, Json | None]]) -> Sequence[BatchOutcome]:
        """Many acceptances in one transaction, each matched on its own."""

    def accept_many(self, items: Sequence[tuple[Transition, Json | None]]) -> Sequence[BatchOutcome]:
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
        return accept_each(self.accept_terminal, items, conflict=self._conflict)

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
        self._write_receipt_rows(tx, accepted)

    def _write_receipt_rows(self, tx: Any, accepted: Sequence[AcceptanceRows]) -> None:
        """The receipt, result and outbox rows of checked acceptances whose state and transition
        rows are written (``_write_acceptances``, or with the rest of a group: DuckDB)."""
        if not accepted:
            return
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
