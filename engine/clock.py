"""Time for the engine: the ``Clock`` protocol and the system clock.

The only module of the house that reads the wall clock or sleeps (the reference servers, which must
not import the engine they test, have their own in ``refserver/clock.py``); everything else is handed
a ``Clock``, or measures elapsed time with ``monotonic_seconds``. Tests wait through
``engine.testing.wait`` (bounded), which sleeps through here.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current instant, timezone-aware UTC."""
        ...

    async def sleep(self, delay: timedelta) -> None: ...


class SystemClock:
    """Wall-clock time for production."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, delay: timedelta) -> None:
        await asyncio.sleep(max(0.0, delay.total_seconds()))

    def sleep_blocking(self, delay: timedelta) -> None:
        """Block the calling thread for ``delay``: for threads and scripts that run no event loop
        (a benchmark's pacing, the living demo, a bounded wait for a subprocess). Never on a loop."""
        time.sleep(max(0.0, delay.total_seconds()))


def monotonic_seconds() -> float:
    """A monotonic reading for measuring elapsed time (benchmarks, timeouts)."""
    return time.monotonic()


def thread_cpu_seconds() -> float:
    """The calling thread's own CPU time: what work cost, not the time a starved thread waited."""
    return time.thread_time()


__all__ = [
    "Clock",
    "SystemClock",
    "monotonic_seconds",
    "thread_cpu_seconds",
]
