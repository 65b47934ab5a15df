"""The async shell around the pure core: load an operation, talk to its server, ``step``, record.

A ``Driver`` advances one operation by one action at a time (``advance``) and says when it wants to
be woken next; ``finality call`` loops over one operation, the service's scheduler over thousands.
What to do is read from the operation's local state, so a restarted driver resumes any operation
from the ledger alone and never submits twice. It decides no state itself: every change goes
through ``engine.machine.step`` and then through the ledger (``accept_terminal`` for receipts).

The concerns live in their own modules, each a layer of ``Driver``: ``recording`` (memory, requests,
commit), ``submission``, ``polling`` (status and result), ``cancelling`` and ``approvals``; this
module holds ``advance``, which carries out the step ``plan.next_step`` names.
"""

from __future__ import annotations

from datetime import datetime

from engine.adapters.base import Json
from engine.errors import BackendUnavailable, StaleWrite
from engine.model import RECEIPT_STATES, CancelRequested, FetchStarted, LocalState, Operation, Resubmitted
from engine.runtime.cancelling import Cancelling
from engine.runtime.plan import Step, next_step
from engine.runtime.polling import MAX_FETCH_ATTEMPTS, UNKNOWN_PROBE_INTERVAL
from engine.runtime.recording import Wake
from engine.runtime.submission import Submission
from engine.schedule import retry_delay

S = LocalState


class Driver(Submission, Cancelling):
    """Drives operations of one server through one adapter."""

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
            proved_absent=op.state is S.NOT_FOUND_SAFE and self.proof_of_absence(op),
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
        wake = await self._act(op)
        if wake.operation.state in RECEIPT_STATES:
            # A receipt ends the operation: nothing remembered of it is needed again. The cancel
            # path and a terminal status answered by a poll reach it without passing ``Step.DONE``,
            # and a service that kept their memory (arguments included) grew with every operation
            # it had ever driven, not with the ones in flight.
            self.forget(wake.operation)
        return wake

    async def _act(self, op: Operation) -> Wake:
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
                    return Wake(op, None)  # (forgotten by ``advance``, as every receipt is)
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


__all__ = [
    "MAX_FETCH_ATTEMPTS",
    "UNKNOWN_PROBE_INTERVAL",
    "Driver",
    "Wake",
]
