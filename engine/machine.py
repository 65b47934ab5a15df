"""The one transition function: ``step(operation, event, now) -> Transition``.

Every state change of an operation is decided here and nowhere else. Pure: no I/O, no clock, no
randomness. An event that the seed's diagram does not allow in the current state leaves the
operation unchanged and comes back as a rejected transition with its reason, to be recorded.

Arrows (the seed's diagram, plus the few the expiry/404 and inline-result rules need)::

    SUBMITTING -> WORKING <-> INPUT_REQUIRED
    SUBMITTING -> SUBMISSION_UNKNOWN -> WORKING | NOT_FOUND_SAFE
    WORKING | INPUT_REQUIRED -> CANCEL_REQUESTED
    WORKING | INPUT_REQUIRED -> TERMINAL_OBSERVED
    TERMINAL_OBSERVED -> FETCHING_RESULT -> ACCEPTED
    CANCEL_REQUESTED -> CANCELLED_ACCEPTED | TERMINAL_OBSERVED
    --- additions ---
    SUBMITTING -> TERMINAL_OBSERVED                  the server answered inline (no task) or refused
    SUBMISSION_UNKNOWN -> UNKNOWN                     no key lookup: a person must find it
    NOT_FOUND_SAFE | NEVER_CREATED -> SUBMITTING      resubmit under the SAME key: by the driver only
                                                      after the server's proof by key, otherwise only
                                                      as a person's action (``Resubmitted.actor``)
    (any with a server id) -> NEVER_CREATED | EXPIRED_WITH_RECEIPT | UNKNOWN     on "not found"
    EXPIRED_WITH_RECEIPT -> FETCHING_RESULT          the held outcome may still be accepted
    FETCHING_RESULT -> UNKNOWN                        the result failed verification
    UNKNOWN -> WORKING | INPUT_REQUIRED | CANCEL_REQUESTED | TERMINAL_OBSERVED | NOT_FOUND_SAFE
                                                      the server reappeared, or a person reconciled

ACCEPTED and CANCELLED_ACCEPTED hold a receipt and absorb everything; a completion that arrives
after CANCELLED_ACCEPTED only raises the effect-reconciliation flag.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import assert_never

from engine.model import (
    RECEIPT_STATES,
    AcceptTerminal,
    AwaitApproval,
    CancelAcknowledged,
    CancelConfirmed,
    CancelRefusedTerminal,
    CancelRequested,
    Effect,
    EpochRaised,
    Event,
    FetchResult,
    FetchStarted,
    FlagEffectReconciliation,
    InlineResultReturned,
    InputAnswered,
    LocalState,
    LookUp,
    LookupFound,
    LookupProvedAbsent,
    LookupUnavailable,
    NotFound,
    OpenReconciliation,
    Operation,
    Poll,
    Receipt,
    Reconciled,
    Resubmitted,
    ResultRejected,
    ResultVerified,
    SendCancel,
    SendInput,
    ServerStatus,
    StatusObserved,
    SubmissionLost,
    Submit,
    Submitted,
    TaskId,
    Transition,
)

S = LocalState

_HAS_SERVER_ID = frozenset(
    {S.WORKING, S.INPUT_REQUIRED, S.CANCEL_REQUESTED, S.TERMINAL_OBSERVED, S.FETCHING_RESULT}
)


def _ok(
    op: Operation,
    event: Event,
    now: datetime,
    after: Operation,
    effects: tuple[Effect, ...] = (),
    reason: str = "",
) -> Transition:
    if after != op:
        after = replace(after, updated_at=now, row_version=op.row_version + 1)
    return Transition(
        before=op, after=after, event=event, effects=effects, accepted=True, reason=reason, at=now
    )


def _moved(
    op: Operation,
    event: Event,
    now: datetime,
    changes: Mapping[str, object],
    effects: tuple[Effect, ...] = (),
    reason: str = "",
) -> Transition:
    """``_ok`` for an ``after`` given as the fields it changes: the new value is made in one copy,
    stamped as it is made (the copies were three quarters of ``step``'s time, two or three a change).
    No copy at all when every field already holds its value."""
    if any(getattr(op, name) != value for name, value in changes.items()):
        after = replace(op, **changes, updated_at=now, row_version=op.row_version + 1)  # type: ignore[arg-type]
        return Transition(
            before=op, after=after, event=event, effects=effects, accepted=True, reason=reason, at=now
        )
    return Transition(before=op, after=op, event=event, effects=effects, accepted=True, reason=reason, at=now)


def _reject(op: Operation, event: Event, now: datetime, reason: str) -> Transition:
    return Transition(before=op, after=op, event=event, effects=(), accepted=False, reason=reason, at=now)


def _still(op: Operation, event: StatusObserved, now: datetime) -> Transition:
    """The server says again what ``op`` holds (``_observed`` finds nothing new): poll on, unlogged.

    Accepted against ``op`` only: the ledger still compares it with the row, so a reply that is late
    for a row another writer moved is refused, and the retry against that row decides it afresh."""
    return Transition(
        before=op, after=op, event=event, effects=(Poll(),), accepted=True, reason="", at=now, logged=False
    )


def _event_epoch(event: Event) -> int | None:
    match event:
        case InputAnswered() | CancelRequested() | Reconciled() | EpochRaised():
            return None
        case _:
            return event.epoch


def _event_task(event: Event) -> TaskId | None:
    match event:
        case StatusObserved() | CancelConfirmed() | CancelAcknowledged() | CancelRefusedTerminal():
            return event.task_id
        case ResultVerified():
            return event.task_id
        case _:
            return None


def _receipt(op: Operation, now: datetime, *, status: ServerStatus, evidence: str | None = None) -> Receipt:
    return Receipt(
        call_node_id=op.call_node_id,
        operation_id=op.operation_id,
        request_digest=op.request_digest,
        task_id=op.task_id,
        tool_version=op.tool.version,
        epoch=op.epoch,
        cancel_generation=op.cancel_generation,
        status=status,
        result_digest=op.result_digest,
        accepted_at=now,
        cancel_evidence=evidence,
    )


def _accept_cancel(op: Operation, event: Event, now: datetime, evidence: str) -> Transition:
    after = replace(op, state=S.CANCELLED_ACCEPTED, server_status=ServerStatus.CANCELLED)
    effects: list[Effect] = [
        AcceptTerminal(_receipt(after, now, status=ServerStatus.CANCELLED, evidence=evidence))
    ]
    if op.tool.side_effects:
        # The work may have run partly before it stopped; only a person can say what it changed.
        after = replace(after, effect_reconciliation_required=True)
        effects.append(FlagEffectReconciliation("cancel won while a side-effecting tool may have run"))
    return _ok(op, event, now, after, tuple(effects), reason=evidence)


def _not_found(op: Operation, event: NotFound, now: datetime) -> Transition:
    if event.proved_never_created:
        return _ok(
            op, event, now, replace(op, state=S.NEVER_CREATED), reason="server proved it was never created"
        )
    expired = op.expires_at is not None and now >= op.expires_at
    when = "after expiry" if expired else "before expiry"
    if op.server_status is not None and op.server_status.terminal and op.result_held:
        return _ok(
            op,
            event,
            now,
            replace(op, state=S.EXPIRED_WITH_RECEIPT),
            (FetchResult(),),
            reason=f"not found {when}; the terminal outcome is held",
        )
    reason = f"not found {when} without a held outcome"
    return _ok(op, event, now, replace(op, state=S.UNKNOWN), (OpenReconciliation(reason),), reason=reason)


def _observed(op: Operation, ev: StatusObserved) -> dict[str, object]:
    """The fields a status report changes in ``op``; none when it says nothing new."""
    news: dict[str, object] = {}
    if ev.status is not op.server_status:
        news["server_status"] = ev.status
    if ev.poll_cursor is not None and ev.poll_cursor != op.poll_cursor:
        news["poll_cursor"] = ev.poll_cursor
    if ev.expires_at is not None and ev.expires_at != op.expires_at:
        news["expires_at"] = ev.expires_at
    if ev.status.terminal and ev.result_held != op.result_held:
        news["result_held"] = ev.result_held
    return news


def _observe(op: Operation, ev: StatusObserved) -> Operation:
    """``op`` with what the status report says; ``op`` itself when it says nothing new."""
    news = _observed(op, ev)
    return replace(op, **news) if news else op  # type: ignore[arg-type]


def _status_while_running(op: Operation, ev: StatusObserved, now: datetime) -> Transition:
    """WORKING or INPUT_REQUIRED (or UNKNOWN with a server id) meets a status report."""
    news = _observed(op, ev)
    if ev.status.terminal:
        return _moved(op, ev, now, {"state": S.TERMINAL_OBSERVED, **news}, (FetchResult(),))
    if ev.status is ServerStatus.INPUT_REQUIRED:
        seen = _observe(op, ev)
        replay = (
            ev.input_request_key is not None
            and ev.input_request_key == op.input_request_key
            and op.answered_round == op.input_round
        )
        if replay:
            return _ok(
                op, ev, now, replace(seen, state=S.WORKING), (Poll(),), reason="input round replayed; ignored"
            )
        if op.state is S.INPUT_REQUIRED and ev.input_request_key == op.input_request_key:
            return _ok(op, ev, now, seen, (), reason="still waiting for input")
        round_ = op.input_round + 1
        after = replace(
            seen, state=S.INPUT_REQUIRED, input_round=round_, input_request_key=ev.input_request_key
        )
        return _ok(op, ev, now, after, (AwaitApproval(round_, ev.input_request_key),))
    if not news and op.state is S.WORKING:
        return _still(op, ev, now)
    return _moved(op, ev, now, {"state": S.WORKING, **news}, (Poll(),))


def step(op: Operation, event: Event, now: datetime) -> Transition:
    """Decide the next operation value and the effects to perform for one event.

    Args:
        op: the operation as last read from the ledger.
        event: what happened.
        now: the instant the event is recorded at (from the caller's clock).

    Returns:
        The transition; ``accepted`` is False (and the operation unchanged) when the event is
        illegal in this state, stale (older epoch, cancel generation or input round) or foreign
        (another task id).
    """
    state = op.state
    ev_epoch = _event_epoch(event)
    if ev_epoch is not None and ev_epoch != op.epoch:
        kind = "stale" if ev_epoch < op.epoch else "future"
        return _reject(op, event, now, f"{kind} epoch {ev_epoch}; operation is at epoch {op.epoch}")
    ev_task = _event_task(event)
    if ev_task is not None and op.task_id is not None and ev_task != op.task_id:
        return _reject(
            op, event, now, f"reply for task {ev_task!r}, but this operation is task {op.task_id!r}"
        )

    if state in RECEIPT_STATES:
        late_completion = (
            isinstance(event, StatusObserved | ResultVerified) and event.status is ServerStatus.COMPLETED
        )
        if state is S.CANCELLED_ACCEPTED and late_completion:
            reason = "completion arrived after the cancel was accepted; it never advances"
            if op.effect_reconciliation_required:
                return _reject(op, event, now, reason)
            after = replace(op, effect_reconciliation_required=True)
            return _ok(op, event, now, after, (FlagEffectReconciliation(reason),), reason=reason)
        return _reject(op, event, now, f"{state} holds a terminal receipt and absorbs every event")

    match event:
        case EpochRaised():
            if event.epoch <= op.epoch:
                return _reject(op, event, now, f"epoch {event.epoch} does not raise {op.epoch}")
            return _ok(
                op, event, now, replace(op, epoch=event.epoch), reason=f"epoch raised by {event.actor}"
            )

        case Submitted():
            if state is not S.SUBMITTING:
                return _reject(op, event, now, "a server id can only arrive while submitting")
            changes = {"state": S.WORKING, "task_id": event.task_id, "expires_at": event.expires_at}
            return _moved(op, event, now, changes, (Poll(),))

        case SubmissionLost():
            if state is not S.SUBMITTING:
                return _reject(op, event, now, "only a submission in flight can be lost")
            after = replace(op, state=S.SUBMISSION_UNKNOWN)
            return _ok(op, event, now, after, (LookUp(op.idempotency_key),), reason=event.reason)

        case InlineResultReturned():
            if state is not S.SUBMITTING:
                return _reject(op, event, now, "an inline outcome can only answer a submission")
            after = replace(op, state=S.TERMINAL_OBSERVED, server_status=event.status, result_held=True)
            return _ok(op, event, now, after, (FetchResult(),))

        case LookupFound():
            if state is not S.SUBMISSION_UNKNOWN:
                return _reject(op, event, now, "a key lookup only resolves SUBMISSION_UNKNOWN")
            return _ok(op, event, now, replace(op, state=S.WORKING, task_id=event.task_id), (Poll(),))

        case LookupProvedAbsent():
            if state is not S.SUBMISSION_UNKNOWN:
                return _reject(op, event, now, "a key lookup only resolves SUBMISSION_UNKNOWN")
            return _ok(
                op, event, now, replace(op, state=S.NOT_FOUND_SAFE), reason="server proved absence by key"
            )

        case LookupUnavailable():
            if state is not S.SUBMISSION_UNKNOWN:
                return _reject(op, event, now, "a key lookup only resolves SUBMISSION_UNKNOWN")
            after = replace(op, state=S.UNKNOWN)
            return _ok(op, event, now, after, (OpenReconciliation(event.reason),), reason=event.reason)

        case Resubmitted():
            if state not in (S.NOT_FOUND_SAFE, S.NEVER_CREATED):
                return _reject(
                    op, event, now, "resubmission needs proof that the operation was never created"
                )
            after = replace(op, state=S.SUBMITTING, task_id=None, submit_attempts=op.submit_attempts + 1)
            why = "same key, proven absent by the server"
            if event.actor is not None:
                why = f"{event.actor}: {event.reason} (same key, resubmitted by a person)"
            return _ok(op, event, now, after, (Submit(op.idempotency_key),), reason=why)

        case StatusObserved():
            if state in (S.WORKING, S.INPUT_REQUIRED):
                return _status_while_running(op, event, now)
            if state is S.CANCEL_REQUESTED:
                if event.status is ServerStatus.CANCELLED:
                    return _accept_cancel(op, event, now, "server reports the task cancelled")
                news = _observed(op, event)
                if event.status.terminal:
                    return _moved(
                        op,
                        event,
                        now,
                        {"state": S.TERMINAL_OBSERVED, **news},
                        (FetchResult(),),
                        reason="the task ended before the cancel took effect",
                    )
                if not news:
                    return _still(op, event, now)
                return _moved(op, event, now, news, (Poll(),))
            if state in (S.TERMINAL_OBSERVED, S.FETCHING_RESULT, S.EXPIRED_WITH_RECEIPT):
                if event.status is op.server_status:
                    return _ok(op, event, now, op, reason="terminal status repeated")
                return _reject(
                    op,
                    event,
                    now,
                    f"server status {op.server_status} is terminal; {event.status} arrived late",
                )
            if state is S.UNKNOWN and op.task_id is not None:
                resumed = replace(op, state=S.CANCEL_REQUESTED if op.cancel_generation else S.WORKING)
                if op.cancel_generation and not event.status.terminal:
                    return _ok(
                        op, event, now, _observe(resumed, event), (Poll(),), reason="server reappeared"
                    )
                if op.cancel_generation and event.status is ServerStatus.CANCELLED:
                    t = _accept_cancel(resumed, event, now, "server reports the task cancelled")
                else:
                    t = _status_while_running(resumed, event, now)
                # Decided as if running again, but recorded as what it is: a move out of UNKNOWN,
                # one write that raises the row version even when only the state changed.
                return _ok(op, event, now, t.after, t.effects, reason=t.reason or "server reappeared")
            return _reject(op, event, now, f"no status is expected in {state}")

        case InputAnswered():
            if state is not S.INPUT_REQUIRED:
                return _reject(op, event, now, "no input round is open")
            if event.input_round != op.input_round:
                return _reject(
                    op, event, now, f"answer for round {event.input_round}; open round is {op.input_round}"
                )
            after = replace(op, state=S.WORKING, answered_round=event.input_round)
            return _ok(
                op,
                event,
                now,
                after,
                (SendInput(event.input_round, op.input_request_key), Poll()),
                reason=f"answered by {event.actor}",
            )

        case CancelRequested():
            if event.generation != op.cancel_generation + 1:
                return _reject(
                    op,
                    event,
                    now,
                    f"cancel generation {event.generation} does not follow {op.cancel_generation}",
                )
            if state in (S.WORKING, S.INPUT_REQUIRED):
                after = replace(
                    op, state=S.CANCEL_REQUESTED, cancel_generation=event.generation, cancel_requested_at=now
                )
                return _ok(
                    op,
                    event,
                    now,
                    after,
                    (SendCancel(event.generation),),
                    reason=f"{event.actor}: {event.reason}",
                )
            if state is S.CANCEL_REQUESTED:
                after = replace(op, cancel_generation=event.generation)
                return _ok(op, event, now, after, (SendCancel(event.generation),), reason="cancel sent again")
            return _reject(op, event, now, f"cannot cancel in {state}")

        case CancelConfirmed():
            if state is not S.CANCEL_REQUESTED:
                return _reject(op, event, now, "no cancel is outstanding")
            if event.generation != op.cancel_generation:
                return _reject(
                    op,
                    event,
                    now,
                    f"confirmation for cancel generation {event.generation}; current is {op.cancel_generation}",
                )
            return _accept_cancel(op, event, now, "cancel response confirms the cancelled terminal state")

        case CancelAcknowledged():
            if state is not S.CANCEL_REQUESTED:
                return _reject(op, event, now, "no cancel is outstanding")
            return _ok(op, event, now, op, (Poll(),), reason="acknowledged only; polling until terminal")

        case CancelRefusedTerminal():
            if state is not S.CANCEL_REQUESTED:
                return _reject(op, event, now, "no cancel is outstanding")
            return _ok(
                op, event, now, op, (Poll(),), reason="already terminal on the server; reading its state"
            )

        case FetchStarted():
            if state not in (S.TERMINAL_OBSERVED, S.EXPIRED_WITH_RECEIPT):
                return _reject(op, event, now, "nothing terminal to fetch")
            return _moved(op, event, now, {"state": S.FETCHING_RESULT})

        case ResultVerified():
            if state is not S.FETCHING_RESULT:
                return _reject(op, event, now, "no result fetch is in progress")
            if event.epoch_echo is not None and event.epoch_echo != op.epoch:
                kind = "stale" if event.epoch_echo < op.epoch else "future"
                return _reject(
                    op,
                    event,
                    now,
                    f"{kind} epoch {event.epoch_echo} echoed by the result; it was fetched at epoch "
                    f"{event.epoch}, the operation is at epoch {op.epoch}",
                )
            if event.status is not op.server_status:
                return _reject(
                    op, event, now, f"result says {event.status}, server status is {op.server_status}"
                )
            after = replace(op, state=S.ACCEPTED, result_digest=event.result_digest)
            return _ok(op, event, now, after, (AcceptTerminal(_receipt(after, now, status=event.status)),))

        case ResultRejected():
            if state is not S.FETCHING_RESULT:
                return _reject(op, event, now, "no result fetch is in progress")
            reason = f"result failed verification: {event.reason}"
            if event.result_digest is not None:
                reason += f"; candidate result digest {event.result_digest}"
            else:
                reason += "; no candidate result could be read"
            return _ok(
                op, event, now, replace(op, state=S.UNKNOWN), (OpenReconciliation(reason),), reason=reason
            )

        case NotFound():
            if state in _HAS_SERVER_ID:
                return _not_found(op, event, now)
            if state is S.UNKNOWN and event.proved_never_created:
                return _not_found(op, event, now)
            return _reject(op, event, now, f"not found means nothing new in {state}")

        case Reconciled():
            if state is not S.UNKNOWN:
                return _reject(op, event, now, "only UNKNOWN operations are reconciled")
            if event.task_id is None:
                return _ok(
                    op,
                    event,
                    now,
                    replace(op, state=S.NOT_FOUND_SAFE),
                    reason=f"{event.actor}: {event.reason} (absent: the wait ends without a receipt)",
                )
            if op.task_id is not None and event.task_id != op.task_id:
                # One operation, one server task: a person may confirm the task it is bound to,
                # never bind it to a second one (or to a second spelling of the same one).
                return _reject(
                    op,
                    event,
                    now,
                    f"the operation is bound to task {op.task_id!r}; {event.task_id!r} is another task",
                )
            after = replace(op, state=S.WORKING, task_id=event.task_id)
            return _ok(op, event, now, after, (Poll(),), reason=f"{event.actor}: {event.reason}")

        case _:
            assert_never(event)


__all__ = [
    "step",
]
