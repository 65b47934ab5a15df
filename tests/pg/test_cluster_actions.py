"""Any executor takes any person action; one gate run per interval for the cluster.

Two ``finality serve`` processes share one PostgreSQL ledger (one database, one pair of reference
servers and one pair of executors for the whole module). Every operation is submitted through
executor A (so A holds it) and every person action goes through executor B: a cancel, an answer
and a resolution are recorded by B in the ledger (compare-and-swap on the row, never a 409 for
"another executor holds it") and carried out by A. The console of either executor reads the one
gate run the cluster records per interval. Last, A is SIGKILLed and the same actions, sent to B
at once, are recorded and carried out by B once it has taken A's operations over.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from console.insights import Insights
from console.sources import ServiceSource
from engine.ledger import pg_client
from engine.testing.postgres import TemporaryPostgres
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess, start_all, wait_until

LEASE_S = 3.0
GATE_INTERVAL_S = 2.0
LONG = {"duration_ms": 120_000, "ttl_ms": 3_600_000}
# A round's deadline is the task's retention: kept for an hour, so the round is open when answered.
INPUT = {"duration_ms": 300, "input_rounds": 1, "ttl_ms": 3_600_000}
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


@dataclass
class Cluster:
    url: str
    mcp: RefServer
    a: ServiceProcess
    b: ServiceProcess


@pytest.fixture(scope="module")
def cluster(pg_cluster: TemporaryPostgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    url = pg_cluster.create_database(f"t_{uuid.uuid4().hex[:16]}")
    config = tmp_path_factory.mktemp("cluster_actions") / "finality.toml"
    with RefServer("mcp-2025-11-25", seed=1) as mcp, RefServer("aip-151", seed=2) as aip:
        config.write_text(_config(mcp, aip))
        a, b = (
            ServiceProcess(url, config, seed=s, startup_timeout=120, extra_args=["--lease-s", str(LEASE_S)])
            for s in (1, 2)
        )
        try:
            start_all([a, b])
            yield Cluster(url, mcp, a, b)
        finally:
            a.close()
            b.close()


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
    with pg_client.connect(pg_url) as con:
        row = con.execute(
            "SELECT s.lease_owner FROM op_state s JOIN op_identity i USING (operation_id) "
            "WHERE i.call_node_id = %s",
            [node],
        ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def _needs_a_person(b: ServiceClient, suffix: str) -> None:
    wait_until(lambda: _state(b, f"long-{suffix}") == "WORKING", timeout=30, what="long call working")
    wait_until(lambda: _approval(b, f"input-{suffix}") is not None, timeout=30, what="an approval")
    wait_until(lambda: _unknown_entry(b, f"lost-{suffix}") is not None, timeout=30, what="an UNKNOWN entry")


def _act_through_b(b: ServiceClient, suffix: str) -> None:
    """Cancel, answer and resolve through B (none of them answered 409)."""
    cancelled = b.cancel(f"long-{suffix}", actor="rm", reason="not needed")
    assert cancelled["state"] == "CANCEL_REQUESTED"
    approval = _approval(b, f"input-{suffix}")
    assert approval is not None
    answered = b.answer(
        str(approval["operation_id"]),
        int(approval["input_round"]),
        actor="approver",
        answer={"approve": True},
    )
    assert answered["state"] == "WORKING"
    entry = _unknown_entry(b, f"lost-{suffix}")
    assert entry is not None
    task = str(b.show(f"lost-{suffix}")["task_id"])
    assert b.resolve(int(entry["entry_id"]), actor="ops", reason="found it", task_id=task, absent=False)


def _polled_after_resolution(op: dict[str, Any]) -> bool:
    """The resolution was carried out: a status observed after it. The server keeps echoing a stale
    epoch, so the operation goes back to UNKNOWN on its next fetch: its state alone cannot say."""
    events = [t["event"] for t in op["transitions"] if t["accepted"]]
    return "Reconciled" in events and "StatusObserved" in events[events.index("Reconciled") :]


def _carried_out(client: ServiceClient, suffix: str) -> bool:
    return (
        _state(client, f"long-{suffix}") == "CANCELLED_ACCEPTED"
        and _state(client, f"input-{suffix}") == "ACCEPTED"
        and _polled_after_resolution(client.show(f"lost-{suffix}"))
    )


def _submit_three(client: ServiceClient, suffix: str) -> None:
    client.submit(call_node=f"long-{suffix}", tool="generate_report", arguments={"_sim": LONG})
    client.submit(call_node=f"input-{suffix}", tool="generate_report", arguments={"_sim": INPUT})
    client.submit(call_node=f"lost-{suffix}", tool="analyze_upload", arguments={"_sim": STALE})


def test_cancel_answer_and_resolve_through_an_executor_that_does_not_hold_the_operation(
    cluster: Cluster,
) -> None:
    """Recorded by B without a 409, carried out by the holder A (the holder stays A)."""
    with cluster.a.client() as ca, cluster.b.client() as cb:
        _submit_three(ca, "1")
        _needs_a_person(cb, "1")
        _act_through_b(cb, "1")
        wait_until(lambda: _carried_out(cb, "1"), timeout=60, every=0.2, what="A carried out B's actions")
    for kind in ("long", "input", "lost"):
        # A takeover would name B: A did the work.
        assert (_holder(cluster.url, f"{kind}-1") or "").endswith(f":{cluster.a.pid}"), kind


def test_the_console_through_either_executor_reads_the_one_gate_run_the_cluster_records(
    cluster: Cluster,
) -> None:
    """One gate run per interval for both executors together, and each one's console shows that run."""
    with cluster.a.client() as ca, cluster.b.client() as cb:
        consoles = [
            Insights(ServiceSource(c), cache_s=0, gate_cache_s=0, gate_interval_s=GATE_INTERVAL_S)
            for c in (ca, cb)
        ]

        def same_run() -> bool:
            # Read A, B, A: when A read the same run both times, B read within that run's interval.
            first, through_b, again = (c.recorded_gates() for c in (consoles[0], consoles[1], consoles[0]))
            return (
                first is not None
                and through_b is not None
                and again is not None
                and first.run_id == again.run_id == through_b.run_id
            )

        wait_until(same_run, timeout=30, every=0.2, what="both consoles on one recorded run")
        assert len(cb.gates()["gates"]) == 6
    with pg_client.connect(cluster.url) as con:
        runs = con.execute(
            "SELECT DISTINCT run_id, evaluated_at FROM gate_runs ORDER BY evaluated_at"
        ).fetchall()
    assert len(runs) >= 2, runs
    # Each executor takes a turn only once 90 % of the interval has passed since anyone's last one:
    # two series (one per executor) would put runs closer than that.
    gaps = [(b[1] - a[1]).total_seconds() for a, b in itertools.pairwise(runs)]
    assert min(gaps) >= 0.9 * GATE_INTERVAL_S - 0.05, gaps


def test_person_actions_through_a_non_holder_while_the_holder_is_killed_are_carried_out_by_the_taker(
    cluster: Cluster,
) -> None:
    """A is SIGKILLed with its operations waiting on a person; B records the actions at once (no 409)
    and carries them out once it has taken them over; nothing is sent twice."""
    created_before = cluster.mcp.stats()["operations_created"]["total"]
    with cluster.a.client() as ca, cluster.b.client() as cb:
        _submit_three(ca, "2")
        _needs_a_person(cb, "2")
        cluster.a.kill()
        _act_through_b(cb, "2")
        wait_until(lambda: _carried_out(cb, "2"), timeout=60, every=0.2, what="B took over and carried out")
    assert cluster.b.running, cluster.b.stderr()
    # Nothing was sent twice: one server operation per call node on the MCP server.
    assert cluster.mcp.stats()["operations_created"]["total"] - created_before == 2
