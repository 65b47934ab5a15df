"""`finality call` and `finality show` from the command line, against real reference servers.

One test runs ``python -m service`` as its own process (the entry point and its exit status); the
others run the same ``main(argv)`` in this process (``cli_kit``): a fresh interpreter costs about
2.5 CPU-s of imports, and a command's arguments, exit code and output are the same.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_kit import finality

from refserver.testing import RefServer

HOURS_OF_WORK = '{"duration_ms": 3600000}'
"""Work that cannot finish while a test waits on it, however slow the CLI is to start."""
KEPT_AN_HOUR = '{"report": "q3", "_sim": {"ttl_ms": 3600000}}'
"""A quick call whose task the server keeps an hour (its default retention at this time scale is about a
second: on a loaded machine the task could expire between two polls, and the call end UNKNOWN)."""


@pytest.fixture(scope="module")
def mcp() -> Iterator[RefServer]:
    with RefServer("mcp-2025-11-25", time_scale=0.02) as server:
        yield server


@pytest.fixture(scope="module")
def aip() -> Iterator[RefServer]:
    with RefServer("aip-151", time_scale=0.02) as server:
        yield server


def finality_process(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m service ARGS`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "service", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def call(
    server: RefServer,
    ledger: Path,
    node: str,
    *extra: str,
    args: str = KEPT_AN_HOUR,
    run: Callable[..., subprocess.CompletedProcess[str]] = finality,
) -> subprocess.CompletedProcess[str]:
    url = server.url if server.protocol == "aip-151" else server.endpoint
    tool = "analyze_upload" if server.protocol == "aip-151" else "generate_report"
    return run(
        "call",
        "--server",
        url,
        "--tool",
        tool,
        "--args",
        args,
        "--call-node",
        node,
        "--ledger",
        str(ledger),
        "--json",
        *extra,
    )


def test_a_completed_call_prints_its_receipt_and_exits_zero(mcp: RefServer, tmp_path: Path) -> None:
    """--json prints one object with the documented fields; exit 0 means a receipt was written (the
    command run as ``python -m service``, its own process)."""
    done = call(mcp, tmp_path / "l.duckdb", "n1", run=finality_process)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for key in (
        "call_node",
        "operation_id",
        "protocol",
        "state",
        "server_status",
        "receipt",
        "result",
        "effect_reconciliation_required",
        "transitions",
    ):
        assert key in report
    assert report["protocol"] == "mcp-2025-11-25"  # --protocol auto discovered it
    assert report["state"] == "ACCEPTED"
    assert set(report["receipt"]) >= {"status", "result_digest", "epoch", "cancel_generation"}
    assert report["result"]["structuredContent"]["echo"] == {"report": "q3"}
    assert {"from", "to", "cause", "at"} <= set(report["transitions"][0])


def test_show_prints_the_same_object_afterwards(mcp: RefServer, tmp_path: Path) -> None:
    """`finality show` reads the ledger and prints the same operation object."""
    ledger = tmp_path / "l.duckdb"
    first = json.loads(call(mcp, ledger, "n2").stdout)
    shown = finality("show", "--call-node", "n2", "--ledger", str(ledger), "--json")
    assert shown.returncode == 0
    assert json.loads(shown.stdout) == first


def test_calling_again_resumes_and_never_submits_twice(aip: RefServer, tmp_path: Path) -> None:
    """A second `finality call` for the same call node returns the same operation; the server saw one."""
    aip.reset()
    ledger = tmp_path / "l.duckdb"
    first = json.loads(call(aip, ledger, "same").stdout)
    again = json.loads(call(aip, ledger, "same").stdout)
    assert again["operation_id"] == first["operation_id"]
    assert aip.stats()["operations_created"]["total"] == 1


def test_cancel_after_ends_cancelled_with_a_receipt(mcp: RefServer, tmp_path: Path) -> None:
    """--cancel-after requests a cancel; the 2025-11-25 response is terminal evidence."""
    done = call(
        mcp, tmp_path / "l.duckdb", "c1", "--cancel-after", "0.3", args=f'{{"_sim": {HOURS_OF_WORK}}}'
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["state"] == "CANCELLED_ACCEPTED"
    assert report["receipt"]["status"] == "cancelled"
    assert report["result"] is None


def test_leaving_early_is_not_a_cancel(aip: RefServer, tmp_path: Path) -> None:
    """A caller that stops waiting exits 3; the operation and the server's task go on."""
    aip.reset()
    # The task outlives any CLI start on a loaded machine (an hour at this scale is 72 s): the budget,
    # not the work finishing first, is what ends the wait.
    done = call(
        aip, tmp_path / "l.duckdb", "gone", "--wait-budget", "0.5", args=f'{{"_sim": {HOURS_OF_WORK}}}'
    )
    assert done.returncode == 3
    report = json.loads(done.stdout)
    assert report["state"] == "WORKING"
    assert report["receipt"] is None
    (task,) = aip.stats()["tasks"]
    assert task["status"] == "working"
    assert task["cancel_requested_at"] is None


def test_usage_errors_exit_two(mcp: RefServer, tmp_path: Path) -> None:
    """Bad JSON arguments, an unknown tool, or an unreadable ledger are usage errors."""
    assert call(mcp, tmp_path / "l.duckdb", "u1", args="[1, 2]").returncode == 2
    unknown = finality(
        "call",
        "--server",
        mcp.endpoint,
        "--tool",
        "no_such_tool",
        "--call-node",
        "u2",
        "--ledger",
        str(tmp_path / "l.duckdb"),
    )
    assert unknown.returncode == 2
    assert "no_such_tool" in unknown.stderr
    bad_ledger = tmp_path / "bad.duckdb"
    bad_ledger.write_text("not a ledger" * 100)
    assert call(mcp, bad_ledger, "u3").returncode == 2


def test_a_long_tool_without_tasks_is_refused_unless_its_sync_limit_fits(
    mcp: RefServer, tmp_path: Path
) -> None:
    """quick_lookup forbids tasks: it runs synchronously only when its published limit fits the budget."""
    ledger = str(tmp_path / "l.duckdb")
    base = ["call", "--server", mcp.endpoint, "--tool", "quick_lookup", "--ledger", ledger, "--json"]
    refused = finality(*base, "--call-node", "s1")
    assert refused.returncode == 2
    assert "synchronous limit" in refused.stderr
    ran = finality(*base, "--call-node", "s2", "--sync-limit", "5", "--wait-budget", "30")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["protocol"] == "legacy-sync"


def test_a_reused_call_node_refuses_another_request_naming_the_field_and_never_polls_another_server(
    mcp: RefServer, aip: RefServer, tmp_path: Path
) -> None:
    """q3 ran {"quarter": "Q3"}: other arguments, another tool or another server exit 2 naming the field
    (never Q3's result with exit 0), and the other server is never asked anything."""
    ledger = tmp_path / "l.duckdb"
    first = call(mcp, ledger, "q3", args='{"quarter": "Q3"}')
    assert first.returncode == 0, first.stderr
    again = call(mcp, ledger, "q3", args='{"quarter": "Q3"}')
    assert again.returncode == 0, again.stderr
    other_args = call(mcp, ledger, "q3", args='{"quarter": "Q4"}')
    assert other_args.returncode == 2
    assert "arguments digest differs" in other_args.stderr
    assert "Q3" not in other_args.stdout
    other_tool = call(mcp, ledger, "q3", "--tool", "apply_batch_change", args='{"quarter": "Q3"}')
    assert other_tool.returncode == 2
    assert "tool differs" in other_tool.stderr
    aip.reset()
    other_server = finality(
        "call", "--server", aip.url, "--tool", "generate_report", "--args", '{"quarter": "Q3"}',
        "--call-node", "q3", "--ledger", str(ledger), "--json",
    )  # fmt: skip
    assert other_server.returncode == 2
    assert "server differs" in other_server.stderr
    assert aip.stats()["requests"] == {}
