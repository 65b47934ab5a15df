"""The RefServer helper and the command line: start, READY, admin calls, failures, stop."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import http_kit
import pytest

from engine.clock import monotonic_seconds
from refserver.cli import parse_options
from refserver.context import Protocol
from refserver.testing import (
    STARVED_CEILING,
    RefServer,
    RefServerError,
    StartupFailed,
    StartupTimeout,
    read_ready_line,
    run_queue_wait_s,
)

SILENT = "import sys; sys.stdin.read()"
"""A child that prints nothing until its stdin closes."""


@pytest.fixture
def silent() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen([sys.executable, "-c", SILENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        yield child
    finally:
        child.kill()
        child.wait(timeout=10)
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                pipe.close()


def test_a_silent_child_fails_its_start_once_its_own_time_is_spent(silent):
    """Not starved (no run-queue time credited), the wait ends at the budget, never before it."""
    started = monotonic_seconds()
    with pytest.raises(StartupTimeout, match=r"no READY line within 0\.2 s"):
        read_ready_line(silent, timedelta(seconds=0.2), run_queue_wait=lambda pid: 0.0)
    assert monotonic_seconds() - started >= 0.2


def test_time_a_child_waits_for_a_cpu_is_not_charged_to_its_start(silent):
    """A child always waiting in the run queue is given wall time up to the ceiling, then fails."""
    clock_start = monotonic_seconds()
    starved = lambda pid: monotonic_seconds() - clock_start  # noqa: E731 - every second passed was queued
    with pytest.raises(StartupTimeout, match="of wall time"):
        read_ready_line(silent, timedelta(seconds=0.05), run_queue_wait=starved)
    assert monotonic_seconds() - clock_start >= STARVED_CEILING * 0.05


def test_a_child_that_exits_before_its_line_ends_the_wait_at_once():
    """stdout closing fails the start at once, not at the deadline; a READY line gives what follows it."""
    done = subprocess.Popen([sys.executable, "-c", "pass"], stdout=subprocess.PIPE)
    with pytest.raises(StartupFailed, match="exited before READY"):
        read_ready_line(done, timedelta(seconds=60))
    done.wait(timeout=10)
    done.stdout.close()
    ready = subprocess.Popen([sys.executable, "-c", "print('READY x')"], stdout=subprocess.PIPE)
    assert read_ready_line(ready, timedelta(seconds=60)) == "x"
    ready.wait(timeout=10)
    ready.stdout.close()


def test_the_run_queue_reading_is_a_growing_count_of_seconds_for_a_live_process():
    """This process's own reading is a number >= 0 that never goes down; a gone pid reads 0."""
    first = run_queue_wait_s(os.getpid())
    assert 0.0 <= first <= run_queue_wait_s(os.getpid())
    assert run_queue_wait_s(2**22 + 7) == 0.0


def test_ref_server_reports_its_url_and_health_and_stops():
    """The helper starts the subprocess, exposes url/endpoint, and forgets them after stop."""
    server = RefServer("aip-151", time_scale=0.01)
    with server:
        assert server.url.startswith("http://127.0.0.1:")
        assert server.endpoint == f"{server.url}/v1"
        assert http_kit.get(f"{server.url}/healthz").json() == {"status": "ok", "protocol": "aip-151"}
        assert server.stats()["operations_created"] == {"total": 0, "by_tool": {}}
    with pytest.raises(RefServerError):
        _ = server.url
    server.stop()


async def test_ref_server_works_as_an_async_context_manager():
    """``async with`` starts and stops the server without blocking the event loop."""
    async with RefServer("mcp-2026-07-28", time_scale=0.01) as server:
        assert server.endpoint.endswith("/mcp")
        async with http_kit.AsyncClient() as client:
            assert (await client.get(f"{server.url}/healthz")).status_code == 200


def test_a_bad_fault_plan_fails_startup_with_the_servers_message():
    """The server refuses an invalid plan before READY; the helper raises with its stderr."""
    with pytest.raises(RefServerError, match="unknown fault"):
        RefServer("aip-151", fault_plan={"rules": [{"fault": "no_such_fault"}]}).start()


def test_initial_fault_plan_is_installed_and_restored_by_reset():
    """--fault-plan rules are active at start and come back after set_faults and reset."""
    plan = {"seed": 7, "rules": [{"fault": "poll_429", "tool": "*", "count": 1}]}
    with RefServer("aip-151", time_scale=0.01, fault_plan=plan) as server:
        assert server.stats()["fault_plan"]["seed"] == 7
        server.set_faults([], seed=1)
        assert server.stats()["fault_plan"]["rules"] == []
        server.reset()
        assert [r["fault"] for r in server.stats()["fault_plan"]["rules"]] == ["poll_429"]
        with pytest.raises(RefServerError, match="400"):
            server.set_faults([{"fault": "poll_429", "rate": 5}])


def test_unknown_protocol_is_refused_before_starting():
    """The helper validates the protocol name itself."""
    with pytest.raises(ValueError, match="protocol"):
        RefServer("grpc")


def test_command_line_parses_tokens_and_plan_options(tmp_path):
    """--token pairs become the token map; --fault-plan is read and validated."""
    plan = tmp_path / "plan.json"
    plan.write_text('{"rules": [{"fault": "slow_response", "params": {"delay_ms": 5}}]}')
    options, _ = parse_options(
        [
            "--protocol",
            "mcp-2025-11-25",
            "--port",
            "0",
            "--token",
            "t1=alice",
            "--fault-plan",
            str(plan),
            "--idempotency",
        ]
    )
    assert options.protocol is Protocol.MCP_2025_11_25
    assert options.tokens == {"t1": "alice"}
    assert options.idempotency
    assert options.initial_plan().rules[0].params.delay_ms == 5


@pytest.mark.parametrize(
    "argv",
    [
        ["--protocol", "aip-151", "--port", "0", "--token", "no-equals"],
        ["--protocol", "aip-151", "--port", "0", "--time-scale", "0"],
        ["--protocol", "aip-151", "--port", "70000"],
        ["--protocol", "aip-151", "--port", "0", "--fault-plan", "/nonexistent/plan.json"],
        ["--protocol", "soap", "--port", "0"],
    ],
)
def test_command_line_rejects_bad_arguments_with_usage_errors(argv):
    """Malformed options exit with status 2 and a message, never a traceback."""
    with pytest.raises(SystemExit) as caught:
        parse_options(argv)
    assert caught.value.code == 2
