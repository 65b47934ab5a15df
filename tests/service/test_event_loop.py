"""The event loop ``finality serve`` and the executor's benchmarks run on (``service.event_loop``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from engine.clock import SystemClock
from service import event_loop


def test_run_drives_the_coroutine_on_a_uvloop_event_loop():
    """``run`` returns the coroutine's result, computed on uvloop's loop rather than asyncio's own."""

    async def main() -> str:
        await SystemClock().sleep(timedelta(0))
        return type(asyncio.get_running_loop()).__module__

    assert event_loop.run(main()).startswith("uvloop")
