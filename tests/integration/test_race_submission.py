"""Races around obtaining an operation identity: the creating response lost or too slow, and a task
ID the server wrongly hands out again. The rule under test: never a second operation, never a
blind resubmission, and an UNKNOWN a person can find by key, digest, window or candidates."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta

import pytest
from race_kit import KEYED, MCP, OPTIONS, PLAIN, QUICK, call, drive, invariants, server_task_id, spec_for

from engine.clock import SystemClock
from engine.machine import step
from engine.model import (
    CallNodeId,
    CallRequest,
    Epoch,
    LocalState,
    LookupProvedAbsent,
    LookupUnavailable,
    OperationId,
    Principal,
    Protocol,
    Reconciled,
    ServerStatus,
    SubmissionLost,
    new_operation,
)
from engine.runtime.call import ADAPTER_VERSION


@pytest.mark.parametrize("server", KEYED, indirect=True)
async def test_a_lost_creating_response_is_found_by_its_key_and_makes_one_operation(server, ledger):
    """create_response_lost with a key lookup: SUBMISSION_UNKNOWN → the same task found → accepted."""
    sim = {"duration_ms": QUICK, "faults": ["create_response_lost"]}
    op = await call(server, ledger, tool="apply_batch_change", sim=sim)
    seen = invariants(ledger, server)
    assert "create_response_lost" in seen.fired()
    assert op.state is LocalState.ACCEPTED
    assert seen.path()[1:3] == ["SUBMISSION_UNKNOWN", "WORKING"]
    assert seen.methods()[:2] == ["submit", "lookup"]
    assert seen.task()["key"] == op.idempotency_key
    assert len(seen.stats["executions"]["apply_batch_change"]) == 1


@pytest.mark.parametrize(
    ("server", "listed"), [("mcp25", True), ("mcp26", False)], indirect=["server"], ids=MCP
)
async def test_a_lost_creating_response_without_key_lookup_goes_to_reconciliation_unresubmitted(
    server, ledger, listed
):
    """Plain MCP: SUBMISSION_UNKNOWN → UNKNOWN with key, digest, window and tasks/list candidates."""
    op = await call(server, ledger, sim={"duration_ms": QUICK, "faults": ["create_response_lost"]})
    seen = invariants(ledger, server)
    assert op.state is LocalState.UNKNOWN
    assert op.task_id is None
    assert seen.receipt() is None
    assert seen.path()[1:] == ["SUBMISSION_UNKNOWN", "UNKNOWN"]
    (entry,) = seen.entries["node-1"]
    assert entry["status"] == "open"
    assert entry["task_id"] is None
    assert entry["window_start"] == op.created_at
    (created,) = seen.stats["tasks"]
    # 2025-11-25 lists tasks, so the one it created is offered; the 2026 extension removed tasks/list.
    assert json.loads(str(entry["candidates"])) == ([created["id"]] if listed else [])


@pytest.mark.parametrize("server", KEYED, indirect=True)
async def test_a_creating_response_slower_than_the_timeout_is_found_by_its_key(server, ledger):
    """slow_response on creation past the request timeout: the key lookup binds the one operation."""
    impatient = replace(
        OPTIONS,
        timeouts=replace(OPTIONS.timeouts, request=timedelta(milliseconds=300)),
        request_id_dedupe=server.dedupes_request_id,
    )
    slow = {"name": "slow_response", "delay_ms": 100_000}
    sim = {"duration_ms": QUICK, "faults": [slow]}
    op = await call(server, ledger, tool="apply_batch_change", sim=sim, options=impatient)
    seen = invariants(ledger, server)
    assert "slow_response" in seen.fired()
    assert op.state is LocalState.ACCEPTED
    assert "SUBMISSION_UNKNOWN" in seen.path()
    assert seen.polls["node-1"][0]["outcome"] == "unavailable"
    assert len(seen.stats["executions"]["apply_batch_change"]) == 1


@pytest.mark.parametrize("server", PLAIN, indirect=True)
async def test_a_task_id_reused_for_another_request_is_never_adopted(server, ledger):
    """task_id_reused: the second call is told the first call's task id; it binds nothing and waits for a person."""
    first = await call(server, ledger, sim={"duration_ms": QUICK}, node="node-1")
    second = await call(
        server, ledger, sim={"duration_ms": QUICK, "faults": ["task_id_reused"]}, node="node-2"
    )
    seen = invariants(ledger, server, "node-1", "node-2")
    assert "task_id_reused" in seen.fired()
    assert first.state is LocalState.ACCEPTED
    receipt = seen.receipt("node-1")
    assert receipt is not None
    assert receipt.status is ServerStatus.COMPLETED
    assert receipt.task_id == first.task_id
    assert second.state is LocalState.UNKNOWN
    assert second.task_id is None
    assert seen.receipt("node-2") is None
    (entry,) = seen.entries["node-2"]
    assert first.task_id is not None
    assert server_task_id(first.task_id) in str(entry["reason"])
    assert ledger.by_task(first.server, first.task_id) == ledger.by_call_node("node-1")


@pytest.mark.parametrize("server", ["aip_ignoring_request_id"], indirect=True)
async def test_a_lost_creating_response_on_a_service_that_ignores_request_id_goes_to_reconciliation(
    server, ledger
):
    """AIP-155 makes request_id optional: without a declared dedupe, a lost create response is never
    looked up by re-posting the create (which made a second operation); a person gets the candidates."""
    op = await call(server, ledger, sim={"duration_ms": QUICK, "faults": ["create_response_lost"]})
    seen = invariants(ledger, server)
    assert op.state is LocalState.UNKNOWN
    assert op.task_id is None
    assert seen.path()[1:] == ["SUBMISSION_UNKNOWN", "UNKNOWN"]
    (entry,) = seen.entries["node-1"]
    assert "request_id_dedupe" in str(entry["reason"])
    (created,) = seen.stats["tasks"]
    assert json.loads(str(entry["candidates"])) == [f"operations/{created['id']}"]


@pytest.mark.parametrize("server", ["aip"], indirect=True)
async def test_a_create_that_never_arrived_is_proved_absent_by_key_and_resubmitted_under_the_same_key(
    server, ledger
):
    """create_request_lost on a service declared to dedupe request_id: the lookup by key answers "no
    such request", which is the proof that allows one resubmission under the same key; one operation."""
    op = await call(server, ledger, sim={"duration_ms": QUICK, "faults": ["create_request_lost"]})
    assert op.state is LocalState.ACCEPTED
    stats = server.stats()
    (task,) = stats["tasks"]
    assert task["key"] == op.idempotency_key
    assert op.task_id == f"operations/{task['id']}"
    transitions = ledger.transitions(op.operation_id)
    path = [t["to_state"] for t in transitions if t["accepted"] and t["from_state"] != t["to_state"]]
    assert path[:5] == ["SUBMITTING", "SUBMISSION_UNKNOWN", "NOT_FOUND_SAFE", "SUBMITTING", "WORKING"]
    (resubmitted,) = [t for t in transitions if t["event"] == "Resubmitted"]
    assert "proven absent by the server" in str(resubmitted["cause"])
    methods = [str(p["method"]) for p in ledger.polls(op.operation_id)]
    assert methods[:3] == ["submit", "lookup", "submit"]
    receipt = ledger.receipt("node-1")
    assert receipt is not None
    assert receipt.status is ServerStatus.COMPLETED


@pytest.mark.parametrize(
    ("server", "first"), [("mcp25", None), ("mcp26", None), ("aip", "lookup")], indirect=["server"]
)
async def test_an_executor_restarted_with_its_operation_in_submitting_never_sends_the_create_again(
    server, ledger, first
):
    """A call found in SUBMITTING by a new process (its create may have reached the server) is looked
    up by key where the server can, else handed to a person; never submitted blindly again."""
    spec = spec_for(server, sim={"duration_ms": QUICK})
    # What the crashed process left: the operation recorded in SUBMITTING, nothing of its reply.
    left, _ = _left_after_a_crash(server, spec)
    ledger.create_operation(left, spec.arguments)
    op = await drive(spec, ledger)
    methods = [str(p["method"]) for p in ledger.polls(op.operation_id)]
    transitions = ledger.transitions(op.operation_id)
    lost = [t for t in transitions if t["event"] == "SubmissionLost" and t["accepted"]]
    assert lost
    assert "restarted while submitting" in str(lost[0]["cause"])
    if first is None:
        # Without lookup by key nothing may be sent: a person reconciles by key, digest and window.
        assert "submit" not in methods
        assert server.stats()["tasks"] == []
        assert op.state is LocalState.UNKNOWN
        (entry,) = [e for e in ledger.reconciliation() if e["kind"] == "unknown"]
        assert entry["idempotency_key"] == op.idempotency_key
    else:
        # The key lookup comes first; only its proof of absence allows the one submission.
        assert methods[0] == "lookup"
        assert methods.count("submit") <= 1


def _left_after_a_crash(server, spec):
    """The operation a crashed process recorded in SUBMITTING (the test moves it on through
    ``machine.step``), and the instant it was recorded; nothing of it in any process's memory."""
    request = CallRequest(CallNodeId(spec.call_node), spec.tool, spec.arguments, Principal(spec.principal))
    now = SystemClock().now()
    op = new_operation(
        request,
        operation_id=OperationId("op-crashed"),
        protocol=Protocol(server.protocol),
        adapter_version=ADAPTER_VERSION,
        server=spec.server,
        epoch=Epoch(spec.epoch),
        now=now,
    )
    return op, now


@pytest.mark.parametrize("server", ["aip"], indirect=True)
async def test_an_executor_restarted_after_the_servers_proof_of_absence_resubmits_under_the_same_key(
    server, ledger
):
    """The lookup proved the lost create absent (NOT_FOUND_SAFE) and the process died before it
    resubmitted: the next process reads the server's proof from the ledger's log and sends the one
    create under the same key, instead of waiting for a person nobody told."""
    spec = spec_for(server, sim={"duration_ms": QUICK})
    op, now = _left_after_a_crash(server, spec)
    op, _ = ledger.create_operation(op, spec.arguments)
    epoch = Epoch(spec.epoch)
    for event in (SubmissionLost(epoch, "connection reset"), LookupProvedAbsent(epoch)):
        op = ledger.apply(step(op, event, now))
    assert op.state is LocalState.NOT_FOUND_SAFE
    op = await drive(spec, ledger)
    assert op.state is LocalState.ACCEPTED
    (task,) = server.stats()["tasks"]
    assert task["key"] == op.idempotency_key
    methods = [str(p["method"]) for p in ledger.polls(op.operation_id)]
    assert methods[:1] == ["submit"]
    assert methods.count("submit") == 1
    (resubmitted,) = [t for t in ledger.transitions(op.operation_id) if t["event"] == "Resubmitted"]
    assert "proven absent by the server" in str(resubmitted["cause"])


@pytest.mark.parametrize("server", ["aip"], indirect=True)
async def test_an_operation_a_person_declared_absent_waits_for_that_persons_resubmission_after_a_restart(
    server, ledger
):
    """A person's "absent" is not the server's proof: a restarted process sends nothing for it."""
    spec = spec_for(server, sim={"duration_ms": QUICK})
    op, now = _left_after_a_crash(server, spec)
    op, _ = ledger.create_operation(op, spec.arguments)
    epoch = Epoch(spec.epoch)
    for event in (
        SubmissionLost(epoch, "connection reset"),
        LookupUnavailable(epoch, "no lookup by key"),
        Reconciled("oncall", "checked the server's console: never arrived", None),
    ):
        op = ledger.apply(step(op, event, now))
    assert op.state is LocalState.NOT_FOUND_SAFE
    op = await drive(spec, ledger)
    assert op.state is LocalState.NOT_FOUND_SAFE
    assert ledger.polls(op.operation_id) == []
    assert server.stats()["tasks"] == []
