"""What exploring one (scenario, protocol) pair found, and its runs replayed as readable timelines.

Shared by the sampling walk (``engine.explore.explorer``) and the state-merging search
(``engine.explore.prune``), which both import it and not each other. ``replay`` runs one interleaving
of the shipped driver and adapters again by its choices; it decides nothing itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.explore.scenario import Scenario
from engine.model import Protocol

CODES = ("shipped",)
"""What an explorer run runs: ``shipped`` is ``engine/runtime/driver.py`` with the real adapters
against the reference servers (the only code there is: the simulated copy, ``model``, is gone;
``explorer_runs`` rows of older revisions may still say ``model``)."""
RULES = "engine"
"""The rule set a run judges by (recorded in ``explorer_runs.rules``): the engine's own, as shipped.
Broken variants are ``make mutants``' one-line bugs in the shipped code."""

Finding = tuple[str, str]
SPACE_EXACT = "exact"
"""``PairResult.space`` is the pair's exact count of interleavings (the search covered them all)."""
SPACE_AT_LEAST = "at_least"
"""``space`` is a proven lower bound: the interleavings covered, all distinct, when the search
stopped at its limit (``finality explore --exhaustive``: the pair has at least that many)."""
SPACE_ESTIMATE = "estimate"
"""``space`` is an estimate (Knuth's random probes): neither a bound nor a count."""
SPACE_KINDS = (SPACE_EXACT, SPACE_AT_LEAST, SPACE_ESTIMATE)
DUCKDB_SHARE = 8
"""Every this-many-th run of a shipped-code pair writes through the real DuckDB ledger (the others
through the in-memory one, which keeps the same rules and is much faster)."""


@dataclass(frozen=True, slots=True)
class Failing:
    """One divergent run: its choices (replayable) and what was wrong with it."""

    choices: tuple[int, ...]
    findings: tuple[Finding, ...]
    ledger: str = "memory"
    """The shipped code's runs: the ledger it ran on (``memory``, or ``duckdb`` for a share of them)."""


@dataclass(slots=True)
class PairResult:
    """What exploring one scenario under one protocol found."""

    scenario: str
    protocol: Protocol
    rules: str
    seed: int
    explored: int = 0
    """Distinct interleavings run (each a different sequence of choices)."""
    exhaustive: bool = False
    """Every interleaving of the scenario was run."""
    divergent: int = 0
    receipts: int = 0
    parked: int = 0
    """Runs that ended in UNKNOWN or INPUT_REQUIRED with a person told (not divergences)."""
    kinds: dict[str, int] = field(default_factory=dict)
    states: int = 0
    """Distinct states executed, when equivalent interleavings were merged (0 otherwise)."""
    shortest: Failing | None = None
    trace: str | None = None
    seconds: float = 0.0
    code: str = "shipped"
    """Which code ran (``CODES``)."""
    runs: int = 0
    """Worlds actually run (with state merging, ``explored`` counts the interleavings covered)."""
    space: float | None = None
    """The pair's interleavings, all of them: exact when ``exhaustive``, else an estimate
    (``space_probes`` random probes, ``engine.explore.prune.estimate_paths``); ``None``: not known."""
    space_probes: int = 0
    """Probes behind an estimated ``space`` (0: exact, or none made)."""
    space_kind: str | None = None
    """What ``space`` is (``SPACE_KINDS``: exact, a proven lower bound, an estimate); ``None``: no space."""
    stopped: str | None = None
    """Why the merging search stopped before covering every interleaving (``engine.explore.prune``:
    ``runs``, ``paths``, ``time``); ``None``: it did not stop early, or another strategy ran."""


def new_world(scenario: Scenario, protocol: Protocol, *, trace: bool, ledger: str = "memory") -> Any:
    """A fresh run of ``scenario`` under ``protocol`` on the shipped code."""
    from engine.explore.shipped import WireWorld  # imported here: it loads the adapters and refserver

    return WireWorld(scenario, protocol, trace=trace, ledger=ledger)


def replay(scenario: Scenario, protocol: Protocol, choices: Sequence[int], *, ledger: str = "memory") -> Any:
    """Run one interleaving again, by its choices, with a trace (call ``finish`` on it for the checks)."""
    world = new_world(scenario, protocol, trace=True, ledger=ledger)
    for i in choices:
        world.perform(world.enabled()[i])
    return world


def render_trace(
    scenario: Scenario,
    protocol: Protocol,
    choices: Sequence[int],
    findings: Sequence[Finding] | None = None,
    *,
    ledger: str = "memory",
) -> str:
    """The interleaving as a timeline, one line per step: actor, action -> local state / server state."""
    world = replay(scenario, protocol, choices, ledger=ledger)
    judged = world.finish()
    if findings is None:
        findings = judged
    head = (
        f"{scenario.name} on {protocol} (shipped code, {ledger} ledger), {len(choices)} steps, "
        f"choices {list(choices)}"
    )
    body = world.lines or []
    tail = [f"  DIVERGENCE {kind}: {detail}" for kind, detail in findings]
    return "\n".join([head, *body, *tail])


__all__ = [
    "CODES",
    "DUCKDB_SHARE",
    "RULES",
    "SPACE_AT_LEAST",
    "SPACE_ESTIMATE",
    "SPACE_EXACT",
    "SPACE_KINDS",
    "Failing",
    "Finding",
    "PairResult",
    "new_world",
    "render_trace",
    "replay",
]
