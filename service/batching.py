"""Group commit for the service: a ledger whose transition and poll writes are buffered until ``flush``.

The service's scheduler advances many operations per tick and flushes once per tick, so thousands
of transitions share one transaction. The order that matters is kept: a tick's network requests
act only on state flushed by an earlier tick, so "record, then send" still holds. A write that
loses its compare-and-swap at flush time is reported back so the scheduler reloads that operation.

Acceptances are group-committed too (``Ledger.accept_many``): each is still matched by the single
acceptance rule inside the flush's transaction, against the row as the database holds it, and
the receipt and its outbox entry are written in that same transaction. Nothing is sent after an
acceptance, so deferring its commit to the tick's flush delays only the caller's view of it; a
refused acceptance comes back like a refused transition and the scheduler reloads the operation.
Inside ``immediate()`` (person actions) it commits at once, as before.

It wraps any ``engine.ledger.LedgerPort`` by delegation (DuckDB's ``Ledger``, PostgreSQL's
``PgLedger`` or a fenced handle of it): every call it does not buffer goes to ``inner`` unchanged.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from engine.acceptance import receipt_of
from engine.ledger.port import BatchOutcome, HeldOutcome, Json, PollRecord, WriteGroup, refusals
from engine.model import Operation, Receipt, Transition

if TYPE_CHECKING:
    from engine.ledger.port import LedgerPort


class BatchingLedger:
    """The same ledger API, with ``apply``, ``record_polls``, held outcomes and acceptances deferred to ``flush``.

    ``inner`` may be swapped between flushes (the executor does so when its fence changes).
    """

    def __init__(self, inner: LedgerPort) -> None:
        self.inner = inner
        self._pending: list[Transition] = []
        self._overlay: dict[str, Operation] = {}
        self._polls: list[PollRecord] = []
        self._held: list[tuple[str, HeldOutcome]] = []
        self._accepts: list[tuple[Transition, Json | None]] = []
        self._committing: dict[str, Operation] = {}
        self._commit_lock = threading.RLock()
        self.flushed_transitions = 0
        self.flushed_acceptances = 0
        self.flushes = 0
        """Write transactions issued through this store: group commits and immediate writes alike."""
        self._immediate = 0
        self._grouped = 0

    def __getattr__(self, name: str) -> Any:
        # Everything not buffered here is the wrapped ledger's own (reads, creation, approvals, ...).
        if name == "inner":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    # Writes that wait for the tick's flush ---------------------------------------------------------

    @contextmanager
    def immediate(self) -> Iterator[None]:
        """Within this block writes commit at once (after everything buffered): person actions
        such as a cancel must be durable, and win or lose their compare-and-swap, right away.

        Inside ``grouped()`` the writes join the group instead, which commits as one at its end.
        """
        if self._grouped:
            yield
            return
        # The lock keeps a person's write from racing a group commit running on the writer thread.
        with self._commit_lock:
            self.flush()
            self._immediate += 1
            try:
                yield
            finally:
                self._immediate -= 1

    @contextmanager
    def grouped(self) -> Iterator[list[tuple[Transition, BatchOutcome]]]:
        """Person actions that arrived together: their writes commit in ONE transaction at the end.

        Everything buffered before is committed first, so the actions act on durable rows. The
        yielded list receives every refusal (of the first flush and of the group's own commit);
        the caller answers each action only after this block, i.e. once its write is durable.
        """
        refused: list[tuple[Transition, BatchOutcome]] = []
        with self._commit_lock:
            refused += self.flush()
            self._grouped += 1
            try:
                yield refused
            finally:
                self._grouped -= 1
                refused += self.flush()

    def apply(self, transition: Transition) -> Operation:
        if self._immediate:
            self.flushes += 1
            return self.inner.apply(transition)
        self._pending.append(transition)
        self._overlay[transition.after.operation_id] = transition.after
        return transition.after

    def record_polls(self, rows: Sequence[PollRecord]) -> None:
        self._polls.extend(rows)

    def hold_outcome(self, operation_id: str, held: HeldOutcome) -> None:
        if self._immediate:
            self.flushes += 1
            self.inner.hold_outcome(operation_id, held)
            return
        self._held.append((operation_id, held))

    def get(self, operation_id: str) -> Operation | None:
        pending = self._overlay.get(operation_id) or self._committing.get(operation_id)
        return pending if pending is not None else self.inner.get(operation_id)

    def accept_terminal(self, transition: Transition, payload: Json | None) -> Receipt:
        if self._immediate:
            self.flush()
            self.flushes += 1
            return self.inner.accept_terminal(transition, payload)
        receipt = receipt_of(transition)  # not an acceptance at all: refused now, not at flush
        self._accepts.append((transition, payload))
        self._overlay[transition.after.operation_id] = transition.after
        return receipt

    # Committing -----------------------------------------------------------------------------------

    def take(self) -> WriteGroup:
        """Hand over everything buffered as one group (on the loop's thread); new writes start a new one.

        Until ``settle``, ``get`` still answers from the taken writes, so the loop never reads a
        row older than what it already wrote.
        """
        group = WriteGroup(tuple(self._pending), tuple(self._accepts), tuple(self._polls), tuple(self._held))
        self._committing.update(self._overlay)
        self._overlay = {}
        self._pending, self._accepts, self._polls, self._held = [], [], [], []
        return group

    def commit(self, group: WriteGroup) -> list[tuple[Transition, BatchOutcome]]:
        """Commit a taken group in one transaction (callable from a writer thread); return the refusals."""
        if group.empty:
            return []
        with self._commit_lock:
            outcome = self.inner.commit_group(group)
        self.flushes += 1
        self.flushed_transitions += len(group.transitions)
        self.flushed_acceptances += len(group.acceptances)
        refused = [(group.transitions[i], BatchOutcome(None, e)) for i, e in refusals(outcome.transitions)]
        refused += [
            (group.acceptances[i][0], BatchOutcome(None, e)) for i, e in refusals(outcome.acceptances)
        ]
        return refused

    def settle(self) -> None:
        """The taken group is durable (or refused and reported): reads go to the ledger again."""
        self._committing = {}

    def flush(self) -> list[tuple[Transition, BatchOutcome]]:
        """Commit everything buffered now, on this thread; return the transitions that were refused."""
        try:
            return self.commit(self.take())
        finally:
            self.settle()

    @property
    def pending(self) -> int:
        return len(self._pending) + len(self._polls) + len(self._held) + len(self._accepts)


__all__ = [
    "BatchingLedger",
]
