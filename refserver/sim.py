"""The ``_sim`` argument object: how one simulated tool call behaves. Pure parsing, no I/O.

Every duration in ``_sim`` is written in unscaled milliseconds and multiplied by the server's
``--time-scale`` here, once, so the rest of the server only ever sees real seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from refserver.fault import FaultError, FaultRequest, parse_fault_refs

SIM_KEY = "_sim"
DEFAULT_POLL_INTERVAL_MS = 500.0
DEFAULT_TTL_MS = 60_000.0
# Calls shorter than this (unscaled) answer synchronously on the 2026-07-28 extension.
SHORT_CALL_MS = 50.0
_FIELDS = frozenset(
    {"duration_ms", "outcome", "input_rounds", "poll_interval_ms", "ttl_ms", "result_bytes", "faults"}
)


class SimOutcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    IS_ERROR = "is_error"


class SimError(ValueError):
    """A ``_sim`` object that cannot be understood; the message names the field."""


@dataclass(frozen=True, slots=True)
class SimSpec:
    """One call's simulated behaviour, durations already scaled to real seconds."""

    duration_ms: float
    duration_s: float
    outcome: SimOutcome
    input_rounds: int
    poll_interval_s: float
    ttl_s: float | None
    result_bytes: int | None
    faults: tuple[FaultRequest, ...]

    @property
    def is_short(self) -> bool:
        return self.duration_ms < SHORT_CALL_MS


def _number(raw: Mapping[str, Any], name: str, default: float) -> float:
    value = raw.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise SimError(f"_sim.{name} must be a number >= 0, got {value!r}")
    return float(value)


def _count(raw: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = raw.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SimError(f"_sim.{name} must be an integer >= 0, got {value!r}")
    return value


def split_arguments(arguments: Mapping[str, Any]) -> tuple[dict[str, Any], object]:
    """Separate the tool's own arguments (the echo) from the ``_sim`` object."""
    echo = {k: v for k, v in arguments.items() if k != SIM_KEY}
    return echo, arguments.get(SIM_KEY)


def parse_sim(raw: object, *, default_duration_ms: float, time_scale: float) -> SimSpec:
    """Validate ``_sim`` (absent means all defaults) and scale its durations.

    Raises:
        SimError: a field has the wrong type or range, or an unknown field or fault is named.
    """
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SimError(f"_sim must be an object, got {raw!r}")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise SimError(f"unknown _sim field(s): {', '.join(sorted(map(str, unknown)))}")
    outcome_raw = raw.get("outcome", SimOutcome.COMPLETED.value)
    try:
        outcome = SimOutcome(outcome_raw)
    except ValueError:
        raise SimError(
            f"_sim.outcome must be one of completed, failed, is_error; got {outcome_raw!r}"
        ) from None
    try:
        faults = parse_fault_refs(raw.get("faults"))
    except FaultError as exc:
        raise SimError(f"_sim.faults: {exc}") from exc
    duration_ms = _number(raw, "duration_ms", default_duration_ms)
    ttl_ms = raw.get("ttl_ms")
    ttl_s = None if ttl_ms is None else _number(raw, "ttl_ms", DEFAULT_TTL_MS) * time_scale / 1000.0
    return SimSpec(
        duration_ms=duration_ms,
        duration_s=duration_ms * time_scale / 1000.0,
        outcome=outcome,
        input_rounds=_count(raw, "input_rounds", 0) or 0,
        poll_interval_s=_number(raw, "poll_interval_ms", DEFAULT_POLL_INTERVAL_MS) * time_scale / 1000.0,
        ttl_s=ttl_s,
        result_bytes=_count(raw, "result_bytes", None),
        faults=faults,
    )


__all__ = [
    "DEFAULT_POLL_INTERVAL_MS",
    "DEFAULT_TTL_MS",
    "SHORT_CALL_MS",
    "SIM_KEY",
    "SimError",
    "SimOutcome",
    "SimSpec",
    "parse_sim",
    "split_arguments",
]
