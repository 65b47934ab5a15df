"""Reading an operation's task: status polls, the result fetch, and probes of an UNKNOWN task.

``Polling`` reads what the server says about a task, turns the view into ``StatusObserved`` (holding
a terminal outcome that came with it, opening an input round only once its request has arrived),
fetches and verifies the terminal result (``ResultVerified``, fenced by epoch and digest in
``machine.step``), and backs off on unusable replies. It must not submit or cancel; those are
``submission`` and ``cancelling``.
"""

from __future__ import annotations

from datetime import timedelta

from engine.adapters.base import Outcome, ServerView
from engine.errors import BackendRejected, NotFoundOnServer, ProtocolViolation
from engine.machine import step
from engine.model import (
    RECEIPT_STATES,
    Digest,
    Epoch,
    LocalState,
    NotFound,
    Operation,
    ResultRejected,
    ResultVerified,
    ServerStatus,
    StatusObserved,
    TaskId,
)
from engine.runtime.approvals import Approvals
from engine.runtime.recording import Memory, Wake, logger
from engine.schedule import poll_delay, retry_delay

S = LocalState

MAX_FETCH_ATTEMPTS = 4
"""Fetches of one terminal result before a persistent failure goes to reconciliation."""
UNKNOWN_PROBE_INTERVAL = timedelta(seconds=30)


class Polling(Approvals):
    """A driver's reads of a task: polls, the result fetch, probes of an UNKNOWN task."""

    async def _poll(self, op: Operation, mem: Memory) -> Wake:
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

    def _apply_view(self, op: Operation, mem: Memory, view: ServerView) -> Wake:
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

    async def _fetch(self, op: Operation, mem: Memory) -> Wake:
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


__all__ = [
    "MAX_FETCH_ATTEMPTS",
    "UNKNOWN_PROBE_INTERVAL",
    "Polling",
]
