"""The ready outbox consumed over HTTP from a service on a PostgreSQL ledger, SIGKILLed during long-polls (issue 21)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine.errors import ServiceUnavailable
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess

CONFIG = """
global_qps = 200
rollout_salt = "pg-outbox"

[poll]
default_interval_ms = 100
min_interval_ms = 20
max_interval_ms = 500
retry_backoff_ms = 50

[servers.aip]
url = "{url}"
protocol = "aip-151"
qps = 200

[tools.analyze_upload]
server = "aip"
side_effect_free = true
"""


def test_a_postgres_service_delivers_entries_keeps_acks_and_loses_nothing_to_sigkill(
    pg_url: str, tmp_path: Path
) -> None:
    """Long-poll answered by an acceptance, idempotent ack, then SIGKILL mid long-poll: after a restart all is there."""
    config = tmp_path / "finality.toml"
    with RefServer("aip-151", time_scale=0.05) as server:
        config.write_text(CONFIG.format(url=server.url))
        service = ServiceProcess(pg_url, config, extra_args=["--lease-s", "5"])
        with service, service.client() as client, ThreadPoolExecutor(4) as pool:
            waiting = pool.submit(client.outbox, "pg-wf", wait_s=30)
            first = client.submit_and_wait(call_node="pg-0", tool="analyze_upload", arguments={}, wait_s=30)
            got = waiting.result(timeout=60)["entries"]
            assert [e["call_node_id"] for e in got] == ["pg-0"]
            assert got[0]["result_digest"] == first["receipt"]["result_digest"]
            assert client.ack(got[0], consumer="pg-wf")["repeated"] is False
            assert client.ack(got[0], consumer="pg-wf")["repeated"] is True
            for i in (1, 2):
                client.submit_and_wait(call_node=f"pg-{i}", tool="analyze_upload", arguments={}, wait_s=30)
            pollers = [ServiceClient(service.url) for _ in range(3)]
            polls = [
                pool.submit(p.outbox, name, after=10**9, wait_s=30)
                for p, name in zip(pollers, ("pg-wf", "x", "y"), strict=True)
            ]
            service.kill()
            failures = [p.exception(timeout=60) for p in polls]
            for p in pollers:
                p.close()
        assert all(isinstance(f, ServiceUnavailable) for f in failures)
        with ServiceProcess(pg_url, config, extra_args=["--lease-s", "5"]) as again, again.client() as client:
            left = [e["call_node_id"] for e in client.outbox("pg-wf", wait_s=0)["entries"]]
            everyone = [e["call_node_id"] for e in client.outbox("newcomer", wait_s=0)["entries"]]
            lag = {row["consumer"]: row for row in client.outbox_lag()}
    assert left == ["pg-1", "pg-2"]
    assert everyone == ["pg-0", "pg-1", "pg-2"]
    assert lag["pg-wf"]["acknowledged"] == 1
    assert lag["pg-wf"]["behind"] == 2
