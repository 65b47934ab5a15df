"""Pure poll timing: the server's interval plus jitter, Retry-After, wait budgets, expiry and QPS windows.

No clock and no randomness of its own: instants come in as arguments and jitter is drawn from a
``random.Random`` the caller passes, so every schedule is reproducible from a seed.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True, slots=True)
class PollPolicy:
    """How to space polls when the server advises an interval (or does not)."""

    default_interval: timedelta = timedelta(seconds=1)
    min_interval: timedelta = timedelta(milliseconds=50)
    max_interval: timedelta = timedelta(seconds=30)
    jitter: float = 0.1
    """Fraction of the interval added at random, in [0, jitter), so that pollers spread out."""
    retry_backoff: timedelta = timedelta(milliseconds=200)
    """First wait after a failed request without Retry-After; doubles up to ``max_interval``."""

    def __post_init__(self) -> None:
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        if self.min_interval <= timedelta(0) or self.min_interval > self.max_interval:
            raise ValueError("need 0 < min_interval <= max_interval")


def poll_delay(policy: PollPolicy, advised: timedelta | None, rng: random.Random) -> timedelta:
    """The wait before the next poll: the server's advice (clamped) plus up to ``jitter`` of it.

    Jitter is only ever added, never subtracted, so a poll never comes earlier than the server asked.
    """
    base = advised if advised is not None else policy.default_interval
    base = min(max(base, policy.min_interval), policy.max_interval)
    return base + base * (policy.jitter * rng.random())


def retry_delay(
    policy: PollPolicy, attempt: int, retry_after: timedelta | None, rng: random.Random
) -> timedelta:
    """The wait after a failed request: the server's Retry-After when given, else capped exponential backoff.

    ``attempt`` counts consecutive failures from 1.
    """
    if retry_after is not None:
        return max(retry_after, timedelta(0)) + policy.min_interval * rng.random()
    exp = policy.retry_backoff * (2 ** max(0, min(attempt - 1, 16)))
    capped = min(exp, policy.max_interval)
    half: timedelta = capped / 2
    return half + half * rng.random()


def next_poll_at(
    now: datetime,
    delay: timedelta,
    *,
    deadline: datetime | None = None,
    expires_at: datetime | None = None,
) -> datetime | None:
    """When to poll next, or ``None`` when the wait budget is spent.

    Polls are not pushed past expiry: the last look happens at expiry at the latest, so that an
    outcome is still read before the server may delete it.
    """
    at = now + delay
    if expires_at is not None and at > expires_at > now:
        at = expires_at
    if deadline is not None and at > deadline:
        return None
    return at


class RateWindow:
    """At most ``limit`` requests in any half-open one-second window.

    A sliding log of the last ``limit`` send instants: the next send may go at
    ``oldest + window`` once the log is full. Pure: every call takes the current instant.
    """

    def __init__(self, limit: float, window: timedelta = timedelta(seconds=1)) -> None:
        if limit <= 0:
            raise ValueError("a rate limit must be positive")
        self.limit = int(limit) if limit >= 1 else 1
        self.window = window if limit >= 1 else window / limit
        self._sent: deque[datetime] = deque()

    def earliest(self, now: datetime) -> datetime:
        """The earliest instant a request may be sent without breaking the limit."""
        self._expire(now)
        if len(self._sent) < self.limit:
            return now
        return self._sent[0] + self.window

    def take(self, now: datetime) -> bool:
        """Record a send at ``now`` if allowed; False (and nothing recorded) if it would break the limit."""
        self._expire(now)
        if len(self._sent) >= self.limit:
            return False
        self._sent.append(now)
        return True

    def slot(self, now: datetime) -> datetime:
        """The earliest instant, not before ``now`` nor before any reservation, that keeps the limit."""
        self._expire(now)
        at = max(now, self._sent[-1]) if self._sent else now
        if len(self._sent) >= self.limit:
            at = max(at, self._sent[-self.limit] + self.window)
        return at

    def reserve(self, at: datetime) -> None:
        """Book a send at ``at`` (from ``slot``); reservations are kept in time order."""
        if self._sent and at < self._sent[-1]:
            raise ValueError("reservations must not go back in time")
        self._sent.append(at)

    def _expire(self, now: datetime) -> None:
        edge = now - self.window
        while self._sent and self._sent[0] <= edge:
            self._sent.popleft()


def busiest_window(sent: list[datetime], window: timedelta = timedelta(seconds=1)) -> int:
    """The largest number of instants that fall in any half-open window of the given length."""
    ordered = sorted(sent)
    best = 0
    start = 0
    for end, at in enumerate(ordered):
        while ordered[start] <= at - window:
            start += 1
        best = max(best, end - start + 1)
    return best


def wait_budget_end(created_at: datetime, budget: timedelta) -> datetime:
    """When an operation's wait budget runs out: counted from its creation, so a restart or a
    person's answer never extends it."""
    return created_at + budget


__all__ = [
    "PollPolicy",
    "RateWindow",
    "busiest_window",
    "next_poll_at",
    "poll_delay",
    "retry_delay",
    "wait_budget_end",
]
