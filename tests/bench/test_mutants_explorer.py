"""The explorer half of ``make mutants`` on the seed-rule mutants: every one caught by the explorer alone.

Off by default: it costs minutes of one core (see bench/results/mutants.md for the measured time),
more than the suite's room. ``FINALITY_MUTANTS_IN_TESTS=1`` runs it; the lead enables it for good
by dropping the ``skipif`` once the suite has the room.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bench_kit import load

pytestmark = pytest.mark.skipif(
    os.environ.get("FINALITY_MUTANTS_IN_TESTS") != "1",
    reason="the explorer half of make mutants costs minutes (FINALITY_MUTANTS_IN_TESTS=1 runs it)",
)


def test_every_mutant_that_breaks_a_seed_rule_is_caught_by_the_explorer_alone(tmp_path: Path) -> None:
    """Each seed-rule mutant, applied to a copy of the tree, makes the explorer report a divergence."""
    mutants = load("mutants")
    seed_rule = [m.id for m in mutants.MUTANTS if m.seed_rule]
    out = tmp_path / "mutants.md"
    code = mutants.main(["--per-pair", "1", "--hint-budget", "30", "--only", *seed_rule, "--out", str(out)])
    report = out.read_text()
    assert "does not apply" not in report, report
    assert code == 0, report
