"""The explorer runs distinct interleavings, deterministically, and the real rules never diverge."""

from __future__ import annotations

from engine.explore import SCENARIOS, explore, explore_pair, render_trace, scenario_named, selected_pairs
from engine.explore.executor import MAX_FETCH_ATTEMPTS
from engine.explore.explorer import PairExplorer, replay
from engine.explore.rules import ENGINE
from engine.explore.scenario import FINDINGS
from engine.explore.server import Kind, Request
from engine.explore.world import OP_ID, Divergence, World
from engine.machine import step
from engine.model import (
    Epoch,
    LocalState,
    NotFound,
    Protocol,
    ServerStatus,
    StatusObserved,
    Submitted,
    TaskId,
)
from engine.runtime import driver
from engine.testing import EPOCH_START, make_operation

P = Protocol


def test_the_engine_rules_diverge_in_none_of_ten_thousand_interleavings() -> None:
    """The gate: 10,000 distinct interleavings across every scenario and protocol, 0 divergent."""
    results = explore(selected_pairs(SCENARIOS), permutations=10_000, seed=0)
    assert sum(r.explored for r in results) == 10_000
    assert [(r.scenario, r.protocol, r.kinds) for r in results if r.divergent] == []


def test_no_interleaving_is_run_twice() -> None:
    """Each run is a different sequence of choices, even once the budget exceeds what is left."""
    explorer = PairExplorer(scenario_named("crash-restart"), P.MCP_2026_07_28)
    explorer.record = []
    explorer.run(700)
    explorer.run(700)
    assert len(explorer.record) == 1400
    assert len(set(explorer.record)) == 1400


def test_a_small_scenario_is_enumerated_exhaustively_by_either_strategy() -> None:
    """Depth-first and seeded-random order reach exactly the same set of interleavings."""
    seen = {}
    for strategy in ("dfs", "sample"):
        explorer = PairExplorer(scenario_named("happy"), P.MCP_2025_11_25, strategy=strategy)
        explorer.record = []
        explorer.run(10_000)
        assert explorer.exhausted
        seen[strategy] = set(explorer.record)
    assert seen["dfs"] == seen["sample"]
    assert len(seen["dfs"]) == 289


def test_the_same_seed_explores_the_same_interleavings_in_the_same_order() -> None:
    """Sampling is seeded: equal seeds agree run for run, another seed takes another order."""
    orders = []
    for seed in (7, 7, 8):
        explorer = PairExplorer(scenario_named("stale-epoch"), P.AIP_151, seed=seed)
        explorer.record = []
        explorer.run(200)
        orders.append(explorer.record)
    assert orders[0] == orders[1]
    assert orders[0] != orders[2]


def test_the_executor_crashes_at_every_point_and_still_ends_with_the_servers_terminal() -> None:
    """crash-restart is enumerated exhaustively: a crash after every step of every interleaving."""
    for protocol in (P.MCP_2025_11_25, P.AIP_151):
        result = explore_pair(scenario_named("crash-restart"), protocol, budget=10_000)
        assert result.exhaustive
        assert result.divergent == 0
        assert result.receipts == result.explored


def test_budget_left_over_by_small_trees_goes_to_the_larger_ones() -> None:
    """Exhausted scenarios hand their share on, so the requested total is reached."""
    pairs = [(scenario_named("task-id-reused"), P.AIP_151), (scenario_named("cancel-twice"), P.AIP_151)]
    results = explore(pairs, permutations=600)
    assert [r.explored for r in results] == [2, 598]
    assert results[0].exhaustive


def test_a_restart_in_submitting_looks_up_by_the_same_key_instead_of_resubmitting() -> None:
    """The driver's rule: SUBMITTING found after a restart becomes SUBMISSION_UNKNOWN, then a lookup."""
    world = World(scenario_named("crash-restart"), P.AIP_151, ENGINE)
    world.perform(("caller", "submit", None))
    world.perform(("executor", "submit", 0))
    world.perform(("executor", "crash", 0))
    assert ("executor", "resume-submitting", 1) in world.enabled()
    world.perform(("executor", "resume-submitting", 1))
    op = world.ledger.get(OP_ID)
    assert op is not None
    assert op.state is LocalState.SUBMISSION_UNKNOWN
    world.perform(("executor", "lookup", 1))
    lookups = [m for m in world.net if isinstance(m, Request) and m.kind is Kind.LOOKUP]
    assert [m.key for m in lookups] == [op.idempotency_key]
    assert [m.kind for m in world.net if isinstance(m, Request)] == [Kind.SUBMIT, Kind.LOOKUP]


def test_the_simulated_executor_keeps_the_drivers_fetch_attempt_limit() -> None:
    """The executor mirrors engine.runtime.driver; its constants must not drift."""
    assert MAX_FETCH_ATTEMPTS == driver.MAX_FETCH_ATTEMPTS


def test_a_trace_has_one_line_per_step_with_local_and_server_state() -> None:
    """Replaying a run's choices prints actor, action and the resulting states for each step."""
    scenario = scenario_named("complete-vs-cancel")
    explorer = PairExplorer(scenario, P.MCP_2025_11_25)
    explorer.record = []
    explorer.run(1)
    choices = explorer.record[0]
    lines = render_trace(scenario, P.MCP_2025_11_25, ENGINE, choices).splitlines()
    assert len(lines) == len(choices) + 1
    assert lines[1].split()[:2] == ["1", "caller"]
    assert all(" -> " in line and " / " in line for line in lines[1:])


def test_runs_that_end_parked_have_told_a_person_and_are_not_divergent() -> None:
    """404 before expiry parks in UNKNOWN with a reconciliation item; without the item it is LOST."""
    scenario = scenario_named("not-found-before-expiry")
    explorer = PairExplorer(scenario, P.MCP_2025_11_25)
    explorer.record = []
    explorer.run(10_000)
    result = explorer.finish()
    assert result.exhaustive
    assert result.parked > 0
    assert result.divergent == 0
    parked = next(c for c in explorer.record if replay(scenario, P.MCP_2025_11_25, ENGINE, c).parked)
    world = replay(scenario, P.MCP_2025_11_25, ENGINE, parked)
    assert world.finish() == []
    world.ledger.entries.clear()
    assert [kind for kind, _ in world.finish()] == [Divergence.LOST]


def test_a_rollback_on_a_server_echoing_the_creation_epoch_parks_once_instead_of_cycling() -> None:
    """Formerly an open finding (UNKNOWN -> FETCHING_RESULT for ever): the model now plans with the
    driver's own table (``engine.runtime.plan``), which leaves a terminal UNKNOWN to a person."""
    result = explore_pair(scenario_named("rollback-creation-echo"), P.MCP_2026_07_28, budget=200)
    assert result.divergent == 0, result.trace
    assert result.parked > 0
    assert not FINDINGS


def test_leaving_unknown_on_a_repeated_status_raises_the_row_version() -> None:
    """Regression found by the explorer: UNKNOWN -> WORKING must be a write compare-and-swap can see."""
    op = make_operation("n1")
    for event in (
        Submitted(TaskId("t1"), Epoch(1)),
        StatusObserved(TaskId("t1"), ServerStatus.WORKING, Epoch(1)),
        NotFound(Epoch(1)),
    ):
        op = step(op, event, EPOCH_START).after
    t = step(op, StatusObserved(TaskId("t1"), ServerStatus.WORKING, Epoch(1)), EPOCH_START)
    assert (t.before.state, t.after.state) == (LocalState.UNKNOWN, LocalState.WORKING)
    assert t.after.row_version == t.before.row_version + 1
