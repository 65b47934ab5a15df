"""Merging equivalent interleavings by state counts exactly what running every interleaving finds."""

from __future__ import annotations

import io

import pytest

from engine.errors import StateLimit
from engine.explore import RULES, explore_pair, scenario_named
from engine.explore.cli import EXIT_OK, EXIT_USAGE, main
from engine.explore.prune import explore_pruned
from engine.model import Protocol

P = Protocol

SMALL = [
    ("engine", "crash-restart", P.MCP_2025_11_25),
    ("engine", "create-lost", P.MCP_2025_11_25),
    ("engine", "not-found-after-expiry", P.MCP_2026_07_28),
    ("engine", "create-lost-no-lookup", P.MCP_2026_07_28),
    ("ack-as-terminal", "complete-vs-cancel", P.MCP_2026_07_28),
    ("skip-fetch", "result-lost", P.MCP_2025_11_25),
    ("accept-late-completion", "late-completion", P.AIP_151),
]


@pytest.mark.parametrize(("rules", "scenario", "protocol"), SMALL)
def test_merged_counts_equal_the_counts_of_running_every_interleaving(
    rules: str, scenario: str, protocol: Protocol
) -> None:
    """Interleavings, divergent, parked and receipts agree with plain exhaustive enumeration."""
    plain = explore_pair(scenario_named(scenario), protocol, rules=RULES[rules], budget=20_000)
    merged = explore_pruned(scenario_named(scenario), protocol, rules=RULES[rules])
    assert plain.exhaustive
    assert (merged.explored, merged.divergent, merged.parked, merged.receipts) == (
        plain.explored,
        plain.divergent,
        plain.parked,
        plain.receipts,
    )
    assert merged.kinds == plain.kinds
    assert merged.states < merged.explored or merged.explored < 100


def test_merging_exhausts_a_tree_too_large_to_run_one_by_one() -> None:
    """input-replayed has billions of interleavings; every one is covered, none diverges."""
    result = explore_pruned(scenario_named("input-replayed"), P.MCP_2026_07_28)
    assert result.exhaustive
    assert result.explored > 1_000_000_000
    assert result.divergent == 0


def test_the_shortest_divergent_interleaving_is_found_and_traced() -> None:
    """With merging, the trace is the globally shortest divergent run, replayed step by step."""
    merged = explore_pruned(
        scenario_named("complete-vs-cancel"), P.MCP_2026_07_28, rules=RULES["ack-as-terminal"]
    )
    plain = explore_pair(
        scenario_named("complete-vs-cancel"), P.MCP_2026_07_28, rules=RULES["ack-as-terminal"], budget=1_000
    )
    assert merged.shortest is not None
    assert plain.shortest is not None
    assert len(merged.shortest.choices) == len(plain.shortest.choices)
    assert merged.trace is not None
    assert "DIVERGENCE terminal" in merged.trace


def test_a_state_limit_stops_the_search() -> None:
    """Too many distinct states raise StateLimit instead of running for ever."""
    with pytest.raises(StateLimit):
        explore_pruned(scenario_named("crash-restart-input"), P.MCP_2025_11_25, max_states=500)


def test_the_cli_prune_option_reports_merged_exhaustive_counts() -> None:
    """--prune explores each selected pair completely; a too small --max-states is a usage error."""
    out = io.StringIO()
    assert (
        main(["--code", "model", "--prune", "--scenario", "cancel-ack-lost"], out=out, err=io.StringIO())
        == EXIT_OK
    )
    assert (
        "0 divergent of 10,539 distinct interleavings (3 of 3 scenario/protocol pairs exhaustive"
        in out.getvalue()
    )
    err = io.StringIO()
    assert (
        main(
            ["--code", "model", "--prune", "--scenario", "stale-epoch", "--max-states", "10"],
            out=io.StringIO(),
            err=err,
        )
        == EXIT_USAGE
    )
    assert "max-states" in err.getvalue()


def test_a_sampled_pair_prints_the_shortest_divergent_interleaving_of_all() -> None:
    """Even when the budget only samples the tree, the trace is the globally shortest failure."""
    scenario = scenario_named("cancel-ack-lost")
    sampled = explore_pair(scenario, P.MCP_2026_07_28, rules=RULES["ack-as-terminal"], budget=50)
    merged = explore_pruned(scenario, P.MCP_2026_07_28, rules=RULES["ack-as-terminal"])
    assert not sampled.exhaustive
    assert sampled.shortest is not None
    assert merged.shortest is not None
    assert sampled.shortest.choices == merged.shortest.choices


def test_every_interleaving_around_expiry_keeps_the_row_version_honest() -> None:
    """Found by the explorer: a stale status that moved UNKNOWN back to WORKING kept its row version.

    Covers all interleavings of 404-after-expiry (two pollers) on every protocol; none diverges.
    """
    for protocol in scenario_named("not-found-after-expiry").protocols:
        result = explore_pruned(scenario_named("not-found-after-expiry"), protocol)
        assert result.divergent == 0, result.trace
