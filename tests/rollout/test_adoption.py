"""Adoption after a rollback, in-process: interrupted rollbacks finish at the next start; fenced replies are logged."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from rollout_kit import created, executions, parsed_config, settle, states, stop

from engine.clock import SystemClock
from engine.ledger.duckdb import Ledger
from engine.model import RECEIPT_STATES
from refserver.testing import RefServer
from rollout.controller import RolloutController
from rollout.plan import Action, Request
from rollout.route import ToolPaths
from service.executor import Executor

LONG = {"duration_ms": 60_000, "ttl_ms": 3_600_000}


async def test_a_rollback_interrupted_before_adoption_is_finished_at_the_next_start(
    tmp_path: Path, paths: dict[str, RefServer]
) -> None:
    """The epoch was raised (CAS) but the process died before adopting: the next start adopts, never resubmits."""
    for server in paths.values():
        server.reset()
    config = parsed_config(paths, qps=100)
    ledger = Ledger.open(tmp_path / "adopt.duckdb")
    try:
        first = Executor(ledger=ledger, config=config, clock=SystemClock(), rng=random.Random(1))
        await first.start()
        runner = asyncio.create_task(first.run())
        await first.rollout_act(Request(Action.SHADOW, "rm", "shadow first"))
        await first.rollout_act(Request(Action.CANARY, "rm", "5 %", canary_bp=500, override=True))
        await first.rollout_act(Request(Action.CANARY, "rm", "half", canary_bp=5000, override=True))
        nodes = [f"i{i}" for i in range(12)]
        await first.submit_many([(n, "apply_batch_change", {"n": n, "_sim": LONG}) for n in nodes])
        await settle(lambda: states(ledger)["WORKING"] == len(nodes), within=30, what="all working")
        await stop(first, runner)

        # Only the first half of a rollback: the audit row and the epoch's compare-and-swap.
        tools = {
            n: ToolPaths(n, t.server, t.shadow_server, t.side_effect_free) for n, t in config.tools.items()
        }
        RolloutController(ledger, SystemClock(), tools, salt=config.rollout_salt).act(
            Request(Action.ROLLBACK, "oncall", "new adapter misbehaves")
        )
        assert ledger.execution_epoch() == 2
        assert {op.epoch for op in ledger.operations()} == {1}

        second = Executor(ledger=ledger, config=config, clock=SystemClock(), rng=random.Random(2))
        await second.start()
        assert second.epoch == 2
        assert {op.epoch for op in ledger.operations()} == {2}, "adopted at start, before anything is sent"
        runner = asyncio.create_task(second.run())
        await settle(
            lambda: all(op.state in RECEIPT_STATES for op in ledger.operations()), within=60, what="terminal"
        )
        await stop(second, runner)
        adopted = [
            t
            for op in ledger.operations()
            for t in ledger.transitions(op.operation_id)
            if t["event"] == "EpochRaised"
        ]
        assert len(adopted) == len(nodes)
        assert all("restart after rollback" in str(t["cause"]) for t in adopted)
        assert all(op.epoch == 2 for op in ledger.operations())
        assert created(paths["old"]) + created(paths["new"]) == len(nodes)
        for server in paths.values():
            assert all(c == 1 for c in executions(server).values())
    finally:
        ledger.close()
