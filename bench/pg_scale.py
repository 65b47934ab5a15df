"""Scale-out on PostgreSQL: 1, 2 and 4 executor processes (``finality serve``) sharing one ledger.

Each run starts a fresh database on a throwaway PostgreSQL 15 (``engine.testing.postgres``), one MCP
reference server (idempotency keys), N executor processes on that database, and submits ``--ops``
short calls through the executors' APIs (round robin, two client threads per executor). It times
from the first submission until every operation holds a receipt, and reports per N:

* completed operations/s: operations / that time;
* transitions/s: ledger transitions written (all executors together) / that time;
* CPU seconds per 1,000 operations of each executor process, of PostgreSQL (the postmaster and
  its backends) and of the reference server, read from ``/proc`` (user + system, children
  included) over the same span, so that a reader sees what the cluster costs per operation and
  which part would scale on more cores (the executors) and which is shared (the database).

It also checks each run: one receipt per operation, one server-side operation per call node, and
the busiest one-second window of requests (polls table) within the shared global cap.

    python bench/pg_scale.py [--ops 1500] [--runs 5] [--executors 1,2,4] [--qps 2000] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.figures import Report
from engine import RECEIPT_STATES, open_ledger
from engine.clock import SystemClock, monotonic_seconds
from engine.schedule import busiest_window
from engine.testing.postgres import TemporaryPostgres
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess

CLOCK = SystemClock()

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its waited-for children (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # Fields 14-17 of proc(5): utime, stime, cutime, cstime (counted from field 3, the state).
    return sum(int(f) for f in fields[11:15]) / _TICK


def _tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and of its live children (PostgreSQL's backends)."""
    total = _cpu_s(root)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == root:
            total += sum(int(f) for f in fields[11:15]) / _TICK
    return total


def _postmaster(cluster: TemporaryPostgres) -> int:
    return int((cluster.data / "postmaster.pid").read_text().splitlines()[0])


def _config(server: RefServer, qps: float) -> str:
    return f"""
global_qps = {qps}
rollout_salt = "bench"
gate_interval_s = 0

[poll]
default_interval_ms = 100
min_interval_ms = 50
max_interval_ms = 500
retry_backoff_ms = 100

[servers.mcp]
url = "{server.endpoint}"
protocol = "mcp-2025-11-25"
qps = {qps}

[tools.generate_report]
server = "mcp"
side_effect_free = true
"""


def _submit(executors: list[ServiceProcess], nodes: list[str], duration_ms: int) -> None:
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        client = ServiceClient(executors[worker % len(executors)].url, timeout=60.0)
        try:
            for node in nodes[worker :: 2 * len(executors)]:
                client.submit(
                    call_node=node,
                    tool="generate_report",
                    arguments={"n": node, "_sim": {"duration_ms": duration_ms}},
                )
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(2 * len(executors))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    if errors:
        raise errors[0]


def one_run(
    cluster: TemporaryPostgres, config: Path, server: RefServer, n: int, args: argparse.Namespace
) -> dict[str, float]:
    url = cluster.create_database(f"bench_{uuid.uuid4().hex[:12]}")
    open_ledger(url).close()  # migrate once, before the executors race to
    nodes = [f"b-{uuid.uuid4().hex[:8]}-{i}" for i in range(args.ops)]
    executors = [ServiceProcess(url, config, seed=i, extra_args=["--lease-s", "10"]) for i in range(n)]
    created_before = int(server.stats()["operations_created"]["total"])
    try:
        for executor in executors:
            executor.start()
        postmaster = _postmaster(cluster)
        server_pid = server.pid
        pids = [e.pid for e in executors if e.pid is not None]
        cpu_before = [_cpu_s(pid) for pid in pids]
        pg_before = _tree_cpu_s(postmaster)
        ref_before = _cpu_s(server_pid) if server_pid is not None else 0.0
        started = time.perf_counter()
        _submit(executors, nodes, args.duration_ms)
        with open_ledger(url, read_only=True) as ledger:
            deadline = monotonic_seconds() + args.timeout_s
            while monotonic_seconds() < deadline:
                done = sum(1 for op in ledger.operations() if op.state in RECEIPT_STATES)
                if done == args.ops:
                    break
                CLOCK.sleep_blocking(timedelta(seconds=0.1))
            elapsed = time.perf_counter() - started
            cpu = [_cpu_s(pid) - before for pid, before in zip(pids, cpu_before, strict=True)]
            pg_cpu = _tree_cpu_s(postmaster) - pg_before
            ref_cpu = (_cpu_s(server_pid) if server_pid is not None else 0.0) - ref_before
            ops = ledger.operations()
            transitions = ledger.count("transitions")
            receipts = ledger.count("receipts")
            sent = [p["sent_at"] for p in ledger.polls()]
    finally:
        for executor in executors:
            executor.close()
    finished = sum(1 for op in ops if op.state in RECEIPT_STATES)
    if finished != args.ops:
        raise SystemExit(
            f"{n} executors: {args.ops - finished} operations unfinished after {args.timeout_s} s"
        )
    created = int(server.stats()["operations_created"]["total"]) - created_before
    busiest = busiest_window(sent)  # type: ignore[arg-type]
    if receipts != args.ops or created != args.ops or busiest > args.qps:
        raise SystemExit(
            f"{n} executors: receipts {receipts}, server operations {created}, busiest window {busiest} "
            f"(cap {args.qps}) for {args.ops} calls"
        )
    return {
        "ops_per_s": args.ops / elapsed,
        "transitions_per_s": transitions / elapsed,
        "busiest": float(busiest),
        "elapsed_s": elapsed,
        "executor_cpu_ms_per_op": sum(cpu) * 1000 / args.ops,
        "busiest_executor_cpu_share": max(cpu) / elapsed,
        "pg_cpu_ms_per_op": pg_cpu * 1000 / args.ops,
        "pg_cpu_share": pg_cpu / elapsed,
        "refserver_cpu_ms_per_op": ref_cpu * 1000 / args.ops,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1500)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--executors", default="1,2,4")
    parser.add_argument("--qps", type=float, default=2000)
    parser.add_argument("--duration-ms", type=int, default=300)
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--quick", action="store_true", help="2 runs of 400 operations")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.ops, args.runs = 400, 2
    counts = [int(c) for c in args.executors.split(",")]
    results: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
    with (
        TemporaryPostgres().start() as cluster,
        RefServer("mcp-2025-11-25", idempotency=True) as server,
        tempfile.TemporaryDirectory() as folder,
    ):
        config = Path(folder) / "finality.toml"
        config.write_text(_config(server, args.qps))
        for run in range(args.runs):
            for n in counts:  # interleaved, so machine load drifts over every count alike
                result = one_run(cluster, config, server, n, args)
                results[n].append(result)
                if not args.json:
                    print(
                        f"run {run + 1}/{args.runs}  {n} executor(s): {result['ops_per_s']:.0f} ops/s, "
                        f"{result['transitions_per_s']:.0f} transitions/s, busiest window "
                        f"{result['busiest']:.0f}/{args.qps:g}, {result['elapsed_s']:.1f} s; CPU per "
                        f"operation: executors {result['executor_cpu_ms_per_op']:.2f} ms (busiest "
                        f"{result['busiest_executor_cpu_share']:.0%} of a core), PostgreSQL "
                        f"{result['pg_cpu_ms_per_op']:.2f} ms ({result['pg_cpu_share']:.0%} of a core), "
                        f"reference server {result['refserver_cpu_ms_per_op']:.2f} ms",
                        flush=True,
                    )
    command = "python bench/pg_scale.py" + (
        " --quick" if args.quick else f" --ops {args.ops} --runs {args.runs}"
    )
    report = Report("pg_scale", command)
    first = counts[0]
    for n in counts:
        label = f"{n} executor{'s' if n > 1 else ''}"
        base = None if n == first else f"completed operations/s, {first} executor"
        report.add(
            f"completed operations/s, {label}",
            "operations/s",
            [r["ops_per_s"] for r in results[n]],
            baseline=base,
        )
    for n in counts:
        label = f"{n} executor{'s' if n > 1 else ''}"
        base = None if n == first else f"transitions/s, {first} executor"
        report.add(
            f"transitions/s, {label}",
            "transitions/s",
            [r["transitions_per_s"] for r in results[n]],
            baseline=base,
        )
    for key, name, unit in (
        ("executor_cpu_ms_per_op", "executor CPU per operation (all executors)", "ms"),
        ("busiest_executor_cpu_share", "busiest executor's CPU share of one core", "fraction"),
        ("pg_cpu_ms_per_op", "PostgreSQL CPU per operation", "ms"),
        ("pg_cpu_share", "PostgreSQL CPU share of one core", "fraction"),
        ("refserver_cpu_ms_per_op", "reference server CPU per operation", "ms"),
    ):
        for n in counts:
            label = f"{n} executor{'s' if n > 1 else ''}"
            report.add(f"{name}, {label}", unit, [r[key] for r in results[n]])
    report.notes.append(
        f"{args.ops} calls of {args.duration_ms} ms each through the executors' HTTP APIs per run, "
        f"global cap {args.qps:g} QPS shared through the database; one PostgreSQL 15 (durability off, "
        "memory-backed folder when available), reference server and executors on the same machine"
    )
    report.notes.append(
        "every run checked: one receipt per operation, one server-side operation per call node, "
        "busiest one-second window within the cap"
    )
    if args.json:
        report.emit()
    else:
        for figure in report.figures:
            d = figure.as_dict()
            print(
                f"{figure.name}: median {d['median']:.3g} {figure.unit} "
                f"(min {d['min']:.3g}, max {d['max']:.3g})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
