"""``finality serve``: one process that runs the executor and serves the control API.

On a DuckDB file this process owns the ledger (one writing process per file); everything else
(console, notebooks, CLI commands that change state) goes through its HTTP API. On a PostgreSQL
URL any number of these processes share the ledger: each leases its work, fences its writes and
books its requests in the shared QPS budget (see ``service.executor``); analyst SQL runs in
place (``PgLedger.analyst_query``) instead of on a snapshot, on a connection pool of its own.
Reads that are not the executor's run on a bounded readers' pool (``service.readers``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import tempfile
from datetime import timedelta
from pathlib import Path

import uvicorn

from engine.clock import SystemClock
from engine.ledger import open_ledger
from engine.ledger.duckdb import Ledger
from engine.ledger.port import LedgerPort
from engine.ledger.postgres import PgLedger
from service.analysis import AnalystReads, DuckDbReads, PgReads
from service.api import build_api
from service.config import ServiceConfig
from service.executor import Executor
from service.readers import ReaderPool

logger = logging.getLogger(__name__)


async def serve(
    config: ServiceConfig,
    ledger_target: str,
    *,
    host: str,
    port: int,
    seed: int | None = None,
    lease_s: float | None = None,
) -> None:
    """Run until SIGINT/SIGTERM; print one ``READY http://host:port`` line once listening.

    ``ledger_target`` is a DuckDB path or a PostgreSQL URL (``engine.ledger.open_ledger``);
    ``lease_s`` overrides the config's lease length (PostgreSQL only).
    """
    ledger = open_ledger(ledger_target)
    shared = isinstance(ledger, PgLedger)
    executor = Executor(
        ledger=ledger,
        config=config,
        clock=SystemClock(),
        rng=random.Random(seed),
        lease_s=(lease_s or config.lease_s) if shared else None,
    )
    await executor.start()
    analyst = config.analyst
    readers = ReaderPool(analyst.workers, analyst.queue)
    reader_ledger: PgLedger | None = None
    with tempfile.TemporaryDirectory(prefix="finality-sql-") as folder:
        sql: AnalystReads
        if isinstance(ledger, PgLedger):
            # A pool of its own: analyst queries never hold a connection the executor needs.
            reader_ledger = PgLedger.open(ledger_target, read_only=True, pool_size=analyst.workers)
            sql = PgReads(reader_ledger, analyst)
        else:
            assert isinstance(ledger, Ledger)
            published = (
                Path(analyst.snapshot_dir) if analyst.snapshot_dir else Path(ledger.path).parent / "snapshots"
            )
            sql = DuckDbReads(ledger, Path(folder), executor.clock, analyst, published=published)
        app = build_api(executor, ledger, sql=sql, readers=readers, analyst=analyst)
        server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        )
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runner = asyncio.create_task(executor.run())
        gates = asyncio.create_task(record_gates(executor, ledger, config.gate_interval))
        snapshots = asyncio.create_task(publish_snapshots(executor, readers, sql, analyst.snapshot_every))
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
        await executor.aclose()
        runner.cancel()
    readers.close()
    if reader_ledger is not None:
        reader_ledger.close()
    ledger.close()


async def publish_snapshots(
    executor: Executor, readers: ReaderPool, reads: AnalystReads, every: timedelta | None
) -> None:
    """Publish a snapshot every ``every`` (on the readers' pool); a failure is logged and retried next time."""
    if every is None or isinstance(reads, PgReads):
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
    """
    # Imported here: rollout sits above the engine and the service only records its verdicts.
    from rollout.gates import evaluate

    if interval is None:
        return
    while True:
        try:
            now = executor.clock.now()
            inputs = await asyncio.to_thread(ledger.gate_inputs, now)
            await asyncio.to_thread(ledger.record_gate_run, evaluate(inputs).results, now)
        except Exception:  # one bad evaluation must not end the periodic record
            logger.exception("periodic gate evaluation failed")
        await executor.clock.sleep(interval)


__all__ = [
    "publish_snapshots",
    "record_gates",
    "serve",
]
