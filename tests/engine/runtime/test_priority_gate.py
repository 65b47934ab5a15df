"""The in-flight gate: a bounded number of requests at once, the cancel path served before routine polls."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from engine.clock import SystemClock
from engine.runtime.limiter import PriorityGate


async def let_others_run() -> None:
    """Yield to the event loop once (a zero sleep): every ready task runs a step; no time passes."""
    await SystemClock().sleep(timedelta(0))


async def test_waiters_are_served_urgent_first_then_in_arrival_order() -> None:
    gate = PriorityGate(1)
    order: list[str] = []
    await gate.acquire()  # the one place is taken

    async def wait(name: str, urgent: bool) -> None:
        async with gate.hold(urgent=urgent):
            order.append(name)

    tasks = [
        asyncio.create_task(wait("poll-1", False)),
        asyncio.create_task(wait("poll-2", False)),
        asyncio.create_task(wait("cancel-1", True)),
        asyncio.create_task(wait("cancel-2", True)),
    ]
    await let_others_run()  # every waiter queues
    assert gate.waiting == 4
    gate.release()
    await asyncio.gather(*tasks)
    assert order == ["cancel-1", "cancel-2", "poll-1", "poll-2"]
    assert gate.held == 0


async def test_a_waiter_cancelled_while_queued_loses_no_place() -> None:
    gate = PriorityGate(1)
    await gate.acquire()
    doomed = asyncio.create_task(gate.acquire(urgent=True))
    await let_others_run()
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    gate.release()  # nobody live is waiting: the place is free again
    assert gate.held == 0
    await asyncio.wait_for(gate.acquire(), timeout=1)
    assert gate.held == 1


async def test_a_waiter_cancelled_after_being_handed_the_place_gives_it_back() -> None:
    gate = PriorityGate(1)
    await gate.acquire()
    handed = asyncio.create_task(gate.acquire())
    await let_others_run()
    gate.release()  # the place passes to the waiter ...
    handed.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await handed
    assert gate.held == 0


async def test_no_more_than_the_limit_hold_at_once() -> None:
    gate = PriorityGate(3)
    inside = 0
    peak = 0

    async def work(urgent: bool) -> None:
        nonlocal inside, peak
        async with gate.hold(urgent=urgent):
            inside += 1
            peak = max(peak, inside)
            await let_others_run()
            inside -= 1

    await asyncio.gather(*(work(i % 4 == 0) for i in range(40)))
    assert peak == 3
    assert gate.held == 0


def test_a_gate_needs_a_place() -> None:
    with pytest.raises(ValueError, match="at least one"):
        PriorityGate(0)
