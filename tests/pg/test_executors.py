"""Several executor processes share one PostgreSQL ledger; one is killed with SIGKILL mid-way.

Three ``finality serve`` processes on one fresh database, one AIP-151 reference server (request_id
idempotency and lookup by key), 1,500 calls submitted through the executors' APIs. Half-way
through the submissions one executor is killed: its operations are taken over by
the others once its leases expire, and afterwards every operation is terminal with exactly one
receipt, the server created exactly one operation per call node, and the busiest one-second window
of requests (all executors together, from the polls table) is within the global cap.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from pathlib import Path

import pytest

from engine.clock import monotonic_seconds
from engine.errors import ServiceRefused, ServiceUnavailable
from engine.ledger import open_ledger, pg_client
from engine.model import RECEIPT_STATES
from engine.schedule import busiest_window
from engine.testing.wait import wait_until
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess

CALLS = 1500
EXECUTORS = 3
GLOBAL_QPS = 400
LEASE_S = 3.0
KILL_AFTER = CALLS // 2


def _config(server: RefServer) -> str:
    # The reference server dedupes request_id, and the config must say so: without the declaration
    # a lookup by key is refused (AIP-155 makes request_id optional), so every operation the victim
    # left in SUBMITTING went to UNKNOWN for a person (CI: Counter({'UNKNOWN': 6}) after 120 s).
    assert server.dedupes_request_id
    return f"""
global_qps = {GLOBAL_QPS}
rollout_salt = "pg"
gate_interval_s = 5

[poll]
default_interval_ms = 250
min_interval_ms = 100
max_interval_ms = 1000
retry_backoff_ms = 100

[servers.aip]
url = "{server.url}"
protocol = "aip-151"
qps = 1000
request_id_dedupe = true

[tools.analyze_upload]
server = "aip"
side_effect_free = true
"""


def _submit_all(
    executors: list[ServiceProcess], nodes: list[str], victim: ServiceProcess, kill_after: int
) -> dict[str, int]:
    """Submit every call node through the executors' APIs (round robin, two threads each).

    The victim is killed once ``kill_after`` calls were acknowledged; calls meant for it then go
    to the others (a call it may have recorded just before dying is asked again: one operation).
    Returns which executor acknowledged each call node.
    """
    acknowledged: dict[str, int] = {}
    lock = threading.Lock()
    killed = threading.Event()
    rng = random.Random(7)
    durations = {node: rng.choice([300, 800, 1500, 3000]) for node in nodes}
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        clients = [ServiceClient(e.url, timeout=60.0) for e in executors]
        try:
            for i in range(worker, len(nodes), 2 * len(executors)):
                node = nodes[i]
                for attempt in range(len(executors) * 3):
                    which = (i + attempt) % len(executors)
                    if killed.is_set() and executors[which] is victim:
                        continue
                    try:
                        clients[which].submit(
                            call_node=node,
                            tool="analyze_upload",
                            arguments={"n": node, "_sim": {"duration_ms": durations[node]}},
                        )
                    except (ServiceUnavailable, ServiceRefused):
                        if executors[which] is victim and killed.is_set():
                            continue
                        raise
                    with lock:
                        acknowledged[node] = which
                        if len(acknowledged) >= kill_after and not killed.is_set():
                            killed.set()
                            victim.kill()
                    break
                else:
                    raise AssertionError(f"{node} was not acknowledged by any executor")
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)
        finally:
            for client in clients:
                client.close()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(2 * len(executors))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)
    assert not any(t.is_alive() for t in threads), "submitters did not finish in time"
    assert not errors, errors[0]
    assert killed.is_set()
    return acknowledged


def test_three_executors_one_killed_nothing_doubled_every_operation_terminal(
    pg_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "finality.toml"
    nodes = [f"pg-{i:05d}" for i in range(CALLS)]
    with RefServer("aip-151", time_scale=1.0, seed=3) as server:
        config.write_text(_config(server))
        executors = [
            ServiceProcess(pg_url, config, seed=i, extra_args=["--lease-s", str(LEASE_S)])
            for i in range(EXECUTORS)
        ]
        try:
            for executor in executors:
                executor.start()
            victim = executors[0]
            killed_at = monotonic_seconds()
            acknowledged = _submit_all(executors, nodes, victim, KILL_AFTER)
            killed_at = monotonic_seconds() - killed_at
            survivors = [e for e in executors if e is not victim]
            with open_ledger(pg_url, read_only=True) as ledger:
                wait_until(
                    lambda: (
                        len(ops := ledger.operations()) == CALLS
                        and all(op.state in RECEIPT_STATES for op in ops)
                    ),
                    timeout=120,
                    every=0.2,
                    what="every call to hold a receipt",
                )
                ops = ledger.operations()
                receipts = ledger.count("receipts")
                entries = ledger.reconciliation(open_only=False)
                sent = [p["sent_at"] for p in ledger.polls()]
            stats = server.stats()
            for executor in survivors:
                assert executor.running, executor.stderr()
            # Read before the survivors stop: a clean stop releases their leases.
            victim_owner = f":{victim.pid}"
            with pg_client.connect(pg_url) as con:
                owners = Counter(
                    str(row[0]).rsplit(":", 1)[-1]
                    for row in con.execute("SELECT lease_owner FROM op_state WHERE lease_owner IS NOT NULL")
                )
                victim_nodes = sorted(n for n, which in acknowledged.items() if which == 0)
                # Claimed (after expiry: ``claim`` takes nothing else) and finished by a survivor.
                by_survivor = con.execute(
                    "SELECT count(*) FROM op_state s JOIN op_identity i USING (operation_id) "
                    "WHERE i.call_node_id = ANY(%s) AND s.lease_owner NOT LIKE %s",
                    [victim_nodes, f"%{victim_owner}"],
                ).fetchone()
        finally:
            for executor in executors:
                executor.close()

    # Every call node has one operation, and every operation is terminal with one receipt.
    assert len(acknowledged) == CALLS
    assert sorted(op.call_node_id for op in ops) == nodes
    unfinished = Counter(op.state.value for op in ops if op.state not in RECEIPT_STATES)
    assert not unfinished, unfinished
    assert receipts == CALLS, "double (or missing) receipts"
    # What the victim left mid-submission was found by its key, not handed to a person.
    assert entries == [], entries[:3]
    # Server side: exactly one operation per call node, never a second one for a key.
    assert stats["operations_created"]["total"] == CALLS
    per_key = Counter(t["key"] for t in stats["tasks"])
    assert max(per_key.values()) == 1
    # The victim's operations that were still running were taken over by the survivors.
    assert set(owners) <= {str(e.pid) for e in executors}, owners
    assert victim_nodes, "the victim acknowledged no call"
    assert by_survivor is not None
    assert by_survivor[0] > 0, "nothing of the victim's was taken over"
    # The global QPS cap held across the executors, in every one-second window.
    assert busiest_window(sent) <= GLOBAL_QPS
    assert killed_at < 150


def test_a_service_on_postgres_answers_sql_gates_and_shares_its_budget(pg_url: str, tmp_path: Path) -> None:
    """/api/v1/sql runs in place under the read-only role, /api/v1/gates evaluates and records, and a
    clean stop releases the executor's leases."""
    config = tmp_path / "finality.toml"
    with RefServer("aip-151", time_scale=0.05) as server:
        config.write_text(_config(server))
        with (
            ServiceProcess(pg_url, config, extra_args=["--lease-s", "5"]) as service,
            service.client() as client,
        ):
            client.submit(
                call_node="sql-1", tool="analyze_upload", arguments={"n": 1, "_sim": {"duration_ms": 100}}
            )
            rows = client.sql("SELECT count(*) AS n FROM operations")
            assert rows["columns"] == ["n"]
            assert rows["rows"] == [[1]]
            with pytest.raises(ServiceRefused):
                client.sql("DELETE FROM operations")
            gates = client.gates(record=True)
            assert len(gates["gates"]) == 6
            assert gates["run_id"] is not None
            with open_ledger(pg_url, read_only=True) as ledger:
                assert len(ledger.gate_runs()) >= 1
                assert ledger.setting("global_qps") == repr(float(GLOBAL_QPS))
        with open_ledger(pg_url, read_only=True) as ledger:
            assert ledger.leases() == []  # released on the clean stop


def test_the_shared_grid_keeps_every_one_second_window_within_the_cap() -> None:
    from engine.runtime.limiter import slot_grid

    for qps in (0.5, 1, 3, 7, 10, 25, 99, 100, 400, 1234):
        slot_us, per_slot = slot_grid(qps)
        per_second = 1_000_000 / slot_us
        assert per_slot >= 1
        # A half-open one-second window holds at most ceil(per_second) slot starts.
        assert per_slot * max(1, int(per_second)) <= qps or (qps < 1 and per_slot == 1)
        assert per_slot * per_second >= 0.8 * qps or qps < 10  # not wastefully below the cap
