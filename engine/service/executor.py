"""The service's executor: one timer heap over every in-flight operation, ticks, and group commit.

Each tick flushes the previous tick's writes, pops every operation that is due, advances them
concurrently through their server's ``Driver`` (one action each), and flushes again. There is no
sleeping task per operation: an operation is a heap entry until it is due. Person actions (submit,
cancel, answer, reconcile) are applied between ticks, so no two actions on one operation overlap.
On start every non-terminal operation is loaded from the ledger and resumed; none is resubmitted.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import itertools
import logging
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TypeVar

import httpx

from engine.adapters import AdapterOptions, CallMode, discover, open_backend, plan_call
from engine.adapters.base import Backend, Capabilities, Json
from engine.clock import Clock
from engine.errors import DuplicateOperation, EngineError, NegotiationError
from engine.ledger import Ledger
from engine.model import (
    RECEIPT_STATES,
    CallNodeId,
    CallRequest,
    Epoch,
    LocalState,
    Operation,
    OperationId,
    Principal,
    Protocol,
    Reconciled,
    Role,
    TaskId,
    new_operation,
)
from engine.runtime.call import ADAPTER_VERSION
from engine.runtime.driver import Driver, StaleRound, Wake
from engine.runtime.limiter import Limiter
from engine.schedule import PollPolicy
from engine.service.batching import BatchingLedger
from engine.service.config import ServerConfig, ServiceConfig, ToolConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")
S = LocalState

MAX_RUNNING = 2000
"""Operations advancing at once; the QPS limiter spaces their requests."""
FLUSH_BATCH = 500
FLUSH_DELAY = timedelta(milliseconds=5)
"""How long finished advances wait for company before their writes are committed together."""


class ServiceError(EngineError):
    """A request to the service that cannot be carried out; ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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

    ledger: Ledger
    config: ServiceConfig
    clock: Clock
    rng: random.Random = field(default_factory=random.Random)
    epoch: Epoch = field(default_factory=lambda: Epoch(1))
    client: httpx.AsyncClient | None = None
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
    _running: dict[str, asyncio.Future[Wake]] = field(default_factory=dict)
    _finished: list[Wake] = field(default_factory=list)
    _rerun: set[str] = field(default_factory=set)
    _dirty: set[str] = field(default_factory=set)
    _stopping: bool = False
    stats: dict[str, int] = field(default_factory=lambda: {"ticks": 0, "advances": 0, "refused": 0})

    def __post_init__(self) -> None:
        self._store = BatchingLedger(self.ledger)

    # ------------------------------------------------------------------------------ start up

    async def start(self) -> None:
        """Negotiate with every configured server, then resume every non-terminal operation."""
        self.ledger.warm_up()
        now = self.clock.now()
        self.ledger.put_setting("global_qps", repr(self.config.global_qps), now)
        self.ledger.put_setting("rollout_salt", self.config.rollout_salt, now)
        if self.client is None:
            self.client = httpx.AsyncClient(
                limits=httpx.Limits(max_connections=200, max_keepalive_connections=100)
            )
        limiter = Limiter(
            self.clock,
            global_qps=self.config.global_qps,
            per_server={s.url: s.qps for s in self.config.servers.values()},
        )
        poll = self.config.poll
        policy = PollPolicy(
            default_interval=poll.default_interval,
            min_interval=poll.min_interval,
            max_interval=poll.max_interval,
            jitter=poll.jitter,
            retry_backoff=poll.retry_backoff,
        )
        for name, server in self.config.servers.items():
            options = AdapterOptions(clock=self.clock)
            if server.max_result_bytes is not None:
                options = AdapterOptions(clock=self.clock, max_result_bytes=server.max_result_bytes)
            if server.protocol == "auto":
                protocol = await discover(server.url, self.client, server.token, options=options)
            else:
                protocol = Protocol(server.protocol)
            backend = open_backend(
                protocol, server.url, client=self.client, token=server.token, options=options
            )
            caps = await backend.negotiate(Principal(server.principal))
            driver = Driver(
                ledger=self._store,
                backend=backend,
                clock=self.clock,
                rng=random.Random(self.rng.random()),
                server=server.url,
                epoch=self.epoch,
                policy=policy,
                limiter=limiter,
                ttl=server.ttl,
            )
            self._servers[name] = _Server(server, protocol, backend, caps, driver)
        self._resume()

    def _resume(self) -> None:
        now = self.clock.now()
        live = [s for s in LocalState if s not in RECEIPT_STATES]
        by_url = {s.config.url: s for s in self._servers.values()}
        resumed = 0
        for op in self.ledger.operations(states=live):
            if op.server not in by_url:
                logger.warning(
                    "operation %s belongs to unconfigured server %s; left alone", op.operation_id, op.server
                )
                continue
            self._ops[op.operation_id] = op
            self._schedule(op.operation_id, now)
            resumed += 1
        logger.info("resumed %d operations", resumed)

    async def aclose(self) -> None:
        self._stopping = True
        self._wake.set()
        self._store.flush()
        for server in self._servers.values():
            await server.backend.aclose()
        if self.client is not None:
            await self.client.aclose()

    # ------------------------------------------------------------------------------- the loop

    def _schedule(self, op_id: str, at: datetime) -> None:
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
        """Loop until ``aclose``: flush, release finished operations, run person actions, launch due ones."""
        while not self._stopping:
            await self.tick()
            await self._idle()
        if self._running:
            await asyncio.wait(self._running.values(), timeout=30)
        self._flush()

    async def _idle(self) -> None:
        if self._actions or self._finished:
            # Let a few more advances finish so that they share one commit.
            if self._store.pending < FLUSH_BATCH and self._running:
                await self.clock.sleep(FLUSH_DELAY)
            return
        now = self.clock.now()
        if self._heap and self._heap[0][0] <= now and len(self._running) < MAX_RUNNING:
            return
        self._wake.clear()
        delay = (self._heap[0][0] - now) if self._heap else timedelta(seconds=1)
        sleeper = asyncio.ensure_future(self.clock.sleep(min(delay, timedelta(seconds=1))))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait({sleeper, waker}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    async def tick(self) -> int:
        """One round; returns how many operations were launched.

        1. flush buffered writes (one transaction), then hand finished advances back to the heap:
           an operation's next request is only ever sent after its last change is durable;
        2. run queued person actions;
        3. launch every due operation that is not already running, as its own task.
        """
        self.stats["ticks"] += 1
        self._flush()
        finished, self._finished = self._finished, []
        for wake in finished:
            self._after(wake)
        actions, self._actions = self._actions, []
        for action, future in actions:
            try:
                future.set_result(await action())
            except Exception as exc:  # handed to the waiting API request, which reports it
                future.set_exception(exc)
            self._flush()
        now = self.clock.now()
        launched = 0
        while self._heap and self._heap[0][0] <= now and len(self._running) < MAX_RUNNING:
            at, _, op_id = heapq.heappop(self._heap)
            if self._due_at.get(op_id) != at:
                continue  # superseded by an earlier schedule
            del self._due_at[op_id]
            op = self._ops.get(op_id)
            if op is None:
                continue
            if op_id in self._running:
                self._rerun.add(op_id)
                continue
            task = asyncio.ensure_future(self._advance(op))
            self._running[op_id] = task
            task.add_done_callback(functools.partial(self._done, op_id))
            launched += 1
        return launched

    def _done(self, op_id: str, task: asyncio.Future[Wake]) -> None:
        self._running.pop(op_id, None)
        if not task.cancelled():
            self._finished.append(task.result())
        self._wake.set()

    async def _advance(self, op: Operation) -> Wake:
        driver = self._driver_for(op)
        if driver is None:
            return Wake(op, None)
        self.stats["advances"] += 1
        try:
            return await driver.advance(op)
        except Exception:
            # One operation's unexpected failure must not stop the others; it is retried later.
            logger.exception("advancing operation %s failed", op.operation_id)
            return Wake(op, self.clock.now() + timedelta(seconds=5))

    def _after(self, wake: Wake) -> None:
        op = wake.operation
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
            return
        budget_at = self._budget_deadline(op)
        if (
            budget_at is not None
            and self.clock.now() >= budget_at
            and op.state in (S.WORKING, S.INPUT_REQUIRED)
        ):
            self._budget_exhausted(op)
            return
        if wake.at is not None:
            self._schedule(op.operation_id, wake.at)

    def _budget_deadline(self, op: Operation) -> datetime | None:
        tool = self.config.tools.get(op.tool.name)
        if tool is None or tool.on_budget_exhausted != "cancel":
            return None
        return op.created_at + tool.wait_budget

    def _budget_exhausted(self, op: Operation) -> None:
        driver = self._driver_for(op)
        if driver is None:
            return
        try:
            with self._store.immediate():
                after = driver.request_cancel(op, actor="finality", reason="wait budget exhausted")
        except EngineError as exc:
            logger.warning("budget cancel of %s failed: %s", op.operation_id, exc)
            return
        self._touched(after)

    def _touched(self, after: Operation) -> None:
        """A person's action just changed ``after`` in the ledger; make the loop follow it."""
        if after.operation_id in self._running:
            self._dirty.add(after.operation_id)
        self._ops[after.operation_id] = after
        self._schedule(after.operation_id, self.clock.now())

    def _flush(self) -> None:
        for transition, outcome in self._store.flush():
            self.stats["refused"] += 1
            op_id = transition.after.operation_id
            if op_id in self._running:
                self._dirty.add(op_id)
                continue
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

        Raises:
            ServiceError: 400 unknown tool/server, 409 the call node holds another request,
                422 the server or tool cannot run it within its limits.
        """
        tool_config = self.config.tools.get(tool)
        if tool_config is None:
            raise ServiceError(400, f"unknown tool {tool!r}; configure it under [tools.{tool}]")
        server_name = server or tool_config.server
        target = self._servers.get(server_name)
        if target is None:
            raise ServiceError(400, f"unknown server {server_name!r}")
        who = principal or target.config.principal

        async def create() -> Operation:
            return await self._create(target, tool_config, call_node, arguments, who, role)

        return await self._between_ticks(create)

    async def _create(
        self, target: _Server, tool: ToolConfig, call_node: str, arguments: Json, principal: str, role: Role
    ) -> Operation:
        existing = self.ledger.by_call_node(call_node)
        if existing is not None:
            request_digest = CallRequest(
                CallNodeId(call_node), tool.ref, arguments, Principal(principal)
            ).request_digest
            if existing.request_digest != request_digest:
                raise ServiceError(409, f"call node {call_node!r} already holds a different request")
            return existing
        try:
            plan = plan_call(target.caps, tool.name, sync_limit=tool.sync_limit, wait_budget=tool.wait_budget)
        except NegotiationError as exc:
            raise ServiceError(422, str(exc)) from exc
        if plan.mode is CallMode.SYNC and target.protocol is not Protocol.MCP_2026_07_28:
            raise ServiceError(422, f"{plan.reason}; synchronous calls run through `finality call`")
        request = CallRequest(CallNodeId(call_node), tool.ref, arguments, Principal(principal))
        op = new_operation(
            request,
            operation_id=OperationId(str(uuid.uuid4())),
            protocol=target.protocol,
            adapter_version=ADAPTER_VERSION,
            server=target.config.url,
            epoch=self.epoch,
            now=self.clock.now(),
            role=role,
        )
        stored, created = self.ledger.create_operation(op, arguments)
        if created:
            target.driver.mark_fresh(stored, arguments)
        self._ops[stored.operation_id] = stored
        self._schedule(stored.operation_id, self.clock.now())
        return stored

    async def submit_many(self, calls: list[tuple[str, str, Json]]) -> list[Operation]:
        """Record many calls ``(call_node, tool, arguments)`` in one transaction and schedule them.

        For load generators and imports; each call follows the same rules as ``submit``.
        """

        async def create() -> list[Operation]:
            items = []
            targets = []
            for call_node, tool, arguments in calls:
                tool_config = self.config.tools.get(tool)
                if tool_config is None:
                    raise ServiceError(400, f"unknown tool {tool!r}")
                target = self._servers[tool_config.server]
                plan_call(
                    target.caps, tool, sync_limit=tool_config.sync_limit, wait_budget=tool_config.wait_budget
                )
                request = CallRequest(
                    CallNodeId(call_node), tool_config.ref, arguments, Principal(target.config.principal)
                )
                op = new_operation(
                    request,
                    operation_id=OperationId(str(uuid.uuid4())),
                    protocol=target.protocol,
                    adapter_version=ADAPTER_VERSION,
                    server=target.config.url,
                    epoch=self.epoch,
                    now=self.clock.now(),
                )
                items.append((op, arguments))
                targets.append(target)
            stored = self.ledger.create_many(items)
            now = self.clock.now()
            for (op, created), target, (_, arguments) in zip(stored, targets, items, strict=True):
                if created:
                    target.driver.mark_fresh(op, arguments)
                self._ops[op.operation_id] = op
                self._schedule(op.operation_id, now)
            return [op for op, _ in stored]

        return await self._between_ticks(create)

    async def cancel(self, call_node: str, *, actor: str, reason: str) -> Operation:
        """Raise the cancel generation and record CANCEL_REQUESTED; the request goes out next tick."""

        async def do() -> Operation:
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
                with self._store.immediate():
                    after = driver.commit(op, Reconciled(actor, reason, TaskId(task_id) if task_id else None))
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
