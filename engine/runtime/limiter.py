"""The QPS budget at run time: per-server and global request windows, waited out on the injected clock.

Every protocol request passes ``acquire`` first. The arithmetic lives in ``engine.schedule.RateWindow``;
this module only waits. No ledger, no HTTP.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from engine.clock import Clock
from engine.schedule import RateWindow


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
        self.in_flight = asyncio.Semaphore(max_in_flight)
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
