"""Rule sets the explorer runs: the engine's own, and deliberately broken variants that it must catch.

``ENGINE`` is ``engine.machine.step`` (memoised: it is pure, so a repeated ``(operation, event,
now)`` returns the very transition it returned before) with the driver's reactions. Each broken
variant wraps ``step`` or flips one executor reaction; none of them touches a production code
path. Used by the explorer and its tests only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from engine.explore.executor import Reactions
from engine.machine import step as engine_step
from engine.model import (
    CancelAcknowledged,
    CancelConfirmed,
    CancelRefusedTerminal,
    Event,
    LocalState,
    Operation,
    Protocol,
    ResultVerified,
    ServerStatus,
    StatusObserved,
    Transition,
)

StepFn = Callable[[Operation, Event, datetime], Transition]

_CACHE_LIMIT = 200_000
_CACHES: list[dict[tuple[Operation, Event, datetime], Transition]] = []


def memoised(fn: StepFn) -> StepFn:
    """``fn`` with its results kept by argument (``fn`` must be pure, as ``step`` is)."""
    cache: dict[tuple[Operation, Event, datetime], Transition] = {}
    _CACHES.append(cache)

    def cached(op: Operation, event: Event, now: datetime) -> Transition:
        key = (op, event, now)
        hit = cache.get(key)
        if hit is None:
            if len(cache) >= _CACHE_LIMIT:
                cache.clear()
            hit = cache[key] = fn(op, event, now)
        return hit

    return cached


def clear_caches() -> None:
    """Forget every memoised transition (benchmarks measure from a cold start)."""
    for cache in _CACHES:
        cache.clear()


@dataclass(frozen=True, slots=True)
class Rules:
    """A transition function plus the executor's reactions, under a name recorded with each run."""

    name: str
    summary: str
    step: StepFn = field(compare=False)
    reactions: Reactions = field(default_factory=Reactions)


# ------------------------------------------------------------------------------- broken steps


def _late_completion(op: Operation, event: Event, now: datetime) -> Transition:
    """Broken: a completion that arrives after the cancel was accepted is taken up again."""
    late = isinstance(event, StatusObserved | ResultVerified) and event.status is ServerStatus.COMPLETED
    if op.state is LocalState.CANCELLED_ACCEPTED and late:
        t = engine_step(replace(op, state=LocalState.WORKING), event, now)
        return replace(t, before=op, reason="late completion taken up")
    return engine_step(op, event, now)


def _ignore_generation(op: Operation, event: Event, now: datetime) -> Transition:
    """Broken: a cancel reply counts for the current cancel, whatever generation it answered."""
    if isinstance(event, CancelConfirmed | CancelAcknowledged | CancelRefusedTerminal):
        event = replace(event, generation=op.cancel_generation)
    return engine_step(op, event, now)


def _ack_as_terminal(op: Operation, event: Event, now: datetime) -> Transition:
    """Broken: a 2026-07-28 cancel acknowledgement is read as the cancelled terminal state."""
    if isinstance(event, CancelAcknowledged) and op.protocol is Protocol.MCP_2026_07_28:
        event = CancelConfirmed(event.task_id, event.generation, event.epoch)
    return engine_step(op, event, now)


def _stale_epoch_result(op: Operation, event: Event, now: datetime) -> Transition:
    """Broken: a result echoing another execution epoch is accepted as if it were current."""
    if isinstance(event, ResultVerified) and event.epoch != op.epoch:
        event = replace(event, epoch=op.epoch)
    return engine_step(op, event, now)


def _make() -> dict[str, Rules]:
    return {
        rules.name: rules
        for rules in (
            Rules("engine", "engine.machine.step with the driver's reactions", memoised(engine_step)),
            Rules(
                "accept-late-completion",
                "a completion after the cancel was accepted is taken up",
                memoised(_late_completion),
            ),
            Rules(
                "skip-fetch",
                "completed is accepted without fetching the result",
                memoised(engine_step),
                Reactions(skip_fetch=True),
            ),
            Rules(
                "new-key-on-unknown",
                "SUBMISSION_UNKNOWN resubmits under a new key instead of looking up",
                memoised(engine_step),
                Reactions(new_key_on_unknown=True),
            ),
            Rules(
                "ignore-cancel-generation",
                "cancel replies count whatever generation they answer",
                memoised(_ignore_generation),
            ),
            Rules(
                "ack-as-terminal",
                "a 2026-07-28 cancel acknowledgement is taken as cancelled",
                memoised(_ack_as_terminal),
            ),
            Rules(
                "driver-epoch-stamp",
                "engine/runtime/driver.py as written: a creating/lookup response is stamped with the "
                "epoch of the reloaded operation, not the epoch it was sent under",
                memoised(engine_step),
                Reactions(stamp_current_epoch=True),
            ),
            Rules(
                "stale-epoch-result",
                "a result from another execution epoch is accepted",
                memoised(_stale_epoch_result),
            ),
        )
    }


RULES: dict[str, Rules] = _make()
ENGINE = RULES["engine"]
BROKEN: tuple[str, ...] = tuple(name for name in RULES if name != "engine")


__all__ = [
    "BROKEN",
    "ENGINE",
    "RULES",
    "Rules",
    "StepFn",
    "clear_caches",
    "memoised",
]
