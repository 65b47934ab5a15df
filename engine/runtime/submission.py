"""Submissions: sending an operation once, finding a lost one by its key, and a person's resubmission.

``Submission`` sends a SUBMITTING operation only when this very process recorded it and has not sent
it yet; otherwise (a restart, a lost reply) it looks the submission up by its key and never sends
blindly again. It refuses a task id the server already gave another call, and records a person's
resubmission before anything goes out. Reading the task afterwards is ``polling``'s.
"""

from __future__ import annotations

import contextlib

from engine.adapters.base import Created, SubmitRequest
from engine.errors import (
    BackendError,
    BackendRejected,
    BackendUnavailable,
    DuplicateOperation,
    NegotiationError,
    ProtocolViolation,
    ResubmitNotAllowed,
)
from engine.model import (
    InlineResultReturned,
    LocalState,
    LookupFound,
    LookupProvedAbsent,
    LookupUnavailable,
    Operation,
    Resubmitted,
    SubmissionLost,
    Submitted,
    TaskId,
)
from engine.runtime.polling import Polling
from engine.runtime.recording import Memory, Wake


class Submission(Polling):
    """A driver's submissions: sent once, looked up by key when lost, resubmitted by a person."""

    async def _submit(self, op: Operation, mem: Memory) -> Wake:
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
            mem.proved_absent = op.state is LocalState.NOT_FOUND_SAFE
            return Wake(op, now)
        try:
            op = self.commit(op, LookupFound(view.task_id, self.epoch))
        except DuplicateOperation as exc:
            return Wake(self.task_reused(op, view.task_id, str(exc)), None)
        return self._apply_view(op, mem, view)

    def proof_of_absence(self, op: Operation) -> bool:
        """Whether the server itself proved ``op`` absent by its key (so this driver may resubmit).

        Remembered by the process that made the lookup; a restarted process finds it in the
        ledger's log: the transition that last entered NOT_FOUND_SAFE is the server's proof
        (``LookupProvedAbsent``), not a person's "absent" (``Reconciled``), which waits for that
        person's resubmission. Without this a proof made just before a restart left the operation
        waiting for a person nobody told (the explorer's ``crash-after-proved-absent``).
        """
        known = self._memory.get(op.operation_id)
        if known is not None and known.proved_absent:
            return True
        if op.state is not LocalState.NOT_FOUND_SAFE:
            return False
        entered = [
            row
            for row in self.ledger.transitions(op.operation_id)
            if row["accepted"] and row["to_state"] == LocalState.NOT_FOUND_SAFE.value
        ]
        proved = bool(entered) and entered[-1]["event"] == LookupProvedAbsent.__name__
        if proved:
            self._mem(op).proved_absent = True
        return proved

    def resubmit(self, op: Operation, *, actor: str, reason: str) -> Operation:
        """A person's decision to submit again under the same key, after they declared it absent.

        Recorded (actor and reason in the transition) before anything is sent; the submission goes
        out on the operation's next ``advance``.

        Raises:
            ResubmitNotAllowed: the operation is not NOT_FOUND_SAFE.
        """
        current = self.ledger.get(op.operation_id) or op
        if current.state is not LocalState.NOT_FOUND_SAFE:
            raise ResubmitNotAllowed(f"operation {op.operation_id} is {current.state}, not NOT_FOUND_SAFE")
        after = self.commit(current, Resubmitted(self.epoch, actor=actor, reason=reason))
        if after.state is not LocalState.SUBMITTING:
            raise ResubmitNotAllowed(f"operation {op.operation_id} could not be resubmitted")
        self.mark_fresh(after)
        return after


__all__ = [
    "Submission",
]
