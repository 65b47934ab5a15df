"""The executor's epoch decisions: the epoch a (re)started executor runs at, which operations it
adopts after a rollback, which value of an operation it advances, and what a fenced write the
ledger refused means for its writer (adopt at the raised epoch, or drop a taken-over lease).

These change outcomes (an executor at a stale epoch strands its work; an operation left behind the
epoch is never driven again; an old value advanced after a rollback acts on a superseded row), so
they live in one pure place: the service executor (``service/executor``) calls them, and so does
the explorer's executor actor (``engine.explore.shipped``), which is how the explorer runs them.
Must not do I/O: the caller reads the ledger and hands the values in.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from datetime import datetime

from engine.errors import EpochMoved, LeaseLost
from engine.machine import step
from engine.model import RECEIPT_STATES, Epoch, EpochRaised, Operation, OperationId, Transition


def startup_epoch(configured: Epoch, recorded: int | None) -> Epoch:
    """The epoch an executor starts at: the one the ledger recorded (a rollback raised it, and it
    survives restarts), else the configured one."""
    if recorded is not None and recorded != configured:
        return Epoch(recorded)
    return configured


def is_behind(op: Operation, epoch: Epoch) -> bool:
    """Whether ``op`` was last driven under an epoch older than ``epoch`` (a rollback happened)."""
    return op.epoch < epoch


def behind(ops: Iterable[Operation], epoch: Epoch) -> list[Operation]:
    """The live operations to adopt at ``epoch``: recorded under an older epoch, without a receipt."""
    return [op for op in ops if is_behind(op, epoch) and op.state not in RECEIPT_STATES]


def adoption(op: Operation, epoch: Epoch, actor: str, now: datetime) -> Transition:
    """Adopt ``op`` at ``epoch``: ``EpochRaised`` through ``step`` (its state carries over)."""
    return step(op, EpochRaised(epoch, actor), now)


def to_advance(op: Operation, epoch: Epoch, read: Callable[[OperationId], Operation | None]) -> Operation:
    """The value to advance: one from before a rollback is replaced by the ledger's (adopted) row."""
    if is_behind(op, epoch):
        return read(op.operation_id) or op
    return op


class Refusal(enum.Enum):
    """What the writer of a fenced write the ledger refused does with the operation."""

    ADOPT = "adopt"
    """The execution epoch was raised (a rollback, maybe through another executor): the lease is
    still the writer's, so it adopts the operation at the new epoch and goes on driving it."""
    DROP = "drop"
    """The lease was taken over (or released): another executor drives the operation now."""


def refusal(error: LeaseLost) -> Refusal:
    """The one decision for every fenced write refused (group commits, advances, adoption, and the
    holder's own cancel, answer, resolution and resubmission): an epoch refusal is not a takeover.

    Dropping an operation whose write was refused only for the epoch left it leased (and renewed)
    by its executor but driven by nobody: never adopted, never finished.
    """
    return Refusal.ADOPT if isinstance(error, EpochMoved) else Refusal.DROP


def urgent(op: Operation) -> bool:
    """Whether ``op``'s requests go ahead of routine polls: a cancel is recorded and not yet settled."""
    return op.cancel_generation > 0 and op.state not in RECEIPT_STATES


__all__ = [
    "Refusal",
    "adoption",
    "behind",
    "is_behind",
    "refusal",
    "startup_epoch",
    "to_advance",
    "urgent",
]
