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

Niceness does not make a busy core free, though: a reader at nice 19 that holds a core delays each
wake-up of the executor's loop (and of its database backends) by up to the kernel's time slice,
and with as many busy readers as cores every wake-up waits so. Analyst SQL, the one read that may
run for its whole time limit, therefore has a second bound: at most ``analyst_limit`` analyst
queries run at once (``analyst_slots``: by default one fewer than this process's cores, at least
one), so a core is left to the executor however many analysts ask; the rest wait in the queue
(they hold no worker thread while they wait: the other reads go on) and count against its limit.

Holds no rules about what a read may do: the sandbox (``engine.ledger.sandbox``) and the
PostgreSQL analyst path (``engine.ledger.analyst``) own the per-query limits.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar

from engine.errors import ServiceError

T = TypeVar("T")


class ReadersBusy(ServiceError):
    """Every reader worker is busy and the queue is full: come back after ``retry_after_s``."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(503, message)
        self.retry_after_s = retry_after_s


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform says, else all)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def analyst_slots(workers: int, configured: int = 0, cores: int | None = None) -> int:
    """How many analyst queries may run at once: ``configured`` if set (> 0), else one fewer than
    ``cores`` (default: this process's), at least one; never more than the ``workers`` to run them."""
    wanted = configured if configured > 0 else (cores if cores is not None else usable_cores()) - 1
    return max(1, min(workers, wanted))


@dataclass(frozen=True, slots=True)
class ReaderStats:
    workers: int
    queue_limit: int
    running: int
    queued: int
    refused: int
    nice: int
    analyst_limit: int
    analyst_running: int

    def as_json(self) -> dict[str, int]:
        return {
            "workers": self.workers,
            "nice": self.nice,
            "queue_limit": self.queue_limit,
            "running": self.running,
            "queued": self.queued,
            "refused": self.refused,
            "analyst_limit": self.analyst_limit,
            "analyst_running": self.analyst_running,
        }


class ReaderPool:
    """``workers`` threads for reads, at most ``queue_limit`` more waiting; beyond that ``ReadersBusy``.

    Each worker runs at niceness ``nice`` (0-19; 19 the lowest priority). Of the reads, at most
    ``analyst_limit`` analyst queries (``run(..., analyst=True)``) run at once (None: as many as
    there are workers); the others wait in the queue without a thread.
    """

    def __init__(
        self,
        workers: int = 2,
        queue_limit: int = 8,
        *,
        retry_after_s: int = 2,
        nice: int = 19,
        analyst_limit: int | None = None,
    ) -> None:
        if workers < 1 or queue_limit < 0:
            raise ValueError("a reader pool needs at least one worker and a non-negative queue")
        if not 0 <= nice <= 19:
            raise ValueError("a reader pool's niceness is 0 (normal) to 19 (lowest)")
        if analyst_limit is not None and analyst_limit < 1:
            raise ValueError("a reader pool runs at least one analyst query at a time")
        self.workers = workers
        self.queue_limit = queue_limit
        self.retry_after_s = retry_after_s
        self.nice = nice
        self.analyst_limit = min(workers, analyst_limit or workers)
        # Created on first use, on the loop that awaits it (a pool serves one loop).
        self._analyst_slots: asyncio.Semaphore | None = None
        self._analyst_running = 0
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
                self.analyst_limit,
                self._analyst_running,
            )

    async def run(self, what: str, fn: Callable[[], T], *, analyst: bool = False) -> T:
        """Run ``fn`` on a reader thread and await its result; refuse at once when the pool is full.

        ``analyst``: ``fn`` is an analyst query; it waits (in the queue, without a thread) while
        ``analyst_limit`` of them run.

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
                self._analyst_running += int(analyst)
            try:
                return fn()
            finally:
                with self._lock:
                    self._running -= 1
                    self._analyst_running -= int(analyst)
                    self._admitted -= 1

        if not analyst:
            plain = self._threads.submit(job)
            plain.add_done_callback(self._forget_if_cancelled)
            return await asyncio.wrap_future(plain)
        if self._analyst_slots is None:
            self._analyst_slots = asyncio.Semaphore(self.analyst_limit)
        slots = self._analyst_slots
        try:
            await slots.acquire()
        except BaseException:
            # Cancelled while queued: it leaves the queue, it never ran.
            with self._lock:
                self._admitted -= 1
            raise
        loop = asyncio.get_running_loop()
        try:
            future = self._threads.submit(job)
        except BaseException:
            slots.release()
            with self._lock:
                self._admitted -= 1
            raise
        future.add_done_callback(self._forget_if_cancelled)

        def free_slot(_: Future[T]) -> None:
            # The slot is free when the query ends on its thread, not when its caller stops waiting
            # (a client that hangs up leaves its query running to its time limit).
            with suppress(RuntimeError):  # the loop is closed: nobody waits for a slot
                loop.call_soon_threadsafe(slots.release)

        future.add_done_callback(free_slot)
        return await asyncio.wrap_future(future)

    def _forget_if_cancelled(self, future: Future[Any]) -> None:
        """A read cancelled before a worker took it never ran: it leaves the queue's count."""
        if future.cancelled():
            with self._lock:
                self._admitted -= 1

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


__all__ = [
    "ReaderPool",
    "ReaderStats",
    "ReadersBusy",
    "analyst_slots",
    "usable_cores",
]
