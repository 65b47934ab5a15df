"""The executor's shared state and what each of its concerns needs from the others.

``ExecutorState`` holds the fields every concern reads (the operations held, the timer heap, the
write buffer, the servers, the epoch) and declares, as abstract methods, the few calls that cross
from one concern to another, so that each concern lives in its own module and the composed
``Executor`` (``service.executor.core``) is checked to provide them all. No behaviour here.
"""

from __future__ import annotations

import abc
import asyncio
import itertools
import os
import random
import socket
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from engine.adapters import HttpClient
from engine.adapters.base import Backend, Capabilities, Json
from engine.clock import Clock
from engine.errors import LeaseLost
from engine.ledger.port import BatchOutcome, LedgerPort
from engine.model import Epoch, LocalState, Operation, Protocol, Role, Transition
from engine.runtime.driver import Driver, Wake
from engine.runtime.limiter import Limiter
from engine.schedule import PollPolicy
from service.batching import BatchingLedger
from service.config import ServerConfig, ServiceConfig, ToolConfig
from service.delivery import CommitSignal

if TYPE_CHECKING:
    from rollout.controller import RolloutController
    from rollout.route import Router


class Tenancy(abc.ABC):
    """Whether other executors share the ledger, and everything that follows from it."""

    lease_due: datetime
    """When ``maintain`` is next due."""
    follow_every: timedelta | None
    """How often to re-read the ledger's rollout state (other executors act on it); None: alone,
    every rollout action goes through this process."""
    shared: bool
    """Whether other executors share the ledger (for status and logs; the executor never branches on it)."""

    @property
    @abc.abstractmethod
    def reads(self) -> LedgerPort:
        """The unfenced ledger: rollout state, epoch reads, leases."""

    @abc.abstractmethod
    def handle(self, epoch: Epoch) -> LedgerPort:
        """The ledger to write through at ``epoch``."""

    @abc.abstractmethod
    def limiter(self, clock: Clock, *, global_qps: float, per_server: dict[str, float]) -> Limiter:
        """The QPS budget: this process's own, or booked across processes."""

    @abc.abstractmethod
    def loaded_at_start(self) -> list[Operation]:
        """The live operations this process owns without claiming them (all of them when alone)."""

    @abc.abstractmethod
    def drives(self, op_id: str, *, tracked: bool) -> bool:
        """Whether an existing operation found by a submit is this process's to drive."""

    @abc.abstractmethod
    def adoption_candidates(self, held: list[str], epoch: Epoch) -> list[Operation]:
        """The live operations behind ``epoch`` this process adopts after a rollback."""

    @abc.abstractmethod
    def renew(self, now: datetime) -> set[str] | None:
        """Renew this process's leases; what it still holds, or None when nothing is leased (alone).

        Raises ``LeaseLost`` or ``EngineError``; sets ``lease_due`` first, so a failure is retried then.
        """

    @abc.abstractmethod
    def claim(self, now: datetime, *, room: int, epoch: Epoch, servers: list[str]) -> list[Operation]:
        """Lease up to ``room`` free or expired operations of ``servers`` (raises like ``renew``)."""

    @abc.abstractmethod
    def release(self) -> None:
        """A clean stop: hand back what this process holds."""


S = LocalState
T = TypeVar("T")

MAX_RUNNING = 2000
"""Operations advancing at once; the QPS limiter spaces their requests."""
MAX_IN_FLIGHT_REQUESTS = 48
"""Protocol requests awaiting a reply at once, across all servers."""
FLUSH_BATCH = 2000
"""Buffered writes that trigger a group commit without waiting for ``FLUSH_DELAY``."""
FLUSH_DELAY = timedelta(milliseconds=50)
"""How long finished advances wait for company before their writes are committed together.

A DuckDB commit costs milliseconds whatever it carries, so commits are paced, not per write;
the delay is small against any poll interval, and person actions never wait for it."""
FLUSH_PATIENCE = timedelta(milliseconds=250)
"""How long finished advances whose next request is at least twice this far off wait for company
(``commit_deadline``): a status read a poll interval away is not sent any sooner for an earlier commit."""

ROUNDS_EVERY = timedelta(seconds=1)
"""How often pending approval rounds are checked for a passed deadline or an operation that moved
past them. An answer is checked against its own deadline when it arrives, so this only bounds how
long a closed round may still be listed."""

ROLLOUT_FOLLOW = timedelta(milliseconds=250)
"""How often an executor sharing the ledger re-reads the rollout state (one row). With a tick at
most a second apart under load, a change made through any executor routes every executor's new
calls within 1 s (a rollback at once: see ``RolloutAdoption``)."""

CLAIM_BATCH = 500
"""Operations one claim may lease at once."""

NEVER = datetime.min.replace(tzinfo=UTC)


def owner_name() -> str:
    """This process as a lease owner: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class HeldOperations(dict[str, Operation]):
    """The operations an executor holds, by id, counted by principal as they come and go.

    The API's per-principal limit asks for a principal's count on every submission; counted over
    every held operation, each submission cost a pass over all of them (10,000 at the default
    limit, more than the rest of a submission's CPU). Only ``[]=``, ``del`` and ``pop`` may change it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.by_principal: Counter[str] = Counter()

    def __setitem__(self, key: str, value: Operation) -> None:
        old = super().get(key)
        if old is not None:
            self.by_principal[old.principal] -= 1
        self.by_principal[value.principal] += 1
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.by_principal[self[key].principal] -= 1
        super().__delitem__(key)

    def pop(self, key: str, default: Operation | None = None) -> Operation | None:  # type: ignore[override]
        found = super().pop(key, None)
        if found is None:
            return default
        self.by_principal[found.principal] -= 1
        return found


@dataclass(frozen=True)
class Submission:
    """One ``submit`` call waiting for the loop (see ``PersonActions._create_queued``)."""

    tool: ToolConfig
    call_node: str
    arguments: Json
    principal: str | None
    role: Role
    server: str | None


@dataclass
class Server:
    """One configured server: its protocol, backend, negotiated capabilities and current driver."""

    config: ServerConfig
    protocol: Protocol
    backend: Backend
    caps: Capabilities
    driver: Driver


@dataclass
class ExecutorState(abc.ABC):
    """Owns the ledger's writes while the service runs (the fields; the behaviour is in the concerns)."""

    ledger: LedgerPort
    config: ServiceConfig
    clock: Clock
    rng: random.Random = field(default_factory=random.Random)
    epoch: Epoch = field(default_factory=lambda: Epoch(1))
    client: HttpClient | None = None
    lease_s: float | None = None
    """Share the ledger with other executors (a ledger whose port offers ``leasing``): lease length
    in seconds; None: alone."""
    owner: str = field(default_factory=owner_name)
    lease_token: str = field(default_factory=lambda: str(uuid.uuid4()))
    """Fresh per process start: a restarted executor holds none of its former leases."""
    _tenancy: Tenancy = field(init=False)
    """How this executor shares the ledger (alone, or leased and fenced); chosen once from the port."""
    _lost: set[str] = field(default_factory=set)
    """Operations dropped (lease lost) while an advance of theirs was running."""
    _store: BatchingLedger = field(init=False)
    _servers: dict[str, Server] = field(default_factory=dict)
    _heap: list[tuple[datetime, int, str]] = field(default_factory=list)
    _due_at: dict[str, datetime] = field(default_factory=dict)
    _ops: HeldOperations = field(default_factory=HeldOperations)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _actions: list[tuple[Callable[[], Awaitable[object]], asyncio.Future[object]]] = field(
        default_factory=list
    )
    _cancels: list[tuple[str, str, str, asyncio.Future[Operation]]] = field(default_factory=list)
    _submits: list[tuple[Submission, asyncio.Future[Operation]]] = field(default_factory=list)
    """``submit`` calls waiting for the next recording, recorded together in one transaction."""
    _recording: asyncio.Future[None] | None = None
    """The recording of queued submissions in flight (``PersonActions._record_soon``; None: none)."""
    _exclusive: bool = False
    """The tick's exclusive steps run or wait for the recording in flight: no recording starts meanwhile."""
    _urgent: set[str] = field(default_factory=set)
    """Operations on the cancel path: launched when due even while MAX_RUNNING advances run."""
    _running: dict[str, asyncio.Future[Wake]] = field(default_factory=dict)
    _finished: list[Wake] = field(default_factory=list)
    _commit_by: datetime = NEVER
    """When the finished advances' group commit is due (``commit_deadline``; NEVER: none waits)."""
    _committing: asyncio.Future[None] | None = None
    """The group commit running on the writer thread while the loop goes on launching due
    operations (None: none running)."""
    _rerun: set[str] = field(default_factory=set)
    _awaiting_group: set[str] = field(default_factory=set)
    """Operations whose finished advance waits in ``_finished`` for its group commit: not launched
    again before that group is durable (``_launch``, ``_after``)."""
    _dirty: set[str] = field(default_factory=set)
    _budget_flagged: set[str] = field(default_factory=set)
    """Operations whose spent wait budget was handed to a person (no cancel capability)."""
    _rounds_due: datetime = NEVER
    """When pending approval rounds are next closed if no longer answerable (``ROUNDS_EVERY``)."""
    _rounds_open: bool = True
    """Whether an approval round may be pending (unknown at start: the ledger may hold some)."""
    _stopping: bool = False
    _rollout_due: datetime = NEVER
    """When the ledger's rollout state is next read (shared ledgers only)."""
    stats: dict[str, int] = field(
        default_factory=lambda: {
            "ticks": 0,
            "advances": 0,
            "refused": 0,
            "fenced": 0,
            "adopted": 0,
            "commits": 0,
            "committed_writes": 0,
            "claimed": 0,
            "lease_lost": 0,
        }
    )
    commit_signal: CommitSignal = field(default_factory=CommitSignal)
    """Notified after a commit that wrote receipts: requests waiting for a receipt or an outbox entry look again."""
    commit_seconds: float = 0.0
    """Wall time spent waiting for group commits on the writer thread."""
    rollout: RolloutController = field(init=False)
    router: Router = field(init=False)
    _limiter: Limiter | None = None
    _policy: PollPolicy = field(default_factory=PollPolicy)
    _shadow_of: dict[str, str] = field(default_factory=dict)
    """Primary operation id -> its shadow's, until the pair is compared."""
    _primary_of: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------- calls that cross from one concern to another

    @abc.abstractmethod
    def _schedule(self, op_id: str, at: datetime) -> None:
        """(loop) Put ``op_id`` on the heap, due at ``at``."""

    @abc.abstractmethod
    def _driver_for(self, op: Operation) -> Driver | None:
        """(loop) The current driver of the operation's server, None when it is not configured."""

    @abc.abstractmethod
    def _touched(self, after: Operation) -> None:
        """(loop) A person's action just changed ``after`` in the ledger; make the loop follow it."""

    @abc.abstractmethod
    def _new_driver(
        self, server: ServerConfig, backend: Backend, caps: Capabilities, *, ledger: LedgerPort | None = None
    ) -> Driver:
        """(loop) A driver at the current epoch with no memory, writing to ``ledger`` (default: the
        executor's group-committed store)."""

    @abc.abstractmethod
    def _after(self, wake: Wake) -> None:
        """(loop) Hand a finished advance back to the heap once its writes are durable."""

    @abc.abstractmethod
    async def _commit(self) -> None:
        """(write groups) Group-commit on the writer thread."""

    @abc.abstractmethod
    async def settled(self) -> None:
        """(write groups) Until the group commit a tick started (if any) is durable."""

    @abc.abstractmethod
    def _commit_in_flight(self) -> bool:
        """(write groups) Whether a started group commit still runs (a finished one is reaped)."""

    @abc.abstractmethod
    def _start_commit(self) -> None:
        """(write groups) Start the group commit as a task of its own."""

    @abc.abstractmethod
    def _commit_due(self) -> bool:
        """(write groups) Whether finished advances have waited long enough for company."""

    @abc.abstractmethod
    def _flush(self) -> None:
        """(write groups) Commit what is buffered now, on the loop's thread."""

    @abc.abstractmethod
    def _refused(self, refused: list[tuple[Transition, BatchOutcome]], finished: list[Wake]) -> None:
        """(write groups) Follow the writes the ledger refused."""

    @abc.abstractmethod
    def _refence(self) -> None:
        """(leases) Write through the handle this executor's tenancy gives at the current epoch."""

    @abc.abstractmethod
    def _maintain_leases(self) -> None:
        """(leases) Renew, drop, claim."""

    @abc.abstractmethod
    def _lease_lost(self, op_id: str, why: str) -> None:
        """(leases) Stop driving ``op_id``."""

    @abc.abstractmethod
    def _write_refused(self, op_id: str, error: LeaseLost) -> Operation | None:
        """(leases) A fenced write refused: adopt at the raised epoch (returns the adopted operation)
        or drop a taken-over one (returns None)."""

    @abc.abstractmethod
    def _epoch_check(self) -> None:
        """(leases) Follow a raised execution epoch: restart the drivers at it and adopt what is held."""

    @abc.abstractmethod
    async def _between_ticks(self, action: Callable[[], Awaitable[T]]) -> T:
        """(person actions) Run ``action`` in the loop between ticks."""

    @abc.abstractmethod
    async def _create_queued(self) -> None:
        """(person actions) Record the queued submissions together."""

    @abc.abstractmethod
    def _record_soon(self) -> None:
        """(person actions) Start recording the queued submissions unless a recording runs."""

    @abc.abstractmethod
    async def _recorded(self) -> None:
        """(person actions) Until the recording of submissions in flight (if any) has ended."""

    @abc.abstractmethod
    def _cancel_queued(self) -> None:
        """(forwarding) Record the queued cancels, one group commit."""

    @abc.abstractmethod
    def _holds(self, op_id: str) -> bool:
        """(forwarding) Whether this executor carries out actions on ``op_id`` itself."""

    @abc.abstractmethod
    def _recorder(self, op: Operation) -> Driver:
        """(forwarding) A driver that records a person's action in the ledger and sends nothing."""

    @abc.abstractmethod
    def _current(self, call_node: str, found: dict[str, Operation] | None = None) -> Operation:
        """(person actions) The operation of ``call_node`` as this executor knows it (404 if none);
        ``found``: the rows of a batch just read by call node."""

    @abc.abstractmethod
    def _cancel_now(self, op: Operation, *, actor: str, reason: str) -> Operation:
        """(forwarding) Record the cancel of an operation this executor holds."""

    @abc.abstractmethod
    def _as_holder(self, op: Operation, act: Callable[[Driver, Operation], Operation]) -> Operation | None:
        """(forwarding) Record a person's action as the holder (adopting after an epoch refusal);
        None when this executor does not hold ``op``."""

    @abc.abstractmethod
    def _cancel_elsewhere(self, op: Operation, *, actor: str, reason: str) -> Operation:
        """(forwarding) Record the cancel of an operation another executor holds."""

    @abc.abstractmethod
    def _cancel_shadow(self, primary: Operation, *, actor: str, reason: str) -> None:
        """(forwarding) Cancel a primary's running shadow with it, wherever it is held."""

    @abc.abstractmethod
    def _follow_person_actions(self) -> None:
        """(forwarding) Carry out the person's actions other executors recorded on what this one holds."""

    @abc.abstractmethod
    def _raise_epoch(self, epoch: Epoch, actor: str) -> dict[str, object]:
        """(rollout adoption) Switch to ``epoch`` and adopt the in-flight work."""

    @abc.abstractmethod
    def _adopt_operations(self, ops: list[Operation], *, actor: str) -> dict[str, object]:
        """(rollout adoption) ``EpochRaised`` for each operation through ``step``."""

    @abc.abstractmethod
    def _follow_rollout(self) -> None:
        """(rollout adoption) Route by the ledger's rollout state; adopt an epoch another raised."""

    @abc.abstractmethod
    def _compare_shadows(self, operation_id: str | None = None) -> None:
        """(rollout adoption) Record shadow comparisons whose pairs both hold a receipt."""


__all__ = [
    "CLAIM_BATCH",
    "FLUSH_BATCH",
    "FLUSH_DELAY",
    "MAX_IN_FLIGHT_REQUESTS",
    "MAX_RUNNING",
    "NEVER",
    "ROLLOUT_FOLLOW",
    "ExecutorState",
    "HeldOperations",
    "Server",
    "Submission",
    "owner_name",
]
