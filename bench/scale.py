"""10,000 concurrent in-flight operations against one reference server, driven by one executor process.

Reports RSS, CPU-seconds per 1,000 protocol requests, polls per completed operation against the
server-advised minimum ceil(duration / pollInterval), cancel-confirmation p99, and the busiest
one-second window of protocol requests against the configured cap (all measured from the ledger's
polls table, not from the executor's own counters). Every run checks exactly one receipt per call node
(in the ledger) and one server operation per call node (the server's count), and fails otherwise.

    python bench/scale.py [--ops 10000] [--qps 1000] [--duration-s 10] [--interval-s 5] [--cancel-share 0.1]
                          [--runs 5] [--json] [--keep-ledger PATH] [--memory-census]
    python bench/scale.py --from-ledger PATH [--duration-s 10] [--interval-s 5]

``rss_mib`` is the peak RSS of the executor's process (this one: the executor runs in it, the bench's
own per-call-node bookkeeping included); ``server_rss_mib`` the reference server subprocess's, read
apart. ``--memory-census`` (slow: tracemalloc) prints to stderr where the executor's memory is when
every operation has been submitted and when the last operation is terminal: the largest allocation
sites and the live object counts by type.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import contextlib

from bench.figures import Report
from engine import RECEIPT_STATES, Ledger, LocalState, SystemClock, run_query
from engine.schedule import busiest_window
from refserver.testing import RefServer
from service import event_loop
from service.config import parse_config
from service.executor import Executor

CLOCK = SystemClock()


def census(label: str, ledger: Ledger) -> None:
    """Where this process's memory is now (``--memory-census``): allocation sites, object counts,
    and DuckDB's own accounting of its buffers (which tracemalloc does not see)."""
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, tracemalloc.__file__),
            tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
        ]
    )
    stats = snapshot.statistics("lineno")
    total = sum(stat.size for stat in stats)
    lines = [f"--- memory census: {label}: {total / 2**20:.1f} MiB traced, RSS peak {peak_rss_mib()} MiB"]
    lines += [
        f"{stat.size / 2**20:8.1f} MiB {stat.count:9} blocks  {stat.traceback[0]}" for stat in stats[:30]
    ]
    counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    lines += [f"{n:9} {name}" for name, n in counts.most_common(25)]
    duck = ledger._con.execute(
        "SELECT tag, memory_usage_bytes FROM duckdb_memory() WHERE memory_usage_bytes > 0 ORDER BY 2 DESC"
    ).fetchall()
    lines += [f"duckdb {tag}: {used / 2**20:.1f} MiB" for tag, used in duck]
    print("\n".join(lines), file=sys.stderr, flush=True)


def peak_rss_mib() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def server_peak_rss_mib(pid: int | None) -> float | None:
    """The reference server subprocess's peak RSS (``VmHWM``), read before it stops."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


async def drive(args: argparse.Namespace, url: str, ledger_path: Path) -> dict[str, object]:
    config = parse_config(
        {
            "global_qps": args.qps,
            "poll": {"default_interval_ms": 1000, "max_interval_ms": 60_000, "retry_backoff_ms": 200},
            # The AIP-151 reference server deduplicates request_id (as RefServer says): declared, a
            # submission whose reply was lost is looked up and found or proved absent; undeclared
            # (as before session 9) it waits in UNKNOWN for a person: 934 of 100,000 did so at load 24-55.
            "servers": {
                "ref": {
                    "url": url,
                    "protocol": args.protocol,
                    "qps": args.qps,
                    "request_id_dedupe": args.protocol == "aip-151",
                }
            },
            "tools": {"generate_report": {"server": "ref", "side_effect_free": True, "wait_budget_s": 3600}},
        }
    )
    # Opened as `finality serve` opens its ledger (service.serve.open_service_ledger: one DuckDB
    # thread), so that the process measured is the one shipped. With DuckDB's default (a thread per
    # core) a second DuckDB thread ran beside the writer thread (1.9-2.2 CPU-s of a 10,000-operation
    # run); with one, the group commits take longer (bench/results/latest.md, scale, session 11).
    ledger = Ledger.open(ledger_path, threads=1)
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
    op_of: dict[str, str] = {}
    for start in range(0, len(nodes), 1000):
        chunk = nodes[start : start + 1000]
        created = await executor.submit_many([(n, "generate_report", {"n": n, "_sim": sim}) for n in chunk])
        op_of.update({op.call_node_id: op.operation_id for op in created})
    phases = {"submitted": round(time.perf_counter() - wall0, 1)}
    if args.memory_census:
        census(f"{args.ops} submitted, {executor.in_flight} in flight", ledger)
    # A person cancels each chosen operation a third of its duration after it started working,
    # as many API requests arriving over time would (concurrent with each other and the polling).
    waiting = set(nodes[:: max(1, int(1 / args.cancel_share))] if args.cancel_share > 0 else [])
    working_since: dict[str, float] = {}
    cancels: list[asyncio.Task[None]] = []

    async def cancel(node: str) -> None:
        with contextlib.suppress(Exception):  # an operation that finished first cannot be cancelled
            await executor.cancel(node, actor="bench", reason="scale benchmark cancel")

    deadline = time.perf_counter() + args.timeout_s
    peak_in_flight = 0
    while time.perf_counter() < deadline:
        peak_in_flight = max(peak_in_flight, executor.in_flight)
        if executor.in_flight == 0:
            break
        now = time.perf_counter()
        for node in list(waiting):
            op = executor._ops.get(op_of[node])
            if op is None or op.state in RECEIPT_STATES:
                waiting.discard(node)
            elif op.state is LocalState.WORKING:
                since = working_since.setdefault(node, now)
                if now - since >= args.duration_s / 3:
                    waiting.discard(node)
                    cancels.append(asyncio.create_task(cancel(node)))
        if not waiting and "cancels_sent" not in phases:
            phases["cancels_sent"] = round(now - wall0, 1)
        await CLOCK.sleep(timedelta(seconds=0.2))
    await asyncio.gather(*cancels)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    if args.memory_census:
        census(f"{executor.in_flight} in flight after {wall:.0f} s", ledger)
    store = executor._store
    flushes, ticks = store.flushes, executor.stats["ticks"]
    commit_s = executor.commit_seconds
    await executor.aclose()
    runner.cancel()
    # The executor's peak, read before this benchmark's own analysis below loads every poll row and
    # every operation into Python (at 100,000 operations that analysis would be the peak).
    rss_mib = peak_rss_mib()
    figures = ledger_figures(ledger, args)
    ledger.close()
    return {
        "ops": args.ops,
        "terminal": figures.pop("terminal"),
        "unfinished": figures.pop("unfinished"),
        "peak_in_flight": peak_in_flight,
        "wall_s": round(wall, 1),
        "rss_mib": rss_mib,
        "requests": figures["requests"],
        "cpu_s_per_1000_requests": round(cpu / max(1, int(figures["requests"])) * 1000, 3),
        **figures,
        "flushes": flushes,
        "ticks": ticks,
        "commit_wait_s": round(commit_s, 1),
        "phases_s": phases,
        "qps_cap": args.qps,
    }


def ledger_figures(ledger: Ledger, args: argparse.Namespace) -> dict[str, object]:
    """The run's figures that the ledger holds (requests, polls, cancels, the busiest window)."""
    polls = ledger.polls()
    ops = ledger.operations()
    sent = [row["sent_at"] for row in polls]
    gets = sum(1 for row in polls if row["method"] == "get")
    completed = [op for op in ops if op.state in RECEIPT_STATES and op.cancel_generation == 0]
    cancel_latencies = []
    for op in ops:
        if op.cancel_requested_at is not None and op.state in RECEIPT_STATES:
            cancel_latencies.append((op.updated_at - op.cancel_requested_at).total_seconds())
    minimum = math.ceil(args.duration_s / args.interval_s)
    # One set, not one per poll row (that was quadratic: 2 % of a profiled run, after the CPU figure).
    completed_ids = {op.operation_id for op in completed}
    polls_completed = sum(
        1 for row in polls if row["method"] == "get" and row["operation_id"] in completed_ids
    )
    return {
        "terminal": sum(1 for op in ops if op.state in RECEIPT_STATES),
        "unfinished": sum(1 for op in ops if op.state not in RECEIPT_STATES),
        "requests": len(polls),
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
    }


def from_ledger(path: Path, args: argparse.Namespace) -> dict[str, object]:
    """The ledger's figures of a run that was stopped (kill -9) before every operation was terminal,
    and its receipts checked as a finished run's are (more than one receipt per call node fails;
    an unfinished call node has none yet)."""
    ledger = Ledger.open(path)
    try:
        figures = ledger_figures(ledger, args)
    finally:
        ledger.close()
    nodes, one, more = run_query(path, RECEIPTS_SQL, max_rows=1).rows[0]
    figures["call_nodes"] = nodes
    figures["call_nodes_with_one_receipt"] = one
    figures["call_nodes_with_more_than_one"] = more
    return figures


FIGURES = (
    # (result key, figure name, unit, better)
    ("rss_mib", "peak RSS", "MiB", "lower"),
    ("server_rss_mib", "reference server's peak RSS (its own process)", "MiB", "lower"),
    ("cpu_s_per_1000_requests", "CPU per 1,000 protocol requests", "CPU-s", "lower"),
    ("ratio_to_minimum", "status polls per completed operation / advised minimum", "ratio", "lower"),
    (
        "requests_per_completed_op",
        "protocol requests per operation (submit + polls + cancels)",
        "requests",
        "lower",
    ),
    ("busiest_window", "busiest 1-second window of protocol requests", "requests", "lower"),
    ("cancel_p99_s", "cancel-confirmation p99 (requested -> receipt)", "s", "lower"),
    ("wall_s", "wall time until every operation is terminal", "s", "lower"),
)


RECEIPTS_SQL = """
SELECT count(*) AS nodes, count(*) FILTER (WHERE receipts = 1) AS one, count(*) FILTER (WHERE receipts > 1) AS more
FROM (SELECT i.call_node_id, count(r.operation_id) AS receipts
      FROM op_identity i LEFT JOIN receipts r USING (operation_id)
      WHERE i.call_node_id LIKE 'scale-%' GROUP BY i.call_node_id)
"""


def checks(ledger_path: Path, ops: int, server_operations: int) -> list[str]:
    """What broke the run's promise: one receipt per call node, one server operation per call node."""
    nodes, one, more = run_query(ledger_path, RECEIPTS_SQL, max_rows=1).rows[0]
    problems = []
    if (nodes, one) != (ops, ops):
        problems.append(
            f"{one} of {ops} call nodes with exactly one receipt ({nodes} call nodes, {more} with more)"
        )
    if server_operations != ops:
        problems.append(f"{server_operations} server operations for {ops} call nodes")
    return problems


def one_run(args: argparse.Namespace, keep: Path | None) -> dict[str, object]:
    with RefServer(args.protocol, time_scale=1.0) as server, tempfile.TemporaryDirectory() as tmp:
        url = server.endpoint if args.protocol.startswith("mcp") else server.url
        path = keep or Path(tmp) / "scale.duckdb"
        if args.memory_census:
            tracemalloc.start()
        result = event_loop.run(drive(args, url, path))  # the loop `finality serve` runs on
        result["server_rss_mib"] = server_peak_rss_mib(server.pid)
        created = int(server.counts()["operations_created"]["total"])
        result["server_operations_created"] = created
        result["problems"] = checks(path, args.ops, created)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--qps", type=float, default=1000)
    parser.add_argument("--duration-s", type=float, default=10)
    parser.add_argument("--interval-s", type=float, default=5)
    parser.add_argument("--cancel-share", type=float, default=0.1)
    parser.add_argument("--protocol", default="aip-151")
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument(
        "--runs", type=int, default=1, help="runs, each in a fresh process (RSS is per process)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print a bench/figures.py report as the last line"
    )
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)  # one run, its dict as JSON
    parser.add_argument(
        "--memory-census", action="store_true", help="print where the memory is to stderr (slow: tracemalloc)"
    )
    parser.add_argument(
        "--from-ledger", help="print the ledger figures of a stopped run's ledger (a copy: it is migrated)"
    )
    parser.add_argument("--keep-ledger", help="write the ledger here (a new file) and keep it for analysis")
    args = parser.parse_args()
    if args.from_ledger:
        print(json.dumps(from_ledger(Path(args.from_ledger), args), default=str))
        return 0
    keep = Path(args.keep_ledger) if args.keep_ledger else None
    if keep is not None and keep.exists():
        parser.error(f"--keep-ledger {keep} exists; the benchmark writes a new ledger")
    if args.raw or (args.runs == 1 and not args.json):
        result = one_run(args, keep)
        if args.raw:
            print(json.dumps(result, default=str))
        else:
            for key, value in result.items():
                print(f"{key:28} {value}")
        return 1 if result["problems"] else 0
    forwarded = [a for a in sys.argv[1:] if a != "--json"]
    runs: list[dict[str, object]] = []
    for n in range(args.runs):
        done = subprocess.run(
            [sys.executable, __file__, *forwarded, "--raw"], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(f"run {n + 1}/{args.runs}: " + json.dumps(runs[-1], default=str), file=sys.stderr)
        if runs[-1]["problems"]:
            print(f"run {n + 1} failed its checks: {runs[-1]['problems']}", file=sys.stderr)
            return 1
    command = "python bench/scale.py " + " ".join([*forwarded, "--json"])
    report = Report("scale", command)
    for key, name, unit, better in FIGURES:
        values = [float(r[key]) for r in runs if isinstance(r.get(key), int | float)]
        if values:
            report.add(name, unit, values, better=better)
    first = runs[0]
    report.notes.append(
        f"{args.ops} operations in flight at once against one {args.protocol} reference server, one executor "
        f"process; tasks last {args.duration_s} s, the server advises polling every {args.interval_s} s "
        f"(advised minimum {first['advised_minimum_polls']} status polls per operation); QPS cap "
        f"{args.qps:g}; {args.cancel_share:.0%} of operations cancelled a third of the way through."
    )
    report.notes.append(
        "targets (issue #5): RSS <= 1024 MiB; busiest window <= the cap; polls per completed operation "
        "<= 1.1x the advised minimum. Per run: "
        + "; ".join(
            f"terminal {r['terminal']}/{r['ops']}, server operations {r['server_operations_created']}, "
            "one receipt per call node, "
            f"busiest {r['busiest_window']} vs cap {r['qps_cap']}"
            for r in runs
        )
    )
    report.emit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
