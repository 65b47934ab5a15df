"""A naive "time out after 30 s, then call again" client vs Finality, under the seed's faults.

Both sides run the same calls of the side-effecting tool ``apply_batch_change`` against the same
reference servers (one per protocol: MCP 2025-11-25 without idempotency keys, the MCP tasks
extension 2026-07-28, AIP-151), each server injecting every fault it knows at the same small rate
(lost create responses, out-of-order polls, lost and truncated results, stale-epoch results, reused
task ids, 404 before and after expiry, 429/503, connection resets, slow and malformed responses).
The servers are reset between the two sides, so each side starts from the same seeded fault plan.

* **naive**: Finality's own wire adapter driven the way a client without a ledger does it: submit,
  poll at the advised interval, fetch the result; the whole call times out after 30 s (scaled) and
  any timeout or error means "call again" (up to 3 attempts, as ``retries=2`` would).
* **Finality**: the real ``finality serve`` (one process per protocol, fresh ledger per run).

What the SERVERS saw is what counts: second operations created (operations beyond one per call)
and calls whose side effect ran more than once (the execution log, matched by the call's
arguments). Time is scaled: every duration, the poll interval and the naive 30 s timeout are
multiplied by ``--time-scale`` (default 0.05, so 30 s -> 1.5 s and a 5 min call -> 15 s);
Retry-After on 429/503 is whole real seconds and is not scaled.

    python bench/naive_retry.py [--runs 5] [--calls 20] [--time-scale 0.05] [--fault-rate 0.04] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import math
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.figures import Report
from engine import AdapterOptions, EngineError, open_backend
from engine.adapters import open_client
from engine.adapters.base import Created, SubmitRequest
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
from refserver.fault import Fault
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess

TOOL = ToolRef("apply_batch_change", "1", "1", side_effects=True)
PROTOCOLS = ("mcp-2025-11-25", "mcp-2026-07-28", "aip-151")
TERMINAL = frozenset({ServerStatus.COMPLETED, ServerStatus.FAILED, ServerStatus.CANCELLED})
SETTLED = frozenset({s.value for s in RECEIPT_STATES} | {"UNKNOWN"})
NAIVE_TIMEOUT_S = 30.0
NAIVE_ATTEMPTS = 3


def fault_plan(rate: float, seed: int) -> dict[str, object]:
    return {"seed": seed, "rules": [{"fault": f.value, "tool": TOOL.name, "rate": rate} for f in Fault]}


def endpoint(server: RefServer) -> str:
    return server.url if server.protocol == "aip-151" else server.endpoint


def calls_for(run: int, count: int) -> list[tuple[str, dict[str, object]]]:
    """``count`` calls with durations spread log-uniformly over 5 s-5 min (unscaled), shuffled."""
    rng = random.Random(500 + run)
    low, high = 5_000.0, 300_000.0
    spread = [low * math.exp(math.log(high / low) * i / max(1, count - 1)) for i in range(count)]
    rng.shuffle(spread)
    return [
        (
            f"batch-{run}-{i}",
            {
                "batch": f"run{run}-change{i}",
                "_sim": {"duration_ms": round(d), "poll_interval_ms": 5_000, "ttl_ms": 3_600_000},
            },
        )
        for i, d in enumerate(spread)
    ]


# ---------------------------------------------------------------------------------------- the naive


@dataclass
class NaiveCall:
    key: str
    attempts: int = 0
    answered: bool = False
    last_error: str = ""


async def naive_attempt(backend, key: str, attempt: int, arguments: dict[str, object]) -> None:  # type: ignore[no-untyped-def]
    """One whole call: submit as a new request, poll at the advised interval, fetch the result."""
    request = CallRequest(CallNodeId(f"{key}-try{attempt}"), TOOL, arguments, Principal("anonymous"))
    op = new_operation(
        request,
        operation_id=OperationId(str(uuid.uuid4())),
        protocol=backend.protocol,
        adapter_version="naive",
        server="bench",
        epoch=Epoch(1),
        now=datetime.now(UTC),
    )
    submitted = await backend.submit(SubmitRequest(op, arguments))
    if not isinstance(submitted, Created):
        return
    view = submitted.view
    op = replace(op, task_id=view.task_id, server_status=view.status)
    while view.status not in TERMINAL:
        interval = view.poll_interval.total_seconds() if view.poll_interval else 1.0
        await asyncio.sleep(interval)
        view = await backend.get(op)
    if view.outcome is None:
        await backend.fetch_result(replace(op, server_status=view.status))


async def naive_call(backend, key: str, arguments: dict[str, object], timeout_s: float) -> NaiveCall:  # type: ignore[no-untyped-def]
    call = NaiveCall(key)
    for attempt in range(1, NAIVE_ATTEMPTS + 1):
        call.attempts = attempt
        try:
            await asyncio.wait_for(naive_attempt(backend, key, attempt, arguments), timeout=timeout_s)
        except TimeoutError:
            call.last_error = f"timed out after {timeout_s:g} s"
        except EngineError as exc:
            call.last_error = f"{type(exc).__name__}: {exc}"
        else:
            call.answered = True
            return call
    return call


async def run_naive(
    servers: dict[str, RefServer], jobs: list[tuple[str, dict[str, object]]], timeout_s: float
) -> list[NaiveCall]:
    async with open_client(pool=400) as client:
        backends = {}
        for protocol, server in servers.items():
            backends[protocol] = open_backend(
                Protocol(protocol), endpoint(server), client=client, token=None, options=AdapterOptions()
            )
            await backends[protocol].negotiate(Principal("anonymous"))
        try:
            return list(
                await asyncio.gather(
                    *(
                        naive_call(backends[protocol], f"{protocol}:{key}", args, timeout_s)
                        for protocol in servers
                        for key, args in jobs
                    )
                )
            )
        finally:
            for backend in backends.values():
                await backend.aclose()


# ---------------------------------------------------------------------------------------- Finality


def write_config(folder: Path, protocol: str, url: str) -> Path:
    config = folder / f"finality-{protocol}.toml"
    config.write_text(
        f"""# bench/naive_retry.py
global_qps = 1000
rollout_salt = "bench"

[servers.ref]
url = "{url}"
protocol = "{protocol}"
qps = 1000

[tools.{TOOL.name}]
server = "ref"
wait_budget_s = 900
on_budget_exhausted = "stop"
"""
    )
    return config


def run_finality(
    servers: dict[str, RefServer], jobs: list[tuple[str, dict[str, object]]], folder: Path, deadline_s: float
) -> tuple[dict[str, Counter[str]], dict[str, list[str]]]:
    """Submit every call through one service per protocol; wait until each is settled (receipt or UNKNOWN).

    Returns the end states per protocol and the call nodes left in UNKNOWN per protocol.
    """
    services = {}
    try:
        with concurrent.futures.ThreadPoolExecutor(len(servers)) as pool:
            started = {
                protocol: pool.submit(
                    ServiceProcess(
                        folder / f"{protocol}.duckdb", write_config(folder, protocol, endpoint(server))
                    ).start
                )
                for protocol, server in servers.items()
            }
            services = {protocol: future.result() for protocol, future in started.items()}
        for service in services.values():
            with ServiceClient(service.url, timeout=30) as client:
                for key, arguments in jobs:
                    client.submit(call_node=key, tool=TOOL.name, arguments=arguments)
        deadline = time.monotonic() + deadline_s
        states: dict[str, Counter[str]] = {}
        unknown: dict[str, list[str]] = {}
        while True:
            for protocol, service in services.items():
                with ServiceClient(service.url, timeout=30) as client:
                    rows = client.operations(limit=10_000)
                states[protocol] = Counter(str(r["state"]) for r in rows)
                unknown[protocol] = [str(r["call_node_id"]) for r in rows if r["state"] == "UNKNOWN"]
            settled = all(sum(c[s] for s in SETTLED) >= len(jobs) for c in states.values())
            if settled or time.monotonic() > deadline:
                return states, unknown
            time.sleep(0.5)
    finally:
        for service in services.values():
            service.close()


# ------------------------------------------------------------------------------------------- counts


@dataclass
class SideCount:
    """What the servers saw of one side's calls."""

    calls: int
    operations_created: int
    second_operations: int
    executed_twice_or_more: int
    extra_executions: int


def faults_behind(
    servers: dict[str, RefServer], jobs: list[tuple[str, dict[str, object]]], nodes: dict[str, list[str]]
) -> Counter[str]:
    """The faults the server fired on the tasks of these call nodes (found by the call's arguments)."""
    echo_of = {
        key: json.dumps({k: v for k, v in args.items() if k != "_sim"}, sort_keys=True) for key, args in jobs
    }
    causes: Counter[str] = Counter()
    for protocol, server in servers.items():
        stats = server.stats()
        task_of = {
            json.dumps(e["arguments"], sort_keys=True): e["task_id"]
            for e in stats["executions"].get(TOOL.name, [])
        }
        fired: dict[str, list[str]] = {}
        for f in stats["faults_fired"]:
            fired.setdefault(f["task_id"], []).append(f["fault"])
        for node in nodes.get(protocol, []):
            task = task_of.get(echo_of.get(node, ""))
            names = sorted(set(fired.get(task, []))) if task else []
            causes[f"{protocol}: " + ("+".join(names) if names else "no fault fired")] += 1
    return causes


def server_counts(servers: dict[str, RefServer], calls_per_server: int) -> SideCount:
    created = second = twice = extra = 0
    for server in servers.values():
        stats = server.stats()
        created_here = int(stats["operations_created"]["total"])
        runs = Counter(
            json.dumps(e["arguments"], sort_keys=True) for e in stats["executions"].get(TOOL.name, [])
        )
        created += created_here
        reached = len(runs)
        second += max(0, created_here - reached)
        twice += sum(1 for n in runs.values() if n > 1)
        extra += sum(n - 1 for n in runs.values() if n > 1)
    return SideCount(calls_per_server * len(servers), created, second, twice, extra)


# --------------------------------------------------------------------------------------------- main


@dataclass
class RunResult:
    naive: SideCount
    finality: SideCount
    naive_answered: int
    naive_gave_up: int
    finality_accepted: int
    finality_unknown: int
    finality_unsettled: int
    naive_errors: Counter[str]
    finality_states: Counter[str]
    unknown_causes: Counter[str]
    seconds: float


def one_run(args: argparse.Namespace, run: int, servers: dict[str, RefServer], folder: Path) -> RunResult:
    started = time.perf_counter()
    jobs = calls_for(run, args.calls)
    timeout_s = NAIVE_TIMEOUT_S * args.time_scale
    for server in servers.values():
        server.reset()
    naive_calls = asyncio.run(run_naive(servers, jobs, timeout_s))
    naive = server_counts(servers, args.calls)
    for server in servers.values():
        server.reset()
    states, unknown = run_finality(
        servers, jobs, folder / f"run{run}", deadline_s=300 * args.time_scale * 4 + 60
    )
    finality = server_counts(servers, args.calls)
    causes = faults_behind(servers, jobs, unknown)
    total = Counter[str]()
    for counter in states.values():
        total.update(counter)
    errors = Counter(c.last_error.split(":")[0] for c in naive_calls if c.last_error)
    return RunResult(
        naive,
        finality,
        sum(c.answered for c in naive_calls),
        sum(not c.answered for c in naive_calls),
        total["ACCEPTED"] + total["CANCELLED_ACCEPTED"],
        total["UNKNOWN"],
        sum(n for s, n in total.items() if s not in SETTLED),
        errors,
        total,
        causes,
        time.perf_counter() - started,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20, help="calls per protocol per side per run")
    parser.add_argument("--time-scale", type=float, default=0.05)
    parser.add_argument("--fault-rate", type=float, default=0.04, help="rate of each fault per created task")
    parser.add_argument("--quick", action="store_true", help="8 calls per protocol")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.calls = 8
    results: list[RunResult] = []
    with tempfile.TemporaryDirectory() as tmp, concurrent.futures.ThreadPoolExecutor(3) as pool:
        servers = {
            protocol: RefServer(
                protocol, time_scale=args.time_scale, seed=i, fault_plan=fault_plan(args.fault_rate, 11 + i)
            )
            for i, protocol in enumerate(PROTOCOLS)
        }
        try:
            list(pool.map(lambda s: s.start(), servers.values()))
            for run in range(args.runs):
                (Path(tmp) / f"run{run}").mkdir()
                result = one_run(args, run, servers, Path(tmp))
                results.append(result)
                print(
                    f"run {run + 1}/{args.runs} ({result.seconds:.0f} s): naive {result.naive}; "
                    f"finality {result.finality}; finality states {dict(result.finality_states)}",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            for server in servers.values():
                server.stop()
    calls = args.calls * len(PROTOCOLS)
    report = Report(
        "naive_retry",
        f"python bench/naive_retry.py --runs {args.runs} --calls {args.calls} "
        f"--time-scale {args.time_scale:g} --fault-rate {args.fault_rate:g}",
    )
    figures = (
        ("second operations created", "operations", lambda s: s.second_operations),
        ("calls whose side effect ran twice or more", "calls", lambda s: s.executed_twice_or_more),
        ("extra executions of the side-effecting tool", "executions", lambda s: s.extra_executions),
    )
    for name, unit, value in figures:
        naive_name = f"{name}: naive client"
        report.add(naive_name, unit, [value(r.naive) for r in results], better="lower")
        report.add(
            f"{name}: Finality",
            unit,
            [value(r.finality) for r in results],
            baseline=naive_name,
            better="lower",
        )
    report.add("calls answered: naive client", "calls", [r.naive_answered for r in results])
    report.add(
        "calls with an accepted receipt: Finality",
        "calls",
        [r.finality_accepted for r in results],
        baseline="calls answered: naive client",
    )
    report.add(
        "calls left to a person (UNKNOWN, findable by key or task id): Finality",
        "calls",
        [r.finality_unknown for r in results],
        better="lower",
    )
    naive_errors = Counter[str]()
    for r in results:
        naive_errors.update(r.naive_errors)
    report.notes += [
        f"Per run {calls} calls per side ({args.calls} per protocol on {', '.join(PROTOCOLS)}), all concurrent; "
        f"durations spread log-uniformly over 5 s-5 min; every fault the reference server knows armed on each "
        f"created task at rate {args.fault_rate:g} (seeded, the same plan for both sides).",
        f"Time scale factor {args.time_scale:g}: durations, the advised 5 s poll interval and the naive client's "
        f"30 s timeout are all multiplied by it (timeout {NAIVE_TIMEOUT_S * args.time_scale:g} s real); "
        "Retry-After on 429/503 (whole real seconds) is not scaled.",
        f"The naive client makes up to {NAIVE_ATTEMPTS} attempts per call, each a new request; last errors "
        f"of its failed attempts over all runs: {dict(naive_errors.most_common(6))}.",
        "Counted by the servers: operations created beyond one per call, and calls whose execution log entry "
        "(the tool's arguments) appears more than once. MCP 2025-11-25 here offers no idempotency key, so a "
        "Finality call whose create response was lost cannot be looked up by key: it is parked as UNKNOWN for "
        "a person (never resubmitted), which is the last row.",
        "Why Finality left calls to a person (faults the server fired on those tasks, all runs): "
        + json.dumps(dict(sum((r.unknown_causes for r in results), Counter[str]()).most_common()))
        + ". A 404 for a task that exists, a task deleted the moment it ended, a reply naming another "
        "task, a result stamped with an older execution epoch, or a lost create response with no key to "
        "look it up by: the server's word is missing or cannot be trusted, so the operation waits in UNKNOWN "
        "with its key, request digest and candidate task ids instead of being guessed at or resubmitted.",
        "Finality end states over all runs: "
        + json.dumps(dict(sum((r.finality_states for r in results), Counter[str]())), sort_keys=True)
        + (
            f"; {sum(r.finality_unsettled for r in results)} calls were still in flight at the deadline"
            if any(r.finality_unsettled for r in results)
            else ""
        ),
    ]
    if args.json:
        report.emit()
    else:
        for figure in report.figures:
            print(
                f"{figure.name:70s} median {statistics.median(figure.runs):6.1f} "
                f"(min {min(figure.runs):.0f}, max {max(figure.runs):.0f})"
            )
        for note in report.notes:
            print(f"- {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
