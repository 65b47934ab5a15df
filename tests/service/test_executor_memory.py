"""What the executor keeps in memory per operation: nothing, once the operation's receipt is durable (issue 18).

A long-running ``finality serve`` sees every operation it ever drove pass through; anything it kept
of a finished one would grow with the total, not with the work in flight (100,000 in flight in one
process at <= 2 GiB RSS is bench/scale.py's figure; these tests hold the rule it rests on).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from executor_kit import running_executor

from engine.ledger.duckdb import Ledger
from engine.model import RECEIPT_STATES, LocalState
from engine.testing.wait import wait_until_async
from refserver.testing import RefServer
from service.config import parse_config
from service.executor import Executor
from service.testing import config_text

QUICK = {"duration_ms": 2000, "ttl_ms": 3_600_000}
LONG = {"duration_ms": 600_000, "ttl_ms": 3_600_000}


def held_of(executor: Executor, op_ids: set[str]) -> dict[str, list[str]]:
    """Where the executor (its tables, its drivers' memories) still holds any of ``op_ids``."""
    tables = {
        "ops": executor._ops,
        "due_at": executor._due_at,
        "running": executor._running,
        "urgent": executor._urgent,
        "dirty": executor._dirty,
        "rerun": executor._rerun,
        "budget_flagged": executor._budget_flagged,
    }
    for name, server in executor._servers.items():
        tables[f"driver memory ({name})"] = server.driver._memory
    return {name: sorted(op_ids & set(table)) for name, table in tables.items() if op_ids & set(table)}


async def test_a_completed_a_failed_and_a_cancelled_operation_leave_nothing_in_memory_once_accepted(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """On each protocol a completed, a failed and a cancelled call: once every receipt is durable neither
    the executor's tables nor its drivers remember any of them (a cancelled one's driver memory
    stayed for good: the cancel path reaches its receipt by a poll, which never forgot it)."""
    config = parse_config(tomllib.loads(config_text(servers, global_qps=200)))
    ledger = Ledger.open(tmp_path / "memory.duckdb")
    async with running_executor(ledger, config, seed=5) as executor:
        tools = {"aip": "analyze_upload", "ext": "apply_batch_change", "mcp": "generate_report"}
        ids: set[str] = set()
        for server, tool in tools.items():
            for kind, sim in (
                ("completed", QUICK),
                ("failed", {**QUICK, "outcome": "failed"}),
                ("cancelled", LONG),
            ):
                node = f"{kind}-{server}"
                op = await executor.submit(call_node=node, tool=tool, arguments={"n": node, "_sim": sim})
                ids.add(op.operation_id)
        for server in tools:
            node = f"cancelled-{server}"
            await wait_until_async(
                lambda node=node: executor._current(node).state is LocalState.WORKING,  # type: ignore[misc]
                within=60,
                what=f"{node} working",
            )
            await executor.cancel(node, actor="test", reason="memory test")
        await wait_until_async(lambda: executor.in_flight == 0, within=120, what="every call terminal")
        await executor.settled()
        states = {op.call_node_id: op.state for op in ledger.operations()}
        assert all(state in RECEIPT_STATES for state in states.values()), states
        assert {s for n, s in states.items() if n.startswith("cancelled")} == {LocalState.CANCELLED_ACCEPTED}
        assert held_of(executor, ids) == {}
