"""``finality serve`` as a subprocess, driven over its control API against real reference servers."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from cli_kit import finality

from engine.errors import ServiceRefused
from engine.ledger.duckdb import Ledger
from engine.schedule import busiest_window
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess, all_terminal, service_in, wait_until


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, servers: dict[str, RefServer]
) -> Iterator[ServiceProcess]:
    """One service on the default config for the module: each test uses call nodes of its own, and a
    test that counts the servers' operations resets them first (every earlier call is terminal)."""
    with service_in(tmp_path_factory.mktemp("service-http"), servers) as svc:
        yield svc


def reset(servers: dict[str, RefServer]) -> None:
    for server in servers.values():
        server.reset()


def accepted_on_mcp(metrics: str) -> float:
    """The ACCEPTED operations on the MCP 2025-11-25 server in /metrics (0 before the first)."""
    found = re.search(
        r'^finality_operations\{protocol="mcp-2025-11-25",state="ACCEPTED"\} (\S+)$', metrics, re.M
    )
    return float(found.group(1)) if found else 0.0


def test_calls_on_every_protocol_end_with_one_receipt_each(
    service: ServiceProcess, servers: dict[str, RefServer]
) -> None:
    """Submitted calls on the three protocols each end ACCEPTED with a receipt and one server operation."""
    reset(servers)
    nodes = []
    with service.client() as client:
        for i in range(3):
            for tool in ("generate_report", "analyze_upload", "apply_batch_change"):
                node = f"{tool}-{i}"
                client.submit(call_node=node, tool=tool, arguments={"i": i, "_sim": {"duration_ms": 1000}})
                nodes.append(node)
        wait_until(lambda: all_terminal(client, nodes), what="all calls terminal")
        reports = [client.show(node) for node in nodes]
    assert {r["state"] for r in reports} == {"ACCEPTED"}
    assert all(r["receipt"]["status"] == "completed" for r in reports)
    for server in servers.values():
        assert server.stats()["operations_created"]["total"] == 3


def test_submitting_a_call_node_again_returns_its_operation(
    service: ServiceProcess, servers: dict[str, RefServer]
) -> None:
    """Asking twice for one call node never creates a second operation."""
    reset(servers)
    with service.client() as client:
        first = client.submit(call_node="again", tool="generate_report", arguments={"x": 1})
        second = client.submit(call_node="again", tool="generate_report", arguments={"x": 1})
        assert first["operation_id"] == second["operation_id"]
        with pytest.raises(ServiceRefused) as refused:
            client.submit(call_node="again", tool="generate_report", arguments={"x": 2})
        assert refused.value.status == 409
        wait_until(lambda: all_terminal(client, ["again"]), what="terminal")
    assert servers["mcp"].stats()["operations_created"]["total"] == 1


def test_bad_requests_get_clear_errors(service: ServiceProcess) -> None:
    """Unknown tools, missing fields and malformed bodies are refused with 4xx and a message."""
    with service.client() as client:
        with pytest.raises(ServiceRefused, match="unknown tool") as unknown:
            client.submit(call_node="x", tool="no_such_tool", arguments={})
        assert unknown.value.status == 400
        with pytest.raises(ServiceRefused) as missing:
            client.show("never-submitted")
        assert missing.value.status == 404
        with pytest.raises(ServiceRefused, match="actor"):
            client.resolve(1, actor=" ", reason="because")
    import http_kit

    response = http_kit.post(f"{service.url}/api/v1/calls", content=b"{not json", timeout=10)
    assert response.status_code == 400
    assert "not JSON" in response.json()["error"]


def test_cancel_is_recorded_before_it_is_sent_and_confirmed(service: ServiceProcess, tmp_path: Path) -> None:
    """A cancel raises the generation, is recorded, then confirmed by the server's reply."""
    with service.client() as client:
        client.submit(call_node="long", tool="generate_report", arguments={"_sim": {"duration_ms": 60_000}})
        wait_until(lambda: client.show("long")["state"] == "WORKING", what="working")
        client.cancel("long", actor="oncall", reason="not needed")
        wait_until(lambda: all_terminal(client, ["long"]), what="cancelled")
        report = client.show("long")
    assert report["state"] == "CANCELLED_ACCEPTED"
    assert report["receipt"]["status"] == "cancelled"
    assert report["cancel_generation"] == 1
    states = [t["to"] for t in report["transitions"] if t["accepted"]]
    assert states.index("CANCEL_REQUESTED") < states.index("CANCELLED_ACCEPTED")


def test_input_answer_is_bound_to_its_round(service: ServiceProcess) -> None:
    """An answer for a stale round gets 409 and changes nothing; the open round's answer resumes the task."""
    with service.client() as client:
        client.submit(
            call_node="ask",
            tool="generate_report",
            # The task's retention is the round's deadline: ten real minutes (time_scale 0.05), so the
            # round cannot expire while this test runs on a slow machine.
            arguments={"_sim": {"duration_ms": 400, "input_rounds": 1, "ttl_ms": 12_000_000}},
        )
        wait_until(lambda: len(client.approvals()) == 1, what="an approval")
        (approval,) = client.approvals()
        with pytest.raises(ServiceRefused) as stale:
            client.answer(
                approval["operation_id"], approval["input_round"] + 1, actor="bob", answer={"approve": True}
            )
        assert stale.value.status == 409
        assert client.show("ask")["state"] == "INPUT_REQUIRED"
        client.answer(
            approval["operation_id"], approval["input_round"], actor="bob", answer={"approve": True}
        )
        wait_until(lambda: all_terminal(client, ["ask"]), what="answered call to finish")
        assert client.show("ask")["state"] == "ACCEPTED"
        assert client.approvals() == []


def test_metrics_and_health_are_served(service: ServiceProcess) -> None:
    """/metrics speaks Prometheus text; health reports the servers' negotiated protocols."""
    with service.client() as client:
        before = accepted_on_mcp(client.metrics())
        client.submit(call_node="m", tool="generate_report", arguments={})
        wait_until(lambda: all_terminal(client, ["m"]), what="terminal")
        text = client.metrics()
        health = client.health()
    assert accepted_on_mcp(text) == before + 1
    assert health["servers"] == {"mcp": "mcp-2025-11-25", "aip": "aip-151", "ext": "mcp-2026-07-28"}
    assert health["dialect"] == "duckdb"


def test_analyst_sql_is_read_only(service: ServiceProcess) -> None:
    """The SQL route answers SELECTs and refuses writes and file reads with 400."""
    with service.client() as client:
        client.submit(call_node="s", tool="generate_report", arguments={})
        wait_until(lambda: all_terminal(client, ["s"]), what="terminal")
        result = client.sql("SELECT count(*) AS n FROM receipts")
        assert result["columns"] == ["n"]
        for hostile in ("DELETE FROM receipts", "SELECT * FROM read_text('/etc/passwd')", "ATTACH 'x.db'"):
            with pytest.raises(ServiceRefused) as refused:
                client.sql(hostile)
            assert refused.value.status == 400
        assert client.show("s")["state"] == "ACCEPTED"


def test_request_rate_never_exceeds_the_configured_qps(
    tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> None:
    """Measured from the polls table: no 1-second window holds more requests than global_qps."""
    nodes = [f"q{i}" for i in range(40)]
    ledger_path = tmp_path / "qps.duckdb"
    with ServiceProcess(ledger_path, write_config(global_qps=15)) as svc, svc.client() as client:
        for node in nodes:
            client.submit(
                call_node=node,
                tool="generate_report",
                arguments={"_sim": {"duration_ms": 2000, "poll_interval_ms": 200, "ttl_ms": 3_600_000}},
            )
        wait_until(lambda: all_terminal(client, nodes), timeout=60, what="all calls terminal")
    with Ledger.open(ledger_path, read_only=True) as ledger:
        sent: list[datetime] = [row["sent_at"] for row in ledger.polls()]  # type: ignore[misc]
    assert len(sent) > 40
    assert busiest_window(sent, timedelta(seconds=1)) <= 15


def test_bad_config_is_refused_at_start_naming_the_key(tmp_path: Path) -> None:
    """The service does not start on a bad config, and says which key is wrong."""
    config = tmp_path / "bad.toml"
    config.write_text('[servers.a]\nurl = "http://127.0.0.1:9/mcp"\nprotocol = "carrier-pigeon"\n')
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "service",
            "serve",
            "--ledger",
            str(tmp_path / "l.duckdb"),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "servers.a.protocol" in done.stderr


def test_client_reports_an_unreachable_service() -> None:
    """A CLI pointed at no service says so instead of crashing."""
    from engine.errors import ServiceUnavailable

    with ServiceClient("http://127.0.0.1:9", timeout=2) as client, pytest.raises(ServiceUnavailable):
        client.health()


def test_the_service_records_a_gate_run_every_interval(
    tmp_path: Path, write_config: Callable[..., Path]
) -> None:
    """With gate_interval_s set, gate runs (with their raw inputs) appear in the ledger without anyone asking."""
    ledger_path = tmp_path / "gates.duckdb"
    with (
        ServiceProcess(ledger_path, write_config(top="gate_interval_s = 0.2")) as svc,
        svc.client() as client,
    ):
        client.submit(call_node="g1", tool="generate_report", arguments={"_sim": {"duration_ms": 200}})
        wait_until(lambda: all_terminal(client, ["g1"]), what="call terminal")

        def runs() -> int:
            rows = client.sql("SELECT count(DISTINCT run_id) FROM gate_runs")["rows"]
            return int(rows[0][0])

        wait_until(lambda: runs() >= 3, what="three recorded gate runs", timeout=60)
    with Ledger.open(ledger_path, read_only=True) as ledger:
        latest = ledger.gate_runs(limit=6)
    assert {row["gate"] for row in latest} >= {"duplicate_operations", "traceability"}
    assert all(row["inputs"] for row in latest)


def test_a_negative_gate_interval_is_refused_naming_the_key(
    tmp_path: Path, write_config: Callable[..., Path]
) -> None:
    """gate_interval_s must be 0 (off) or a number of seconds (``finality serve`` run in this process)."""
    result = finality(
        "serve",
        "--ledger",
        str(tmp_path / "l.duckdb"),
        "--config",
        str(write_config(top="gate_interval_s = -1")),
        "--port",
        "0",
    )
    assert result.returncode == 2
    assert "gate_interval_s" in result.stderr
