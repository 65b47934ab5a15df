"""Exhaustive exploration of the shipped code with equivalent interleavings merged.

A depth-first walk over the choice tree of one (scenario, protocol) pair in which a state seen
before is not explored again: at every quiet point (``WireWorld.state_key``: no coroutine of the
driver or the server mid-exchange) the run's state is keyed, and two interleavings that reach equal
keys have the same futures, so the subtree below is run once and its summary (how many
interleavings lie below, how many diverge and how, how many end parked or with a receipt, the
shortest divergent continuation) is reused for every other way of reaching it. The counts are exact
counts of distinct interleavings, though only distinct states are executed; the tests check them
against running every interleaving one by one.

The shipped code's state cannot be copied (it lives in coroutines), so the walk continues the run
it has in hand into the first branch and reaches each other branch by running its prefix again from
the start (``runs`` counts every run started). A state that repeats on its own path is a cycle:
that interleaving never settles and counts as divergent. When the run budget ends first, the
result counts the interleavings below the subtrees completed so far (all distinct, all judged) and
says ``exhaustive=False``. Deterministic; no I/O.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from engine.clock import monotonic_seconds
from engine.errors import EngineError, Nondeterminism
from engine.explore.result import RULES, Failing, Finding, PairResult, new_world
from engine.explore.scenario import Scenario
from engine.model import Protocol

MAX_STEPS = 250
"""Steps after which a run counts as unsettled (as in the sampling walk)."""
UNSETTLED = "unsettled"


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
        kinds = {kind: 1 for kind, _ in findings}
        return Summary(1, 1, 0, 0, kinds, (), tuple(findings))
    if parked:
        return Summary(1, 0, 1, 0)
    return Summary(1, 0, 0, 1)


class OutOfRuns(EngineError):
    """The run budget ended; ``partial`` sums the subtrees completed so far (none of them twice)."""

    def __init__(self) -> None:
        super().__init__("run budget spent")
        self.partial = Summary()

    def take(self, prefix: list[int], done: Summary) -> None:
        """Add the completed children of the state after ``prefix`` (choices from the root)."""
        partial = self.partial
        shortest = partial.shortest
        partial.add(0, Summary(done.paths, done.divergent, done.parked, done.receipts, done.kinds))
        if done.shortest is not None:
            path = (*prefix, *done.shortest)
            if shortest is None or len(path) < len(shortest):
                partial.shortest, partial.findings = path, done.findings


class MergingSearch:
    """The merging walk of one pair; ``run`` may be called once."""

    def __init__(
        self, scenario: Scenario, protocol: Protocol, *, max_runs: int, max_steps: int = MAX_STEPS
    ) -> None:
        self.scenario = scenario
        self.protocol = protocol
        self.max_runs = max_runs
        self.max_steps = max_steps
        self.memo: dict[tuple[object, ...], Summary] = {}
        self.on_path: set[tuple[object, ...]] = set()
        self.runs = 0
        self.merged = 0
        """Times a state was found in the memo (a subtree not run again)."""

    def _start(self, prefix: list[int]) -> object:
        if self.runs >= self.max_runs:
            raise OutOfRuns
        self.runs += 1
        world = new_world(self.scenario, self.protocol, trace=False)
        for i in prefix:
            enabled = world.enabled()
            if i >= len(enabled):
                world.close()
                raise Nondeterminism(f"{self.scenario.name}/{self.protocol}: {prefix} no longer replays")
            world.perform(enabled[i])
        return world

    def visit(self, world: object, prefix: list[int]) -> Summary:
        """The summary of every interleaving below the state ``world`` is in (after ``prefix``)."""
        from engine.explore.shipped import WireWorld

        assert isinstance(world, WireWorld)
        key = world.state_key()
        if key is not None:
            hit = self.memo.get(key)
            if hit is not None:
                self.merged += 1
                world.close()
                return hit
            if key in self.on_path:
                world.close()
                finding = (UNSETTLED, "the run returns to a state it was in: it can cycle for ever")
                return Summary(1, 1, 0, 0, {UNSETTLED: 1}, (), (finding,))
        enabled = [] if world.aborted else world.enabled()
        if not enabled or world.steps >= self.max_steps:
            parked = world.parked
            summary = _leaf(world.finish(unsettled=bool(enabled)), parked)
        else:
            n = len(enabled)
            summary = Summary()
            if key is not None:
                self.on_path.add(key)
            try:
                for i in range(n):
                    child = world if i == 0 else self._start(prefix)
                    if i:
                        again = child.enabled()  # type: ignore[attr-defined]
                        if len(again) != n:
                            raise Nondeterminism(
                                f"{self.scenario.name}/{self.protocol}: {prefix} enabled {len(again)}, before {n}"
                            )
                        child.perform(again[i])  # type: ignore[attr-defined]
                    else:
                        child.perform(enabled[0])  # type: ignore[attr-defined]
                    prefix.append(i)
                    try:
                        summary.add(i, self.visit(child, prefix))
                    finally:
                        prefix.pop()
            except OutOfRuns as out:
                out.take(prefix, summary)
                raise
            finally:
                if key is not None:
                    self.on_path.discard(key)
        if key is not None:
            self.memo[key] = summary
        return summary

    def run(self) -> tuple[Summary, bool]:
        """(the summary, whether it covers every interleaving)."""
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(max(limit, 20 * self.max_steps + 1000))
        try:
            return self.visit(self._start([]), []), True
        except OutOfRuns as out:
            return out.partial, False
        finally:
            sys.setrecursionlimit(limit)


def explore_merged(
    scenario: Scenario, protocol: Protocol, *, max_runs: int, max_steps: int = MAX_STEPS
) -> PairResult:
    """Every interleaving of ``scenario`` under ``protocol`` (each distinct state run once), within
    ``max_runs`` runs; ``explored`` is the interleavings covered, ``runs`` the runs it took,
    ``states`` the distinct quiet states keyed.
    """
    started = monotonic_seconds()
    search = MergingSearch(scenario, protocol, max_runs=max_runs, max_steps=max_steps)
    summary, complete = search.run()
    result = PairResult(scenario.name, protocol, RULES, 0)
    result.explored = summary.paths
    result.runs = search.runs
    result.states = len(search.memo)
    result.exhaustive = complete
    result.divergent = summary.divergent
    result.parked = summary.parked
    result.receipts = summary.receipts
    result.kinds = dict(summary.kinds)
    if summary.shortest is not None:
        result.shortest = Failing(summary.shortest, summary.findings)
    result.seconds = monotonic_seconds() - started
    return result


__all__ = ["MAX_STEPS", "MergingSearch", "OutOfRuns", "Summary", "explore_merged"]
