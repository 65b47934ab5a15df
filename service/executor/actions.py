"""Person actions: submit (routed by the rollout), cancel, resubmit, answer, resolve.

Each runs between ticks (``_between_ticks``), so it never overlaps an advance of its operation,
and is recorded before anything is sent. Any executor of a shared ledger takes any action: on an
operation it holds it records and carries it out; on one another executor holds (or nobody does)
it records it by compare-and-swap on the row, exactly as the holder would, and the holder carries
it out (``_follow_person_actions``, or its next write, which loses its compare-and-swap against
the action and resumes from the ledger). A person never has to know which process holds what. Cancels that arrive together are recorded in one group
commit, each still its own compare-and-swap. This module must not send protocol requests itself:
the operation's driver does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable, Sized
from typing import TypeVar

from engine.adapters import CallMode, plan_call
from engine.adapters.base import Json
from engine.errors import (
    AnswerInvalid,
    DuplicateOperation,
    EngineError,
    LeaseLost,
    NegotiationError,
    RolloutRefused,
    ServiceError,
    StaleRound,
)
from engine.model import (
    CallNodeId,
    CallRequest,
    LocalState,
    Operation,
    OperationId,
    Principal,
    Protocol,
    Reconciled,
    Role,
    new_operation,
    request_mismatch,
)
from engine.runtime.call import ADAPTER_VERSION
from rollout.assign import Arm, bucket
from rollout.route import Route
from rollout.shadow import SHADOW_SUFFIX, shadow_call_node
from service.config import ToolConfig
from service.executor.base import (
    ExecutorState,
    Server,
    Submission,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")
ARRIVAL_ROUNDS = 20
"""Loop rounds a recording waits at most for submissions still being read (no timer: an idle
service records a lone submission after one round)."""
S = LocalState


async def arrivals_read(queue: Sized) -> None:
    """Let the loop come round until a round adds nothing to ``queue`` (at most ARRIVAL_ROUNDS): the
    submissions it has read but not yet handled join the batch. Started at the first of 200 callers,
    a batch of one cost the other 199 its whole commit (a burst's p50 181 -> 267 ms, measured)."""
    loop = asyncio.get_running_loop()
    for _ in range(ARRIVAL_ROUNDS):
        seen = len(queue)
        round_: asyncio.Future[None] = loop.create_future()
        loop.call_soon(round_.set_result, None)
        await round_
        if len(queue) == seen:
            return


class PersonActions(ExecutorState):
    """What a person (or a client) asks of the executor, carried out between ticks."""

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

        # Not one action each: every submission that arrives while a recording runs is recorded by
        # the next one, in one transaction (``_create_queued``), so 200 concurrent callers cost a
        # few commits, not 400.
        future: asyncio.Future[Operation] = asyncio.get_running_loop().create_future()
        self._submits.append((Submission(tool_config, call_node, arguments, principal, role, server), future))
        self._record_soon()
        # Awaited directly, not through wait_for: its extra hops let the tick's newly launched
        # advances run before the callers are answered, and 200 callers then waited on 200 submits.
        async with asyncio.timeout(60):
            return await future

    def _record_soon(self) -> None:
        """Start recording the queued submissions now, unless a recording runs (the queue is then its
        next batch) or the tick's exclusive steps do (they start it when they end). Not in the tick:
        a submission waited there for the group commit in flight, then for the loop's commit of
        everything buffered, then for its own, while it touches no row those commits write."""
        if self._recording is None and not self._exclusive and self._submits:
            self._recording = asyncio.ensure_future(self._record_queue())

    async def _record_queue(self) -> None:
        """Record batch after batch until the queue is empty or the tick's exclusive steps wait."""
        try:
            while self._submits and not self._exclusive:
                await arrivals_read(self._submits)
                await self._create_queued()
        finally:
            self._recording = None
            self._wake.set()  # exclusive steps may be waiting for this recording to end

    async def _recorded(self) -> None:
        while self._recording is not None:
            await asyncio.wait({self._recording})

    async def _create_queued(self) -> None:
        """Record the queued submissions of new call nodes together; every other one goes alone.

        A call node that already has an operation, or appears twice in the queue, is answered by
        ``_create`` exactly as a lone submission would be (same result, same 409). The new ones
        and their rollout arms are recorded by one ``create_many``: one durable commit, made on a
        worker thread, so that the loop goes on reading the requests that arrive meanwhile (they
        queue for the next batch: the batch grows with the load, and no window is waited out).
        """
        queued, self._submits = self._submits, []
        for _ in range(3):
            try:
                await self._record_submissions(queued)
                return
            except LeaseLost:
                # A rollback through another executor raised the epoch after these were routed:
                # the ledger refused them all. Route them again by the rollout state it now holds.
                self._follow_rollout()
            except Exception as exc:
                # No caller may wait out its timeout for a batch that failed: each is told.
                logger.exception("recording %d submissions failed", len(queued))
                for _, future in queued:
                    if not future.done():
                        future.set_exception(exc)
                return
        for _, future in queued:
            if not future.done():
                future.set_exception(
                    ServiceError(503, "the rollout kept moving while this call was recorded; submit again")
                )

    async def _record_submissions(self, queued: list[tuple[Submission, asyncio.Future[Operation]]]) -> None:
        """Route and record ``queued`` (futures already answered are skipped); each caller is answered
        as soon as the commit that holds its operation is durable.

        Raises:
            LeaseLost: the ledger's epoch is newer than this executor's; nothing was recorded.
        """
        batch: list[tuple[Submission, asyncio.Future[Operation], Operation, Route, Server]] = []
        alone: list[tuple[Submission, asyncio.Future[Operation]]] = []
        nodes: set[str] = set()
        waiting = [(sub, future) for sub, future in queued if not future.done()]  # others gave up
        # Nothing is read first: ``create_many`` skips the call nodes that already have an operation
        # (they are answered below, one by one, as before), so a batch of new calls is one commit.
        for sub, future in waiting:
            if sub.call_node in nodes:
                alone.append((sub, future))
                continue
            try:
                route = self._route(sub.call_node, sub.tool, sub.server)
                target = self._servers[route.server]
                self._plan(target, sub.tool)
            except ServiceError:
                # Refused for a new call, but a call node that has an operation gets it back
                # whatever the routing says now: ``_create`` looks it up first.
                alone.append((sub, future))
                continue
            principal = sub.principal or target.config.principal
            op = self._new_op(target, sub.tool, sub.call_node, sub.arguments, principal, sub.role)
            batch.append((sub, future, op, route, target))
            nodes.add(sub.call_node)
        arms = [
            self.rollout.assignment(op, route, tool=sub.tool.name, server_name=route.server)
            for sub, _, op, route, _ in batch
        ]
        created: list[tuple[Submission, asyncio.Future[Operation], Operation, Route, Server]] = []
        try:
            stored = await asyncio.to_thread(
                functools.partial(
                    self.ledger.create_many, [(op, sub.arguments) for sub, _, op, _, _ in batch], arms=arms
                )
            )
        except LeaseLost:
            raise
        except EngineError:
            # Another executor raced us to one of the call nodes. What the batch recorded before
            # it failed is ours (our operation id); the rest is answered one by one.
            arm_of = {str(arm["operation_id"]): arm for arm in arms}
            for sub, future, op, route, target in batch:
                found = self.ledger.by_call_node(sub.call_node)
                if found is not None and found.operation_id == op.operation_id:
                    created.append((sub, future, found, route, target))
                else:
                    alone.append((sub, future))
            # (an arm already written with its operation is not written twice)
            self.ledger.record_assignments([arm_of[op.operation_id] for _, _, op, _, _ in created])
        else:
            for (sub, future, _, route, target), (op, fresh) in zip(batch, stored, strict=True):
                if fresh:
                    created.append((sub, future, op, route, target))
                else:
                    alone.append((sub, future))
        shadows: list[tuple[Operation, Route]] = []
        tool_of: dict[str, ToolConfig] = {}
        for sub, _, op, route, target in created:
            self._track(target, op, True, sub.arguments)
            if route.shadow_server is not None:
                shadows.append((op, route))
                tool_of[op.operation_id] = sub.tool
        if shadows:
            self.ledger.record_assignments(self._start_shadows(shadows, tool_of=tool_of))
        for _, future, op, _, _ in created:
            future.set_result(op)
        for sub, future in alone:
            try:
                future.set_result(self._create_following(sub))
            except Exception as exc:  # handed to the waiting API request, which reports it
                future.set_exception(exc)

    def _create_following(self, sub: Submission) -> Operation:
        """``_create``, routed again once if a rollback elsewhere raised the epoch under it."""
        try:
            return self._create(sub.tool, sub.call_node, sub.arguments, sub.principal, sub.role, sub.server)
        except LeaseLost:
            self._follow_rollout()
            return self._create(sub.tool, sub.call_node, sub.arguments, sub.principal, sub.role, sub.server)

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

    def _plan(self, target: Server, tool: ToolConfig) -> None:
        try:
            plan = plan_call(target.caps, tool.name, sync_limit=tool.sync_limit, wait_budget=tool.wait_budget)
        except NegotiationError as exc:
            raise ServiceError(422, str(exc)) from exc
        if plan.mode is CallMode.SYNC and target.protocol is not Protocol.MCP_2026_07_28:
            raise ServiceError(422, f"{plan.reason}; synchronous calls run through `finality call`")

    def _new_op(
        self, target: Server, tool: ToolConfig, call_node: str, arguments: Json, principal: str, role: Role
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

    def _track(self, target: Server, op: Operation, created: bool, arguments: Json) -> None:
        if created:
            target.driver.mark_fresh(op, arguments)
        elif not self._tenancy.drives(op.operation_id, tracked=op.operation_id in self._ops):
            return
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
        meta: list[tuple[Operation, Route, Server, ToolConfig, Json]] = []
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
            planned: list[tuple[Server, Route, ToolConfig]] = []
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

        async def following() -> list[Operation]:
            try:
                return await create()
            except LeaseLost:
                # Routed before a rollback through another executor: route again by its state.
                self._follow_rollout()
                return await create()

        return await self._between_ticks(following)

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
                after = self._as_holder(op, lambda d, o: d.resubmit(o, actor=actor, reason=reason))
                if after is not None:
                    return after
                return self._recorder(op).resubmit(op, actor=actor, reason=reason)
            except EngineError as exc:
                raise ServiceError(409, str(exc)) from exc

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
                after = self._as_holder(
                    op, lambda d, o: d.record_answer(o, input_round=input_round, answer=answer, actor=actor)
                )
                if after is not None:
                    # Durable before it is sent, by the driver of the epoch it was recorded at.
                    sender = self._driver_for(after)
                    if sender is not None:
                        await sender.send_answer(after)
                    return after
                # Recorded here, sent by the holder (``_follow_person_actions``) or the next claimer.
                return self._recorder(op).record_answer(
                    op, input_round=input_round, answer=answer, actor=actor
                )
            except StaleRound as exc:
                raise ServiceError(409, str(exc)) from exc
            except AnswerInvalid as exc:
                raise ServiceError(422, str(exc)) from exc

        return await self._between_ticks(do)

    async def resolve(
        self, entry_id: int, *, actor: str, reason: str, task_id: str | None, absent: bool
    ) -> bool:
        """Resolve a reconciliation entry; for an UNKNOWN operation, bind it to a task or declare it absent."""
        if not actor.strip() or not reason.strip():
            raise ServiceError(400, "actor and reason are required")

        async def do() -> bool:
            # An advance that finished while this tick's group commit ran has its transition (say,
            # to UNKNOWN) still buffered, while the entry it opened is already in the ledger: commit
            # it first, so the entry is read beside the operation it was opened for, not an older row.
            self._flush()
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
                    held = self._as_holder(op, lambda d, o: d.commit(o, Reconciled(actor, reason, bound)))
                    # Recorded here when not held; its holder (or the next claimer) resumes it
                    # from the ledger.
                    after = held or self._recorder(op).commit(op, Reconciled(actor, reason, bound))
                except DuplicateOperation as exc:
                    raise ServiceError(409, f"task {bound} belongs to another operation: {exc}") from exc
                if after.state is S.UNKNOWN:
                    raise ServiceError(409, "the operation could not be reconciled that way")
            return self.ledger.resolve_reconciliation(
                entry_id, actor=actor, resolution=reason, at=self.clock.now()
            )

        return await self._between_ticks(do)

    def _current(self, call_node: str, found: dict[str, Operation] | None = None) -> Operation:
        op = found.get(call_node) if found is not None else self.ledger.by_call_node(call_node)
        if op is None:
            raise ServiceError(404, f"no operation for call node {call_node!r}")
        return self._ops.get(op.operation_id, op)


__all__ = ["PersonActions"]
