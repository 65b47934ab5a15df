"""The readers' pool in-process: its workers yield the CPU to the executor, and a full pool refuses."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from service.readers import ReaderPool, ReadersBusy


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
