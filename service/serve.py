"""``finality serve``: one process that runs the executor and serves the control API.

On a DuckDB file this process owns the ledger (one writing process per file); everything else
(console, notebooks, CLI commands that change state) goes through its HTTP API. On a PostgreSQL
URL any number of these processes share the ledger: each leases its work, fences its writes and
books its requests in the shared QPS budget (see ``service.executor``); analyst SQL runs in
place (``PgLedger.analyst_query``) instead of on a snapshot.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import uvicorn

from engine.clock import SystemClock, monotonic_seconds
from engine.ledger import open_ledger
from engine.ledger.duckdb import Ledger
from engine.ledger.port import LedgerPort
from engine.ledger.postgres import PgLedger
from engine.ledger.sandbox import run_query
from service.api import build_api
from service.config import ServiceConfig
from service.executor import Executor

logger = logging.getLogger(__name__)

SNAPSHOT_MAX_AGE = timedelta(seconds=5)


@dataclass
class SnapshotSql:
    """Analyst SQL against a snapshot no older than ``max_age``, made by the owning process."""

    ledger: Ledger
    folder: Path
    max_age: timedelta = SNAPSHOT_MAX_AGE
    _made_at: float | None = None

    def __call__(self, query: str, max_rows: int) -> dict[str, object]:
        path = self.folder / "analyst-snapshot.duckdb"
        now = monotonic_seconds()
        if self._made_at is None or now - self._made_at > self.max_age.total_seconds():
            self.ledger.snapshot(path)
            self._made_at = now
        # The snapshot is ours alone and replaced by rename, so the sandbox may stay attached to it.
        result = run_query(path, query, max_rows=max_rows, keep_open=True).as_json()
        result["snapshot_age_s"] = round(monotonic_seconds() - (self._made_at or now), 3)
        return result


@dataclass
class PgSql:
    """Analyst SQL on a PostgreSQL ledger: in place, read-only transaction, read-only role."""

    ledger: PgLedger

    def __call__(self, query: str, max_rows: int) -> dict[str, object]:
        result = self.ledger.analyst_query(query, max_rows=max_rows).as_json()
        result["snapshot_age_s"] = 0.0
        return result


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
    with tempfile.TemporaryDirectory(prefix="finality-sql-") as folder:
        sql = PgSql(ledger) if isinstance(ledger, PgLedger) else SnapshotSql(ledger, Path(folder))
        app = build_api(executor, ledger, sql=sql)
        server = uvicorn.Server(
            uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        )
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        runner = asyncio.create_task(executor.run())
        gates = asyncio.create_task(record_gates(executor, ledger, config.gate_interval))
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
        await executor.aclose()
        runner.cancel()
    ledger.close()


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
    "SNAPSHOT_MAX_AGE",
    "PgSql",
    "SnapshotSql",
    "record_gates",
    "serve",
]
