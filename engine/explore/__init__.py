"""Finality's deterministic race explorer: every interleaving of a scenario's actors, judged.

The explorer runs the real transition function (``engine.machine.step``) and the ledger's
acceptance rule (``engine.acceptance.check_acceptance``, inside an in-memory ledger) against
simulated servers, a lossy and reordering network, executor crashes and epoch raises, and
reports every run whose outcome diverges from the server's truth. Simulation only: it never talks
to a real server or writes a real ledger (except ``cli.main --ledger``, which records summaries).
"""

from engine.explore.explorer import PairResult, explore, explore_pair, render_trace, replay, selected_pairs
from engine.explore.rules import BROKEN, ENGINE, RULES, Rules
from engine.explore.scenario import SCENARIOS, Scenario, scenario_named
from engine.explore.world import Divergence, World

__all__ = [
    "BROKEN",
    "ENGINE",
    "RULES",
    "SCENARIOS",
    "Divergence",
    "PairResult",
    "Rules",
    "Scenario",
    "World",
    "explore",
    "explore_pair",
    "render_trace",
    "replay",
    "scenario_named",
    "selected_pairs",
]
