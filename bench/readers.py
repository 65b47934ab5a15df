"""The executor while analysts read (issue 22 points 3-4): windows with and without 4 analyst clients.

Each run starts one MCP 2025-11-25 reference server (real time) and ``finality serve`` (shipped
defaults for ``[analyst]``: 2 reader workers, a queue of 8, 10-s queries, readers at nice 19,
at most one fewer analyst queries at once than the cores, at least one),
submits ``--ops`` calls that poll for longer than the run (server-advised interval ``--interval-s``),
lets them settle for ``--warmup-s``, then measures windows of ``--window-s`` each, the modes in the
order A B B A ... (``--rounds`` passes): both modes are measured on the same service, the same
ledger and the same minutes of the machine's load, so the machine's drift (this machine is shared;
its load moves by a factor of two within minutes) falls on both alike. In each window:

* poll lateness: for every poll sent in the window, ``sent_at`` minus the instant it was due (the
  previous answer's ``received_at`` plus the advised interval), from the ledger's polls table
  (p99; it includes the executor's up-to-10 % jitter in both modes alike);
* health latency: ``GET /api/v1/health`` every 100 ms from a client thread, round trip (p99);
* cancel confirmation: ``--cancels`` operations cancelled at the window's start; from
  ``cancel_requested_at`` to the receipt's ``accepted_at`` (p99), from the ledger;
* CPU: the service's threads and its child processes (the reader processes that run analyst SQL
  on DuckDB) from ``/proc/PID/task/*/schedstat`` (its own at nice 0, the niced readers, the part
  in reader processes, the loop thread's run time and its wait for a CPU) and, on PostgreSQL, the
  cluster's backends (the analysts' are the niced ones).

Each run prints one line with its three readers/no-readers p99 ratios, the loop thread's wait for
a CPU in each mode and the load average (``uptime``) at its end.

In ``readers`` windows 4 client threads run a 10-s analyst query (``POST /api/v1/sql``, stopped
by the service's time limit) back to back, starting ``--lead-s`` before the window; a 503 (queue
full) is retried after its Retry-After. ``baseline`` windows are the same without them. Each p99
pools the samples of a mode's windows in one run; the figures are medians over runs, and the
readers/baseline ratio of each p99 is the figure the issue bounds at 1.2.

``--modes baseline,readers-nice0`` measures the readers at ``[analyst] nice = 0`` instead (reader
threads, and a local PostgreSQL analyst backend, at normal CPU priority): what the low priority buys.

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
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.figures import Report
from engine.clock import SystemClock, monotonic_seconds
from engine.ledger import duckdb_client, pg_client
from engine.testing.postgres import TemporaryPostgres
from refserver.testing import RefServer
from service.client import ServiceClient, ServiceRefused
from service.testing import ServiceProcess

CLOCK = SystemClock()

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
WHERE o.cancel_requested_at >= ? AND o.cancel_requested_at < ?
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
        with pg_client.connect(ledger) as conn:
            rows = conn.execute(text.replace("?", "%s"), params).fetchall()
    else:
        con = duckdb_client.connect(ledger, read_only=True)
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


class ThreadClock:
    """CPU of one process's threads (``/proc/PID/task/*/schedstat``): time run and time waited on a run queue."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self.pids = pids

    def sample(self) -> dict[tuple[int, int], tuple[int, float, float]]:
        """(pid, tid) -> (niceness, seconds run, seconds waited for a CPU), since the thread started."""
        out: dict[tuple[int, int], tuple[int, float, float]] = {}
        for pid in self.pids():
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        stat = f.read()
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        run, wait = f.read().split()[:2]
                except OSError:
                    continue
                nice = int(stat[stat.rfind(")") + 2 :].split()[16])
                out[(pid, int(tid))] = (nice, int(run) / 1e9, int(wait) / 1e9)
        return out


def cpu_between(
    before: dict[tuple[int, int], tuple[int, float, float]],
    after: dict[tuple[int, int], tuple[int, float, float]],
    main_tid: int | None = None,
) -> dict[str, float]:
    """CPU-seconds run between two samples, by niceness (0: the executor's; > 0: the niced readers),
    and the part of it in the service's child processes (its reader processes: ``main_tid`` is the
    service's pid, and every other pid sampled is a child of it)."""
    own = niced = children = main_run = main_wait = 0.0
    for key, (nice, run, wait) in after.items():
        _, run0, wait0 = before.get(key, (nice, 0.0, 0.0))
        if nice > 0:
            niced += run - run0
        else:
            own += run - run0
        if main_tid is not None and key[0] != main_tid:
            children += run - run0
        if key[1] == main_tid:
            main_run, main_wait = run - run0, wait - wait0
    return {
        "cpu_nice0": own,
        "cpu_niced": niced,
        "cpu_children": children,
        "loop_ran": main_run,
        "loop_waited": main_wait,
    }


def with_children(pid: int) -> Callable[[], list[int]]:
    """``pid`` and its child processes now (the service's reader processes start on first use)."""

    def pids() -> list[int]:
        found = [pid]
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return found
        # Each thread lists the children it started (a reader process: the reader thread's).
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    found += [int(c) for c in f.read().split()]
            except (OSError, ValueError):
                continue
        return found

    return pids


def postgres_pids(data: Path | None) -> Callable[[], list[int]]:
    """The cluster's postmaster and its children (the backends), for their CPU."""

    def pids() -> list[int]:
        if data is None:
            return []
        try:
            postmaster = int((data / "postmaster.pid").read_text().split()[0])
            with open(f"/proc/{postmaster}/task/{postmaster}/children") as f:
                return [postmaster, *(int(c) for c in f.read().split())]
        except (OSError, ValueError, IndexError):
            return []

    return pids


def window_order(modes: list[str], rounds: int) -> list[str]:
    """Modes in the windows of one run: forwards, then backwards (A B B A ...), so a drift over the
    run (the ledger grows, the machine's load changes) falls on every mode alike."""
    order: list[str] = []
    for r in range(rounds):
        order += modes if r % 2 == 0 else modes[::-1]
    return order


def one_run(
    args: argparse.Namespace, modes: list[str], ledger: str, folder: Path, pg_data: Path | None
) -> dict[str, dict[str, float]]:
    """One service, its calls submitted once, then windows of every mode in ``window_order``."""
    order = window_order(modes, args.rounds)
    windows: list[tuple[str, float, float]] = []
    health: dict[str, list[float]] = {m: [] for m in modes}
    ran: dict[str, list[str]] = {m: [] for m in modes}
    cpu: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    pg_cpu: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with RefServer("mcp-2025-11-25", time_scale=1.0, idempotency=True) as server:
        cfgs = {}
        for nice in {MODES[m][1] for m in modes}:
            cfg = folder / f"finality-{uuid.uuid4().hex[:6]}.toml"
            cfg.write_text(config(server, args.qps, nice))
            cfgs[nice] = cfg
        if len(cfgs) > 1:
            raise SystemExit("one run has one service: modes of one run must share the [analyst] nice")
        svc = ServiceProcess(ledger, next(iter(cfgs.values())), startup_timeout=120).start()
        assert svc.pid is not None
        service_pid = svc.pid
        # The service's threads and its reader processes (analyst SQL on DuckDB runs in those).
        service_clock = ThreadClock(with_children(service_pid))
        pg_clock = ThreadClock(postgres_pids(pg_data))
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
            CLOCK.sleep_blocking(timedelta(seconds=args.warmup_s))
            for k, mode in enumerate(order):
                clients, _ = MODES[mode]
                prober = Prober(svc.url)
                stop = threading.Event()
                workers = [
                    threading.Thread(
                        target=analyst, args=(svc.url, SLOW[args.ledger], stop, ran[mode]), daemon=True
                    )
                    for _ in range(clients)
                ]
                for w in workers:
                    w.start()
                # The analysts' first queries are under way before the window opens.
                CLOCK.sleep_blocking(timedelta(seconds=args.lead_s if clients else 0.0))
                window_start = CLOCK.now().timestamp()
                s0, p0 = service_clock.sample(), pg_clock.sample()
                prober.thread.start()
                with ServiceClient(svc.url, timeout=60.0) as client:
                    for node in nodes[k * args.cancels : (k + 1) * args.cancels]:
                        client.cancel(node, actor="bench", reason="cancel-confirmation probe")
                CLOCK.sleep_blocking(
                    timedelta(seconds=max(0.0, window_start + args.window_s - CLOCK.now().timestamp()))
                )
                window_end = CLOCK.now().timestamp()
                s1, p1 = service_clock.sample(), pg_clock.sample()
                cpu[mode].append(cpu_between(s0, s1, service_pid))
                pg_cpu[mode].append(cpu_between(p0, p1))
                prober.stop.set()
                stop.set()
                prober.thread.join(timeout=60)
                health[mode] += prober.samples
                # A query under way runs into its 10-s limit: the next window starts after it.
                for w in workers:
                    w.join(timeout=120)
                windows.append((mode, window_start, window_end))
                CLOCK.sleep_blocking(timedelta(seconds=args.gap_s))
            # Let the cancels confirm (bounded), then read the figures from the ledger.
            deadline = monotonic_seconds() + 180
            cancelled = nodes[: len(order) * args.cancels]
            with ServiceClient(svc.url, timeout=60.0) as client:
                while monotonic_seconds() < deadline and not all(
                    client.show(n)["terminal"] for n in cancelled
                ):
                    CLOCK.sleep_blocking(timedelta(seconds=1))
        finally:
            svc.stop(timeout=60)
    out: dict[str, dict[str, float]] = {}
    for mode in modes:
        lateness: list[float] = []
        cancels: list[float] = []
        seconds = 0.0
        for m, lo, hi in windows:
            if m != mode:
                continue
            span: list[object] = [datetime.fromtimestamp(lo, UTC), datetime.fromtimestamp(hi, UTC)]
            lateness += [g - args.interval_s for g in query(ledger, LATENESS_SQL, span)]
            cancels += query(ledger, CANCEL_SQL, span)
            seconds += hi - lo
        total = {k: sum(c[k] for c in cpu[mode]) for k in cpu[mode][0]}
        backends = {k: sum(c[k] for c in pg_cpu[mode]) for k in pg_cpu[mode][0]}
        out[mode] = {
            "poll_lateness_p99_s": p99(lateness),
            "polls_in_window": float(len(lateness)),
            "health_p99_s": p99(health[mode]),
            "health_samples": float(len(health[mode])),
            "cancel_p99_s": p99(cancels),
            "cancels_confirmed": float(len(cancels)),
            "analyst_queries_done": float(ran[mode].count("done")),
            "analyst_503": float(ran[mode].count("503")),
            "analyst_stopped_at_time_limit": float(ran[mode].count("400")),
            "analyst_other": float(len([r for r in ran[mode] if r not in ("done", "400", "503")])),
            # CPU per second of window: the service's own threads, its niced reader threads, the
            # loop thread's share and its wait for a CPU; PostgreSQL's backends (niced = analysts').
            "service_cpu_per_s": total["cpu_nice0"] / seconds,
            "readers_cpu_per_s": total["cpu_niced"] / seconds,
            "reader_processes_cpu_per_s": total["cpu_children"] / seconds,
            "loop_ran_per_s": total["loop_ran"] / seconds,
            "loop_waited_per_s": total["loop_waited"] / seconds,
            "pg_backends_cpu_per_s": backends["cpu_nice0"] / seconds,
            "pg_analyst_cpu_per_s": backends["cpu_niced"] / seconds,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--cancels", type=int, default=50, help="operations cancelled per window")
    parser.add_argument("--submitters", type=int, default=32)
    parser.add_argument("--interval-s", type=float, default=5.0)
    parser.add_argument("--duration-s", type=float, default=3600.0)
    parser.add_argument("--warmup-s", type=float, default=10.0)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=2, help="passes over the modes per run (A B, B A, ...)")
    parser.add_argument("--lead-s", type=float, default=1.0, help="analysts start this long before a window")
    parser.add_argument("--gap-s", type=float, default=3.0, help="pause between windows")
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
    if args.ops < args.cancels * args.rounds * len(modes):
        parser.error("--ops must cover --cancels operations for every window")
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    loads: list[str] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib_cluster(args.ledger) as cluster:
        for i in range(args.runs):
            folder = Path(tmp) / f"run-{i}"
            folder.mkdir()
            with ledger_target(args.ledger, folder, cluster) as ledger:
                run = one_run(args, modes, ledger, folder, cluster.data if cluster else None)
            loads.append(load())
            for mode in modes:
                results[mode].append(run[mode])
                print(f"run {i + 1} {mode}: {run[mode]} (uptime: {loads[-1]})", file=sys.stderr, flush=True)
            print(
                f"run {i + 1}: {run_summary(run, modes)} (uptime: {loads[-1]})", file=sys.stderr, flush=True
            )
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
            per_run = [w / b if b else float("inf") for w, b in zip(with_readers, base, strict=True)]
            report.notes.append(
                f"{label}{suffix}: {mode}/baseline median ratio {ratio:.2f} (bound: 1.2); "
                f"per run (same service, interleaved windows): {', '.join(f'{r:.2f}' for r in per_run)}"
            )
    for key in (
        "polls_in_window",
        "health_samples",
        "cancels_confirmed",
        "analyst_queries_done",
        "analyst_stopped_at_time_limit",
        "analyst_503",
        "analyst_other",
        "service_cpu_per_s",
        "readers_cpu_per_s",
        "reader_processes_cpu_per_s",
        "loop_ran_per_s",
        "loop_waited_per_s",
        "pg_backends_cpu_per_s",
        "pg_analyst_cpu_per_s",
    ):
        report.notes.append(
            f"{key}: " + ", ".join(f"{m} {[round(r[key], 3) for r in results[m]]}" for m in modes)
        )
    report.notes.append("uptime at each run's end: " + "; ".join(loads))
    report.notes.append(f"uptime at the end: {load()}")
    if args.json:
        report.emit()
    else:
        for f in report.figures:
            print(f"{f.name}: median {f.median:.4f} {f.unit} runs {list(f.runs)}")
        for note in report.notes:
            print(note)
    return 0


RATIOS = (("poll_lateness_p99_s", "poll"), ("health_p99_s", "health"), ("cancel_p99_s", "cancel"))


def run_summary(run: dict[str, dict[str, float]], modes: list[str]) -> str:
    """One run's three readers/no-readers p99 ratios and the loop thread's wait for a CPU, per mode."""
    base = run["baseline"]
    parts = []
    for mode in modes[1:]:
        ratios = ", ".join(
            f"{short} {run[mode][key] / base[key]:.2f}x" if base[key] else f"{short} inf"
            for key, short in RATIOS
        )
        parts.append(f"{mode}/baseline p99 ratios {ratios}")
    waits = ", ".join(f"{m} {run[m]['loop_waited_per_s']:.3f}" for m in modes)
    return "; ".join(parts) + f"; loop thread's wait for a CPU, s per s: {waits}"


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
