"""A service executor running in the test's own event loop: started, its loop a task, and stopped
however the test ends (the loop awaited within 60 s, the executor and the ledger closed).

One way to do it for every test that drives ``service.executor.Executor`` directly, not over HTTP.
It must not hold assertions: what a test checks stays in the test.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from engine.clock import Clock, SystemClock
from engine.ledger.duckdb import Ledger
from service.config import ServiceConfig
from service.executor import Executor


@asynccontextmanager
async def running_executor(
    ledger: Ledger, config: ServiceConfig, *, seed: int, clock: Clock | None = None
) -> AsyncIterator[Executor]:
    """An executor over ``ledger`` with its loop running; closes the ledger too on the way out."""
    executor = Executor(ledger=ledger, config=config, clock=clock or SystemClock(), rng=random.Random(seed))
    await executor.start()
    runner = asyncio.create_task(executor.run())
    try:
        yield executor
    finally:
        executor.request_stop()
        await asyncio.wait_for(runner, timeout=60)
        await executor.aclose()
        ledger.close()
