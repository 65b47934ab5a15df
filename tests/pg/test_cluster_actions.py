"""Any executor takes any person action; one gate run per interval for the cluster.

Two ``finality serve`` processes share one PostgreSQL ledger. Every operation is submitted through
executor A (so A holds it) and every person action goes through executor B: a cancel, an answer
and a resolution are recorded by B in the ledger (compare-and-swap on the row, never a 409 for
"another executor holds it") and carried out by A; then A is SIGKILLed and the same actions,
sent to B at once, are recorded and carried out by B once it has taken A's operations over.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess, wait_until

LEASE_S = 3.0
GATE_INTERVAL_S = 1.0
LONG = {"duration_ms": 120_000}
INPUT = {"duration_ms": 300, "input_rounds": 1}
STALE = {"duration_ms": 200, "ttl_ms": 10_000_000, "faults": ["stale_epoch_result"]}


def _config(mcp: RefServer, aip: RefServer) -> str:
    return f"""
global_qps = 200
rollout_salt = "actions"
gate_interval_s = {GATE_INTERVAL_S}

[poll]
default_interval_ms = 200
min_interval_ms = 50
max_interval_ms = 500
retry_backoff_ms = 50

[servers.mcp]
url = "{mcp.endpoint}"
protocol = "mcp-2025-11-25"
qps = 200

[servers.aip]
url = "{aip.url}"
protocol = "aip-151"
qps = 200

[tools.generate_report]
server = "mcp"
side_effect_free = true

[tools.analyze_upload]
server = "aip"
side_effect_free = true
"""


def _state(client: ServiceClient, node: str) -> str:
    return str(client.show(node)["state"])


def _approval(client: ServiceClient, node: str) -> dict[str, Any] | None:
    op_id = client.show(node)["operation_id"]
    return next((a for a in client.approvals() if a["operation_id"] == op_id), None)


def _unknown_entry(client: ServiceClient, node: str) -> dict[str, Any] | None:
    op = client.show(node)
    if op["state"] != "UNKNOWN":
        return None
    return next(
        (
            e
            for e in client.reconciliation()
            if e["operation_id"] == op["operation_id"] and e["kind"] == "unknown"
        ),
        None,
    )


def _holder(pg_url: str, node: str) -> str | None:
    with psycopg.connect(pg_url) as con:
        row = con.execute(
            "SELECT s.lease_owner FROM op_state s JOIN op_identity i USING (operation_id) "
            "WHERE i.call_node_id = %s",
            [node],
        ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def _act_through_b(a: ServiceClient, b: ServiceClient, suffix: str) -> None:
    """Wait until A's operations need a person, then cancel, answer and resolve through B."""
    wait_until(lambda: _state(b, f"long-{suffix}") == "WORKING", timeout=30, what="long call working")
    wait_until(lambda: _approval(b, f"input-{suffix}") is not None, timeout=30, what="an approval")
    wait_until(lambda: _unknown_entry(b, f"lost-{suffix}") is not None, timeout=30, what="an UNKNOWN entry")
    cancelled = b.cancel(f"long-{suffix}", actor="rm", reason="not needed")
    assert cancelled["state"] == "CANCEL_REQUESTED"
    approval = _approval(b, f"input-{suffix}")
    assert approval is not None
    answered = b.answer(
        str(approval["operation_id"]), int(approval["input_round"]), actor="approver", answer={"ok": True}
    )
    assert answered["state"] == "WORKING"
    entry = _unknown_entry(b, f"lost-{suffix}")
    assert entry is not None
    task = str(b.show(f"lost-{suffix}")["task_id"])
    assert b.resolve(int(entry["entry_id"]), actor="ops", reason="found it", task_id=task, absent=False)


def _carried_out(client: ServiceClient, suffix: str) -> bool:
    return (
        _state(client, f"long-{suffix}") == "CANCELLED_ACCEPTED"
        and _state(client, f"input-{suffix}") == "ACCEPTED"
        and _state(client, f"lost-{suffix}") != "UNKNOWN"
    )


def _submit_three(client: ServiceClient, suffix: str) -> None:
    client.submit(call_node=f"long-{suffix}", tool="generate_report", arguments={"_sim": LONG})
    client.submit(call_node=f"input-{suffix}", tool="generate_report", arguments={"_sim": INPUT})
    client.submit(call_node=f"lost-{suffix}", tool="analyze_upload", arguments={"_sim": STALE})


def test_cancel_answer_and_resolve_through_an_executor_that_does_not_hold_the_operation(
    pg_url: str, tmp_path: Path
) -> None:
    """Recorded by B without a 409, carried out by the holder A; then, A killed, carried out by B."""
    config = tmp_path / "finality.toml"
    with RefServer("mcp-2025-11-25", seed=1) as mcp, RefServer("aip-151", seed=2) as aip:
        config.write_text(_config(mcp, aip))
        a = ServiceProcess(
            pg_url, config, seed=1, startup_timeout=120, extra_args=["--lease-s", str(LEASE_S)]
        )
        b = ServiceProcess(
            pg_url, config, seed=2, startup_timeout=120, extra_args=["--lease-s", str(LEASE_S)]
        )
        try:
            a.start()
            b.start()
            with a.client() as ca, b.client() as cb:
                _submit_three(ca, "1")
                _act_through_b(ca, cb, "1")
                wait_until(lambda: _carried_out(cb, "1"), timeout=60, what="A carried out B's actions")
                assert all(
                    (_holder(pg_url, f"{kind}-1") or "").endswith(f":{a.pid}") for kind in ("long", "input")
                ), "the holder changed: B did the work itself"

                _submit_three(ca, "2")
                wait_until(lambda: _approval(cb, "input-2") is not None, timeout=30, what="an approval")
                wait_until(lambda: _unknown_entry(cb, "lost-2") is not None, timeout=30, what="UNKNOWN")
                a.kill()
                _act_through_b(ca, cb, "2")
                wait_until(lambda: _carried_out(cb, "2"), timeout=60, what="B took over and carried out")
                with psycopg.connect(pg_url) as con:
                    runs = con.execute(
                        "SELECT count(DISTINCT run_id), min(evaluated_at), max(evaluated_at) FROM gate_runs"
                    ).fetchone()
                gates_b = cb.gates()
            assert b.running, b.stderr()
        finally:
            a.close()
            b.close()
        mcp_stats = mcp.stats()

    # Nothing was sent twice: one server operation per call node on the MCP server.
    assert mcp_stats["operations_created"]["total"] == 4
    # One gate run per interval for both executors together (not one series each).
    assert runs is not None
    count, first, last = int(str(runs[0])), runs[1], runs[2]
    assert count >= 2
    span = (last - first).total_seconds()
    assert count <= span / (0.9 * GATE_INTERVAL_S) + 1, (count, span)
    assert len(gates_b["gates"]) == 6
