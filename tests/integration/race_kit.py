"""Shared pieces of the race integration tests: the reference server fleet, the call helper and the
seed's invariants (the fixtures that use them live in ``conftest.py``).

Every test drives the real engine (``run_call`` and ``Driver``) over real HTTP against a real
``refserver`` subprocess, then calls ``invariants``. Every wait is bounded: a call gets its wait
budget plus a margin, and nothing sleeps for long.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

from engine.adapters import AdapterOptions, Timeouts
from engine.adapters.verify import EPOCH_META
from engine.clock import SystemClock
from engine.ledger.duckdb import Ledger
from engine.model import (
    RECEIPT_STATES,
    LocalState,
    Operation,
    Receipt,
    ServerStatus,
    ToolRef,
    digest_of,
)
from engine.runtime.call import CallSpec, run_call
from engine.schedule import PollPolicy
from refserver.testing import RefServer

SCALE = 0.01
"""Server time scale: a ``_sim`` millisecond is 10 real microseconds."""
QUICK = 500
"""Unscaled ``duration_ms`` of a call that is over before the first poll (5 ms real)."""
LONG = 100_000
"""Unscaled ``duration_ms`` of a call that is still working when a cancel arrives (1 s real)."""
KEEP = 10_000_000
"""Unscaled ``ttl_ms`` that outlives any test (100 s real): the default for every call, so that a
slow machine never turns a test into an expiry test (the scaled default would be 0.6 s)."""
ACCEPT: dict[str, object] = {"action": "accept", "content": {"approve": True}}
POLICY = PollPolicy(
    default_interval=timedelta(milliseconds=20),
    min_interval=timedelta(milliseconds=10),
    max_interval=timedelta(seconds=1),
    retry_backoff=timedelta(milliseconds=20),
)
OPTIONS = AdapterOptions(
    timeouts=Timeouts(
        request=timedelta(seconds=5),
        result_wait=timedelta(seconds=5),
        input_probe=timedelta(milliseconds=500),
    )
)
MARGIN = timedelta(seconds=10)
"""How much longer than its wait budget one ``run_call`` may take before the test gives up."""

# Server kinds: protocol and options (``idempotency``: the MCP server honours ``idempotencyKey``,
# SEP-3182; ``elicitation_id``: one JSON-RPC id for every elicitation, as some servers send 0).
KINDS: dict[str, tuple[str, dict[str, Any]]] = {
    "mcp25": ("mcp-2025-11-25", {}),
    "mcp25_keyed": ("mcp-2025-11-25", {"idempotency": True}),
    "mcp25_id0": ("mcp-2025-11-25", {"elicitation_id": 0}),
    "mcp26": ("mcp-2026-07-28", {}),
    "mcp26_keyed": ("mcp-2026-07-28", {"idempotency": True}),
    "aip": ("aip-151", {}),
    "aip_ignoring_request_id": ("aip-151", {"ignore_request_id": True}),
}
PLAIN = ["mcp25", "mcp26", "aip"]
"""One server per protocol, as a parametrize list for the ``server`` fixture."""
KEYED = ["mcp25_keyed", "mcp26_keyed", "aip"]
"""Servers that can find a submission again by its key (AIP-151 always can, by ``request_id``)."""
MCP = ["mcp25", "mcp26"]


class Fleet:
    """Reference servers started on first use and stopped at the end of the session."""

    def __init__(self) -> None:
        self._servers: dict[str, RefServer] = {}

    def get(self, kind: str) -> RefServer:
        if kind not in self._servers:
            protocol, options = KINDS[kind]
            server = RefServer(protocol, time_scale=SCALE, seed=11, **options)
            server.start()
            self._servers[kind] = server
            warm_up(server)
        return self._servers[kind]

    def stop(self) -> None:
        for server in self._servers.values():
            server.stop()
        self._servers.clear()


def warm_up(server: RefServer) -> None:
    """One plain call before the first test, so that this process's first-call costs (imports,
    validator builds, ~0.5 s) never eat into a test's wait budget or cancel timing.

    Runs on its own thread and event loop, apart from the test's loop, and is bounded.
    """

    async def one_call(path: Path) -> None:
        ledger = Ledger.open(path)
        try:
            await call(server, ledger, sim={"duration_ms": QUICK}, node="warm-up")
        finally:
            ledger.close()

    with tempfile.TemporaryDirectory() as folder, ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, one_call(Path(folder) / "warm-up.duckdb")).result(timeout=30)


def engine_url(server: RefServer) -> str:
    """What the engine is pointed at: the MCP endpoint, or the AIP-151 service root."""
    return server.url if server.protocol == "aip-151" else server.endpoint


def tool_ref(tool: str) -> ToolRef:
    return ToolRef(tool, "1.0", "1", side_effects=tool == "apply_batch_change")


def arguments(tool: str, sim: dict[str, Any], **echo: object) -> dict[str, object]:
    """Tool arguments: a little echo the result must carry back, plus the ``_sim`` controls."""
    own: dict[str, dict[str, object]] = {
        "generate_report": {"report": "q3", "period": "2026-Q3"},
        "analyze_upload": {"upload_id": "up-1"},
        "apply_batch_change": {"batch_id": "b-1", "changes": [{"set": "x", "to": 1}]},
    }
    return {**own.get(tool, {}), **echo, "_sim": sim}


def spec_for(
    server: RefServer,
    *,
    sim: dict[str, Any],
    node: str = "node-1",
    tool: str = "generate_report",
    wait_budget: timedelta = timedelta(seconds=5),
    **overrides: Any,
) -> CallSpec:
    fields: dict[str, Any] = {
        "server": engine_url(server),
        "protocol": server.protocol,
        "tool": tool_ref(tool),
        "arguments": arguments(tool, {"ttl_ms": KEEP, **sim}),
        "call_node": node,
        "wait_budget": wait_budget,
        "policy": POLICY,
        # Lookup by request_id only where the server is known to deduplicate it (AIP-155 optional).
        "options": replace(OPTIONS, request_id_dedupe=server.dedupes_request_id),
        "seed": 7,
    }
    fields.update(overrides)
    return CallSpec(**fields)


async def drive(spec: CallSpec, ledger: Ledger) -> Operation:
    """``run_call`` (the driver the service uses) with the real clock, bounded by budget + margin."""
    limit = (spec.wait_budget + MARGIN).total_seconds()
    return await asyncio.wait_for(run_call(spec, ledger, SystemClock()), limit)


async def call(server: RefServer, ledger: Ledger, *, sim: dict[str, Any], **kwargs: Any) -> Operation:
    """Drive one call of ``generate_report`` (or ``tool=``) on ``server`` to a receipt, a person or its budget."""
    return await drive(spec_for(server, sim=sim, **kwargs), ledger)


# ----------------------------------------------------------------------------------- invariants


def server_task_id(task_id: str) -> str:
    """The id the server keeps for a task: AIP-151 names are ``operations/{id}``."""
    return task_id.removeprefix("operations/")


def path_of(transitions: list[dict[str, object]]) -> list[str]:
    """The states an operation went through, from its accepted transitions that changed state."""
    return [str(t["to_state"]) for t in transitions if t["accepted"] and t["from_state"] != t["to_state"]]


@dataclass
class Seen:
    """What the invariant check read, for the test's own assertions."""

    stats: dict[str, Any]
    ops: dict[str, Operation]
    receipts: dict[str, Receipt | None]
    transitions: dict[str, list[dict[str, object]]]
    entries: dict[str, list[dict[str, Any]]]
    polls: dict[str, list[dict[str, object]]]
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Server-side task records by server task id."""

    def op(self, node: str = "node-1") -> Operation:
        return self.ops[node]

    def receipt(self, node: str = "node-1") -> Receipt | None:
        return self.receipts[node]

    def task(self, node: str = "node-1") -> dict[str, Any]:
        task_id = self.ops[node].task_id
        assert task_id is not None, f"{node} has no task id"
        return self.tasks[server_task_id(task_id)]

    def path(self, node: str = "node-1") -> list[str]:
        return path_of(self.transitions[node])

    def methods(self, node: str = "node-1") -> list[str]:
        return [str(p["method"]) for p in self.polls[node]]

    def fired(self) -> list[str]:
        return [str(f["fault"]) for f in self.stats["faults_fired"]]


def _check_one(ledger: Ledger, server: RefServer, node: str, seen: Seen) -> None:
    op = seen.ops[node]
    receipt = seen.receipts[node]
    transitions = seen.transitions[node]
    path = path_of(transitions)

    # At most one terminal receipt per call node, written by exactly one accepted transition, and
    # receipt states absorb everything after it.
    into_receipt = [
        i
        for i, t in enumerate(transitions)
        if t["accepted"] and t["to_state"] in RECEIPT_STATES and t["from_state"] not in RECEIPT_STATES
    ]
    assert len(into_receipt) == (1 if receipt is not None else 0), f"{node}: receipt transitions {path}"
    assert (receipt is not None) == (op.state in RECEIPT_STATES), f"{node}: {op.state} vs receipt {receipt}"
    if into_receipt:
        final = transitions[into_receipt[0]]["to_state"]
        later = transitions[into_receipt[0] + 1 :]
        assert all(t["to_state"] == final for t in later), f"{node}: moved after its receipt: {path}"

    # Never a second submission: exactly one submit request; lookups repeat the same key.
    submits = [m for m in seen.methods(node) if m == "submit"]
    assert len(submits) == 1, f"{node}: {len(submits)} submissions"
    assert "Resubmitted" not in {str(t["event"]) for t in transitions if t["accepted"]}

    task = seen.tasks.get(server_task_id(op.task_id)) if op.task_id is not None else None
    if op.task_id is not None:
        assert task is not None, f"{node}: bound to {op.task_id}, which the server never created"
        if task["key"] is not None:
            assert task["key"] == op.idempotency_key, f"{node}: bound to a task of another key"

    if receipt is not None:
        assert receipt.call_node_id == node
        assert receipt.operation_id == op.operation_id
        assert receipt.task_id == op.task_id
        assert receipt.request_digest == op.request_digest
        assert receipt.epoch == op.epoch
        assert receipt.cancel_generation == op.cancel_generation
        assert task is not None
        # Zero terminal divergence: the receipt states what the server holds.
        assert receipt.status.value == task["status"], f"{node}: receipt {receipt.status}, server {task}"

    if receipt is not None and receipt.status is not ServerStatus.CANCELLED:
        # Completed (or failed) only after the result was fetched and its digest verified.
        assert op.state is LocalState.ACCEPTED
        accepted_at = path.index(LocalState.ACCEPTED.value)
        assert LocalState.FETCHING_RESULT.value in path[:accepted_at], f"{node}: accepted unfetched: {path}"
        assert transitions[into_receipt[0]]["event"] == "ResultVerified"
        assert transitions[into_receipt[0]]["from_state"] == LocalState.FETCHING_RESULT.value
        payload = ledger.result_payload(op.operation_id)
        assert payload is not None, f"{node}: a receipt without its result"
        assert receipt.result_digest == op.result_digest == digest_of(payload)
        _check_is_the_tools_own_result(ledger, op, payload)

    if receipt is not None and receipt.status is ServerStatus.CANCELLED:
        # Cancel is a terminal of its own: no success payload, and the tool's effects go to a person.
        assert op.state is LocalState.CANCELLED_ACCEPTED
        assert op.cancel_generation >= 1
        assert receipt.cancel_evidence
        assert receipt.result_digest is None
        assert ledger.result_payload(op.operation_id) is None
        if op.tool.side_effects:
            assert op.effect_reconciliation_required
            assert any(e["kind"] == "effects" for e in seen.entries[node]), f"{node}: effects not flagged"

    # Every UNKNOWN can be found again by its submission key or its task id.
    if LocalState.UNKNOWN.value in path or op.state is LocalState.UNKNOWN:
        unknown = [e for e in seen.entries[node] if e["kind"] == "unknown"]
        assert unknown, f"{node}: went UNKNOWN without a reconciliation entry"
        for entry in unknown:
            assert entry["idempotency_key"] == op.idempotency_key
            assert entry["request_digest"] == op.request_digest
            assert entry["window_start"] <= entry["window_end"]
            assert isinstance(json.loads(str(entry["candidates"])), list)
            found = ledger.by_key(str(entry["idempotency_key"]))
            assert found is not None
            assert found.operation_id == op.operation_id
            if entry["task_id"] is not None:
                assert entry["task_id"] == op.task_id
                by_task = ledger.by_task(op.server, str(entry["task_id"]))
                assert by_task is not None
                assert by_task.operation_id == op.operation_id
        if op.state is LocalState.UNKNOWN:
            assert any(e["status"] == "open" for e in unknown), f"{node}: UNKNOWN with no open entry"


def epoch_echo(payload: dict[str, object]) -> int | None:
    """The execution epoch a result carries, where the reference servers put it (None if absent)."""
    data = payload.get("data")
    for meta in (payload.get("_meta"), data.get("_meta") if isinstance(data, dict) else None):
        if isinstance(meta, dict) and isinstance(meta.get(EPOCH_META), int):
            return int(meta[EPOCH_META])
    if isinstance(payload.get("epoch"), int):  # AIP-151 response
        return int(str(payload["epoch"]))
    details = payload.get("details")
    for detail in details if isinstance(details, list) else []:  # AIP-151 google.rpc.Status ErrorInfo
        meta = detail.get("metadata") if isinstance(detail, dict) else None
        if isinstance(meta, dict) and str(meta.get("epoch", "")).lstrip("-").isdigit():
            return int(meta["epoch"])
    return None


def _check_is_the_tools_own_result(ledger: Ledger, op: Operation, payload: dict[str, object]) -> None:
    """A stored result is what the tool returned for these arguments in this epoch, not something else."""
    echoed = epoch_echo(payload)
    assert echoed in (None, op.epoch), f"accepted a result of epoch {echoed}; the operation is at {op.epoch}"
    sent = {k: v for k, v in ledger.arguments(op.operation_id).items() if k != "_sim"}
    structured = payload.get("structuredContent")
    if isinstance(structured, dict):
        assert structured.get("tool") == op.tool.name
        assert structured.get("echo") == sent, f"result echoes {structured.get('echo')}, sent {sent}"
    else:
        # A JSON-RPC error or a google.rpc.Status: the failure the server reported.
        why = f"accepted something that is neither the tool's result nor its error: {payload}"
        assert isinstance(payload.get("code"), int), why
        assert isinstance(payload.get("message"), str), why


def invariants(ledger: Ledger, server: RefServer, *nodes: str) -> Seen:
    """Check the seed's invariants for the call nodes of one test (default ``node-1``); return what was read.

    - at most one terminal receipt per call node, with one outbox entry each, absorbing later events;
    - no second operation on the server (server-side count, execution log, one submit per node);
    - a completed/failed receipt only after FETCHING_RESULT, with the stored result's digest;
    - a cancelled receipt has no success payload, and a side-effecting tool is flagged for effects;
    - the receipt's status is the server's own (no divergence);
    - every UNKNOWN has a reconciliation entry that finds it by key or task id.
    """
    nodes = nodes or ("node-1",)
    stats = server.stats()
    ops: dict[str, Operation] = {}
    for node in nodes:
        op = ledger.by_call_node(node)
        assert op is not None, f"no operation recorded for {node}"
        ops[node] = op
    entries_all = ledger.reconciliation(open_only=False)
    seen = Seen(
        stats=stats,
        ops=ops,
        receipts={node: ledger.receipt(node) for node in nodes},
        transitions={node: ledger.transitions(op.operation_id) for node, op in ops.items()},
        entries={
            node: [e for e in entries_all if e["operation_id"] == op.operation_id] for node, op in ops.items()
        },
        polls={node: ledger.polls(op.operation_id) for node, op in ops.items()},
        tasks={str(t["id"]): t for t in stats["tasks"]},
    )

    receipts = [r for r in seen.receipts.values() if r is not None]
    assert ledger.count("receipts") == len(receipts)
    assert ledger.count("outbox") == len(receipts), "every receipt has exactly one outbox entry"

    # No second operation: one server-side operation per call node, each executed once.
    created = stats["operations_created"]["total"]
    assert created == len(nodes), f"the server created {created} operations for {len(nodes)} call nodes"
    executed = [e["task_id"] for runs in stats["executions"].values() for e in runs]
    assert len(executed) == created, f"executions: {executed}"
    assert len(set(executed)) == created, f"a task executed twice: {executed}"
    bound = [op.task_id for op in ops.values() if op.task_id is not None]
    assert len(bound) == len(set(bound)), f"two call nodes bound to one task: {bound}"

    for node in nodes:
        _check_one(ledger, server, node, seen)
    return seen
