"""The state key of one run of the shipped code, at every state: what the merging search compares.

``StateKeys.state_key`` renders everything a run's future depends on as data (``wire.canon``) and
leaves out what it provably does not (each left-out part named below with the reason); the live
coroutines, whose places in the code are not data, by the label of the last step they ran in
(``Tracked``; ``before_step`` / ``after_step`` label them, the only writes this module makes, to
the coroutines' own labels). ``fingerprint`` is the smaller key of what an advance could see
change (an executor is not asked again until it moves). Part of ``engine.explore.shipped.WireWorld``
(a mixin); it never changes the run.
"""

from __future__ import annotations

import asyncio
import hashlib
import pickle
from collections.abc import Coroutine, Generator
from typing import Any

from engine.explore.wire import Network, RefServer, VirtualLoop, VirtualTime, canon, message_key
from engine.model import Operation, OperationId

Finding = tuple[str, str]
Digest = bytes
"""A 128-bit digest of a state key (``digest``): what the merging search's memo is keyed by."""


def digest(key: object) -> Digest:
    """A 128-bit digest of a state key (a forked child sends back digests, not keys).

    Pickled without its memo (``fast``), so equal keys give equal bytes however their parts are
    shared; keys that are equal but pickle differently (``1`` and ``1.0``) only merge less. Two
    different keys with the same digest would merge wrongly; at 2**-128 a pair that is not a risk
    (TLC's model checker keys its states by 64-bit fingerprints).
    """
    buf = _Sink()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.fast = True  # no memo: the bytes depend on the values only
    pickler.dump(key)
    return buf.digest.digest()


class _Sink:
    """A file-like object that hashes what is written to it."""

    __slots__ = ("digest",)

    def __init__(self) -> None:
        self.digest = hashlib.blake2b(digest_size=16)

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return len(data)


class Tracked(Coroutine[Any, Any, Any]):
    """A task's coroutine on the explorer's loop, with what keys its place in the code.

    A coroutine's locals and its place in the code are not data the key can read; what they are is
    a function of the state the run was in before the last step during which the coroutine ran
    and of that step (every run of the shipped code is deterministic in its choices). So each
    step that resumes (or starts) the coroutine labels it with the digest of that state's key and
    the step (``StateKeys.after_step``), and the key holds the labels of the live coroutines: two
    states whose data are equal and whose live coroutines carry equal labels have the same futures
    (by induction on the steps: equal labels name equal states before equal steps). A coroutine
    that did not run during a step keeps its label, so steps of other actors that commute (a
    server's clock, a cancel click, a message delivered elsewhere) merge mid-exchange.
    """

    __slots__ = ("coro", "label", "resumes", "role")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro
        self.resumes = 0
        """Times the task resumed it (a step that resumes it relabels it)."""
        self.label: Digest | None = None
        """The digest of (the state before, the step) of the last step it ran in; ``None``: a step
        from an unkeyed state (the coroutine is then not keyed, nor any state it is live in)."""
        code = getattr(coro, "cr_code", None)
        self.role = "?" if code is None else code.co_qualname

    def send(self, value: Any) -> Any:
        self.resumes += 1
        return self.coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self.resumes += 1
        if val is None and tb is None:
            return self.coro.throw(typ)
        return self.coro.throw(typ, val, tb)  # pragma: no cover - asyncio throws one exception

    def close(self) -> None:
        self.coro.close()

    def __await__(self) -> Generator[Any, None, Any]:
        return self.coro.__await__()


def _tracked_task(loop: asyncio.AbstractEventLoop, coro: Any, *, context: Any = None) -> asyncio.Task[Any]:
    """The explorer's loop's task factory: every task's coroutine is ``Tracked``."""
    return asyncio.Task(Tracked(coro), loop=loop, context=context)


def track_tasks(loop: VirtualLoop) -> None:
    """Make every task ``loop`` starts from now on a ``Tracked`` one (idempotent)."""
    if loop.get_task_factory() is not _tracked_task:
        loop.set_task_factory(_tracked_task)


class StateKeys:
    """The keying half of ``WireWorld``."""

    ledger: Any
    ledger_kind: str
    store: Any
    ref: RefServer
    vt: VirtualTime
    loop: VirtualLoop
    net: Network
    steps: int
    _key_cache: tuple[int, Digest | None] | None = None
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
        """Everything the run's future depends on; ``None`` where the key cannot say it.

        Data: the ledger (rows, receipts, held outcomes, answers, open items), the server's task
        records, keys and seeded generator, the messages in flight, the virtual time and the loop's timers, what every live
        executor's ``Driver`` keeps in memory (and its adapter's negotiated state), the fault budgets
        left and what was found so far. Code: every live coroutine (the executor's advance, the
        caller's answer, the server's handler of a request) by its ``Tracked`` label, so states in
        the middle of an exchange are keyed too. Two runs with equal keys have the same futures
        (``engine.explore.prune`` merges them). ``None``: the DuckDB ledger, a live coroutine no
        keyed step labelled, or (the service executor) writes buffered or a group commit on its way.
        """
        if self.ledger_kind != "memory":
            return None
        live = self._live()
        if live is None:
            return None
        seat = self.executors[self.active].seat
        if seat is not None and seat.holds_writes():
            # Writes buffered or a group commit on its way: the executor's buffers are not keyed.
            return None
        net = self.net
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
            # In their order, not as a multiset: the order names the explorer's choices (a merged
            # state's shortest divergent choices must replay from the other ways there), and the
            # server's generator, out of the key once the task exists, jitters reply bodies, so an
            # order by content would not carry over to the states merged with it.
            tuple(message_key(m) for m in net.inflight),
            self.vt.seconds,
            self.active,
            tuple((i.alive, i.epoch, i.busy) for i in self.executors),
            (inc.negotiated, inc.parked, idle),
            memory,
            canon(inc.backend, _ADAPTER_CONNECTION),
            self._others(),
            live,
            tuple(sorted(net.fenced)),
            (self.drops, self.delays, self.dups, self.throttles, self.corrupts),
            (self.crashes, self.raises, self.passes, self.cancels, self.max_generation, self.stale_advances),
            tuple(found),
            (self.faulted, self.aborted, self.submitted, self._unknowns(), self.recorded_epoch),
            None if seat is None else seat.key(self.op_id),
        )

    def _live(self) -> tuple[object, ...] | None:
        """The live coroutines by role and label, with the loop's pending timers (whose deadlines
        those coroutines set); ``None`` if one of them has no label."""
        labels = []
        for task in asyncio.all_tasks(self.loop):
            if task.done():
                continue
            coro = task.get_coro()
            if not isinstance(coro, Tracked) or coro.label is None:
                return None
            labels.append((coro.role, coro.label))
        labels.sort()
        scheduled = self.loop._scheduled  # type: ignore[attr-defined]  # CPython's timer heap
        timers = sorted(h.when() for h in scheduled if not h.cancelled())
        return (tuple(labels), tuple(timers))

    def _others(self) -> tuple[object, ...]:
        """Every live executor but the active one: what its ``Driver`` and adapter keep (a stale
        advance or a reply to its request still in flight reads them)."""
        return tuple(
            (
                i.index,
                i.negotiated,
                i.parked,
                canon(i.driver._memory, _WAKE_ONLY),
                canon(i.backend, _ADAPTER_CONNECTION),
            )
            for i in self.executors
            if i.alive and i.index != self.active
        )

    def state_digest(self) -> Digest | None:
        """``digest(state_key())``, computed once per state (the search and the next step's
        labels both read it)."""
        cached = self._key_cache
        if cached is not None and cached[0] == self.steps:
            return cached[1]
        key = self.state_key()
        found = None if key is None else digest(key)
        self._key_cache = (self.steps, found)
        return found

    def prime_digest(self, known: Digest | None) -> None:
        """Take ``known`` as this state's ``state_digest`` (the same run replayed to a state it
        was in before: the search keyed it then)."""
        self._key_cache = (self.steps, known)

    def action_key(self, action: tuple[str, str, object]) -> tuple[object, ...]:
        """``action`` as data: a network step names its message by ``message_key`` as well as by
        its place in flight."""
        actor, verb, arg = action
        if actor == "network":
            assert isinstance(arg, int)
            return (actor, verb, arg, message_key(self.net.inflight[arg]))
        return action

    def before_step(self, action: tuple[str, str, object]) -> tuple[Digest | None, dict[Tracked, int]]:
        """What ``after_step`` needs: the label of the step (from the state before it) and how often
        each live coroutine has resumed so far."""
        track_tasks(self.loop)
        before = self.state_digest()
        label = None if before is None else digest((before, self.action_key(action)))
        # Keyed by the coroutines themselves, not their ids: held, none is freed during the step
        # and its id given to a coroutine started in it.
        resumes: dict[Tracked, int] = {}
        for task in asyncio.all_tasks(self.loop):
            coro = task.get_coro()
            if isinstance(coro, Tracked):
                resumes[coro] = coro.resumes
        return label, resumes

    def after_step(self, mark: tuple[Digest | None, dict[Tracked, int]]) -> None:
        """Label every coroutine that started or resumed during the step just taken."""
        label, resumes = mark
        for task in asyncio.all_tasks(self.loop):
            if task.done():
                continue
            coro = task.get_coro()
            if isinstance(coro, Tracked) and resumes.get(coro) != coro.resumes:
                coro.label = label
        self._key_cache = None


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


__all__ = ["Digest", "StateKeys", "Tracked", "digest", "track_tasks"]
