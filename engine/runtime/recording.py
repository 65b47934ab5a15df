"""The driver's core: what it remembers per operation, how it sends one request, how it records.

``DriverCore`` holds the driver's fields (ledger, backend, clock, epoch, policy, limiter), sends each
protocol request inside the QPS budget and records it in the polls table (``_request``), and turns
an event into a recorded transition (``commit``: ``machine.step``, then the ledger, then the
transition's effects such as opening a reconciliation item or an approval). The concerns that act
on an operation (``submission``, ``polling``, ``cancelling``, ``approvals``) build on it, and
``engine.runtime.driver.Driver`` puts them together. It decides no state itself and chooses no
action: ``machine.step`` decides states, ``plan.next_step`` the action due.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from engine.adapters.base import Backend, Capabilities, InputRequest, Json, Outcome
from engine.clock import Clock
from engine.errors import (
    BackendRejected,
    BackendUnavailable,
    LeaseLost,
    NegotiationError,
    NotFoundOnServer,
    ProtocolViolation,
    StaleWrite,
)
from engine.ledger.port import ApprovalRequest, HeldOutcome, PollRecord
from engine.machine import step
from engine.model import (
    AcceptTerminal,
    AwaitApproval,
    Epoch,
    Event,
    FlagEffectReconciliation,
    LocalState,
    OpenReconciliation,
    Operation,
    StatusObserved,
    TaskId,
    Transition,
)
from engine.runtime.epochs import urgent
from engine.runtime.limiter import Limiter
from engine.schedule import PollPolicy, wait_budget_end

# One logger for the whole driver, whichever of its modules logs: operators filter on this name.
logger = logging.getLogger("engine.runtime.driver")
S = LocalState
T = TypeVar("T")

if TYPE_CHECKING:  # the port both ledgers (DuckDB, PostgreSQL) offer; imported for typing only
    from engine.ledger.port import LedgerPort


@dataclass(slots=True)
class Memory:
    """What the driver remembers about one operation between actions (lost on restart, by design).

    One per operation in flight (100,000 in one process: bench/scale.py), hence slots; forgotten
    when the operation reaches its receipt (``Driver.advance``)."""

    fresh_submit: bool = False
    cancel_sent: int = 0
    failures: int = 0
    fetch_attempts: int = 0
    input_resends: int = 0
    resend_input: bool = False
    candidates: list[TaskId] = field(default_factory=list)
    arguments: Json | None = None
    held: Outcome | None = None
    refetch: bool = False
    advised: timedelta | None = None
    pending_input: InputRequest | None = None
    proved_absent: bool = False
    """The server proved by the key that the submission never arrived (after a restart the driver
    reads it back from the ledger's log: ``Submission.proof_of_absence``)."""


@dataclass(slots=True)
class Wake:
    """The driver's answer to ``advance``: the operation now, and when to call again (None: parked)."""

    operation: Operation
    at: datetime | None


@dataclass
class DriverCore:
    """The fields of a driver of one server through one adapter, its requests and its records."""

    ledger: LedgerPort
    backend: Backend
    clock: Clock
    rng: random.Random
    server: str
    epoch: Epoch
    policy: PollPolicy = field(default_factory=PollPolicy)
    limiter: Limiter | None = None
    ttl: timedelta | None = None
    on_change: Callable[[Operation], None] | None = None
    wait_budgets: Mapping[str, timedelta] = field(default_factory=dict)
    """Each tool's wait budget: its end bounds every approval's deadline (``approval_deadline``)."""
    capabilities: Capabilities | None = None
    """What negotiation found out about the server (None: not negotiated; nothing is refused ahead)."""
    _memory: dict[str, Memory] = field(default_factory=dict)

    # ------------------------------------------------------------------------------ bookkeeping

    def _mem(self, op: Operation) -> Memory:
        mem = self._memory.get(op.operation_id)
        if mem is None:
            mem = self._memory[op.operation_id] = Memory()
        return mem

    def forget(self, op: Operation) -> None:
        self._memory.pop(op.operation_id, None)

    def mark_fresh(self, op: Operation, arguments: Json | None = None) -> None:
        """This process just recorded ``op`` in SUBMITTING and has not sent it yet."""
        mem = self._mem(op)
        mem.fresh_submit = True
        mem.arguments = arguments

    def _arguments(self, op: Operation) -> Json:
        mem = self._mem(op)
        if mem.arguments is None:
            mem.arguments = self.ledger.arguments(op.operation_id)
        return mem.arguments

    async def _request(self, op: Operation, method: str, call: Callable[[], Awaitable[T]]) -> T:
        """One protocol request: within the QPS budget, and recorded in the polls table."""
        if self.limiter is None:
            return await self._send(op, method, self.clock.now(), call)
        # The cancel path goes first when requests queue: a person is waiting on it (the p99 gate).
        async with self.limiter.in_flight.hold(urgent=urgent(op)):
            return await self._send(op, method, await self.limiter.acquire(self.server), call)

    async def _send(self, op: Operation, method: str, sent: datetime, call: Callable[[], Awaitable[T]]) -> T:
        outcome = "ok"
        try:
            return await call()
        except BackendUnavailable:
            outcome = "unavailable"
            raise
        except NotFoundOnServer:
            outcome = "not_found"
            raise
        except ProtocolViolation:
            outcome = "violation"
            raise
        except (BackendRejected, NegotiationError):
            outcome = "rejected"
            raise
        finally:
            self.ledger.record_polls(
                [PollRecord(op.operation_id, self.server, method, op.epoch, sent, self.clock.now(), outcome)]
            )

    # ------------------------------------------------------------------------------- recording

    def commit(self, op: Operation, event: Event, *, payload: Json | None = None) -> Operation:
        """``step`` the event and record it; on a lost compare-and-swap, reload and step again.

        Rejected events are recorded too (with their reason) and leave the operation unchanged.
        """
        for _ in range(5):
            t = step(op, event, self.clock.now())
            try:
                self._record(t, payload)
            except LeaseLost:
                raise  # another executor holds it now (or the epoch moved on): reloading cannot help
            except StaleWrite:
                reloaded = self.ledger.get(op.operation_id)
                if reloaded is None:
                    raise
                op = reloaded
                continue
            self._effects(t)
            if t.after != t.before and self.on_change is not None:
                self.on_change(t.after)
            return t.after
        raise StaleWrite(op.operation_id, op.row_version, "kept losing the race")

    def _record(self, t: Transition, payload: Json | None) -> None:
        if any(isinstance(e, AcceptTerminal) for e in t.effects):
            self.ledger.accept_terminal(t, payload)
        else:
            self.ledger.apply(t)

    def _effects(self, t: Transition) -> None:
        now = self.clock.now()
        op = t.after
        if t.before.state is S.UNKNOWN and op.state is not S.UNKNOWN and isinstance(t.event, StatusObserved):
            # The server answered for the operation again: nothing is left for a person to find.
            self.ledger.resolve_open(
                op.operation_id,
                kind="unknown",
                actor="finality",
                resolution=f"server reported the task {t.event.status} again; resumed as {op.state}",
                at=now,
            )
        for effect in t.effects:
            match effect:
                case OpenReconciliation(reason=reason):
                    self.ledger.open_reconciliation(
                        op,
                        kind="unknown",
                        reason=reason,
                        window_end=now,
                        candidates=self._mem(op).candidates,
                        at=now,
                    )
                case FlagEffectReconciliation(reason=reason):
                    self.ledger.open_reconciliation(op, kind="effects", reason=reason, window_end=now, at=now)
                case AwaitApproval():
                    request = self._mem(op).pending_input
                    self.ledger.open_approval(
                        op,
                        ApprovalRequest(
                            message=request.message if request else "input required",
                            requested_schema=request.requested_schema if request else {},
                            schema_digest=request.schema_digest if request else "",
                            deadline=self.approval_deadline(op, request),
                        ),
                        at=now,
                    )
                case _:
                    # Poll, FetchResult, Submit, LookUp, SendCancel, SendInput and AcceptTerminal are
                    # carried out by ``advance`` from the state they leave behind, so that a restart
                    # resumes them from the ledger alone.
                    pass

    def _hold(self, op: Operation, outcome: Outcome) -> None:
        self._mem(op).held = outcome
        self.ledger.hold_outcome(
            op.operation_id,
            HeldOutcome(
                status=outcome.status.value,
                digest=outcome.digest,
                payload=outcome.payload,
                task_id=outcome.task_id,
                epoch_echo=outcome.epoch_echo,
                held_at=self.clock.now(),
            ),
        )

    def approval_deadline(self, op: Operation, request: InputRequest | None) -> datetime | None:
        """When a person's answer stops being useful: the earliest of the request's own deadline,
        the server's expiry of the task and the end of the tool's wait budget (past any of them
        the answer can no longer reach a waiting server or a waiting caller)."""
        budget = self.wait_budgets.get(op.tool.name)
        ends = [
            request.deadline if request is not None else None,
            op.expires_at,
            wait_budget_end(op.created_at, budget) if budget is not None else None,
        ]
        known = [end for end in ends if end is not None]
        return min(known) if known else None


__all__ = [
    "DriverCore",
    "Memory",
    "Wake",
    "logger",
]
