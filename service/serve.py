"""``finality serve``: one process that runs the executor and serves the control API.

On a DuckDB file this process owns the ledger (one writing process per file); everything else
(console, notebooks, CLI commands that change state) goes through its HTTP API. On a PostgreSQL
URL any number of these processes share the ledger: each leases its work, fences its writes and
books its requests in the shared QPS budget (see ``service.executor``); analyst SQL runs in
place (``PgLedger.analyst_query``) instead of on a snapshot, on a connection pool of its own.
Reads that are not the executor's run on a bounded readers' pool (``service.readers``); on
DuckDB, analyst SQL runs in reader processes of this one (``service.reader_process``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import sys
import tempfile
from dataclasses import fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import uvicorn

from engine.arrow import skip_pandas_probe
from engine.clock import Clock, SystemClock
from engine.ledger import open_ledger
from engine.ledger.duckdb import Ledger
from engine.ledger.port import ExplorerRun, LedgerPort
from service.analysis import AnalystReads, DuckDbReads, PgReads
from service.api import build_api
from service.config import AnalystConfig, ServiceConfig
from service.executor import Executor
from service.reader_process import ReaderProcesses
from service.readers import ReaderPool, analyst_slots

if TYPE_CHECKING:  # imported where a PostgreSQL ledger is opened: a DuckDB service never loads psycopg
    from engine.ledger.postgres import PgLedger

logger = logging.getLogger(__name__)


async def serve(
    config: ServiceConfig,
    ledger_target: str,
    *,
    host: str,
    port: int,
    seed: int | None = None,
    lease_s: float | None = None,
    explore: int | None = None,
) -> None:
    """Run until SIGINT/SIGTERM; print one ``READY http://host:port`` line once listening.

    ``ledger_target`` is a DuckDB path or a PostgreSQL URL (``engine.ledger.open_ledger``);
    ``lease_s`` overrides the config's lease length (PostgreSQL only); ``explore``: run the race
    explorer over the shipped code for that many interleavings meanwhile and record its runs
    (``record_shipped_explorer``).
    """
    skip_pandas_probe()  # the service holds no pandas object (engine.arrow)
    ledger = open_service_ledger(ledger_target)
    shared = ledger.leasing is not None
    executor = Executor(
        ledger=ledger,
        config=config,
        clock=SystemClock(),
        rng=random.Random(seed),
        lease_s=(lease_s or config.lease_s) if shared else None,
    )
    await executor.start()
    analyst = config.analyst
    readers = ReaderPool(
        analyst.workers,
        analyst.queue,
        nice=analyst.nice,
        analyst_limit=analyst_slots(analyst.workers, analyst.queries),
    )
    with tempfile.TemporaryDirectory(prefix="finality-sql-") as folder:
        sql, owned = analyst_reads(ledger, ledger_target, analyst, Path(folder), executor.clock)
        app = build_api(executor, ledger, sql=sql, readers=readers, analyst=analyst)
        server = uvicorn.Server(
            # httptools: the C parser (a dependency), not h11's pure Python, parses each request.
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", http="httptools")
        )
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runner = asyncio.create_task(executor.run())
        gates = asyncio.create_task(record_gates(executor, ledger, config.gate_interval))
        snapshots = asyncio.create_task(publish_snapshots(executor, readers, sql, analyst.snapshot_every))
        explorer = asyncio.create_task(record_shipped_explorer(ledger, explore))
        web = asyncio.create_task(server.serve())
        while not server.started:
            if web.done():
                await web
                raise RuntimeError("control API failed to start")
            await SystemClock().sleep(timedelta(milliseconds=20))
        bound = server.servers[0].sockets[0].getsockname()[1] if server.servers else port
        print(f"READY http://{host}:{bound}", flush=True)
        await stop.wait()
        server.should_exit = True
        await web
        gates.cancel()
        snapshots.cancel()
        explorer.cancel()
        await executor.aclose()
        runner.cancel()
        # A cancelled task leaves the statement it handed to a worker thread running (the gate
        # evaluation's scan, a snapshot): the ledger closed under it refused ("connection is busy")
        # and the service died with a traceback. Those threads end first.
        await loop.shutdown_default_executor()
        readers.close()
        # The reader processes end before the snapshot folder they read goes.
        owned.close()
    ledger.close()


class _Closes(Protocol):
    def close(self) -> None: ...


def analyst_reads(
    ledger: LedgerPort, target: str, analyst: AnalystConfig, folder: Path, clock: Clock
) -> tuple[AnalystReads, _Closes]:
    """The analysts' reads over the service's ledger, and what they own (to close at the end).

    On PostgreSQL they read in place on a read-only pool of their own, ``analyst.workers``
    connections: an analyst's query never holds a connection the executor needs. On DuckDB they
    read private snapshots in ``folder`` (``DuckDbReads``), each query in one of ``analyst.workers``
    reader processes at the readers' niceness (``service.reader_process``), started on first use.
    """
    source = ledger.snapshots
    if source is None:
        from engine.ledger.postgres import PgLedger

        reader = PgLedger.open(target, read_only=True, pool_size=analyst.workers)
        return PgReads(reader, analyst), reader
    published = Path(analyst.snapshot_dir) if analyst.snapshot_dir else Path(source.path).parent / "snapshots"
    processes = ReaderProcesses(analyst.workers, analyst.nice)
    reads = DuckDbReads(source, folder, clock, analyst, published=published, processes=processes)
    return reads, processes


def open_service_ledger(target: str) -> Ledger | PgLedger:
    """The ledger as ``finality serve`` opens it: a DuckDB one with a single DuckDB thread.

    DuckDB's worker threads are the process's own, started at the executor's priority; with more
    than one, a snapshot made for the readers on a niced reader thread hands most of its CPU (a
    second or more per snapshot on a ledger of 100,000 polls) to them, and it competes with the
    executor at the executor's priority. With one, each statement runs on its caller's thread: the
    executor's small writes lose nothing, and the readers' snapshots stay at the readers' priority.
    """
    return open_ledger(target, duckdb_threads=1)


async def publish_snapshots(
    executor: Executor, readers: ReaderPool, reads: AnalystReads, every: timedelta | None
) -> None:
    """Publish a snapshot every ``every`` (on the readers' pool); a failure is logged and retried next time."""
    if every is None or not reads.snapshotting:
        return
    while True:
        await executor.clock.sleep(every)
        try:
            made = await readers.run("periodic snapshot", reads.publish)
            logger.info("published snapshot %s (as of %s)", made["name"], made["as_of"])
        except Exception:  # one failed snapshot must not end the periodic publishing
            logger.exception("periodic snapshot failed")


async def record_gates(executor: Executor, ledger: LedgerPort, interval: timedelta | None) -> None:
    """Evaluate the six gates every ``interval`` and record each run (with its raw inputs) in ``gate_runs``.

    The console shows the latest run instead of rescanning a large ledger per page view. The scan
    runs on a worker thread (its own cursor), so the executor's loop keeps advancing meanwhile.
    A failed evaluation is logged and retried at the next interval; it never stops the service.
    Several executors on one ledger take turns (``take_turn``): one run per interval in all.
    """
    # Imported here: rollout sits above the engine and the service only records its verdicts.
    from rollout.gates import evaluate

    if interval is None:
        return
    while True:
        try:
            now = executor.clock.now()
            # One run per interval for every executor of the ledger together: whoever comes due
            # first takes the turn (the others' consoles and APIs read the same gate_runs).
            if await asyncio.to_thread(ledger.take_turn, "gate_run", now, interval):
                inputs = await asyncio.to_thread(ledger.gate_inputs, now)
                await asyncio.to_thread(ledger.record_gate_run, evaluate(inputs).results, now)
        except Exception:  # one bad evaluation must not end the periodic record
            logger.exception("periodic gate evaluation failed")
        await executor.clock.sleep(interval)


async def record_shipped_explorer(ledger: LedgerPort, permutations: int | None) -> int:
    """Explore ``permutations`` interleavings of the shipped driver and adapters (against the
    reference servers) and record the runs in ``ledger``, where the terminal_divergence gate reads
    them; returns how many runs were recorded.

    The explorer runs as ``finality explore --code shipped`` in a child process of this same code
    (its CPU would slow the executor's loop), recording into a ledger file of its own, since this
    process holds the ledger; its runs are then copied here, the ones of the shipped code at this
    process's revision only. No run reaches the gate that this code did not explore. A failed
    exploration is logged and records nothing.
    """
    # Imported here: only a service told to explore needs them.
    from engine.revision import running_revision

    if not permutations:
        return 0
    with tempfile.TemporaryDirectory(prefix="finality-explore-") as folder:
        side = Path(folder) / "explore.duckdb"
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "service",
            "explore",
            "--code",
            "shipped",
            "--permutations",
            str(permutations),
            "--ledger",
            str(side),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            _, err = await child.communicate()
        except asyncio.CancelledError:
            child.kill()
            await child.wait()
            raise
        # 0: no divergence, 1: divergent interleavings found (recorded: the gate must see them).
        if child.returncode not in (0, 1):
            logger.error("the shipped-code explorer failed (%s): %s", child.returncode, err.decode()[-500:])
            return 0
        with Ledger.open(side, read_only=True) as explored:
            rows = explored.explorer_runs()
    revision = running_revision()
    names = [f.name for f in fields(ExplorerRun)]
    runs = [
        ExplorerRun(**{n: _instant(row[n]) if n in ("started_at", "finished_at") else row[n] for n in names})  # type: ignore[arg-type]
        for row in rows
        if row["code"] == "shipped" and row["revision"] == revision
    ]
    for run in runs:
        await asyncio.to_thread(ledger.record_explorer_run, run)
    logger.info(
        "recorded %d shipped-code explorer runs: %d interleavings, %d divergent",
        len(runs),
        sum(r.distinct_interleavings for r in runs),
        sum(r.divergent for r in runs),
    )
    return len(runs)


def _instant(value: object) -> datetime:
    return value if isinstance(value, datetime) else datetime.fromisoformat(str(value))


__all__ = [
    "analyst_reads",
    "open_service_ledger",
    "publish_snapshots",
    "record_gates",
    "record_shipped_explorer",
    "serve",
]
