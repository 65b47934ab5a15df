"""The readers' pool in-process: its workers yield the CPU to the executor, and a full pool refuses."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from service.readers import ReaderPool, ReadersBusy, analyst_slots


def _own_priority() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_reader_workers_run_at_the_lowest_cpu_priority_and_the_loop_thread_keeps_its_own() -> None:
    """A read runs on a worker niced to 19 (reported in stats); the thread that awaits it is not niced."""
    before = _own_priority()
    pool = ReaderPool(workers=2, queue_limit=0)
    try:
        seen = asyncio.run(pool.run("priority probe", _own_priority))
        assert seen == 19
        assert pool.stats().as_json()["nice"] == 19
        assert _own_priority() == before
    finally:
        pool.close()


def test_a_pool_configured_at_normal_priority_leaves_its_workers_there() -> None:
    """nice = 0 leaves the workers at the process's priority (the benchmark's comparison run)."""
    pool = ReaderPool(workers=1, queue_limit=0, nice=0)
    try:
        assert asyncio.run(pool.run("priority probe", _own_priority)) == _own_priority()
    finally:
        pool.close()


def test_a_full_pool_refuses_at_once_naming_its_limits_and_counts_the_refusal() -> None:
    """One worker, no queue: a second read while the first runs is refused with the Retry-After to send."""
    pool = ReaderPool(workers=1, queue_limit=0, retry_after_s=3)
    started, release = threading.Event(), threading.Event()

    def hold() -> str:
        started.set()
        release.wait(timeout=30)
        return "done"

    async def scenario() -> str:
        first = asyncio.ensure_future(pool.run("slow read", hold))
        assert await asyncio.to_thread(started.wait, 30)
        with pytest.raises(ReadersBusy, match="all 1 reader workers are busy") as busy:
            await pool.run("second read", lambda: "never")
        assert busy.value.status == 503
        assert busy.value.retry_after_s == 3
        release.set()
        return await first

    try:
        assert asyncio.run(scenario()) == "done"
        assert pool.stats().refused == 1
    finally:
        release.set()
        pool.close()


def test_analyst_queries_run_on_one_fewer_than_the_cores_at_least_one_and_no_more_than_the_workers() -> None:
    """The default leaves a core to the executor; a configured number wins, the workers cap both."""
    assert analyst_slots(workers=2, cores=2) == 1
    assert analyst_slots(workers=2, cores=1) == 1
    assert analyst_slots(workers=2, cores=8) == 2
    assert analyst_slots(workers=4, cores=3) == 2
    assert analyst_slots(workers=4, configured=3, cores=2) == 3
    assert analyst_slots(workers=2, configured=5, cores=16) == 2
    assert 1 <= analyst_slots(workers=64) <= 64


def test_an_analyst_query_over_the_limit_waits_in_the_queue_without_a_thread_and_one_more_gets_503() -> None:
    """One analyst slot, two workers, a queue of one: the second analyst query waits while a plain read
    runs on the free worker; a fourth read is refused; the waiting query runs when the first ends."""
    pool = ReaderPool(workers=2, queue_limit=1, retry_after_s=4, analyst_limit=1)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold() -> str:
        started.set()
        release.wait(timeout=30)
        ran.append("first")
        return "first"

    def second() -> str:
        ran.append("second")
        return "second"

    plain_started, plain_release = threading.Event(), threading.Event()

    def plain() -> str:
        plain_started.set()
        plain_release.wait(timeout=30)
        return "plain"

    async def scenario() -> list[str]:
        first = asyncio.ensure_future(pool.run("analyst SQL", hold, analyst=True))
        assert await asyncio.to_thread(started.wait, 30)
        waiting = asyncio.ensure_future(pool.run("analyst SQL", second, analyst=True))
        # A plain read takes the second worker: the waiting analyst query holds no thread. (The
        # waiting task reaches its slot first: tasks start in the order they were made.)
        other = asyncio.ensure_future(pool.run("plain read", plain))
        assert await asyncio.to_thread(plain_started.wait, 30)
        stats = pool.stats()
        assert (stats.analyst_limit, stats.analyst_running, stats.running, stats.queued) == (1, 1, 2, 1)
        assert ran == []
        with pytest.raises(ReadersBusy, match="queue limit") as busy:
            await pool.run("analyst SQL", lambda: "never", analyst=True)
        assert (busy.value.status, busy.value.retry_after_s) == (503, 4)
        plain_release.set()
        assert await other == "plain"
        assert ran == []
        release.set()
        return [await first, await waiting]

    try:
        assert asyncio.run(scenario()) == ["first", "second"]
        assert ran == ["first", "second"]
        stats = pool.stats()
        assert (stats.running, stats.queued, stats.analyst_running, stats.refused) == (0, 0, 0, 1)
    finally:
        release.set()
        plain_release.set()
        pool.close()


def test_an_analyst_query_cancelled_while_it_waits_for_a_slot_leaves_the_queue() -> None:
    """A caller that stops waiting before its query got a slot frees its place in the queue; it never runs."""
    pool = ReaderPool(workers=2, queue_limit=0, analyst_limit=1)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold() -> str:
        started.set()
        release.wait(timeout=30)
        return "first"

    async def scenario() -> str:
        first = asyncio.ensure_future(pool.run("analyst SQL", hold, analyst=True))
        assert await asyncio.to_thread(started.wait, 30)
        waiting = asyncio.ensure_future(pool.run("analyst SQL", lambda: ran.append("never"), analyst=True))
        await asyncio.to_thread(lambda: None)  # the waiting task reaches its slot
        assert pool.stats().queued == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert pool.stats().queued == 0
        release.set()
        return await first

    try:
        assert asyncio.run(scenario()) == "first"
        assert ran == []
    finally:
        release.set()
        pool.close()
