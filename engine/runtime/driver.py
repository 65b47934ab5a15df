"""The async shell around the pure core: load an operation, talk to its server, ``step``, record.

A ``Driver`` advances one operation by one action at a time (``advance``) and says when it wants to
be woken next; ``finality call`` loops over one operation, the service's scheduler over thousands.
What to do is read from the operation's local state, so a restarted driver resumes any operation
from the ledger alone and never submits twice. It decides no state itself: every change goes
through ``engine.machine.step`` and then through the ledger (``accept_terminal`` for receipts).
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from engine.adapters.base import (
    Backend,
    CancelResult,
    Capabilities,
    Created,
    InputRequest,
    Json,
    Outcome,
    ServerView,
    SubmitRequest,
)
from engine.adapters.elicitation import answer_problem
from engine.clock import Clock
from engine.errors import (
    AnswerInvalid,
    BackendError,
    BackendRejected,
    BackendUnavailable,
    CancelNotAllowed,
    CancelUnsupported,
    DuplicateOperation,
    LeaseLost,
    NegotiationError,
    NotFoundOnServer,
    ProtocolViolation,
    ResubmitNotAllowed,
    StaleRound,
    StaleWrite,
)
from engine.ledger.port import HeldOutcome, PollRecord
from engine.machine import step
from engine.model import (
    RECEIPT_STATES,
    AcceptTerminal,
    AwaitApproval,
    CancelAcknowledged,
    CancelConfirmed,
    CancelRefusedTerminal,
    CancelRequested,
    Digest,
    Epoch,
    Event,
    FetchStarted,
    FlagEffectReconciliation,
    InlineResultReturned,
    InputAnswered,
    LocalState,
    LookupFound,
    LookupProvedAbsent,
    LookupUnavailable,
    NotFound,
    OpenReconciliation,
    Operation,
    Resubmitted,
    ResultRejected,
    ResultVerified,
    ServerStatus,
    StatusObserved,
    SubmissionLost,
    Submitted,
    TaskId,
    Transition,
)
from engine.runtime.epochs import urgent
from engine.runtime.limiter import Limiter
from engine.runtime.plan import Step, next_step
from engine.schedule import PollPolicy, poll_delay, retry_delay, wait_budget_end

logger = logging.getLogger(__name__)
S = LocalState
T = TypeVar("T")

MAX_FETCH_ATTEMPTS = 4
"""Fetches of one terminal result before a persistent failure goes to reconciliation."""
UNKNOWN_PROBE_INTERVAL = timedelta(seconds=30)

if TYPE_CHECKING:  # the port both ledgers (DuckDB, PostgreSQL) offer; imported for typing only
    from engine.ledger.port import LedgerPort


@dataclass
class _Memory:
    """What the driver remembers about one operation between actions (lost on restart, by design)."""

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
    """The server proved by the key that the submission never arrived (lost on restart: then the
    NOT_FOUND_SAFE operation waits for a person's resubmission instead)."""


@dataclass
class Wake:
    """The driver's answer to ``advance``: the operation now, and when to call again (None: parked)."""

    operation: Operation
    at: datetime | None


@dataclass
class Driver:
    """Drives operations of one server through one adapter."""

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
    _memory: dict[str, _Memory] = field(default_factory=dict)

    # ------------------------------------------------------------------------------ bookkeeping

    def _mem(self, op: Operation) -> _Memory:
        return self._memory.setdefault(op.operation_id, _Memory())

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
                        message=request.message if request else "input required",
                        requested_schema=request.requested_schema if request else {},
                        schema_digest=request.schema_digest if request else "",
                        deadline=self.approval_deadline(op, request),
                        at=now,
                    )
                case _:
                    # Poll, FetchResult, Submit, LookUp, SendCancel, SendInput and AcceptTerminal are
                    # carried out by ``advance`` from the state they leave behind, so that a restart
                    # resumes them from the ledger alone.
                    pass

    # -------------------------------------------------------------------------------- creating

    async def submit_new(self, op: Operation, arguments: Json) -> Wake:
        """Record a new operation (or find the call node's existing one) and send it once."""
        stored, created = self.ledger.create_operation(op, arguments)
        if created:
            self.mark_fresh(stored, arguments)
        return await self.advance(stored)

    # ------------------------------------------------------------------------------- advancing

    def _due(self, op: Operation, now: datetime) -> tuple[Step, datetime | None]:
        """The step due for ``op`` at ``now``, and its open round's deadline (INPUT_REQUIRED only)."""
        known = self._memory.get(op.operation_id)
        deadline = self.round_deadline(op) if op.state is S.INPUT_REQUIRED else None
        due = next_step(
            op,
            epoch=self.epoch,
            fresh_submit=known is not None and known.fresh_submit,
            cancel_sent=known.cancel_sent if known is not None else 0,
            proved_absent=known is not None and known.proved_absent,
            round_expired=deadline is not None and now >= deadline,
            can_cancel=self.can_cancel(),
        )
        return due, deadline

    def sends_nothing(self, op: Operation) -> bool:
        """Whether ``op``'s next action sends no request: starting the fetch, or verifying an
        outcome this driver already holds in memory (it came with the terminal status).

        Such an action needs nothing durable before it, so a scheduler may run it at once instead
        of waiting for the commit of the writes before it.
        """
        due, _ = self._due(op, self.clock.now())
        if due is Step.FETCH_START:
            return True
        if due is Step.FETCH:
            known = self._memory.get(op.operation_id)
            return known is not None and known.held is not None and not known.refetch
        return False

    async def advance(self, op: Operation) -> Wake:
        """Carry out the one action the operation's state calls for; say when to come back."""
        now = self.clock.now()
        due, deadline = self._due(op, now)
        if due is Step.FENCED:
            # Another executor epoch owns it; a fenced driver never talks to the server for it.
            # Every event below is stamped with ``self.epoch``, the epoch its request went out
            # under, so a reply that arrives after a rollback is fenced by ``step``.
            return Wake(op, None)
        mem = self._mem(op)
        try:
            match due:
                case Step.SUBMIT | Step.RESUME_SUBMITTING:
                    return await self._submit(op, mem)
                case Step.LOOK_UP:
                    return await self._look_up(op)
                case Step.RESUBMIT:
                    mem.proved_absent = False
                    op = self.commit(op, Resubmitted(self.epoch))
                    if op.state is S.SUBMITTING:
                        mem.fresh_submit = True
                    return Wake(op, now)
                case Step.POLL:
                    return await self._poll(op, mem)
                case Step.SEND_CANCEL:
                    return await self._send_cancel(op, mem)
                case Step.FETCH_START:
                    return Wake(self.commit(op, FetchStarted(self.epoch)), now)
                case Step.FETCH:
                    return await self._fetch(op, mem)
                case Step.PROBE:
                    return await self._probe_unknown(op)
                case Step.CANCEL_UNANSWERED:
                    reason = f"input round {op.input_round} unanswered by its deadline {deadline}"
                    return Wake(
                        self.commit(op, CancelRequested(op.cancel_generation + 1, "finality", reason)), now
                    )
                case Step.HAND_OVER_UNANSWERED:
                    capability = self.capabilities.cancel_capability if self.capabilities else "cancel"
                    self.ledger.open_reconciliation(
                        op,
                        kind="approval",
                        reason=(
                            f"input round {op.input_round} unanswered by its deadline {deadline}; not "
                            f"cancelled because the server does not declare {capability}"
                        ),
                        window_end=now,
                        at=now,
                    )
                    return Wake(op, None)
                case Step.WAIT:
                    # An open round wakes the operation at its deadline, when it moves on unanswered.
                    return Wake(op, deadline if deadline is not None and deadline > now else None)
                case Step.DONE:
                    self.forget(op)
                    return Wake(op, None)
            raise AssertionError(f"no action for {due}")  # unreachable: every Step is handled above
        except BackendUnavailable as exc:
            mem.failures += 1
            delay = retry_delay(self.policy, mem.failures, exc.retry_after, self.rng)
            # Retry-After counts from when the refusal arrived, not from before the request went out
            # (found by tests/integration: counting from ``now`` re-polled up to one round trip early).
            return Wake(op, self.clock.now() + delay)
        except StaleWrite:
            fresh = self.ledger.get(op.operation_id)
            return Wake(fresh or op, now)

    async def _submit(self, op: Operation, mem: _Memory) -> Wake:
        now = self.clock.now()
        if not mem.fresh_submit:
            # Found in SUBMITTING without having sent it in this process: the request may or may
            # not have reached the server. Never send it blindly again; look it up by key.
            return Wake(
                self.commit(op, SubmissionLost(self.epoch, "executor restarted while submitting")), now
            )
        mem.fresh_submit = False
        arguments = self._arguments(op)
        try:
            result = await self._request(
                op, "submit", lambda: self.backend.submit(SubmitRequest(op, arguments, self.ttl))
            )
        except (BackendUnavailable, ProtocolViolation) as exc:
            return Wake(
                self.commit(op, SubmissionLost(self.epoch, f"no usable reply to the submission: {exc}")), now
            )
        except BackendRejected as exc:
            return Wake(self.commit(op, SubmissionLost(self.epoch, f"submission refused: {exc}")), now)
        if isinstance(result, Created):
            try:
                op = self.commit(op, Submitted(result.view.task_id, self.epoch, result.view.expires_at))
            except DuplicateOperation as exc:
                # The server handed out a task id that already belongs to another call: never
                # adopt another request's task.
                return Wake(self.task_reused(op, result.view.task_id, str(exc)), None)
            return self._apply_view(op, mem, result.view)
        self._hold(op, result.outcome)
        return Wake(self.commit(op, InlineResultReturned(result.outcome.status, self.epoch)), now)

    def task_reused(self, op: Operation, task_id: TaskId, why: str) -> Operation:
        op = self.commit(
            op, SubmissionLost(self.epoch, f"server returned task id {task_id} already bound: {why}")
        )
        return self.commit(
            op, LookupUnavailable(self.epoch, f"server reused task id {task_id} for another request")
        )

    async def _look_up(self, op: Operation) -> Wake:
        now = self.clock.now()
        mem = self._mem(op)
        arguments = self._arguments(op)
        try:
            view = await self._request(op, "lookup", lambda: self.backend.look_up(op, arguments))
        except (NegotiationError, BackendRejected, ProtocolViolation) as exc:
            candidates: list[TaskId] = []
            with contextlib.suppress(BackendError, NegotiationError):
                candidates = await self._request(op, "list", lambda: self.backend.candidates(op))
            reason = f"cannot look the submission up by key ({exc}); find it by key, digest and time window"
            mem.candidates = candidates
            return Wake(self.commit(op, LookupUnavailable(self.epoch, reason)), None)
        if view is None:
            op = self.commit(op, LookupProvedAbsent(self.epoch))
            mem.proved_absent = op.state is S.NOT_FOUND_SAFE
            return Wake(op, now)
        try:
            op = self.commit(op, LookupFound(view.task_id, self.epoch))
        except DuplicateOperation as exc:
            return Wake(self.task_reused(op, view.task_id, str(exc)), None)
        return self._apply_view(op, mem, view)

    async def _poll(self, op: Operation, mem: _Memory) -> Wake:
        if mem.resend_input and op.state is S.WORKING:
            mem.resend_input = False
            try:
                await self.send_answer(op)
            except BackendRejected as exc:
                # The server asks something else now: the stored answer belongs to its own question only.
                logger.warning("operation %s: answer not sent again: %s", op.operation_id, exc)
        try:
            view = await self._request(op, "get", lambda: self.backend.get(op))
        except NotFoundOnServer:
            mem.failures = 0
            return Wake(self.commit(op, NotFound(self.epoch)), self.clock.now())
        except ProtocolViolation as exc:
            # A malformed or foreign reply says nothing about the task: back off and ask again.
            mem.failures += 1
            logger.warning("operation %s: unusable status reply: %s", op.operation_id, exc)
            return Wake(op, self.clock.now() + retry_delay(self.policy, mem.failures, None, self.rng))
        mem.failures = 0
        return self._apply_view(op, mem, view)

    def _apply_view(self, op: Operation, mem: _Memory, view: ServerView) -> Wake:
        now = self.clock.now()
        mem.advised = view.poll_interval or mem.advised
        if view.outcome is not None and view.status.terminal:
            self._hold(op, view.outcome)
        if view.input_request is not None:
            mem.pending_input = view.input_request
        elif view.status is ServerStatus.INPUT_REQUIRED and op.state is not S.CANCEL_REQUESTED:
            # Found by tests/integration (input_replayed on 2025-11-25): the server said input_required
            # but its request did not reach us (a replay of the answered round went to the old result
            # stream). Without a request key the machine cannot tell a replay from a new round, and
            # opened a phantom round 2 whose answer went nowhere. Never hand a person a question we do
            # not have: ask again soon, and open a round only once its request has arrived.
            logger.warning("operation %s: input_required without a request yet; polling", op.operation_id)
            return Wake(op, now + poll_delay(self.policy, mem.advised, self.rng))
        answered_before = op.answered_round == op.input_round and op.input_round > 0
        replay = (
            view.status is ServerStatus.INPUT_REQUIRED
            and answered_before
            and view.input_request is not None
            and view.input_request.key == op.input_request_key
        )
        event = StatusObserved(
            view.task_id,
            view.status,
            self.epoch,
            poll_cursor=view.cursor,
            input_request_key=view.input_request.key if view.input_request else None,
            expires_at=view.expires_at,
            result_held=view.outcome is not None,
        )
        op = self.commit(op, event)
        if replay and mem.input_resends < 3:
            # The server shows the round we answered: our answer may not have arrived. Servers
            # ignore stale or repeated keys, so sending the stored answer again is safe.
            mem.input_resends += 1
            mem.resend_input = True
        if op.state in (S.TERMINAL_OBSERVED, S.FETCHING_RESULT, S.CANCELLED_ACCEPTED, S.ACCEPTED):
            return Wake(op, now if op.state not in RECEIPT_STATES else None)
        if op.state is S.INPUT_REQUIRED:
            # Woken at the round's deadline: unanswered by then, it moves on (``next_step``).
            return Wake(op, self.approval_deadline(op, mem.pending_input))
        if op.state is S.UNKNOWN:
            return Wake(op, None)
        return Wake(op, now + poll_delay(self.policy, mem.advised, self.rng))

    async def _send_cancel(self, op: Operation, mem: _Memory) -> Wake:
        now = self.clock.now()
        generation = op.cancel_generation
        try:
            result = await self._request(op, "cancel", lambda: self.backend.cancel(op))
        except NotFoundOnServer:
            mem.cancel_sent = generation
            return Wake(self.commit(op, NotFound(self.epoch)), now)
        except (BackendRejected, ProtocolViolation, NegotiationError) as exc:
            # The request did not take (or can never be sent: no cancel capability, recorded before
            # this driver knew); polling carries the operation to its real terminal state.
            logger.warning("operation %s: cancel not accepted: %s", op.operation_id, exc)
            mem.cancel_sent = generation
            return Wake(op, now + poll_delay(self.policy, mem.advised, self.rng))
        except BackendUnavailable as exc:
            # The acknowledgement may be lost after the server cancelled: poll to find out, and
            # send the cancel again later (cancel_sent stays behind the generation).
            mem.failures += 1
            # From the failure, not from before the request (see ``advance``).
            return Wake(
                op, self.clock.now() + retry_delay(self.policy, mem.failures, exc.retry_after, self.rng)
            )
        mem.cancel_sent = generation
        task = op.task_id or TaskId("")
        match result:
            case CancelResult.CONFIRMED:
                op = self.commit(op, CancelConfirmed(task, generation, self.epoch))
                if op.state is S.CANCELLED_ACCEPTED:
                    await self._audit_after_cancel(op)
                    return Wake(op, None)
                return Wake(op, now)
            case CancelResult.ACKNOWLEDGED:
                op = self.commit(op, CancelAcknowledged(task, generation, self.epoch))
            case CancelResult.ALREADY_TERMINAL:
                op = self.commit(op, CancelRefusedTerminal(task, generation, self.epoch))
        return Wake(op, now)

    async def _audit_after_cancel(self, op: Operation) -> None:
        """Read what the cancelled task left, for the audit trail only (never a success payload)."""
        try:
            outcome = await self._request(op, "result-audit", lambda: self.backend.fetch_result(op))
        except (BackendError, NegotiationError):
            return
        self.ledger.attach_audit_result(op, "result-after-cancel", outcome.payload, self.clock.now())
        if outcome.status is ServerStatus.COMPLETED:
            self.commit(op, StatusObserved(op.task_id or TaskId(""), ServerStatus.COMPLETED, self.epoch))

    async def _fetch(self, op: Operation, mem: _Memory) -> Wake:
        now = self.clock.now()
        outcome: Outcome | None = None if mem.refetch else mem.held
        use_ledger_copy = outcome is None and op.result_held and not mem.refetch
        held = self.ledger.held_outcome(op.operation_id) if use_ledger_copy else None
        if held is not None:
            outcome = Outcome(
                status=ServerStatus(held.status),
                payload=held.payload,
                digest=Digest(held.digest),
                task_id=TaskId(held.task_id) if held.task_id else None,
                epoch_echo=held.epoch_echo,
            )
        if outcome is None:
            try:
                outcome = await self._request(op, "result", lambda: self.backend.fetch_result(op))
            except NotFoundOnServer:
                return Wake(self.commit(op, NotFound(self.epoch)), now)
            except ProtocolViolation as exc:
                mem.fetch_attempts += 1
                if mem.fetch_attempts >= MAX_FETCH_ATTEMPTS:
                    mem.fetch_attempts = 0  # a person's retry later gets its own attempts
                    return Wake(self.commit(op, ResultRejected(str(exc), self.epoch)), None)
                return Wake(op, now + retry_delay(self.policy, mem.fetch_attempts, None, self.rng))
        echo = Epoch(outcome.epoch_echo) if outcome.epoch_echo is not None else None
        # The event carries this driver's epoch and the server's echo side by side; ``step`` fences
        # on both, so an echo never stands in for the epoch the request went out under.
        event = ResultVerified(
            outcome.task_id or op.task_id, outcome.status, outcome.digest, self.epoch, epoch_echo=echo
        )
        t = step(op, event, now)
        if not t.accepted:
            mem.fetch_attempts += 1
            self.ledger.apply(t)  # recorded as rejected, with its reason (a stale epoch is fenced here)
            # A held copy that was refused is never offered again: ask the server afresh.
            mem.refetch = True
            mem.held = None
            if echo is not None and echo != self.epoch and mem.fetch_attempts < MAX_FETCH_ATTEMPTS:
                return Wake(op, now + retry_delay(self.policy, mem.fetch_attempts, None, self.rng))
            mem.fetch_attempts = 0  # a person's retry later gets its own attempts
            return Wake(self.commit(op, ResultRejected(t.reason, self.epoch, outcome.digest)), None)
        op = self.commit(op, event, payload=outcome.payload)
        self.forget(op)
        return Wake(op, None)

    async def _probe_unknown(self, op: Operation) -> Wake:
        now = self.clock.now()
        try:
            view = await self._request(op, "get", lambda: self.backend.get(op))
        except (NotFoundOnServer, ProtocolViolation, BackendRejected):
            return Wake(op, now + UNKNOWN_PROBE_INTERVAL)
        return self._apply_view(op, self._mem(op), view)

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

    # -------------------------------------------------------------------------- person actions

    def request_cancel(
        self, op: Operation, *, actor: str, reason: str, current: Operation | None = None
    ) -> Operation:
        """Raise the cancel generation by compare-and-swap and record CANCEL_REQUESTED.

        The protocol request goes out on the operation's next ``advance``, never before this is
        recorded. ``current`` is the operation's row as the caller has just read it from this
        driver's ledger (a batch of cancels reads them together); otherwise it is read here.

        Raises:
            CancelUnsupported: the server declared no cancel capability; nothing was recorded.
            CancelNotAllowed: the state allows no cancel.
        """
        if current is None:
            current = self.ledger.get(op.operation_id) or op
        self.check_cancel(current)
        after = self.commit(current, CancelRequested(current.cancel_generation + 1, actor, reason))
        if after.cancel_generation == current.cancel_generation:
            raise CancelNotAllowed(f"cannot cancel operation {op.operation_id} in {current.state}")
        return after

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

    def round_deadline(self, op: Operation) -> datetime | None:
        """The open round's deadline as the ledger records it (``None`` when it has none, or it
        is closed: an expired round's deadline stays its deadline)."""
        approval = self.ledger.approval(op.operation_id, op.input_round)
        if approval is None or approval["status"] not in ("pending", "expired"):
            return None
        deadline = approval.get("deadline")
        return deadline if isinstance(deadline, datetime) else None

    def check_answer(self, op: Operation, input_round: int, answer: Json) -> None:
        """Refuse an answer for a round that is no longer answerable, or that does not fit the
        schema the round requested. Nothing is recorded or sent when it refuses.

        Raises:
            StaleRound: the round is closed, or its deadline has passed (then it is closed as
                expired here, so the refusal and the record agree).
            AnswerInvalid: naming the failing field.
        """
        approval = self.ledger.approval(op.operation_id, input_round)
        if approval is None:
            return  # a round opened before approvals were recorded: nothing to check against
        if approval["status"] != "pending":
            reason = approval.get("closed_reason") or approval["status"]
            raise StaleRound(f"round {input_round} of {op.operation_id} is {approval['status']} ({reason})")
        deadline = approval.get("deadline")
        now = self.clock.now()
        if isinstance(deadline, datetime) and now >= deadline:
            self.ledger.close_rounds(now)
            raise StaleRound(f"round {input_round} of {op.operation_id} expired at {deadline.isoformat()}")
        raw = approval.get("requested_schema")
        schema = json.loads(raw) if isinstance(raw, str) else raw
        if isinstance(schema, dict):
            problem = answer_problem(schema, answer)
            if problem is not None:
                raise AnswerInvalid(*problem)

    def resubmit(self, op: Operation, *, actor: str, reason: str) -> Operation:
        """A person's decision to submit again under the same key, after they declared it absent.

        Recorded (actor and reason in the transition) before anything is sent; the submission goes
        out on the operation's next ``advance``.

        Raises:
            ResubmitNotAllowed: the operation is not NOT_FOUND_SAFE.
        """
        current = self.ledger.get(op.operation_id) or op
        if current.state is not S.NOT_FOUND_SAFE:
            raise ResubmitNotAllowed(f"operation {op.operation_id} is {current.state}, not NOT_FOUND_SAFE")
        after = self.commit(current, Resubmitted(self.epoch, actor=actor, reason=reason))
        if after.state is not S.SUBMITTING:
            raise ResubmitNotAllowed(f"operation {op.operation_id} could not be resubmitted")
        self.mark_fresh(after)
        return after

    def can_cancel(self) -> bool:
        """Whether the server can take a cancel (unknown until negotiated: then assumed)."""
        return self.capabilities is None or self.capabilities.cancel

    def check_cancel(self, op: Operation) -> None:
        """Refuse, before anything is recorded, a cancel the server has no way to receive.

        Raises:
            CancelUnsupported: naming the capability the server would have to declare.
        """
        if not self.can_cancel():
            assert self.capabilities is not None
            raise CancelUnsupported(op.operation_id, op.server, self.capabilities.cancel_capability)

    async def answer(self, op: Operation, *, input_round: int, answer: Json, actor: str) -> Operation:
        """Answer an input round: bound to the operation and round, then sent to the server.

        Raises:
            StaleRound: the round is not the open one (already answered, or replaced).
            AnswerInvalid: the answer does not fit the schema the server requested (the failing
                field named); nothing is recorded or sent.
        """
        after = self.record_answer(op, input_round=input_round, answer=answer, actor=actor)
        await self.send_answer(after)
        return after

    def record_answer(self, op: Operation, *, input_round: int, answer: Json, actor: str) -> Operation:
        """Bind the answer to the operation and its open round in the ledger; nothing is sent.

        The operation's holder sends it (``answer`` does both when this process holds it; another
        executor's holder sends it on its next poll, see ``answered_elsewhere``).

        Raises:
            StaleRound: the round is not the open one (already answered, or replaced).
            AnswerInvalid: the answer does not fit the requested schema; nothing is recorded.
        """
        current = self.ledger.get(op.operation_id) or op
        if current.state is not S.INPUT_REQUIRED or current.input_round != input_round:
            raise StaleRound(f"round {input_round} of {op.operation_id} is not open")
        if not self._answer_recorded(current, input_round, answer, actor):
            self.check_answer(current, input_round, answer)
            if not self.ledger.record_answer(op.operation_id, input_round, answer, actor, self.clock.now()):
                raise StaleRound(f"round {input_round} of {op.operation_id} is not pending")
        after = self.commit(current, InputAnswered(input_round, actor))
        if after.state is not S.WORKING:
            raise StaleRound(f"round {input_round} of {op.operation_id} could not be answered")
        return after

    def _answer_recorded(self, op: Operation, input_round: int, answer: Json, actor: str) -> bool:
        """Whether this very answer is already stored for the round while ``op`` still waits at it.

        The answer's row and the operation's transition are two writes: when the transition is
        refused (a fenced write refused for an epoch a rollback raised), the holder adopts the
        operation and takes the same answer again, and only the transition remains to record.
        """
        row = self.ledger.approval(op.operation_id, input_round)
        return (
            row is not None
            and row.get("status") == "answered"
            and row.get("actor") == actor
            and self.ledger.answer_of(op.operation_id, input_round) == answer
        )

    def answered_elsewhere(self, op: Operation) -> None:
        """Another process recorded the answer of ``op``'s round: send it before the next poll."""
        self._mem(op).resend_input = True

    async def send_answer(self, op: Operation) -> None:
        answer = self.ledger.answer_of(op.operation_id, op.answered_round)
        if answer is None or op.input_request_key is None:
            return
        key = op.input_request_key
        # A person's answer is the content of an accepted elicitation unless it says otherwise.
        response: Json = answer if "action" in answer else {"action": "accept", "content": answer}
        await self._request(op, "input", lambda: self.backend.answer_input(op, key, response))


__all__ = [
    "MAX_FETCH_ATTEMPTS",
    "UNKNOWN_PROBE_INTERVAL",
    "Driver",
    "Wake",
]
