"""The service's executor: one timer heap over every in-flight operation, ticks, and group commit.

Each tick flushes the previous tick's writes, pops every operation that is due, advances them
concurrently through their server's ``Driver`` (one action each), and flushes again. There is no
sleeping task per operation: an operation is a heap entry until it is due. Person actions (submit,
cancel, answer, reconcile) are applied between ticks, so no two actions on one operation overlap.
On start every non-terminal operation is loaded from the ledger and resumed; none is resubmitted.

Rollout (see ``rollout/``): a new call node is routed by a small ``Router`` (old path, canary on the
new adapter, or a shadow beside it) and its arm recorded. A rollback is one action between ticks:
the rollout stops sending new calls to the new adapter, the execution epoch is raised by
compare-and-swap in the ledger, every server gets a fresh driver at the new epoch (no memory, so
an operation found in SUBMITTING is looked up by key exactly as after a restart), and every
non-terminal operation is adopted with ``EpochRaised`` through ``step``. Replies to requests that
old drivers sent before the raise are stamped with the old epoch: ``step`` refuses them and the
refusal is logged as a transition (``fenced``). The service is the composition root, so it may
import ``rollout``; the engine layers below it never do.

Several executors (a PostgreSQL ledger, ``lease_s`` set): each process has an owner name and a
fresh lease token, and writes only through ``ledger.fenced(Fence(owner, token, epoch, lease_s))``.
It drives only operations it leases: the ones it creates, and the ones ``claim`` hands it (free,
or expired because their holder died). Every ``lease_s / 3`` it renews its leases, drops every
operation ``renew`` no longer returns, and claims more. A write refused with ``LeaseLost`` drops
its operation; if the epoch was raised by another executor, drivers restart at the new epoch and
the operations still held are adopted. Requests are spaced by a QPS budget shared through the
database (``SharedLimiter``). A clean stop releases every lease. DuckDB (one process) needs none
of this: ``lease_s`` is None and the code paths are the single-process ones.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
import os
import random
import socket
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from engine.adapters import (
    AdapterOptions,
    CallMode,
    HttpClient,
    discover,
    open_backend,
    open_client,
    plan_call,
)
from engine.adapters.base import Backend, Capabilities, Json
from engine.clock import Clock, monotonic_seconds
from engine.errors import (
    DuplicateOperation,
    EngineError,
    LeaseLost,
    NegotiationError,
    RolloutRefused,
    ServiceError,
    StaleRound,
)
from engine.ledger.port import BatchOutcome, Fence, LeasingLedgerPort, LedgerPort
from engine.ledger.postgres import PgLedger
from engine.machine import step
from engine.model import (
    RECEIPT_STATES,
    CallNodeId,
    CallRequest,
    Epoch,
    EpochRaised,
    LocalState,
    OpenReconciliation,
    Operation,
    OperationId,
    Principal,
    Protocol,
    Reconciled,
    Role,
    Transition,
    new_operation,
    request_mismatch,
)
from engine.runtime.call import ADAPTER_VERSION
from engine.runtime.driver import Driver, Wake
from engine.runtime.limiter import Limiter, SharedLimiter
from engine.schedule import PollPolicy
from rollout.assign import Arm, bucket
from rollout.controller import RolloutController
from rollout.plan import Action, Request
from rollout.route import Route, Router, ToolPaths
from rollout.shadow import SHADOW_SUFFIX, shadow_call_node
from service.batching import BatchingLedger
from service.config import ServerConfig, ServiceConfig, ToolConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")
S = LocalState

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


_NEVER = datetime.min.replace(tzinfo=UTC)

CLAIM_BATCH = 500
"""Operations one claim may lease at once."""


def owner_name() -> str:
    """This process as a lease owner: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class _Submission:
    """One ``submit`` call waiting for the loop (see ``Executor._create_queued``)."""

    tool: ToolConfig
    call_node: str
    arguments: Json
    principal: str | None
    role: Role
    server: str | None


@dataclass
class _Server:
    config: ServerConfig
    protocol: Protocol
    backend: Backend
    caps: Capabilities
    driver: Driver


@dataclass
class Executor:
    """Owns the ledger's writes while the service runs."""

    ledger: LedgerPort
    config: ServiceConfig
    clock: Clock
    rng: random.Random = field(default_factory=random.Random)
    epoch: Epoch = field(default_factory=lambda: Epoch(1))
    client: HttpClient | None = None
    lease_s: float | None = None
    """Share the ledger with other executors (PostgreSQL only): lease length in seconds; None: alone."""
    owner: str = field(default_factory=owner_name)
    lease_token: str = field(default_factory=lambda: str(uuid.uuid4()))
    """Fresh per process start: a restarted executor holds none of its former leases."""
    _leasing: LeasingLedgerPort | None = field(default=None, init=False)
    """The unfenced ledger, for leases and reads (``ledger`` becomes the fenced handle)."""
    _lost: set[str] = field(default_factory=set)
    """Operations dropped (lease lost) while an advance of theirs was running."""
    _lease_due: datetime = _NEVER
    _store: BatchingLedger = field(init=False)
    _servers: dict[str, _Server] = field(default_factory=dict)
    _heap: list[tuple[datetime, int, str]] = field(default_factory=list)
    _due_at: dict[str, datetime] = field(default_factory=dict)
    _ops: dict[str, Operation] = field(default_factory=dict)
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _actions: list[tuple[Callable[[], Awaitable[object]], asyncio.Future[object]]] = field(
        default_factory=list
    )
    _cancels: list[tuple[str, str, str, asyncio.Future[Operation]]] = field(default_factory=list)
    _submits: list[tuple[_Submission, asyncio.Future[Operation]]] = field(default_factory=list)
    """``submit`` calls waiting for the next tick, recorded together in one transaction."""
    _urgent: set[str] = field(default_factory=set)
    """Operations on the cancel path: launched when due even while MAX_RUNNING advances run."""
    _running: dict[str, asyncio.Future[Wake]] = field(default_factory=dict)
    _finished: list[Wake] = field(default_factory=list)
    _finished_since: datetime = _NEVER
    _rerun: set[str] = field(default_factory=set)
    _dirty: set[str] = field(default_factory=set)
    _budget_flagged: set[str] = field(default_factory=set)
    """Operations whose spent wait budget was handed to a person (no cancel capability)."""
    _stopping: bool = False
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
    commit_seconds: float = 0.0
    """Wall time spent waiting for group commits on the writer thread."""
    rollout: RolloutController = field(init=False)
    router: Router = field(init=False)
    _limiter: Limiter | None = None
    _policy: PollPolicy = field(default_factory=PollPolicy)
    _shadow_of: dict[str, str] = field(default_factory=dict)
    """Primary operation id -> its shadow's, until the pair is compared."""
    _primary_of: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.lease_s is not None:
            if not isinstance(self.ledger, PgLedger):
                raise ValueError("leases (several executors) need a PostgreSQL ledger")
            if self.lease_s <= 0:
                raise ValueError("lease_s must be positive")
            self._leasing = self.ledger
        self._store = BatchingLedger(self.ledger)

    @property
    def shared(self) -> bool:
        """Whether this executor shares the ledger with others (leases, fencing, shared QPS)."""
        return self._leasing is not None

    def _refence(self) -> None:
        """Write through a handle fenced by this process's lease token at the current epoch."""
        if self._leasing is None or self.lease_s is None:
            return
        self._store.flush()
        self.ledger = self._leasing.fenced(Fence(self.owner, self.lease_token, int(self.epoch), self.lease_s))
        self._store.inner = self.ledger

    # ------------------------------------------------------------------------------ start up

    async def start(self) -> None:
        """Negotiate with every configured server, then resume every non-terminal operation."""
        self.ledger.warm_up()
        now = self.clock.now()
        recorded = self.ledger.execution_epoch()
        if recorded is not None and recorded != self.epoch:
            # The ledger's epoch is the truth: a rollback raised it and it survives restarts.
            logger.info("execution epoch %d (from the ledger)", recorded)
            self.epoch = Epoch(recorded)
        self.ledger.put_setting("global_qps", repr(self.config.global_qps), now)
        self.ledger.put_setting("rollout_salt", self.config.rollout_salt, now)
        if self.client is None:
            # No more connections than requests the limiter lets out at once (more would sit idle).
            pool = MAX_IN_FLIGHT_REQUESTS + 16
            self.client = open_client(pool=pool)
        per_server = {s.url: s.qps for s in self.config.servers.values()}
        limiter: Limiter
        if isinstance(self._leasing, PgLedger):
            # Several processes: the budget is booked in the database, so it holds across them.
            limiter = SharedLimiter(
                self.clock,
                self._leasing.book_send_slots,
                global_qps=self.config.global_qps,
                per_server=per_server,
                max_in_flight=MAX_IN_FLIGHT_REQUESTS,
                prune=self._leasing.prune_send_slots,
            )
        else:
            limiter = Limiter(
                self.clock,
                max_in_flight=MAX_IN_FLIGHT_REQUESTS,
                global_qps=self.config.global_qps,
                per_server=per_server,
            )
        self._limiter = limiter
        self._refence()
        poll = self.config.poll
        self._policy = PollPolicy(
            default_interval=poll.default_interval,
            min_interval=poll.min_interval,
            max_interval=poll.max_interval,
            jitter=poll.jitter,
            retry_backoff=poll.retry_backoff,
        )
        for name, server in self.config.servers.items():
            options = AdapterOptions(clock=self.clock, request_id_dedupe=server.request_id_dedupe)
            if server.max_result_bytes is not None:
                options = replace(options, max_result_bytes=server.max_result_bytes)
            if server.protocol == "auto":
                protocol = await discover(server.url, self.client, server.token, options=options)
            else:
                protocol = Protocol(server.protocol)
            backend = open_backend(
                protocol, server.url, client=self.client, token=server.token, options=options
            )
            caps = await backend.negotiate(Principal(server.principal))
            self._servers[name] = _Server(
                server, protocol, backend, caps, self._new_driver(server, backend, caps)
            )
        paths = {
            name: ToolPaths(name, tool.server, tool.shadow_server, tool.side_effect_free)
            for name, tool in self.config.tools.items()
        }
        self.rollout = RolloutController(
            self._leasing or self.ledger,
            self.clock,
            paths,
            salt=self.config.rollout_salt,
            epoch=int(self.epoch),
        )
        self.router = Router(
            self.rollout.state, paths, {name: s.protocol.value for name, s in self._servers.items()}
        )
        self._resume()

    def _new_driver(self, server: ServerConfig, backend: Backend, caps: Capabilities) -> Driver:
        """A driver at the executor's current epoch, with no memory of earlier actions."""
        return Driver(
            ledger=self._store,
            backend=backend,
            clock=self.clock,
            rng=random.Random(self.rng.random()),
            server=server.url,
            epoch=self.epoch,
            policy=self._policy,
            limiter=self._limiter,
            ttl=server.ttl,
            capabilities=caps,
        )

    def _resume(self) -> None:
        if self.shared:
            # Nothing is loaded wholesale: what other executors lease is theirs. Free and expired
            # operations come through ``claim`` (now, and every lease_s / 3).
            for primary, shadow in self.ledger.shadow_pairs(ready_only=False):
                self._shadow_of[primary] = shadow
                self._primary_of[shadow] = primary
            self._maintain_leases()
            return
        now = self.clock.now()
        live = [s for s in LocalState if s not in RECEIPT_STATES]
        by_url = {s.config.url: s for s in self._servers.values()}
        resumed = 0
        behind = [op for op in self.ledger.operations(states=live) if op.epoch < self.epoch]
        if behind:
            # A rollback raised the epoch but stopped before adopting these: finish it now.
            self._adopt_operations(behind, actor="finality (restart after rollback)")
        for op in self.ledger.operations(states=live):
            if op.epoch > self.epoch:
                logger.warning(
                    "operation %s belongs to a newer epoch %d; left alone", op.operation_id, op.epoch
                )
                continue
            if op.server not in by_url:
                logger.warning(
                    "operation %s belongs to unconfigured server %s; left alone", op.operation_id, op.server
                )
                continue
            self._ops[op.operation_id] = op
            self._schedule(op.operation_id, now)
            resumed += 1
        logger.info("resumed %d operations", resumed)
        for primary, shadow in self.ledger.shadow_pairs(ready_only=False):
            self._shadow_of[primary] = shadow
            self._primary_of[shadow] = primary
        self._compare_shadows()

    def request_stop(self) -> None:
        """Launch nothing more; ``run`` returns once the advances already running have finished."""
        self._stopping = True
        self._wake.set()

    async def aclose(self) -> None:
        self._stopping = True
        self._wake.set()
        self._store.flush()
        if self._leasing is not None:
            # A clean stop: others may claim these at once instead of after expiry.
            try:
                released = self._leasing.release(self.owner, self.lease_token)
                logger.info("released %d leases", released)
            except EngineError as exc:
                logger.warning("leases not released (they expire on their own): %s", exc)
        for server in self._servers.values():
            await server.backend.aclose()
        if self.client is not None:
            await self.client.aclose()

    # ------------------------------------------------------------------------------- the loop

    def _schedule(self, op_id: str, at: datetime) -> None:
        op = self._ops.get(op_id)
        if op is not None and op.cancel_generation > 0 and op.state not in RECEIPT_STATES:
            self._urgent.add(op_id)
        current = self._due_at.get(op_id)
        if current is not None and current <= at:
            return
        self._due_at[op_id] = at
        heapq.heappush(self._heap, (at, next(self._seq), op_id))
        self._wake.set()

    def _driver_for(self, op: Operation) -> Driver | None:
        for server in self._servers.values():
            if server.config.url == op.server:
                return server.driver
        return None

    async def run(self) -> None:
        """Loop until ``aclose``: commit, release finished operations, run person actions, launch due ones."""
        while not self._stopping:
            await self.tick()
            await self._idle()
        if self._running:
            await asyncio.wait(self._running.values(), timeout=30)
        self._flush()

    def _commit_due(self) -> bool:
        """Whether finished advances have waited long enough for company (or there is a lot to write)."""
        if self._store.pending >= FLUSH_BATCH or self._stopping:
            return bool(self._finished or self._store.pending)
        return bool(self._finished) and self.clock.now() >= self._finished_since + FLUSH_DELAY

    async def _idle(self) -> None:
        if self._actions or self._submits or self._cancels or self._commit_due():
            return
        now = self.clock.now()
        if self._heap and self._heap[0][0] <= now and len(self._running) < MAX_RUNNING:
            return
        if self.shared and now >= self._lease_due:
            return
        self._wake.clear()
        wake_at = now + timedelta(seconds=1)
        if self._heap:
            wake_at = min(wake_at, self._heap[0][0])
        if self._finished:
            wake_at = min(wake_at, self._finished_since + FLUSH_DELAY)
        if self.shared:
            wake_at = min(wake_at, self._lease_due)
        sleeper = asyncio.ensure_future(self.clock.sleep(max(wake_at - now, timedelta(0))))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    async def tick(self) -> int:
        """One round; returns how many operations were launched.

        1. when finished advances have waited ``FLUSH_DELAY`` (or much is buffered, or a person
           action waits), commit everything buffered in one transaction on the writer thread, then
           hand those finished advances back to the heap: an operation's next request is only
           ever sent after its last change is durable. Advances still running keep buffering
           into the next group meanwhile;
        2. run queued person actions;
        3. launch every due operation that is not already running, as its own task.
        """
        self.stats["ticks"] += 1
        if self._actions or self._submits or self._cancels or self._commit_due():
            await self._commit()
        if self.shared and self.clock.now() >= self._lease_due:
            self._maintain_leases()
        if self._cancels:
            self._cancel_queued()
        if self._submits:
            self._create_queued()
        actions, self._actions = self._actions, []
        for action, future in actions:
            try:
                future.set_result(await action())
            except Exception as exc:  # handed to the waiting API request, which reports it
                future.set_exception(exc)
            self._flush()
        now = self.clock.now()
        launched = 0
        # The cancel path is not held back by MAX_RUNNING: a person is waiting on it.
        for op_id in [o for o in self._urgent if (due := self._due_at.get(o)) is not None and due <= now]:
            self._urgent.discard(op_id)
            del self._due_at[op_id]  # its heap entry is now superseded and skipped below
            launched += self._launch(op_id)
        while self._heap and self._heap[0][0] <= now and len(self._running) < MAX_RUNNING:
            at, _, op_id = heapq.heappop(self._heap)
            if self._due_at.get(op_id) != at:
                continue  # superseded by an earlier schedule
            del self._due_at[op_id]
            launched += self._launch(op_id)
        return launched

    def _launch(self, op_id: str) -> int:
        op = self._ops.get(op_id)
        if op is None:
            return 0
        if op_id in self._running:
            self._rerun.add(op_id)
            return 0
        task = asyncio.ensure_future(self._advance(op))
        self._running[op_id] = task
        task.add_done_callback(functools.partial(self._done, op_id))
        return 1

    def _done(self, op_id: str, task: asyncio.Future[Wake]) -> None:
        self._running.pop(op_id, None)
        if not task.cancelled():
            if not self._finished:
                self._finished_since = self.clock.now()
            self._finished.append(task.result())
            if len(self._finished) == 1 or self._store.pending >= FLUSH_BATCH:
                self._wake.set()
        else:
            self._wake.set()

    async def _advance(self, op: Operation) -> Wake:
        if op.epoch < self.epoch:
            # A value from before a rollback; the ledger holds the adopted one.
            op = self.ledger.get(op.operation_id) or op
        driver = self._driver_for(op)
        if driver is None:
            return Wake(op, None)
        self.stats["advances"] += 1
        try:
            return await driver.advance(op)
        except LeaseLost as exc:
            self._lease_lost(op.operation_id, str(exc))
            return Wake(op, None)
        except Exception:
            # One operation's unexpected failure must not stop the others; it is retried later.
            logger.exception("advancing operation %s failed", op.operation_id)
            return Wake(op, self.clock.now() + timedelta(seconds=5))

    def _after(self, wake: Wake) -> None:
        op = wake.operation
        if op.operation_id in self._lost:
            # Its lease was lost while the advance ran: another executor drives it now.
            self._lost.discard(op.operation_id)
            self._dirty.discard(op.operation_id)
            self._rerun.discard(op.operation_id)
            return
        if op.epoch < self.epoch:
            # Finished under an older epoch (a rollback happened meanwhile): what it ended with
            # is not the truth, the adopted row in the ledger is.
            self._dirty.add(op.operation_id)
        known = self._ops.get(op.operation_id)
        if known is not None and known.row_version > op.row_version:
            # A person's action (a cancel, an answer, a budget cancel) was recorded after this
            # advance had finished but before its group was committed, so ``_touched`` did not
            # see it running. Found by the demo: a cancel recorded in that gap was overwritten
            # here by the older value and never sent (cancel_confirmation failed, 237 s and rising).
            self._dirty.add(op.operation_id)
        if op.operation_id in self._dirty:
            # While this advance was in flight a person acted on the operation, or one of its
            # writes lost its compare-and-swap: what it ended with is not the truth. Start again
            # from the ledger.
            self._dirty.discard(op.operation_id)
            fresh = self.ledger.get(op.operation_id)
            if fresh is None:
                self._ops.pop(op.operation_id, None)
                return
            op = fresh
            wake = Wake(op, self.clock.now())
        if op.operation_id in self._rerun:
            self._rerun.discard(op.operation_id)
            wake = Wake(op, self.clock.now())
        self._ops[op.operation_id] = op
        if op.state in RECEIPT_STATES:
            self._ops.pop(op.operation_id, None)
            self._urgent.discard(op.operation_id)
            self._compare_shadows(op.operation_id)
            return
        budget_at = self._budget_deadline(op)
        if (
            budget_at is not None
            and self.clock.now() >= budget_at
            and op.state in (S.WORKING, S.INPUT_REQUIRED)
            and self._budget_exhausted(op)
        ):
            return
        if wake.at is not None:
            self._schedule(op.operation_id, wake.at)

    def _budget_deadline(self, op: Operation) -> datetime | None:
        tool = self.config.tools.get(op.tool.name)
        if tool is None or tool.on_budget_exhausted != "cancel":
            return None
        return op.created_at + tool.wait_budget

    def _budget_exhausted(self, op: Operation) -> bool:
        """The wait budget ran out: cancel, or (no cancel capability) hand it to a person.

        Returns whether the operation was taken over by a cancel (``_touched`` reschedules it);
        False means it goes on being polled to its real terminal state.
        """
        driver = self._driver_for(op)
        if driver is None:
            return False
        if not driver.can_cancel():
            # A cancel that can never be sent must not be recorded: stop waiting, tell a person
            # once, and keep polling until the server says how it ended.
            if op.operation_id not in self._budget_flagged:
                self._budget_flagged.add(op.operation_id)
                capability = driver.capabilities.cancel_capability if driver.capabilities else "cancel"
                now = self.clock.now()
                with self._store.immediate():
                    self._store.open_reconciliation(
                        op,
                        kind="budget",
                        reason=(
                            "wait budget exhausted; not cancelled because the server does not declare "
                            f"{capability}; the operation is still polled to its terminal state"
                        ),
                        window_end=now,
                        at=now,
                    )
            return False
        try:
            with self._store.immediate():
                after = driver.request_cancel(op, actor="finality", reason="wait budget exhausted")
        except EngineError as exc:
            logger.warning("budget cancel of %s failed: %s", op.operation_id, exc)
            return True
        self._touched(after)
        return True

    def _touched(self, after: Operation) -> None:
        """A person's action just changed ``after`` in the ledger; make the loop follow it."""
        if after.operation_id in self._running:
            self._dirty.add(after.operation_id)
        self._ops[after.operation_id] = after
        self._schedule(after.operation_id, self.clock.now())

    # ------------------------------------------------------------------ leases (several executors)

    def _maintain_leases(self) -> None:
        """Renew this process's leases, drop what ``renew`` no longer returns, claim more.

        Runs between ticks every ``lease_s / 3``. A claimed operation behind the epoch (its
        holder died before adopting it) is adopted; the others are resumed exactly as after a
        restart (the drivers have no memory of them).
        """
        if self._leasing is None or self.lease_s is None:
            return
        now = self.clock.now()
        self._lease_due = now + timedelta(seconds=self.lease_s / 3)
        try:
            held = set(self._leasing.renew(self.owner, self.lease_token, self.lease_s, now))
            for op_id in [o for o in self._ops if o not in held]:
                self._lease_lost(op_id, "not renewed")
            room = MAX_RUNNING * 4 - len(self._ops)
            claimed = self._leasing.claim(
                self.owner,
                self.lease_token,
                min(CLAIM_BATCH, room),
                self.lease_s,
                now,
                epoch=int(self.epoch),
                servers=[s.config.url for s in self._servers.values()],
            )
        except LeaseLost:
            self._epoch_check()
            return
        except EngineError as exc:
            logger.warning("lease maintenance failed (retried in %.1f s): %s", self.lease_s / 3, exc)
            return
        if not claimed:
            return
        self.stats["claimed"] += len(claimed)
        logger.info("claimed %d operations", len(claimed))
        behind = [op for op in claimed if op.epoch < self.epoch]
        for op in claimed:
            if op.epoch < self.epoch:
                continue
            self._lost.discard(op.operation_id)
            if op.operation_id in self._running:
                self._dirty.add(op.operation_id)  # its advance ends on the row as claimed
            self._ops[op.operation_id] = op
            self._schedule(op.operation_id, now)
        if behind:
            self._adopt_operations(behind, actor="finality (taken over behind the epoch)")

    def _lease_lost(self, op_id: str, why: str) -> None:
        """Another executor owns ``op_id`` now (or the epoch moved on): stop driving it."""
        op = self._ops.pop(op_id, None)
        if op is not None:
            self.stats["lease_lost"] += 1
            logger.info("operation %s dropped: %s", op_id, why)
            driver = self._driver_for(op)
            if driver is not None:
                driver.forget(op)
        self._due_at.pop(op_id, None)
        if op_id in self._running:
            self._lost.add(op_id)
        if "epoch" in why:
            self._epoch_check()

    def _epoch_check(self) -> None:
        """If another executor raised the execution epoch, restart the drivers at it and adopt."""
        if self._leasing is None:
            return
        try:
            recorded = self._leasing.execution_epoch()
        except EngineError as exc:
            logger.warning("execution epoch not read: %s", exc)
            return
        if recorded is not None and recorded > self.epoch:
            logger.info("execution epoch raised to %d by another executor", recorded)
            self._raise_epoch(Epoch(recorded), "finality (epoch raised by another executor)")

    async def _commit(self) -> None:
        """Group commit on the writer thread, then release the advances that finished before it.

        The finished list is taken before the writes: an advance that finishes while the commit
        runs may have writes in the next group, so it waits for the next commit.
        """
        finished, self._finished = self._finished, []
        group = self._store.take()
        started = monotonic_seconds()
        try:
            refused = await asyncio.to_thread(self._store.commit, group)
        finally:
            self._store.settle()
        self.commit_seconds += monotonic_seconds() - started
        self.stats["commits"] += 1
        self.stats["committed_writes"] += group.size
        self._refused(refused, finished)
        for wake in finished:
            self._after(wake)

    def _flush(self) -> None:
        """Commit what is buffered now, on the loop's thread (around person actions and at stop)."""
        finished, self._finished = self._finished, []
        self._refused(self._store.flush(), finished)
        for wake in finished:
            self._after(wake)

    def _refused(self, refused: list[tuple[Transition, BatchOutcome]], finished: list[Wake]) -> None:
        self._log_fenced([t for t, _ in refused])
        finishing = {wake.operation.operation_id for wake in finished} if refused else set()
        for transition, outcome in refused:
            self.stats["refused"] += 1
            op_id = transition.after.operation_id
            if isinstance(outcome.error, LeaseLost):
                self._lease_lost(op_id, str(outcome.error))
                continue
            if op_id in self._running:
                self._dirty.add(op_id)
                continue
            if op_id in finishing:
                # Its advance ended on a write the ledger refused: ``_after`` restarts it from the
                # ledger instead of from what the advance ended with.
                self._dirty.add(op_id)
            fresh = self.ledger.get(op_id)
            if fresh is None:
                continue
            if isinstance(outcome.error, DuplicateOperation) and transition.after.task_id is not None:
                driver = self._driver_for(fresh)
                if driver is not None:
                    fresh = driver.task_reused(fresh, transition.after.task_id, str(outcome.error))
                    self._store.flush()
            self._ops[op_id] = fresh
            if fresh.state not in RECEIPT_STATES:
                self._schedule(op_id, self.clock.now())

    def _log_fenced(self, refused: list[Transition]) -> None:
        """Group-committed writes refused because a rollback raised the epoch under them: say so.

        An old driver stepped its reply against the operation as it was when it sent the request;
        against the adopted row the same reply is stale, and ``step`` says why. Those refusals are
        what the transitions log keeps (the replies themselves change nothing).
        """
        now = self.clock.now()
        stale = [
            t
            for t in refused
            if t.accepted and t.before.epoch < self.epoch and t.after.operation_id not in self._lost
        ]
        current = self.ledger.get_many([t.after.operation_id for t in stale])
        fenced: list[tuple[Transition, Transition]] = []
        for transition in stale:
            fresh = current.get(transition.after.operation_id)
            if fresh is None or fresh.epoch <= transition.before.epoch:
                continue
            verdict = step(fresh, transition.event, now)
            if not verdict.accepted:
                fenced.append((transition, verdict))
        if not fenced:
            return
        outcomes = self.ledger.apply_many([verdict for _, verdict in fenced])
        for (transition, verdict), outcome in zip(fenced, outcomes, strict=True):
            if outcome.error is not None:
                logger.warning(
                    "fenced reply for %s not logged: %s", verdict.before.operation_id, outcome.error
                )
                continue
            self.stats["fenced"] += 1
            fresh = verdict.before
            if fresh.state is not S.UNKNOWN and any(
                isinstance(e, OpenReconciliation) for e in transition.effects
            ):
                # The old driver opened an entry for a person on the strength of that reply; the
                # adopted operation is not lost, so nobody has anything to find.
                self.ledger.resolve_open(
                    fresh.operation_id,
                    kind="unknown",
                    actor="finality",
                    resolution=f"opened on a reply fenced after the rollback to epoch {self.epoch}; "
                    f"the adopted operation continues in {fresh.state}",
                    at=now,
                )

    # -------------------------------------------------------------------------- person actions

    async def _between_ticks(self, action: Callable[[], Awaitable[T]]) -> T:
        """Run ``action`` in the loop between ticks, so it never overlaps an operation's advance."""
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._actions.append((action, future))
        self._wake.set()
        result = await asyncio.wait_for(future, timeout=60)
        return result  # type: ignore[return-value]

    async def submit(
        self,
        *,
        call_node: str,
        tool: str,
        arguments: Json,
        principal: str | None = None,
        server: str | None = None,
        role: Role = Role.PRIMARY,
    ) -> Operation:
        """Record and schedule a call (or return the call node's existing operation).

        A new call node is routed by the rollout (old path, canary or a shadow beside it) unless
        ``server`` names one; either way a server whose protocol is switched off takes no new call.

        Raises:
            ServiceError: 400 unknown tool/server or a reserved call node id, 409 the call node
                holds another request or the protocol is disabled, 422 the server or tool cannot
                run it within its limits.
        """
        tool_config = self.config.tools.get(tool)
        if tool_config is None:
            raise ServiceError(400, f"unknown tool {tool!r}; configure it under [tools.{tool}]")
        if server is not None and server not in self._servers:
            raise ServiceError(400, f"unknown server {server!r}")

        # Not one action each: every submission waiting when the loop comes round is recorded in
        # one transaction (``_create_queued``), so 200 concurrent callers cost two commits, not 400.
        future: asyncio.Future[Operation] = asyncio.get_running_loop().create_future()
        self._submits.append(
            (_Submission(tool_config, call_node, arguments, principal, role, server), future)
        )
        self._wake.set()
        return await asyncio.wait_for(future, timeout=60)

    def _create_queued(self) -> None:
        """Record the queued submissions of new call nodes together; every other one goes alone.

        A call node that already has an operation, or appears twice in the queue, is answered by
        ``_create`` exactly as a lone submission would be (same result, same 409). The new ones
        are recorded by one ``create_many`` and their assignments by one ``record_assignments``.
        """
        queued, self._submits = self._submits, []
        batch: list[tuple[_Submission, asyncio.Future[Operation], Operation, Route, _Server]] = []
        alone: list[tuple[_Submission, asyncio.Future[Operation]]] = []
        nodes: set[str] = set()
        for sub, future in queued:
            if future.done():
                continue  # its caller gave up
            if sub.call_node in nodes or self.ledger.by_call_node(sub.call_node) is not None:
                alone.append((sub, future))
                continue
            try:
                route = self._route(sub.call_node, sub.tool, sub.server)
                target = self._servers[route.server]
                self._plan(target, sub.tool)
            except ServiceError as exc:
                future.set_exception(exc)
                continue
            principal = sub.principal or target.config.principal
            op = self._new_op(target, sub.tool, sub.call_node, sub.arguments, principal, sub.role)
            batch.append((sub, future, op, route, target))
            nodes.add(sub.call_node)
        created: list[tuple[_Submission, asyncio.Future[Operation], Operation, Route, _Server]] = []
        try:
            stored = self.ledger.create_many([(op, sub.arguments) for sub, _, op, _, _ in batch])
        except EngineError:
            # Another executor raced us to one of the call nodes. What the batch recorded before
            # it failed is ours (our operation id); the rest is answered one by one.
            for sub, future, op, route, target in batch:
                found = self.ledger.by_call_node(sub.call_node)
                if found is not None and found.operation_id == op.operation_id:
                    created.append((sub, future, found, route, target))
                else:
                    alone.append((sub, future))
        else:
            for (sub, future, _, route, target), (op, fresh) in zip(batch, stored, strict=True):
                if fresh:
                    created.append((sub, future, op, route, target))
                else:
                    alone.append((sub, future))
        rows: list[dict[str, object]] = []
        shadows: list[tuple[Operation, Route]] = []
        tool_of: dict[str, ToolConfig] = {}
        for sub, _, op, route, target in created:
            self._track(target, op, True, sub.arguments)
            rows.append(self.rollout.assignment(op, route, tool=sub.tool.name, server_name=route.server))
            if route.shadow_server is not None:
                shadows.append((op, route))
                tool_of[op.operation_id] = sub.tool
        rows.extend(self._start_shadows(shadows, tool_of=tool_of))
        self.ledger.record_assignments(rows)
        for _, future, op, _, _ in created:
            future.set_result(op)
        for sub, future in alone:
            try:
                future.set_result(
                    self._create(sub.tool, sub.call_node, sub.arguments, sub.principal, sub.role, sub.server)
                )
            except Exception as exc:  # handed to the waiting API request, which reports it
                future.set_exception(exc)
        self._flush()

    def _route(self, call_node: str, tool: ToolConfig, server: str | None) -> Route:
        if call_node.endswith(SHADOW_SUFFIX):
            raise ServiceError(
                400, f"call node ids ending in {SHADOW_SUFFIX!r} are reserved for shadow operations"
            )
        try:
            if server is None:
                return self.router.route(call_node, tool.name)
            target = self._servers[server]
            if target.protocol.value in self.router.state.disabled_protocols:
                raise RolloutRefused(
                    409,
                    f"protocol {target.protocol} is disabled (kill switch): server {server!r} takes no new call",
                )
            return Route(server, Arm.FIXED, bucket(call_node, self.router.state.salt))
        except RolloutRefused as exc:
            raise ServiceError(exc.status, str(exc)) from exc

    def _plan(self, target: _Server, tool: ToolConfig) -> None:
        try:
            plan = plan_call(target.caps, tool.name, sync_limit=tool.sync_limit, wait_budget=tool.wait_budget)
        except NegotiationError as exc:
            raise ServiceError(422, str(exc)) from exc
        if plan.mode is CallMode.SYNC and target.protocol is not Protocol.MCP_2026_07_28:
            raise ServiceError(422, f"{plan.reason}; synchronous calls run through `finality call`")

    def _new_op(
        self, target: _Server, tool: ToolConfig, call_node: str, arguments: Json, principal: str, role: Role
    ) -> Operation:
        request = CallRequest(CallNodeId(call_node), tool.ref, arguments, Principal(principal))
        return new_operation(
            request,
            operation_id=OperationId(str(uuid.uuid4())),
            protocol=target.protocol,
            adapter_version=ADAPTER_VERSION,
            server=target.config.url,
            epoch=self.epoch,
            now=self.clock.now(),
            role=role,
        )

    def _track(self, target: _Server, op: Operation, created: bool, arguments: Json) -> None:
        if created:
            target.driver.mark_fresh(op, arguments)
        elif self.shared and op.operation_id not in self._ops:
            return  # another executor's (or free): its holder, or a later claim, drives it
        self._ops[op.operation_id] = op
        self._schedule(op.operation_id, self.clock.now())

    def _create(
        self,
        tool: ToolConfig,
        call_node: str,
        arguments: Json,
        principal: str | None,
        role: Role,
        server: str | None,
    ) -> Operation:
        existing = self.ledger.by_call_node(call_node)
        if existing is not None:
            asked = CallRequest(
                CallNodeId(call_node), tool.ref, arguments, Principal(principal or existing.principal)
            )
            field = request_mismatch(existing, asked)
            if field is not None:
                raise ServiceError(
                    409, f"call node {call_node!r} already holds a different request: its {field} differs"
                )
            return existing
        route = self._route(call_node, tool, server)
        target = self._servers[route.server]
        self._plan(target, tool)
        op = self._new_op(target, tool, call_node, arguments, principal or target.config.principal, role)
        stored, created = self.ledger.create_operation(op, arguments)
        self._track(target, stored, created, arguments)
        if created:
            rows = [self.rollout.assignment(stored, route, tool=tool.name, server_name=route.server)]
            if route.shadow_server is not None:
                rows.extend(self._start_shadows([(stored, route)], tool_of={stored.operation_id: tool}))
            self.ledger.record_assignments(rows)
        return stored

    def _start_shadows(
        self, primaries: list[tuple[Operation, Route]], *, tool_of: dict[str, ToolConfig]
    ) -> list[dict[str, object]]:
        """Start the shadow copies of freshly created primaries; returns their assignment rows.

        A shadow never affects its primary: a shadow that cannot be planned or recorded is
        skipped with a warning. Only side-effect-free tools are ever shadowed (the router and the
        stage machine ensure it; checked here once more because a shadow runs the call twice).
        """
        items: list[tuple[Operation, Json]] = []
        meta: list[tuple[Operation, Route, _Server, ToolConfig, Json]] = []
        for primary, route in primaries:
            tool = tool_of[primary.operation_id]
            if route.shadow_server is None or not tool.side_effect_free:
                continue
            target = self._servers[route.shadow_server]
            try:
                self._plan(target, tool)
            except ServiceError as exc:
                logger.warning("no shadow for %s on %s: %s", primary.call_node_id, route.shadow_server, exc)
                continue
            arguments = self.ledger.arguments(primary.operation_id)
            op = self._new_op(
                target,
                tool,
                shadow_call_node(primary.call_node_id),
                arguments,
                target.config.principal,
                Role.SHADOW,
            )
            items.append((op, arguments))
            meta.append((primary, route, target, tool, arguments))
        if not items:
            return []
        try:
            stored = self.ledger.create_many(items)
        except EngineError as exc:
            logger.warning("shadow operations not recorded: %s", exc)
            return []
        rows: list[dict[str, object]] = []
        for (op, created), (primary, route, target, tool, arguments) in zip(stored, meta, strict=True):
            self._track(target, op, created, arguments)
            if created:
                self._shadow_of[primary.operation_id] = op.operation_id
                self._primary_of[op.operation_id] = primary.operation_id
                rows.append(
                    self.rollout.assignment(
                        op,
                        route,
                        tool=tool.name,
                        server_name=target.config.name,
                        primary_operation_id=primary.operation_id,
                    )
                )
        return rows

    async def submit_many(self, calls: list[tuple[str, str, Json]]) -> list[Operation]:
        """Record many calls ``(call_node, tool, arguments)`` in one transaction and schedule them.

        For load generators and imports; each call follows the same rules as ``submit`` (routing,
        shadows and the kill switch included).
        """

        async def create() -> list[Operation]:
            items: list[tuple[Operation, Json]] = []
            planned: list[tuple[_Server, Route, ToolConfig]] = []
            for call_node, tool, arguments in calls:
                tool_config = self.config.tools.get(tool)
                if tool_config is None:
                    raise ServiceError(400, f"unknown tool {tool!r}")
                route = self._route(call_node, tool_config, None)
                target = self._servers[route.server]
                self._plan(target, tool_config)
                op = self._new_op(
                    target, tool_config, call_node, arguments, target.config.principal, Role.PRIMARY
                )
                items.append((op, arguments))
                planned.append((target, route, tool_config))
            stored = self.ledger.create_many(items)
            rows: list[dict[str, object]] = []
            fresh: list[tuple[Operation, Route]] = []
            tool_of: dict[str, ToolConfig] = {}
            for (op, created), (target, route, tool_config), (_, arguments) in zip(
                stored, planned, items, strict=True
            ):
                self._track(target, op, created, arguments)
                if created:
                    rows.append(
                        self.rollout.assignment(op, route, tool=tool_config.name, server_name=route.server)
                    )
                    if route.shadow_server is not None:
                        fresh.append((op, route))
                        tool_of[op.operation_id] = tool_config
            rows.extend(self._start_shadows(fresh, tool_of=tool_of))
            self.ledger.record_assignments(rows)
            return [op for op, _ in stored]

        return await self._between_ticks(create)

    async def cancel(self, call_node: str, *, actor: str, reason: str) -> Operation:
        """Raise the cancel generation and record CANCEL_REQUESTED; the request goes out after that.

        Cancels that arrive together are recorded together: one group commit between ticks, each
        still its own compare-and-swap, and each caller answered only once its record is durable.
        A primary's running shadow is cancelled with it, so that the comparison stays like for like.
        """
        future: asyncio.Future[Operation] = asyncio.get_running_loop().create_future()
        self._cancels.append((call_node, actor, reason, future))
        self._wake.set()
        return await asyncio.wait_for(future, timeout=60)

    def _cancel_queued(self) -> None:
        queued, self._cancels = self._cancels, []
        done: list[tuple[asyncio.Future[Operation], Operation | Exception]] = []
        with self._store.grouped() as refused:
            for call_node, actor, reason, future in queued:
                try:
                    done.append((future, self._cancel_now(call_node, actor=actor, reason=reason)))
                except Exception as exc:  # handed to the waiting API request, which reports it
                    done.append((future, exc))
        lost = {t.after.operation_id for t, _ in refused}
        self._refused(refused, [])
        for future, result in done:
            if future.done():  # the caller stopped waiting; the record stands all the same
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            elif result.operation_id in lost:
                future.set_exception(
                    ServiceError(409, "the operation moved while the cancel was recorded; ask again")
                )
            else:
                future.set_result(result)

    def _cancel_now(self, call_node: str, *, actor: str, reason: str) -> Operation:
        op = self._current(call_node)
        driver = self._driver_for(op)
        if driver is None:
            raise ServiceError(409, f"operation's server {op.server} is not configured")
        try:
            with self._store.immediate():
                after = driver.request_cancel(op, actor=actor, reason=reason)
        except EngineError as exc:
            raise ServiceError(409, str(exc)) from exc
        self._touched(after)
        self._cancel_shadow(after, actor=actor, reason=reason)
        return after

    def _cancel_shadow(self, primary: Operation, *, actor: str, reason: str) -> None:
        shadow_id = self._shadow_of.get(primary.operation_id)
        shadow = self.ledger.get(shadow_id) if shadow_id is not None else None
        if shadow is None or shadow.state not in (S.WORKING, S.INPUT_REQUIRED):
            return
        driver = self._driver_for(shadow)
        if driver is None:
            return
        try:
            with self._store.immediate():
                after = driver.request_cancel(
                    shadow, actor=actor, reason=f"mirrors its primary's cancel: {reason}"
                )
        except EngineError as exc:
            logger.warning("shadow %s not cancelled with its primary: %s", shadow.operation_id, exc)
            return
        self._touched(after)

    async def resubmit(self, call_node: str, *, actor: str, reason: str) -> Operation:
        """A person's resubmission under the same key of an operation they declared absent.

        Recorded with actor and reason before the submission goes out; 409 unless NOT_FOUND_SAFE.
        """
        if not actor.strip() or not reason.strip():
            raise ServiceError(400, "actor and reason are required")

        async def do() -> Operation:
            op = self._current(call_node)
            driver = self._driver_for(op)
            if driver is None:
                raise ServiceError(409, f"operation's server {op.server} is not configured")
            try:
                with self._store.immediate():
                    after = driver.resubmit(op, actor=actor, reason=reason)
            except EngineError as exc:
                raise ServiceError(409, str(exc)) from exc
            self._touched(after)
            return after

        return await self._between_ticks(do)

    async def answer(self, operation_id: str, *, input_round: int, answer: Json, actor: str) -> Operation:
        """Answer one input round; a stale round is refused with 409 and changes nothing."""

        async def do() -> Operation:
            op = self.ledger.get(operation_id)
            if op is None:
                raise ServiceError(404, f"no operation {operation_id}")
            driver = self._driver_for(op)
            if driver is None:
                raise ServiceError(409, f"operation's server {op.server} is not configured")
            try:
                with self._store.immediate():
                    after = await driver.answer(op, input_round=input_round, answer=answer, actor=actor)
            except StaleRound as exc:
                raise ServiceError(409, str(exc)) from exc
            self._touched(after)
            return after

        return await self._between_ticks(do)

    async def resolve(
        self, entry_id: int, *, actor: str, reason: str, task_id: str | None, absent: bool
    ) -> bool:
        """Resolve a reconciliation entry; for an UNKNOWN operation, bind it to a task or declare it absent."""
        if not actor.strip() or not reason.strip():
            raise ServiceError(400, "actor and reason are required")

        async def do() -> bool:
            entries = [e for e in self.ledger.reconciliation(open_only=True) if e["entry_id"] == entry_id]
            if not entries:
                raise ServiceError(404, f"no open reconciliation entry {entry_id}")
            entry = entries[0]
            op = self.ledger.get(str(entry["operation_id"]))
            if (
                op is not None
                and op.state is S.UNKNOWN
                and entry["kind"] == "unknown"
                and (task_id or absent)
            ):
                driver = self._driver_for(op)
                if driver is None:
                    raise ServiceError(409, f"operation's server {op.server} is not configured")
                # A person's spelling of the task becomes the protocol's one spelling, so that a bare
                # AIP-151 id and its full name denote one server operation (found by the demo: one
                # operation bound twice, counted by duplicate_operations as a second one).
                bound = driver.backend.canonical_task_id(task_id) if task_id else None
                if bound is not None and op.task_id is not None and bound != op.task_id:
                    raise ServiceError(
                        409,
                        f"operation {op.operation_id} is bound to task {op.task_id}; "
                        f"{task_id!r} names another task",
                    )
                try:
                    with self._store.immediate():
                        after = driver.commit(op, Reconciled(actor, reason, bound))
                except DuplicateOperation as exc:
                    raise ServiceError(409, f"task {bound} belongs to another operation: {exc}") from exc
                if after.state is S.UNKNOWN:
                    raise ServiceError(409, "the operation could not be reconciled that way")
                self._touched(after)
            return self.ledger.resolve_reconciliation(
                entry_id, actor=actor, resolution=reason, at=self.clock.now()
            )

        return await self._between_ticks(do)

    def _current(self, call_node: str) -> Operation:
        op = self.ledger.by_call_node(call_node)
        if op is None:
            raise ServiceError(404, f"no operation for call node {call_node!r}")
        return self._ops.get(op.operation_id, op)

    # ----------------------------------------------------------------------------- inspection

    @property
    def in_flight(self) -> int:
        return len(self._ops)

    def servers(self) -> dict[str, Protocol]:
        return {name: s.protocol for name, s in self._servers.items()}

    # -------------------------------------------------------------------------------- rollout

    async def rollout_act(self, request: Request) -> dict[str, object]:
        """Carry out one rollout action between ticks; a rollback also adopts every in-flight operation.

        Raises:
            RolloutRefused: the stage machine refuses it (``status`` and, for a blocked promotion,
                the failing gates say why).
        """

        async def do() -> dict[str, object]:
            self._flush()
            context: dict[str, object] | None = None
            if request.action is Action.ROLLBACK:
                context = {"in_flight_at_rollback": self._in_flight_summary()}
            result = self.rollout.act(request, context=context)
            # From here on no new call is routed to the new adapter.
            self.router.state = result.decision.after
            out = result.as_json()
            if result.decision.after.epoch > self.epoch:
                out["adoption"] = self._raise_epoch(Epoch(result.decision.after.epoch), request.actor)
            return out

        return await self._between_ticks(do)

    def _in_flight_summary(self) -> dict[str, object]:
        live = self.ledger.live_by_protocol()
        on_new_path = sum(
            int(str(row["operations"]))
            for row in self.ledger.arm_counts()
            if row["in_flight"] and row["arm"] in (Arm.CANARY.value, Arm.SHADOW.value)
        )
        return {
            "operations": sum(sum(states.values()) for states in live.values()),
            "on_new_adapter": on_new_path,
            "by_protocol": live,
            "advances_in_flight": len(self._running),
        }

    def _raise_epoch(self, epoch: Epoch, actor: str) -> dict[str, object]:
        """Switch to ``epoch`` (already compare-and-swapped into the ledger) and adopt the in-flight work.

        Old drivers are dropped, not changed: an advance still awaiting a reply keeps its driver,
        whose replies carry the old epoch and are fenced. The new drivers start without memory,
        exactly as after a restart.
        """
        previous = self.epoch
        self.epoch = epoch
        self._refence()
        for server in self._servers.values():
            server.driver = self._new_driver(server.config, server.backend, server.caps)
        live = [s for s in LocalState if s not in RECEIPT_STATES]
        if self.shared:
            # Only what this executor leases; the others adopt theirs when their fence refuses
            # them, and behind-epoch operations nobody holds are adopted as ``claim`` hands them out.
            held = self.ledger.get_many(list(self._ops))
            behind = [op for op in held.values() if op.epoch < epoch and op.state not in RECEIPT_STATES]
        else:
            behind = [op for op in self.ledger.operations(states=live) if op.epoch < epoch]
        adopted = self._adopt_operations(behind, actor=actor)
        return {"from_epoch": previous, "to_epoch": epoch, **adopted}

    def _adopt_operations(self, ops: list[Operation], *, actor: str) -> dict[str, object]:
        """``EpochRaised`` for each operation through ``step``, group-committed; state carries over."""
        now = self.clock.now()
        by_state: Counter[str] = Counter()
        failed: list[str] = []
        pending = ops
        for _ in range(3):
            retry: list[Operation] = []
            for start in range(0, len(pending), 1000):
                chunk = [
                    step(op, EpochRaised(self.epoch, actor), now) for op in pending[start : start + 1000]
                ]
                for t, outcome in zip(chunk, self.ledger.apply_many(chunk), strict=True):
                    if isinstance(outcome.error, LeaseLost):
                        self._lease_lost(t.before.operation_id, str(outcome.error))
                        continue
                    if outcome.error is not None or outcome.operation is None:
                        fresh = self.ledger.get(t.before.operation_id)
                        if (
                            fresh is not None
                            and fresh.epoch < self.epoch
                            and fresh.state not in RECEIPT_STATES
                        ):
                            retry.append(fresh)
                        continue
                    after = outcome.operation
                    by_state[after.state.value] += 1
                    self.stats["adopted"] += 1
                    if after.operation_id in self._running:
                        self._dirty.add(after.operation_id)
                    self._ops[after.operation_id] = after
                    self._schedule(after.operation_id, now)
            pending = retry
            if not pending:
                break
        failed = [op.operation_id for op in pending]
        if failed:
            logger.error(
                "%d operations could not be adopted at epoch %d: %s", len(failed), self.epoch, failed[:20]
            )
        return {"adopted": sum(by_state.values()), "adopted_by_state": dict(by_state), "not_adopted": failed}

    def _compare_shadows(self, operation_id: str | None = None) -> None:
        """Record the shadow comparison of a pair once both of its operations hold a receipt."""
        if operation_id is None:
            pairs = list(self._shadow_of.items())
        elif operation_id in self._shadow_of:
            pairs = [(operation_id, self._shadow_of[operation_id])]
        elif operation_id in self._primary_of:
            pairs = [(self._primary_of[operation_id], operation_id)]
        else:
            return
        for primary_id, shadow_id in pairs:
            try:
                done = self.rollout.compare_pair(primary_id, shadow_id)
            except EngineError as exc:
                logger.warning("shadow comparison of %s failed: %s", primary_id, exc)
                continue
            if done is not None:
                self._shadow_of.pop(primary_id, None)
                self._primary_of.pop(shadow_id, None)

    def rollout_status(self) -> dict[str, object]:
        """The rollout as the status route shows it."""
        status = self.rollout.status(protocols={name: s.protocol.value for name, s in self._servers.items()})
        status["executor"] = {
            "epoch": int(self.epoch),
            "in_flight": self.in_flight,
            "fenced_since_start": self.stats["fenced"],
            "adopted_since_start": self.stats["adopted"],
        }
        return status


__all__ = [
    "CLAIM_BATCH",
    "FLUSH_BATCH",
    "FLUSH_DELAY",
    "MAX_IN_FLIGHT_REQUESTS",
    "MAX_RUNNING",
    "Executor",
    "S",
    "owner_name",
]
