"""The state key of one run of the shipped code at a quiet point: what the merging search compares.

``StateKeys.state_key`` renders everything a run's future depends on as data (``wire.canon``) and
leaves out what it provably does not (each left-out part named below with the reason);
``fingerprint`` is the smaller key of what an advance could see change (an executor is not asked
again until it moves). Part of ``engine.explore.shipped.WireWorld`` (a mixin): reads only.
"""

from __future__ import annotations

from typing import Any

from engine.explore.wire import Network, RefServer, VirtualTime, canon, message_key
from engine.model import Operation, OperationId

Finding = tuple[str, str]


class StateKeys:
    """The keying half of ``WireWorld``."""

    ledger: Any
    ledger_kind: str
    store: Any
    ref: RefServer
    vt: VirtualTime
    net: Network
    op_id: OperationId
    executors: list[Any]
    active: int
    answering: Any
    findings: list[Finding]
    drops: int
    delays: int
    dups: int
    throttles: int
    corrupts: int
    crashes: int
    raises: int
    stale_advances: int
    passes: int
    cancels: int
    max_generation: int
    faulted: bool
    aborted: bool
    submitted: bool
    recorded_epoch: int | None

    def _check_writes(self, out: list[Finding]) -> None:
        raise NotImplementedError

    def _main_task(self) -> Any:
        raise NotImplementedError

    def _unknowns(self) -> int:
        raise NotImplementedError

    def fingerprint(self, op: Operation | None = None) -> tuple[object, ...]:
        """What an advance could see change; ``op`` is the row as just read (a DuckDB read is a
        query: the explorer's own reads of it were most of a DuckDB run's cost)."""
        if op is None:
            op = self.ledger.get(self.op_id)
        tasks = tuple(
            (t.task_id, t.status, t.rounds_answered, t.deleted_at is not None, t.cancel_at)
            for t in self.store._tasks.values()
        )
        # The executor's memory (what ``Driver`` keeps between actions: a refetch due, an answer to
        # re-send) decides its next action as much as the ledger does. Not the server's advised poll
        # interval: it only says when to wake, and the explorer decides that (a 2026-07-28 server
        # jitters it on every read, which made every poll look new and a run poll for ever).
        memory = canon(self.executors[self.active].driver._memory, _WAKE_ONLY)
        net = self.net
        return (op, tasks, self.vt.seconds, len(net.inflight), net.failures, memory)

    def state_key(self) -> tuple[object, ...] | None:
        """Everything the run's future depends on, at a quiet point; ``None`` elsewhere.

        Quiet: no coroutine of the driver or of the server is running (every exchange in flight has
        been given up by its sender), so what the next steps do is a function of data alone: the
        ledger (rows, receipts, held outcomes, answers, open items), the server's task records,
        keys and seeded generator, the messages still in flight, the virtual time, what the active
        executor's ``Driver`` keeps in memory (and its adapter's negotiated state and request
        numbering), the fault budgets left and what was found so far. Two runs with equal keys have
        the same futures (``engine.explore.prune`` merges them). Mid-exchange a coroutine's place in
        the code is not data, so those states are never merged. In-memory ledger only.
        """
        if self.ledger_kind != "memory":
            return None
        if any(inc.busy for inc in self.executors) or (
            self.answering is not None and not self.answering.done()
        ):
            return None
        net = self.net
        if net.busy or any(m.waiting for m in net.inflight):
            return None
        seat = self.executors[self.active].seat
        if seat is not None and seat.holds_writes():
            # Writes buffered or a group commit on its way: the executor's buffers are not keyed.
            return None
        found = list(self.findings)
        self._check_writes(found)
        inc = self.executors[self.active]
        fingerprint = self.fingerprint()
        memory = fingerprint[-1]
        idle = _idle(inc.idle_at, fingerprint)
        ledger = self.ledger
        return (
            canon(ledger.mem, _LEDGER_HISTORY),
            canon(
                [
                    {k: v for k, v in a.items() if k not in _ROUND_HISTORY}
                    for a in ledger.approvals(pending_only=False)
                ]
            ),
            canon(self.store, _SERVER_HISTORY if self._main_task() is None else _SERVER_AFTER_CREATE),
            self.ref.protocol_state(),
            tuple(message_key(m) for m in net.inflight),
            self.vt.seconds,
            self.active,
            tuple((i.alive, i.epoch) for i in self.executors),
            (inc.negotiated, inc.parked, idle),
            memory,
            canon(inc.backend, _ADAPTER_CONNECTION),
            (self.drops, self.delays, self.dups, self.throttles, self.corrupts),
            (self.crashes, self.raises, self.passes, self.cancels, self.max_generation, self.stale_advances),
            tuple(found),
            (self.faulted, self.aborted, self.submitted, self._unknowns(), self.recorded_epoch),
            None if seat is None else seat.key(self.op_id),
        )


_LEDGER_HISTORY = frozenset({"writes", "rejected"})
"""MemLedger counters of writes made: history, not state (the row versions say what changed). The
port's transition log, poll records and the instants its entries were opened at are history too:
the key reads the operations and entries from ``MemoryPort.mem``, the approval rounds without
``_ROUND_HISTORY``."""
_ROUND_HISTORY = frozenset({"opened_at", "answered_at", "closed_at"})
"""When an approval round was opened, answered or closed: recorded, never read by the driver."""
_SERVER_HISTORY = frozenset({"_log", "anchor", "clock", "config", "_new_id"})
"""The task store's request counters and its fixed wiring."""
_SERVER_AFTER_CREATE = _SERVER_HISTORY | {"rng"}
"""Once the call node's task exists, the store's seeded generator too: what it draws after that is
the jitter of the advised poll interval in a reply (the driver keeps it only to say when to wake,
``_WAKE_ONLY``) and the expiry bump of a task created later, which for this call node is a second
operation, a divergence in every run that makes one (``second-operation``)."""
_WAKE_ONLY = frozenset({"advised"})
"""What a ``Driver`` keeps only to say when to wake (the server's advised poll interval): the explorer
decides when an executor advances, so it changes no outcome (its generator, which only jitters the
wake time, is left out of the key for the same reason)."""
_ADAPTER_CONNECTION = frozenset({"session_id", "_client", "_options", "_token", "_ids", "_lock"})
"""An adapter's connection: the session id is the server's name for a connection (one per process,
reused by every run), the client and options are the same in every run, and the JSON-RPC request
numbering is a renaming (``wire.without_rpc_ids``)."""


def _idle(idle_at: object, now: tuple[object, ...]) -> object:
    """The part of an executor's "nothing changed since its last advance" mark its future reads.

    ``True``: the mark matches now (no advance is offered). A mark that can never match again is
    keyed as no mark (``None``): the fingerprint's virtual time and failure count never go down,
    nor does the row's version (every change raises it by one; one that does not is itself an
    ``unversioned`` finding, in the key), so once one of them moved past the mark the advance
    stays offered until the next advance sets a new mark, exactly as with no mark at all.
    """
    if idle_at is None:
        return None
    if idle_at == now:
        return True
    assert isinstance(idle_at, tuple)
    before, after = idle_at[0], now[0]
    if (
        now[2] > idle_at[2]
        or now[4] > idle_at[4]
        or (
            isinstance(before, Operation)
            and isinstance(after, Operation)
            and after.row_version > before.row_version
        )
    ):
        return None
    return idle_at


__all__ = ["StateKeys"]
