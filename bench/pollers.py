"""Protocol requests per completed operation and completion-detection delay: Finality vs two baseline pollers.

All three pollers drive the same set of task durations against ONE reference server (MCP 2025-11-25,
real time, every task advising the same ``pollInterval``), concurrently, in the same run:

* **Finality**: the real service (``finality serve`` in its own process, its default poll policy:
  ``engine.schedule.poll_delay`` over ``PollPolicy()``, i.e. the server's advised interval plus up
  to 10 % jitter). Its requests are the ledger's ``polls`` rows; "noticed" is when the ledger
  recorded the operation's ``TERMINAL_OBSERVED`` transition.
* **google-api-core-style**: what ``google.api_core`` long-running-operation futures do: sleep
  ``uniform(0, d)`` ("full jitter") before each poll, with ``d`` starting at 1 s, times 1.5 after
  each poll, capped at 20 s; the server's advice is ignored.
* **fastmcp-style**: first poll after 20 ms, each wait double the previous one, capped at the
  server's advised ``pollInterval``.

The baselines speak the wire through Finality's own MCP adapter (``engine.adapters``), so the only
difference between the three is when they ask. Per operation: requests = create + status reads +
result fetch (the session handshake is excluded for all three); detection delay = the instant the
client learned the task was terminal minus the instant the server completed it (``terminal_at`` in
the server's ``/admin/stats``). The server's own request counters are checked against the sum.

    python bench/pollers.py [--runs 5] [--ops 40] [--min-s 2] [--max-s 30] [--interval-ms 5000] [--json]
    python bench/pollers.py --quick      # 12 operations of 2-8 s
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.figures import Report
from engine import AdapterOptions, open_backend, run_query
from engine.adapters import open_client
from engine.adapters.base import Backend, Created, SubmitRequest
from engine.model import (
    RECEIPT_STATES,
    CallNodeId,
    CallRequest,
    Epoch,
    OperationId,
    Principal,
    Protocol,
    ServerStatus,
    ToolRef,
    new_operation,
)
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess

TOOL = ToolRef("generate_report", "1", "1", side_effects=False)
TERMINAL = frozenset({ServerStatus.COMPLETED, ServerStatus.FAILED, ServerStatus.CANCELLED})
FINALITY = "Finality"
GOOGLE = "google-api-core-style"
FASTMCP = "fastmcp-style"
POLICIES = (FINALITY, GOOGLE, FASTMCP)
RECEIPT_VALUES = frozenset(s.value for s in RECEIPT_STATES)


# ------------------------------------------------------------------------------------ the baselines


def google_delays(
    rng: random.Random, initial: float = 1.0, multiplier: float = 1.5, cap: float = 20.0
) -> Iterator[float]:
    """google-api-core's exponential sleep generator: full jitter over a growing, capped ceiling."""
    ceiling = min(initial, cap)
    while True:
        yield rng.uniform(0.0, ceiling)
        ceiling = min(ceiling * multiplier, cap)


def fastmcp_delays(advised_s: float, initial: float = 0.02) -> Iterator[float]:
    """20 ms, doubling, never longer than the server's advised poll interval."""
    delay = min(initial, advised_s)
    while True:
        yield delay
        delay = min(delay * 2, advised_s)


@dataclass
class Sample:
    """One operation as one poller saw it."""

    policy: str
    key: str
    task_id: str | None = None
    requests: int = 0
    noticed_at: datetime | None = None
    status: str | None = None
    error: str | None = None


async def baseline_call(
    backend: Backend, policy: str, key: str, arguments: dict[str, object], delays: Iterator[float]
) -> Sample:
    """Submit one task, poll it on ``delays`` until terminal, then fetch its result."""
    sample = Sample(policy, key)
    request = CallRequest(CallNodeId(key), TOOL, arguments, Principal("anonymous"))
    op = new_operation(
        request,
        operation_id=OperationId(str(uuid.uuid4())),
        protocol=Protocol.MCP_2025_11_25,
        adapter_version=policy,
        server="bench",
        epoch=Epoch(1),
        now=datetime.now(UTC),
    )
    try:
        sample.requests += 1
        created = await backend.submit(SubmitRequest(op, arguments))
        if not isinstance(created, Created):
            raise RuntimeError("the server answered inline; this benchmark needs tasks")
        op = replace(op, task_id=created.view.task_id, server_status=created.view.status)
        sample.task_id = created.view.task_id
        status = created.view.status
        while status not in TERMINAL:
            await asyncio.sleep(next(delays))
            sample.requests += 1
            view = await backend.get(op)
            status = view.status
        sample.noticed_at = datetime.now(UTC)
        op = replace(op, server_status=status)
        sample.requests += 1
        outcome = await backend.fetch_result(op)
        sample.status = outcome.status.value
    except Exception as exc:  # a benchmark records what went wrong and goes on
        sample.error = f"{type(exc).__name__}: {exc}"
    return sample


async def run_baseline(
    url: str,
    policy: str,
    jobs: list[tuple[str, dict[str, object]]],
    make_delays: Callable[[int], Iterator[float]],
) -> list[Sample]:
    async with open_client(pool=400) as client:
        backend = open_backend(
            Protocol.MCP_2025_11_25, url, client=client, token=None, options=AdapterOptions()
        )
        await backend.negotiate(Principal("anonymous"))
        try:
            return list(
                await asyncio.gather(
                    *(
                        baseline_call(backend, policy, key, args, make_delays(i))
                        for i, (key, args) in enumerate(jobs)
                    )
                )
            )
        finally:
            await backend.aclose()


# ---------------------------------------------------------------------------------------- Finality

FINALITY_SQL = """
SELECT i.call_node_id, s.task_id, s.state,
       (SELECT count(*) FROM polls p WHERE p.operation_id = s.operation_id) AS requests,
       (SELECT min(t.recorded_at) FROM transitions t
         WHERE t.operation_id = s.operation_id AND t.to_state = 'TERMINAL_OBSERVED' AND t.accepted) AS observed_at,
       (SELECT min(r.accepted_at) FROM receipts r WHERE r.operation_id = s.operation_id) AS accepted_at
FROM op_state s JOIN op_identity i USING (operation_id)
WHERE i.call_node_id LIKE 'pollers-%'
"""


def write_config(folder: Path, url: str) -> Path:
    config = folder / "finality.toml"
    config.write_text(
        f"""# bench/pollers.py: the service's default poll policy (no [poll] table); caps far above the load.
global_qps = 2000
rollout_salt = "bench"

[servers.ref]
url = "{url}"
protocol = "mcp-2025-11-25"
qps = 2000

[tools.generate_report]
server = "ref"
side_effect_free = true
wait_budget_s = 900
"""
    )
    return config


def submit_finality(service_url: str, jobs: list[tuple[str, dict[str, object]]]) -> None:
    with ServiceClient(service_url, timeout=30) as client:
        for key, arguments in jobs:
            client.submit(call_node=key, tool=TOOL.name, arguments=arguments)


def finality_done(service_url: str, count: int) -> bool:
    """Every Finality operation of this run holds a receipt."""
    with ServiceClient(service_url, timeout=30) as client:
        rows = client.operations(limit=10_000)
    return sum(1 for r in rows if r.get("state") in RECEIPT_VALUES) >= count


def finality_samples(ledger: Path) -> list[Sample]:
    result = run_query(ledger, FINALITY_SQL, max_rows=100_000)
    samples = []
    for row in result.rows:
        values = dict(zip(result.columns, row, strict=True))
        noticed = values["observed_at"] or values["accepted_at"]
        samples.append(
            Sample(
                FINALITY,
                str(values["call_node_id"]),
                str(values["task_id"]) if values["task_id"] else None,
                int(values["requests"]),
                _instant(noticed) if noticed is not None else None,
                str(values["state"]),
                None if values["state"] == "ACCEPTED" else f"ended in {values['state']}",
            )
        )
    return samples


def _instant(value: object) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    text = str(value).replace("Z", "+00:00")
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --------------------------------------------------------------------------------------------- a run


@dataclass
class RunResult:
    requests: dict[str, float]
    """Mean protocol requests per completed operation, by policy."""
    delay_median: dict[str, float]
    delay_p95: dict[str, float]
    completed: dict[str, int]
    failures: dict[str, list[str]]
    server_requests: int
    client_requests: int
    seconds: float


def durations(rng: random.Random, count: int, low: float, high: float) -> list[float]:
    """``count`` durations spread log-uniformly over [low, high] seconds (both ends included)."""
    if count == 1:
        return [low]
    ratio = math.log(high / low)
    points = [low * math.exp(ratio * i / (count - 1)) for i in range(count)]
    rng.shuffle(points)
    return points


async def one_run(args: argparse.Namespace, run: int, server: RefServer, folder: Path) -> RunResult:
    server.reset()
    rng = random.Random(1000 + run)
    spread = durations(rng, args.ops, args.min_s, args.max_s)
    interval_s = args.interval_ms / 1000

    def jobs_for(policy: str) -> list[tuple[str, dict[str, object]]]:
        tag = {FINALITY: "fin", GOOGLE: "gac", FASTMCP: "fmc"}[policy]
        return [
            (
                f"pollers-{run}-{tag}-{i}",
                {
                    "report": f"r{run}-{i}",
                    "_sim": {
                        "duration_ms": round(d * 1000),
                        "poll_interval_ms": args.interval_ms,
                        "ttl_ms": 3_600_000,
                    },
                },
            )
            for i, d in enumerate(spread)
        ]

    ledger = folder / f"pollers-{run}.duckdb"
    started = time.perf_counter()
    service = ServiceProcess(ledger, write_config(folder, server.endpoint), seed=run).start()
    try:
        google_rng = random.Random(2000 + run)
        baselines = asyncio.gather(
            run_baseline(
                server.endpoint,
                GOOGLE,
                jobs_for(GOOGLE),
                lambda i: google_delays(random.Random(google_rng.random())),
            ),
            run_baseline(server.endpoint, FASTMCP, jobs_for(FASTMCP), lambda i: fastmcp_delays(interval_s)),
        )
        await asyncio.to_thread(submit_finality, service.url, jobs_for(FINALITY))
        google, fastmcp = await asyncio.wait_for(baselines, timeout=args.max_s * 3 + 60)
        deadline = time.perf_counter() + args.max_s * 2 + 60
        while not await asyncio.to_thread(finality_done, service.url, args.ops):
            if time.perf_counter() > deadline:
                break
            await asyncio.sleep(0.5)
    finally:
        service.close()
    seconds = time.perf_counter() - started
    stats = server.stats()
    finality = finality_samples(ledger)
    terminal_at = {
        t["id"]: _instant(t["terminal_at"]) for t in stats["tasks"] if t.get("terminal_at") is not None
    }
    requests: dict[str, float] = {}
    delay_median: dict[str, float] = {}
    delay_p95: dict[str, float] = {}
    completed: dict[str, int] = {}
    failures: dict[str, list[str]] = {}
    for policy, samples in ((FINALITY, finality), (GOOGLE, google), (FASTMCP, fastmcp)):
        done = [
            s for s in samples if s.error is None and s.noticed_at is not None and s.task_id in terminal_at
        ]
        failures[policy] = [f"{s.key}: {s.error or 'not noticed'}" for s in samples if s not in done]
        if len(samples) < args.ops:
            failures[policy].append(f"{args.ops - len(samples)} operations missing")
        delays = [(s.noticed_at - terminal_at[s.task_id]).total_seconds() for s in done]  # type: ignore[index,operator]
        completed[policy] = len(done)
        requests[policy] = statistics.fmean(s.requests for s in done) if done else math.nan
        delay_median[policy] = statistics.median(delays) if delays else math.nan
        delay_p95[policy] = statistics.quantiles(delays, n=20)[18] if len(delays) > 1 else math.nan
    counted = stats["requests"]
    server_requests = sum(counted.get(m, 0) for m in ("tools/call", "tasks/get", "tasks/result"))
    client_requests = sum(s.requests for s in [*finality, *google, *fastmcp])
    return RunResult(
        requests, delay_median, delay_p95, completed, failures, server_requests, client_requests, seconds
    )


# ---------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ops", type=int, default=40, help="operations per poller per run")
    parser.add_argument("--min-s", type=float, default=2.0, help="shortest task (seconds)")
    parser.add_argument("--max-s", type=float, default=30.0, help="longest task (seconds)")
    parser.add_argument("--interval-ms", type=int, default=5000, help="the pollInterval the server advises")
    parser.add_argument("--quick", action="store_true", help="12 operations of 2-8 s per poller")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.ops, args.min_s, args.max_s, args.interval_ms = 12, 2.0, 8.0, 2000
    results: list[RunResult] = []
    with RefServer("mcp-2025-11-25", time_scale=1.0) as server, tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            result = asyncio.run(one_run(args, run, server, Path(tmp)))
            results.append(result)
            print(
                f"run {run + 1}/{args.runs} ({result.seconds:.0f} s): "
                + "; ".join(
                    f"{p}: {result.requests[p]:.2f} req/op, detection median {result.delay_median[p]:.2f} s "
                    f"({result.completed[p]}/{args.ops})"
                    for p in POLICIES
                ),
                file=sys.stderr,
                flush=True,
            )
    command = (
        f"python bench/pollers.py --runs {args.runs} --ops {args.ops} --min-s {args.min_s:g} "
        f"--max-s {args.max_s:g} --interval-ms {args.interval_ms}"
    )
    report = Report("pollers", command)
    for policy in POLICIES:
        report.add(
            f"requests per completed operation: {policy}",
            "requests/op",
            [r.requests[policy] for r in results],
            baseline=None if policy == FINALITY else f"requests per completed operation: {FINALITY}",
            better="lower",
        )
    for policy in POLICIES:
        report.add(
            f"detection delay, median: {policy}",
            "s",
            [r.delay_median[policy] for r in results],
            baseline=None if policy == FINALITY else f"detection delay, median: {FINALITY}",
            better="lower",
        )
    for policy in POLICIES:
        report.add(
            f"detection delay, p95: {policy}",
            "s",
            [r.delay_p95[policy] for r in results],
            baseline=None if policy == FINALITY else f"detection delay, p95: {FINALITY}",
            better="lower",
        )
    advised_minimum = statistics.fmean(
        2 + math.ceil(d / (args.interval_ms / 1000))
        for d in durations(random.Random(0), args.ops, args.min_s, args.max_s)
    )
    report.notes += [
        f"One MCP 2025-11-25 reference server at real time; per run {args.ops} tasks per poller, durations "
        f"spread log-uniformly over {args.min_s:g}-{args.max_s:g} s (the same durations for all three pollers), "
        f"every task advising pollInterval {args.interval_ms} ms; all {3 * args.ops} operations run concurrently. "
        f"Ratios are the baseline's median over Finality's (above 1: the baseline needs more).",
        "Requests per completed operation = create + status reads + result fetch; the MCP session handshake "
        f"is not counted for any poller. Polling exactly on the advised interval would need "
        f"{advised_minimum:.2f} on average (create + ceil(duration / interval) reads + result).",
        "Detection delay = when the client learned the task was terminal - when the server completed it "
        "(the server's terminal_at). For Finality, 'learned' is when its ledger recorded TERMINAL_OBSERVED "
        "(after the group commit), so its figure includes the write; for the baselines it is when the status "
        "reply arrived.",
        "Finality is the real `finality serve` process with its default poll policy (engine.schedule "
        "PollPolicy/poll_delay); the baselines run in the benchmark process on Finality's MCP adapter.",
        "Server-side check: the server counted "
        + ", ".join(f"{r.server_requests}" for r in results)
        + " create/get/result requests per run; the pollers counted "
        + ", ".join(f"{r.client_requests}" for r in results)
        + ".",
    ]
    problems = {p: sum(len(r.failures[p]) for r in results) for p in POLICIES}
    if any(problems.values()):
        first = next(f for r in results for p in POLICIES for f in r.failures[p])
        report.notes.append(
            "Operations not counted (did not complete or were not noticed): "
            + ", ".join(f"{p} {n}" for p, n in problems.items())
            + f"; e.g. {first}"
        )
    if args.json:
        report.emit()
    else:
        for figure in report.figures:
            print(
                f"{figure.name:52s} median {figure.median:8.3f} {figure.unit} (min {min(figure.runs):.3f}, max {max(figure.runs):.3f})"
            )
        for note in report.notes:
            print(f"- {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
