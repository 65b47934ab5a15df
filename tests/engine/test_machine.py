"""The transition function: a table over every (state, event) pair, and properties over event sequences."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
    Reconciled,
    Resubmitted,
    ResultRejected,
    ResultVerified,
    SendCancel,
    ServerStatus,
    StatusObserved,
    SubmissionLost,
    Submit,
    Submitted,
    TaskId,
)
from engine.testing import BATCH_TOOL, EPOCH_START, make_operation

S = LocalState
T = TaskId("task-1")
E = Epoch(1)
D = Digest("sha256:feed")
NOW = EPOCH_START + timedelta(seconds=5)


def in_state(state: LocalState, **changes: object) -> Operation:
    """An operation placed in ``state`` with the fields that state implies."""
    op = make_operation("table")
    extra: dict[str, object] = {"state": state}
    if state not in (S.SUBMITTING, S.SUBMISSION_UNKNOWN, S.NOT_FOUND_SAFE, S.NEVER_CREATED):
        extra["task_id"] = T
    if state in (S.TERMINAL_OBSERVED, S.FETCHING_RESULT, S.ACCEPTED, S.EXPIRED_WITH_RECEIPT):
        extra["server_status"] = ServerStatus.COMPLETED
    if state is S.CANCELLED_ACCEPTED:
        extra["server_status"] = ServerStatus.CANCELLED
    if state is S.CANCEL_REQUESTED:
        extra["cancel_generation"] = 1
    if state is S.INPUT_REQUIRED:
        extra.update(input_round=1, input_request_key="k1")
    if state is S.EXPIRED_WITH_RECEIPT:
        extra["result_held"] = True
    extra.update(changes)
    return replace(op, **extra)  # type: ignore[arg-type]


EVENTS: dict[str, Event] = {
    "Submitted": Submitted(T, E),
    "SubmissionLost": SubmissionLost(E, "reset"),
    "InlineResult": InlineResultReturned(ServerStatus.COMPLETED, E),
    "LookupFound": LookupFound(T, E),
    "LookupProvedAbsent": LookupProvedAbsent(E),
    "LookupUnavailable": LookupUnavailable(E, "no key lookup"),
    "Resubmitted": Resubmitted(E),
    "Status.working": StatusObserved(T, ServerStatus.WORKING, E),
    "Status.input": StatusObserved(T, ServerStatus.INPUT_REQUIRED, E, input_request_key="k2"),
    "Status.completed": StatusObserved(T, ServerStatus.COMPLETED, E),
    "Status.cancelled": StatusObserved(T, ServerStatus.CANCELLED, E),
    "InputAnswered": InputAnswered(1, "bob"),
    "CancelRequested": CancelRequested(1, "bob", "no longer needed"),
    "CancelConfirmed": CancelConfirmed(T, 1, E),
    "CancelAcknowledged": CancelAcknowledged(T, 1, E),
    "CancelRefusedTerminal": CancelRefusedTerminal(T, 1, E),
    "FetchStarted": FetchStarted(E),
    "ResultVerified": ResultVerified(T, ServerStatus.COMPLETED, D, E),
    "ResultRejected": ResultRejected("schema mismatch", E),
    "NotFound": NotFound(E),
    "NotFound.proved": NotFound(E, proved_never_created=True),
    "Reconciled.found": Reconciled("carol", "found on server", T),
    "Reconciled.absent": Reconciled("carol", "server has no trace", None),
    "EpochRaised": EpochRaised(Epoch(2), "ops"),
}

# Every legal (state, event) -> next state. Anything not listed must be rejected unchanged.
# A value equal to the key's state is a legal event that changes fields but not the state.
LEGAL: dict[tuple[LocalState, str], LocalState] = {
    (S.SUBMITTING, "Submitted"): S.WORKING,
    (S.SUBMITTING, "SubmissionLost"): S.SUBMISSION_UNKNOWN,
    (S.SUBMITTING, "InlineResult"): S.TERMINAL_OBSERVED,
    (S.SUBMISSION_UNKNOWN, "LookupFound"): S.WORKING,
    (S.SUBMISSION_UNKNOWN, "LookupProvedAbsent"): S.NOT_FOUND_SAFE,
    (S.SUBMISSION_UNKNOWN, "LookupUnavailable"): S.UNKNOWN,
    (S.NOT_FOUND_SAFE, "Resubmitted"): S.SUBMITTING,
    (S.NEVER_CREATED, "Resubmitted"): S.SUBMITTING,
    (S.WORKING, "Status.working"): S.WORKING,
    (S.WORKING, "Status.input"): S.INPUT_REQUIRED,
    (S.WORKING, "Status.completed"): S.TERMINAL_OBSERVED,
    (S.WORKING, "Status.cancelled"): S.TERMINAL_OBSERVED,
    (S.WORKING, "CancelRequested"): S.CANCEL_REQUESTED,
    (S.WORKING, "NotFound"): S.UNKNOWN,
    (S.WORKING, "NotFound.proved"): S.NEVER_CREATED,
    (S.INPUT_REQUIRED, "Status.working"): S.WORKING,
    (S.INPUT_REQUIRED, "Status.input"): S.INPUT_REQUIRED,
    (S.INPUT_REQUIRED, "Status.completed"): S.TERMINAL_OBSERVED,
    (S.INPUT_REQUIRED, "Status.cancelled"): S.TERMINAL_OBSERVED,
    (S.INPUT_REQUIRED, "InputAnswered"): S.WORKING,
    (S.INPUT_REQUIRED, "CancelRequested"): S.CANCEL_REQUESTED,
    (S.INPUT_REQUIRED, "NotFound"): S.UNKNOWN,
    (S.INPUT_REQUIRED, "NotFound.proved"): S.NEVER_CREATED,
    (S.CANCEL_REQUESTED, "Status.working"): S.CANCEL_REQUESTED,
    (S.CANCEL_REQUESTED, "Status.input"): S.CANCEL_REQUESTED,
    (S.CANCEL_REQUESTED, "Status.completed"): S.TERMINAL_OBSERVED,
    (S.CANCEL_REQUESTED, "Status.cancelled"): S.CANCELLED_ACCEPTED,
    (S.CANCEL_REQUESTED, "CancelConfirmed"): S.CANCELLED_ACCEPTED,
    (S.CANCEL_REQUESTED, "CancelAcknowledged"): S.CANCEL_REQUESTED,
    (S.CANCEL_REQUESTED, "CancelRefusedTerminal"): S.CANCEL_REQUESTED,
    (S.CANCEL_REQUESTED, "NotFound"): S.UNKNOWN,
    (S.CANCEL_REQUESTED, "NotFound.proved"): S.NEVER_CREATED,
    (S.TERMINAL_OBSERVED, "Status.completed"): S.TERMINAL_OBSERVED,
    (S.TERMINAL_OBSERVED, "FetchStarted"): S.FETCHING_RESULT,
    (S.TERMINAL_OBSERVED, "NotFound"): S.UNKNOWN,
    (S.TERMINAL_OBSERVED, "NotFound.proved"): S.NEVER_CREATED,
    (S.FETCHING_RESULT, "Status.completed"): S.FETCHING_RESULT,
    (S.FETCHING_RESULT, "ResultVerified"): S.ACCEPTED,
    (S.FETCHING_RESULT, "ResultRejected"): S.UNKNOWN,
    (S.FETCHING_RESULT, "NotFound"): S.UNKNOWN,
    (S.FETCHING_RESULT, "NotFound.proved"): S.NEVER_CREATED,
    (S.EXPIRED_WITH_RECEIPT, "Status.completed"): S.EXPIRED_WITH_RECEIPT,
    (S.EXPIRED_WITH_RECEIPT, "FetchStarted"): S.FETCHING_RESULT,
    (S.UNKNOWN, "Status.working"): S.WORKING,
    (S.UNKNOWN, "Status.input"): S.INPUT_REQUIRED,
    (S.UNKNOWN, "Status.completed"): S.TERMINAL_OBSERVED,
    (S.UNKNOWN, "Status.cancelled"): S.TERMINAL_OBSERVED,
    (S.UNKNOWN, "NotFound.proved"): S.NEVER_CREATED,
    (S.UNKNOWN, "Reconciled.found"): S.WORKING,
    (S.UNKNOWN, "Reconciled.absent"): S.NOT_FOUND_SAFE,
    # Absorbed, but the late completion raises the effect-reconciliation flag.
    (S.CANCELLED_ACCEPTED, "Status.completed"): S.CANCELLED_ACCEPTED,
    (S.CANCELLED_ACCEPTED, "ResultVerified"): S.CANCELLED_ACCEPTED,
}
for _state in S:
    if _state not in RECEIPT_STATES:
        LEGAL[(_state, "EpochRaised")] = _state


@pytest.mark.parametrize("state", list(S), ids=str)
@pytest.mark.parametrize("event_name", list(EVENTS))
def test_every_state_event_pair_follows_the_table(state: LocalState, event_name: str) -> None:
    """Each (state, event) pair is either a listed arrow or rejected with the operation unchanged."""
    op = in_state(state)
    t = step(op, EVENTS[event_name], NOW)
    expected = LEGAL.get((state, event_name))
    if expected is None:
        assert not t.accepted, f"{state} + {event_name} should be rejected, went to {t.after.state}"
        assert t.after == op
        assert t.reason
        assert t.effects == ()
    else:
        assert t.accepted, f"{state} + {event_name} was rejected: {t.reason}"
        assert t.after.state is expected
        if t.after != op:
            assert t.after.row_version == op.row_version + 1
            assert t.after.updated_at == NOW


def test_diagram_arrows_are_all_legal() -> None:
    """Every arrow of the seed's diagram appears in the table."""
    arrows = {
        (S.SUBMITTING, S.WORKING),
        (S.WORKING, S.INPUT_REQUIRED),
        (S.INPUT_REQUIRED, S.WORKING),
        (S.SUBMITTING, S.SUBMISSION_UNKNOWN),
        (S.SUBMISSION_UNKNOWN, S.WORKING),
        (S.SUBMISSION_UNKNOWN, S.NOT_FOUND_SAFE),
        (S.WORKING, S.CANCEL_REQUESTED),
        (S.INPUT_REQUIRED, S.CANCEL_REQUESTED),
        (S.WORKING, S.TERMINAL_OBSERVED),
        (S.INPUT_REQUIRED, S.TERMINAL_OBSERVED),
        (S.TERMINAL_OBSERVED, S.FETCHING_RESULT),
        (S.FETCHING_RESULT, S.ACCEPTED),
        (S.CANCEL_REQUESTED, S.CANCELLED_ACCEPTED),
        (S.CANCEL_REQUESTED, S.TERMINAL_OBSERVED),
    }
    table = {(s, to) for (s, _), to in LEGAL.items()}
    assert arrows <= table


def test_stale_epoch_reply_is_rejected_and_named() -> None:
    """A reply sent under an older execution epoch is fenced."""
    op = in_state(S.WORKING, epoch=Epoch(3))
    t = step(op, StatusObserved(T, ServerStatus.COMPLETED, Epoch(2)), NOW)
    assert not t.accepted
    assert "stale epoch 2" in t.reason


def test_a_result_fetched_by_an_old_driver_is_fenced_even_when_it_echoes_the_current_epoch() -> None:
    """The fetching driver's epoch and the server's echo must both match: an echo of the new epoch
    never lets an epoch-1 driver's result through an epoch-2 operation, and vice versa."""
    op = in_state(S.FETCHING_RESULT, epoch=Epoch(2))
    old_driver = step(op, ResultVerified(T, ServerStatus.COMPLETED, D, Epoch(1), epoch_echo=Epoch(2)), NOW)
    assert not old_driver.accepted
    assert "stale epoch 1" in old_driver.reason
    newer_echo = step(op, ResultVerified(T, ServerStatus.COMPLETED, D, Epoch(2), epoch_echo=Epoch(3)), NOW)
    assert not newer_echo.accepted
    assert "future epoch 3 echoed by the result" in newer_echo.reason
    both = step(op, ResultVerified(T, ServerStatus.COMPLETED, D, Epoch(2), epoch_echo=Epoch(2)), NOW)
    assert both.accepted


def test_reply_for_another_task_is_rejected() -> None:
    """A status for a different task id never moves this operation."""
    t = step(in_state(S.WORKING), StatusObserved(TaskId("other"), ServerStatus.COMPLETED, E), NOW)
    assert not t.accepted
    assert "other" in t.reason


def test_cancel_confirmation_for_an_old_generation_is_rejected() -> None:
    """Only the current cancel generation can be confirmed."""
    op = in_state(S.CANCEL_REQUESTED, cancel_generation=2)
    assert not step(op, CancelConfirmed(T, 1, E), NOW).accepted
    assert step(op, CancelConfirmed(T, 2, E), NOW).after.state is S.CANCELLED_ACCEPTED


def test_cancel_request_records_generation_and_instant_then_sends() -> None:
    """CANCEL_REQUESTED is recorded with the raised generation before the cancel is sent."""
    t = step(in_state(S.WORKING), CancelRequested(1, "bob", "why"), NOW)
    assert t.after.cancel_generation == 1
    assert t.after.cancel_requested_at == NOW
    assert t.effects == (SendCancel(1),)


def test_cancel_with_a_skipped_generation_is_rejected() -> None:
    """A cancel built on a stale read of the generation does not apply."""
    assert not step(in_state(S.WORKING), CancelRequested(2, "bob", "why"), NOW).accepted


def test_submission_loss_looks_up_by_the_same_key() -> None:
    """SUBMISSION_UNKNOWN asks for a lookup by the one key, never a new submission."""
    op = in_state(S.SUBMITTING)
    t = step(op, SubmissionLost(E, "reset"), NOW)
    assert t.effects == (LookUp(op.idempotency_key),)


def test_resubmission_after_proof_reuses_the_key() -> None:
    """Resubmitting after the server proved absence uses the same key."""
    op = in_state(S.NOT_FOUND_SAFE)
    t = step(op, Resubmitted(E), NOW)
    assert t.effects == (Submit(op.idempotency_key),)
    assert t.after.submit_attempts == 1


def test_completed_is_accepted_only_with_the_verified_digest() -> None:
    """ACCEPTED carries a receipt whose digest is the verified one."""
    t = step(in_state(S.FETCHING_RESULT), ResultVerified(T, ServerStatus.COMPLETED, D, E), NOW)
    (effect,) = t.effects
    assert isinstance(effect, AcceptTerminal)
    assert effect.receipt.result_digest == D
    assert t.after.result_digest == D


def test_result_with_a_status_other_than_observed_is_rejected() -> None:
    """A result whose status contradicts the observed terminal status is not accepted."""
    assert not step(in_state(S.FETCHING_RESULT), ResultVerified(T, ServerStatus.FAILED, D, E), NOW).accepted


def test_cancel_won_for_side_effecting_tool_flags_effect_reconciliation() -> None:
    """A cancel that wins against a tool with effects is flagged for effect reconciliation."""
    op = replace(in_state(S.CANCEL_REQUESTED), tool=BATCH_TOOL)
    t = step(op, CancelConfirmed(T, 1, E), NOW)
    assert t.after.effect_reconciliation_required
    assert any(isinstance(e, FlagEffectReconciliation) for e in t.effects)


def test_late_completion_after_cancel_never_advances_and_flags() -> None:
    """A completion after CANCELLED_ACCEPTED writes no receipt and sets the effect flag."""
    op = in_state(S.CANCELLED_ACCEPTED)
    t = step(op, StatusObserved(T, ServerStatus.COMPLETED, E), NOW)
    assert t.after.state is S.CANCELLED_ACCEPTED
    assert t.after.effect_reconciliation_required
    assert not any(isinstance(e, AcceptTerminal) for e in t.effects)


def test_replayed_input_round_is_ignored() -> None:
    """An answered input round presented again opens no new approval."""
    op = in_state(S.INPUT_REQUIRED)
    answered = step(op, InputAnswered(1, "bob"), NOW).after
    t = step(answered, StatusObserved(T, ServerStatus.INPUT_REQUIRED, E, input_request_key="k1"), NOW)
    assert t.after.state is S.WORKING
    assert not any(isinstance(e, AwaitApproval) for e in t.effects)


def test_answer_for_a_stale_round_is_rejected() -> None:
    """An answer is bound to its round."""
    op = in_state(S.INPUT_REQUIRED, input_round=2)
    assert not step(op, InputAnswered(1, "bob"), NOW).accepted


def test_not_found_after_expiry_with_held_outcome_may_still_be_accepted() -> None:
    """Expired with the outcome held goes to EXPIRED_WITH_RECEIPT and fetches it locally."""
    op = in_state(S.TERMINAL_OBSERVED, result_held=True, expires_at=EPOCH_START)
    t = step(op, NotFound(E), NOW)
    assert t.after.state is S.EXPIRED_WITH_RECEIPT
    assert t.effects == (FetchResult(),)
    assert "after expiry" in t.reason


def test_not_found_before_expiry_goes_to_reconciliation() -> None:
    """A 404 before expiry without proof is UNKNOWN and opens reconciliation."""
    op = in_state(S.WORKING, expires_at=NOW + timedelta(hours=1))
    t = step(op, NotFound(E), NOW)
    assert t.after.state is S.UNKNOWN
    assert isinstance(t.effects[0], OpenReconciliation)
    assert "before expiry" in t.effects[0].reason


def test_a_status_that_repeats_what_a_running_operation_holds_is_accepted_and_not_logged() -> None:
    """Still working, nothing else new (in WORKING or CANCEL_REQUESTED): accepted, polled on, the
    operation unchanged, no log row; a new status, cursor or expiry, a stale reply and a move out of
    UNKNOWN are all logged."""
    working = in_state(S.WORKING, server_status=ServerStatus.WORKING)
    cancelling = in_state(S.CANCEL_REQUESTED, server_status=ServerStatus.WORKING)
    for op in (working, cancelling):
        t = step(op, StatusObserved(T, ServerStatus.WORKING, E), NOW)
        assert (t.accepted, t.logged, t.after, t.effects) == (True, False, op, (Poll(),))
    news = [
        (in_state(S.WORKING), StatusObserved(T, ServerStatus.WORKING, E)),  # first status seen
        (working, StatusObserved(T, ServerStatus.WORKING, E, poll_cursor="c2")),
        (working, StatusObserved(T, ServerStatus.WORKING, E, expires_at=NOW + timedelta(hours=1))),
        (working, StatusObserved(T, ServerStatus.WORKING, Epoch(0))),  # stale: rejected
        (in_state(S.UNKNOWN, server_status=ServerStatus.WORKING), StatusObserved(T, ServerStatus.WORKING, E)),
    ]
    for op, event in news:
        t = step(op, event, NOW)
        assert t.logged, (op.state, event)
        assert not t.accepted or t.after != op or op.state is S.UNKNOWN


# ----------------------------------------------------------------------------------- properties

event_strategy = (
    st.sampled_from(list(EVENTS.values()))
    | st.builds(
        StatusObserved,
        task_id=st.sampled_from([T, TaskId("other")]),
        status=st.sampled_from(list(ServerStatus)),
        epoch=st.sampled_from([Epoch(1), Epoch(2)]),
        input_request_key=st.sampled_from([None, "k1", "k2", "k3"]),
        result_held=st.booleans(),
    )
    | st.builds(CancelRequested, generation=st.integers(1, 4), actor=st.just("a"), reason=st.just("r"))
    | st.builds(
        ResultVerified,
        task_id=st.sampled_from([T, None]),
        status=st.sampled_from(list(ServerStatus)),
        result_digest=st.just(D),
        epoch=st.just(E),
    )
    | st.builds(InputAnswered, input_round=st.integers(1, 4), actor=st.just("a"))
)


@settings(max_examples=400, deadline=None)
@given(events=st.lists(event_strategy, max_size=40), side_effects=st.booleans())
def test_any_event_sequence_yields_at_most_one_receipt(events: list[Event], side_effects: bool) -> None:
    """Whatever arrives, in whatever order: one receipt at most; receipt states absorb;
    completed reaches ACCEPTED only with a verified digest; nothing advances after a cancel won."""
    op = in_state(S.SUBMITTING)
    if side_effects:
        op = replace(op, tool=BATCH_TOOL)
    receipts = 0
    verified: set[Digest] = set()
    for event in events:
        t = step(op, event, NOW)
        if isinstance(event, ResultVerified) and t.accepted:
            verified.add(event.result_digest)
        receipts += sum(isinstance(e, AcceptTerminal) for e in t.effects)
        if op.state in RECEIPT_STATES:
            assert t.after.state is op.state, "receipt states absorb"
            assert not any(isinstance(e, AcceptTerminal) for e in t.effects)
        late_completion = (
            isinstance(event, StatusObserved | ResultVerified) and event.status is ServerStatus.COMPLETED
        )
        if op.state is S.CANCELLED_ACCEPTED and late_completion and t.accepted:
            assert t.after.effect_reconciliation_required
        if t.after.state is S.ACCEPTED and t.after.server_status is ServerStatus.COMPLETED:
            assert t.after.result_digest in verified
        if not t.accepted:
            assert t.after == op
        if not t.logged:
            assert (t.accepted, t.after, t.effects) == (True, op, (Poll(),)), "only a repeat goes unlogged"
        op = t.after
    assert receipts <= 1
