"""The explorer over the service executor's write groups (``service.explore_seat``): buffered writes,
group commits the explorer lets land, crashes between the buffering and the commit."""

from __future__ import annotations

import logging

import pytest

from engine.errors import ConfigError
from engine.explore import shipped
from engine.explore.explorer import explore_pair
from engine.explore.result import replay
from engine.explore.scenario import scenario_named
from engine.explore.shipped import WireWorld
from engine.model import LocalState, Protocol

P = Protocol
S = LocalState


def _walk(world: WireWorld, *steps: str) -> None:
    """Take each named step (``actor:verb``, the first enabled one of that name)."""
    for want in steps:
        enabled = world.enabled()
        action = next((a for a in enabled if f"{a[0]}:{a[1]}" == want), None)
        assert action is not None, f"{want} not enabled: {enabled}"
        world.perform(action)


def _proved_absent() -> WireWorld:
    """group-create-lost on AIP-151 up to NOT_FOUND_SAFE: the create lost, the lookup by key found nothing."""
    world = replay(scenario_named("group-create-lost"), P.AIP_151, [])
    _walk(world, "executor:submit", "executor:advance", "network:drop", "executor:commit", "executor:write")
    _walk(
        world, "executor:advance", "network:deliver", "network:deliver", "executor:commit", "executor:write"
    )
    return world


@pytest.fixture(autouse=True)
def _quiet() -> None:
    # The executor logs what it refuses; the explorer judges from the ledger instead.
    logging.getLogger("service.executor").setLevel(logging.CRITICAL)


@pytest.mark.parametrize(
    ("scenario", "protocol"),
    [("group-crash", P.AIP_151), ("group-create-lost", P.AIP_151)],
)
def test_the_service_executors_write_groups_pass_every_check(scenario: str, protocol: Protocol) -> None:
    """Sampled interleavings of the shipped executor's group commits, crashes and cancels end without a divergence."""
    result = explore_pair(scenario_named(scenario), protocol, budget=8, code="shipped")
    assert result.explored == 8
    assert result.divergent == 0, result.trace
    assert result.receipts + result.parked == 8


@pytest.mark.parametrize("ledger", ["memory", "duckdb"])
def test_a_crash_between_a_groups_buffering_and_its_commit_loses_the_group_and_the_restart_resumes_from_the_ledger(
    ledger: str,
) -> None:
    """The create's reply is buffered, its group taken but not landed, the executor dies: the ledger never
    saw it, and the restarted executor finds the task by key and accepts it once."""
    world = WireWorld(scenario_named("group-crash"), P.MCP_2026_07_28, ledger=ledger)
    try:
        _walk(world, "executor:submit", "executor:advance", "network:deliver", "network:deliver")
        seat = world.executors[0].seat
        assert seat.holds_writes()
        assert world.ledger.get(world.op_id).state is S.SUBMITTING
        _walk(world, "executor:commit")
        assert world.jobs
        assert world.ledger.get(world.op_id).state is S.SUBMITTING
        writes = len(world.writes)
        _walk(world, "executor:crash")
        assert not world.jobs
        assert len(world.writes) == writes
        assert world.ledger.get(world.op_id).state is S.SUBMITTING
        # The restarted executor resumes what the ledger holds: its submission's fate is unknown.
        for _ in range(60):
            enabled = world.enabled()
            if not enabled:
                break
            world.perform(next((a for a in enabled if a[1] not in ("crash", "cancel")), enabled[0]))
        assert world.ledger.get(world.op_id).state is S.ACCEPTED
        assert len([t for t in world.store._tasks.values() if t.echo.get("node") == world.node]) == 1
        assert world.finish() == []
    finally:
        world.close()


def test_an_advance_handed_back_before_its_group_is_durable_is_caught_sending_on_an_unrecorded_write() -> (
    None
):
    """Releasing the resubmission's advance while its group is still on the writer thread (what the
    ``executor-released-before-durable`` mutant does) sends the create on a row the ledger does not
    hold: ``unrecorded``."""
    world = _proved_absent()
    try:
        assert world.ledger.get(world.op_id).state is S.NOT_FOUND_SAFE
        _walk(world, "executor:advance")  # the resubmission, buffered
        ex = world.executors[0].seat.executor
        finished = list(ex._finished)
        _walk(world, "executor:commit")  # its group taken, on its way to the writer thread
        for wake in finished:
            ex._after(wake)
        _walk(world, "executor:advance")
        assert "unrecorded" in [k for k, _ in world.finish()]
    finally:
        world.close()


def test_the_clean_executor_sends_the_resubmission_only_after_its_group_landed() -> None:
    """The same run with the executor's own order: the create goes out once the resubmission is durable."""
    world = _proved_absent()
    try:
        _walk(world, "executor:advance", "executor:commit")
        assert ("executor", "advance", 0) not in world.enabled()  # held until its group is durable
        _walk(world, "executor:write", "executor:advance")
        assert world.ledger.get(world.op_id).state is S.SUBMITTING
        assert "unrecorded" not in [k for k, _ in world.finish()]  # (the run is cut short here)
    finally:
        world.close()


def test_a_group_scenario_without_the_service_executor_plugged_in_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine never imports the service: a group scenario with no seat handed in says how to hand one in."""
    monkeypatch.setattr(shipped, "_service_seat", [])
    with pytest.raises(ConfigError, match="plug_into_the_explorer"):
        WireWorld(scenario_named("group-crash"), P.MCP_2026_07_28)


def _to_the_end(world: WireWorld) -> None:
    """Take the first enabled step that is not a fault or a person's action, until nothing is enabled."""
    for _ in range(80):
        enabled = [
            a for a in world.enabled() if a[1] not in ("crash", "cancel", "raise-epoch", "raise-epoch-crash")
        ]
        if not enabled:
            return
        world.perform(enabled[0])


@pytest.mark.parametrize("ledger", ["memory", "duckdb"])
def test_a_rollback_while_a_poll_is_in_flight_adopts_the_operation_and_fences_the_old_drivers_reply(
    ledger: str,
) -> None:
    """The executor raises its own epoch while its advance awaits a status read: the operation is adopted at
    epoch 2; the reply, delivered after the raise to the old driver, is refused; the operation is not advanced
    again before that advance's group is durable, and it ends accepted once, at epoch 2 (before, the second
    advance's acceptance shared a group with the refused old writes, was refused with them, and the executor
    dropped the operation as accepted: it stayed WORKING, driven by nobody)."""
    world = WireWorld(scenario_named("group-rollback"), P.MCP_2026_07_28, ledger=ledger)
    try:
        _walk(world, "executor:submit", "executor:advance", "network:deliver", "network:deliver")
        _walk(
            world, "executor:commit", "executor:write", "server:work", "executor:advance", "network:deliver"
        )
        assert world.ledger.get(world.op_id).state is S.WORKING
        _walk(world, "operator:raise-epoch")
        assert world.ledger.get(world.op_id).epoch == 2
        _walk(world, "network:deliver")  # the completed status, to the driver of epoch 1
        _to_the_end(world)
        op = world.ledger.get(world.op_id)
        assert (op.state, op.epoch) == (S.ACCEPTED, 2)
        assert world.finish() == []
    finally:
        world.close()


def test_a_rollback_recorded_by_a_process_that_dies_before_adopting_is_adopted_by_the_restarted_one() -> None:
    """The raised epoch is recorded and the executor dies before it adopts: the restarted executor starts at
    epoch 2 and adopts the operation itself (``Loop._resume``), then drives it to its receipt."""
    world = WireWorld(scenario_named("group-rollback-restart"), P.AIP_151)
    try:
        _walk(world, "executor:submit", "executor:advance", "network:deliver", "network:deliver")
        _walk(world, "executor:commit", "executor:write")
        assert world.ledger.get(world.op_id).state is S.WORKING
        _walk(world, "operator:raise-epoch-crash")
        fresh = world.executors[world.active]
        assert (fresh.index, fresh.epoch) == (1, 2)
        adopted = world.writes[-1]
        assert (adopted.writer, type(adopted.transition.event).__name__) == (1, "EpochRaised")
        assert world.ledger.get(world.op_id).epoch == 2
        _to_the_end(world)
        assert world.ledger.get(world.op_id).state is S.ACCEPTED
        assert world.finish() == []
    finally:
        world.close()
