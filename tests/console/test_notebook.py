"""notebooks/ledger_analysis.ipynb runs top to bottom: on a seeded ledger file, and on a running service
(a snapshot it publishes, and DataFrames over its SQL API), as an analyst would run it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from refserver.testing import RefServer
from service.testing import ServiceProcess, all_terminal, wait_until

ROOT = Path(__file__).resolve().parents[2]


def execute(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> list[dict[str, object]]:
    """Run every cell in a fresh kernel with ``env``; the code cells' outputs."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    for name in ("FINALITY_SERVICE_URL", "FINALITY_NOTEBOOK_READS", "FINALITY_LEDGER"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    )
    notebook = nbformat.read(ROOT / "notebooks" / "ledger_analysis.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
    )
    client.execute()
    return [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]


def figures(outputs: list[dict[str, object]]) -> list[dict[str, object]]:
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    return [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]  # type: ignore[operator]


def printed(outputs: list[dict[str, object]]) -> str:
    return "".join(str(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")


def test_the_analysis_notebook_executes_on_a_seeded_ledger(
    seeded_ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every cell runs; the cancel-latency and UNKNOWN-age charts are produced."""
    outputs = execute(monkeypatch, {"FINALITY_LEDGER": str(seeded_ledger)})
    assert len(figures(outputs)) == 2


@pytest.fixture(scope="module")
def live_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """A running finality serve over one MCP reference server, holding finished and cancelled calls."""
    folder = tmp_path_factory.mktemp("notebook-live")
    with RefServer("mcp-2025-11-25", time_scale=0.05, idempotency=True) as server:
        config = folder / "finality.toml"
        config.write_text(
            f"""
global_qps = 100
rollout_salt = "test"

[poll]
default_interval_ms = 100
min_interval_ms = 20
max_interval_ms = 500

[servers.mcp]
url = "{server.endpoint}"
protocol = "mcp-2025-11-25"
qps = 100

[tools.generate_report]
server = "mcp"
side_effect_free = true
"""
        )
        # A generous start-up bound: the machine running the suite may be busy.
        with (
            ServiceProcess(folder / "ledger.duckdb", config, startup_timeout=120) as svc,
            svc.client() as client,
        ):
            done = [f"done-{i}" for i in range(4)]
            for node in done:
                client.submit(
                    call_node=node, tool="generate_report", arguments={"_sim": {"duration_ms": 200}}
                )
            cancelled = [f"cancelled-{i}" for i in range(2)]
            for node in cancelled:
                client.submit(
                    call_node=node, tool="generate_report", arguments={"_sim": {"duration_ms": 600_000}}
                )
                # A cancel is for a created operation: the reply to a submission comes once SUBMITTING
                # is durable, before the server has answered the create.
                wait_until(lambda node=node: client.show(node)["state"] == "WORKING", what=f"{node} working")
                client.cancel(node, actor="analyst-test", reason="a cancel for the latency chart")
            wait_until(
                lambda: all_terminal(client, done + cancelled), what="the calls' receipts", timeout=120
            )
            yield svc


@pytest.mark.parametrize("reads", ["snapshot", "frames"])
def test_the_analysis_notebook_executes_on_a_running_service(
    live_service: ServiceProcess, reads: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With FINALITY_SERVICE_URL set the notebook reads the live service (a snapshot, or DataFrames) end to end."""
    outputs = execute(
        monkeypatch, {"FINALITY_SERVICE_URL": live_service.url, "FINALITY_NOTEBOOK_READS": reads}
    )
    assert len(figures(outputs)) == 2
    text = printed(outputs)
    assert ("snapshot of" in text) if reads == "snapshot" else ("live: DataFrames over the SQL API" in text)
    # The notebook's first table is the operation count the service holds.
    first = next(o for o in outputs if o.get("output_type") == "execute_result")
    assert "6" in str(first.get("data", {}))
