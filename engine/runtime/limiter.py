"""The QPS budget at run time: per-server and global request windows, waited out on the injected clock.

Every protocol request passes ``acquire`` first. The arithmetic lives in ``engine.schedule.RateWindow``;
this module only waits. No ledger, no HTTP: ``SharedLimiter`` (several executors sharing one budget)
books its send slots through a function it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime, timedelta

from engine.clock import Clock
from engine.schedule import RateWindow


class PriorityGate:
    """At most ``limit`` holders at once; waiting urgent holders go before waiting ordinary ones.

    Each class is served first come, first served. Urgent is the cancel path: a person asked to
    stop an operation, and that request (and what confirms it) must not queue behind thousands of
    routine polls when the executor is saturated. ``async with gate:`` holds an ordinary place.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a gate needs at least one place")
        self._limit = limit
        self._held = 0
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._ordinary: deque[asyncio.Future[None]] = deque()

    @property
    def held(self) -> int:
        return self._held

    @property
    def waiting(self) -> int:
        return sum(1 for q in (self._urgent, self._ordinary) for f in q if not f.done())

    def _anyone_waiting(self) -> bool:
        """Whether a live waiter is queued; drops finished ones from the front on the way.

        Not ``waiting``: that counts every queued waiter, and acquire runs once per request with
        up to one waiter per operation in flight (10,000 and more).
        """
        for queue in (self._urgent, self._ordinary):
            while queue and queue[0].done():
                queue.popleft()
            if queue:
                return True
        return False

    async def acquire(self, *, urgent: bool = False) -> None:
        if self._held < self._limit and not self._anyone_waiting():
            self._held += 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._ordinary).append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # the place was handed over just as the waiter was cancelled
            raise

    def release(self) -> None:
        """Hand the place to the first live urgent waiter, else the first ordinary one, else free it."""
        for queue in (self._urgent, self._ordinary):
            while queue:
                future = queue.popleft()
                if not future.done():
                    future.set_result(None)  # the place passes on: ``held`` is unchanged
                    return
        self._held -= 1

    @contextlib.asynccontextmanager
    async def hold(self, *, urgent: bool = False) -> AsyncIterator[None]:
        await self.acquire(urgent=urgent)
        try:
            yield
        finally:
            self.release()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Limiter:
    """At most ``global_qps`` requests in any one-second window overall, and ``per_server`` each."""

    def __init__(
        self,
        clock: Clock,
        *,
        global_qps: float,
        per_server: dict[str, float] | None = None,
        max_in_flight: int = 48,
    ) -> None:
        self._clock = clock
        # Requests queued inside the HTTP pool cost it quadratic bookkeeping; queue them here instead.
        self.in_flight = PriorityGate(max_in_flight)
        self._global = RateWindow(global_qps)
        self._per_server = {server: RateWindow(qps) for server, qps in (per_server or {}).items()}

    async def acquire(self, server: str) -> datetime:
        """Book the next send slot that fits both windows, wait for it, and return its instant.

        Booking happens before the wait, so every waiter sleeps exactly once and waiters are
        served first come, first served (no thundering herd when thousands wait). The caller
        records the returned instant as the request's send time, so the polls table measures
        exactly what the windows enforced.
        """
        windows = [self._global]
        if server in self._per_server:
            windows.append(self._per_server[server])
        now = self._clock.now()
        at = max(w.slot(now) for w in windows)
        for w in windows:
            w.reserve(at)
        if at > now:
            await self._clock.sleep(at - now)
        return at


_UNIX = datetime(1970, 1, 1, tzinfo=UTC)
_SLOTS_PER_SECOND = (10, 8, 5, 4, 2, 1)
"""Slot counts that divide one second into a whole number of microseconds."""
PRUNE_EVERY = timedelta(seconds=30)


def slot_grid(global_qps: float) -> tuple[int, int]:
    """The shared budget's grid: ``(slot length in microseconds, sends per slot)``.

    Every send goes out at the start of a slot. With ``S`` slots per second, a half-open window of
    one second holds exactly ``S`` slot starts, so at most ``S * per_slot <= global_qps`` sends,
    wherever the window is. Picks the finest grid that lets through at least 90 % of what the best
    grid would (fine grids spread sends; coarse ones burst); below 1 QPS a slot is
    ``1 / global_qps`` seconds long and holds one send.
    """
    if global_qps <= 0:
        raise ValueError("a rate limit must be positive")
    if global_qps < 1:
        return round(1_000_000 / global_qps), 1
    best_rate = max(s * int(global_qps // s) for s in _SLOTS_PER_SECOND)
    chosen = max(s for s in _SLOTS_PER_SECOND if s * int(global_qps // s) >= 0.9 * best_rate)
    return 1_000_000 // chosen, int(global_qps // chosen)


BookSlots = Callable[[Sequence[str], Sequence[int], int, int], list[int]]
"""``(scopes, caps, first_slot, n) -> slots``: atomic booking in shared state (``PgLedger.book_send_slots``)."""


class SharedLimiter(Limiter):
    """The QPS budget shared by several executor processes through the ledger's database.

    Time is cut into slots (``slot_grid``); each slot holds ``per_slot`` sends overall and its
    share of each server's cap. ``acquire`` books the earliest slot with room (atomically, across
    every process: ``book``), waits for the slot's start and returns that instant, which the
    caller records as the send time. Waiters that arrive together are booked in one round trip.
    The in-flight bound stays per process.
    """

    def __init__(
        self,
        clock: Clock,
        book: BookSlots,
        *,
        global_qps: float,
        per_server: dict[str, float] | None = None,
        max_in_flight: int = 48,
        prune: Callable[[int], object] | None = None,
    ) -> None:
        super().__init__(clock, global_qps=global_qps, per_server=per_server, max_in_flight=max_in_flight)
        self._book = book
        self._prune = prune
        self.slot_us, self.per_slot = slot_grid(global_qps)
        # A server's cap on the same grid (at least one send per slot: a cap below one per slot
        # is only approximated across processes).
        self._server_caps = {
            url: max(1, int(qps * self.slot_us // 1_000_000)) for url, qps in (per_server or {}).items()
        }
        self._waiting: dict[str, list[asyncio.Future[datetime]]] = {}
        self._pump: asyncio.Task[None] | None = None
        self._pruned_at: datetime | None = None
        self.bookings = 0
        """Round trips to the shared state."""

    def _first_slot(self, now: datetime) -> int:
        us = (now - _UNIX) // timedelta(microseconds=1)
        return -(-us // self.slot_us)

    def _instant(self, slot: int) -> datetime:
        return _UNIX + timedelta(microseconds=slot * self.slot_us)

    async def acquire(self, server: str) -> datetime:
        future: asyncio.Future[datetime] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(server, []).append(future)
        if self._pump is None or self._pump.done():
            self._pump = asyncio.ensure_future(self._book_waiting())
        at = await future
        now = self._clock.now()
        if at > now:
            await self._clock.sleep(at - now)
        return at

    async def _book_waiting(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, {}
            for server, futures in batch.items():
                scopes = ["*"]
                caps = [self.per_slot]
                if server in self._server_caps:
                    scopes.append(server)
                    caps.append(self._server_caps[server])
                now = self._clock.now()
                try:
                    slots = await asyncio.to_thread(
                        self._book, scopes, caps, self._first_slot(now), len(futures)
                    )
                    self.bookings += 1
                except Exception as exc:  # handed to each waiter: its request is retried later
                    for future in futures:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for future, slot in zip(futures, slots, strict=True):
                    if not future.done():
                        future.set_result(self._instant(slot))
                if self._prune is not None and (
                    self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY
                ):
                    self._pruned_at = now
                    with contextlib.suppress(Exception):  # best effort: old rows only cost space
                        await asyncio.to_thread(self._prune, self._first_slot(now - PRUNE_EVERY))


__all__ = [
    "PRUNE_EVERY",
    "BookSlots",
    "Limiter",
    "PriorityGate",
    "SharedLimiter",
    "slot_grid",
]
