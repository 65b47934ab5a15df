"""10,000 concurrent in-flight operations against one reference server, driven by one executor process.

Reports RSS, CPU-seconds per 1,000 protocol requests, polls per completed operation against the
server-advised minimum ceil(duration / pollInterval), cancel-confirmation p99, and the busiest
one-second window of protocol requests against the configured cap (all measured from the ledger's
polls table, not from the executor's own counters).

    python bench/scale.py [--ops 10000] [--qps 1000] [--duration-s 10] [--interval-s 5] [--cancel-share 0.1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import resource
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from engine.clock import SystemClock
from engine.ledger import Ledger
from engine.model import RECEIPT_STATES
from engine.schedule import busiest_window
from engine.service.config import parse_config
from engine.service.executor import Executor
from refserver.testing import RefServer


async def drive(args: argparse.Namespace, url: str, ledger_path: Path) -> dict[str, object]:
    config = parse_config(
        {
            "global_qps": args.qps,
            "poll": {"default_interval_ms": 1000, "max_interval_ms": 60_000, "retry_backoff_ms": 200},
            "servers": {"ref": {"url": url, "protocol": args.protocol, "qps": args.qps}},
            "tools": {"generate_report": {"server": "ref", "side_effect_free": True, "wait_budget_s": 3600}},
        }
    )
    ledger = Ledger.open(ledger_path)
    executor = Executor(ledger=ledger, config=config, clock=SystemClock())
    await executor.start()
    runner = asyncio.create_task(executor.run())
    sim = {
        "duration_ms": args.duration_s * 1000,
        "poll_interval_ms": args.interval_s * 1000,
        "ttl_ms": 3_600_000,
    }
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    nodes = [f"scale-{i}" for i in range(args.ops)]
    for start in range(0, len(nodes), 1000):
        chunk = nodes[start : start + 1000]
        await executor.submit_many([(n, "generate_report", {"n": n, "_sim": sim}) for n in chunk])
    phases = {"submitted": round(time.perf_counter() - wall0, 1)}
    cancel_nodes = nodes[:: max(1, int(1 / args.cancel_share))] if args.cancel_share > 0 else []
    await asyncio.sleep(args.duration_s / 3)

    async def cancel(node: str) -> None:
        with contextlib.suppress(Exception):  # an operation that finished first cannot be cancelled
            await executor.cancel(node, actor="bench", reason="scale benchmark cancel")

    # Many people cancelling at once, as many API requests would arrive.
    await asyncio.gather(*(cancel(node) for node in cancel_nodes))
    phases["cancelled"] = round(time.perf_counter() - wall0, 1)
    deadline = time.perf_counter() + args.timeout_s
    peak_in_flight = 0
    while time.perf_counter() < deadline:
        peak_in_flight = max(peak_in_flight, executor.in_flight)
        if executor.in_flight == 0:
            break
        await asyncio.sleep(0.5)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    store = executor._store
    flushes, ticks = store.flushes, executor.stats["ticks"]
    commit_s = executor.commit_seconds
    await executor.aclose()
    runner.cancel()
    polls = ledger.polls()
    ops = ledger.operations()
    sent = [row["sent_at"] for row in polls]
    gets = sum(1 for row in polls if row["method"] == "get")
    completed = [op for op in ops if op.state in RECEIPT_STATES and op.cancel_generation == 0]
    cancel_latencies = []
    for op in ops:
        if op.cancel_requested_at is not None and op.state in RECEIPT_STATES:
            cancel_latencies.append((op.updated_at - op.cancel_requested_at).total_seconds())
    ledger.close()
    minimum = math.ceil(args.duration_s / args.interval_s)
    polls_completed = sum(
        1
        for row in polls
        if row["method"] == "get" and row["operation_id"] in {op.operation_id for op in completed}
    )
    return {
        "ops": args.ops,
        "terminal": sum(1 for op in ops if op.state in RECEIPT_STATES),
        "unfinished": sum(1 for op in ops if op.state not in RECEIPT_STATES),
        "peak_in_flight": peak_in_flight,
        "wall_s": round(wall, 1),
        "rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "requests": len(polls),
        "cpu_s_per_1000_requests": round(cpu / max(1, len(polls)) * 1000, 3),
        "polls_per_completed_op": round(polls_completed / max(1, len(completed)), 3),
        "advised_minimum_polls": minimum,
        "ratio_to_minimum": round(polls_completed / max(1, len(completed)) / minimum, 3),
        "requests_per_completed_op": round(len(polls) / max(1, len(ops)), 3),
        "gets": gets,
        "cancelled": len(cancel_latencies),
        "cancel_p99_s": round(statistics.quantiles(cancel_latencies, n=100)[98], 3)
        if len(cancel_latencies) > 1
        else None,
        "busiest_window": busiest_window(sent, timedelta(seconds=1)),
        "flushes": flushes,
        "ticks": ticks,
        "commit_wait_s": round(commit_s, 1),
        "phases_s": phases,
        "qps_cap": args.qps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--qps", type=float, default=1000)
    parser.add_argument("--duration-s", type=float, default=10)
    parser.add_argument("--interval-s", type=float, default=5)
    parser.add_argument("--cancel-share", type=float, default=0.1)
    parser.add_argument("--protocol", default="aip-151")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--keep-ledger", help="write the ledger here (a new file) and keep it for analysis")
    args = parser.parse_args()
    with RefServer(args.protocol, time_scale=1.0) as server, tempfile.TemporaryDirectory() as tmp:
        url = server.endpoint if args.protocol.startswith("mcp") else server.url
        path = Path(args.keep_ledger) if args.keep_ledger else Path(tmp) / "scale.duckdb"
        if path.exists():
            parser.error(f"--keep-ledger {path} exists; the benchmark writes a new ledger")
        result = asyncio.run(drive(args, url, path))
        result["server_operations_created"] = server.stats()["operations_created"]["total"]
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
