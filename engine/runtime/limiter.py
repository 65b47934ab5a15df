"""The QPS budget at run time: per-server and global request windows, waited out on the injected clock.

Every protocol request passes ``acquire`` first. The arithmetic lives in ``engine.schedule.RateWindow``;
this module only waits. No ledger, no HTTP.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from engine.clock import Clock
from engine.schedule import RateWindow


class Limiter:
    """At most ``global_qps`` requests in any one-second window overall, and ``per_server`` each."""

    def __init__(
        self, clock: Clock, *, global_qps: float, per_server: dict[str, float] | None = None
    ) -> None:
        self._clock = clock
        self._global = RateWindow(global_qps)
        self._per_server = {server: RateWindow(qps) for server, qps in (per_server or {}).items()}

    async def acquire(self, server: str) -> datetime:
        """Wait until a request to ``server`` fits both windows, take a slot in each, return its instant.

        The caller records that instant as the request's send time, so that the polls table
        measures exactly what the windows enforced.
        """
        windows = [self._global]
        if server in self._per_server:
            windows.append(self._per_server[server])
        while True:
            now = self._clock.now()
            earliest = max(w.earliest(now) for w in windows)
            if earliest <= now:
                # No await between the check and the take: the event loop cannot interleave.
                for w in windows:
                    taken = w.take(now)
                    assert taken
                return now
            await self._clock.sleep(max(earliest - now, timedelta(microseconds=100)))
