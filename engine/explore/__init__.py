"""Finality's deterministic race explorer: the interleavings of the shipped code, judged.

Each run is the real ``engine.runtime.driver.Driver`` with the real protocol adapters, talking over
an in-process network to the reference server's own protocol code on a virtual clock, with the
explorer choosing at every point where the wire or the ledger is touched what happens next
(``engine.explore.shipped``, ``engine.explore.wire``). Every run is judged by the seed's invariants
from the ledger's writes and the server's own records. Simulation only: it never talks to a real
server or writes a real ledger (except ``cli.main --ledger``, which records summaries).
"""

from engine.explore.explorer import PairResult, explore, explore_pair, render_trace, replay, selected_pairs
from engine.explore.scenario import SCENARIOS, Scenario, scenario_named
from engine.explore.shipped import use_service_executor

__all__ = [
    "SCENARIOS",
    "PairResult",
    "Scenario",
    "explore",
    "explore_pair",
    "render_trace",
    "replay",
    "scenario_named",
    "selected_pairs",
    "use_service_executor",
]
