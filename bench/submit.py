"""Submission latency: ``POST /api/v1/calls`` from many concurrent callers to the reply, which comes once
the operation's SUBMITTING record is durable (the service answers only after that commit, so the time
to the reply bounds the time to the durable record from above).

One ``finality serve`` process (DuckDB ledger file on disk) in front of an AIP-151 reference server.
Two arrival shapes, each run on a fresh service (and ledger) of its own, both in every run:

- burst: ``--calls`` callers, each on its own kept-alive HTTP/1.1 connection, send one new call each,
  all at the same instant;
- steady: the same number of callers each send one new call every ``--period-s`` (an open-loop
  arrival: each caller's sends are fixed in advance at a random phase, whatever the replies do) for
  ``--steady-s`` seconds: ``calls / period`` submissions a second, spread out.

Each shape's baseline, measured in the same run on the same connections just before, is
``GET /api/v1/health`` in the same shape: what the HTTP stack alone costs. The callers are raw asyncio
streams writing pre-encoded requests (an HTTP client library would add its own milliseconds to every
figure); each latency runs from writing the request to reading the whole reply. A steady caller whose
reply has not come back by its next send time sends late (after the reply); how late is reported
(``lag``), so that a slow service cannot hide behind fewer requests. The service process's CPU over
each shape (from the first request written to the last reply read), divided by the requests, is each
route's CPU per request. Every run checks each call got 201 and that each ledger holds exactly one
operation per call node.

    python bench/submit.py [--runs 3] [--calls 200] [--period-s 1] [--steady-s 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fastmcp_compare import proc_cpu_s
from bench.figures import Report
from engine import run_query
from engine.clock import SystemClock
from refserver.testing import RefServer
from service.testing import ServiceProcess

TOOL = "generate_report"
CLOCK = SystemClock()


def config_text(url: str, *, steady: bool = False) -> str:
    # The steady shape creates thousands of operations; AIP-151 advises no poll interval, so at the
    # default 1 s their status reads would swamp the two cores the measurement shares. Polled once a
    # minute instead, the executor's own work in the window is sending each new call upstream.
    extra = (
        "\n[poll]\ndefault_interval_ms = 60000\nmax_interval_ms = 60000\n\n"
        "[limits]\nsubmissions_per_s_per_principal = 100000\nsubmission_burst = 100000\n"
        if steady
        else ""
    )
    return f"""# bench/submit.py: caps far above the load
global_qps = 5000
rollout_salt = "bench"
{extra}
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


class Steady:
    """One steady shape's latencies, how late each send went out, and the service's CPU seconds."""

    def __init__(self, latencies: list[float], lags: list[float], cpu_s: float, sent: int) -> None:
        self.latencies = latencies
        self.lags = lags
        self.cpu_s = cpu_s
        self.sent = sent


async def steady(
    callers: list[Caller], requests: list[list[bytes]], pid: int, period: float, rng: random.Random
) -> Steady:
    """Each caller sends its ``requests`` one every ``period`` seconds from a random phase (open loop:
    the send times are fixed before the first request); a reply later than the next send time delays
    that send, and the delay is counted in ``lags``."""
    latencies: list[float] = []
    lags: list[float] = []
    loop = asyncio.get_running_loop()
    begin = loop.time() + 0.05

    async def one(caller: Caller, mine: list[bytes]) -> None:
        phase = rng.uniform(0, period)
        for k, payload in enumerate(mine):
            due = begin + phase + k * period
            delay = due - loop.time()
            if delay > 0:
                await CLOCK.sleep(timedelta(seconds=delay))
            lags.append(max(0.0, loop.time() - due))
            seconds, status, body = await caller.exchange(payload)
            if status not in (200, 201):
                raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
            latencies.append(seconds)

    cpu = proc_cpu_s(pid)
    await asyncio.gather(*(one(c, mine) for c, mine in zip(callers, requests, strict=True)))
    return Steady(latencies, lags, proc_cpu_s(pid) - cpu, sum(len(m) for m in requests))


async def steady_run(
    port: int, pid: int, calls: int, run: int, period: float, seconds: float
) -> tuple[Steady, Steady, list[str]]:
    """(health, submissions, problems) of one run's steady shape: ``calls`` callers, one request each
    every ``period`` seconds, health for half of ``seconds`` first, then submissions for ``seconds``."""
    rng = random.Random(run)
    callers = [Caller(*await asyncio.open_connection("127.0.0.1", port)) for _ in range(calls)]
    problems: list[str] = []
    health = request("GET", "/api/v1/health", port)
    per_caller = max(1, round(seconds / period))
    try:
        for caller in callers:  # every connection accepted and warm before anything is timed
            await caller.exchange(health)
        baseline = await steady(
            callers, [[health] * max(1, per_caller // 2) for _ in callers], pid, period, rng
        )
        posts = [
            [
                request(
                    "POST",
                    "/api/v1/calls",
                    port,
                    {"call_node": key, "tool": TOOL, "arguments": arguments(key)},
                )
                for key in (f"steady-{run}-{i}-{k}" for k in range(per_caller))
            ]
            for i in range(calls)
        ]
        try:
            submitted = await steady(callers, posts, pid, period, rng)
        except RuntimeError as exc:
            problems.append(f"run {run} steady: {exc}")
            submitted = Steady([0.0], [0.0], 0.0, 0)
    finally:
        for caller in callers:
            caller.close()
    return baseline, submitted, problems


def ledger_holds(ledger: Path, prefix: str, expected: int) -> str | None:
    """None when the ledger holds exactly one operation for each of ``expected`` call nodes."""
    rows = run_query(
        ledger,
        f"SELECT count(*), count(DISTINCT call_node_id) FROM op_identity WHERE call_node_id LIKE '{prefix}%'",
        max_rows=1,
    ).rows
    if tuple(rows[0]) != (expected, expected):
        return f"{prefix}: the ledger holds {rows[0]} operations for {expected} calls"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--period-s", type=float, default=1.0, help="steady: each caller's send interval")
    parser.add_argument("--steady-s", type=float, default=20.0, help="steady: how long submissions run")
    parser.add_argument("--no-steady", action="store_true", help="the burst only (as before)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    p50s: list[float] = []
    p99s: list[float] = []
    base50: list[float] = []
    base99: list[float] = []
    health_cpu: list[float] = []
    submit_cpu: list[float] = []
    s50: list[float] = []
    s99: list[float] = []
    sbase50: list[float] = []
    sbase99: list[float] = []
    slag99: list[float] = []
    scpu: list[float] = []
    sbase_cpu: list[float] = []
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
            problem = ledger_holds(ledger, f"submit-{run}-", args.calls)
            if problem is not None:
                problems.append(problem)
            ms = sorted(1000 * s for s in posts.latencies)
            base = sorted(1000 * s for s in health.latencies)
            health_cpu.append(1000 * health.cpu_s / args.calls)
            submit_cpu.append(1000 * posts.cpu_s / args.calls)
            p50s.append(statistics.median(ms))
            p99s.append(quantile(ms, 99))
            base50.append(statistics.median(base))
            base99.append(quantile(base, 99))
            print(
                f"run {run + 1}/{args.runs} burst: POST p50 {p50s[-1]:.1f} ms, p99 {p99s[-1]:.1f} ms; "
                f"GET health p50 {base50[-1]:.1f} ms, p99 {base99[-1]:.1f} ms; CPU per request "
                f"POST {submit_cpu[-1]:.2f} ms, health {health_cpu[-1]:.2f} ms",
                file=sys.stderr,
                flush=True,
            )
            if args.no_steady:
                continue
            config = folder / f"steady-{run}.toml"
            config.write_text(config_text(server.url, steady=True))
            ledger = folder / f"steady-{run}.duckdb"
            service = ServiceProcess(ledger, config, seed=run)
            service.start()
            try:
                assert service.pid is not None
                sh, sp, found = asyncio.run(
                    steady_run(service.port, service.pid, args.calls, run, args.period_s, args.steady_s)
                )
            finally:
                service.stop()
            problems += found
            if not found:
                problem = ledger_holds(ledger, f"steady-{run}-", sp.sent)
                if problem is not None:
                    problems.append(problem)
            ms = sorted(1000 * s for s in sp.latencies)
            base = sorted(1000 * s for s in sh.latencies)
            s50.append(statistics.median(ms))
            s99.append(quantile(ms, 99))
            sbase50.append(statistics.median(base))
            sbase99.append(quantile(base, 99))
            slag99.append(quantile(sorted(1000 * s for s in sp.lags), 99))
            scpu.append(1000 * sp.cpu_s / max(1, sp.sent))
            sbase_cpu.append(1000 * sh.cpu_s / max(1, sh.sent))
            print(
                f"run {run + 1}/{args.runs} steady ({sp.sent} POSTs): POST p50 {s50[-1]:.1f} ms, "
                f"p99 {s99[-1]:.1f} ms, send lag p99 {slag99[-1]:.1f} ms; GET health p50 "
                f"{sbase50[-1]:.1f} ms, p99 {sbase99[-1]:.1f} ms; CPU per request POST {scpu[-1]:.2f} ms, "
                f"health {sbase_cpu[-1]:.2f} ms",
                file=sys.stderr,
                flush=True,
            )
    command = f"python bench/submit.py --runs {args.runs} --calls {args.calls}"
    if not args.no_steady:
        command += f" --period-s {args.period_s:g} --steady-s {args.steady_s:g}"
    else:
        command += " --no-steady"
    report = Report("submit", command)
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
    if not args.no_steady:
        report.add("steady: GET /api/v1/health p50 (baseline)", "ms", sbase50, better="lower")
        report.add("steady: GET /api/v1/health p99 (baseline)", "ms", sbase99, better="lower")
        report.add(
            "steady: POST /api/v1/calls p50 (reply after the durable SUBMITTING record)",
            "ms",
            s50,
            baseline="steady: GET /api/v1/health p50 (baseline)",
            better="lower",
        )
        report.add(
            "steady: POST /api/v1/calls p99 (reply after the durable SUBMITTING record)",
            "ms",
            s99,
            baseline="steady: GET /api/v1/health p99 (baseline)",
            better="lower",
        )
        report.add("steady: POST send lag p99 (behind the open-loop schedule)", "ms", slag99, better="lower")
        report.add(
            "steady: GET /api/v1/health: service CPU per request (baseline)", "ms", sbase_cpu, better="lower"
        )
        report.add(
            "steady: POST /api/v1/calls: service CPU per request",
            "ms",
            scpu,
            baseline="steady: GET /api/v1/health: service CPU per request (baseline)",
            better="lower",
        )
    report.notes += [
        f"burst: {args.calls} callers at once, each on its own kept-alive connection (opened and warmed with "
        "one health request first), one new call node each, against a fresh `finality serve` (DuckDB file "
        "ledger) per run in front of an AIP-151 reference server; latency from writing the request to "
        "reading the whole reply. The baseline is the same callers' GET /api/v1/health just before.",
        f"steady: {args.calls} callers, each sending one request every {args.period_s:g} s at a random "
        f"phase (open loop), GET health for {args.steady_s / 2:g} s, then new calls for {args.steady_s:g} s, "
        "on a fresh service of its own (the new operations polled once a minute, so that what the "
        "executor does besides recording them is sending each upstream; principal limits raised above "
        "the load).",
        "The reply is sent only after the commit that holds the operation's SUBMITTING record: each "
        "POST latency is an upper bound on the time to the durable record.",
        "target (issue #18 point 4): p50 <= 5 ms, p99 <= 50 ms.",
        "checked per run: every call answered 201 and the ledger holds exactly one operation per call node"
        + (f"; PROBLEMS: {problems[:5]}" if problems else " (no problems)"),
    ]
    for problem in problems:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    if args.json:
        report.emit()
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
