"""The simulated servers answer the way each protocol's contract (and adapter) says they do."""

from __future__ import annotations

from datetime import timedelta

import pytest

from engine.adapters.base import CancelResult, Created, Outcome, ServerView
from engine.explore.server import Failure, Kind, Request, SimServer, SimTask
from engine.model import Epoch, IdempotencyKey, Protocol, ServerStatus, TaskId
from engine.testing import EPOCH_START

P = Protocol
E = Epoch(1)
KEY = IdempotencyKey("key-1")


def server(
    protocol: Protocol, script: tuple[str, ...] = ("complete",), echo_creation_epoch: bool = False
) -> SimServer:
    return SimServer(
        protocol, script, lookup_by_key=True, ttl=timedelta(hours=1), echo_creation_epoch=echo_creation_epoch
    )


def ask(srv: SimServer, kind: Kind, task: str | None = "t1", **fields: object) -> object:
    request = Request(1, kind, 0, fields.pop("epoch", E), TaskId(task) if task else None, **fields)  # type: ignore[arg-type]
    return srv.handle(request, EPOCH_START)


def submitted(srv: SimServer) -> SimTask:
    reply = ask(srv, Kind.SUBMIT, None, key=KEY)
    assert isinstance(reply, Created)
    return srv.tasks[reply.view.task_id]


def test_a_2025_cancel_of_a_running_task_confirms_the_cancelled_terminal() -> None:
    """MCP 2025-11-25: the task is cancelled before the reply, so success is terminal evidence."""
    srv = server(P.MCP_2025_11_25)
    task = submitted(srv)
    assert ask(srv, Kind.CANCEL, generation=1) is CancelResult.CONFIRMED
    assert task.status is ServerStatus.CANCELLED
    assert task.first_terminal is ServerStatus.CANCELLED
    assert [w for w, _ in srv.work()] == []


def test_a_2025_cancel_of_a_finished_task_is_refused_and_changes_nothing() -> None:
    """-32602 on a terminal task: the completion stands."""
    srv = server(P.MCP_2025_11_25)
    task = submitted(srv)
    srv.do_work("complete", task.task_id)
    assert ask(srv, Kind.CANCEL, generation=1) is CancelResult.ALREADY_TERMINAL
    assert task.first_terminal is ServerStatus.COMPLETED


@pytest.mark.parametrize("protocol", [P.MCP_2026_07_28, P.AIP_151])
def test_a_2026_or_aip_cancel_is_only_acknowledged_and_the_task_may_still_complete(
    protocol: Protocol,
) -> None:
    """The 2026-07-28 extension and AIP-151 acknowledge; honouring the cancel races the completion."""
    srv = server(protocol)
    task = submitted(srv)
    assert ask(srv, Kind.CANCEL, generation=1) is CancelResult.ACKNOWLEDGED
    assert task.status is ServerStatus.WORKING
    assert sorted(w for w, _ in srv.work()) == ["complete", "honour-cancel"]
    srv.do_work("complete", task.task_id)
    assert task.first_terminal is ServerStatus.COMPLETED


def test_the_2025_status_read_carries_no_outcome_but_2026_and_aip_carry_it_inline() -> None:
    """tasks/get is status only on 2025-11-25; the others put the outcome in the status read."""
    for protocol, inline in [(P.MCP_2025_11_25, False), (P.MCP_2026_07_28, True), (P.AIP_151, True)]:
        srv = server(protocol)
        task = submitted(srv)
        srv.do_work("complete", task.task_id)
        view = ask(srv, Kind.GET)
        assert isinstance(view, ServerView)
        assert (view.outcome is not None) is inline


def test_a_repeated_create_with_the_same_key_returns_the_same_operation() -> None:
    """AIP-155 request_id (and SEP-3182 keys): the repeat is the same single call."""
    srv = server(P.AIP_151)
    first = submitted(srv)
    again = ask(srv, Kind.LOOKUP, None, key=KEY)
    assert isinstance(again, ServerView)
    assert again.task_id == first.task_id
    assert srv.created == [first.task_id]


def test_a_stale_input_key_is_ignored() -> None:
    """An answer to an older input round changes nothing; the right key resumes the work."""
    srv = server(P.MCP_2026_07_28, script=("input", "complete"))
    task = submitted(srv)
    srv.do_work("input", task.task_id)
    assert ask(srv, Kind.INPUT, input_key="t1/in0") is None
    statuses = [task.status]
    ask(srv, Kind.INPUT, input_key=task.input_key)
    statuses.append(task.status)
    assert statuses == [ServerStatus.INPUT_REQUIRED, ServerStatus.WORKING]


def test_outcomes_echo_the_request_epoch_or_the_creating_epoch() -> None:
    """By default a result echoes the epoch of its request; the refserver's way echoes the creation's."""
    for creation, echo in [(False, 2), (True, 1)]:
        srv = server(P.MCP_2025_11_25, echo_creation_epoch=creation)
        task = submitted(srv)
        srv.do_work("complete", task.task_id)
        outcome = ask(srv, Kind.RESULT, epoch=Epoch(2))
        assert isinstance(outcome, Outcome)
        assert outcome.epoch_echo == echo


def test_a_lost_task_answers_not_found() -> None:
    """After eviction or expiry every read is "not found"."""
    srv = server(P.AIP_151)
    task = submitted(srv)
    srv.evict(task.task_id)
    assert ask(srv, Kind.GET) is Failure.NOT_FOUND
    assert ask(srv, Kind.RESULT) is Failure.NOT_FOUND
    assert ask(srv, Kind.CANCEL, generation=1) is Failure.NOT_FOUND
