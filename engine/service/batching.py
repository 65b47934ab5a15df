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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from engine.acceptance import receipt_of
from engine.ledger import BatchOutcome, HeldOutcome, Json, Ledger, PollRecord
from engine.model import Operation, Receipt, Transition


class BatchingLedger(Ledger):
    """The same ledger file and API, with ``apply`` and ``record_polls`` deferred to ``flush``."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner._root, inner.path, inner.read_only)
        self._pending: list[Transition] = []
        self._overlay: dict[str, Operation] = {}
        self._polls: list[PollRecord] = []
        self._held: list[tuple[str, HeldOutcome]] = []
        self._accepts: list[tuple[Transition, Json | None]] = []
        self.flushed_transitions = 0
        self.flushed_acceptances = 0
        self._immediate = 0

    # Writes that wait for the tick's flush -------------------------------------------------

    @contextmanager
    def immediate(self) -> Iterator[None]:
        """Within this block writes commit at once (after everything buffered): person actions
        such as a cancel must be durable, and win or lose their compare-and-swap, right away."""
        self.flush()
        self._immediate += 1
        try:
            yield
        finally:
            self._immediate -= 1

    def apply(self, transition: Transition) -> Operation:
        if self._immediate:
            return super().apply(transition)
        self._pending.append(transition)
        self._overlay[transition.after.operation_id] = transition.after
        return transition.after

    def record_polls(self, rows: Sequence[PollRecord]) -> None:
        self._polls.extend(rows)

    def hold_outcome(self, operation_id: str, held: HeldOutcome) -> None:
        if self._immediate:
            super().hold_outcome(operation_id, held)
            return
        self._held.append((operation_id, held))

    def get(self, operation_id: str) -> Operation | None:
        pending = self._overlay.get(operation_id)
        return pending if pending is not None else super().get(operation_id)

    def accept_terminal(self, transition: Transition, payload: Json | None) -> Receipt:
        if self._immediate:
            self.flush()
            return super().accept_terminal(transition, payload)
        receipt = receipt_of(transition)  # not an acceptance at all: refused now, not at flush
        self._accepts.append((transition, payload))
        self._overlay[transition.after.operation_id] = transition.after
        return receipt

    def flush(self) -> list[tuple[Transition, BatchOutcome]]:
        """Commit everything buffered in one transaction; return the transitions that were refused."""
        pending, self._pending = self._pending, []
        self._overlay.clear()
        polls, self._polls = self._polls, []
        held, self._held = self._held, []
        accepts, self._accepts = self._accepts, []
        if held:
            super().hold_many(held)
        refused: list[tuple[Transition, BatchOutcome]] = []
        if pending:
            outcomes = super().apply_many(pending)
            self.flushed_transitions += len(pending)
            refused = [(t, o) for t, o in zip(pending, outcomes, strict=True) if o.error is not None]
        if accepts:
            # After the transitions: an acceptance's expected row is the one they leave behind.
            outcomes = super().accept_many(accepts)
            self.flushed_acceptances += len(accepts)
            refused += [(t, o) for (t, _), o in zip(accepts, outcomes, strict=True) if o.error is not None]
        if polls:
            super().record_polls(polls)
        return refused

    @property
    def pending(self) -> int:
        return len(self._pending) + len(self._polls) + len(self._held) + len(self._accepts)
