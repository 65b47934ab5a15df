"""Rollback during 1,000 in-flight operations: no repeated call, no double receipt, everything ends.

In-process (the executor the service runs, on the test's event loop) against two reference servers:
the old path (MCP 2025-11-25) and the new adapter (MCP 2026-07-28). Half the calls are canaried onto
the new adapter; the rollback lands while they are being submitted, polled and fetched.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rollout_kit import created, executions, parsed_config, settle, states, stop

from engine.clock import SystemClock, monotonic_seconds
from engine.errors import ServiceError
from engine.ledger.duckdb import Ledger
from engine.model import RECEIPT_STATES, LocalState, Role
from refserver.testing import RefServer
from rollout.plan import Action, Request
from service.executor import Executor

CALLS = 1000
AFTER = 50
SETTLED = {s.value for s in RECEIPT_STATES} | {LocalState.UNKNOWN.value}


@pytest.mark.slow
async def test_rollback_during_a_thousand_in_flight_operations_repeats_nothing(
    tmp_path: Path, paths: dict[str, RefServer]
) -> None:
    """Epoch raised by CAS, in-flight work adopted and finished, old replies fenced, new calls on the old path."""
    for server in paths.values():
        server.reset()
    config = parsed_config(paths, qps=100)
    ledger = Ledger.open(tmp_path / "rollback.duckdb")
    executor = Executor(ledger=ledger, config=config, clock=SystemClock(), rng=random.Random(11))
    await executor.start()
    runner = asyncio.create_task(executor.run())
    rng = random.Random(5)
    figures: dict[str, Any] = {}
    try:
        await executor.rollout_act(
            Request(Action.SHADOW, "rm", "shadow the report tool", tools=("generate_report",))
        )
        await executor.rollout_act(Request(Action.CANARY, "rm", "5 % first", canary_bp=500, override=True))
        await executor.rollout_act(
            Request(Action.CANARY, "rm", "half of the calls", canary_bp=5000, override=True)
        )
        calls = [
            (
                f"rb-{i}",
                "apply_batch_change" if i % 3 == 0 else "generate_report",
                {
                    "n": f"rb-{i}",
                    "_sim": {
                        "duration_ms": rng.choice([2000, 4000, 8000]),
                        "poll_interval_ms": 2000,
                        "ttl_ms": 3_600_000,
                        **({"outcome": "failed"} if i % 17 == 0 else {}),
                    },
                },
            )
            for i in range(CALLS)
        ]
        started = monotonic_seconds()
        await executor.submit_many(calls)
        # Roll back while the work is spread over submission, polling, fetching and acceptance.
        await settle(
            lambda: (
                sum(n for s, n in states(ledger).items() if s != LocalState.SUBMITTING.value) >= CALLS // 4
            ),
            within=60,
            what="a quarter of the calls to be known to their server",
        )
        working = [r["call_node_id"] for r in ledger.list_operations(state="WORKING", limit=5)]
        for node in working:
            with contextlib.suppress(ServiceError):  # it may have finished meanwhile
                await executor.cancel(str(node), actor="oncall", reason="no longer needed")
        before = states(ledger)
        result = await executor.rollout_act(Request(Action.ROLLBACK, "oncall", "new adapter misbehaves"))
        figures["rollback_after_s"] = round(monotonic_seconds() - started, 2)
        figures["states_at_rollback"] = dict(before)
        figures["in_flight_at_rollback"] = result["detail"]["in_flight_at_rollback"]  # type: ignore[index]
        figures["adoption"] = result["adoption"]
        later = [
            (
                f"after-{i}",
                "apply_batch_change",
                {"n": f"after-{i}", "_sim": {"duration_ms": 2000, "ttl_ms": 3_600_000}},
            )
            for i in range(AFTER)
        ]
        await executor.submit_many(later)
        # The rest is ~3x the work done so far (three quarters of the calls, the later ones, every
        # poll and fetch): allowed 8x the time that first part took here, so a loaded machine gets
        # longer, and never under the former 240 s.
        await settle(
            lambda: set(states(ledger)) <= SETTLED,
            within=max(240.0, 8 * figures["rollback_after_s"]),
            what="every operation terminal or in reconciliation",
        )
        figures["total_s"] = round(monotonic_seconds() - started, 2)
    finally:
        await stop(executor, runner)
    try:
        ops = ledger.operations()
        receipts = ledger.count("receipts")
        outbox = ledger.count("outbox")
        fenced = ledger.fenced_replies()
        assignments = {a["operation_id"]: a for a in ledger.assignments(limit=10_000)}
        epoch = ledger.execution_epoch()
        final = Counter(op.state.value for op in ops)
    finally:
        ledger.close()

    in_flight = result["detail"]["in_flight_at_rollback"]  # type: ignore[index]
    figures.update(
        fenced_replies=fenced,
        end_states=dict(final),
        operations_created={name: created(server) for name, server in paths.items()},
    )
    print("rollback figures:", figures)

    # The rollback caught a real crowd in flight, on both paths.
    assert in_flight["operations"] >= 500, figures
    assert in_flight["on_new_adapter"] >= 200, figures
    assert result["adoption"]["adopted"] == in_flight["operations"], figures  # type: ignore[index]
    assert result["adoption"]["not_adopted"] == [], figures  # type: ignore[index]
    # Replies to requests sent before the raise were refused and logged, not applied.
    assert fenced > 0, figures
    assert epoch == 2
    # 0 repeated calls: one server-side operation per call node, and at most one execution each.
    nodes = {op.call_node_id for op in ops if op.role is Role.PRIMARY}
    assert len(nodes) == CALLS + AFTER
    assert sum(created(s) for s in paths.values()) == len(nodes), figures
    for name, server in paths.items():
        repeated = {n: c for n, c in executions(server).items() if c > 1}
        assert repeated == {}, (name, repeated)
    both = set(executions(paths["old"])) & set(executions(paths["new"]))
    assert both == set(), "a call ran on both paths"
    # 0 double receipts: one receipt per operation that holds one, one outbox row per primary receipt.
    assert receipts == sum(1 for op in ops if op.state in RECEIPT_STATES)
    assert outbox == receipts
    # Every operation ended terminal or in reconciliation, at the new epoch.
    assert set(final) <= SETTLED, final
    # Those in flight at the rollback were adopted at epoch 2; only calls that had already finished
    # (a loaded machine can finish a few before the rollback lands) keep epoch 1, with their receipt.
    first = [op for op in ops if op.call_node_id.startswith("rb-")]
    assert {op.epoch for op in first} <= {1, 2}
    finished_before = [op for op in first if op.epoch == 1]
    assert len(finished_before) == CALLS - in_flight["operations"], figures
    assert all(op.state in RECEIPT_STATES for op in finished_before)
    # After the rollback every new call took the old path.
    after_arms = {assignments[op.operation_id]["arm"] for op in ops if op.call_node_id.startswith("after-")}
    assert after_arms == {"control"}
    assert all(op.server == paths["old"].endpoint for op in ops if op.call_node_id.startswith("after-"))
    # Canaried operations finished on the new adapter they were sent to (adopted, never resent).
    canaried = [op for op in ops if assignments[op.operation_id]["arm"] == "canary"]
    assert canaried
    assert all(op.server == paths["new"].endpoint for op in canaried)
