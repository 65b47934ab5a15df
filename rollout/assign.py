"""Sticky canary bucketing: a call node's bucket is a stable hash of its key and the rollout salt.

Pure: no I/O, no clock, no randomness. ``bucket`` is sha256-based (never Python's ``hash()``, which
is salted per process), so every process and every restart puts a key in the same bucket. A key is
in the canary arm when its bucket is below the canary's size in basis points; growing the canary
only ever moves keys from control to canary, never back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

BUCKETS: Final = 10_000
"""Buckets per rollout; one bucket is one basis point (0.01 %) of traffic."""


class Arm(StrEnum):
    """Which path an operation was routed to."""

    CONTROL = "control"
    """The old path: the tool's configured server."""
    CANARY = "canary"
    """The new path: the tool's new-adapter server (``shadow_server`` in the configuration)."""
    SHADOW = "shadow"
    """A shadow copy on the new path, compared with its primary and never delivered."""
    FIXED = "fixed"
    """The tool has no new path; it is not part of the rollout."""


def bucket(call_node: str, salt: str) -> int:
    """The key's bucket in ``[0, BUCKETS)``: sha256 over salt and key, first 8 bytes, modulo."""
    digest = hashlib.sha256(f"{salt}\x00{call_node}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def arm_for(call_node: str, salt: str, canary_bp: int) -> Arm:
    """CANARY when the key's bucket is below ``canary_bp`` (basis points of traffic), else CONTROL."""
    return Arm.CANARY if bucket(call_node, salt) < canary_bp else Arm.CONTROL


def percent_to_bp(percent: float) -> int:
    """A canary size in percent (``5``, ``12.5``) as basis points.

    Raises:
        ValueError: not in (0, 100], or finer than 0.01 %.
    """
    if not 0 < percent <= 100:
        raise ValueError(f"a canary percentage must be in (0, 100], got {percent:g}")
    bp = round(percent * 100)
    if abs(bp - percent * 100) > 1e-6:
        raise ValueError(f"a canary percentage has at most two decimals (0.01 % steps), got {percent!r}")
    return bp


def bp_to_percent(bp: int) -> float:
    return bp / 100


@dataclass(frozen=True, slots=True)
class Key:
    """A call node the rollout has seen, with its operation's current standing."""

    call_node: str
    operation_id: str
    state: str
    in_flight: bool


@dataclass(frozen=True, slots=True)
class ArmFlip:
    """A key whose arm differs between two canary sizes."""

    call_node: str
    operation_id: str
    state: str
    in_flight: bool
    before: Arm
    after: Arm


@dataclass(frozen=True, slots=True)
class FlipReport:
    """Which known keys change arm when the canary goes from ``from_bp`` to ``to_bp``.

    An in-flight operation stays on the server it was submitted to (it is never moved or resent);
    the new arm applies to new call nodes. ``in_flight`` lists the operations that are now on the
    "wrong" arm and will finish where they are.
    """

    from_bp: int
    to_bp: int
    considered: int
    flips: tuple[ArmFlip, ...]

    @property
    def to_canary(self) -> tuple[ArmFlip, ...]:
        return tuple(f for f in self.flips if f.after is Arm.CANARY)

    @property
    def to_control(self) -> tuple[ArmFlip, ...]:
        return tuple(f for f in self.flips if f.after is Arm.CONTROL)

    @property
    def in_flight(self) -> tuple[ArmFlip, ...]:
        return tuple(f for f in self.flips if f.in_flight)

    def as_json(self, *, limit: int | None = None) -> dict[str, object]:
        """The report as JSON; ``limit`` caps each listed key list (counts stay exact)."""

        def rows(flips: tuple[ArmFlip, ...]) -> list[dict[str, object]]:
            chosen = flips if limit is None else flips[:limit]
            return [
                {
                    "call_node": f.call_node,
                    "operation_id": f.operation_id,
                    "state": f.state,
                    "from": f.before.value,
                    "to": f.after.value,
                }
                for f in chosen
            ]

        return {
            "from_percent": bp_to_percent(self.from_bp),
            "to_percent": bp_to_percent(self.to_bp),
            "keys_considered": self.considered,
            "keys_flipped": len(self.flips),
            "to_canary": len(self.to_canary),
            "to_control": len(self.to_control),
            "in_flight_affected": len(self.in_flight),
            "flipped": rows(self.flips),
            "in_flight": rows(self.in_flight),
            "note": "in-flight operations finish on the server they were submitted to; "
            "only new call nodes follow the new arm",
        }


def flip_report(keys: Iterable[Key], salt: str, from_bp: int, to_bp: int) -> FlipReport:
    """The arm-flip report for a change of canary size (0 = no canary, ``BUCKETS`` = everything)."""
    flips: list[ArmFlip] = []
    considered = 0
    for key in keys:
        considered += 1
        before = arm_for(key.call_node, salt, from_bp)
        after = arm_for(key.call_node, salt, to_bp)
        if before is not after:
            flips.append(ArmFlip(key.call_node, key.operation_id, key.state, key.in_flight, before, after))
    flips.sort(key=lambda f: f.call_node)
    return FlipReport(from_bp, to_bp, considered, tuple(flips))


__all__ = [
    "BUCKETS",
    "Arm",
    "ArmFlip",
    "FlipReport",
    "Key",
    "arm_for",
    "bp_to_percent",
    "bucket",
    "flip_report",
    "percent_to_bp",
]
