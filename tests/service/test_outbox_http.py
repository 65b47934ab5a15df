"""The ready outbox consumed and a call awaited, over real HTTP against ``finality serve`` and the reference servers (issue 21)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import http_kit
import pytest

from demo.living import DOWNSTREAM, Shared, downstream
from engine.errors import ServiceRefused, ServiceUnavailable
from refserver.testing import RefServer
from service.client import ServiceClient
from service.testing import ServiceProcess, service_in, wait_until

SLOW = {"_sim": {"duration_ms": 400_000}}
"""A call that stays in flight for the whole test (20 s at the tests' time scale)."""


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory, servers: dict[str, RefServer]
) -> Iterator[ServiceProcess]:
    """One service for the module: each test uses its own call nodes and consumer names."""
    with service_in(tmp_path_factory.mktemp("outbox"), servers) as svc:
        yield svc


def test_a_long_poll_returns_the_entry_once_its_call_is_accepted(service: ServiceProcess) -> None:
    """A consumer waiting on an empty outbox gets the entry, with its result and digests, when the call is accepted."""
    with service.client() as client, ThreadPoolExecutor(1) as pool:
        start = client.outbox("lp", wait_s=0)
        waiting = pool.submit(client.outbox, "lp", after=start["cursor"], wait_s=30)
        client.submit(call_node="lp-1", tool="generate_report", arguments={"n": 1})
        got = waiting.result(timeout=60)
        report = client.show("lp-1")
    (entry,) = [e for e in got["entries"] if e["call_node_id"] == "lp-1"]
    assert entry["status"] == "completed"
    assert entry["result_digest"] == report["receipt"]["result_digest"]
    assert entry["result"] == report["result"]
    assert got["cursor"] == got["entries"][-1]["seq"]


def test_an_ack_is_idempotent_per_consumer_and_separate_for_another(service: ServiceProcess) -> None:
    """A second ack by the same consumer is a no-op (200, repeated); another consumer's is its own (201)."""
    with service.client() as client:
        done = client.submit_and_wait(call_node="ack-1", tool="generate_report", arguments={}, wait_s=30)
        assert done["receipt"] is not None
        (entry,) = [
            e for e in client.outbox("ack-a", wait_s=0, limit=1000)["entries"] if e["call_node_id"] == "ack-1"
        ]
        first = client.ack(entry, consumer="ack-a")
        again = client.ack(entry, consumer="ack-a")
        other = client.ack(entry, consumer="ack-b")
        left = [e["call_node_id"] for e in client.outbox("ack-a", wait_s=0, limit=1000)["entries"]]
        lag = {row["consumer"]: row for row in client.outbox_lag()}
    assert not first["repeated"]
    assert again["repeated"]
    assert again["acknowledged_at"] == first["acknowledged_at"]
    assert not other["repeated"]
    assert "ack-1" not in left
    assert lag["ack-a"]["acknowledged"] == 1


def test_an_ack_that_does_not_match_its_entry_is_refused(service: ServiceProcess) -> None:
    """No such entry: 404; a forged digest: 409; both named, and the gate's refused count rises."""
    with service.client() as client:
        client.submit_and_wait(call_node="forge-1", tool="generate_report", arguments={}, wait_s=30)
        before = client.gates()["gates"]
        with pytest.raises(ServiceRefused) as missing:
            client.ack(
                {"call_node_id": "no-such-call", "status": "completed", "result_digest": None}, consumer="f"
            )
        with pytest.raises(ServiceRefused, match="result digest") as forged:
            client.ack(
                {"call_node_id": "forge-1", "status": "completed", "result_digest": "sha256:x"}, consumer="f"
            )
        after = client.gates()["gates"]
    assert missing.value.status == 404
    assert forged.value.status == 409
    refused = [
        {g["gate"]: g for g in run}["traceability"]["inputs"]["refused_acks"] for run in (before, after)
    ]
    assert refused[1] == refused[0] + 2


def test_a_consumer_killed_before_acking_receives_the_entry_again(service: ServiceProcess) -> None:
    """At-least-once: a consumer process killed after receiving restarts at its cursor and receives the entry again."""
    with service.client() as client:
        client.submit_and_wait(call_node="crash-1", tool="generate_report", arguments={}, wait_s=30)
        cursor = None  # the consumer's persisted cursor: nothing acknowledged yet
    # A consumer process that receives its entries and is killed before it acknowledges any.
    with subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from service.client import ServiceClient\n"
            f"got = ServiceClient({service.url!r}).outbox('crashy', wait_s=0, limit=1000)\n"
            "print(','.join(e['call_node_id'] for e in got['entries']), flush=True)\n"
            "sys.stdin.readline()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as receiver:
        try:
            assert receiver.stdout is not None
            received = receiver.stdout.readline().strip().split(",")
        finally:
            receiver.kill()
            receiver.wait(timeout=30)
    assert "crash-1" in received
    with service.client() as client:
        again = client.outbox("crashy", after=cursor, wait_s=0, limit=1000)["entries"]
        (entry,) = [e for e in again if e["call_node_id"] == "crash-1"]
        assert client.ack(entry, consumer="crashy")["repeated"] is False
        assert client.ack(entry, consumer="crashy")["repeated"] is True
        rest = [e["call_node_id"] for e in client.outbox("crashy", wait_s=0, limit=1000)["entries"]]
    assert "crash-1" not in rest


def test_submit_with_wait_returns_the_receipt_and_a_repeat_returns_the_same(service: ServiceProcess) -> None:
    """POST /calls with wait_s answers 201 once the receipt is there; the same submit again, the same receipt."""
    with service.client() as client:
        first = client.submit_and_wait(call_node="w-1", tool="analyze_upload", arguments={"a": 1}, wait_s=30)
        second = client.submit_and_wait(call_node="w-1", tool="analyze_upload", arguments={"a": 1}, wait_s=30)
        shown = client.wait("w-1", wait_s=5)
    assert first["receipt"] is not None
    assert second["operation_id"] == first["operation_id"]
    assert second["receipt"] == first["receipt"] == shown["receipt"]


def test_a_wait_that_ends_first_answers_202_with_the_current_state(service: ServiceProcess) -> None:
    """A call still running when wait_s ends: 202 with the operation as it is, no receipt; nothing cancelled."""
    with http_kit.Client(base_url=service.url, timeout=30) as http:
        answer = http.post(
            "/api/v1/calls",
            json={"call_node": "slow-1", "tool": "generate_report", "arguments": SLOW, "wait_s": 0.3},
        )
        shown = http.get("/api/v1/operations/slow-1", params={"wait_s": 0.2})
        bad = http.get("/api/v1/operations/slow-1", params={"wait_s": "forever"})
    assert answer.status_code == 202
    assert answer.json()["receipt"] is None
    assert shown.status_code == 202
    assert shown.json()["cancel_generation"] == 0
    assert bad.status_code == 400


def test_a_caller_that_disconnects_while_waiting_cancels_nothing(service: ServiceProcess) -> None:
    """The caller goes away mid-wait; the call still reaches its receipt, and submitting again returns it."""
    arguments = {"_sim": {"duration_ms": 20_000}}
    with http_kit.Client(base_url=service.url, timeout=0.3) as http, pytest.raises(http_kit.ReadTimeout):
        http.post(
            "/api/v1/calls",
            json={"call_node": "gone-1", "tool": "generate_report", "arguments": arguments, "wait_s": 30},
        )
    with service.client() as client:
        done = client.wait("gone-1", wait_s=30)
        again = client.submit_and_wait(
            call_node="gone-1", tool="generate_report", arguments=arguments, wait_s=5
        )
    assert done["receipt"]["status"] == "completed"
    assert done["cancel_generation"] == 0
    assert again["operation_id"] == done["operation_id"]
    assert again["receipt"] == done["receipt"]


def test_finality_submit_wait_prints_the_receipt(service: ServiceProcess) -> None:
    """``finality submit --wait`` exits 0 and prints the operation with its receipt (the 202 path: above)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "service.cli",
            "submit",
            "--service",
            service.url,
            "--json",
            "--call-node",
            "cli-1",
            "--tool",
            "generate_report",
            "--wait",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"receipt": {"status": "completed"' in done.stdout


def test_the_demos_downstream_workflow_acknowledges_every_entry_it_advances_on(
    service: ServiceProcess,
) -> None:
    """demo.living's consumer long-polls, takes a workflow step per entry and acks it: the lag shows it, the gate counts it."""
    with service.client() as client:
        for n in ("dw-1", "dw-2"):
            client.submit_and_wait(call_node=n, tool="generate_report", arguments={}, wait_s=30)
        shared = Shared(service.url, {})
        shared.tools.update({"dw-1": "generate_report", "dw-2": "generate_report"})
        consumer = threading.Thread(target=downstream, args=(shared,), daemon=True)
        consumer.start()
        try:
            wait_until(
                lambda: (
                    not [
                        e
                        for e in client.outbox(DOWNSTREAM, wait_s=0, limit=1000)["entries"]
                        if e["call_node_id"].startswith("dw-")
                    ]
                ),
                timeout=60,
                what="the downstream acknowledged dw-1 and dw-2",
            )
        finally:
            shared.stop.set()
            consumer.join(timeout=30)
        lag = {row["consumer"]: row for row in client.outbox_lag()}
        trace = {g["gate"]: g for g in client.gates()["gates"]}["traceability"]
    assert not consumer.is_alive()
    assert shared.counts["report filed"] >= 2
    assert lag[DOWNSTREAM]["acknowledged"] >= 2
    assert trace["inputs"]["advances"] >= lag[DOWNSTREAM]["acknowledged"]


def test_the_service_killed_during_long_polls_loses_no_entry_and_no_ack(service: ServiceProcess) -> None:
    """SIGKILL while consumers long-poll: after a restart every accepted call's entry is there, acks kept.

    Last in the module: it kills the module's service and starts it again on the same ledger.
    """
    nodes = [f"k-{i}" for i in range(6)]
    with service.client() as client:
        receipts = [
            client.submit_and_wait(call_node=n, tool="generate_report", arguments={"i": i}, wait_s=30)[
                "receipt"
            ]
            for i, n in enumerate(nodes)
        ]
        entries = [
            e
            for e in client.outbox("survivor", wait_s=0, limit=1000)["entries"]
            if e["call_node_id"] in nodes
        ]
        for entry in entries[:3]:
            client.ack(entry, consumer="survivor")
        cursor = client.outbox("survivor", wait_s=0, limit=1000)["cursor"]
    with ThreadPoolExecutor(4) as pool:
        clients = [ServiceClient(service.url) for _ in range(4)]
        polls = [
            pool.submit(c.outbox, name, after=cursor, wait_s=30)
            for c, name in zip(clients, ("survivor", "other", "third", "fourth"), strict=True)
        ]
        service.kill()
        failures = [p.exception(timeout=60) for p in polls]
        for c in clients:
            c.close()
    assert all(isinstance(f, ServiceUnavailable) for f in failures)
    service.start()
    with service.client() as client:
        after = [e["call_node_id"] for e in client.outbox("survivor", wait_s=0, limit=1000)["entries"]]
        everyone = [e["call_node_id"] for e in client.outbox("newcomer", wait_s=0, limit=1000)["entries"]]
        lag = {row["consumer"]: row for row in client.outbox_lag()}
    assert all(r is not None for r in receipts)
    assert [e["call_node_id"] for e in entries] == nodes
    assert [n for n in everyone if n in nodes] == nodes
    assert [n for n in after if n in nodes] == nodes[3:]
    assert lag["survivor"]["acknowledged"] == 3
