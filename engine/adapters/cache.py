"""Inline outcomes an adapter handed out, kept in memory so ``fetch_result`` can return them again.

A synchronous answer has no task id to re-read, so this is the only copy the adapter has; it is a
courtesy cache, not storage: the runtime must persist the outcome it got from ``submit``.
"""

from __future__ import annotations

from collections import OrderedDict

from engine.adapters.base import Outcome
from engine.errors import NotFoundOnServer
from engine.model import Operation, OperationId


class InlineOutcomes:
    """A bounded map from operation id to the inline outcome its submission returned."""

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._held: OrderedDict[OperationId, Outcome] = OrderedDict()

    def keep(self, op: Operation, outcome: Outcome) -> Outcome:
        self._held[op.operation_id] = outcome
        self._held.move_to_end(op.operation_id)
        while len(self._held) > self._capacity:
            self._held.popitem(last=False)
        return outcome

    def get(self, op: Operation) -> Outcome:
        """The held outcome, or ``NotFoundOnServer``: without a task there is nothing to read back."""
        outcome = self._held.get(op.operation_id)
        if outcome is None:
            raise NotFoundOnServer(
                f"operation {op.operation_id} ran without a task and this adapter no longer holds its outcome"
            )
        return outcome


__all__ = [
    "InlineOutcomes",
]
