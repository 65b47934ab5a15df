"""Exhaustive exploration with equivalent interleavings merged: depth-first over world states.

Two interleavings that reach the same state (``World.state_key``: equal ledger, server, network,
executor memory, budgets and findings so far) have the same futures, so the subtree below a state
is run once and its summary (how many interleavings lie below, how many diverge and how, the
shortest divergent continuation) is reused for every other way of reaching it. The counts are
exact counts of distinct interleavings, though only distinct states are executed. A state that
repeats on its own path is a cycle: that interleaving never settles and counts as divergent.
Deterministic; no I/O.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.clock import monotonic_seconds
from engine.errors import StateLimit
from engine.explore.result import Failing, PairResult, render_trace
from engine.explore.rules import ENGINE, Rules
from engine.explore.scenario import Scenario
from engine.explore.world import Divergence, Finding, World
from engine.model import Protocol

MAX_STATES = 3_000_000
"""Distinct states one scenario/protocol pair may expand before the search gives up."""
MAX_DEPTH = 400


@dataclass(slots=True)
class Summary:
    """Every interleaving below one state, summed up."""

    paths: int = 0
    divergent: int = 0
    parked: int = 0
    receipts: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    shortest: tuple[int, ...] | None = None
    """Choices from this state to the shortest divergent end (``None``: nothing below diverges)."""
    findings: tuple[Finding, ...] = ()

    def add(self, choice: int, child: Summary) -> None:
        self.paths += child.paths
        self.divergent += child.divergent
        self.parked += child.parked
        self.receipts += child.receipts
        for kind, n in child.kinds.items():
            self.kinds[kind] = self.kinds.get(kind, 0) + n
        if child.shortest is not None and (
            self.shortest is None or len(child.shortest) + 1 < len(self.shortest)
        ):
            self.shortest = (choice, *child.shortest)
            self.findings = child.findings


def _leaf(findings: list[Finding], parked: bool) -> Summary:
    if findings:
        kinds: dict[str, int] = {}
        for kind, _ in findings:
            kinds[kind] = 1
        return Summary(1, 1, 0, 0, kinds, (), tuple(findings))
    if parked:
        return Summary(1, 0, 1, 0)
    return Summary(1, 0, 0, 1)


class _Search:
    def __init__(self, max_states: int) -> None:
        self.memo: dict[tuple[object, ...], Summary] = {}
        self.on_path: set[tuple[object, ...]] = set()
        self.max_states = max_states

    def visit(self, world: World, depth: int) -> Summary:
        key = world.state_key()
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        if key in self.on_path or depth >= MAX_DEPTH:
            finding = (Divergence.UNSETTLED, "the run returns to a state it was in: it can cycle for ever")
            return Summary(1, 1, 0, 0, {Divergence.UNSETTLED: 1}, (), (finding,))
        enabled = [] if world.aborted else world.enabled()
        if not enabled:
            summary = _leaf(world.finish(), world.parked)
        else:
            if len(self.memo) >= self.max_states:
                raise StateLimit(f"more than {self.max_states:,} distinct states")
            self.on_path.add(key)
            summary = Summary()
            last = len(enabled) - 1
            for i, action in enumerate(enabled):
                child = world if i == last else world.clone()
                child.perform(action)
                summary.add(i, self.visit(child, depth + 1))
            self.on_path.discard(key)
        self.memo[key] = summary
        return summary


def explore_pruned(
    scenario: Scenario,
    protocol: Protocol,
    *,
    rules: Rules = ENGINE,
    max_states: int = MAX_STATES,
    trace: bool = True,
) -> PairResult:
    """Every interleaving of ``scenario`` under ``protocol``, each distinct state run once.

    ``explored`` (and the distinct count) is the number of interleavings covered; ``states`` the
    number of distinct states executed.

    Raises:
        StateLimit: the scenario has more than ``max_states`` distinct states.
    """
    started = monotonic_seconds()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * MAX_DEPTH + 200))
    try:
        search = _Search(max_states)
        summary = search.visit(World(scenario, protocol, rules), 0)
    finally:
        sys.setrecursionlimit(limit)
    result = PairResult(scenario.name, protocol, rules.name, 0)
    result.explored = summary.paths
    result.states = len(search.memo)
    result.exhaustive = True
    result.divergent = summary.divergent
    result.parked = summary.parked
    result.receipts = summary.receipts
    result.kinds = dict(summary.kinds)
    if summary.shortest is not None:
        result.shortest = Failing(summary.shortest, summary.findings)
        if trace:
            result.trace = render_trace(scenario, protocol, rules, summary.shortest, summary.findings)
    result.seconds = monotonic_seconds() - started
    return result


def explore_all_pruned(
    pairs: Iterable[tuple[Scenario, Protocol]], *, rules: Rules = ENGINE, max_states: int = MAX_STATES
) -> list[PairResult]:
    """``explore_pruned`` for each pair."""
    return [explore_pruned(s, p, rules=rules, max_states=max_states) for s, p in pairs]


__all__ = [
    "MAX_DEPTH",
    "MAX_STATES",
    "Summary",
    "explore_all_pruned",
    "explore_pruned",
]
