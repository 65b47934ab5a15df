"""The ``finality`` commands as a person uses them while the service runs: gates and sql through the
service (no DuckDB lock error), ops as a table, reconcile summarised, quiet on a closed pipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from refserver.testing import RefServer
from service.cli import main
from service.testing import ServiceProcess, wait_until

ROOT = Path(__file__).resolve().parents[2]
STALE = {"duration_ms": 200, "ttl_ms": 10_000_000, "faults": ["stale_epoch_result"]}


@pytest.fixture
def service(
    tmp_path: Path, write_config: Callable[..., Path], servers: dict[str, RefServer]
) -> Iterator[ServiceProcess]:
    for server in servers.values():
        server.reset()
    with ServiceProcess(tmp_path / "ledger.duckdb", write_config()) as svc:
        with svc.client() as client:
            for n in range(3):
                client.submit(call_node=f"cli-{n}", tool="analyze_upload", arguments={"job": n})
        yield svc


def test_gates_and_sql_ask_the_running_service_named_by_the_environment(
    service: ServiceProcess, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With FINALITY_SERVICE_URL set and no --ledger, both commands answer from the service."""
    monkeypatch.setenv("FINALITY_SERVICE_URL", service.url)
    code = main(["gates", "--json", "--no-record"])
    body = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert len(body["gates"]) == 6
    assert main(["sql", "SELECT count(*) AS n FROM op_identity"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "n"
    assert int(out[1]) >= 3


def test_gates_on_the_ledger_the_service_holds_asks_the_service_instead_of_failing_on_the_lock(
    service: ServiceProcess, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--ledger on the locked file: the command says it asks the service, and prints the gates with units."""
    monkeypatch.setenv("FINALITY_SERVICE_URL", service.url)
    code = main(["gates", "--ledger", str(service.ledger), "--no-record"])
    captured = capsys.readouterr()
    assert code in (0, 1)
    assert "asking it instead" in captured.err
    assert "cancel_confirmation" in captured.out
    assert "PASS" in captured.out or "FAIL" in captured.out
    assert "value" in captured.out.splitlines()[0]


def test_gates_with_no_service_and_no_ledger_names_the_ledger_option(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing answers at the default: the message says to pass --ledger."""
    monkeypatch.setenv("FINALITY_SERVICE_URL", "http://127.0.0.1:9")
    assert main(["gates"]) == 2
    assert "--ledger" in capsys.readouterr().err


def test_sql_reads_a_ledger_file_read_only_while_no_service_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--ledger with no service: the sandbox answers from the file."""
    from engine.ledger import open_ledger

    path = tmp_path / "quiet.duckdb"
    open_ledger(str(path)).close()
    assert main(["sql", "--ledger", str(path), "--json", "SELECT 41 + 1 AS answer"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == [[42]]


def test_ops_prints_a_readable_table_and_json_lines_only_when_asked(
    service: ServiceProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """The default is a header and one short row per operation; --json gives one JSON object a line."""
    assert main(["ops", "--service", service.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["call_node", "state", "protocol"]
    assert any(line.startswith("cli-") for line in lines[1:])
    assert lines[-1].startswith("3 operation(s)")
    assert all(len(line) < 160 for line in lines)
    assert main(["ops", "--service", service.url, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["call_node_id"] for r in rows} == {"cli-0", "cli-1", "cli-2"}


def test_ops_into_a_pipe_closed_early_ends_quietly(service: ServiceProcess) -> None:
    """``finality ops | head -1``: no BrokenPipe traceback."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    script = f"{sys.executable} -m service ops --service {service.url} --limit 500 | head -c 1"
    done = subprocess.run(
        ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipe" not in done.stderr, done.stderr


def test_reconcile_summarises_each_entry_on_one_line(
    service: ServiceProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """An open UNKNOWN reads as id, kind, age in minutes, reason and a candidate count, not a list of ids."""
    with service.client() as client:
        client.submit(call_node="lost", tool="analyze_upload", arguments={"_sim": STALE})
        wait_until(lambda: bool(client.reconciliation()), what="an open reconciliation entry")
    assert main(["reconcile", "--service", service.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["entry", "kind", "status", "operation"]
    assert "unknown" in lines[1]
    assert " min" in lines[1]
    assert lines[-1].startswith("1 entry")
