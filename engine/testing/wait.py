"""The one bounded wait of the tests, the service-process helper and the benchmarks: poll a predicate.

``wait_until`` (a thread) and ``wait_until_async`` (on an event loop) ask ``predicate`` every
``every`` seconds until it returns something truthy, and fail with ``AssertionError`` naming
``what`` once ``timeout`` (``within``) seconds have passed. They never wait for time itself to pass: a wait is
always for a condition, and always ends. Time is read and slept through ``engine.clock``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from engine.clock import SystemClock, monotonic_seconds

T = TypeVar("T")
_CLOCK = SystemClock()


@dataclass(frozen=True, slots=True)
class _Deadline:
    """When a wait for ``what`` gives up, and how long it pauses between looks."""

    what: str
    timeout: float
    every: timedelta
    ends_at: float

    @classmethod
    def start(cls, what: str, timeout: float, every: float) -> _Deadline:
        return cls(what, timeout, timedelta(seconds=every), monotonic_seconds() + timeout)

    def check(self) -> None:
        """Fail the wait once its time is spent."""
        if monotonic_seconds() >= self.ends_at:
            raise AssertionError(f"timed out after {self.timeout} s waiting for {self.what}")


def wait_until(
    predicate: Callable[[], T], *, timeout: float = 30.0, every: float = 0.05, what: str = "condition"
) -> T:
    """Poll ``predicate`` every ``every`` seconds until it returns something truthy (returned), for at
    most ``timeout`` seconds (then AssertionError). A predicate that costs a query wants a longer ``every``."""
    deadline = _Deadline.start(what, timeout, every)
    while not (value := predicate()):
        deadline.check()
        _CLOCK.sleep_blocking(deadline.every)
    return value


async def wait_until_async(
    predicate: Callable[[], T], *, within: float = 30.0, every: float = 0.05, what: str = "condition"
) -> T:
    """``wait_until`` on an event loop: the loop runs other tasks (an executor under test) between
    looks. (``within``, not ``timeout``: the deadline is the wait's own, not an ``asyncio.timeout``.)"""
    deadline = _Deadline.start(what, within, every)
    while not (value := predicate()):
        deadline.check()
        await _CLOCK.sleep(deadline.every)
    return value


__all__ = [
    "wait_until",
    "wait_until_async",
]
