"""Analyst SQL of a running ``finality serve`` on a PostgreSQL ledger: fewer queries at once than the
reader workers, the rest queued, the one over the queue refused (issue 22 point 4).

A real service process over a real PostgreSQL; each query runs until the test cancels its backend
(``pg_cancel_backend``), so what runs and what waits is read from ``pg_stat_activity`` and the
service's health, never from elapsed time.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import http_kit
from pg_kit import analyst_backends

from engine.ledger import pg_client
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess, wait_until

SLEEPER = "SELECT pg_sleep(120) AS slept"

# Two reader workers, no queue beyond them, one analyst query at a time.
CONFIG = """
global_qps = 50
rollout_salt = "pg-analysts"

[servers.aip]
url = "{url}"
protocol = "aip-151"
qps = 50

[tools.analyze_upload]
server = "aip"
side_effect_free = true

[analyst]
workers = 2
queue = 0
queries = 1
timeout_s = 120
"""


def _cancel(pg_url: str, pid: int) -> None:
    with pg_client.connect(pg_url, autocommit=True) as conn:
        conn.execute("SELECT pg_cancel_backend(%s)", [pid])


def _written(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


class _Query:
    """One analyst query sent from a thread of its own; its HTTP answer once it has one."""

    def __init__(self, url: str) -> None:
        self.answer: http_kit.Response | None = None
        self.thread = threading.Thread(target=self._ask, args=(url,))
        self.thread.start()

    def _ask(self, url: str) -> None:
        self.answer = http_kit.post(f"{url}/api/v1/sql", json={"query": SLEEPER}, timeout=180)

    def result(self) -> http_kit.Response:
        self.thread.join(timeout=180)
        assert self.answer is not None
        return self.answer


def test_with_one_analyst_slot_the_second_query_waits_in_the_queue_and_the_third_gets_503_with_retry_after(
    pg_url: str, tmp_path: Path
) -> None:
    """queries = 1 of 2 workers: one analyst backend runs, the next query waits for it (no second
    backend), one more is refused 503 + Retry-After; the waiting one runs when the first ends, on a
    backend at niceness 19 in the idle scheduling class."""
    config = tmp_path / "finality.toml"
    with (
        RefServer("aip-151", time_scale=0.05) as server,
        ServiceProcess(pg_url, _written(config, CONFIG.format(url=server.url))) as svc,
        ServiceClient(svc.url, timeout=60.0) as client,
    ):
        first = _Query(svc.url)
        wait_until(lambda: len(analyst_backends(pg_url)) == 1, what="the first analyst query running")
        (first_pid,) = analyst_backends(pg_url)
        second = _Query(svc.url)
        wait_until(lambda: client.health()["readers"]["queued"] == 1, what="the second query queued")
        readers = client.health()["readers"]
        assert (readers["analyst_limit"], readers["analyst_running"], readers["running"]) == (1, 1, 1)
        assert analyst_backends(pg_url) == [first_pid], "the queued query must not hold a backend"

        refused = http_kit.post(f"{svc.url}/api/v1/sql", json={"query": "SELECT 1"}, timeout=60)
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"].isdigit()
        assert "queue limit" in refused.json()["error"]

        _cancel(pg_url, first_pid)
        assert first.result().status_code == 400
        # (It may run on the first's connection, so on the same backend.)
        wait_until(
            lambda: client.health()["readers"]["queued"] == 0 and len(analyst_backends(pg_url)) == 1,
            what="the queued query running once the first ended",
        )
        (second_pid,) = analyst_backends(pg_url)
        assert os.getpriority(os.PRIO_PROCESS, second_pid) == 19
        assert os.sched_getscheduler(second_pid) == os.SCHED_IDLE
        _cancel(pg_url, second_pid)
        assert second.result().status_code == 400
        assert client.health()["readers"]["refused"] == 1
