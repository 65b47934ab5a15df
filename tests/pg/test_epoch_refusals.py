"""A write refused because a rollback through another executor raised the epoch is not a takeover.

Two executors in this process share one PostgreSQL ledger, each on its own ``FakeClock``, and the
test drives their loops tick by tick, so the order is fixed rather than timed: executor A holds an
operation and has not yet read the rollout state again (its 0.25 s follow is not due on its
clock) when a rollback through executor B raises the epoch. A's next write for that operation,
whether a group-committed poll or a person's action on its own operation (an answer), is refused
for the epoch (``EpochMoved``). A must adopt the operation at the new epoch and go on driving it
(``engine.runtime.epochs.refusal``), not drop it as if taken over: a dropped one stayed leased to
A, renewed by it, and driven by nobody. Real reference servers over HTTP; only the clocks are fake.
"""

from __future__ import annotations

import asyncio
import random
import tomllib
from collections.abc import Awaitable, Callable, Iterator
from datetime import timedelta
from typing import TypeVar

import pytest

from engine.ledger import open_ledger, pg_client
from engine.model import LocalState, Operation
from engine.testing import FakeClock
from refserver.testing import RefServer
from rollout.plan import Action, Request
from service.config import ServiceConfig, parse_config
from service.executor import Executor

T = TypeVar("T")
S = LocalState
LEASE_S = 30.0
"""Far longer than the fake time the test spends: no lease lapses, so every refusal is the epoch's."""
STEP = timedelta(milliseconds=60)
"""Fake time per tick: past the 50 ms group-commit delay, within the 0.25 s rollout follow."""
LONG = {"duration_ms": 3_600_000, "ttl_ms": 3_600_000}
ASKS = {"duration_ms": 200, "input_rounds": 1, "ttl_ms": 3_600_000}
SLOW_POLL = {
    "duration_ms": 300,
    "ttl_ms": 3_600_000,
    "faults": [{"name": "slow_response", "delay_ms": 2500, "times": 2}, "connection_reset"],
}
"""The creating request is answered 2.5 s late, and so is the first poll, whose connection is then
reset: that poll's advance is still running while the test moves the executors' leases and epoch
around it, and it ends without writing anything, as a poll that times out does."""


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[RefServer, RefServer]]:
    with RefServer("mcp-2025-11-25", seed=3, idempotency=True) as old, RefServer("aip-151", seed=4) as new:
        yield old, new


def _config(old: RefServer, new: RefServer) -> ServiceConfig:
    text = f"""
global_qps = 200
rollout_salt = "refusals"
gate_interval_s = 0

[poll]
default_interval_ms = 50
min_interval_ms = 50
max_interval_ms = 100
retry_backoff_ms = 50

[servers.old]
url = "{old.endpoint}"
protocol = "mcp-2025-11-25"
qps = 200

[servers.new]
url = "{new.url}"
protocol = "aip-151"
qps = 200

[tools.generate_report]
server = "old"
shadow_server = "new"
side_effect_free = true

[tools.analyze_upload]
server = "old"
side_effect_free = true
"""
    return parse_config(tomllib.loads(text))


class Driven:
    """One executor whose loop the test turns: a tick, then its advances' HTTP replies (bounded)."""

    def __init__(self, pg_url: str, config: ServiceConfig, name: str, seed: int) -> None:
        self.clock = FakeClock()
        self.ledger = open_ledger(pg_url)
        self.executor = Executor(
            ledger=self.ledger,
            config=config,
            clock=self.clock,
            rng=random.Random(seed),
            lease_s=LEASE_S,
            owner=name,
        )

    async def turn(self) -> None:
        self.clock.advance(STEP)
        await self.executor.tick()
        running = list(self.executor._running.values())
        if running:
            await asyncio.wait(running, timeout=15)

    async def between_ticks(self, action: Awaitable[T]) -> T:
        """Queue a person's (or a rollout) action, run one tick to carry it out, return its answer."""
        task = asyncio.ensure_future(action)
        await asyncio.wait({task}, timeout=0)  # one pass of the event loop: the task queues its action
        await self.turn()
        return await asyncio.wait_for(task, timeout=15)

    async def until(self, predicate: Callable[[], bool], what: str, *, turns: int = 400) -> None:
        for _ in range(turns):
            if predicate():
                return
            await self.turn()
        raise AssertionError(f"{what}: not within {turns} ticks")

    def follow_not_due(self) -> bool:
        """Its next tick does not read the rollout state (so it has not seen B's rollback)."""
        return self.clock.now() + STEP < self.executor._rollout_due

    async def close(self) -> None:
        await self.executor.aclose()
        self.ledger.close()


def _row(pg_url: str, op_id: str) -> tuple[str, int, str | None, bool]:
    """(state, epoch, lease owner, has a receipt) as the ledger holds them."""
    with pg_client.connect(pg_url) as con:
        row = con.execute(
            "SELECT s.state, s.epoch, s.lease_owner, "
            "EXISTS (SELECT 1 FROM receipts r WHERE r.operation_id = s.operation_id) "
            "FROM op_state s WHERE s.operation_id = %s",
            [op_id],
        ).fetchone()
    assert row is not None
    return str(row[0]), int(row[1]), None if row[2] is None else str(row[2]), bool(row[3])


def _fenced(pg_url: str, op_id: str) -> int:
    """Replies refused (and logged) for their stale epoch."""
    with pg_client.connect(pg_url) as con:
        row = con.execute(
            "SELECT count(*) FROM transitions WHERE operation_id = %s AND NOT accepted AND cause LIKE %s",
            [op_id, "stale epoch%"],
        ).fetchone()
    assert row is not None
    return int(row[0])


async def _cluster(pg_url: str, servers: tuple[RefServer, RefServer]) -> tuple[Driven, Driven]:
    config = _config(*servers)
    a, b = Driven(pg_url, config, "a", 1), Driven(pg_url, config, "b", 2)
    await a.executor.start()
    await b.executor.start()
    # A live stage, so that there is something to roll back.
    await b.between_ticks(b.executor.rollout_act(Request(Action.SHADOW, "rm", "shadow first")))
    return a, b


async def _rollback_through_b_unseen_by_a(a: Driven, b: Driven) -> None:
    # A reads the rollout state now (its follow is due after 0.25 s of its own time), then B rolls back.
    a.clock.advance(timedelta(seconds=1))
    await a.turn()
    await b.between_ticks(b.executor.rollout_act(Request(Action.ROLLBACK, "rm", "new adapter misbehaves")))
    assert b.ledger.execution_epoch() == 2
    assert a.executor.epoch == 1
    assert a.follow_not_due()


async def test_a_poll_refused_for_an_epoch_raised_elsewhere_is_adopted_by_its_holder_not_dropped(
    pg_url: str, servers: tuple[RefServer, RefServer]
) -> None:
    """A's group-committed poll is refused for B's rollback: A adopts the operation at epoch 2, still
    holds it, logs the old-epoch reply as fenced, and its cancel is sent by A and ends it with one
    receipt at the new epoch."""
    a, b = await _cluster(pg_url, servers)
    try:
        op = await a.between_ticks(
            a.executor.submit(call_node="polled", tool="analyze_upload", arguments={"n": 1, "_sim": LONG})
        )
        await a.until(lambda: _row(pg_url, op.operation_id)[0] == "WORKING", "working on the server")
        refused_before = a.executor.stats["refused"]
        await _rollback_through_b_unseen_by_a(a, b)
        # Its next poll goes out at epoch 1 and its write is refused in A's next group commit.
        await a.until(lambda: a.executor.stats["refused"] > refused_before, "a poll refused", turns=3)
        assert a.executor.epoch == 2, "the refusal made A follow the epoch"
        held = a.executor._ops.get(op.operation_id)
        assert held is not None, "still held, not dropped"
        assert held.epoch == 2, "adopted"
        assert _row(pg_url, op.operation_id)[1:3] == (2, "a")
        assert _fenced(pg_url, op.operation_id) == 1, "the old-epoch reply is logged as fenced"

        cancelled = await a.between_ticks(a.executor.cancel("polled", actor="rm", reason="finish the test"))
        assert cancelled.state is S.CANCEL_REQUESTED
        await a.until(lambda: _row(pg_url, op.operation_id)[3], "the cancel's receipt")
        assert _row(pg_url, op.operation_id) == ("CANCELLED_ACCEPTED", 2, "a", True)
    finally:
        await a.close()
        await b.close()


async def test_the_holders_own_answer_refused_for_an_epoch_raised_elsewhere_adopts_and_sends_it(
    pg_url: str, servers: tuple[RefServer, RefServer]
) -> None:
    """A person answers through A, which holds the operation, just after a rollback through B: A's
    write is refused for the epoch, A adopts the operation, records and sends the answer at epoch 2,
    and the operation ends with one receipt; one server operation for the call node."""
    old, _ = servers
    created_before = old.stats()["operations_created"]["total"]
    a, b = await _cluster(pg_url, servers)
    try:
        op = await a.between_ticks(
            a.executor.submit(call_node="asks", tool="analyze_upload", arguments={"n": 2, "_sim": ASKS})
        )
        await a.until(lambda: _row(pg_url, op.operation_id)[0] == "INPUT_REQUIRED", "a question")
        asked = a.ledger.get(op.operation_id)
        assert asked is not None
        await _rollback_through_b_unseen_by_a(a, b)

        answered: Operation = await a.between_ticks(
            a.executor.answer(
                op.operation_id, input_round=asked.input_round, answer={"approve": True}, actor="approver"
            )
        )
        assert answered.state is S.WORKING
        assert answered.epoch == 2
        assert op.operation_id in a.executor._ops, "still A's to drive"
        await a.until(lambda: _row(pg_url, op.operation_id)[3], "a receipt after the answer")
        assert _row(pg_url, op.operation_id) == ("ACCEPTED", 2, "a", True)
    finally:
        await a.close()
        await b.close()
    assert old.stats()["operations_created"]["total"] - created_before == 1


async def test_an_operation_claimed_back_behind_the_epoch_while_its_old_advance_runs_is_driven_again(
    pg_url: str, servers: tuple[RefServer, RefServer]
) -> None:
    """A's poll of X is still awaiting its reply when B takes X over (A's lease lapsed on B's
    clock) and A drops it; B then dies holding X behind a rollback through A, and A claims X back and
    adopts it while that poll still runs. When the poll's advance ends (its reply lost), A must go
    on driving X (it used to end on the dropped operation's bookkeeping and leave X leased, renewed and never
    advanced: the 3-executor rollback test's operations that never reached a receipt)."""
    a, b = await _cluster(pg_url, servers)
    try:
        op = await a.between_ticks(
            a.executor.submit(call_node="slow", tool="analyze_upload", arguments={"n": 3, "_sim": SLOW_POLL})
        )
        await a.until(lambda: _row(pg_url, op.operation_id)[0] == "WORKING", "working on the server")
        a.clock.advance(timedelta(seconds=1))
        await a.executor.tick()  # launches its first poll, answered late and then cut off
        assert op.operation_id in a.executor._running

        # A's lease has lapsed on B's clock: B claims X (and, dead from here on, never drives it).
        b.clock.advance(timedelta(seconds=2 * LEASE_S))
        b.executor._maintain_leases()
        assert _row(pg_url, op.operation_id)[2] == "b"
        # A's next renewal no longer returns X: dropped while its advance runs.
        a.clock.advance(timedelta(seconds=LEASE_S / 2))
        a.executor._maintain_leases()
        assert op.operation_id not in a.executor._ops
        # A rollback through A: X is not A's, so it stays behind the epoch, leased to dead B.
        rolling = asyncio.ensure_future(
            a.executor.rollout_act(Request(Action.ROLLBACK, "rm", "new adapter misbehaves"))
        )
        await asyncio.wait({rolling}, timeout=0)
        await a.executor.tick()
        await asyncio.wait_for(rolling, timeout=15)
        assert _row(pg_url, op.operation_id)[1] == 1
        # B's lease expires on A's clock: A claims X back behind the epoch and adopts it.
        a.clock.advance(timedelta(seconds=4 * LEASE_S))
        a.executor._maintain_leases()
        assert _row(pg_url, op.operation_id)[1:3] == (2, "a")
        assert op.operation_id in a.executor._running, "the poll is still awaiting its reply"

        await a.until(lambda: _row(pg_url, op.operation_id)[3], "a receipt for X")
        assert _row(pg_url, op.operation_id) == ("ACCEPTED", 2, "a", True)
    finally:
        await a.close()
        await b.close()
