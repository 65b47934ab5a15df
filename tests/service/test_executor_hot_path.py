"""The service's hot path: a burst of submissions shares one transaction, with lone submissions' answers (issue 18)."""

from __future__ import annotations

import asyncio
import random
import threading
import tomllib
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path

from engine.adapters.base import Json
from engine.clock import SystemClock
from engine.ledger.duckdb import Ledger
from engine.ledger.port import GroupOutcome, WriteGroup
from engine.model import Operation
from engine.testing import FakeClock
from engine.testing.wait import wait_until_async
from refserver.testing import RefServer
from service.config import parse_config
from service.executor import Executor, ServiceError
from service.testing import config_text

LONG = {"duration_ms": 600_000, "ttl_ms": 3_600_000}


class CountingLedger(Ledger):
    """A real DuckDB ledger that counts how operations are created (one transaction per call)."""

    creations: list[int]
    arm_writes: int = 0
    """Transactions that wrote rollout arms apart from their operations' creation."""

    def create_operation(self, op: Operation, arguments: Json) -> tuple[Operation, bool]:
        self.creations.append(1)
        return super().create_operation(op, arguments)

    def create_many(
        self,
        items: Sequence[tuple[Operation, Json]],
        *,
        arms: Sequence[dict[str, object]] = (),
    ) -> list[tuple[Operation, bool]]:
        self.creations.append(len(items))
        return super().create_many(items, arms=arms)

    def record_assignments(self, rows: Sequence[dict[str, object]]) -> None:
        self.arm_writes += 1
        super().record_assignments(rows)


class HeldCommitLedger(Ledger):
    """A real DuckDB ledger whose group commits can be held on the writer thread until released."""

    hold: threading.Event
    entered: threading.Event
    release: threading.Event

    def commit_group(self, group: WriteGroup) -> GroupOutcome:
        if self.hold.is_set():
            self.hold.clear()
            self.entered.set()
            self.release.wait(timeout=60)
        return super().commit_group(group)


class SweepCountingLedger(Ledger):
    """A real DuckDB ledger that counts the sweeps closing approval rounds."""

    sweeps: int = 0

    def close_rounds(self, at: datetime) -> int:
        self.sweeps += 1
        return super().close_rounds(at)


async def started(
    tmp_path: Path, servers: dict[str, RefServer]
) -> tuple[Executor, Ledger, asyncio.Task[None]]:
    config = parse_config(tomllib.loads(config_text(servers, global_qps=200)))
    ledger = CountingLedger.open(tmp_path / "hot.duckdb")
    ledger.creations = []
    executor = Executor(ledger=ledger, config=config, clock=SystemClock(), rng=random.Random(3))
    await executor.start()
    return executor, ledger, asyncio.create_task(executor.run())


async def stopped(executor: Executor, ledger: Ledger, runner: asyncio.Task[None]) -> None:
    executor.request_stop()
    await asyncio.wait_for(runner, timeout=60)
    await executor.aclose()
    ledger.close()


async def test_concurrent_submissions_share_one_transaction_and_each_is_durable_when_answered(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """Sixty callers at once: a few create_many calls, no lone creation; each reply names a durable row
    whose rollout arm was written in the same transaction (no separate write of the arms)."""
    executor, ledger, runner = await started(tmp_path, servers)
    try:
        nodes = [f"s{i}" for i in range(60)]
        answers = await asyncio.gather(
            *(
                executor.submit(call_node=n, tool="analyze_upload", arguments={"n": n, "_sim": LONG})
                for n in nodes
            )
        )
        assert [a.call_node_id for a in answers] == nodes
        assert len({a.operation_id for a in answers}) == 60
        for answer in answers:
            assert ledger.get(answer.operation_id) is not None
        assert sum(ledger.creations) == 60
        assert len(ledger.creations) < 10  # batches, not sixty transactions
        assert ledger.arm_writes == 0
        arms = {str(a["call_node_id"]) for a in ledger.assignments(limit=1000)}
        assert arms == set(nodes)
    finally:
        await stopped(executor, ledger, runner)


async def test_a_call_node_submitted_twice_in_one_burst_keeps_its_first_request_and_refuses_another(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """The same request again gets the same operation; a different one under that call node is a 409."""
    executor, ledger, runner = await started(tmp_path, servers)
    try:
        same = {"n": "x", "_sim": LONG}
        first, again, other = await asyncio.gather(
            executor.submit(call_node="dup", tool="analyze_upload", arguments=same),
            executor.submit(call_node="dup", tool="analyze_upload", arguments=same),
            executor.submit(call_node="dup", tool="analyze_upload", arguments={"n": "y", "_sim": LONG}),
            return_exceptions=True,
        )
        assert isinstance(first, Operation)
        assert isinstance(again, Operation)
        assert again.operation_id == first.operation_id
        assert isinstance(other, ServiceError)
        assert other.status == 409
        assert len(ledger.operations()) == 1
    finally:
        await stopped(executor, ledger, runner)


async def test_a_loop_without_pending_approval_rounds_stops_sweeping_them_after_the_first_look(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """At start the ledger may hold rounds: one sweep; none pending, later ticks (a second apart) sweep
    nothing and commit nothing on the loop's thread (each sweep used to flush the buffered writes first)."""
    config = parse_config(tomllib.loads(config_text(servers, global_qps=200)))
    ledger = SweepCountingLedger.open(tmp_path / "rounds.duckdb")
    clock = FakeClock()
    executor = Executor(ledger=ledger, config=config, clock=clock, rng=random.Random(3))
    await executor.start()
    try:
        await executor.tick()
        assert ledger.sweeps == 1
        flushes = executor._store.flushes
        for _ in range(5):
            clock.advance(timedelta(seconds=1.5))
            await executor.tick()
        assert ledger.sweeps == 1
        assert executor._store.flushes == flushes
    finally:
        await executor.aclose()
        ledger.close()


async def test_every_advance_of_a_completing_call_sends_a_request_the_local_steps_after_it_ride_along(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """On each protocol a call that completes is advanced exactly once per protocol request: starting
    the fetch and verifying an outcome that came with the terminal status follow in the advance that
    saw it (they used to wait a group commit each), and each call still gets one receipt."""
    executor, ledger, runner = await started(tmp_path, servers)
    try:
        quick = {"duration_ms": 2000, "ttl_ms": 3_600_000}
        nodes = {
            "inline-aip": "analyze_upload",
            "inline-ext": "apply_batch_change",
            "fetched-mcp": "generate_report",
        }
        for node, tool in nodes.items():
            await executor.submit(call_node=node, tool=tool, arguments={"n": node, "_sim": quick})
        await wait_until_async(lambda: executor.in_flight == 0, within=120, what="every call terminal")
        executor.request_stop()
        await asyncio.wait_for(runner, timeout=60)
        ops = {op.call_node_id: op for op in ledger.operations()}
        assert {node: ops[node].state.value for node in nodes} == dict.fromkeys(nodes, "ACCEPTED")
        assert len(ledger.polls()) == executor.stats["advances"]
    finally:
        await stopped(executor, ledger, runner)


async def test_due_polls_go_out_while_a_group_commit_is_still_running(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """A group commit held on the writer thread does not hold back the poll of an operation whose
    last change is already durable: it is sent meanwhile (the loop used to wait for each commit
    before launching anything, so every poll due during it went out late)."""
    config = parse_config(tomllib.loads(config_text(servers, global_qps=200)))
    ledger = HeldCommitLedger.open(tmp_path / "held.duckdb")
    ledger.hold, ledger.entered, ledger.release = threading.Event(), threading.Event(), threading.Event()
    executor = Executor(ledger=ledger, config=config, clock=SystemClock(), rng=random.Random(3))
    await executor.start()
    runner = asyncio.create_task(executor.run())
    try:
        # The servers run at a time scale of 0.05: polled every 0.2 s, 0.2 s and 0.6 s of real time.
        for node, interval_ms in (("fast-1", 4_000), ("fast-2", 4_000), ("slow", 12_000)):
            sim = {"duration_ms": 60_000_000, "poll_interval_ms": interval_ms, "ttl_ms": 72_000_000}
            await executor.submit(call_node=node, tool="generate_report", arguments={"n": node, "_sim": sim})
        slow = ledger.by_call_node("slow")
        assert slow is not None
        await wait_until_async(
            lambda: sum(1 for row in ledger.polls() if row["operation_id"] == slow.operation_id) >= 2,
            within=60,
            what="the slow call polling",
        )
        for _ in range(10):  # until the held group finds the slow call between two polls
            ledger.entered.clear()
            ledger.release = threading.Event()
            ledger.hold.set()
            await wait_until_async(ledger.entered.is_set, within=30, what="a group commit to be held")
            between = slow.operation_id in executor._due_at and slow.operation_id not in executor._running
            if between:
                break
            ledger.release.set()
        assert between, "the slow call was never found between two polls while a commit was held"
        polls = executor.stats["advances"]
        await wait_until_async(
            lambda: executor.stats["advances"] > polls, within=20, what="a poll sent during the commit"
        )
        assert not ledger.release.is_set()
    finally:
        ledger.release.set()
        await stopped(executor, ledger, runner)


async def test_a_submission_is_recorded_and_answered_while_a_group_commit_is_held(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """A new call touches no row a group commit writes: it is recorded durably and answered while the
    executor's group commit is still held on the writer thread (it used to wait for that commit, then
    for the loop's commit of everything buffered, then for its own)."""
    config = parse_config(tomllib.loads(config_text(servers, global_qps=200)))
    ledger = HeldCommitLedger.open(tmp_path / "held.duckdb")
    ledger.hold, ledger.entered, ledger.release = threading.Event(), threading.Event(), threading.Event()
    executor = Executor(ledger=ledger, config=config, clock=SystemClock(), rng=random.Random(3))
    await executor.start()
    runner = asyncio.create_task(executor.run())
    try:
        ledger.hold.set()
        # Its advance (the submission upstream) ends in a group commit, which is held.
        await executor.submit(call_node="first", tool="generate_report", arguments={"n": 1, "_sim": LONG})
        await wait_until_async(ledger.entered.is_set, within=30, what="a group commit to be held")
        second = asyncio.ensure_future(
            executor.submit(call_node="second", tool="generate_report", arguments={"n": 2, "_sim": LONG})
        )
        await wait_until_async(second.done, within=30, what="the second submission answered")
        assert not ledger.release.is_set()
        answer = second.result()
        # Durable: another connection of the same database reads the committed row.
        found = await asyncio.to_thread(ledger.get, answer.operation_id)
        assert found is not None
        assert found.call_node_id == "second"
    finally:
        ledger.release.set()
        await stopped(executor, ledger, runner)


async def test_each_principal_s_in_flight_count_follows_its_operations_to_their_receipts(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """The count the API's per-principal limit reads is kept as operations come and go, not counted
    over every held operation per submission: it matches the held operations, and is 0 at the end."""
    executor, ledger, runner = await started(tmp_path, servers)
    try:
        for i, principal in enumerate(["alice", "alice", "alice", "bob", "bob"]):
            await executor.submit(
                call_node=f"p{i}",
                tool="generate_report",
                arguments={"n": i, "_sim": LONG},
                principal=principal,
            )
        assert executor.in_flight_by_principal() == {"alice": 3, "bob": 2}
        assert (executor.in_flight_of("alice"), executor.in_flight_of("carol")) == (3, 0)
        for i in range(5):
            await executor.cancel(f"p{i}", actor="test", reason="the count is checked")
        await wait_until_async(lambda: executor.in_flight == 0, within=120, what="every call terminal")
        assert executor.in_flight_by_principal() == {}
        assert executor.in_flight_of("alice") == 0
    finally:
        await stopped(executor, ledger, runner)


async def one_round() -> None:
    """Let the event loop come round once (as an HTTP request's reading does between its steps)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    loop.call_soon(done.set_result, None)
    await done


async def test_submissions_read_a_few_loop_rounds_apart_are_recorded_in_one_transaction(
    tmp_path: Path, servers: dict[str, RefServer]
) -> None:
    """Callers whose requests are read a loop round or a few apart, as an HTTP burst is, share one
    create_many: the recording waits for the rounds that still bring submissions (no timer), where
    starting at the first caller made a batch of a few and kept the rest waiting for its commit."""
    executor, ledger, runner = await started(tmp_path, servers)
    try:

        async def caller(i: int) -> Operation:
            for _ in range(i % 4):
                await one_round()
            return await executor.submit(
                call_node=f"r{i}", tool="analyze_upload", arguments={"n": i, "_sim": LONG}
            )

        answers = await asyncio.gather(*(caller(i) for i in range(60)))
        assert len({a.operation_id for a in answers}) == 60
        assert ledger.creations == [60]
    finally:
        await stopped(executor, ledger, runner)
