"""The merging search over the shipped code: exact counts, honest partial results, replayable traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.explore.explorer import explore, explore_pair
from engine.explore.keys import digest
from engine.explore.prune import MergingSearch, estimate_paths, explore_merged, search_result
from engine.explore.result import render_trace
from engine.explore.scenario import scenario_named
from engine.model import Protocol

P = Protocol
ROOT = Path(__file__).resolve().parents[3]


def _counts(result: object) -> tuple[object, ...]:
    r = result
    return (r.explored, r.receipts, r.parked, r.divergent, r.exhaustive, dict(r.kinds))  # type: ignore[attr-defined]


def test_merged_counts_equal_the_counts_of_running_every_interleaving() -> None:
    """Merging equal states runs fewer runs but counts exactly the interleavings, receipts and parks
    that running every interleaving one by one counts."""
    scenario = scenario_named("complete-vs-cancel")
    merged = explore_merged(scenario, P.AIP_151, max_runs=1_000)
    one_by_one = explore_pair(scenario, P.AIP_151, budget=1_000, strategy="dfs")
    assert merged.exhaustive
    assert one_by_one.exhaustive
    assert _counts(merged) == _counts(one_by_one)
    assert merged.runs < one_by_one.explored
    assert merged.states > 0


@pytest.mark.usefixtures("ack_taken_as_confirmed")
def test_merging_counts_every_divergent_interleaving_and_keeps_the_shortest_replayable() -> None:
    """On a broken adapter the merged search counts as many divergent interleavings as running each
    one does, and its shortest divergent choices replay to the same divergence."""
    scenario = scenario_named("complete-vs-cancel")
    merged = explore_merged(scenario, P.MCP_2026_07_28, max_runs=1_000)
    one_by_one = explore_pair(scenario, P.MCP_2026_07_28, budget=1_000, strategy="dfs")
    assert merged.exhaustive
    assert one_by_one.exhaustive
    assert merged.divergent > 0
    assert _counts(merged) == _counts(one_by_one)
    assert merged.shortest is not None
    assert len(merged.shortest.choices) <= len(one_by_one.shortest.choices)  # type: ignore[union-attr]
    trace = render_trace(scenario, P.MCP_2026_07_28, merged.shortest.choices)
    assert "DIVERGENCE terminal: accepted cancelled; the server's truth is completed" in trace


def test_a_run_budget_too_small_is_reported_as_sampled_with_what_it_covered() -> None:
    """When the runs run out the pair is not exhaustive; what it counts lies in subtrees it finished."""
    result = explore_merged(scenario_named("happy"), P.MCP_2025_11_25, max_runs=6)
    assert result.runs == 6
    assert not result.exhaustive
    assert 0 < result.explored == result.receipts + result.parked + result.divergent


def test_states_that_differ_only_in_when_the_driver_would_wake_merge_and_count_exactly() -> None:
    """The driver's wake jitter (its generator) and the server's advised poll interval are not in the
    state key, so runs that polled a different number of times merge; the merged counts still equal
    running every interleaving one by one."""
    scenario = scenario_named("failure")
    merged = explore_merged(scenario, P.MCP_2025_11_25, max_runs=1_000)
    one_by_one = explore_pair(scenario, P.MCP_2025_11_25, budget=1_000, strategy="dfs")
    assert merged.exhaustive
    assert one_by_one.exhaustive
    assert _counts(merged) == _counts(one_by_one)
    assert merged.runs < one_by_one.explored


_FORKED = """
import json
from engine.explore.prune import MergingSearch
from engine.explore.scenario import scenario_named
from engine.model import Protocol
search = MergingSearch(scenario_named("complete-vs-cancel"), Protocol.AIP_151, max_runs=1_000, fork=True, fork_after=0)
summary, complete = search.run()
print(json.dumps([summary.paths, summary.receipts, summary.parked, summary.divergent, complete,
                  search.runs, search.forks, len(search.memo)]))
"""


def test_branches_reached_by_forking_count_exactly_what_replaying_their_prefix_counts() -> None:
    """A branch taken in a forked copy of the process is the same run continued: the search counts
    the same interleavings, states and runs as when it replays every branch's prefix."""
    # The forking search runs in a fresh interpreter: this test's worker holds the native threads
    # of the tests before it (DuckDB, pyarrow, the HTTP pools), and a fork of such a process is
    # what can_fork() refuses; forced here, its child died in a CI run.
    forked = subprocess.run(
        [sys.executable, "-c", _FORKED], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    paths, receipts, parked, divergent, complete, runs, forks, memo = json.loads(forked.stdout)
    replayed = MergingSearch(scenario_named("complete-vs-cancel"), P.AIP_151, max_runs=1_000, fork=False)
    by_replay, _ = replayed.run()
    assert complete
    assert forks == runs - 1 > 0
    assert replayed.forks == 0
    assert (paths, receipts, parked, divergent) == (
        by_replay.paths,
        by_replay.receipts,
        by_replay.parked,
        by_replay.divergent,
    )
    assert (runs, memo) == (replayed.runs, len(replayed.memo))


def test_states_that_differ_only_in_the_servers_interval_jitter_merge_and_count_exactly() -> None:
    """On MCP 2026-07-28 the server draws every advised poll interval from its seeded generator;
    once the task exists the generator is out of the key, and the merged counts still equal
    running every interleaving one by one."""
    scenario = scenario_named("failure")
    merged = explore_merged(scenario, P.MCP_2026_07_28, max_runs=1_000)
    one_by_one = explore_pair(scenario, P.MCP_2026_07_28, budget=1_000, strategy="dfs")
    assert merged.exhaustive
    assert one_by_one.exhaustive
    assert _counts(merged) == _counts(one_by_one)
    assert merged.runs < one_by_one.explored


def _key_without_the_coroutines(world: object) -> bytes | None:
    """The state key with its live coroutines' labels left out: an unsound key (mid-exchange, two
    states then look alike whose executors wait on different replies or hold different locals)."""
    key = world.state_key()  # type: ignore[attr-defined]
    if key is None:
        return None
    live = world._live()  # type: ignore[attr-defined]
    return digest(tuple(part for part in key if part != live))


@pytest.mark.parametrize(
    ("name", "protocol", "budget"),
    [
        ("complete-vs-cancel", P.AIP_151, 200),
        ("cancel-not-found", P.MCP_2026_07_28, 200),
        ("happy", P.AIP_151, 150),
    ],
)
def test_states_the_key_merges_mid_exchange_have_equal_futures(
    name: str, protocol: Protocol, budget: int
) -> None:
    """Nothing merged, every state keyed: every two states with one key, in the middle of an
    exchange or not, have the same futures below them (interleavings, receipts, parks,
    divergences by kind)."""
    search = MergingSearch(scenario_named(name), protocol, max_runs=budget, check=lambda w: w.state_digest())
    search.run()
    assert len(search.memo) > 0
    assert search.unsound == []


def test_a_key_that_leaves_out_the_coroutines_is_caught_merging_states_with_different_futures() -> None:
    """The check above can fail: without the live coroutines' labels the key gives one name to
    states whose futures differ, and the check lists them."""
    search = MergingSearch(
        scenario_named("happy"), P.AIP_151, max_runs=150, check=_key_without_the_coroutines
    )
    search.run()
    assert search.unsound
    _, futures, earlier = search.unsound[0]
    assert (futures.paths, futures.receipts) != (
        earlier.paths,
        earlier.receipts,
    ) or futures.kinds != earlier.kinds


def test_a_space_estimate_of_a_finished_search_is_its_exact_count() -> None:
    """Every probe of a search that finished meets its root in the memo: the estimate is exact."""
    search = MergingSearch(scenario_named("complete-vs-cancel"), P.AIP_151, max_runs=1_000)
    summary, complete = search.run()
    assert complete
    assert estimate_paths(search, 4) == summary.paths


def test_a_pair_sampled_while_only_quiet_states_were_keyed_is_exhaustive_within_the_same_budget() -> None:
    """With states keyed only where no coroutine was mid-exchange, AIP-151 ``happy`` (a request
    may be duplicated) took 237 runs to finish; keyed mid-exchange too it finishes within 210,
    counting the same 770 interleavings."""
    result = explore_merged(scenario_named("happy"), P.AIP_151, max_runs=210)
    assert result.exhaustive
    assert result.explored == result.space == 770


def test_a_search_stopped_at_its_space_limit_proves_the_pair_has_at_least_what_it_covered() -> None:
    """With ``max_paths`` the search starts no run once its finished subtrees cover that many
    interleavings: the pair (MCP 2025-11-25 ``happy``, 1,116 in all) is not exhausted, and what it
    counts, all distinct and judged, is a lower bound on its space, not an estimate."""
    result = explore_merged(scenario_named("happy"), P.MCP_2025_11_25, max_runs=10_000, max_paths=300)
    assert not result.exhaustive
    assert result.stopped == "paths"
    assert result.space_kind == "at_least"
    assert 300 <= result.explored == result.space < 1_116
    assert result.explored == result.receipts + result.parked + result.divergent
    assert result.space_probes == 0


def test_a_search_run_again_with_more_runs_counts_what_one_uninterrupted_search_counts() -> None:
    """A search stopped by its run budget goes on where it stopped when run again with a larger one:
    it finishes with the exact counts of a search that never stopped, in few more runs."""
    scenario = scenario_named("happy")
    whole = explore_merged(scenario, P.AIP_151, max_runs=10_000)
    search = MergingSearch(scenario, P.AIP_151, max_runs=60)
    summary, complete = search.run()
    assert not complete
    assert search.stopped == "runs"
    assert 0 < summary.paths < whole.explored
    search.max_runs = 10_000
    again = search_result(search)
    assert again.exhaustive
    assert again.space_kind == "exact"
    assert _counts(again) == _counts(whole)
    assert again.runs < whole.runs + 60


def test_a_search_past_its_deadline_starts_no_new_run() -> None:
    """The deadline is read from the injected clock before each run: once it has passed the search
    stops, says why, and keeps what it finished."""
    ticks = iter(range(1_000_000))
    search = MergingSearch(
        scenario_named("happy"), P.AIP_151, max_runs=10_000, deadline=20.0, clock=lambda: float(next(ticks))
    )
    summary, complete = search.run()
    assert not complete
    assert search.stopped == "time"
    assert search.runs == 20
    assert summary.paths > 0


def test_a_budget_run_gives_what_small_pairs_leave_over_to_a_pair_just_over_its_share() -> None:
    """The budget is not stopped at an equal share per pair: what the small trees leave over is
    poured into the pairs still open, so a pair first in the catalogue that needs a few times its
    share (MCP 2025-11-25 ``happy``: 224 runs; its share of 300 runs over four pairs is 75) is
    exhausted too, and the runs stay within the budget."""
    tiny = scenario_named("task-id-reused")
    pairs = [(scenario_named("happy"), P.MCP_2025_11_25), *((tiny, p) for p in tiny.protocols)]
    results = explore(pairs, permutations=300)
    assert [(r.scenario, r.exhaustive) for r in results] == [
        ("happy", True),
        ("task-id-reused", True),
        ("task-id-reused", True),
        ("task-id-reused", True),
    ]
    assert results[0].explored == results[0].space == 1_116
    assert sum(r.runs for r in results) <= 300
