"""Time for the reference server: a monotonic clock protocol, the system clock and a fake one.

Task deadlines are arithmetic on a monotonic float (seconds), so wall-clock jumps cannot reorder a
task's history; wall ``datetime``s are only an anchor for rendering ISO timestamps. The one module of ``refserver``
that reads time or sleeps (``pause``: the HTTP layer's waits and a simulated tool's work): the
reference servers must not import the engine they test, so they do not use ``engine.clock``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    """A monotonic reading plus a wall-clock anchor."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards; only differences mean anything."""
        ...

    def now(self) -> datetime:
        """The current instant, timezone-aware UTC."""
        ...


class SystemClock:
    """The real clocks of this process."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)


async def pause(seconds: float) -> None:
    """Wait ``seconds`` on the event loop (an advised delay, a tool's simulated work, a poll's pace)."""
    await asyncio.sleep(seconds)


class FakeClock:
    """A clock that moves only when told to, for unit tests of the pure task logic."""

    def __init__(self, start: datetime | None = None) -> None:
        self._start = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._elapsed = 0.0

    def monotonic(self) -> float:
        return 1000.0 + self._elapsed

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._elapsed)

    def advance(self, seconds: float) -> None:
        """Move time forward; negative steps are refused because the clock is monotonic."""
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go backwards")
        self._elapsed += seconds


class WallAnchor:
    """Maps monotonic readings to UTC instants, fixed once so rendered times stay consistent."""

    def __init__(self, clock: Clock) -> None:
        self._mono0 = clock.monotonic()
        self._wall0 = clock.now()

    def at(self, mono: float) -> datetime:
        return self._wall0 + timedelta(seconds=mono - self._mono0)

    def iso(self, mono: float) -> str:
        """ISO 8601 in UTC with millisecond precision and a ``Z`` suffix."""
        return self.at(mono).isoformat(timespec="milliseconds").replace("+00:00", "Z")


__all__ = [
    "Clock",
    "FakeClock",
    "SystemClock",
    "WallAnchor",
    "pause",
]
