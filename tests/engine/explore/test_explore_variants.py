"""Each deliberately broken rule variant is caught, with a readable trace of its shortest failure."""

from __future__ import annotations

import pytest

from engine.explore import BROKEN, RULES, explore_pair, scenario_named
from engine.explore.world import Divergence
from engine.model import Protocol

P = Protocol

CAUGHT = [
    ("accept-late-completion", "late-completion", P.MCP_2026_07_28, Divergence.AFTER_CANCEL),
    ("skip-fetch", "happy", P.MCP_2025_11_25, Divergence.UNFETCHED),
    ("new-key-on-unknown", "create-lost", P.AIP_151, Divergence.SECOND_OPERATION),
    ("ignore-cancel-generation", "cancel-twice", P.MCP_2025_11_25, Divergence.FENCE),
    ("ack-as-terminal", "complete-vs-cancel", P.MCP_2026_07_28, Divergence.TERMINAL),
    ("stale-epoch-result", "stale-epoch", P.AIP_151, Divergence.FENCE),
    ("driver-epoch-stamp", "stale-epoch", P.MCP_2025_11_25, Divergence.FENCE),
]


@pytest.mark.parametrize(("rules", "scenario", "protocol", "kind"), CAUGHT)
def test_a_broken_variant_is_caught_with_a_trace(
    rules: str, scenario: str, protocol: Protocol, kind: Divergence
) -> None:
    """The explorer finds the variant's divergence and prints the shortest run that shows it."""
    result = explore_pair(scenario_named(scenario), protocol, rules=RULES[rules], budget=1_000)
    assert result.divergent > 0
    assert kind in result.kinds
    assert result.trace is not None
    assert result.trace.startswith(f"{scenario} on {protocol} (rules: {rules})")
    assert f"DIVERGENCE {kind}:" in result.trace


@pytest.mark.parametrize(("scenario", "protocol"), sorted({(c[1], c[2]) for c in CAUGHT}))
def test_the_engine_rules_pass_where_each_variant_fails(scenario: str, protocol: Protocol) -> None:
    """Same scenario, protocol and budget: the real rules give no divergence."""
    result = explore_pair(scenario_named(scenario), protocol, rules=RULES["engine"], budget=1_000)
    assert result.divergent == 0


def test_every_broken_variant_has_a_case_that_catches_it() -> None:
    """A new variant needs a row in CAUGHT."""
    assert sorted(BROKEN) == sorted(c[0] for c in CAUGHT)
