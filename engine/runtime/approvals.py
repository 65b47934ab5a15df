"""Input rounds: a person's answer checked, bound to its round, and sent to the server.

``Approvals`` refuses an answer that can no longer be used (a closed or expired round, or one that
does not fit the schema the server asked for) before anything is recorded, records the answer and the
transition, and sends it (again when another process recorded it, or when the server shows the
answered round again). It must not decide a state: the answer becomes ``InputAnswered`` through
``DriverCore.commit``.
"""

from __future__ import annotations

import json
from datetime import datetime

from engine.adapters.base import Json
from engine.adapters.elicitation import answer_problem
from engine.errors import AnswerInvalid, StaleRound
from engine.model import InputAnswered, LocalState, Operation
from engine.runtime.recording import DriverCore


class Approvals(DriverCore):
    """A driver's input rounds: a person's answer checked, recorded and sent."""

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
        if current.state is not LocalState.INPUT_REQUIRED or current.input_round != input_round:
            raise StaleRound(f"round {input_round} of {op.operation_id} is not open")
        if not self._answer_recorded(current, input_round, answer, actor):
            self.check_answer(current, input_round, answer)
            if not self.ledger.record_answer(op.operation_id, input_round, answer, actor, self.clock.now()):
                raise StaleRound(f"round {input_round} of {op.operation_id} is not pending")
        after = self.commit(current, InputAnswered(input_round, actor))
        if after.state is not LocalState.WORKING:
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
    "Approvals",
]
