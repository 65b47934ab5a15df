"""The executor while analysts read (issue 22 point 3): the same run with and without 4 analyst clients.

Each run starts one MCP 2025-11-25 reference server (real time) and ``finality serve`` (shipped
defaults for ``[analyst]``: 2 reader workers, a queue of 8, 10-s queries), submits ``--ops`` calls
that poll for longer than the run (server-advised interval ``--interval-s``), lets them settle for
``--warmup-s``, then measures for ``--window-s``:

* poll lateness: for every poll sent in the window, ``sent_at`` minus the instant it was due (the
  previous answer's ``received_at`` plus the advised interval), from the ledger's polls table
  (p99; it includes the executor's up-to-10 % jitter in both runs alike);
* health latency: ``GET /api/v1/health`` every 100 ms from a client thread, round trip (p99);
* cancel confirmation: ``--cancels`` operations cancelled at the window's start; from
  ``cancel_requested_at`` to the receipt's ``accepted_at`` (p99), from the ledger.

In the ``readers`` runs, 4 client threads run a 10-s analyst query (``POST /api/v1/sql``, stopped
by the service's time limit) back to back for the whole window; a 503 (queue full) is retried after
its Retry-After. ``baseline`` runs are identical without them. Runs alternate baseline / readers so
that the machine's drift falls on both. The readers/baseline ratio of each p99 is the figure the
issue bounds at 1.2.

``--modes baseline,readers,readers-nice0`` adds a third run per round: the same readers with
``[analyst] nice = 0`` (reader threads, and a local PostgreSQL analyst backend, at normal CPU
priority), so one run shows what the readers' low priority buys.

    python bench/readers.py [--runs 3] [--ops 1000] [--ledger duckdb|postgres] [--modes ...] [--json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb
import psycopg

from bench.figures import Report
from engine.testing.postgres import TemporaryPostgres
from refserver.testing import RefServer
from service.client import ServiceClient, ServiceRefused
from service.testing import ServiceProcess

# A query that runs into the service's 10-s limit, in each ledger's dialect.
SLOW = {
    "duckdb": "SELECT count(*) FROM range(100000000000) t(a), range(10) u(b)",
    "postgres": "SELECT count(*) FROM generate_series(1, 100000000000) a",
}
READERS = 4

LATENESS_SQL = """
WITH p AS (
    SELECT sent_at,
           lag(received_at) OVER (PARTITION BY operation_id ORDER BY sent_at) AS prev_answer
    FROM polls
)
SELECT extract(epoch FROM (sent_at - prev_answer)) FROM p
WHERE prev_answer IS NOT NULL AND sent_at >= ? AND sent_at < ?
"""
CANCEL_SQL = """
SELECT extract(epoch FROM (r.accepted_at - o.cancel_requested_at))
FROM operations o JOIN receipts r ON r.operation_id = o.operation_id
WHERE o.cancel_requested_at IS NOT NULL
"""


MODES = {
    # mode: (analyst clients, [analyst] nice; None = the shipped default)
    "baseline": (0, None),
    "readers": (READERS, None),
    "readers-nice0": (READERS, 0),
}
LABELS = {"baseline": "no readers", "readers": "4 analysts", "readers-nice0": "4 analysts at nice 0"}


def config(server: RefServer, qps: float, nice: int | None = None) -> str:
    # Appended last: a TOML table takes every key that follows it.
    analyst = f"\n[analyst]\nnice = {nice}\n" if nice is not None else ""
    return (
        f"""
global_qps = {qps}
rollout_salt = "bench"

[poll]
default_interval_ms = 1000
min_interval_ms = 100
max_interval_ms = 30000
retry_backoff_ms = 200

[servers.mcp]
url = "{server.endpoint}"
protocol = "mcp-2025-11-25"
qps = {qps}

[tools.generate_report]
server = "mcp"
side_effect_free = true
wait_budget_s = 3600

[limits]
submissions_per_s_per_principal = 2000
submission_burst = 2000
"""
        + analyst
    )


def p99(values: list[float]) -> float:
    if not values:
        raise RuntimeError("no samples")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def query(ledger: str, text: str, params: list[object]) -> list[float]:
    """Run a measurement query on the stopped service's ledger (DuckDB file or PostgreSQL)."""
    if "://" in ledger:
        with psycopg.connect(ledger) as conn:
            rows = conn.execute(text.replace("?", "%s"), params).fetchall()
    else:
        con = duckdb.connect(ledger, read_only=True)
        try:
            rows = con.execute(text, params).fetchall()
        finally:
            con.close()
    return [float(r[0]) for r in rows if r[0] is not None]


class Prober:
    """GET /api/v1/health every ``period`` seconds; round trips recorded while ``recording``."""

    def __init__(self, url: str, period: float = 0.1) -> None:
        self.url, self.period = url, period
        self.samples: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with ServiceClient(self.url, timeout=60.0) as client:
            while not self.stop.is_set():
                t0 = time.perf_counter()
                client.health()
                self.samples.append(time.perf_counter() - t0)
                self.stop.wait(self.period)


def analyst(url: str, slow: str, stop: threading.Event, ran: list[str]) -> None:
    with ServiceClient(url, timeout=120.0) as client:
        while not stop.is_set():
            try:
                client.sql(slow)
                ran.append("done")
            except ServiceRefused as exc:
                ran.append(str(exc.status))
                if exc.status == 503:
                    stop.wait(float(exc.retry_after or 1))


@contextmanager
def ledger_target(kind: str, folder: Path, cluster: TemporaryPostgres | None) -> Iterator[str]:
    if kind == "postgres":
        assert cluster is not None
        yield cluster.create_database(f"bench_{uuid.uuid4().hex[:12]}")
    else:
        yield str(folder / "ledger.duckdb")


def one_run(args: argparse.Namespace, mode: str, ledger: str, folder: Path) -> dict[str, float]:
    clients, nice = MODES[mode]
    with RefServer("mcp-2025-11-25", time_scale=1.0, idempotency=True) as server:
        cfg = folder / f"finality-{uuid.uuid4().hex[:6]}.toml"
        cfg.write_text(config(server, args.qps, nice))
        svc = ServiceProcess(ledger, cfg, startup_timeout=120).start()
        try:
            sim = {
                "duration_ms": int(args.duration_s * 1000),
                "poll_interval_ms": int(args.interval_s * 1000),
            }
            nodes = [f"r-{uuid.uuid4().hex[:8]}-{i}" for i in range(args.ops)]

            def submit(chunk: list[str]) -> None:
                with ServiceClient(svc.url, timeout=60.0) as client:
                    for node in chunk:
                        client.submit(call_node=node, tool="generate_report", arguments={"_sim": sim})

            # Many submitters: on a loaded machine one submission's round trip takes seconds, and
            # the service takes concurrent submissions in one tick's group commit.
            with ThreadPoolExecutor(args.submitters) as pool:
                list(pool.map(submit, [nodes[i :: args.submitters] for i in range(args.submitters)]))
            time.sleep(args.warmup_s)
            prober = Prober(svc.url)
            stop = threading.Event()
            ran: list[str] = []
            workers = [
                threading.Thread(target=analyst, args=(svc.url, SLOW[args.ledger], stop, ran), daemon=True)
                for _ in range(clients)
            ]
            window_start = time.time()
            prober.thread.start()
            for w in workers:
                w.start()
            with ServiceClient(svc.url, timeout=60.0) as client:
                for node in nodes[: args.cancels]:
                    client.cancel(node, actor="bench", reason="cancel-confirmation probe")
            time.sleep(args.window_s)
            window_end = time.time()
            prober.stop.set()
            stop.set()
            prober.thread.join(timeout=60)
            for w in workers:
                w.join(timeout=60)
            # Let the cancels confirm (bounded), then read the figures from the ledger.
            deadline = time.monotonic() + 120
            with ServiceClient(svc.url, timeout=60.0) as client:
                while time.monotonic() < deadline and not all(
                    client.show(n)["terminal"] for n in nodes[: args.cancels]
                ):
                    time.sleep(1)
        finally:
            svc.stop(timeout=60)
    lo = datetime.fromtimestamp(window_start, UTC)
    hi = datetime.fromtimestamp(window_end, UTC)
    gaps = query(ledger, LATENESS_SQL, [lo, hi])
    lateness = [g - args.interval_s for g in gaps]
    cancels = query(ledger, CANCEL_SQL, [])
    return {
        "poll_lateness_p99_s": p99(lateness),
        "polls_in_window": float(len(lateness)),
        "health_p99_s": p99(prober.samples),
        "health_samples": float(len(prober.samples)),
        "cancel_p99_s": p99(cancels),
        "cancels_confirmed": float(len(cancels)),
        "analyst_queries_done": float(ran.count("done")),
        "analyst_503": float(ran.count("503")),
        "analyst_stopped_at_time_limit": float(ran.count("400")),
        "analyst_other": float(len([r for r in ran if r not in ("done", "400", "503")])),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--cancels", type=int, default=100)
    parser.add_argument("--submitters", type=int, default=32)
    parser.add_argument("--interval-s", type=float, default=5.0)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--qps", type=float, default=2000)
    parser.add_argument("--ledger", choices=["duckdb", "postgres"], default="duckdb")
    parser.add_argument(
        "--modes", default="baseline,readers", help="comma-separated, from: " + ", ".join(MODES)
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if modes[:1] != ["baseline"] or not set(modes) <= set(MODES):
        parser.error(f"--modes must start with baseline and name only {', '.join(MODES)}")
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp, contextlib_cluster(args.ledger) as cluster:
        for i in range(args.runs):
            for mode in modes:
                folder = Path(tmp) / f"{mode}-{i}"
                folder.mkdir()
                with ledger_target(args.ledger, folder, cluster) as ledger:
                    run = one_run(args, mode, ledger, folder)
                results[mode].append(run)
                print(f"run {i + 1} {mode}: {run} (uptime: {load()})", file=sys.stderr, flush=True)
    report = Report("readers", "python bench/readers.py " + " ".join(sys.argv[1:]))
    suffix = f" ({args.ledger})"
    for key, label in (
        ("poll_lateness_p99_s", "poll lateness p99"),
        ("health_p99_s", "health latency p99"),
        ("cancel_p99_s", "cancel confirmation p99"),
    ):
        base = [r[key] for r in results["baseline"]]
        report.add(f"{label}, no readers{suffix}", "s", base, better="lower")
        for mode in modes[1:]:
            with_readers = [r[key] for r in results[mode]]
            report.add(
                f"{label}, {LABELS[mode]}{suffix}",
                "s",
                with_readers,
                baseline=f"{label}, no readers{suffix}",
                better="lower",
            )
            ratio = (
                statistics.median(with_readers) / statistics.median(base)
                if statistics.median(base)
                else float("inf")
            )
            report.notes.append(f"{label}{suffix}: {mode}/baseline median ratio {ratio:.2f} (bound: 1.2)")
    for key in (
        "polls_in_window",
        "health_samples",
        "cancels_confirmed",
        "analyst_queries_done",
        "analyst_503",
    ):
        report.notes.append(f"{key}: " + ", ".join(f"{m} {[r[key] for r in results[m]]}" for m in modes))
    report.notes.append(f"uptime at the end: {load()}")
    if args.json:
        report.emit()
    else:
        for f in report.figures:
            print(f"{f.name}: median {f.median:.4f} {f.unit} runs {list(f.runs)}")
        for note in report.notes:
            print(note)
    return 0


def load() -> str:
    """The load averages (1, 5, 15 min), as ``uptime`` prints them."""
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


@contextmanager
def contextlib_cluster(kind: str) -> Iterator[TemporaryPostgres | None]:
    if kind != "postgres":
        yield None
        return
    with TemporaryPostgres().start() as cluster:
        yield cluster


if __name__ == "__main__":
    raise SystemExit(main())
