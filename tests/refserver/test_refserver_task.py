"""The server-side task state machine, driven with explicit times (no clock, no HTTP)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refserver.fault import Fault, FaultBook, FaultRequest
from refserver.sim import parse_sim
from refserver.task import TERMINAL, AnswerResult, CancelRejected, Retention, Status, Task
from refserver.tool import ToolFailure, ToolOutput, planned_outcome

T0 = 100.0


def make_task(
    sim: dict[str, object] | None = None,
    *,
    faults: tuple[Fault, ...] = (),
    retention: Retention = Retention.FROM_CREATION,
    is_error_fails: bool = True,
    ttl_s: float | None = 60.0,
    epoch: int | None = 3,
) -> Task:
    spec = parse_sim(sim or {}, default_duration_ms=1000, time_scale=1.0)
    return Task(
        task_id="t1",
        tool="generate_report",
        echo={"report": "q"},
        sim=spec,
        principal=None,
        key=None,
        request_digest="d",
        epoch=epoch,
        created_at=T0,
        ttl_s=ttl_s,
        retention=retention,
        is_error_fails=is_error_fails,
        planned=planned_outcome("generate_report", {"report": "q"}, spec),
        faults=FaultBook([FaultRequest(f) for f in faults]),
    )


def test_task_works_until_its_duration_has_passed_then_completes():
    """A task without input rounds is working before its duration and completed after it."""
    task = make_task()
    assert task.view(T0 + 0.999).status is Status.WORKING
    view = task.view(T0 + 1.0)
    assert view.status is Status.COMPLETED
    assert isinstance(view.outcome, ToolOutput)
    assert task.terminal_at == pytest.approx(T0 + 1.0)


def test_progress_grows_with_elapsed_work():
    """Progress is the fraction of work done, 1.0 once completed."""
    task = make_task()
    assert task.view(T0 + 0.25).progress == pytest.approx(0.25)
    assert task.view(T0 + 5).progress == 1.0


def test_input_rounds_pause_the_work_until_answered():
    """Each input round stops the clock of the work until its key is answered with accept."""
    task = make_task({"input_rounds": 2})
    view = task.view(T0 + 0.4)
    assert view.status is Status.INPUT_REQUIRED
    assert view.input_round is not None
    assert view.input_round.key == "round-t1-1"
    assert task.view(T0 + 50).status is Status.INPUT_REQUIRED
    assert (
        task.answer("round-t1-1", {"action": "accept", "content": {"approve": True}}, T0 + 50)
        is AnswerResult.ACCEPTED
    )
    assert task.view(T0 + 50.1).status is Status.WORKING
    second = task.view(T0 + 50.4)
    assert second.input_round is not None
    assert second.input_round.key == "round-t1-2"
    task.answer("round-t1-2", {"action": "accept"}, T0 + 60)
    assert task.view(T0 + 60.34).status is Status.COMPLETED


def test_answers_to_stale_or_unknown_keys_change_nothing():
    """A repeated answer is stale, a key never asked is unknown, and neither moves the task."""
    task = make_task({"input_rounds": 1})
    task.advance(T0 + 1)
    task.answer("round-t1-1", {"action": "accept"}, T0 + 1)
    assert task.answer("round-t1-1", {"action": "accept"}, T0 + 1.1) is AnswerResult.STALE
    assert task.answer("round-t1-9", {"action": "accept"}, T0 + 1.1) is AnswerResult.UNKNOWN
    assert task.rounds_answered == 1


def test_declining_an_input_round_ends_with_an_error_result():
    """Decline is a tool-level refusal: an isError result (failed on 2025-11-25, completed on 2026)."""
    legacy = make_task({"input_rounds": 1})
    legacy.advance(T0 + 1)
    legacy.answer("round-t1-1", {"action": "decline"}, T0 + 1)
    assert legacy.status is Status.FAILED
    modern = make_task({"input_rounds": 1}, is_error_fails=False)
    modern.advance(T0 + 1)
    modern.answer("round-t1-1", {"action": "decline"}, T0 + 1)
    assert modern.status is Status.COMPLETED
    assert isinstance(modern.outcome, ToolOutput)
    assert modern.outcome.is_error


def test_outcome_failed_makes_a_failed_task_with_a_failure():
    """``_sim.outcome = failed`` ends in ``failed`` with a ToolFailure, on every version."""
    task = make_task({"outcome": "failed"}, is_error_fails=False)
    assert task.view(T0 + 2).status is Status.FAILED
    assert isinstance(task.outcome, ToolFailure)


def test_synchronous_cancel_is_refused_once_terminal():
    """2025-11-25 cancel moves a working task to cancelled at once and refuses a terminal one."""
    task = make_task()
    task.cancel_now(T0 + 0.5)
    assert task.status is Status.CANCELLED
    with pytest.raises(CancelRejected):
        task.cancel_now(T0 + 0.6)
    done = make_task()
    with pytest.raises(CancelRejected):
        done.cancel_now(T0 + 2)
    assert done.status is Status.COMPLETED


def test_cancelled_task_stays_cancelled_after_its_work_would_have_finished():
    """A late completion never overwrites cancelled."""
    task = make_task()
    task.cancel_now(T0 + 0.5)
    assert task.view(T0 + 10).status is Status.CANCELLED
    assert task.outcome is None


def test_cooperative_cancel_takes_effect_after_its_delay():
    """A cooperative cancel leaves the task working until the delay has passed."""
    task = make_task()
    assert task.request_cancel(T0 + 0.1, 0.2)
    assert task.view(T0 + 0.2).status is Status.WORKING
    assert task.view(T0 + 0.3).status is Status.CANCELLED


def test_cooperative_cancel_loses_to_work_that_finishes_first():
    """Work ending inside the cancel delay completes the task; the cancel then does nothing."""
    task = make_task()
    task.request_cancel(T0 + 0.9, 0.2)
    assert task.view(T0 + 1.5).status is Status.COMPLETED


def test_complete_on_cancel_finishes_the_work_when_the_cancel_arrives():
    """With complete_on_cancel the cancel finds a completed task: refused synchronously, a no-op cooperatively."""
    sync = make_task(faults=(Fault.COMPLETE_ON_CANCEL,))
    with pytest.raises(CancelRejected):
        sync.cancel_now(T0 + 0.1)
    assert sync.status is Status.COMPLETED
    coop = make_task(faults=(Fault.COMPLETE_ON_CANCEL,))
    assert not coop.request_cancel(T0 + 0.1, 0.2)
    assert coop.status is Status.COMPLETED
    assert coop.terminal_at == pytest.approx(T0 + 0.1)


def test_ttl_from_creation_never_deletes_before_terminal():
    """Counted from creation, a ttl shorter than the work still leaves the task until it is terminal."""
    task = make_task(ttl_s=0.5)
    assert task.expires_at() is None
    task.advance(T0 + 1)
    assert task.expires_at() == pytest.approx(T0 + 1)


def test_ttl_from_completion_counts_after_terminal():
    """AIP-151 operations expire ttl after they are done."""
    task = make_task(ttl_s=5, retention=Retention.FROM_COMPLETION)
    task.advance(T0 + 1)
    assert task.expires_at() == pytest.approx(T0 + 6)


def test_expire_early_expires_at_the_terminal_instant():
    """expire_early deletes the task as soon as it is terminal."""
    task = make_task(faults=(Fault.EXPIRE_EARLY,))
    task.advance(T0 + 1)
    assert task.expires_at() == pytest.approx(T0 + 1)


def test_stale_view_repeats_the_last_non_terminal_snapshot_served():
    """poll_out_of_order serves what an earlier poll saw, not the terminal state."""
    task = make_task()
    seen = task.view(T0 + 0.5)
    task.advance(T0 + 2)
    stale = task.stale_view()
    assert stale.status is Status.WORKING
    assert stale.progress == seen.progress
    assert stale.stale


def test_input_replayed_presents_the_answered_round_once_more():
    """After the answer, one poll and one result stream see the same round key again."""
    task = make_task({"input_rounds": 1}, faults=(Fault.INPUT_REPLAYED,))
    task.advance(T0 + 1)
    task.answer("round-t1-1", {"action": "accept"}, T0 + 1)
    replayed = task.view(T0 + 1.1)
    assert replayed.status is Status.INPUT_REQUIRED
    assert replayed.input_round is not None
    assert replayed.input_round.key == "round-t1-1"
    assert task.view(T0 + 1.2).status is Status.WORKING
    stream_round = task.take_stream_replay()
    assert stream_round is not None
    assert stream_round.key == "round-t1-1"
    assert task.take_stream_replay() is None
    assert task.answer("round-t1-1", {"action": "accept"}, T0 + 1.3) is AnswerResult.STALE


def test_stale_epoch_result_carries_the_epoch_minus_one():
    """The result of a stale_epoch_result task reports the previous epoch."""
    task = make_task(faults=(Fault.STALE_EPOCH_RESULT,), epoch=7)
    task.advance(T0 + 1)
    assert task.result_epoch == 6


_EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["advance", "answer", "cancel_now", "request_cancel"]),
        st.floats(min_value=0, max_value=3),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(events=_EVENTS, rounds=st.integers(0, 2), outcome=st.sampled_from(["completed", "failed", "is_error"]))
def test_terminal_states_absorb_every_later_event(events, rounds, outcome):
    """Once terminal, no sequence of later events changes status, outcome or terminal time."""
    task = make_task({"input_rounds": rounds, "outcome": outcome})
    now = T0
    settled: tuple[object, ...] | None = None
    for kind, step in events:
        now += step
        if kind == "advance":
            task.advance(now)
        elif kind == "answer":
            pending = task.pending_round()
            task.answer(pending.key if pending else "round-t1-1", {"action": "accept"}, now)
        elif kind == "cancel_now":
            try:
                task.cancel_now(now)
            except CancelRejected:
                assert task.status in TERMINAL
        else:
            task.request_cancel(now, 0.1)
        if settled is not None:
            assert (task.status, task.outcome, task.terminal_at) == settled
        elif task.terminal:
            settled = (task.status, task.outcome, task.terminal_at)
