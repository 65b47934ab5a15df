"""Finality against the real fastmcp client: requests, CPU and detection delay per completed task.

One run measures, one after the other, each on a FRESH server, the same workload: ``--calls``
concurrent calls of a tool that takes ``--duration-s`` (3 s), the server advising a poll interval
of ``--poll-s`` (1 s):

* on a **fastmcp-tasks** server (MCP 2026-07-28, the ``io.modelcontextprotocol/tasks`` extension,
  in-memory Docket backend, tool ``slow_report``), three clients:
  - the fastmcp ``Client`` with ``fastmcp_tasks.call_tool_task`` (its own backoff: 20 ms doubling
    up to the advised interval);
  - a raw httpx poller sleeping the advised ``pollIntervalMs`` (bench/_raw_poller.py);
  - ``finality serve``: its own process, a DuckDB ledger file on disk, every call submitted through
    ``POST /api/v1/calls`` (200 concurrent HTTP callers);
* on the project's reference servers (refserver/, MCP 2025-11-25 and AIP-151, tool
  ``generate_report`` with ``_sim`` duration and interval): the raw poller and ``finality serve``.

fastmcp and fastmcp-tasks are not dependencies of the project: this script creates its own
virtualenv (``bench/.venv-fastmcp``, git-ignored) and installs the pinned versions there on first use;
the fastmcp server and client run in it (bench/_fastmcp_side.py). Everything else runs in the
project's environment.

Per client and server: server-counted status reads (``tasks/get`` / ``GetOperation``) per task,
all server-counted requests per task, on fastmcp-tasks how late each status read came after the
advised interval (the server's timeline of each task: ``read_lateness``), CPU ms per completed task (the client's process; for
Finality the serve process, from before the first submission until its last receipt), detection
delay (observed duration - the tool's duration: from just before the client asked to the instant it
held the outcome; for Finality the receipt's ``accepted_at`` in the ledger, after the group commit)
median and p95, and wall time for all calls. Every run checks, per call node, exactly one receipt
(one completed result for the clients) and exactly one server operation and execution; a run that
fails a check is reported, never averaged in silently.

    python bench/fastmcp_compare.py [--runs 5] [--calls 200] [--duration-s 3] [--poll-s 1] [--json]
    python bench/fastmcp_compare.py --quick        # 1 run, 50 calls
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.figures import Report
from engine import run_query
from refserver.testing import RefServer
from service.testing import ServiceProcess

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv-fastmcp"
FASTMCP_TASKS_VERSION = "4.1.4"
FASTMCP_VERSION = "4.1.4"
SIDE = HERE / "_fastmcp_side.py"
RAW = HERE / "_raw_poller.py"

FASTMCP = "fastmcp Client + call_tool_task"
RAW_POLLER = "raw httpx poller"
FINALITY = "finality serve"
SERVERS = ("fastmcp-tasks 2026-07-28", "refserver mcp-2025-11-25", "refserver aip-151")
CLIENTS = {
    SERVERS[0]: (FASTMCP, RAW_POLLER, FINALITY),
    SERVERS[1]: (RAW_POLLER, FINALITY),
    SERVERS[2]: (RAW_POLLER, FINALITY),
}
STATUS_READS = {SERVERS[0]: "tasks/get", SERVERS[1]: "tasks/get", SERVERS[2]: "GetOperation"}


# ------------------------------------------------------------------------------ the fastmcp venv


def venv_python() -> Path:
    """The benchmark's own virtualenv with the pinned fastmcp and fastmcp-tasks, created on first use."""
    python = VENV / "bin" / "python"
    wanted = f"{FASTMCP_TASKS_VERSION} {FASTMCP_VERSION}"
    probe = "from importlib.metadata import version; print(version('fastmcp-tasks'), version('fastmcp'))"
    if python.exists():
        found = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120)
        if found.returncode == 0 and found.stdout.strip() == wanted:
            return python
    print(
        f"creating {VENV.relative_to(HERE.parent)} with fastmcp-tasks {wanted}", file=sys.stderr, flush=True
    )
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            f"fastmcp-tasks=={FASTMCP_TASKS_VERSION}",
            f"fastmcp=={FASTMCP_VERSION}",
        ],
        check=True,
        timeout=900,
    )
    return python


class FastmcpServer:
    """bench/_fastmcp_side.py ``server`` in the fastmcp venv, on a free loopback port."""

    def __init__(self, python: Path, duration_s: float, poll_s: float) -> None:
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(
            [str(python), str(SIDE), "server", "--duration-s", repr(duration_s), "--poll-s", repr(poll_s)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        port = read_ready(self.process, 60.0, self.stderr)
        self.base = f"http://127.0.0.1:{port}"
        self.endpoint = f"{self.base}/mcp"

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.base}/bench/stats", timeout=30) as response:
            return dict(json.loads(response.read()))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._stderr.close()


def read_ready(process: subprocess.Popen[bytes], timeout: float, stderr: Any) -> int:
    """The port from the ``READY <port>`` line, waited for at most ``timeout`` seconds."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout.fileno(), selectors.EVENT_READ)
        while b"\n" not in buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                process.kill()
                raise RuntimeError(f"no READY within {timeout} s:\n{stderr()}")
            if not selector.select(remaining):
                continue
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the server exited before READY:\n{stderr()}")
            buffer += chunk
    return int(buffer.split()[1])


# ---------------------------------------------------------------------------------- measurements


@dataclass
class Measured:
    """One client on one fresh server: the figures and the checks."""

    status_reads_per_task: float
    requests_per_task: float
    cpu_ms_per_task: float
    delay_median_s: float
    delay_p95_s: float
    wall_s: float
    completed: int
    problems: list[str] = field(default_factory=list)
    post_p50_ms: float = math.nan
    """Finality only: POST /api/v1/calls, request to reply (after the durable SUBMITTING record)."""
    post_p99_ms: float = math.nan
    read_late_median_s: float = math.nan
    """fastmcp-tasks only: how long after the advised interval the status reads arrived (``read_lateness``)."""
    read_late_p95_s: float = math.nan


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18] if len(values) > 1 else math.nan


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def check_server(keys: list[str], executions: Counter[str], created: int, problems: list[str]) -> None:
    """Exactly one server operation and one execution per call node."""
    if created != len(keys):
        problems.append(f"server created {created} operations for {len(keys)} call nodes")
    wrong = [k for k in keys if executions.get(k, 0) != 1]
    if wrong:
        problems.append(
            f"{len(wrong)} call nodes did not execute exactly once, e.g. {wrong[0]}: {executions.get(wrong[0], 0)}"
        )


def read_lateness(timelines: dict[str, list[list[float]]], advised_s: float) -> list[float]:
    """How long after the advised interval each status read reached the server, in seconds.

    ``timelines`` (the fastmcp server's, per task): ``[[created], [arrived, answered], ...]``, the
    create's reply and each ``tasks/get``'s arrival and reply. A read's lateness is its arrival
    minus the previous reply of its task (the create's or the last read's) minus ``advised_s``:
    negative when a client read sooner than advised. A client that reads late reads fewer times
    per task, and sees the result later: the figure that tells the two apart.
    """
    late: list[float] = []
    for timeline in timelines.values():
        if not timeline or len(timeline[0]) != 1:
            continue  # no create answered for it (not this benchmark's task)
        previous = timeline[0][0]
        for arrived, answered in timeline[1:]:
            late.append(arrived - previous - advised_s)
            previous = answered
    return late


def measured_from(
    records: list[dict[str, Any]],
    keys: list[str],
    duration_s: float,
    cpu_s: float,
    wall_s: float,
    reads: int,
    requests: int,
    problems: list[str],
) -> Measured:
    done = [r for r in records if "result_at" in r and "error" not in r]
    by_key = Counter(r["key"] for r in done)
    missing = [k for k in keys if by_key.get(k, 0) != 1]
    if missing:
        errors = [r.get("error") for r in records if "error" in r]
        problems.append(
            f"{len(missing)} call nodes without exactly one result, e.g. {missing[0]}; errors: {errors[:2]}"
        )
    delays = sorted(r["result_at"] - r["submitted_at"] - duration_s for r in done)
    n = max(len(done), 1)
    return Measured(
        status_reads_per_task=reads / len(keys),
        requests_per_task=requests / len(keys),
        cpu_ms_per_task=cpu_s * 1000 / n,
        delay_median_s=statistics.median(delays) if delays else math.nan,
        delay_p95_s=p95(delays),
        wall_s=wall_s,
        completed=len(done),
        problems=problems,
    )


def with_lateness(measured: Measured, lateness: list[float]) -> Measured:
    """``measured`` with the median and p95 of its status reads' lateness (when the server told)."""
    if lateness:
        measured.read_late_median_s = statistics.median(lateness)
        measured.read_late_p95_s = p95(lateness)
    return measured


def run_client_process(command: list[str], timeout: float) -> dict[str, Any]:
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{Path(command[1]).name} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


# ------------------------------------------------------------------------------------- one server


@dataclass(frozen=True)
class Workload:
    server: str
    calls: int
    duration_s: float
    poll_s: float
    run: int

    @property
    def protocol(self) -> str:
        return {SERVERS[0]: "mcp-2026-07-28", SERVERS[1]: "mcp-2025-11-25", SERVERS[2]: "aip-151"}[
            self.server
        ]

    @property
    def tool(self) -> str:
        return "slow_report" if self.server == SERVERS[0] else "generate_report"

    def keys(self, tag: str) -> list[str]:
        return [f"cmp-{self.run}-{tag}-{i}" for i in range(self.calls)]

    def arguments(self, key: str) -> dict[str, Any]:
        if self.server == SERVERS[0]:
            return {"key": key}
        return {
            "report": key,
            "_sim": {
                "duration_ms": round(self.duration_s * 1000),
                "poll_interval_ms": round(self.poll_s * 1000),
                "ttl_ms": 3_600_000,
            },
        }

    def argument_template(self) -> str:
        return json.dumps(self.arguments("{key}"))


class Fresh:
    """A fresh server for one client: fastmcp-tasks in its venv, or a reference server."""

    def __init__(self, workload: Workload, python: Path) -> None:
        self.workload = workload
        self.lateness: list[float] = []
        """fastmcp-tasks only, after ``counts``: each status read's ``read_lateness``."""
        self.fastmcp: FastmcpServer | None = None
        self.ref: RefServer | None = None
        if workload.server == SERVERS[0]:
            self.fastmcp = FastmcpServer(python, workload.duration_s, workload.poll_s)
            self.endpoint = self.fastmcp.endpoint
        else:
            self.ref = RefServer(workload.protocol, time_scale=1.0)
            self.ref.start()
            # Finality's AIP-151 adapter takes the server's root (it adds /v1/...).
            self.endpoint = self.ref.url if workload.protocol == "aip-151" else self.ref.endpoint

    def counts(self, keys: list[str], problems: list[str]) -> tuple[int, int]:
        """(status reads, all requests) the server counted; checks one operation per call node."""
        if self.fastmcp is not None:
            stats = self.fastmcp.stats()
            self.lateness = read_lateness(stats["timelines"], self.workload.poll_s)
            methods = Counter(stats["methods"])
            check_server(keys, Counter(stats["executions"]), methods["tools/call"], problems)
            return methods["tasks/get"], sum(methods.values())
        assert self.ref is not None
        stats = self.ref.stats()
        requests = Counter(stats["requests"])
        executions = Counter(
            str(e["arguments"].get("report")) for e in stats["executions"].get("generate_report", [])
        )
        check_server(keys, executions, stats["operations_created"]["total"], problems)
        return requests[STATUS_READS[self.workload.server]], sum(requests.values())

    def close(self) -> None:
        if self.fastmcp is not None:
            self.fastmcp.close()
        if self.ref is not None:
            self.ref.stop()


def measure_fastmcp(workload: Workload, python: Path) -> Measured:
    keys = workload.keys("fmc")
    server = Fresh(workload, python)
    try:
        out = run_client_process(
            [
                str(python),
                str(SIDE),
                "client",
                "--url",
                server.endpoint,
                "--calls",
                str(workload.calls),
                "--prefix",
                f"cmp-{workload.run}-fmc",
            ],
            timeout=workload.duration_s * 20 + 300,
        )
        problems: list[str] = []
        reads, requests = server.counts(keys, problems)
    finally:
        server.close()
    return with_lateness(
        measured_from(
            out["calls"], keys, workload.duration_s, out["cpu_s"], out["wall_s"], reads, requests, problems
        ),
        server.lateness,
    )


def measure_raw(workload: Workload, python: Path) -> Measured:
    keys = workload.keys("raw")
    server = Fresh(workload, python)
    try:
        out = run_client_process(
            [
                sys.executable,
                str(RAW),
                "--protocol",
                workload.protocol,
                "--url",
                server.endpoint,
                "--tool",
                workload.tool,
                "--arguments",
                workload.argument_template(),
                "--calls",
                str(workload.calls),
                "--interval-s",
                repr(workload.poll_s),
                "--prefix",
                f"cmp-{workload.run}-raw",
            ],
            timeout=workload.duration_s * 20 + 300,
        )
        problems: list[str] = []
        reads, requests = server.counts(keys, problems)
    finally:
        server.close()
    return with_lateness(
        measured_from(
            out["calls"], keys, workload.duration_s, out["cpu_s"], out["wall_s"], reads, requests, problems
        ),
        server.lateness,
    )


def finality_config(folder: Path, workload: Workload, url: str) -> Path:
    config = folder / f"finality-{workload.run}.toml"
    # AIP-151 advises no interval: Finality's default poll interval is set to the one the other
    # clients are given, so every client is asked to poll at the same rate.
    config.write_text(
        f"""# bench/fastmcp_compare.py: caps far above the load; the default poll policy otherwise.
global_qps = 5000
rollout_salt = "bench"

[poll]
default_interval_ms = {round(workload.poll_s * 1000)}

[servers.bench]
url = "{url}"
protocol = "{workload.protocol}"
qps = 5000

[tools.{workload.tool}]
server = "bench"
side_effect_free = true
wait_budget_s = 900
"""
    )
    return config


RECEIPTS_SQL = """
SELECT i.call_node_id, count(r.operation_id) AS receipts, min(r.accepted_at) AS accepted_at
FROM op_identity i LEFT JOIN receipts r USING (operation_id)
WHERE i.call_node_id LIKE 'cmp-%'
GROUP BY i.call_node_id
"""


def instant(value: object) -> float:
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
    else:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return moment.timestamp()


async def submit_all(url: str, workload: Workload, keys: list[str]) -> list[dict[str, Any]]:
    """``POST /api/v1/calls`` for every key at once (one HTTP caller each)."""
    limits = httpx.Limits(max_connections=len(keys) + 10, max_keepalive_connections=len(keys) + 10)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:

        async def one(key: str) -> dict[str, Any]:
            record: dict[str, Any] = {"key": key, "submitted_at": time.time()}
            response = await http.post(
                "/api/v1/calls",
                json={"call_node": key, "tool": workload.tool, "arguments": workload.arguments(key)},
            )
            # 201 comes after the SUBMITTING record is durable: this is the submission latency.
            record["post_s"] = time.time() - record["submitted_at"]
            if response.status_code != 201:
                record["error"] = f"HTTP {response.status_code}: {response.text[:200]}"
            return record

        return list(await asyncio.gather(*(one(k) for k in keys)))


def wait_idle(url: str, timeout_s: float) -> None:
    """Until nothing is in flight but operations parked for a person (UNKNOWN, each with an open
    reconciliation entry; the run's receipt check then counts them as missing). One cheap health
    request a second; the reconciliation list only once few are left."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=30) as http:
        while time.monotonic() < deadline:
            in_flight = int(http.get("/api/v1/health").json().get("in_flight", -1))
            if in_flight == 0:
                return
            if 0 < in_flight <= 20 and len(http.get("/api/v1/reconciliation").json()["entries"]) >= in_flight:
                return
            time.sleep(1.0)
    raise RuntimeError(f"operations still in flight after {timeout_s:.0f} s")


def stuck(url: str) -> str:
    """What the operations still in flight are doing (for the error message of a run that hangs)."""
    with httpx.Client(base_url=url, timeout=30) as http:
        rows = http.get("/api/v1/operations", params={"limit": 10_000}).json()["operations"]
        states = Counter(str(r.get("state")) for r in rows)
        waiting = [r for r in rows if r.get("state") not in ("ACCEPTED", "CANCELLED_ACCEPTED")]
        example = http.get(f"/api/v1/operations/{waiting[0]['call_node_id']}").json() if waiting else {}
    return f"states {dict(states)}; e.g. {json.dumps(example.get('transitions'), default=str)[:1500]}"


def measure_finality(workload: Workload, python: Path, folder: Path) -> Measured:
    keys = workload.keys("fin")
    server = Fresh(workload, python)
    ledger = folder / f"finality-{workload.run}-{workload.protocol}.duckdb"
    problems: list[str] = []
    try:
        service = ServiceProcess(
            ledger, finality_config(folder, workload, server.endpoint), seed=workload.run
        )
        service.start()
        try:
            assert service.pid is not None
            cpu0 = proc_cpu_s(service.pid)
            records = asyncio.run(submit_all(service.url, workload, keys))
            try:
                wait_idle(service.url, workload.duration_s * 20 + 120)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"{exc}: {stuck(service.url)}; finality serve said:\n{service.stderr()}"
                ) from exc
            cpu = proc_cpu_s(service.pid) - cpu0
        finally:
            service.stop()
        reads, requests = server.counts(keys, problems)
    finally:
        server.close()
    result = run_query(ledger, RECEIPTS_SQL, max_rows=100_000)
    ledger_rows = {str(row[0]): (int(row[1]), row[2]) for row in result.rows}
    for record in records:
        receipts, accepted = ledger_rows.get(record["key"], (0, None))
        if receipts == 1 and accepted is not None and "error" not in record:
            record["result_at"] = instant(accepted)
        elif "error" not in record:
            record["error"] = f"{receipts} receipts"
    extra = [k for k, (n, _) in ledger_rows.items() if n > 1]
    if extra:
        problems.append(f"{len(extra)} call nodes with more than one receipt")
    started = min(r["submitted_at"] for r in records)
    finished = max((r["result_at"] for r in records if "result_at" in r), default=started)
    measured = measured_from(
        records, keys, workload.duration_s, cpu, finished - started, reads, requests, problems
    )
    with_lateness(measured, server.lateness)
    posts = sorted(r["post_s"] * 1000 for r in records if "post_s" in r)
    if posts:
        measured.post_p50_ms = statistics.median(posts)
        measured.post_p99_ms = statistics.quantiles(posts, n=100)[98] if len(posts) > 1 else posts[0]
    return measured


def one_run(
    args: argparse.Namespace, run: int, python: Path, folder: Path
) -> dict[tuple[str, str], Measured]:
    out: dict[tuple[str, str], Measured] = {}
    for server in SERVERS if not args.fastmcp_only else SERVERS[:1]:
        workload = Workload(server, args.calls, args.duration_s, args.poll_s, run)
        clients = list(CLIENTS[server])
        # Rotate the order each run so no client always goes first on a machine that warms up.
        shift = run % len(clients)
        for client in clients[shift:] + clients[:shift]:
            if client == FASTMCP:
                m = measure_fastmcp(workload, python)
            elif client == RAW_POLLER:
                m = measure_raw(workload, python)
            else:
                m = measure_finality(workload, python, folder)
            out[(server, client)] = m
            print(
                f"run {run + 1} {server} / {client}: {m.status_reads_per_task:.2f} reads/task, "
                f"{m.cpu_ms_per_task:.1f} CPU ms/task, delay {m.delay_median_s:.2f}/{m.delay_p95_s:.2f} s, "
                f"wall {m.wall_s:.1f} s, {m.completed}/{args.calls}"
                + (
                    f", reads late {m.read_late_median_s:.2f}/{m.read_late_p95_s:.2f} s"
                    if not math.isnan(m.read_late_median_s)
                    else ""
                )
                + (f" PROBLEMS: {m.problems}" if m.problems else ""),
                file=sys.stderr,
                flush=True,
            )
    return out


# ------------------------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--duration-s", type=float, default=3.0)
    parser.add_argument("--poll-s", type=float, default=1.0)
    parser.add_argument("--fastmcp-only", action="store_true", help="skip the reference-server rows")
    parser.add_argument("--quick", action="store_true", help="1 run of 50 calls")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.calls = 1, 50
    python = venv_python()
    runs: list[dict[tuple[str, str], Measured]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            runs.append(one_run(args, run, python, Path(tmp)))
    command = (
        f"python bench/fastmcp_compare.py --runs {args.runs} --calls {args.calls} "
        f"--duration-s {args.duration_s:g} --poll-s {args.poll_s:g}"
        + (" --fastmcp-only" if args.fastmcp_only else "")
    )
    report = Report("fastmcp_compare", command)
    for server in SERVERS if not args.fastmcp_only else SERVERS[:1]:
        cpu_base = FASTMCP if server == SERVERS[0] else RAW_POLLER
        for client in CLIENTS[server]:
            rows = [r[(server, client)] for r in runs]
            label = f"{server}: {client}"
            report.add(
                f"{label}: status reads per task",
                "requests",
                [m.status_reads_per_task for m in rows],
                baseline=None if client == RAW_POLLER else f"{server}: {RAW_POLLER}: status reads per task",
                better="lower",
            )
            report.add(
                f"{label}: requests per task (all)",
                "requests",
                [m.requests_per_task for m in rows],
                baseline=None if client == RAW_POLLER else f"{server}: {RAW_POLLER}: requests per task (all)",
                better="lower",
            )
            report.add(
                f"{label}: CPU per completed task",
                "ms",
                [m.cpu_ms_per_task for m in rows],
                baseline=None if client == cpu_base else f"{server}: {cpu_base}: CPU per completed task",
                better="lower",
            )
            report.add(
                f"{label}: detection delay median",
                "s",
                [m.delay_median_s for m in rows],
                baseline=None if client == RAW_POLLER else f"{server}: {RAW_POLLER}: detection delay median",
                better="lower",
            )
            report.add(
                f"{label}: detection delay p95",
                "s",
                [m.delay_p95_s for m in rows],
                baseline=None if client == RAW_POLLER else f"{server}: {RAW_POLLER}: detection delay p95",
                better="lower",
            )
            if server == SERVERS[0]:
                report.add(
                    f"{label}: status-read lateness median",
                    "s",
                    [m.read_late_median_s for m in rows],
                    better="lower",
                )
                report.add(
                    f"{label}: status-read lateness p95",
                    "s",
                    [m.read_late_p95_s for m in rows],
                    better="lower",
                )
            report.add(f"{label}: wall for all calls", "s", [m.wall_s for m in rows], better="lower")
            if client == FINALITY:
                report.add(
                    f"{label}: POST /api/v1/calls p50", "ms", [m.post_p50_ms for m in rows], better="lower"
                )
                report.add(
                    f"{label}: POST /api/v1/calls p99", "ms", [m.post_p99_ms for m in rows], better="lower"
                )
    problems = [
        f"run {i + 1} {s} / {c}: {p}"
        for i, r in enumerate(runs)
        for (s, c), m in r.items()
        for p in m.problems
    ]
    report.notes += [
        f"Per run and client: {args.calls} concurrent calls of a {args.duration_s:g} s tool, the server advising "
        f"a {args.poll_s:g} s poll interval (AIP-151 advises none: every client is told {args.poll_s:g} s); each "
        "client on its own fresh server, one client at a time, the order rotated every run; client and server "
        "share the machine's 2 cores.",
        f"fastmcp-tasks {FASTMCP_TASKS_VERSION} and fastmcp {FASTMCP_VERSION} in the benchmark's own virtualenv "
        "(bench/.venv-fastmcp, created by this script); its server: in-memory Docket backend, worker concurrency "
        "1000, JSON responses.",
        "CPU per completed task: the client process's CPU from its first call to its last result (the fastmcp "
        "Client and the raw poller), or the `finality serve` process's CPU from before the first POST /api/v1/calls "
        "until nothing is in flight (its durable DuckDB ledger file included). Ratios are against the fastmcp "
        "Client on the fastmcp server and against the raw poller on the reference servers.",
        "Detection delay = observed duration - the tool's duration; observed from just before the call was sent "
        "(for Finality: before its POST /api/v1/calls) to the result in hand (for Finality: the receipt's "
        "accepted_at, recorded after the group commit). Status reads and requests are counted by the servers.",
        "Status-read lateness (fastmcp-tasks only, from the server's own timeline of each task): when a tasks/get "
        "arrived, minus the previous reply for its task (the create's or the last read's), minus the advised "
        "interval. A client that reads late reads fewer times per task and sees results later; 0 is on time.",
        f"POST /api/v1/calls p50/p99: {args.calls} concurrent HTTP callers, from just before the request to its "
        "201 reply, which the service sends after the SUBMITTING record is committed.",
        "Checks every run: exactly one receipt (one completed result) per call node, exactly one server operation "
        "and one execution per call node. "
        + ("All passed." if not problems else f"FAILED: {'; '.join(problems[:5])}"),
    ]
    if args.json:
        report.emit()
    else:
        for figure in report.figures:
            print(f"{figure.name:80s} {figure.median:9.3f} {figure.unit}")
        for note in report.notes:
            print(f"- {note}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
