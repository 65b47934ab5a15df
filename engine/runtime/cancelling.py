"""Cancels: a person's request recorded first, then sent, and what the server answered recorded.

``Cancelling`` refuses a cancel the server cannot receive before anything is recorded, raises the
cancel generation by compare-and-swap (``request_cancel``), sends the cancel on the next ``advance``
and records the server's answer (confirmed, acknowledged, already terminal), reading what a cancelled
task left for the audit trail only. It must not read results as success payloads.
"""

from __future__ import annotations

from engine.adapters.base import CancelResult
from engine.errors import (
    BackendError,
    BackendRejected,
    BackendUnavailable,
    CancelNotAllowed,
    CancelUnsupported,
    NegotiationError,
    NotFoundOnServer,
    ProtocolViolation,
)
from engine.model import (
    CancelAcknowledged,
    CancelConfirmed,
    CancelRefusedTerminal,
    CancelRequested,
    LocalState,
    NotFound,
    Operation,
    ServerStatus,
    StatusObserved,
    TaskId,
)
from engine.runtime.recording import DriverCore, Memory, Wake, logger
from engine.schedule import poll_delay, retry_delay


class Cancelling(DriverCore):
    """A driver's cancels: checked, recorded, sent, and their answers recorded."""

    async def _send_cancel(self, op: Operation, mem: Memory) -> Wake:
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
                if op.state is LocalState.CANCELLED_ACCEPTED:
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


__all__ = [
    "Cancelling",
]
