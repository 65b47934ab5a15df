"""The readers' pool: every read that is not the executor's own runs here, off the executor's loop.

Analyst SQL, the console's queries (they arrive as analyst SQL), gate evaluation on request,
``/metrics`` scans, the audit-chain check, snapshots and exports all go through ``ReaderPool.run``:
a fixed number of worker threads and a bounded queue in front of them. A request that finds the
pool and its queue full is refused at once with 503 and a ``Retry-After`` (``ReadersBusy``), so a
crowd of readers becomes refusals, never an unbounded backlog and never a pause of the loop that
sends polls and cancels. DuckDB and psycopg release the GIL while a query runs, so a worker's
10-s query costs the loop nothing but the final conversion of its (row-capped) result.

Not holding the loop is not enough on a machine with few cores: a worker that burns a core takes
CPU from the executor's thread all the same. So each worker lowers its own scheduling priority
when it starts (``nice``, 19 by default: Linux gives a thread its own nice value). Where the
platform refuses, the worker runs at normal priority and says so in ``stats().nice``. Niceness
orders threads on the cores, not on the interpreter's lock they share with the loop: analyst SQL
on DuckDB, the heaviest reads, therefore runs in reader processes (``service.reader_process``),
one per worker, and its worker only waits for the answer's bytes. The reads that stay on the
workers' threads read the live ledger, which only this process may open (snapshots, lists,
gates, metrics, rollout status, the audit check), or wait on PostgreSQL's own processes.

Holds no rules about what a read may do: the sandbox (``engine.ledger.sandbox``) and the
PostgreSQL analyst path (``engine.ledger.analyst``) own the per-query limits.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from engine.errors import ServiceError

T = TypeVar("T")


class ReadersBusy(ServiceError):
    """Every reader worker is busy and the queue is full: come back after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(503, message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class ReaderStats:
    workers: int
    queue_limit: int
    running: int
    queued: int
    refused: int
    nice: int

    def as_json(self) -> dict[str, int]:
        return {
            "workers": self.workers,
            "nice": self.nice,
            "queue_limit": self.queue_limit,
            "running": self.running,
            "queued": self.queued,
            "refused": self.refused,
        }


class ReaderPool:
    """``workers`` threads for reads, at most ``queue_limit`` more waiting; beyond that ``ReadersBusy``.

    Each worker runs at niceness ``nice`` (0-19; 19 the lowest priority).
    """

    def __init__(
        self, workers: int = 2, queue_limit: int = 8, *, retry_after_s: int = 2, nice: int = 19
    ) -> None:
        if workers < 1 or queue_limit < 0:
            raise ValueError("a reader pool needs at least one worker and a non-negative queue")
        if not 0 <= nice <= 19:
            raise ValueError("a reader pool's niceness is 0 (normal) to 19 (lowest)")
        self.workers = workers
        self.queue_limit = queue_limit
        self.retry_after_s = retry_after_s
        self.nice = nice
        self._threads = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="finality-reader", initializer=self._lower_priority
        )
        self._lock = threading.Lock()
        self._admitted = 0
        self._running = 0
        self._refused = 0
        self._niced = 0  # the niceness the workers reached (0 until one started, or if refused)

    def _lower_priority(self) -> None:
        """Run in each new worker: set the calling thread's own niceness (Linux: per thread)."""
        reached = 0
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, max(self.nice, os.getpriority(os.PRIO_PROCESS, tid)))
            reached = os.getpriority(os.PRIO_PROCESS, tid)
        except (AttributeError, OSError):
            pass  # no per-thread priority here: the worker runs at the process's priority
        with self._lock:
            self._niced = reached

    def stats(self) -> ReaderStats:
        with self._lock:
            return ReaderStats(
                self.workers,
                self.queue_limit,
                self._running,
                self._admitted - self._running,
                self._refused,
                self._niced,
            )

    async def run(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` on a reader thread and await its result; refuse at once when the pool is full.

        Raises:
            ReadersBusy: ``workers`` reads are running and ``queue_limit`` more are waiting.
        """
        with self._lock:
            if self._admitted >= self.workers + self.queue_limit:
                self._refused += 1
                raise ReadersBusy(
                    f"{what}: all {self.workers} reader workers are busy and {self.queue_limit} more reads "
                    f"are queued (the readers' queue limit); retry in {self.retry_after_s} s",
                    self.retry_after_s,
                )
            self._admitted += 1

        def job() -> T:
            with self._lock:
                self._running += 1
            try:
                return fn()
            finally:
                with self._lock:
                    self._running -= 1
                    self._admitted -= 1

        return await asyncio.wrap_future(self._threads.submit(job))

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


__all__ = [
    "ReaderPool",
    "ReaderStats",
    "ReadersBusy",
]
