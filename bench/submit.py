"""Submission latency: ``POST /api/v1/calls`` from many concurrent callers to the reply, which comes once
the operation's SUBMITTING record is durable.

One ``finality serve`` process (DuckDB ledger file on disk) in front of an AIP-151 reference server;
per run ``--calls`` callers, each on its own kept-alive HTTP/1.1 connection, send one new call each,
all at once. The baseline, measured in the same run on the same connections just before, is
``GET /api/v1/health`` at the same concurrency: what the HTTP stack alone costs. The callers are raw
asyncio streams writing pre-encoded requests (an HTTP client library would add its own milliseconds to
every figure); each latency runs from writing the request to reading the whole reply. The service
process's CPU over each burst (from the first request written to the last reply read), divided by the
callers, is each route's CPU per request: on one event loop, 200 requests at once cannot all be
answered sooner than 200 times that. Every run checks each call got 201 and that the ledger holds
exactly one operation per call node.

    python bench/submit.py [--runs 3] [--calls 200] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fastmcp_compare import proc_cpu_s
from bench.figures import Report
from engine import run_query
from refserver.testing import RefServer
from service.testing import ServiceProcess

TOOL = "generate_report"


def config_text(url: str) -> str:
    return f"""# bench/submit.py: caps far above the load
global_qps = 5000
rollout_salt = "bench"

[servers.bench]
url = "{url}"
protocol = "aip-151"
qps = 5000

[tools.{TOOL}]
server = "bench"
side_effect_free = true
wait_budget_s = 900
"""


def quantile(values: list[float], q: int) -> float:
    """The q-th percentile (statistics' exclusive method) of ``values``."""
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0]


class Caller:
    """One kept-alive HTTP/1.1 connection to the service."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def exchange(self, request: bytes) -> tuple[float, int, bytes]:
        """Send ``request``; (seconds to the whole reply, status, body)."""
        started = time.perf_counter()
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await self.reader.readexactly(length)
        return time.perf_counter() - started, status, body

    def close(self) -> None:
        self.writer.close()


def request(method: str, path: str, port: int, body: dict[str, object] | None = None) -> bytes:
    payload = json.dumps(body).encode() if body is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def arguments(key: str) -> dict[str, object]:
    # Long enough that nothing finishes during the measurement; the executor submits each upstream.
    return {"report": key, "_sim": {"duration_ms": 60_000, "poll_interval_ms": 5_000, "ttl_ms": 3_600_000}}


class Burst:
    """One burst's latencies and the service process's CPU seconds over it."""

    def __init__(self, latencies: list[float], cpu_s: float) -> None:
        self.latencies = latencies
        self.cpu_s = cpu_s


async def one_run(port: int, pid: int, calls: int, run: int) -> tuple[Burst, Burst, list[str]]:
    """(health burst, submission burst, problems) of one run; ``pid`` is the service's process."""
    callers = [Caller(*await asyncio.open_connection("127.0.0.1", port)) for _ in range(calls)]
    problems: list[str] = []
    try:
        health = request("GET", "/api/v1/health", port)
        for caller in callers:  # every connection accepted and warm before anything is timed
            await caller.exchange(health)
        cpu = proc_cpu_s(pid)
        baseline = await asyncio.gather(*(c.exchange(health) for c in callers))
        health_cpu = proc_cpu_s(pid) - cpu
        keys = [f"submit-{run}-{i}" for i in range(calls)]
        posts = [
            request("POST", "/api/v1/calls", port, {"call_node": k, "tool": TOOL, "arguments": arguments(k)})
            for k in keys
        ]
        cpu = proc_cpu_s(pid)
        submitted = await asyncio.gather(*(c.exchange(p) for c, p in zip(callers, posts, strict=True)))
        submit_cpu = proc_cpu_s(pid) - cpu
    finally:
        for caller in callers:
            caller.close()
    for key, (_, status, body) in zip(keys, submitted, strict=True):
        if status != 201:
            problems.append(f"{key}: HTTP {status} {body[:200]!r}")
    return (
        Burst([s for s, _, _ in baseline], health_cpu),
        Burst([s for s, _, _ in submitted], submit_cpu),
        problems,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    p50s: list[float] = []
    p99s: list[float] = []
    base50: list[float] = []
    base99: list[float] = []
    health_cpu: list[float] = []
    submit_cpu: list[float] = []
    problems: list[str] = []
    with RefServer("aip-151") as server, tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            folder = Path(tmp)
            config = folder / f"submit-{run}.toml"
            config.write_text(config_text(server.url))
            ledger = folder / f"submit-{run}.duckdb"
            service = ServiceProcess(ledger, config, seed=run)
            service.start()
            try:
                assert service.pid is not None
                health, posts, found = asyncio.run(one_run(service.port, service.pid, args.calls, run))
            finally:
                service.stop()
            problems += found
            rows = run_query(
                ledger,
                f"SELECT count(*), count(DISTINCT call_node_id) FROM op_identity "
                f"WHERE call_node_id LIKE 'submit-{run}-%'",
                max_rows=1,
            ).rows
            if tuple(rows[0]) != (args.calls, args.calls):
                problems.append(f"run {run}: the ledger holds {rows[0]} operations for {args.calls} calls")
            ms = sorted(1000 * s for s in posts.latencies)
            base = sorted(1000 * s for s in health.latencies)
            health_cpu.append(1000 * health.cpu_s / args.calls)
            submit_cpu.append(1000 * posts.cpu_s / args.calls)
            p50s.append(statistics.median(ms))
            p99s.append(quantile(ms, 99))
            base50.append(statistics.median(base))
            base99.append(quantile(base, 99))
            print(
                f"run {run + 1}/{args.runs}: POST p50 {p50s[-1]:.1f} ms, p99 {p99s[-1]:.1f} ms; "
                f"GET health p50 {base50[-1]:.1f} ms, p99 {base99[-1]:.1f} ms; CPU per request "
                f"POST {submit_cpu[-1]:.2f} ms, health {health_cpu[-1]:.2f} ms",
                file=sys.stderr,
                flush=True,
            )
    report = Report("submit", f"python bench/submit.py --runs {args.runs} --calls {args.calls}")
    report.add("GET /api/v1/health p50 (baseline)", "ms", base50, better="lower")
    report.add("GET /api/v1/health p99 (baseline)", "ms", base99, better="lower")
    report.add(
        "POST /api/v1/calls p50 (reply after the durable SUBMITTING record)",
        "ms",
        p50s,
        baseline="GET /api/v1/health p50 (baseline)",
        better="lower",
    )
    report.add(
        "POST /api/v1/calls p99 (reply after the durable SUBMITTING record)",
        "ms",
        p99s,
        baseline="GET /api/v1/health p99 (baseline)",
        better="lower",
    )
    report.add(
        "GET /api/v1/health: service CPU per request over the burst (baseline)",
        "ms",
        health_cpu,
        better="lower",
    )
    report.add(
        "POST /api/v1/calls: service CPU per request over the burst",
        "ms",
        submit_cpu,
        baseline="GET /api/v1/health: service CPU per request over the burst (baseline)",
        better="lower",
    )
    report.notes += [
        f"{args.calls} callers at once, each on its own kept-alive connection (opened and warmed with one "
        "health request first), one new call node each, against a fresh `finality serve` (DuckDB file "
        "ledger) per run in front of an AIP-151 reference server; latency from writing the request to "
        "reading the whole reply. The baseline is the same callers' GET /api/v1/health just before.",
        "target (issue #18 point 4): p50 <= 5 ms, p99 <= 50 ms.",
        "checked per run: every call answered 201 and the ledger holds exactly one operation per call node"
        + (f"; PROBLEMS: {problems[:5]}" if problems else " (no problems)"),
    ]
    if args.json:
        report.emit()
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
