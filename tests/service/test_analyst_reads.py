"""Readers never hold the executor back: analyst SQL, frames and snapshots of a running ``finality serve``.

Each test runs the service as a subprocess against the real reference servers; waits are bounded
(``wait_until``, thread joins with timeouts) and ordering is asserted with events, never with
wall-clock thresholds.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import http_kit
import pandas as pd
import pytest

from engine.ledger import duckdb_client
from refserver.testing import RefServer
from service.cli import main
from service.client import ServiceClient, ServiceRefused
from service.testing import ServiceProcess, all_terminal, config_text, wait_until

SLOW = "SELECT count(*) FROM range(100000000000) t(a), range(10) u(b)"


# One service for the module (workers = 1, no queue: a slow query holds the only worker, and a test
# that starts one ends it by killing its reader process); the crowd test needs a 1-s limit, its own.
SHARED = """
workers = 1
queue = 0
timeout_s = 60
memory_limit_mb = 64
max_rows = 100000
max_result_mb = 4
snapshot_keep = 2
"""


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory, servers: dict[str, RefServer]) -> Iterator[ServiceProcess]:
    folder = tmp_path_factory.mktemp("analyst-reads")
    for server in servers.values():
        server.reset()
    config = folder / "finality.toml"
    config.write_text(config_text(servers, extra=f"\n[analyst]\n{SHARED}\n"))
    service = ServiceProcess(folder / "ledger.duckdb", config).start()
    yield service
    service.close()


@pytest.fixture
def start(
    tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> Iterator[Callable[[str], ServiceProcess]]:
    started: list[ServiceProcess] = []

    def run(analyst: str) -> ServiceProcess:
        svc = ServiceProcess(tmp_path / "ledger.duckdb", write_config(extra=f"\n[analyst]\n{analyst}\n"))
        started.append(svc.start())
        return svc

    yield run
    for svc in started:
        svc.close()


class _SlowQuery:
    """One analyst query that runs until its reader process is killed (the shared service's only worker)."""

    def __init__(self, svc: ServiceProcess) -> None:
        self.url = svc.url
        self.answers: list[http_kit.Response] = []
        self.thread = threading.Thread(target=self._ask)
        self.thread.start()

    def _ask(self) -> None:
        # The service is stopped under it if the test fails.
        with contextlib.suppress(http_kit.HTTPError):
            self.answers.append(http_kit.post(f"{self.url}/api/v1/sql", json={"query": SLOW}, timeout=90))

    def process(self, client: ServiceClient) -> dict[str, int]:
        """The reader process running it (waits until it runs)."""

        def running() -> list[dict[str, int]]:
            readers = client.health()["readers"]
            return list(readers["processes"]) if readers["running"] == 1 else []

        wait_until(lambda: bool(running()), what="the slow query running in a reader process")
        (process,) = running()
        return process

    def kill(self, client: ServiceClient) -> http_kit.Response:
        """Kill its reader process; the answer the query's caller got."""
        os.kill(self.process(client)["pid"], signal.SIGKILL)
        self.thread.join(timeout=60)
        assert len(self.answers) == 1
        return self.answers[0]


def _cli(*argv: str) -> tuple[int, str, str]:
    """A finality command run in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _submit(client: ServiceClient, prefix: str, n: int) -> list[str]:
    nodes = [f"{prefix}-{i}" for i in range(n)]
    for node in nodes:
        client.submit(call_node=node, tool="generate_report", arguments={"_sim": {"duration_ms": 200}})
    return nodes


def test_a_query_over_the_memory_limit_fails_naming_it_and_the_service_goes_on(svc: ServiceProcess) -> None:
    """A query needing more than the sandbox's memory_limit is refused naming the limit; the next one runs."""
    with svc.client() as client:
        with pytest.raises(ServiceRefused, match="memory_limit of 64 MB") as refused:
            client.sql("SELECT list(a) FROM range(30000000) t(a)")
        assert refused.value.status == 400
        assert client.health()["status"] == "ok"
        assert client.sql("SELECT 41 + 1 AS n")["rows"] == [[42]]
        node = _submit(client, "after-oom", 1)
        wait_until(lambda: all_terminal(client, node), what="a call after the refused query")


def test_a_query_returning_millions_of_rows_is_cut_at_max_rows_and_more_is_refused_naming_the_limit(
    svc: ServiceProcess,
) -> None:
    """Five million rows come back as max_rows rows marked truncated; asking past the service's row or byte
    limit is refused naming it."""
    with svc.client() as client:
        result = client.sql("SELECT * FROM range(5000000) t(a)", max_rows=1000)
        assert (result["row_count"], result["truncated"]) == (1000, True)
        with pytest.raises(ServiceRefused, match="result limit of 100,000 rows") as over:
            client.sql("SELECT 1", max_rows=200_000)
        assert over.value.status == 400
        with pytest.raises(ServiceRefused, match="more than max_rows=100,000 rows"):
            client.sql_frame("SELECT * FROM range(5000000) t(a)", max_rows=100_000)
        wide = "SELECT repeat('x', 100) AS s FROM range(100000) t(a)"
        with pytest.raises(ServiceRefused, match=r"over the service's result-size limit of 4 MB") as big:
            client.sql(wide, max_rows=100_000)
        assert big.value.status == 400
        with pytest.raises(ServiceRefused, match=r"result-size limit of 4 MB"):
            client.sql_frame(wide, max_rows=100_000)
        assert client.health()["status"] == "ok"


def test_twenty_concurrent_slow_queries_end_at_the_time_limit_or_get_503_with_retry_after(
    start: Callable[[str], ServiceProcess],
) -> None:
    """With 2 workers and a queue of 2, twenty slow queries: at most four run (each stopped at the limit), the rest
    get 503; on SIGTERM the service ends its reader processes."""
    svc = start("workers = 2\nqueue = 2\ntimeout_s = 1")
    barrier = threading.Barrier(20)
    answers: list[http_kit.Response] = []
    lock = threading.Lock()

    def ask() -> None:
        barrier.wait(timeout=30)
        response = http_kit.post(f"{svc.url}/api/v1/sql", json={"query": SLOW}, timeout=60)
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=ask) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert len(answers) == 20
    stopped = [r for r in answers if r.status_code == 400]
    busy = [r for r in answers if r.status_code == 503]
    assert len(stopped) + len(busy) == 20
    assert 1 <= len(stopped) <= 20 - len(busy)
    assert busy, "a full readers' queue must refuse, not queue without bound"
    assert all("time limit" in r.json()["error"] for r in stopped)
    assert all(r.headers["Retry-After"].isdigit() and "queue limit" in r.json()["error"] for r in busy)
    with svc.client() as client:
        health = client.health()
        assert health["status"] == "ok"
        assert health["readers"]["refused"] == len(busy)
    # SIGTERM ends the service and the reader processes it started.
    children = [p["pid"] for p in health["readers"]["processes"]]
    assert 1 <= len(children) <= 2, (health, [r.json() for r in stopped])
    assert svc.stop(timeout=60) == 0, svc.stderr()
    wait_until(
        lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), what="reader processes ended"
    )


def _cpu_ticks(pid: int) -> int:
    """A process's user + system CPU time so far, in clock ticks (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_a_slow_query_runs_in_a_niced_reader_process_and_one_killed_mid_query_fails_only_that_query(
    svc: ServiceProcess,
) -> None:
    """The query burns CPU in a child of the service at nice 19 in the idle scheduling class while
    health and calls answer; kill -9 of that child answers its caller 503 naming the signal, and the
    next query runs in a new child."""
    slow = _SlowQuery(svc)
    with svc.client() as client:
        process = slow.process(client)
        pid = process["pid"]
        assert svc.pid is not None
        assert _parent(pid) == svc.pid
        assert process["nice"] == os.getpriority(os.PRIO_PROCESS, pid) == 19
        # Idle class: any other wakeup preempts it at once, where a nice-19 task keeps its slice.
        assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        # The query's CPU is the reader process's, not the service's.
        spent = _cpu_ticks(pid)
        wait_until(lambda: _cpu_ticks(pid) > spent, what="the reader process burning CPU")
        nodes = _submit(client, "during-query", 3)
        wait_until(lambda: all_terminal(client, nodes), what="calls terminal while the query runs")
        assert client.health()["readers"]["running"] == 1
        assert not slow.answers, "the slow query must still be running when the calls ended"
        lost = slow.kill(client)
        assert lost.status_code == 503, lost.text
        assert "reader process" in lost.json()["error"]
        assert "killed by signal 9" in lost.json()["error"]
        assert lost.headers["Retry-After"].isdigit()
        assert client.sql("SELECT 41 + 1 AS n")["rows"] == [[42]]
        (fresh,) = client.health()["readers"]["processes"]
        assert fresh["pid"] != pid
        assert client.health()["status"] == "ok"


def test_the_dataframe_path_returns_100000_rows_as_arrow_and_refuses_more(svc: ServiceProcess) -> None:
    """sql_frame returns 100,000 rows within the service's limit, refuses 100,001 and a max_rows past the limit."""
    with svc.client() as client:
        node = _submit(client, "frame", 1)
        wait_until(lambda: all_terminal(client, node), what="terminal")
        frame = client.sql_frame(
            "SELECT a, a * 2 AS b, now() AS at FROM range(100000) t(a)", max_rows=100_000
        )
        assert len(frame) == 100_000
        assert list(frame.columns) == ["a", "b", "at"]
        assert int(frame["b"].sum()) == 2 * sum(range(100_000))
        mine = (
            "SELECT r.operation_id, r.status FROM receipts r JOIN operations o USING (operation_id) "
            "WHERE o.call_node_id = 'frame-0'"
        )
        # The reads' snapshot is at most a few seconds old: the receipt shows once it is remade.
        wait_until(lambda: len(client.sql_frame(mine)) == 1, what="the receipt in the analysts' snapshot")
        with pytest.raises(ServiceRefused, match="more than max_rows=100,000 rows"):
            client.sql_frame("SELECT * FROM range(100001) t(a)", max_rows=100_000)
        with pytest.raises(ServiceRefused, match="result limit of 100,000 rows"):
            client.sql_frame("SELECT 1", max_rows=100_001)


def test_a_snapshot_opens_with_plain_duckdb_while_the_service_writes_and_holds_the_rows_as_of_its_instant(
    svc: ServiceProcess, tmp_path: Path
) -> None:
    """finality snapshot writes a file plain duckdb opens read-only; its counts equal the service's at its as-of instant."""
    with svc.client() as client:
        first = _submit(client, "before", 6)
        wait_until(lambda: all_terminal(client, first), what="first batch terminal")
        # Still writing while the snapshot is made: these poll for a while.
        busy = [f"busy-{i}" for i in range(4)]
        for node in busy:
            client.submit(call_node=node, tool="generate_report", arguments={"_sim": {"duration_ms": 3000}})
        out = tmp_path / "copy.duckdb"
        done = subprocess.run(
            [sys.executable, "-m", "service", "snapshot", "--service", svc.url, "--out", str(out), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        con = duckdb_client.connect(str(out), read_only=True)
        try:
            (as_of,) = con.execute("SELECT as_of FROM snapshot_info").fetchone() or (None,)
            assert as_of is not None
            (snap_ops,) = con.execute("SELECT count(*) FROM operations").fetchone() or (0,)
            (snap_receipts,) = con.execute("SELECT count(*) FROM receipts").fetchone() or (0,)
            (mine,) = con.execute(
                "SELECT count(*) FROM operations WHERE call_node_id LIKE 'before-%' OR call_node_id LIKE 'busy-%'"
            ).fetchone() or (0,)
        finally:
            con.close()
        assert mine == 10
        iso = as_of.isoformat()

        def live() -> tuple[int, int]:
            ops = client.sql(f"SELECT count(*) FROM operations WHERE created_at <= TIMESTAMPTZ '{iso}'")
            receipts = client.sql(f"SELECT count(*) FROM receipts WHERE accepted_at <= TIMESTAMPTZ '{iso}'")
            return ops["rows"][0][0], receipts["rows"][0][0]

        # SQL reads the service's own snapshot, a few seconds old at most: equal once it is past as_of.
        wait_until(
            lambda: live() == (snap_ops, snap_receipts), what="the service's counts as of the snapshot"
        )
        # Parquet from the snapshot, read with plain pandas while the service keeps writing.
        parquet = tmp_path / "parquet"
        code, stdout, stderr = _cli("export", "--parquet", str(parquet), "--ledger", str(out), "--json")
        assert code == 0, stderr
        counts = json.loads(stdout)
        assert len(pd.read_parquet(parquet / "operations.parquet")) == counts["operations"] == snap_ops
        polls = pd.read_parquet(parquet / "polls")
        assert len(polls) == counts["polls"] > 0
        assert {"sent_at", "outcome", "day"} <= set(polls.columns)
        # The live file itself is the service's: the export says to take a snapshot instead.
        code, _, stderr = _cli("export", "--parquet", str(tmp_path / "p2"), "--ledger", str(svc.ledger))
        assert code != 0
        assert "finality snapshot --out FILE" in stderr
        # The service went on writing after the snapshot: the busy calls still end.
        wait_until(lambda: all_terminal(client, busy), what="busy calls terminal after the snapshot")
        for _ in range(2):
            client.publish_snapshot()
        kept = http_kit.get(f"{svc.url}/api/v1/snapshots", timeout=10).json()["snapshots"]
        assert len(kept) == 2


def test_console_reads_rollout_status_gates_and_metrics_go_through_the_readers_pool_and_get_503_when_it_is_full(
    svc: ServiceProcess,
) -> None:
    """Lists, rollout status, gates, the audit check and /metrics queue behind analysts (503 + Retry-After), not on the loop."""
    slow = _SlowQuery(svc)
    with svc.client() as client:
        slow.process(client)
        for path in (
            "/api/v1/operations",
            "/api/v1/approvals",
            "/api/v1/reconciliation",
            "/api/v1/rollout/events",
            "/api/v1/rollout/shadow-diffs",
            "/api/v1/rollout/assignments",
            "/api/v1/rollout/status",
            "/api/v1/rollout/audit",
            "/api/v1/gates",
            "/metrics",
        ):
            answer = http_kit.get(f"{svc.url}{path}", timeout=30)
            assert answer.status_code == 503, (path, answer.text)
            assert int(answer.headers["Retry-After"]) >= 1
        # The executor's own answers do not queue: health and a submission go on.
        health = client.health()
        assert health["status"] == "ok"
        # The slow query runs on a worker at the lowest CPU priority (it yields to the executor).
        assert health["readers"]["nice"] == 19
        node = _submit(client, "during-full-pool", 1)
        assert client.show(node[0])["state"]
        # The module's other tests get the worker back.
        assert slow.kill(client).status_code == 503
