"""Cancels that arrive together: each its own compare-and-swap, recorded in one group commit, answered once durable."""

from __future__ import annotations

import asyncio
import tomllib
from collections.abc import Sequence
from pathlib import Path

from executor_kit import running_executor

from engine.clock import monotonic_seconds
from engine.errors import ServiceError
from engine.ledger.duckdb import Ledger
from engine.model import LocalState, Operation
from engine.testing.wait import wait_until_async
from refserver.testing import RefServer
from service.config import parse_config
from service.testing import config_text

LONG = {"duration_ms": 600_000, "ttl_ms": 3_600_000}  # scaled by the servers' time scale: 30 s


class ReadCountingLedger(Ledger):
    """A real DuckDB ledger that counts the reads of operations: one row at a time, or many at once."""

    point_reads: int = 0
    batch_reads: int = 0

    def get(self, operation_id: str) -> Operation | None:
        self.point_reads += 1
        return super().get(operation_id)

    def by_call_node(self, call_node_id: str) -> Operation | None:
        self.point_reads += 1
        return super().by_call_node(call_node_id)

    def get_many(self, operation_ids: Sequence[str]) -> dict[str, Operation]:
        self.batch_reads += 1
        return super().get_many(operation_ids)

    def by_call_nodes(self, call_node_ids: Sequence[str]) -> dict[str, Operation]:
        self.batch_reads += 1
        return super().by_call_nodes(call_node_ids)


async def test_concurrent_cancels_share_one_commit_and_a_few_reads_and_each_is_durable_when_answered(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """Forty cancels at once: a handful of commits, fewer ledger reads than cancels (not three each)."""
    config = parse_config(tomllib.loads(config_text(servers, global_qps=200)))
    ledger = ReadCountingLedger.open(tmp_path / "cancels.duckdb")
    async with running_executor(ledger, config, seed=7) as executor:
        nodes = [f"c{i}" for i in range(40)]
        await executor.submit_many([(n, "analyze_upload", {"n": n, "_sim": LONG}) for n in nodes])

        def working() -> bool:
            return all(op.state is LocalState.WORKING for op in ledger.operations())

        await wait_until_async(working, within=30, what="all 40 working")
        commits_before = executor._store.flushes
        reads_before = ledger.point_reads + ledger.batch_reads
        answers = await asyncio.gather(
            *(executor.cancel(n, actor="ops", reason="batch stop") for n in nodes),
            executor.cancel("no-such-node", actor="ops", reason="typo"),
            return_exceptions=True,
        )
        # Read together, two reads per tick that takes cancels (a loaded machine spreads forty over
        # a few ticks): fewer reads than cancels. Each cancel used to read its row by call node,
        # again by id and its shadow's row: 120 point reads for forty, a fifth of the executor's
        # time in bench/scale.py.
        assert ledger.point_reads + ledger.batch_reads - reads_before < len(nodes)
        *cancelled, missing = answers
        assert isinstance(missing, ServiceError)
        assert missing.status == 404
        for answer in cancelled:
            assert not isinstance(answer, BaseException), answer
            assert answer.state is LocalState.CANCEL_REQUESTED
            stored = ledger.get(answer.operation_id)  # durable by the time the caller is answered
            assert stored is not None
            assert stored.cancel_generation == 1
            assert stored.cancel_requested_at is not None
        # Forty person actions, a handful of commits (the group's, plus ticks' own), not forty.
        assert executor._store.flushes - commits_before < 10
        again = await asyncio.gather(
            executor.cancel(nodes[0], actor="ops", reason="twice"), return_exceptions=True
        )
        assert isinstance(again[0], ServiceError | type(None)) or again[0].cancel_generation >= 1  # type: ignore[union-attr]


async def test_a_single_cancel_is_answered_without_waiting_for_company(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    config = parse_config(tomllib.loads(config_text(servers, global_qps=200)))
    ledger = Ledger.open(tmp_path / "one.duckdb")
    async with running_executor(ledger, config, seed=8) as executor:
        await executor.submit_many([("solo", "analyze_upload", {"n": "solo", "_sim": LONG})])
        await wait_until_async(
            lambda: all(op.state is LocalState.WORKING for op in ledger.operations()),
            within=30,
            what="working",
        )
        started = monotonic_seconds()
        answer = await executor.cancel("solo", actor="ops", reason="stop")
        assert answer.state is LocalState.CANCEL_REQUESTED
        assert monotonic_seconds() - started < 5
