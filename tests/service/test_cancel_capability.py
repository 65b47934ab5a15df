"""A cancel the server cannot take (no ``tasks.cancel`` declared) is refused before anything is recorded,
and a spent wait budget on such a server goes to a person while polling goes on to the real end."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.errors import ServiceRefused
from refserver.testing import RefServer
from service.testing import ServiceProcess, all_terminal, config_text, wait_until

TIME_SCALE = 0.05
"""As the other service tests' reference servers (``conftest.py``)."""
# 60 s of simulated work at the fixtures' time scale: about 3 s, long enough to try a cancel; kept
# on the server long after it ends, so that this is never an expiry test.
LONG = {"duration_ms": 60_000, "ttl_ms": 10_000_000}
FINALITY = Path(sys.executable).parent / "finality"
AGAIN = ["--actor", "alice", "--reason", "again"]


@pytest.fixture(scope="module")
def no_cancel() -> Iterator[RefServer]:
    with RefServer("mcp-2025-11-25", time_scale=TIME_SCALE, no_cancel=True) as server:
        yield server


@pytest.fixture
def config_for(tmp_path: Path, no_cancel: RefServer, servers: dict[str, RefServer]) -> Callable[..., Path]:
    def write(*, report_budget_s: float | None = None) -> Path:
        no_cancel.reset()
        text = config_text({"mcp": no_cancel, "aip": servers["aip"], "ext": servers["ext"]})
        if report_budget_s is not None:
            text = text.replace(
                '[tools.generate_report]\nserver = "mcp"\n',
                f'[tools.generate_report]\nserver = "mcp"\nwait_budget_s = {report_budget_s}\n',
            )
        path = tmp_path / "finality.toml"
        path.write_text(text)
        return path

    return write


def test_a_cancel_the_server_cannot_take_is_refused_with_409_naming_the_capability(
    tmp_path: Path, config_for: Callable[..., Path], no_cancel: RefServer
) -> None:
    """No tasks.cancel declared: the API answers 409 naming it, records nothing, sends nothing, and the
    operation is still polled to the server's own terminal state; the CLI exits 2 with the same message."""
    with ServiceProcess(tmp_path / "ledger.duckdb", config_for()) as service, service.client() as client:
        client.submit(call_node="c1", tool="generate_report", arguments={"_sim": LONG})
        wait_until(lambda: client.show("c1")["state"] == "WORKING", what="working")
        with pytest.raises(ServiceRefused, match=r"capabilities\.tasks\.cancel") as refused:
            client.cancel("c1", actor="alice", reason="changed my mind")
        assert refused.value.status == 409
        shown = client.show("c1")
        assert shown["state"] == "WORKING"
        assert shown["cancel_generation"] == 0
        cli = subprocess.run(
            [str(FINALITY), "cancel", "--service", service.url, "--call-node", "c1", *AGAIN],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert cli.returncode == 2, cli.stderr
        assert "tasks.cancel" in cli.stderr
        wait_until(lambda: all_terminal(client, ["c1"]), what="terminal")
        final = client.show("c1")
    assert final["state"] == "ACCEPTED"
    assert final["receipt"]["status"] == "completed"
    assert not any(t["event"] == "CancelRequested" for t in final["transitions"])
    assert "tasks/cancel" not in no_cancel.stats()["requests"]


def test_a_spent_wait_budget_without_cancel_capability_goes_to_a_person_and_polling_goes_on(
    tmp_path: Path, config_for: Callable[..., Path], no_cancel: RefServer
) -> None:
    """The budget auto-cancel passes the same check: no CANCEL_REQUESTED, one open 'budget' entry that
    names the capability, and the operation still ends in the server's own terminal state."""
    config = config_for(report_budget_s=0.5)
    with ServiceProcess(tmp_path / "ledger.duckdb", config) as service, service.client() as client:
        client.submit(call_node="b1", tool="generate_report", arguments={"_sim": LONG})
        wait_until(lambda: all_terminal(client, ["b1"]), what="terminal")
        final = client.show("b1")
        entries = client.reconciliation(include_resolved=True)
    assert final["state"] == "ACCEPTED"
    assert final["cancel_generation"] == 0
    (entry,) = [e for e in entries if e["kind"] == "budget"]
    assert entry["status"] == "open"
    assert "tasks.cancel" in entry["reason"]
    assert "tasks/cancel" not in no_cancel.stats()["requests"]


def test_finality_call_with_cancel_after_on_a_server_without_cancel_exits_2_before_submitting(
    tmp_path: Path, no_cancel: RefServer
) -> None:
    """``finality call --cancel-after`` where no cancel can be sent: exit 2 naming the capability, and
    nothing recorded or sent (the server created no operation)."""
    no_cancel.reset()
    ledger = tmp_path / "ledger.duckdb"
    cli = subprocess.run(
        [
            str(FINALITY),
            "call",
            "--server",
            no_cancel.endpoint,
            "--protocol",
            "mcp-2025-11-25",
            "--tool",
            "generate_report",
            "--args",
            '{"_sim": {"duration_ms": 60000}}',
            "--call-node",
            "n1",
            "--ledger",
            str(ledger),
            "--cancel-after",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 2, cli.stderr
    assert "capabilities.tasks.cancel" in cli.stderr
    assert no_cancel.stats()["operations_created"]["total"] == 0
